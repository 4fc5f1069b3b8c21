"""Nothing is retained per finished operation (SPEC: finished ops leave every list at once).

Kafka keeps completed operations in other keys' watch lists until a periodic
purge, which has caused broker OOMs. Here, after a round of 100k operations has
finished (completed by triggers, expired, cancelled one by one, cancelled by
key), the memory traced by ``tracemalloc`` must be back near where it was
before the round, and repeating the round must not make it grow.

Runs on the virtual-time loop, so that the expiry share of a round costs no wall
time and every run is the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import tracemalloc
from collections.abc import Hashable, Iterator

import pytest

import aiopurgatory as ap

ROUND = 100_000
SMALL_ROUND = 5_000  # rounds repeated to check for growth (tracing is slow)
KEY_SPACE = 100  # Kafka's TestPurgatoryPerformance: 3 keys from 100

# Tolerances, generous on purpose:
# * A round holds about 100k live ops at its peak, some hundreds of bytes each
#   (tens of MB): "near baseline" allows 512 KiB, under 6 bytes per op of the
#   round, which any per-op leak (one dict entry, one list slot) would exceed.
# * Between round 2 and round 5 of 5k ops, 128 KiB, under 9 bytes per op of
#   those 15k ops: room for allocator and interpreter noise (free lists, the
#   wheel's heap of buckets), not for anything kept per op (a dict entry alone
#   is over 30 bytes).
NEAR_BASELINE = 512 * 1024
NO_GROWTH = 128 * 1024
# A smaller bound for the focused tests below, whose leftovers would be close to 0.
SMALL_LEFTOVER = 256 * 1024


class Op(ap.DelayedOperation):
    __slots__ = ("completable",)

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.completable = False

    def try_complete(self) -> bool:
        return self.force_complete() if self.completable else False


@contextlib.contextmanager
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


def traced_now() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


class Workload:
    """Timeouts and keys for a round, drawn once before tracing starts.

    Drawing them inside the traced rounds would only add tracing overhead (and
    the lists, alive for the whole test, would not be "per finished op" anyway).
    """

    def __init__(self, size: int, seed: int = 1) -> None:
        rng = random.Random(seed)
        # Timeouts 1..200 ms on a 1 ms tick: every level-0 bucket and one overflow level.
        self.timeouts = [rng.randint(1, 200) / 1000 for _ in range(size)]
        self.keys: list[list[Hashable]] = []
        for i in range(size):
            keys: list[Hashable] = [rng.randrange(KEY_SPACE) for _ in range(3)]
            if i % 10 == 0:
                keys.append(("own", i))  # a key nobody else uses: its list must vanish
            self.keys.append(keys)


async def one_round(p: ap.Purgatory[Op], work: Workload, size: int) -> None:
    ops = []
    for i in range(size):
        op = Op(work.timeouts[i])
        p.try_complete_else_watch(op, work.keys[i])
        ops.append(op)
    assert p.delayed == size
    for i, op in enumerate(ops):
        kind = i % 4
        if kind == 0:
            op.completable = True
        elif kind == 1:
            op.cancel()
    for key in range(KEY_SPACE // 2):
        p.check_and_complete(key)
    for key in range(KEY_SPACE // 2, KEY_SPACE // 2 + 5):
        p.cancel_for_key(key)
    del ops
    await asyncio.sleep(0.25)  # everything left expires (or completes on its key first)
    assert (p.watched, p.delayed, p.statistics().keys) == (0, 0, 0)
    assert len(p.timer) == 0


def assert_mixed(p: ap.Purgatory[Op], ops: int) -> None:
    stats = p.statistics()
    assert stats.completed + stats.expired + stats.cancelled == ops
    assert min(stats.completed, stats.expired, stats.cancelled) > ops // 10  # a real mix


@pytest.mark.virtual_time
async def test_memory_returns_to_baseline_after_100k_ops() -> None:
    work = Workload(ROUND)
    p: ap.Purgatory[Op] = ap.Purgatory("memory")
    with traced():
        await one_round(p, work, 1000)  # warm up: wheel levels, code paths, free lists
        baseline = traced_now()
        await one_round(p, work, ROUND)
        after = traced_now()
        peak = tracemalloc.get_traced_memory()[1]
    assert_mixed(p, 1000 + ROUND)
    # The round did hold a lot of memory at its peak: the measurement can see ops.
    assert peak - baseline > 20 * NEAR_BASELINE, (baseline, peak)
    assert after - baseline < NEAR_BASELINE, (baseline, after, peak)
    p.close()


@pytest.mark.virtual_time
async def test_memory_does_not_grow_over_rounds() -> None:
    work = Workload(SMALL_ROUND, seed=2)
    p: ap.Purgatory[Op] = ap.Purgatory("memory")
    with traced():
        after = []
        for _ in range(5):
            await one_round(p, work, SMALL_ROUND)
            after.append(traced_now())
    assert_mixed(p, 5 * SMALL_ROUND)
    # Round 1 may still warm things up; from round 2 on the level must be flat.
    assert after[4] - after[1] < NO_GROWTH, after
    p.close()


class Observed(ap.DelayedOperation):
    pass


@pytest.mark.virtual_time
async def test_cancelled_observers_are_not_retained() -> None:
    p: ap.Purgatory[Observed] = ap.Purgatory()
    op = Observed(3600.0)
    p.try_complete_else_watch(op, ["k"])

    async def poll(times: int) -> None:
        for _ in range(times):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(op, 0.001)

    with traced():
        await poll(100)
        before = traced_now()
        await poll(2000)
        grown = traced_now() - before
    op.cancel()
    assert grown < 64 * 1024, f"{grown} bytes retained by 2000 cancelled observers"


async def _watch_many(p: ap.Purgatory[Op], keys: list[list[Hashable]], finish: str) -> int:
    """Traced memory left behind by ``len(keys)`` ops once finished and the wheel moved on."""
    ops = [Op(1.0) for _ in keys]
    with traced():
        baseline = traced_now()
        for op, key in zip(ops, keys, strict=True):
            p.try_complete_else_watch(op, key)
        if finish == "cancel":
            for op in ops:
                op.cancel()
        del ops  # what the ops themselves hold (their keys, deadlines) is not the point
        # Let the wheel pass the bucket that held them (its storage may be kept till
        # then); the probe makes an idle timer move its wheel's clock.
        await asyncio.sleep(2)
        probe = Op(0.001)
        p.try_complete_else_watch(probe, ["probe"])
        await probe
        del probe
        after = traced_now()
    assert (p.watched, p.delayed, p.statistics().keys) == (0, 0, 0)
    return after - baseline


@pytest.mark.virtual_time
async def test_memory_returns_to_baseline_after_many_distinct_keys() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory("keys")
    await p.watch(Op(0.001), ["warm-up"])
    # Expiry empties the wheel bucket through its firing path, which drops its storage:
    # what is left is the purgatory's own.
    left = await _watch_many(p, [[("request", i)] for i in range(20_000)], "expire")
    assert left < SMALL_LEFTOVER, left


@pytest.mark.virtual_time
async def test_memory_returns_to_baseline_after_cancelling_a_full_bucket() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory("bucket")
    await p.watch(Op(0.001), ["warm-up"])
    # One key: its watch list is dropped when empty; only the wheel bucket can keep storage.
    left = await _watch_many(p, [["k"] for _ in range(20_000)], "cancel")
    assert left < SMALL_LEFTOVER, left
