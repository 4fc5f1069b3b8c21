"""The processes of ``aiopurgatory bench redis-fanout``: a watcher and a publisher.

Run as a script (``python -P _fanout_worker.py watcher|publisher ...``) with
``PYTHONPATH`` naming the checkout whose library is measured, so that one
invocation compares two versions of ``aiopurgatory.redis``: this file imports
nothing of the package it ships in, only the public API that both versions have
(``Purgatory``, ``WatermarkOperation``, ``RedisTriggers`` and its
``statistics()``). It reports JSON lines on stdout: ``ready`` then ``result``.

* watcher ``INDEX COUNT``: watches every COUNT-th of the keys ``k0..k<keys-1>``,
  from INDEX (its own share), one operation per key waiting until the key's
  watermark reaches ``--rounds``, through ``RedisTriggers.watch``; its result
  comes when all of its operations have ended. Its CPU time counts from ready.
* idle: a purgatory watching nothing, subscribed; its result (what reached it
  anyway) comes when its stdin closes.
* publisher: advances every key to 1, then every key to 2, ... up to
  ``--rounds``, ``--batch`` keys per loop iteration (more gather while a message
  is in flight), then flushes; ``--batch 0``: each trigger alone, flushed (one
  message per trigger).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import aiopurgatory as ap
from aiopurgatory.redis import RedisTriggers

#: How long a watcher's operations may wait: far past any run, so that an
#: operation that expires says a trigger was lost.
OP_TIMEOUT = 600.0


def _emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def _library() -> str:
    return str(ap.__file__).rsplit("/aiopurgatory/", 1)[0]


async def _watcher(args: argparse.Namespace) -> None:
    purgatory: ap.Purgatory[Any] = ap.Purgatory("fanout")
    mine = [f"k{j}" for j in range(args.index, args.keys, args.count)]
    async with RedisTriggers(purgatory, args.url, channel=args.channel) as triggers:
        waits = [
            asyncio.ensure_future(
                triggers.watch(ap.WatermarkOperation(OP_TIMEOUT), {key: args.rounds})
            )
            for key in mine
        ]
        # Ready once subscribed and the watched keys' stored watermarks were read
        # (after which every advance arrives through the subscription).
        deadline = time.monotonic() + 30
        while True:
            stats = triggers.statistics()
            if stats.connected and stats.reads >= 1:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"not subscribed within 30 s: {stats}")
            await asyncio.sleep(0.01)
        cpu = time.process_time()
        started = time.perf_counter()
        _emit(event="ready", keys=len(mine), library=_library())
        outcomes = await asyncio.gather(*waits)
        cpu = time.process_time() - cpu
        wall = time.perf_counter() - started
        stats = triggers.statistics()
    purgatory.close()
    _emit(
        event="result",
        cpu_s=cpu,
        wall_s=wall,
        keys=len(mine),
        completed=sum(outcome is ap.Outcome.COMPLETED for outcome in outcomes),
        statistics=asdict(stats),
    )


async def _idle(args: argparse.Namespace) -> None:
    """A process whose purgatory watches nothing: what reaches it is pure overhead.
    Its result comes when its stdin closes (the run is over)."""
    purgatory: ap.Purgatory[Any] = ap.Purgatory("fanout-idle")
    async with RedisTriggers(purgatory, args.url, channel=args.channel) as triggers:
        deadline = time.monotonic() + 30
        while not triggers.statistics().connected:
            if time.monotonic() > deadline:
                raise RuntimeError("not connected within 30 s")
            await asyncio.sleep(0.01)
        cpu = time.process_time()
        _emit(event="ready", keys=0, library=_library())
        await asyncio.to_thread(sys.stdin.read)
        cpu = time.process_time() - cpu
        stats = triggers.statistics()
    purgatory.close()
    _emit(event="result", cpu_s=cpu, statistics=asdict(stats))


async def _publisher(args: argparse.Namespace) -> None:
    names = [f"k{j}" for j in range(args.keys)]
    # One trigger on another channel, which no watcher hears, before the clocks
    # start: the first send loads Redis's script and, with interest routing,
    # builds the partitions' tags (about 0.1 s once per process), which are not
    # a trigger's cost.
    async with RedisTriggers(None, args.url, channel=args.channel + ":warm-up") as warm_up:
        warm_up.advance("warm-up", 0)
        await warm_up.flush()
    async with RedisTriggers(None, args.url, channel=args.channel) as triggers:
        _emit(event="ready", keys=len(names), library=_library())
        advance = triggers.advance
        batch = args.batch
        cpu = time.process_time()
        started = time.perf_counter()
        if batch == 0:
            # Each trigger alone, as a web request that publishes and waits for it:
            # one message per trigger.
            for value in range(1, args.rounds + 1):
                for name in names:
                    advance(name, value)
                    await triggers.flush()
        else:
            for value in range(1, args.rounds + 1):
                for start in range(0, len(names), batch):
                    for name in names[start : start + batch]:
                        advance(name, value)
                    await asyncio.sleep(0)  # the batch leaves while the next gathers
        await triggers.flush()
        cpu = time.process_time() - cpu
        wall = time.perf_counter() - started
        stats = triggers.statistics()
    _emit(
        event="result",
        cpu_s=cpu,
        wall_s=wall,
        triggers=len(names) * args.rounds,
        statistics=asdict(stats),
    )


def _runner(loop: str) -> asyncio.Runner:
    factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    return asyncio.Runner(loop_factory=factory)


def main(argv: Sequence[str] | None = None) -> None:
    import structlog

    # stdout carries the reports; the library's log lines go to stderr.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["watcher", "idle", "publisher"])
    parser.add_argument("url")
    parser.add_argument("--channel", required=True)
    parser.add_argument("--keys", type=int, required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args(argv)
    with _runner(args.loop) as runner:
        role = {"watcher": _watcher, "idle": _idle, "publisher": _publisher}[args.role]
        runner.run(role(args))


if __name__ == "__main__":
    main()
