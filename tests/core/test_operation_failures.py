"""A failed callback of an operation: raised to whoever receives it and logged only if nobody
does (once, when the operation is collected; at once outside any loop), and a missing
``timeout`` named with the class.

On both cores (the suite runs on each): issue 30's traps of a first hour, made loud.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from structlog.testing import capture_logs

import aiopurgatory as ap
from tests.support.backends import each_backend, settle
from tests.support.purgatory import Boom, FailingOnComplete


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
