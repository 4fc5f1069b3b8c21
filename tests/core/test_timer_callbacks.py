"""A Timer's callbacks: failures contained, re-entrancy, and the context each runs in.

On every backend as ``tests/core/test_timer.py`` (see there); the failing-callback tests on
asyncio read the loop's exception handler, their trio counterparts the driver's report.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import anyio
import pytest
import structlog
import trio
import trio.testing
from structlog.testing import capture_logs

import aiopurgatory as ap
from aiopurgatory import simulation
from tests.support.backends import each_backend, now, run_on
from tests.support.purgatory import Boom
from tests.support.timer import (
    Recorder,
    advance,
    collect_exceptions,
    due_time,
    logged_exception,
    logged_failures,
    next_iteration,
)


@pytest.fixture
def exceptions() -> list[dict[str, Any]]:
    """Route the running loop's exception handler into a list (set by the test)."""
    return []


# -- failures are contained ---------------------------------------------------------------


def _schedule_two_failures(timer: ap.Timer, rec: Recorder) -> ap.TimerHandle:
    """Entries "a", "b" and one raising ValueError("in the wheel") at 0.01 s, one
    raising ValueError("due now") and "c" due at once; returns the failing wheel entry."""

    def boom(what: str) -> None:
        raise ValueError(what)

    timer.call_later(0.01, rec, "a")
    bad = timer.call_later(0.01, boom, "in the wheel")
    timer.call_later(0.01, rec, "b")
    timer.call_later(0, boom, "due now")
    timer.call_later(0, rec, "c")
    return bad


@pytest.mark.virtual_time
async def test_raising_callback_goes_to_the_exception_handler(
    exceptions: list[dict[str, Any]],
) -> None:
    collect_exceptions(exceptions)
    timer = ap.Timer()
    rec = Recorder()
    bad = _schedule_two_failures(timer, rec)
    await asyncio.sleep(1)
    # "c" was due at once; "a" and "b" share a tick (no order promised among them).
    assert rec.names[0] == "c"
    assert sorted(rec.names[1:]) == ["a", "b"]
    assert [str(ctx["exception"]) for ctx in exceptions] == ["due now", "in the wheel"]
    assert all(isinstance(ctx["exception"], ValueError) for ctx in exceptions)
    assert exceptions[1]["timer_handle"] is bad
    assert "timer callback" in exceptions[1]["message"]
    assert len(timer) == 0
    # The timer keeps working.
    timer.call_later(0.5, rec, "d")
    await asyncio.sleep(1)
    assert rec.names[3:] == ["d"]


def test_trio_a_raising_callback_is_logged() -> None:
    # The trio counterpart of the above: trio has no loop exception handler, so the
    # failure is logged (error level, on the stdlib logger "aiopurgatory" here).
    async def main() -> None:
        timer = ap.Timer()
        rec = Recorder()
        with logged_failures() as records:
            bad = _schedule_two_failures(timer, rec)
            await trio.sleep(1)
        # "c" was due at once; "a" and "b" share a tick (no order promised among them).
        assert rec.names[0] == "c"
        assert sorted(rec.names[1:]) == ["a", "b"]
        failures = [logged_exception(record) for record in records]
        assert [str(exc) for exc in failures] == ["due now", "in the wheel"]
        assert all(isinstance(exc, ValueError) for exc in failures)
        assert all(record.levelno == logging.ERROR for record in records)
        fields = getattr(records[1], "aiopurgatory", {})
        assert fields["entry"] == repr(bad)
        assert fields["error"] == repr(failures[1])
        assert len(timer) == 0
        # The timer keeps working.
        timer.call_later(0.5, rec, "d")
        await trio.sleep(1)
        assert rec.names[3:] == ["d"]

    run_on("trio-virtual", main)


@pytest.mark.virtual_time
async def test_base_exceptions_from_callbacks_are_contained_like_asyncio(
    exceptions: list[dict[str, Any]],
) -> None:
    # asyncio's Handle._run reports any BaseException but SystemExit and
    # KeyboardInterrupt to the exception handler; so does the timer.
    collect_exceptions(exceptions)
    timer = ap.Timer()
    rec = Recorder()

    def cancelled() -> None:
        raise asyncio.CancelledError

    timer.call_later(0.01, cancelled)
    timer.call_later(0.01, rec, "after")
    await asyncio.sleep(1)
    assert rec.names == ["after"]
    assert [type(ctx["exception"]) for ctx in exceptions] == [asyncio.CancelledError]


def test_trio_base_exceptions_from_callbacks_are_contained() -> None:
    # The trio counterpart of the above: logged, and the rest of the batch runs.
    async def main() -> None:
        timer = ap.Timer()
        rec = Recorder()

        def cancelled() -> None:
            raise asyncio.CancelledError

        with logged_failures() as records:
            timer.call_later(0.01, cancelled)
            timer.call_later(0.01, rec, "after")
            await trio.sleep(1)
        assert rec.names == ["after"]
        assert [type(logged_exception(record)) for record in records] == [asyncio.CancelledError]

    run_on("trio-virtual", main)


# -- re-entrancy ----------------------------------------------------------------------------


@each_backend(virtual=True)
async def test_callbacks_may_schedule_and_cancel_other_timers() -> None:
    timer = ap.Timer()
    rec = Recorder()
    victims: list[ap.TimerHandle] = []

    def first() -> None:
        rec("first")
        for h in victims:
            h.cancel()
        timer.call_later(0, rec, "due-now child")
        timer.call_later(0.005, rec, "child")
        timer.call_later(100, rec, "far child")

    timer.call_at(0.010, first)
    # Ticks 11 and 12: in the same batch as "first" (see the advance below), after it.
    victims.append(timer.call_at(0.011, rec, "same batch victim"))
    timer.call_at(0.012, rec, "same batch survivor")
    victims.append(timer.call_at(0.5, rec, "later victim"))
    await next_iteration()
    advance(0.1)
    await anyio.sleep(1)
    assert rec.calls == [
        ("first", 0.1),
        ("same batch survivor", 0.1),
        ("due-now child", 0.1),
        ("child", due_time(0.1 + 0.005)),
    ]
    assert all(h.cancelled() for h in victims)
    assert len(timer) == 1
    await anyio.sleep(100)
    assert rec.calls[-1] == ("far child", due_time(0.1 + 100))
    assert len(timer) == 0
    assert now() == 101.1


@each_backend(virtual=True)
async def test_two_callbacks_of_one_tick_cancelling_each_other_run_once() -> None:
    timer = ap.Timer()
    rec = Recorder()
    pair: list[ap.TimerHandle] = []

    def cancel_other(me: int) -> None:
        rec(me)
        pair[1 - me].cancel()

    pair.extend(timer.call_later(0.01, cancel_other, i) for i in (0, 1))
    await anyio.sleep(1)
    assert len(rec.calls) == 1
    ran = rec.names[0]
    assert pair[1 - ran].cancelled()
    assert not pair[ran].cancelled()
    assert len(timer) == 0


@each_backend(virtual=True)
async def test_a_callback_cancelling_itself_is_harmless() -> None:
    timer = ap.Timer()
    handles: list[ap.TimerHandle] = []
    rec = Recorder()

    def selfish() -> None:
        handles[0].cancel()
        rec("ran")

    handles.append(timer.call_later(0.01, selfish))
    timer.call_later(0.01, rec, "other")
    await anyio.sleep(1)
    assert sorted(rec.names) == ["other", "ran"]
    assert len(timer) == 0


# -- contexts ----------------------------------------------------------------------------------

var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")


@each_backend(virtual=True)
async def test_default_context_is_a_copy_taken_at_scheduling_time() -> None:
    timer = ap.Timer()
    seen: list[str] = []

    def look_and_set() -> None:
        seen.append(var.get())
        var.set("set by callback")

    var.set("at scheduling")
    timer.call_later(0.01, look_and_set)
    timer.call_later(0, look_and_set)
    var.set("changed after")
    await anyio.sleep(1)
    assert seen == ["at scheduling", "at scheduling"]
    assert var.get() == "changed after"  # the callback's set did not leak back


@each_backend(virtual=True)
async def test_explicit_context_is_used_as_is() -> None:
    timer = ap.Timer()
    ctx = contextvars.copy_context()
    ctx.run(var.set, "in ctx")
    seen: list[str] = []

    def look_and_set() -> None:
        seen.append(var.get())
        var.set("set by callback")

    timer.call_later(0.01, look_and_set, context=ctx)
    timer.call_at(0.0, look_and_set, context=ctx)
    await anyio.sleep(1)
    assert seen == ["in ctx", "set by callback"]
    assert ctx[var] == "set by callback"  # ran inside ctx itself, not a copy
    assert var.get() == "unset"


# -- logging must not lose timers ------------------------------------------------------------


@pytest.fixture
def raising_logging() -> Iterator[None]:
    def explode(logger: Any, name: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
        raise KeyError("a broken processor")

    structlog.configure(processors=[explode])
    yield
    structlog.reset_defaults()


@pytest.mark.usefixtures("raising_logging")
def test_a_raising_lag_log_does_not_lose_the_batch() -> None:
    async def main() -> tuple[list[str], int]:
        loop = asyncio.get_running_loop()
        timer = ap.Timer()
        fired: list[str] = []
        timer.call_later(0.001, fired.append, "a")
        timer.call_later(0.001, fired.append, "b")
        await asyncio.sleep(0)  # the entries reach the wheel
        loop.advance(1.0)  # type: ignore[attr-defined]  # the driver wakes up 1 s late
        await asyncio.sleep(0.01)
        return fired, len(timer)

    assert simulation.run(main()) == (["a", "b"], 0)


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
