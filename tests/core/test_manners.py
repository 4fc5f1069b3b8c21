"""asyncio's and anyio's manners: what a user of ``asyncio.Future``, ``loop.call_later``,
``loop.close()`` and anyio's resources guesses about the API holds (SPEC "Changes").
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect

import anyio
import pytest

import aiopurgatory as ap
from aiopurgatory import simulation
from tests.support.backends import each_backend, now, settle


class Boom(Exception):
    pass


class FailingOp(ap.DelayedOperation):
    def on_complete(self) -> None:
        raise Boom("on_complete")


# -- DelayedOperation answers like an asyncio.Future ----------------------------------


def test_future_methods_are_methods_not_properties() -> None:
    op = ap.DelayedOperation(1.0)
    for name in ("done", "cancelled", "result", "exception"):
        assert not isinstance(inspect.getattr_static(ap.DelayedOperation, name), property), name
        assert callable(getattr(op, name)), name


def test_a_pending_op_refuses_result_and_exception_as_a_future_does() -> None:
    op = ap.DelayedOperation(1.0)
    assert not op.done()
    assert not op.cancelled()
    with pytest.raises(asyncio.InvalidStateError):
        op.result()
    with pytest.raises(asyncio.InvalidStateError):
        op.exception()
    assert op.outcome is None  # the Kafka-style property never raises


@each_backend(virtual=True)
async def test_completed_expired_and_cancelled_ops_answer_like_futures() -> None:
    p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
    completed, expired, cancelled = (ap.DelayedOperation(1.0) for _ in range(3))
    for op in (completed, expired, cancelled):
        p.try_complete_else_watch(op, ["k"])
    completed.force_complete()
    cancelled.cancel()
    await anyio.sleep(2)
    assert [op.done() for op in (completed, expired, cancelled)] == [True] * 3
    assert [op.cancelled() for op in (completed, expired, cancelled)] == [False, False, True]
    assert completed.result() is ap.Outcome.COMPLETED
    assert expired.result() is ap.Outcome.EXPIRED
    # Cancelling an op is an outcome, not an error: result() does not raise.
    assert cancelled.result() is ap.Outcome.CANCELLED
    assert [op.exception() for op in (completed, expired, cancelled)] == [None] * 3


@each_backend(virtual=True)
async def test_a_failed_callback_is_the_result_s_exception() -> None:
    p: ap.Purgatory[FailingOp] = ap.Purgatory()
    op = FailingOp(1.0)
    p.try_complete_else_watch(op, ["k"])
    assert op.force_complete()
    error = op.exception()
    assert isinstance(error, Boom)
    with pytest.raises(Boom) as info:
        op.result()
    assert info.value is error
    with pytest.raises(Boom):
        await op
    assert op.outcome is ap.Outcome.COMPLETED  # the Kafka-style property stays
    assert op.is_completed


def test_a_never_watched_op_cancelled_answers_too() -> None:
    op = ap.DelayedOperation(1.0)
    assert op.cancel()
    assert op.cancelled()
    assert op.done()
    assert op.result() is ap.Outcome.CANCELLED
    assert op.exception() is None


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


# -- Timer: a closed timer, truthiness, time() ----------------------------------------


def test_timer_closed_error_is_a_runtime_error_named_for_the_timer() -> None:
    assert issubclass(ap.TimerClosedError, RuntimeError)
    assert issubclass(ap.TimerClosedError, ap.PurgatoryError)
    assert not issubclass(ap.TimerClosedError, ap.PurgatoryClosedError)
    assert "TimerClosedError" in ap.__all__


@each_backend(virtual=True)
async def test_a_closed_timer_raises_timer_closed_error_everywhere() -> None:
    timer = ap.Timer()
    p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory(timer=timer)
    timer.close()
    for schedule in (
        lambda: timer.call_later(1, print),
        lambda: timer.call_at(1, print),
        lambda: p.try_complete_else_watch(ap.DelayedOperation(1.0), ["k"]),
    ):
        with pytest.raises(ap.TimerClosedError, match="timer"):
            schedule()
    with pytest.raises(RuntimeError):  # as loop.call_later on a closed loop
        timer.call_later(1, print)
    with pytest.raises(ap.TimerClosedError):
        async with timer.timeout(1):
            pass
    # A closed purgatory keeps its own error.
    p.close()
    with pytest.raises(ap.PurgatoryClosedError):
        p.try_complete_else_watch(ap.DelayedOperation(1.0), ["k"])


def test_an_idle_timer_is_truthy_and_len_counts_pending_entries() -> None:
    async def main() -> None:
        timer = ap.Timer()
        assert bool(timer)
        assert len(timer) == 0
        assert (timer or ap.Timer()) is timer
        handle = timer.call_later(1, print)
        assert bool(timer)
        assert len(timer) == 1
        handle.cancel()
        assert bool(timer)
        assert len(timer) == 0
        timer.close()
        assert bool(timer)

    simulation.run(main())


@each_backend(virtual=True)
async def test_timer_time_is_the_loop_clock() -> None:
    timer = ap.Timer()
    await anyio.sleep(7.5)
    assert timer.time() == now() == 7.5
    fired: list[float] = []
    timer.call_at(timer.time() + 1, lambda: fired.append(timer.time()))
    await anyio.sleep(2)
    assert fired
    assert fired[0] >= 8.5


def test_timer_time_outside_a_loop_binds_like_first_use() -> None:
    with pytest.raises(RuntimeError, match="running event loop"):
        ap.Timer().time()
    closed = ap.Timer()
    closed.close()
    with pytest.raises(ap.TimerClosedError):
        closed.time()


# -- public seams: recorder -------------------------------------------------------------


def test_recorder_is_public_and_set_recorder_sets_it() -> None:
    p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
    initial = p.recorder
    assert initial is None
    seen: list[ap.DelayedOperation] = []
    p.set_recorder(seen.append)
    assert p.recorder == seen.append
    with pytest.raises(AttributeError):
        p.recorder = None  # type: ignore[misc]  # read-only: set_recorder() checks
    p.set_recorder(None)
    assert p.recorder is None
