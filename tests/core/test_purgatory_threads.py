"""check_and_complete_threadsafe raced by 20 threads (Kafka's DelayedOperationTest lock test).

Each operation needs one "arrival" from every thread before its condition holds.
Every thread, for every operation, records its arrival and triggers the op's
key from its own thread. The triggers race with each other and with the arrivals
of other threads; still every operation must complete exactly once, and the
counts returned through the futures must add up to the number of operations.
Runs on the real loops (asyncio and uvloop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading
import time

import aiopurgatory as ap

THREADS = 20
OPS = 100
KEY_SPACE = 10  # several ops share a key, so one trigger may complete several


class Gathering(ap.DelayedOperation):
    """Completes once ``needed`` arrivals were recorded (from any thread)."""

    def __init__(self, needed: int) -> None:
        super().__init__(60.0)
        self.needed = needed
        self.arrivals = 0
        self.lock = threading.Lock()
        self.completions = 0

    def arrive(self) -> None:
        with self.lock:
            self.arrivals += 1

    def try_complete(self) -> bool:
        with self.lock:
            ready = self.arrivals >= self.needed
        return self.force_complete() if ready else False

    def on_complete(self) -> None:
        self.completions += 1


def join_all(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join()


async def test_twenty_threads_trigger_concurrently() -> None:
    purgatory: ap.Purgatory[Gathering] = ap.Purgatory()
    ops = [Gathering(THREADS) for _ in range(OPS)]
    keys = [f"key-{i % KEY_SPACE}" for i in range(OPS)]
    for op, key in zip(ops, keys, strict=True):
        assert purgatory.try_complete_else_watch(op, [key, f"own-{id(op)}"]) is False
    assert purgatory.delayed == OPS

    start = threading.Barrier(THREADS)
    futures: list[concurrent.futures.Future[int]] = []
    futures_lock = threading.Lock()

    def worker(seed: int) -> None:
        order = list(range(OPS))
        random.Random(seed).shuffle(order)
        mine = []
        start.wait()
        for i in order:
            ops[i].arrive()
            mine.append(purgatory.check_and_complete_threadsafe(keys[i]))
        with futures_lock:
            futures.extend(mine)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(THREADS)]
    for thread in threads:
        thread.start()

    async with asyncio.timeout(60):
        await asyncio.to_thread(join_all, threads)
        counts = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))

    assert len(futures) == THREADS * OPS
    assert sum(counts) == OPS
    assert all(op.outcome is ap.Outcome.COMPLETED for op in ops)
    assert [op.completions for op in ops] == [1] * OPS
    stats = purgatory.statistics()
    assert (stats.completed, stats.watched, stats.delayed, stats.keys) == (OPS, 0, 0, 0)
    assert len(purgatory.timer) == 0
    purgatory.close()


async def test_threadsafe_triggers_while_ops_are_being_watched() -> None:
    # Triggers arrive from threads while the loop keeps adding operations: none is
    # lost, with one check per watch (the triggers run on the loop, never between
    # an op's check and its joining the watch lists).
    purgatory: ap.Purgatory[Gathering] = ap.Purgatory()
    ops: list[Gathering] = []
    stop = threading.Event()
    futures: list[concurrent.futures.Future[int]] = []

    def trigger() -> None:
        # Bounded and paced, so the loop is raced but not flooded.
        for _ in range(2000):
            if stop.is_set():
                break
            futures.append(purgatory.check_and_complete_threadsafe("shared"))
            time.sleep(0.0001)

    threads = [threading.Thread(target=trigger) for _ in range(4)]
    # Bind first so that the threads' triggers reach the loop.
    first = Gathering(0)
    purgatory.try_complete_else_watch(first, ["shared"])
    ops.append(first)
    for thread in threads:
        thread.start()
    try:
        for _ in range(200):
            op = Gathering(1)
            op.arrive()  # already completable: completes at its first check
            pending = Gathering(1)
            assert purgatory.try_complete_else_watch(op, ["shared"]) is True
            purgatory.try_complete_else_watch(pending, ["shared"])
            ops += [op, pending]
            pending.arrive()  # now only a trigger can complete it
            await asyncio.sleep(0.0002)
    finally:
        stop.set()
        await asyncio.to_thread(join_all, threads)
    async with asyncio.timeout(60):
        await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        # The last pending ops may have arrived after the threads stopped.
        purgatory.check_and_complete("shared")
        await asyncio.gather(*ops)
    assert [op.completions for op in ops] == [1] * len(ops)
    assert purgatory.statistics().completed == len(ops)
    purgatory.close()
