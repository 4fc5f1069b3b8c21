"""Long-poll consumer fetches: a DelayedFetch per request, fetch.min.bytes and fetch.max.wait.

Consumers fetch their partitions with ``fetch.min.bytes`` and ``fetch.max.wait``.
The broker answers at once if at least ``min.bytes`` are readable past the
requested offsets; otherwise it parks a ``DelayedFetch`` in the fetch purgatory,
watched under the requested topic-partitions, each with the fetch offset + 1 as
threshold (the first record it waits for). Every append calls ``advance(tp,
log_end_offset)``, which checks the fetches that some record reached: the fetch
completes as soon as enough bytes have accumulated, or expires after
``max.wait`` and returns whatever is there (possibly nothing). Raising
``min.bytes`` trades latency for fewer, fuller responses.

Runs on virtual time (fast, deterministic for a ``--seed``) unless ``--real-time``,
on asyncio unless ``--loop`` says otherwise (uvloop, trio: the body is anyio code).
``python -m examples.long_poll_fetch --rate 200 --fetch-min-bytes 16384``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import random
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import anyio

if __name__ == "__main__" and not __package__:
    # Run as a script (python examples/long_poll_fetch.py): make the examples package importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiopurgatory as ap
from examples._kafka import (
    TopicPartition,
    add_runtime_arguments,
    checked_config,
    non_negative_float,
    percentile,
    positive_float,
    positive_int,
    run_main,
    run_timed,
    running_clock,
)

__all__ = ["Config", "DelayedFetch", "FetchResult", "PartitionLog", "main", "run", "simulate"]


@dataclass(frozen=True)
class Config:
    """The parameters of a run (seconds, bytes).

    Raises:
        ValueError: a field is out of range (the message names it).
    """

    #: Partitions of the topic.
    partitions: int = 4
    #: Consumers; partition ``n`` is assigned to consumer ``n % consumers``.
    consumers: int = 2
    #: Records per second appended by the producer, over all partitions (0: none).
    rate: float = 200.0
    #: Smallest and largest record size, bytes (uniform).
    record_bytes: tuple[int, int] = (100, 1000)
    #: ``fetch.min.bytes``: answer once this many bytes are readable.
    fetch_min_bytes: int = 16 * 1024
    #: ``fetch.max.wait``: answer with what there is after this long, seconds.
    fetch_max_wait: float = 0.5
    #: ``fetch.max.bytes``: the most one response carries (at least one record).
    fetch_max_bytes: int = 1024 * 1024
    #: Seconds during which the producer appends (consumers then drain the rest).
    duration: float = 10.0
    seed: int = 1
    topic: str = "events"

    def __post_init__(self) -> None:
        for name in ("partitions", "consumers", "fetch_min_bytes", "fetch_max_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not (isinstance(self.rate, int | float) and 0 <= self.rate < math.inf):
            raise ValueError(f"rate must be a finite number >= 0, got {self.rate!r}")
        for name in ("fetch_max_wait", "duration"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value < math.inf):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        low, high = self.record_bytes
        if not (1 <= low <= high):
            raise ValueError(
                f"record_bytes must be (low, high) with 1 <= low <= high, got {self.record_bytes!r}"
            )


class PartitionLog:
    """A partition's log: record sizes and append times, with running byte totals."""

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.sizes: list[int] = []
        self.appended_at: list[float] = []
        # cumulative[i] = bytes of records [0, i): readable bytes past any offset in O(1).
        self.cumulative = [0]

    @property
    def log_end_offset(self) -> int:
        """The offset the next record gets."""
        return len(self.sizes)

    def append(self, size: int, now: float) -> None:
        """Append one record of ``size`` bytes."""
        self.sizes.append(size)
        self.appended_at.append(now)
        self.cumulative.append(self.cumulative[-1] + size)

    def bytes_after(self, offset: int) -> int:
        """Bytes readable from ``offset`` to the end of the log."""
        return self.cumulative[-1] - self.cumulative[offset]


@dataclass(frozen=True)
class PartitionData:
    """The records of one partition in a fetch response: offsets ``[start, end)``."""

    start: int
    end: int
    size: int


class DelayedFetch(ap.DelayedOperation):
    """A consumer fetch waiting for ``fetch.min.bytes`` (Kafka's ``DelayedFetch``).

    Args:
        op_id: the request id.
        offsets: per partition, the offset to read from.
        logs: the broker's partition logs.
        min_bytes: complete once this many bytes are readable over all partitions.
        max_bytes: the most the response carries (at least one record).
        max_wait: seconds to wait before answering with what there is.
    """

    def __init__(
        self,
        op_id: int,
        offsets: dict[TopicPartition, int],
        logs: dict[TopicPartition, PartitionLog],
        min_bytes: int,
        max_bytes: int,
        max_wait: float,
    ) -> None:
        super().__init__(max_wait)
        self.op_id = op_id
        self.offsets = offsets
        self._logs = logs
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        #: Set exactly once by :meth:`on_complete`.
        self.response: dict[TopicPartition, PartitionData] | None = None
        #: How many times this fetch was answered (exactly once, or a bug).
        self.answers = 0

    def readable_bytes(self) -> int:
        """Bytes readable past the requested offsets, over all partitions."""
        return sum(self._logs[tp].bytes_after(offset) for tp, offset in self.offsets.items())

    def try_complete(self) -> bool:
        """Complete once ``min_bytes`` have accumulated."""
        return self.readable_bytes() >= self.min_bytes and self.force_complete()

    def on_complete(self) -> None:
        """Read the response now, whether enough bytes came or the wait expired."""
        self.answers += 1
        budget = self.max_bytes
        response: dict[TopicPartition, PartitionData] = {}
        for tp, start in self.offsets.items():
            log = self._logs[tp]
            end = start
            while end < log.log_end_offset and (
                log.sizes[end] <= budget or (end == start and budget == self.max_bytes)
            ):
                # Like Kafka, the first record is returned even if it exceeds max.bytes.
                budget -= log.sizes[end]
                end += 1
            response[tp] = PartitionData(start, end, log.cumulative[end] - log.cumulative[start])
        self.response = response


@dataclass
class FetchResult:
    """What a run produced (seconds, bytes)."""

    config: Config
    #: Fetch requests sent.
    fetches: int
    #: Fetch id -> times answered (must be 1 for each).
    answers: dict[int, int]
    #: ``completed`` (min.bytes reached) / ``expired`` (max.wait passed) -> fetches.
    outcomes: Counter[str]
    #: Expired fetches that returned no record at all.
    empty_responses: int
    #: Per fetch, in send order: (outcome, wait, bytes in the response).
    fetch_log: list[tuple[str, float, int]]
    #: Append-to-delivery time of every record consumed.
    delivery_latencies: list[float]
    records_produced: int
    records_consumed: int
    bytes_produced: int
    bytes_consumed: int
    #: Records delivered more than once or skipped (both must be 0).
    duplicates: int
    gaps: int
    statistics: ap.PurgatoryStatistics
    elapsed: float

    def wait_percentiles(self, outcome: str | None = None) -> dict[str, float]:
        """p50/p99/max of the time a fetch waited, of one outcome or of all."""
        waits = sorted(w for out, w, _ in self.fetch_log if outcome is None or out == outcome)
        return {
            "p50": percentile(waits, 50),
            "p99": percentile(waits, 99),
            "max": waits[-1] if waits else math.nan,
        }


async def simulate(config: Config) -> FetchResult:
    """Run producers and long-polling consumers on the running loop; return what happened.

    anyio code: runs on asyncio, uvloop and trio alike.
    """
    now = running_clock()
    start = now()
    end = start + config.duration
    tps = [TopicPartition(config.topic, n) for n in range(config.partitions)]
    logs = {tp: PartitionLog(tp) for tp in tps}
    purgatory: ap.Purgatory[DelayedFetch] = ap.Purgatory("fetch")
    fetch_ids = itertools.count()
    ops: list[DelayedFetch] = []
    fetch_log: list[tuple[int, str, float, int]] = []
    delivery: list[float] = []
    consumed_offsets: dict[TopicPartition, list[int]] = {tp: [] for tp in tps}

    async def producer() -> None:
        if config.rate == 0:
            return
        rng = random.Random(f"{config.seed}-producer")
        while True:
            gap = rng.expovariate(config.rate)
            if now() + gap >= end:
                return
            await anyio.sleep(gap)
            if now() >= end:
                # Woken late (a loaded machine): a record appended now could come
                # after every consumer, caught up past the end, has stopped.
                return
            tp = tps[rng.randrange(len(tps))]
            logs[tp].append(rng.randint(*config.record_bytes), now())
            # New bytes: fetches waiting on this partition may now have enough.
            purgatory.advance(tp, logs[tp].log_end_offset)

    async def consumer(index: int) -> None:
        assigned = [tp for tp in tps if tp.partition % config.consumers == index]
        if not assigned:
            return
        position = dict.fromkeys(assigned, 0)
        while now() < end or any(logs[tp].log_end_offset > position[tp] for tp in assigned):
            op = DelayedFetch(
                next(fetch_ids),
                dict(position),
                logs,
                config.fetch_min_bytes,
                config.fetch_max_bytes,
                config.fetch_max_wait,
            )
            ops.append(op)
            sent = now()
            # Offsets count records, min.bytes counts bytes: the threshold is the
            # first record past the position; advances past it check the bytes.
            outcome = await purgatory.watch(op, {tp: position[tp] + 1 for tp in assigned})
            received = now()
            assert op.response is not None
            size = 0
            for tp, data in op.response.items():
                size += data.size
                for offset in range(data.start, data.end):
                    consumed_offsets[tp].append(offset)
                    delivery.append(received - logs[tp].appended_at[offset])
                position[tp] = data.end
            fetch_log.append((op.op_id, outcome.value, received - sent, size))

    try:
        # Backstop only: consumers stop once caught up after the producer stops.
        with anyio.fail_after(config.duration + 10 * config.fetch_max_wait + 60.0):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(producer)
                for index in range(config.consumers):
                    tasks.start_soon(consumer, index)
    finally:
        statistics = purgatory.statistics()
        purgatory.close()

    duplicates = gaps = 0
    for tp, offsets in consumed_offsets.items():
        duplicates += len(offsets) - len(set(offsets))
        gaps += logs[tp].log_end_offset - len(set(offsets))
    fetch_log.sort()
    return FetchResult(
        config=config,
        fetches=len(ops),
        answers={op.op_id: op.answers for op in ops},
        outcomes=Counter(outcome for _, outcome, _, _ in fetch_log),
        empty_responses=sum(1 for _, outcome, _, size in fetch_log if size == 0),
        fetch_log=[(outcome, wait, size) for _, outcome, wait, size in fetch_log],
        delivery_latencies=delivery,
        records_produced=sum(log.log_end_offset for log in logs.values()),
        records_consumed=sum(len(offsets) for offsets in consumed_offsets.values()),
        bytes_produced=sum(log.cumulative[-1] for log in logs.values()),
        bytes_consumed=sum(size for _, _, _, size in fetch_log),
        duplicates=duplicates,
        gaps=gaps,
        statistics=statistics,
        elapsed=now() - start,
    )


def run(config: Config, *, real_time: bool = False, loop: str = "asyncio") -> FetchResult:
    """Run a whole simulation of ``config`` and return its result: on virtual time
    unless ``real_time``, on ``loop``, seeded with ``config.seed``
    (:func:`examples._kafka.run_main`)."""
    return run_main(lambda: simulate(config), real_time=real_time, loop=loop, seed=config.seed)


def format_summary(result: FetchResult, wall: float) -> str:
    """A short plain-text summary of ``result``."""
    c = result.config
    delivery = sorted(result.delivery_latencies)
    lines = [
        f"long-poll fetch: {c.consumers} consumers, {c.partitions} partitions, "
        f"{c.rate:g} records/s for {c.duration:g} s, fetch.min.bytes {c.fetch_min_bytes}, "
        f"fetch.max.wait {1000 * c.fetch_max_wait:g} ms "
        f"({result.elapsed:.2f} s simulated in {wall:.2f} s)",
        f"  fetches: {result.fetches}: {result.outcomes.get('completed', 0)} reached min.bytes, "
        f"{result.outcomes.get('expired', 0)} expired at max.wait "
        f"({result.empty_responses} of them empty)",
    ]
    for outcome in ("completed", "expired"):
        if result.outcomes.get(outcome):
            w = result.wait_percentiles(outcome)
            lines.append(
                f"  {outcome:>9} fetch wait ms: p50 {1000 * w['p50']:.1f}  "
                f"p99 {1000 * w['p99']:.1f}  max {1000 * w['max']:.1f}"
            )
    lines += [
        f"  records: {result.records_produced} produced, {result.records_consumed} consumed "
        f"({result.bytes_consumed} bytes; {result.duplicates} duplicates, {result.gaps} missing)",
        f"  append-to-delivery ms: p50 {1000 * percentile(delivery, 50):.1f}  "
        f"p99 {1000 * percentile(delivery, 99):.1f}",
        f"  purgatory: {result.statistics}",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The example's argument parser."""
    d = Config()
    parser = argparse.ArgumentParser(
        prog="long_poll_fetch",
        description="Simulate consumer long-poll fetches (fetch.min.bytes / fetch.max.wait).",
    )
    parser.add_argument(
        "--rate", type=non_negative_float, default=d.rate, help="records per second"
    )
    parser.add_argument("--partitions", type=positive_int, default=d.partitions)
    parser.add_argument("--consumers", type=positive_int, default=d.consumers)
    parser.add_argument("--fetch-min-bytes", type=positive_int, default=d.fetch_min_bytes)
    parser.add_argument(
        "--fetch-max-wait", type=positive_float, default=d.fetch_max_wait, help="seconds"
    )
    parser.add_argument("--fetch-max-bytes", type=positive_int, default=d.fetch_max_bytes)
    parser.add_argument("--duration", type=positive_float, default=d.duration, help="seconds")
    add_runtime_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    config = checked_config(
        parser,
        args,
        lambda: Config(
            partitions=args.partitions,
            consumers=args.consumers,
            rate=args.rate,
            fetch_min_bytes=args.fetch_min_bytes,
            fetch_max_wait=args.fetch_max_wait,
            fetch_max_bytes=args.fetch_max_bytes,
            duration=args.duration,
            seed=args.seed,
        ),
    )
    result, wall = run_timed(args, functools.partial(run, config))
    print(format_summary(result, wall))
    ok = (
        all(n == 1 for n in result.answers.values()) and result.duplicates == 0 and result.gaps == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
