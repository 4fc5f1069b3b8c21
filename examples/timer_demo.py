"""A small tour of the timer layer on virtual time: many timers, most cancelled.

Run with ``python examples/timer_demo.py`` (or ``make demo``); ``--real-time``
runs it on the wall clock instead.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import structlog

import aiopurgatory as ap
from aiopurgatory import simulation


async def demo(n: int, seed: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    rng = random.Random(seed)
    lateness: list[float] = []

    def fired(when: float) -> None:
        lateness.append(loop.time() - when)

    started = time.process_time()
    kept = 0
    for i in range(n):
        when = loop.time() + rng.random()
        handle = timer.call_at(when, fired, when)
        if i % 10:
            handle.cancel()
        else:
            kept += 1
    scheduled = time.process_time() - started
    pending = len(timer)
    # Every delay is below 1 s: after 1.1 s all kept timers must have fired.
    await asyncio.sleep(1.1)
    lateness.sort()
    return {
        "timers": n,
        "kept": kept,
        "pending_after_add": pending,
        "fired": len(lateness),
        "early": sum(1 for x in lateness if x < 0),
        "lateness_p50_ms": 1000 * lateness[len(lateness) // 2],
        "lateness_max_ms": 1000 * lateness[-1],
        "add_cancel_us": 1e6 * scheduled / n,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=100_000, help="timers to add (default 100000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--real-time", action="store_true", help="use the wall clock")
    args = parser.parse_args(argv)
    # An application configures logging; the library never does.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(20))
    if args.n < 1:
        parser.error("-n must be at least 1")
    if args.real_time:
        result = asyncio.run(demo(args.n, args.seed))
    else:
        result = simulation.run(demo(args.n, args.seed))
    for key, value in result.items():
        print(f"{key:>18}: {value:.3f}" if isinstance(value, float) else f"{key:>18}: {value}")
    return 0 if result["early"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
