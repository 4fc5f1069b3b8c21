"""Issue 30: the traps a new user met in the first hour, each made impossible or loud.

Every test here failed on main before the fix (both cores: the suite runs twice).
Items 1 and 2 of the issue (a truthy ``try_complete()``, tuple keys) are tested
with the purgatory's watch logic.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
from collections.abc import Iterable, Mapping
from typing import Any

import anyio
import pytest
import trio
from structlog.testing import capture_logs

import aiopurgatory as ap
from aiopurgatory import simulation
from tests.support.backends import each_backend, now, settle


class Boom(Exception):
    pass


class FailingOnComplete(ap.DelayedOperation):
    def on_complete(self) -> None:
        raise Boom("on_complete failed")


class FailingCheck(ap.DelayedOperation):
    def try_complete(self) -> bool:
        raise Boom("try_complete failed")


def _failures(logs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [e for e in logs if e["event"] == "aiopurgatory.callback_failed"]


async def _collect_garbage() -> None:
    await settle()  # the timer lets go of finished operations on its next flush
    gc.collect()
    await settle()  # the log call was handed to the loop


# -- 3. an exception somebody receives is not also logged ----------------------------


@each_backend
async def test_an_exception_raised_to_the_watcher_is_not_also_logged() -> None:
    purgatory: ap.Purgatory[FailingCheck] = ap.Purgatory("first-hour")
    with capture_logs() as logs:
        with pytest.raises(Boom):
            await purgatory.watch(FailingCheck(1.0), ["k"])
        with pytest.raises(Boom):
            purgatory.try_complete_else_watch(FailingCheck(1.0), ["k"])
        await _collect_garbage()
    assert _failures(logs) == []
    assert purgatory.statistics().failed == 2


@each_backend
async def test_a_failure_received_later_is_not_logged() -> None:
    purgatory: ap.Purgatory[FailingOnComplete] = ap.Purgatory("first-hour")
    by_result, by_exception, by_await = (FailingOnComplete(1.0) for _ in range(3))
    with capture_logs() as logs:
        for op in (by_result, by_exception, by_await):
            purgatory.try_complete_else_watch(op, ["k"])
        assert purgatory.check_and_complete("k") == 0  # nothing is ready
        for op in (by_result, by_exception, by_await):
            op.force_complete()  # on_complete raises: contained
        with pytest.raises(Boom):
            by_result.result()
        assert isinstance(by_exception.exception(), Boom)
        with pytest.raises(Boom):
            await by_await
        del by_result, by_exception, by_await, op
        await _collect_garbage()
    assert _failures(logs) == []


@each_backend
async def test_a_failure_nobody_receives_is_logged_once_when_the_op_is_collected() -> None:
    purgatory: ap.Purgatory[FailingOnComplete] = ap.Purgatory("first-hour")
    op = FailingOnComplete(1.0)
    with capture_logs() as logs:
        purgatory.try_complete_else_watch(op, ["k"])
        op.force_complete()
        await _collect_garbage()
        assert _failures(logs) == []  # op is still here: someone may still ask it
        text = repr(op)
        del op
        await _collect_garbage()
    [entry] = _failures(logs)
    assert entry["op"] == text
    assert entry["callback"] == "on_complete"
    assert entry["purgatory"] == "first-hour"
    assert entry["log_level"] == "error"
    assert isinstance(entry["exc_info"], Boom)


def test_a_failure_outside_any_loop_is_logged_at_once() -> None:
    # Nothing can be waiting for it (waiting needs a loop).
    op = FailingOnComplete(1.0)
    with capture_logs() as logs:
        assert op.force_complete() is True
    assert [e["callback"] for e in _failures(logs)] == ["on_complete"]


# -- 4. the done-callback protocol: asyncio.wait and as_completed take operations -----


async def test_asyncio_wait_takes_operations() -> None:
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("first-hour")
    fast, slow = ap.DelayedOperation(0.01), ap.DelayedOperation(30.0)
    purgatory.try_complete_else_watch(fast, ["k"])
    purgatory.try_complete_else_watch(slow, ["k"])
    # typeshed types asyncio.wait for futures only, hence the ignores.
    done, pending = await asyncio.wait(  # type: ignore[type-var]
        [fast, slow], return_when=asyncio.FIRST_COMPLETED
    )
    assert (done, pending) == ({fast}, {slow})
    assert fast.result() is ap.Outcome.EXPIRED
    slow.force_complete()
    done, pending = await asyncio.wait([fast, slow])  # type: ignore[type-var]
    assert (done, pending) == ({fast, slow}, set())
    # The waiter's callback was removed from the op that was pending: nothing is left.
    assert slow._waiters is None


async def test_asyncio_wait_first_exception_and_timeout() -> None:
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("first-hour")
    failing, other = FailingOnComplete(30.0), ap.DelayedOperation(30.0)
    purgatory.try_complete_else_watch(failing, ["k"])
    purgatory.try_complete_else_watch(other, ["k"])
    asyncio.get_running_loop().call_soon(failing.force_complete)
    done, pending = await asyncio.wait(  # type: ignore[type-var]
        [failing, other], return_when=asyncio.FIRST_EXCEPTION
    )
    assert (done, pending) == ({failing}, {other})
    assert isinstance(failing.exception(), Boom)
    done, pending = await asyncio.wait([other], timeout=0.01)  # type: ignore[type-var]
    assert (done, pending) == (set(), {other})
    assert other._waiters is None  # asyncio.wait removed its callback
    other.cancel()


async def test_asyncio_as_completed_takes_operations() -> None:
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("first-hour")
    ops = [ap.DelayedOperation(0.03), ap.DelayedOperation(0.01), ap.DelayedOperation(30.0)]
    for op in ops:
        purgatory.try_complete_else_watch(op, ["k"])
    asyncio.get_running_loop().call_later(0.02, ops[2].force_complete)
    outcomes = [await next_done for next_done in asyncio.as_completed(ops)]
    assert outcomes == [ap.Outcome.EXPIRED, ap.Outcome.COMPLETED, ap.Outcome.EXPIRED]


async def test_done_callbacks_are_called_soon_with_the_op_in_order() -> None:
    calls: list[tuple[str, ap.DelayedOperation]] = []
    op = ap.DelayedOperation(1.0)
    op.add_done_callback(lambda o: calls.append(("first", o)))
    op.add_done_callback(lambda o: calls.append(("second", o)))
    assert op.force_complete()
    assert calls == []  # never inside the call that finished it (call_soon)
    await asyncio.sleep(0)
    assert calls == [("first", op), ("second", op)]
    op.add_done_callback(lambda o: calls.append(("late", o)))
    assert calls[-1][0] == "second"  # already done: scheduled, not called
    await asyncio.sleep(0)
    assert calls[-1] == ("late", op)


async def test_remove_done_callback_and_context() -> None:
    calls: list[str] = []
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="outer")

    def record(op: ap.DelayedOperation) -> None:
        calls.append(var.get())

    op = ap.DelayedOperation(1.0)
    op.add_done_callback(record)
    op.add_done_callback(record)
    context = contextvars.copy_context()
    context.run(var.set, "given")
    op.add_done_callback(lambda o: record(o), context=context)
    assert op.remove_done_callback(record) == 2
    assert op.remove_done_callback(record) == 0
    op.cancel()
    await asyncio.sleep(0)
    assert calls == ["given"]
    with pytest.raises(TypeError, match="fn must be callable"):
        op.add_done_callback(None)  # type: ignore[arg-type]


def test_finishing_an_op_after_its_loop_closed_drops_its_done_callbacks() -> None:
    calls: list[ap.DelayedOperation] = []
    op = ap.DelayedOperation(1.0)

    async def register() -> None:
        op.add_done_callback(calls.append)

    loop = asyncio.new_event_loop()
    loop.run_until_complete(register())
    loop.close()
    assert op.cancel() is True  # no "Event loop is closed" from the callback's scheduling
    assert calls == []


def test_add_done_callback_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        ap.DelayedOperation(1.0).add_done_callback(print)


async def test_a_done_callbacks_exception_goes_to_the_loop() -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))

    def fail(op: ap.DelayedOperation) -> None:
        raise Boom("done callback")

    op = ap.DelayedOperation(1.0)
    op.add_done_callback(fail)
    op.cancel()
    await asyncio.sleep(0)
    assert [type(e["exception"]) for e in errors] == [Boom]


def test_done_callbacks_on_trio() -> None:
    calls: list[ap.DelayedOperation] = []

    def fail(op: ap.DelayedOperation) -> None:
        raise Boom("done callback")

    async def main() -> ap.DelayedOperation:
        purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("first-hour")
        op = ap.DelayedOperation(0.01)
        op.add_done_callback(calls.append)
        op.add_done_callback(fail)  # logged, does not end the run
        with capture_logs() as logs:
            assert await purgatory.watch(op, ["k"]) is ap.Outcome.EXPIRED
            await trio.testing.wait_all_tasks_blocked()
        assert [e["event"] for e in logs] == ["aiopurgatory.done_callback_failed"]
        return op

    op = trio.run(main)
    assert calls == [op]


# -- 5. zero and negative delays are due now ------------------------------------------


async def test_a_zero_timeout_expires_within_a_few_loop_iterations() -> None:
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("first-hour")
    op = ap.DelayedOperation(0)
    purgatory.try_complete_else_watch(op, ["k"])
    assert not op.done()  # never synchronously
    iterations = 0
    while not op.done():
        await asyncio.sleep(0)
        iterations += 1
    assert op.outcome is ap.Outcome.EXPIRED
    assert iterations <= 2  # was ~200 (a whole 1 ms tick) on asyncio


@pytest.mark.parametrize("delay", [0.0, -1.0])
async def test_zero_or_negative_call_later_runs_with_loop_call_later_zero(delay: float) -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    order: list[str] = []
    timer.call_later(delay, order.append, "timer first")
    loop.call_later(0, order.append, "loop")
    timer.call_later(delay, order.append, "timer second")
    assert order == []
    for _ in range(3):
        await asyncio.sleep(0)
    # The timer's own entries in scheduling order; the first one no later than a
    # loop.call_later(0) scheduled after it (it used to run a tick later).
    assert order.index("timer first") < order.index("loop")
    assert order.index("timer first") < order.index("timer second")


async def test_positive_delays_are_never_early() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    fired: list[tuple[float, float]] = []

    def fire(when: float) -> None:
        fired.append((when, loop.time()))

    for i in range(200):
        delay = (i % 20) * 0.0001  # 0 to 1.9 ms, within a tick and across one
        when = loop.time() + delay
        timer.call_at(when, fire, when)
        if i % 7 == 0:
            await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    assert len(timer) == 0
    assert len(fired) == 200
    assert all(now >= when for when, now in fired)


@each_backend(virtual=True)
async def test_a_zero_timeout_expires_at_the_instant_it_was_watched() -> None:
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("first-hour")
    await anyio.sleep(0.0004)  # between two ticks of the wheel
    start = now()
    assert await purgatory.watch(ap.DelayedOperation(0), ["k"]) is ap.Outcome.EXPIRED
    assert now() == start  # was the next tick, 0.6 ms later


def test_next_due_is_no_later_than_a_zero_delay_entry() -> None:
    # Tools that drive the clock themselves (the trace replay) rely on it.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.0004)  # between two ticks
        timer = ap.Timer()
        ran: list[float] = []
        timer.call_later(0, lambda: ran.append(loop.time()))
        due = timer.next_due()
        assert due is not None
        assert due <= loop.time()
        await asyncio.sleep(0)
        assert ran == [0.0004]
        timer.call_later(0.0003, lambda: None)  # not yet due: its tick, never before
        assert timer.next_due() == 0.001

    simulation.run(main())


# -- 6. the shared timer cannot be closed under ap.timeout() --------------------------


@each_backend
async def test_the_shared_timer_refuses_to_close_and_ap_timeout_keeps_working() -> None:
    shared = ap.shared_timer()
    with pytest.raises(RuntimeError, match=r"shared timer .* cannot be closed"):
        shared.close()
    assert not shared.closed
    assert ap.shared_timer() is shared
    with pytest.raises(TimeoutError):
        async with ap.timeout(0.01):
            await trio.sleep(1) if trio.lowlevel.in_trio_run() else await asyncio.sleep(1)
    own = ap.Timer()
    own.call_later(1.0, print)
    own.close()  # a timer of one's own closes as before
    assert own.closed


# -- 7. a failing timer callback is named in its report -------------------------------


def _failing_callback() -> None:
    raise Boom("timer callback")


async def test_a_failing_timer_callbacks_report_names_it() -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    timer = ap.Timer()
    timer.call_later(0, _failing_callback)
    await asyncio.sleep(0.01)
    [error] = errors
    assert "_failing_callback" in error["message"]
    assert "callback=None" not in error["message"]
    assert isinstance(error["exception"], Boom)


def test_a_failing_timer_callbacks_report_names_it_on_trio() -> None:
    async def main() -> list[Any]:
        timer = ap.Timer()
        with capture_logs() as logs:
            timer.call_later(0, _failing_callback)
            await trio.sleep(0.01)
        return logs

    [entry] = trio.run(main)
    assert entry["event"] == "aiopurgatory.timer_callback_failed"
    assert "_failing_callback" in entry["entry"]


# -- 11. DelayedOperation() names the class and the argument, on both cores -----------


def test_a_missing_timeout_is_named() -> None:
    with pytest.raises(TypeError) as caught:
        ap.DelayedOperation()  # type: ignore[call-arg]
    assert "DelayedOperation" in str(caught.value)
    assert "'timeout'" in str(caught.value)

    class Request(ap.DelayedOperation):
        def __init__(self) -> None:
            super().__init__()  # type: ignore[call-arg]

    with pytest.raises(TypeError, match=r"DelayedOperation.*Request.*'timeout'"):
        Request()
    assert ap.DelayedOperation(timeout=1.5).timeout == 1.5
    assert ap.DelayedOperation(2).timeout == 2.0


def test_a_failure_of_a_loop_that_stopped_is_logged_when_collected() -> None:
    # Handed to a loop that is never run again, the log call would be lost.
    loop = asyncio.new_event_loop()
    ops = [FailingOnComplete(1.0)]

    async def fail() -> None:
        ops[0].force_complete()

    try:
        loop.run_until_complete(fail())
        with capture_logs() as logs:
            ops.clear()
            gc.collect()
        assert [e["callback"] for e in _failures(logs)] == ["on_complete"]
    finally:
        loop.close()
