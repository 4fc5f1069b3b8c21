"""CPU per trigger of RedisTriggers, at the publisher, the subscriber and Redis.

``python -m aiopurgatory.redis.bench [--triggers N] [--batch B ...] [--loop L ...]``

``python -m aiopurgatory.redis.bench --routing`` prints instead what the number
of partitions does to interest routing (:func:`routing_table`: arithmetic over
the real partition function, no Redis), the figures docs/distributed.md cites.

Starts a throwaway ``redis-server`` (:mod:`aiopurgatory.redis.testing`), then for
each event loop and batch size runs two processes: a subscriber (a purgatory
with ``--parked`` operations waiting on ``--keys`` keys, thresholds never
reached, and a RedisTriggers) and a publisher-only RedisTriggers that makes
``--triggers`` advances, each on the next key with a growing value:

* ``--batch 0``: each trigger alone, ``await triggers.flush()`` after each (one
  message per trigger: the worst case, a server handling one request at a time);
* ``--batch -1``: no RedisTriggers at the publisher: one ``PUBLISH`` per trigger
  with redis-py alone (``await client.publish(...)``), the floor of the
  per-trigger cost of a round trip from Python;
* ``--batch B``: B triggers per loop iteration (B distinct keys), then
  ``await asyncio.sleep(0)``: the triggers of one iteration leave as one message,
  and more gather while a send is in flight.

Each process measures its own CPU time (``time.process_time``) from its first
trigger (publisher) or from being ready (subscriber) until the last trigger was
sent (publisher) or applied (subscriber: a final advance of a key of its own
completes an operation, and messages arrive in order). Redis's CPU is the change
of ``used_cpu_user + used_cpu_sys`` (``INFO cpu``). Prints a table and, with
``--output``, writes the results as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis

import aiopurgatory as ap

from ._partitions import DEFAULT_PARTITIONS, Partitions
from ._triggers import RedisTriggers
from ._wire import Batch, Key, encode

__all__ = ["main"]

_CHANNEL = "aiopurgatory-bench"
_DONE = b"bench-done"


def _runner(loop: str) -> asyncio.Runner:
    factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    return asyncio.Runner(loop_factory=factory)


def _emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def _routed(triggers: RedisTriggers, keys: list[Key]) -> None:
    """Wait until the partitions of ``keys`` (watched directly) are subscribed and
    their catch-up (a read, and a check of each key) is done."""
    subscriber = triggers._subscriber
    assert subscriber is not None
    while not subscriber.covers(keys) or not triggers._reader.idle:  # noqa: ASYNC110
        await asyncio.sleep(0.005)


class _Done(ap.DelayedOperation):
    """Completes when checked once armed: by the publisher's last trigger."""

    armed = False

    def try_complete(self) -> bool:
        return self.force_complete() if self.armed else False


async def _subscriber(url: str, parked: int, keys: int) -> None:
    purgatory: ap.Purgatory[Any] = ap.Purgatory("bench")
    async with RedisTriggers(purgatory, url, channel=_CHANNEL) as triggers:
        for i in range(parked):
            # Thresholds never reached: an advance reaches no operation.
            purgatory.try_complete_else_watch(ap.WatermarkOperation(3600), {f"k{i % keys}": 10**15})
        done = _Done(3600)
        finished = asyncio.ensure_future(purgatory.watch(done, [_DONE]))
        await _routed(triggers, [_DONE, *{f"k{i % keys}" for i in range(parked)}])
        done.armed = True
        cpu = time.process_time()
        _emit(event="ready")
        await finished
        cpu = time.process_time() - cpu
        stats = triggers.statistics()
        purgatory.close()
    _emit(event="result", cpu=cpu, received=stats.received, applied=stats.applied)


async def _publisher(url: str, triggers_n: int, batch: int, keys: int) -> None:
    names = [f"k{i}" for i in range(keys)]
    async with RedisTriggers(None, url, channel=_CHANNEL) as triggers:
        advance = triggers.advance
        started = time.perf_counter()
        cpu = time.process_time()
        if batch < 0:
            # The floor: what redis-py alone costs for one PUBLISH round trip
            # per trigger, with a message as RedisTriggers would send (from
            # another sender id, so that the subscriber applies it).
            client = aioredis.from_url(url)
            channel_of = Partitions(_CHANNEL, DEFAULT_PARTITIONS).channel
            try:
                wire = Batch()
                for i in range(triggers_n):
                    wire.advances.clear()
                    wire.advances[names[i % keys]] = i
                    key = names[i % keys]
                    await client.publish(channel_of(key), encode("floor", wire))
            finally:
                await client.aclose()
        elif batch == 0:
            for i in range(triggers_n):
                advance(names[i % keys], i)
                await triggers.flush()
        else:
            for start in range(0, triggers_n, batch):
                for i in range(start, min(start + batch, triggers_n)):
                    advance(names[i % keys], i)
                await asyncio.sleep(0)
            await triggers.flush()
        cpu = time.process_time() - cpu
        wall = time.perf_counter() - started
        published = triggers.statistics().published
        triggers.check_and_complete(_DONE)
        await triggers.flush()
    _emit(event="result", cpu=cpu, wall=wall, published=published)


def _role(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["subscriber", "publisher"])
    parser.add_argument("url")
    parser.add_argument("loop")
    parser.add_argument("--triggers", type=int, default=0)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--parked", type=int, default=0)
    args = parser.parse_args(argv)
    with _runner(args.loop) as runner:
        if args.role == "subscriber":
            runner.run(_subscriber(args.url, args.parked, args.keys))
        else:
            runner.run(_publisher(args.url, args.triggers, args.batch, args.keys))


def _redis_cpu(url: str) -> float:
    import redis

    client = redis.Redis.from_url(url)
    try:
        info = client.info("cpu")
    finally:
        client.close()
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "aiopurgatory.redis.bench", "--role", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )


def _read(process: subprocess.Popen[str], event: str) -> dict[str, Any]:
    assert process.stdout is not None
    for line in process.stdout:
        fields: dict[str, Any] = json.loads(line)
        if fields["event"] == event:
            return fields
    raise RuntimeError(f"benchmark process exited with {process.wait()} before {event!r}")


def _run_one(
    url: str, loop: str, triggers: int, batch: int, keys: int, parked: int
) -> dict[str, Any]:
    common = ["--keys", str(keys)]
    publisher_args = ["--triggers", str(triggers), "--batch", str(batch), *common]
    with _spawn("subscriber", url, loop, "--parked", str(parked), *common) as subscriber:
        try:
            _read(subscriber, "ready")
            redis_before = _redis_cpu(url)
            with _spawn("publisher", url, loop, *publisher_args) as publisher:
                try:
                    sent = _read(publisher, "result")
                except BaseException:
                    publisher.kill()
                    raise
            got = _read(subscriber, "result")
            redis_cpu = _redis_cpu(url) - redis_before
        except BaseException:
            subscriber.kill()
            raise
    return {
        "loop": loop,
        "batch": batch,
        "triggers": triggers,
        "keys": keys,
        "parked": parked,
        "messages": sent["published"] if batch >= 0 else triggers,
        "publisher_wall_s": sent["wall"],
        "publisher_cpu_us_per_trigger": sent["cpu"] / triggers * 1e6,
        "subscriber_cpu_us_per_trigger": got["cpu"] / triggers * 1e6,
        "redis_cpu_us_per_trigger": redis_cpu / triggers * 1e6,
        "subscriber_applied": got["applied"],
    }


def routing_table(total: int = 10_000) -> list[dict[str, Any]]:
    """What the number of partitions does to interest routing (arithmetic, no Redis).

    For each count of partitions (and a channel per key), with ``total`` keys
    each triggered once: the share of the triggers a process receives when it
    watches 100 keys, or 1/8 of the keys (8 processes with disjoint interests);
    the partitions it then subscribes to; and the messages a publisher sends
    for one loop iteration that triggers 1,000 distinct keys.
    """
    from ._partitions import partition_of

    names = [f"k{i}" for i in range(total)]
    rows = []
    for count in (64, 256, 1024, 4096, 16384, 0):
        parts = [partition_of(key, count) for key in names] if count else list(range(total))
        row: dict[str, Any] = {"partitions": count or "per key"}
        for label, mine in (
            ("100 keys", range(0, total, total // 100)),
            ("1/8", range(0, total, 8)),
        ):
            subscribed = {parts[i] for i in mine}
            received = sum(1 for p in parts if p in subscribed)
            row[f"{label}: received %"] = round(100 * received / total, 1)
            row[f"{label}: subscribed"] = len(subscribed)
        row["messages per 1,000-key iteration"] = len(set(parts[:1000]))
        rows.append(row)
    return rows


def sweep_cost(keys: int = 10_000, sweeps: int = 50) -> float:
    """CPU milliseconds of one sweep of ``keys`` watched keys, none changing (no Redis)."""

    async def measure() -> float:
        purgatory: ap.Purgatory[Any] = ap.Purgatory("sweep")
        triggers = RedisTriggers(purgatory, "redis://127.0.0.1:1")  # never entered
        subscriber = triggers._subscriber
        assert subscriber is not None
        for i in range(keys):
            purgatory.try_complete_else_watch(ap.WatermarkOperation(3600), {f"k{i}": 1})
        subscriber.sweep()  # the first sweep finds every key
        cpu = time.process_time()
        for _ in range(sweeps):
            subscriber.sweep()
        cpu = time.process_time() - cpu
        purgatory.close()
        return cpu / sweeps * 1e3

    return asyncio.run(measure())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (see the module documentation); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--role"]:
        _role(argv[1:])
        return 0
    if argv[:1] == ["--routing"]:
        for row in routing_table():
            print("  ".join(f"{name}: {value}" for name, value in row.items()))
        print(f"a sweep of 10,000 watched keys, none changing: {sweep_cost():.2f} ms CPU")
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m aiopurgatory.redis.bench",
        description="CPU per trigger of RedisTriggers at the publisher, subscriber and Redis.",
    )
    parser.add_argument("--triggers", type=int, default=20_000, help="advances per run")
    parser.add_argument(
        "--batch",
        type=int,
        action="append",
        help="triggers per loop iteration; 0 = each alone, flushed; -1 = redis-py's publish "
        "alone (default: -1, 0 and 100)",
    )
    parser.add_argument(
        "--loop", action="append", choices=["asyncio", "uvloop"], help="default: both"
    )
    parser.add_argument(
        "--keys",
        type=int,
        default=10_000,
        help="distinct keys advanced in turn (fewer keys: more advances coalesce by key)",
    )
    parser.add_argument(
        "--parked", type=int, default=1000, help="operations waiting at the subscriber"
    )
    parser.add_argument(
        "--appendfsync",
        choices=["always", "everysec", "no"],
        default="everysec",
        help="the server's AOF fsync policy (default: everysec, Redis's own default)",
    )
    parser.add_argument("--output", help="write the results as JSON to this file")
    args = parser.parse_args(argv)
    batches = args.batch or [-1, 0, 100]
    loops = args.loop or ["asyncio", "uvloop"]

    from .testing import RedisServer

    results = []
    with (
        tempfile.TemporaryDirectory() as directory,
        RedisServer(directory, appendfsync=args.appendfsync) as server,
    ):
        for loop in loops:
            for batch in batches:
                result = _run_one(server.url, loop, args.triggers, batch, args.keys, args.parked)
                results.append(result)
                print(
                    f"{loop:8} batch {batch:4}: {result['messages']:6} messages, "
                    f"CPU per trigger: publisher {result['publisher_cpu_us_per_trigger']:6.1f} us, "
                    f"subscriber {result['subscriber_cpu_us_per_trigger']:6.1f} us, "
                    f"redis {result['redis_cpu_us_per_trigger']:6.1f} us "
                    f"({result['publisher_wall_s']:.2f} s, "
                    f"{result['subscriber_applied'] - 1} applied)",
                    flush=True,
                )
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
