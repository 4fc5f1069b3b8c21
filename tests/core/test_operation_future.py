"""A DelayedOperation answers like an ``asyncio.Future``: ``done()``, ``cancelled()``,
``result()`` and ``exception()`` are methods, with a Future's errors (SPEC.md "Changes").
"""

from __future__ import annotations

import asyncio
import inspect

import anyio
import pytest

import aiopurgatory as ap
from tests.support.backends import each_backend


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
