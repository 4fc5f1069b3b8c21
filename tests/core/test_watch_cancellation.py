"""One rule for cancellation, on asyncio and trio: a cancelled wait cancels the operation
if, and only if, the cancelled call is the one that put the operation in the purgatory.

``await purgatory.watch(op, keys)`` watches and waits: the caller owns the operation,
and cancelling it (a task's ``cancel()``, a trio or anyio cancel scope, a timeout)
withdraws the operation. ``await op`` only observes an operation that someone
watched: cancelling an observer leaves the operation, and its other observers,
alone. (docs/purgatory.md, "Awaiting and cancellation", says why.)
"""

from __future__ import annotations

import asyncio

import anyio
import pytest
import trio

import aiopurgatory as ap
from aiopurgatory import simulation
from tests.support.backends import each_backend, now, settle

CANCELLED = ap.Outcome.CANCELLED
COMPLETED = ap.Outcome.COMPLETED
EXPIRED = ap.Outcome.EXPIRED


def assert_empty(p: ap.Purgatory[ap.DelayedOperation]) -> None:
    assert (p.watched, p.delayed, p.pending, len(p.timer)) == (0, 0, 0, 0)


# -- the owner: watch() ---------------------------------------------------------------


@each_backend(virtual=True)
async def test_a_cancel_scope_around_watch_cancels_the_op() -> None:
    p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
    op = ap.DelayedOperation(10.0)
    with anyio.move_on_after(1.0) as scope:
        await p.watch(op, ["k"])
    assert scope.cancelled_caught
    assert op.cancelled()
    assert op.result() is CANCELLED
    assert now() == pytest.approx(1.0, abs=0.01)
    assert_empty(p)
    assert p.statistics().cancelled == 1


@each_backend(virtual=True)
async def test_a_cancelled_task_group_cancels_every_watch_in_it() -> None:
    p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
    ops = [ap.DelayedOperation(10.0) for _ in range(3)]
    async with anyio.create_task_group() as tg:
        for i, op in enumerate(ops):
            tg.start_soon(p.watch, op, [f"k{i}"])
        await settle()
        assert p.pending == 3
        tg.cancel_scope.cancel()
    assert [op.outcome for op in ops] == [CANCELLED] * 3
    assert_empty(p)


@each_backend(virtual=True)
async def test_a_timeout_around_watch_cancels_the_op_and_raises_timeout_error() -> None:
    p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
    op = ap.DelayedOperation(10.0)
    with pytest.raises(TimeoutError):
        async with ap.timeout(1.0):
            await p.watch(op, ["k"])
    assert op.cancelled()
    assert_empty(p)


def test_asyncio_task_cancel_cancels_the_watched_op() -> None:
    async def main() -> None:
        p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
        op = ap.DelayedOperation(10.0)
        task = asyncio.create_task(p.watch(op, ["k"]))
        await asyncio.sleep(0)
        assert p.pending == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert op.cancelled()
        assert_empty(p)

    simulation.run(main())


def test_trio_cancel_scope_cancels_the_watched_op() -> None:
    async def main() -> None:
        p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
        op = ap.DelayedOperation(10.0)
        with trio.move_on_after(1.0):
            await p.watch(op, ["k"])
        assert op.cancelled()
        assert trio.current_time() == pytest.approx(1.0, abs=0.01)
        assert_empty(p)

    simulation.run_trio(main)


@each_backend(virtual=True)
async def test_cancelled_after_the_op_finished_keeps_the_outcome() -> None:
    # The rule withdraws a pending op; a finished one keeps its outcome.
    p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
    op = ap.DelayedOperation(10.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(p.watch, op, ["k"])
        await settle()
        op.force_complete()
        tg.cancel_scope.cancel()
    assert op.result() is COMPLETED
    assert p.statistics().cancelled == 0


# -- observers: await op --------------------------------------------------------------


@each_backend(virtual=True)
async def test_a_cancelled_observer_leaves_the_op_and_other_observers_alone() -> None:
    p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
    op = ap.DelayedOperation(5.0)
    p.try_complete_else_watch(op, ["k"])
    seen: list[ap.Outcome] = []

    async def observe() -> None:
        seen.append(await op)

    async with anyio.create_task_group() as tg:
        tg.start_soon(observe)
        with anyio.move_on_after(1.0) as scope:
            await op
        assert scope.cancelled_caught
        assert not op.done()
        assert (p.pending, p.delayed) == (1, 1)
    # The op ran to its own timeout; the other observer saw it.
    assert seen == [EXPIRED]
    assert op.result() is EXPIRED
    assert now() == pytest.approx(5.0, abs=0.01)
    assert p.statistics().cancelled == 0


def test_asyncio_task_cancel_of_an_observer_does_not_cancel_the_op() -> None:
    async def main() -> None:
        p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
        op = ap.DelayedOperation(10.0)
        p.try_complete_else_watch(op, ["k"])

        async def observe() -> ap.Outcome:
            return await op

        observer = asyncio.create_task(observe())
        await asyncio.sleep(0)
        observer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await observer
        assert not op.done()
        assert op.force_complete()
        assert await op is COMPLETED

    simulation.run(main())


def test_trio_cancel_scope_around_an_observer_does_not_cancel_the_op() -> None:
    async def main() -> None:
        p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
        op = ap.DelayedOperation(10.0)
        p.try_complete_else_watch(op, ["k"])
        with trio.move_on_after(1.0):
            await op
        assert not op.done()
        assert await op is EXPIRED
        assert trio.current_time() == pytest.approx(10.0, abs=0.01)

    simulation.run_trio(main)


@each_backend(virtual=True)
async def test_a_timeout_around_an_observer_raises_and_leaves_the_op() -> None:
    p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
    op = ap.DelayedOperation(10.0)
    p.try_complete_else_watch(op, ["k"])
    with pytest.raises(TimeoutError):
        async with ap.timeout(1.0):
            await op
    assert not op.done()
    op.cancel()  # to cancel an op you observe, say so
    assert op.cancelled()
    assert_empty(p)
