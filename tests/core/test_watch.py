"""``Purgatory.watch()`` (aiopurgatory._watch) against SPEC.md: what it returns, and cancellation.

Backend-neutral, as ``tests/core/test_purgatory.py`` (see there and ``tests/support/backends.py``);
the rule for a cancelled wait on every backend is ``test_watch_cancellation.py``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import anyio.to_thread
import pytest

import aiopurgatory as ap
from aiopurgatory import simulation
from tests.support.backends import each_backend, now, settle
from tests.support.purgatory import (
    CANCELLED,
    COMPLETED,
    EXPIRED,
    Op,
    assert_clean,
    observe,
    outcome,
    start,
)

# =====================================================================================
# watch(): outcomes and cancellation
# =====================================================================================


@each_backend(virtual=True)
async def test_watch_returns_completed_when_triggered() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    async with anyio.create_task_group() as tg:
        task = start(tg, p.watch, op, ["k"])
        await anyio.sleep(0.1)
        assert not task.done()
        op.completable = True
        assert p.check_and_complete("k") == 1
        assert await task.result() is COMPLETED
    assert now() == 0.1


@each_backend(virtual=True)
async def test_watch_returns_completed_at_once_when_completable() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    assert await p.watch(Op(1.0, completable=True), ["k"]) is COMPLETED
    assert now() == 0


@each_backend(virtual=True)
async def test_watch_returns_expired() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(0.3)
    assert await p.watch(op, ["k"]) is EXPIRED
    assert now() == 0.3
    assert op.callbacks() == ["on_complete", "on_expiration"]
    assert_clean(p)


@each_backend(virtual=True)
@pytest.mark.parametrize("how", ["op.cancel", "cancel_for_key", "close"])
async def test_watch_returns_cancelled_when_someone_else_cancels(how: str) -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    async with anyio.create_task_group() as tg:
        task = start(tg, p.watch, op, ["k"])
        await anyio.sleep(0.1)
        if how == "op.cancel":
            assert op.cancel() is True
        elif how == "cancel_for_key":
            assert p.cancel_for_key("k") == [op]
        else:
            p.close()
        assert await task.result() is CANCELLED
    assert op.callbacks() == []
    assert_clean(p)


@each_backend(virtual=True)
async def test_cancelling_the_watching_task_cancels_the_op() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    async with anyio.create_task_group() as tg:
        observer = start(tg, observe, op)
        task = start(tg, p.watch, op, ["a", "b"])
        await anyio.sleep(0.1)
        assert (p.watched, p.delayed) == (2, 1)
        task.cancel()  # asyncio task cancellation on asyncio, a cancel scope on trio
        await task.wait()
        assert task.cancelled  # the cancellation came out of watch()
        assert op.outcome is CANCELLED
        assert op.callbacks() == []
        assert_clean(p)
        assert p.statistics().cancelled == 1
        assert await observer.result() is CANCELLED  # observers are released with the outcome
        await anyio.sleep(2)  # the old deadline passes: nothing fires
    assert op.callbacks() == []


@pytest.mark.virtual_time  # asyncio only: a cancel thrown into a task already woken
async def test_task_cancelled_after_the_op_finished_keeps_the_outcome() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    task = asyncio.create_task(p.watch(op, ["k"]))
    await settle()
    assert op.force_complete() is True  # wakes the task...
    task.cancel()  # ...which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await task
    assert op.outcome is COMPLETED
    assert op.callbacks() == ["on_complete"]
    assert p.statistics().cancelled == 0


@each_backend(virtual=True)
async def test_cancel_scope_cancelled_after_the_op_finished_keeps_the_outcome() -> None:
    # The counterpart of the test above on every backend. A cancel scope (trio's,
    # or anyio's on asyncio) delivers its cancellation at the task's next
    # checkpoint, and a task whose waiter is already set has none left in watch():
    # the op keeps its outcome and the task gets it.
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    async with anyio.create_task_group() as tg:
        task = start(tg, p.watch, op, ["k"])
        await settle()
        assert op.force_complete() is True  # wakes the task...
        task.cancel()  # ...whose scope is cancelled before it runs again
        assert await task.result() is COMPLETED
    assert not task.cancelled
    assert op.outcome is COMPLETED
    assert op.callbacks() == ["on_complete"]
    assert p.statistics().cancelled == 0


@pytest.mark.virtual_time  # asyncio only: asyncio.timeout; on every backend below
async def test_watch_under_asyncio_timeout_cancels_the_op() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await p.watch(op, ["k"])
    assert op.outcome is CANCELLED
    assert asyncio.get_running_loop().time() == 0.2
    assert_clean(p)


@asynccontextmanager
async def _fail_after(seconds: float) -> AsyncIterator[None]:
    with anyio.fail_after(seconds):
        yield


@each_backend(virtual=True)
@pytest.mark.parametrize(
    "deadline", [_fail_after, ap.timeout], ids=["anyio.fail_after", "ap.timeout"]
)
async def test_watch_under_a_deadline_cancels_the_op(
    deadline: Callable[[float], contextlib.AbstractAsyncContextManager[object]],
) -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    with pytest.raises(TimeoutError):
        async with deadline(0.2):
            await p.watch(op, ["k"])
    assert op.outcome is CANCELLED
    assert now() == 0.2
    assert_clean(p)


@each_backend(virtual=True)
async def test_await_op_is_observing_only() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(0.5)
    async with anyio.create_task_group() as tg:
        watcher = start(tg, p.watch, op, ["k"])
        observers = [start(tg, observe, op) for _ in range(3)]
        await anyio.sleep(0.1)
        observers[0].cancel()
        await observers[0].wait()
        assert observers[0].cancelled
        assert outcome(op) is None
        assert not watcher.done()
        assert (p.watched, p.delayed) == (1, 1)
        assert await watcher.result() is EXPIRED
        assert [await o.result() for o in observers[1:]] == [EXPIRED, EXPIRED]


def test_watch_called_unbound_with_none_is_a_type_error() -> None:
    # watch() hands the purgatory to a C function of the compiled core, which must
    # not take None on (it would crash the process, not raise).
    async def main() -> None:
        op = Op(1.0)
        with pytest.raises(TypeError, match="method of a Purgatory"):
            await ap.Purgatory.watch(None, op, ["k"])  # type: ignore[arg-type]
        assert op.outcome is None  # nothing changed: the op can still be watched
        purgatory: ap.Purgatory[Op] = ap.Purgatory()
        assert purgatory.try_complete_else_watch(op, ["k"]) is False
        purgatory.close()

    simulation.run(main())


# -- watch() is a coroutine function -------------------------------------------------


def test_watch_is_a_coroutine_function_and_an_unawaited_watch_warns() -> None:
    # SPEC: `async def watch`, on both cores (the compiled core's is Cython's
    # coroutine; a plain function returning an awaitable would not pass).
    assert inspect.iscoroutinefunction(ap.Purgatory.watch)
    p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
    op = ap.DelayedOperation(1.0)
    # A forgotten await is not silent: Python's "never awaited" warning, and
    # nothing was watched (the watch starts when awaited).
    coro = p.watch(op, ["k"])
    assert asyncio.iscoroutine(coro)
    with pytest.warns(RuntimeWarning, match="was never awaited"):
        del coro
    assert not op.done()
    assert p.watched == 0
    assert op.keys == ()
