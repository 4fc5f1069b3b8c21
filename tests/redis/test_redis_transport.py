"""RedisTriggers as an ``aiopurgatory.Triggers`` transport (issue 48).

Against a real redis-server: a watch whose condition the stored watermarks
already meet completes whatever its timeout (0 and 1 ms included), and one they
do not meet expires promptly, on a healthy and on a hung Redis; a virtual-time
loop is refused at once; ``RedisTriggers`` is a ``Triggers`` (checked by mypy
and at run time).
"""

from __future__ import annotations

import asyncio
import time

import pytest

import aiopurgatory as ap
from aiopurgatory.redis import RedisTriggers, SyncPublisher
from aiopurgatory.redis.testing import RedisServer

pytestmark = pytest.mark.realtime


def test_redis_triggers_is_a_triggers_transport() -> None:
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("typed")
    # Checked by mypy (the test files are type-checked), and at run time.
    transport: ap.Triggers = RedisTriggers(purgatory, "redis://127.0.0.1:1/0")
    assert isinstance(transport, ap.Triggers)
    statistics: ap.TriggersStatistics = transport.statistics()
    assert isinstance(statistics, ap.TriggersStatistics)
    assert (statistics.purgatory, statistics.pending, statistics.completed) == ("typed", 0, 0)


@pytest.mark.parametrize("op_timeout", [0, 0.001])
async def test_a_short_watch_sees_a_stored_watermark(
    redis_server: RedisServer, op_timeout: float
) -> None:
    with SyncPublisher(redis_server.url, channel="jobs") as publisher:
        publisher.advance("done", 3)
        publisher.advance("half", 1)
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("now")
    # A grace long enough for a loaded machine's round trip (the default's 0.1 s is
    # what a hung Redis costs such a watch: the next test).
    async with RedisTriggers(
        purgatory, redis_server.url, channel="jobs", catch_up_grace=2.0
    ) as triggers:
        for _ in range(3):  # the first read of a process included
            # "Tell me now": the job is done (stored), the op completes.
            op = ap.WatermarkOperation(op_timeout)
            assert await triggers.watch(op, {"done": 3}) is ap.Outcome.COMPLETED
            # Not met by stored state (below the threshold, or nothing stored):
            # it expires, promptly.
            for keys in ({"half": 3}, {"never": 1}):
                started = time.monotonic()
                outcome = await triggers.watch(ap.WatermarkOperation(op_timeout), keys)
                assert outcome is ap.Outcome.EXPIRED
                assert time.monotonic() - started < 2.5  # after one read, not the grace
        assert triggers.statistics().completed >= 3
        # Many at once share one read (a round trip per loop iteration).
        reads = triggers.statistics().reads
        ops = [ap.WatermarkOperation(op_timeout) for _ in range(50)]
        outcomes = await asyncio.gather(*(triggers.watch(op, {"done": 2}) for op in ops))
        assert set(outcomes) == {ap.Outcome.COMPLETED}
        assert triggers.statistics().reads - reads <= 3


async def test_a_short_watch_on_a_hung_redis_ends_within_the_grace(
    redis_server: RedisServer,
) -> None:
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("hung")
    async with RedisTriggers(
        purgatory, redis_server.url, channel="jobs", catch_up_grace=0.2, close_timeout=0.5
    ) as triggers:
        redis_server.pause()
        try:
            started = time.monotonic()
            op = ap.WatermarkOperation(0)
            assert await triggers.watch(op, {"k": 1}) is ap.Outcome.EXPIRED
            elapsed = time.monotonic() - started
            assert 0.15 < elapsed < 1.0, elapsed  # the grace, then the op's own timeout
            # Cancelled while it reads first: the op is cancelled, as a watch's is.
            op = ap.WatermarkOperation(0)
            waiting = asyncio.ensure_future(triggers.watch(op, {"k": 1}))
            await asyncio.sleep(0.05)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert op.cancelled()
            # An op longer than the grace does not wait for Redis before watching.
            started = time.monotonic()
            op = ap.WatermarkOperation(0.3)
            assert await triggers.watch(op, {"k": 1}) is ap.Outcome.EXPIRED
            elapsed = time.monotonic() - started
            assert 0.25 < elapsed < 1.0, elapsed
        finally:
            redis_server.resume()


def test_catch_up_grace_is_checked() -> None:
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="catch_up_grace must be positive"):
            RedisTriggers(None, "redis://127.0.0.1:1/0", catch_up_grace=bad)


# -- virtual time ------------------------------------------------------------------------


def test_a_virtual_time_loop_is_refused_at_once_and_says_what_to_use() -> None:
    from aiopurgatory import simulation

    async def construct() -> None:
        RedisTriggers(ap.Purgatory("virtual"), "redis://127.0.0.1:1/0")

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="virtual-time loop") as caught:
        simulation.run(construct())
    assert "aiopurgatory.LocalTriggers" in str(caught.value)
    assert "aiopurgatory.simulation.VirtualTimeLoop" in str(caught.value)

    # Made outside any loop, entered in a virtual one: refused on entering,
    # before any connection is tried (the port here refuses, and is not asked).
    made_outside = RedisTriggers(None, "redis://127.0.0.1:1/0")

    async def enter() -> None:
        async with made_outside:
            pass

    with pytest.raises(RuntimeError, match="LocalTriggers"):
        simulation.run(enter())
    assert time.monotonic() - started < 1.0
    assert made_outside.statistics().connection_errors == 0


class Abandoned(BaseException):
    """Neither an Exception nor asyncio's CancelledError (as trio's Cancelled is not)."""


async def test_a_watch_abandoned_by_any_base_exception_cancels_its_op_as_purgatory_watch(
    redis_server: RedisServer,
) -> None:
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("abandoned")
    async with RedisTriggers(purgatory, redis_server.url, channel="jobs") as triggers:
        # 30 s: abandoned while it waits for the op; 0 s: while it reads first.
        for op_timeout in (30, 0):
            for watch in (triggers.watch, purgatory.watch):
                op = ap.WatermarkOperation(op_timeout)
                watching = watch(op, {f"never-{op_timeout}": 1})
                watching.send(None)  # to its first suspension
                with pytest.raises(Abandoned):
                    watching.throw(Abandoned())
                assert op.cancelled()
