"""An operation's done callbacks (``add_done_callback`` / ``remove_done_callback``), so that
``asyncio.wait`` and ``asyncio.as_completed`` take operations (SPEC.md "Changes"); on trio too.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

import aiopurgatory as ap
from tests.support.purgatory import Boom, FailingOnComplete

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


# On virtual time: on a loaded machine a real loop that wakes late finds the 30 ms
# expiry due beside the 20 ms completion, and the timer expires what is due.
@pytest.mark.virtual_time
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
