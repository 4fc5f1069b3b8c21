"""Closing a purgatory (``close()``, ``aclose()``, ``async with``) and the Timer it owns or shares.

Backend-neutral, as ``tests/core/test_purgatory.py`` (see there).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect

import anyio
import anyio.abc
import anyio.to_thread
import pytest
from structlog.testing import capture_logs

import aiopurgatory as ap
from aiopurgatory import simulation
from tests.support.backends import each_backend, now, settle
from tests.support.purgatory import (
    CANCELLED,
    COMPLETED,
    EXPIRED,
    Op,
    assert_clean,
    start,
)

# =====================================================================================
# Sharing a Timer
# =====================================================================================


@each_backend(virtual=True)
async def test_purgatories_share_one_timer() -> None:
    timer = ap.Timer(tick=0.01, wheel_size=8)
    p1: ap.Purgatory[Op] = ap.Purgatory("one", timer=timer)
    p2: ap.Purgatory[Op] = ap.Purgatory("two", timer=timer)
    assert p1.timer is timer
    assert p2.timer is timer
    a, b, c = Op(0.05), Op(0.12), Op(0.5)
    p1.try_complete_else_watch(a, ["k"])
    p2.try_complete_else_watch(b, ["k"])
    p2.try_complete_else_watch(c, ["k"])
    assert len(timer) == 3
    assert (p1.delayed, p2.delayed) == (1, 2)
    assert p1.check_and_complete("k") == 0
    assert await a is EXPIRED
    assert a.expired_at == [0.05]
    assert await b is EXPIRED
    assert b.expired_at == [0.12]
    p1.close()
    assert len(timer) == 1  # a shared timer is not closed by one of its purgatories
    assert await c is EXPIRED
    assert c.expired_at == [0.5]
    assert len(timer) == 0
    assert (p1.statistics().expired, p2.statistics().expired) == (1, 2)
    p2.close()
    timer.close()


@each_backend(virtual=True)
async def test_closing_a_shared_timer_cancels_its_ops() -> None:
    timer = ap.Timer()
    p: ap.Purgatory[Op] = ap.Purgatory(timer=timer)
    op = Op(1.0)
    async with anyio.create_task_group() as tg:
        task = start(tg, p.watch, op, ["k"])
        await settle()
        timer.close()
        assert await task.result() is CANCELLED
    assert_clean(p)
    before = p.statistics()
    with pytest.raises(ap.TimerClosedError):
        p.try_complete_else_watch(Op(1.0), ["k"])
    assert p.statistics() == before


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"tick": 0.01}, "tick=0.01"),
        ({"wheel_size": 8}, "wheel_size=8"),
        # The defaults' values are "given" too: a sentinel, not a comparison.
        ({"tick": 0.001}, "tick=0.001"),
        ({"wheel_size": 20}, "wheel_size=20"),
        ({"tick": 0.001, "wheel_size": 20}, "tick=0.001 and wheel_size=20"),
        # Before the value is checked: the combination is the error.
        ({"tick": -1}, "tick=-1"),
    ],
)
def test_timer_with_tick_or_wheel_size_is_a_type_error_naming_both(
    kwargs: dict[str, float], named: str
) -> None:
    timer = ap.Timer()
    with pytest.raises(TypeError) as info:
        ap.Purgatory(timer=timer, **kwargs)  # type: ignore[arg-type]
    assert "timer=" in str(info.value)
    assert named in str(info.value)
    p: ap.Purgatory[Op] = ap.Purgatory(timer=timer)
    assert p.timer is timer


def test_tick_and_wheel_size_without_a_timer_reach_its_timer() -> None:
    assert ap.Purgatory().timer.tick == 0.001
    assert ap.Purgatory().timer.wheel_size == 20
    p: ap.Purgatory[Op] = ap.Purgatory(tick=0.01, wheel_size=8)
    assert (p.timer.tick, p.timer.wheel_size) == (0.01, 8)
    with pytest.raises(ValueError, match="tick"):
        ap.Purgatory(tick=0)
    with pytest.raises(ValueError, match="wheel_size"):
        ap.Purgatory(wheel_size=1)


# =====================================================================================
# close() and async with
# =====================================================================================


@each_backend(virtual=True)
async def test_close_cancels_pending_and_is_idempotent() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    ops = [Op(1.0) for _ in range(3)]
    async with anyio.create_task_group() as tg:
        tasks = [start(tg, p.watch, op, ["k", i]) for i, op in enumerate(ops)]
        await settle()
        done = Op(1.0, completable=True)
        p.try_complete_else_watch(done, ["k"])
        with capture_logs() as logs:
            p.close()
            p.close()
    assert p.closed
    assert [await task.result() for task in tasks] == [CANCELLED] * 3
    assert all(op.callbacks() == [] for op in ops)
    assert done.outcome is COMPLETED
    assert_clean(p)
    assert [e["event"] for e in logs].count("aiopurgatory.purgatory_closed") == 1
    stats = p.statistics()
    assert (stats.completed, stats.cancelled) == (1, 3)
    assert p.check_and_complete("k") == 0
    assert p.cancel_for_key("k") == []
    with pytest.raises(ap.PurgatoryClosedError):
        p.try_complete_else_watch(Op(1.0), ["k"])
    with pytest.raises(ap.PurgatoryClosedError):
        await p.watch(Op(1.0), ["k"])
    assert p.statistics() == stats


@each_backend(virtual=True)
async def test_close_expire_pending_expires_now() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    ops = [Op(5.0) for _ in range(3)]
    async with anyio.create_task_group() as tg:
        tasks = [start(tg, p.watch, op, ["k"]) for op in ops]
        await anyio.sleep(0.5)
        p.close(expire_pending=True)
    assert [await task.result() for task in tasks] == [EXPIRED] * 3
    assert all(op.completed_at == op.expired_at == [0.5] for op in ops)
    assert all(op.callbacks() == ["on_complete", "on_expiration"] for op in ops)
    assert now() == 0.5
    assert_clean(p)
    assert p.statistics().expired == 3


@each_backend(virtual=True)
async def test_close_closes_only_an_owned_timer() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    p.try_complete_else_watch(Op(1.0), ["k"])
    p.close()
    with pytest.raises(ap.TimerClosedError):
        p.timer.call_later(1, lambda: None)


@each_backend(virtual=True)
async def test_async_with_closes() -> None:
    async with anyio.create_task_group() as tg:
        async with ap.Purgatory[Op]("ctx") as p:
            assert isinstance(p, ap.Purgatory)
            op = Op(1.0)
            task = start(tg, p.watch, op, ["k"])
            await settle()
        assert p.closed
        assert await task.result() is CANCELLED


@each_backend
async def test_close_on_an_unused_purgatory() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    p.close()
    assert p.closed
    assert_clean(p)


# -- a timer closed by try_complete itself ------------------------------------------------------


def test_op_whose_try_complete_closes_the_timer_ends_cancelled() -> None:
    timer = ap.Timer()

    class Closing(ap.DelayedOperation):
        calls = 0

        def try_complete(self) -> bool:
            Closing.calls += 1
            if Closing.calls == 1:  # the one check, before joining the watch lists
                timer.close()
            return False

    async def main() -> tuple[ap.Outcome | None, int, int]:
        purgatory: ap.Purgatory[Closing] = ap.Purgatory(timer=timer)
        op = Closing(1.0)
        assert not purgatory.try_complete_else_watch(op, ["k"])
        await asyncio.sleep(2)
        return op.outcome, purgatory.pending, len(timer)

    assert simulation.run(main()) == (ap.Outcome.CANCELLED, 0, 0)
    assert Closing.calls == 1


# -- closing: plain close(), aclose() coroutine -------------------------------------


def test_close_is_plain_and_aclose_is_the_coroutine() -> None:
    assert not inspect.iscoroutinefunction(ap.Purgatory.close)
    assert inspect.iscoroutinefunction(ap.Purgatory.aclose)
    assert not inspect.iscoroutinefunction(ap.Timer.close)
    p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
    assert p.close() is None  # type: ignore[func-returns-value]  # nothing to await, and no "never awaited" warning
    assert p.closed
    p.close()  # idempotent


@each_backend(virtual=True)
async def test_close_cancels_pending_ops_and_wakes_their_awaiters() -> None:
    p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
    op = ap.DelayedOperation(10.0)
    results: list[ap.Outcome] = []

    async def watch() -> None:
        results.append(await p.watch(op, ["k"]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        await settle()
        p.close()
    assert results == [ap.Outcome.CANCELLED]
    assert p.timer.closed  # its own timer
    with pytest.raises(ap.PurgatoryClosedError):
        p.try_complete_else_watch(ap.DelayedOperation(1.0), ["k"])


@each_backend(virtual=True)
async def test_aclose_with_contextlib_aclosing_and_async_with() -> None:
    async with contextlib.aclosing(ap.Purgatory[ap.DelayedOperation]("a")) as p:
        op = ap.DelayedOperation(10.0)
        p.try_complete_else_watch(op, ["k"])
    assert p.closed
    assert op.cancelled()

    async with ap.Purgatory[ap.DelayedOperation]("b") as q:
        expiring = ap.DelayedOperation(10.0)
        q.try_complete_else_watch(expiring, ["k"])
        await q.aclose(expire_pending=True)
        assert expiring.result() is ap.Outcome.EXPIRED
    assert q.closed


def test_aclose_fits_anyio_async_resource() -> None:
    # anyio's AsyncResource: aclose() plus async with; duck-typed by anyio's helpers.
    members = {"aclose", "__aenter__", "__aexit__"}
    assert members <= set(dir(ap.Purgatory))
    assert set(anyio.abc.AsyncResource.__abstractmethods__) <= members


@each_backend(virtual=True)
async def test_anyio_aclose_forcefully_closes_a_purgatory() -> None:
    # aclose() inside an already cancelled scope: it awaits nothing, so it closes.
    p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
    op = ap.DelayedOperation(10.0)
    p.try_complete_else_watch(op, ["k"])
    await anyio.aclose_forcefully(p)  # type: ignore[arg-type]
    assert p.closed
    assert op.cancelled()
