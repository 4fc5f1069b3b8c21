"""A bounded load test: K concurrent aiokafka producers (acks=all) for T seconds.

Reports acknowledged messages per second and produce latency percentiles, then
reads every partition back with a consumer and checks that nothing acknowledged
was lost, duplicated or moved (each value at the offset its ack reported)::

    python -m examples.broker.loadtest --producers 4 --seconds 10
    python -m examples.broker.loadtest --bootstrap 127.0.0.1:9092   # an external broker

Without ``--bootstrap`` it starts an in-process broker on a free port. Needs
aiokafka (a dev dependency). Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

from .server import Broker, BrokerConfig

__all__ = ["LoadResult", "main", "run_load"]


@dataclass(frozen=True)
class LoadResult:
    """What a load run measured (latencies in milliseconds)."""

    producers: int
    seconds: float
    acked: int
    failed: int
    acked_per_second: float
    latency_p50_ms: float
    latency_p99_ms: float
    latency_max_ms: float
    consumed: int
    lost: int
    duplicated: int
    misplaced: int

    def as_dict(self) -> dict[str, Any]:
        """The result as a JSON-ready dict."""
        return dict(self.__dict__)


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


async def run_load(
    *,
    bootstrap: str | None = None,
    producers: int = 4,
    seconds: float = 5.0,
    window: int = 8,
    topic: str = "load",
    partitions: int = 4,
    message_bytes: int = 100,
    follower_lag: float = 0.0,
) -> LoadResult:
    """Run the load and the read-back check.

    Args:
        bootstrap: ``host:port`` of a running broker; None starts one in-process.
        producers: concurrent AIOKafkaProducer instances.
        seconds: how long to keep producing.
        window: concurrent ``send_and_wait`` calls per producer.
        topic: topic to produce to (created with ``partitions`` if in-process).
        partitions: partitions of the topic (messages go round robin); with
            ``bootstrap``, the topic's actual partition count is used instead.
        message_bytes: value size.
        follower_lag: follower lag of the in-process broker, seconds.

    Raises:
        ValueError: a non-positive count or duration.
    """
    for name, value in (
        ("producers", producers),
        ("window", window),
        ("partitions", partitions),
        ("message_bytes", message_bytes),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as KafkaTopicPartition

    broker: Broker | None = None
    if bootstrap is None:
        broker = Broker(
            BrokerConfig(
                port=0,
                topics={topic: partitions},
                follower_lag=follower_lag,
                stats_interval=0,
            )
        )
        await broker.start()
        bootstrap = f"127.0.0.1:{broker.port}"
    try:
        acked: dict[bytes, tuple[int, int]] = {}
        latencies: list[float] = []
        failed = 0
        deadline = time.perf_counter() + seconds

        async def sender(producer: Any, pid: int, lane: int) -> None:
            nonlocal failed
            seq = 0
            while time.perf_counter() < deadline:
                key = f"{pid}-{lane}-{seq}".encode()
                value = key.ljust(message_bytes, b".")
                partition = (pid * window + lane + seq) % partitions
                seq += 1
                start = time.perf_counter()
                try:
                    md = await producer.send_and_wait(topic, value, key=key, partition=partition)
                except Exception:
                    failed += 1
                    continue
                latencies.append(time.perf_counter() - start)
                acked[value] = (md.partition, md.offset)

        clients = [
            AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all") for _ in range(producers)
        ]
        await asyncio.gather(*(c.start() for c in clients))
        if broker is None:
            # An external broker decides the partition count (or auto-creates the topic).
            partitions = len(await clients[0].partitions_for(topic))
        # Only this run's messages are checked: read back from the current end offsets.
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        tps = [KafkaTopicPartition(topic, p) for p in range(partitions)]
        try:
            first_offsets = await consumer.end_offsets(tps)
        except BaseException:
            await consumer.stop()
            await asyncio.gather(*(c.stop() for c in clients))
            raise
        started = time.perf_counter()
        deadline = started + seconds
        try:
            await asyncio.gather(
                *(sender(c, pid, lane) for pid, c in enumerate(clients) for lane in range(window))
            )
        finally:
            elapsed = time.perf_counter() - started
            await asyncio.gather(*(c.stop() for c in clients))

        # Read this run's range back and compare with what was acknowledged.
        seen: dict[bytes, list[tuple[int, int]]] = {}
        try:
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, first_offsets[tp])
            ends = await consumer.end_offsets(tps)
            remaining = sum(ends[tp] - first_offsets[tp] for tp in tps)
            while remaining > 0:
                batch = await consumer.getmany(timeout_ms=1000)
                if not batch:
                    break
                for tp, messages in batch.items():
                    for m in messages:
                        seen.setdefault(m.value, []).append((tp.partition, m.offset))
                        remaining -= 1
        finally:
            await consumer.stop()
        consumed = sum(len(v) for v in seen.values())
        lost = sum(1 for v in acked if v not in seen)
        duplicated = sum(len(v) - 1 for v in seen.values() if len(v) > 1)
        misplaced = sum(1 for v, where in acked.items() if v in seen and seen[v][0] != where)
        latencies.sort()
        return LoadResult(
            producers=producers,
            seconds=round(elapsed, 3),
            acked=len(acked),
            failed=failed,
            acked_per_second=round(len(acked) / elapsed, 1),
            latency_p50_ms=round(1000 * _percentile(latencies, 0.50), 3),
            latency_p99_ms=round(1000 * _percentile(latencies, 0.99), 3),
            latency_max_ms=round(1000 * (latencies[-1] if latencies else float("nan")), 3),
            consumed=consumed,
            lost=lost,
            duplicated=duplicated,
            misplaced=misplaced,
        )
    finally:
        if broker is not None:
            await broker.close()


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; exit code 1 if anything acknowledged was lost."""
    p = argparse.ArgumentParser(prog="python -m examples.broker.loadtest", description=__doc__)
    p.add_argument("--bootstrap", default=None, help="host:port; default: in-process broker")
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--window", type=int, default=8, help="in-flight sends per producer")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--message-bytes", type=int, default=100)
    p.add_argument("--follower-lag", type=float, default=0.0)
    p.add_argument("--uvloop", action="store_true")
    args = p.parse_args(argv)
    import structlog

    # Quiet: the result is the JSON line; warnings and errors still reach stderr.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )
    logging.basicConfig(level=logging.ERROR)
    coro = run_load(
        bootstrap=args.bootstrap,
        producers=args.producers,
        seconds=args.seconds,
        window=args.window,
        partitions=args.partitions,
        message_bytes=args.message_bytes,
        follower_lag=args.follower_lag,
    )
    if args.uvloop:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            result = runner.run(coro)
    else:
        result = asyncio.run(coro)
    print(json.dumps(result.as_dict()))
    return 1 if result.lost or result.misplaced or result.duplicated else 0


if __name__ == "__main__":
    sys.exit(main())
