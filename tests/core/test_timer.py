"""Tests of :class:`aiopurgatory.Timer` and :class:`aiopurgatory.TimerHandle`.

Most tests run on every backend (see ``tests/support/backends.py``): exact time
assertions on virtual time (``@each_backend(virtual=True)``: asyncio's
virtual-time loop and trio's autojumping mock clock, both starting at 0.0, where
the clock jumps to each armed deadline exactly), and the real-time tests on
asyncio, uvloop and trio (``@each_backend``), which assert only "never early",
measured with the backend's clock as the driver sees it, and a generous bound on
lateness.

A few stay on asyncio (pytest-asyncio; ``@pytest.mark.virtual_time`` for the
virtual-time loop) because asyncio's machinery is what they test: the loop's
exception handler, parity with ``loop.call_later`` handles, the driver's one
armed ``loop.call_at`` handle. Each has a trio counterpart (``test_trio_...``,
on trio's virtual time): a failing callback is logged there, and the driver
sleeps in one cancel scope whose deadline is the armed instant.

Where a test waits for "the next loop iteration" it calls :func:`next_iteration`:
one iteration on asyncio, as before; trio runs the tasks woken together in a
shuffled order (seeded on virtual time), so there it waits until every task is
blocked, the promise being "later, never inside the call, at the same instant".
:func:`advance` moves either virtual clock without running anything.

Some tests look at what the driver has armed (:func:`armed_at`, and on asyncio
:func:`armed_handle`): "nothing armed when idle" is a promise about the driver
and is not observable through the public API.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from math import ceil, inf, nan
from typing import Any, TypeVar, cast

import anyio
import pytest
import trio
import trio.testing

import aiopurgatory as ap
from aiopurgatory import simulation
from aiopurgatory._asyncio_driver import AsyncioDriver
from aiopurgatory._backends import current_owner
from aiopurgatory._trio_driver import TrioDriver
from tests.support.backends import VIRTUAL, each_backend, now, run_on, settle

TICK = 0.001
T = TypeVar("T")


def due_time(when: float, tick: float = TICK) -> float:
    """The time a callback due at ``when`` runs at on virtual time.

    The first tick boundary at or after ``when``: rounded up, never early.
    """
    e = ceil(when / tick)
    if e * tick < when:
        e += 1
    return e * tick


class Recorder:
    """Callbacks that append (name, the backend's time) when they run."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, float]] = []

    def __call__(self, name: Any) -> None:
        self.calls.append((name, now()))

    @property
    def names(self) -> list[Any]:
        return [n for n, _ in self.calls]


async def next_iteration() -> None:
    """Let what this step scheduled for the next loop iteration run; time stands still.

    asyncio: exactly one loop iteration (the timer's flush, a ``call_soon`` made in
    this one, has run after it). trio runs the tasks woken together in a shuffled
    (seeded) order, so the timer's driver task and this one may run either way
    round on the next batch: wait until every other task is blocked instead
    (:func:`settle`); trio's clock, a mock clock's too, does not move meanwhile.
    """
    if trio.lowlevel.in_trio_run():
        await settle()
    else:
        await asyncio.sleep(0)


def advance(seconds: float) -> None:
    """Move the virtual clock forward now, running nothing (handles due meanwhile run late).

    ``VirtualTimeLoop.advance`` on asyncio, ``MockClock.jump`` on trio.
    """
    if trio.lowlevel.in_trio_run():
        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, trio.testing.MockClock)
        clock.jump(seconds)
    else:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, simulation.VirtualTimeLoop)
        loop.advance(seconds)


@pytest.fixture
def exceptions() -> list[dict[str, Any]]:
    """Route the running loop's exception handler into a list (set by the test)."""
    return []


def armed_handle(timer: ap.Timer) -> asyncio.TimerHandle | None:
    """The asyncio driver's armed ``loop.call_at`` handle (white box, see the module docstring)."""
    driver = cast("AsyncioDriver | None", timer._driver)
    return None if driver is None else driver._handle


def armed_at(timer: ap.Timer) -> float | None:
    """The instant the timer's driver will wake it at; None if nothing is armed (white box).

    asyncio: the ``when`` of the driver's one ``loop.call_at`` handle (None exactly
    when there is no handle). trio: the deadline of the cancel scope the driver
    task sleeps in, its only deadline; while the task is not asleep (spawned or
    woken, about to run), the instant it will sleep until next.
    """
    driver = timer._driver
    if driver is None:
        return None
    if isinstance(driver, AsyncioDriver):
        handle = driver._handle
        return None if handle is None else handle.when()
    assert isinstance(driver, TrioDriver)
    bed = driver._bed
    scope = bed.scope
    when = scope.deadline if bed.task is not None and scope is not None else driver._armed
    return None if when == inf else when


def collect_exceptions(into: list[dict[str, Any]]) -> None:
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: into.append(ctx))


@contextlib.contextmanager
def logged_failures() -> Iterator[list[logging.LogRecord]]:
    """The ``aiopurgatory.timer_callback_failed`` records logged meanwhile (trio's report)."""
    records: list[logging.LogRecord] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            fields = getattr(record, "aiopurgatory", {})
            if fields.get("event") == "aiopurgatory.timer_callback_failed":
                records.append(record)

    handler = Capture(level=logging.ERROR)
    logger = logging.getLogger("aiopurgatory")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def logged_exception(record: logging.LogRecord) -> BaseException:
    assert record.exc_info is not None
    exc = record.exc_info[1]
    assert exc is not None
    return exc


# -- exact timing on virtual time ----------------------------------------------------


@pytest.mark.timeout(30)
@each_backend(virtual=True)
async def test_callbacks_run_at_their_time_rounded_up_to_the_tick() -> None:
    timer = ap.Timer()
    rec = Recorder()
    delays = [0.0005, 0.001, 0.0015, 0.0199, 0.02, 0.0105, 0.4, 1.2345, 7.5, 60.0001, 3600.5]
    handles = {d: timer.call_later(d, rec, d) for d in delays}
    assert len(timer) == len(delays)
    await anyio.sleep(3601)
    assert len(timer) == 0
    fired = dict(rec.calls)
    assert sorted(fired) == sorted(delays)
    for d, at in fired.items():
        assert handles[d].when() == d  # the clock started at 0
        assert at == due_time(d)
        assert d <= at < d + TICK
    assert rec.names == sorted(delays)


@pytest.mark.timeout(30)
@each_backend(virtual=True)
async def test_call_at_takes_absolute_loop_time() -> None:
    await anyio.sleep(10)
    timer = ap.Timer(tick=0.01, wheel_size=4)
    rec = Recorder()
    h = timer.call_at(12.345, rec, "a")
    assert h.when() == 12.345
    await anyio.sleep(5)
    assert rec.calls == [("a", due_time(12.345, 0.01))]
    assert now() == 15


@each_backend(virtual=True)
async def test_callbacks_are_called_with_their_args() -> None:
    timer = ap.Timer()
    got: list[tuple[object, ...]] = []
    timer.call_later(0.01, lambda *a: got.append(a), 1, "two", None)
    timer.call_at(0.0, lambda *a: got.append(a))
    await anyio.sleep(0.1)
    assert got == [(), (1, "two", None)]


@pytest.mark.parametrize("delay", [0, 0.0, -0.5, -3600])
@each_backend(virtual=True)
async def test_due_now_runs_on_a_later_iteration_never_synchronously(delay: float) -> None:
    await anyio.sleep(1)
    timer = ap.Timer()
    rec = Recorder()
    h = timer.call_later(delay, rec, "now")
    assert rec.calls == []  # not inside call_later
    assert h.when() == 1 + delay
    assert len(timer) == 1
    await next_iteration()
    assert rec.calls == [("now", 1.0)]  # the next iteration, the clock standing still
    assert len(timer) == 0
    timer.call_at(now() - 10, rec, "past")
    assert rec.names == ["now"]
    await next_iteration()
    assert rec.names == ["now", "past"]


@each_backend(virtual=True)
async def test_due_now_after_a_long_idle_spell() -> None:
    # The wheel's clock stands still while nothing is pending; scheduling after an
    # idle hour must not place entries relative to the stale clock.
    timer = ap.Timer()
    rec = Recorder()
    timer.call_later(0.005, rec, "first")
    await anyio.sleep(3600)
    timer.call_later(0.003, rec, "second")
    timer.call_later(0, rec, "third")
    await anyio.sleep(1)
    assert rec.calls == [
        ("first", 0.005),
        ("third", 3600.0),
        ("second", due_time(3600.003)),
    ]


@pytest.mark.timeout(30)
@each_backend(virtual=True)
async def test_order_follows_due_time() -> None:
    rng = random.Random(3)
    timer = ap.Timer(wheel_size=4)
    rec = Recorder()
    delays = [rng.randrange(0, 1500) / 1000 for _ in range(300)]
    for i, d in enumerate(delays):
        timer.call_later(d, rec, i)
    await anyio.sleep(2)
    times = [t for _, t in rec.calls]
    assert times == sorted(times)
    assert sorted(rec.names) == list(range(300))
    for i, at in rec.calls:
        assert at == due_time(delays[i])


# -- len, cancel, cancelled -------------------------------------------------------------


@each_backend(virtual=True)
async def test_len_counts_pending_handles() -> None:
    timer = ap.Timer()
    rec = Recorder()
    assert len(timer) == 0
    a = timer.call_later(0.01, rec, "a")
    b = timer.call_later(0.02, rec, "b")
    c = timer.call_later(0, rec, "c")
    d = timer.call_later(500, rec, "d")
    assert len(timer) == 4
    b.cancel()
    assert len(timer) == 3
    b.cancel()  # idempotent: counted once
    assert len(timer) == 3
    await next_iteration()
    assert rec.names == ["c"]
    assert len(timer) == 2
    await anyio.sleep(0.1)
    assert rec.names == ["c", "a"]
    assert len(timer) == 1
    a.cancel()  # after it ran: nothing left to withdraw
    c.cancel()
    assert len(timer) == 1
    d.cancel()
    assert len(timer) == 0


def _cancel_twice(handles: Sequence[ap.TimerHandle | asyncio.TimerHandle]) -> None:
    """Cancel each handle twice: ``cancelled()`` is false before, true after each."""
    for h in handles:
        assert not h.cancelled()
        h.cancel()
        assert h.cancelled()
        h.cancel()
        assert h.cancelled()


@pytest.mark.virtual_time
async def test_cancel_before_fire_and_cancelled_like_asyncio() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    rec = Recorder()
    ours = [timer.call_later(0.01, rec, "x"), timer.call_later(0, rec, "y")]
    theirs = [loop.call_later(0.01, rec, "x"), loop.call_later(0, rec, "y")]
    _cancel_twice([*ours, *theirs])
    await asyncio.sleep(1)
    assert rec.calls == []
    assert len(timer) == 0


def test_trio_cancel_before_fire_and_cancelled() -> None:
    # The trio counterpart of the above (no loop handles to compare with on trio).
    async def main() -> None:
        timer = ap.Timer()
        rec = Recorder()
        _cancel_twice([timer.call_later(0.01, rec, "x"), timer.call_later(0, rec, "y")])
        await trio.sleep(1)
        assert rec.calls == []
        assert len(timer) == 0

    run_on("trio-virtual", main)


@pytest.mark.virtual_time
async def test_cancel_after_fire_like_asyncio() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    rec = Recorder()
    ours = timer.call_later(0.01, rec, "ours")
    theirs = loop.call_later(0.01, rec, "theirs")
    await asyncio.sleep(1)
    assert sorted(rec.names) == ["ours", "theirs"]
    assert ours.cancelled() is theirs.cancelled() is False
    ours.cancel()
    theirs.cancel()
    assert ours.cancelled() is theirs.cancelled() is True
    assert len(timer) == 0


def test_trio_cancel_after_fire() -> None:
    # The trio counterpart of the above.
    async def main() -> None:
        timer = ap.Timer()
        rec = Recorder()
        ours = timer.call_later(0.01, rec, "ours")
        await trio.sleep(1)
        assert rec.calls == [("ours", 0.01)]
        assert ours.cancelled() is False
        ours.cancel()
        assert ours.cancelled() is True
        assert len(timer) == 0

    run_on("trio-virtual", main)


@each_backend(virtual=True)
async def test_a_cancelled_handle_releases_its_callback() -> None:
    timer = ap.Timer()

    class Big:
        pass

    big = Big()
    ref = weakref.ref(big)
    h = timer.call_later(10, lambda _b: None, big)
    del big
    assert ref() is not None
    h.cancel()
    assert ref() is None


# -- close -------------------------------------------------------------------------------


@each_backend(virtual=True)
async def test_close_cancels_everything_and_refuses_new_work() -> None:
    timer = ap.Timer()
    rec = Recorder()
    handles = [timer.call_later(d, rec, d) for d in (0.01, 5, 86_400)]
    await next_iteration()  # new entries reach the wheel on the next iteration
    assert armed_at(timer) is not None
    handles.append(timer.call_later(0, rec, "due now"))
    handles.append(timer.call_later(3, rec, "not yet in the wheel"))
    timer.close()
    assert len(timer) == 0
    assert all(h.cancelled() for h in handles)
    assert armed_at(timer) is None
    timer.close()  # idempotent
    with pytest.raises(ap.TimerClosedError):
        timer.call_later(1, rec, "late")
    with pytest.raises(ap.TimerClosedError):
        timer.call_at(now() + 1, rec, "late")
    with pytest.raises(ap.TimerClosedError):
        async with timer.timeout(1):
            pass
    await anyio.sleep(100_000)  # noqa: ASYNC116 - past every deadline, then back
    assert rec.calls == []
    assert len(timer) == 0


@pytest.mark.parametrize("backend", VIRTUAL)
def test_close_before_first_use_then_scheduling_raises(backend: str) -> None:
    timer = ap.Timer()
    timer.close()

    async def main() -> None:
        with pytest.raises(ap.TimerClosedError):
            timer.call_later(1, print)

    run_on(backend, main)


@each_backend(virtual=True)
async def test_close_from_a_callback_cancels_the_rest_of_its_batch() -> None:
    # Entries at ticks 10, 11, 12 become one batch: the clock jumps past all of
    # them before the driver wakes. Within a batch they run in tick order.
    timer = ap.Timer()
    rec = Recorder()
    before = timer.call_at(0.010, rec, "before")
    timer.call_at(0.011, timer.close)
    after = timer.call_at(0.012, rec, "after")
    await next_iteration()
    advance(1)
    await anyio.sleep(1)
    assert rec.calls == [("before", 1.0)]
    assert before.cancelled() is False
    assert after.cancelled() is True
    assert len(timer) == 0
    assert armed_at(timer) is None


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


# -- nothing armed when idle ------------------------------------------------------------------


@each_backend(virtual=True)
async def test_nothing_armed_after_the_last_cancel_or_fire() -> None:
    timer = ap.Timer()
    rec = Recorder()
    assert armed_at(timer) is None
    h = timer.call_later(5, rec, "x")
    await next_iteration()  # new entries reach the wheel on the next iteration
    assert armed_at(timer) is not None
    h.cancel()
    assert armed_at(timer) is None  # disarmed at once, not at the old deadline

    timer.call_later(5, rec, "cancelled while new").cancel()
    await next_iteration()
    assert armed_at(timer) is None  # never armed at all

    timer.call_later(0.01, rec, "y")
    timer.call_later(30, rec, "z")
    await anyio.sleep(1)
    assert armed_at(timer) is not None  # armed for z
    await anyio.sleep(30)
    assert rec.names == ["y", "z"]
    assert armed_at(timer) is None

    timer.call_later(0, rec, "due now")
    await next_iteration()
    assert rec.names[-1] == "due now"
    assert armed_at(timer) is None  # a due-now entry never needs arming


@pytest.mark.virtual_time
async def test_an_earlier_entry_re_arms_the_handle() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    rec = Recorder()
    timer.call_later(60, rec, "late")
    await asyncio.sleep(0)
    armed = armed_handle(timer)
    assert armed is not None
    assert armed.when() <= 60
    timer.call_later(0.015, rec, "early")
    await asyncio.sleep(0)
    rearmed = armed_handle(timer)
    assert rearmed is not None
    assert rearmed is not armed
    assert rearmed.when() == 0.015
    timer.call_later(0.5, rec, "between")  # a later bucket: no re-arm
    await asyncio.sleep(0)
    assert armed_handle(timer) is rearmed
    await asyncio.sleep(0.6)
    assert rec.calls == [("early", 0.015), ("between", 0.5)]
    assert loop.time() == 0.6


def test_trio_an_earlier_entry_moves_the_one_deadline() -> None:
    # The trio counterpart of the above: the driver task sleeps in one cancel scope
    # whose deadline is the earliest bucket, and that is the run's only deadline
    # (this task, running, has none): an earlier entry moves it, a later one does not.
    def next_deadline() -> float:
        return trio.current_time() + trio.lowlevel.current_statistics().seconds_to_next_deadline

    async def main() -> None:
        timer = ap.Timer()
        rec = Recorder()
        timer.call_later(60, rec, "late")
        await settle()
        armed = armed_at(timer)
        assert armed is not None
        assert armed <= 60
        assert next_deadline() == armed
        timer.call_later(0.015, rec, "early")
        await settle()
        assert armed_at(timer) == 0.015
        assert next_deadline() == 0.015
        timer.call_later(0.5, rec, "between")  # a later bucket: the deadline stays
        await settle()
        assert armed_at(timer) == 0.015
        assert next_deadline() == 0.015
        await trio.sleep(0.6)
        assert rec.calls == [("early", 0.015), ("between", 0.5)]
        assert trio.current_time() == 0.6
        assert armed_at(timer) == armed  # back to "late"'s bucket, nothing else left
        assert next_deadline() == armed
        timer.close()
        await settle()
        assert trio.lowlevel.current_statistics().seconds_to_next_deadline == inf

    run_on("trio-virtual", main)


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


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (nan, ValueError),
        (inf, ValueError),
        (-inf, ValueError),
        (10**400, ValueError),
        ("1", TypeError),
        (None, TypeError),
        (True, TypeError),
        (False, TypeError),
        (1j, TypeError),
    ],
)
@each_backend(virtual=True)
async def test_bad_delay_or_when_is_rejected_and_changes_nothing(
    value: object, error: type[Exception]
) -> None:
    timer = ap.Timer()
    timer.call_later(10, print)
    await next_iteration()  # the entry is armed: a bad call must leave that as it is
    armed = armed_at(timer)
    assert armed is not None
    for method, name in ((timer.call_later, "delay"), (timer.call_at, "when")):
        with pytest.raises(error, match=name):
            method(value, print)  # type: ignore[arg-type]
        assert len(timer) == 1
        assert armed_at(timer) == armed
    if value is not None:  # None is a valid timeout: no deadline
        with pytest.raises(error, match="delay"):
            timer.timeout(value)  # type: ignore[arg-type]


@each_backend(virtual=True)
async def test_numbers_other_than_float_are_accepted() -> None:
    from fractions import Fraction

    timer = ap.Timer()
    rec = Recorder()
    timer.call_later(1, rec, "int")
    timer.call_later(Fraction(1, 2), rec, "fraction")  # type: ignore[arg-type]
    await anyio.sleep(2)
    assert rec.calls == [("fraction", 0.5), ("int", 1.0)]


@pytest.mark.parametrize("callback", [None, 42, "print"])
@each_backend(virtual=True)
async def test_non_callable_callback_is_rejected_and_changes_nothing(callback: object) -> None:
    timer = ap.Timer()
    for method in (timer.call_later, timer.call_at):
        with pytest.raises(TypeError, match="callback"):
            method(1, callback)  # type: ignore[arg-type]
        assert len(timer) == 0
        assert armed_at(timer) is None


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"tick": 0}, ValueError, "tick"),
        ({"tick": -0.001}, ValueError, "tick"),
        ({"tick": nan}, ValueError, "tick"),
        ({"tick": inf}, ValueError, "tick"),
        ({"tick": "0.001"}, TypeError, "tick"),
        ({"tick": True}, TypeError, "tick"),
        ({"tick": None}, TypeError, "tick"),
        ({"wheel_size": 1}, ValueError, "wheel_size"),
        ({"wheel_size": 0}, ValueError, "wheel_size"),
        ({"wheel_size": True}, TypeError, "wheel_size"),
        ({"wheel_size": 20.0}, TypeError, "wheel_size"),
        ({"wheel_size": "20"}, TypeError, "wheel_size"),
    ],
)
def test_bad_constructor_arguments(
    kwargs: dict[str, Any], error: type[Exception], name: str
) -> None:
    with pytest.raises(error, match=name):
        ap.Timer(**kwargs)


def test_settings_are_readable() -> None:
    timer = ap.Timer(tick=0.005, wheel_size=64)
    assert timer.tick == 0.005
    assert timer.wheel_size == 64
    assert timer.loop is None
    assert len(timer) == 0


def test_first_use_needs_a_running_loop() -> None:
    # Outside asyncio and outside trio (imported here, so the check for a trio run is made).
    timer = ap.Timer()
    with pytest.raises(RuntimeError, match="running event loop"):
        timer.call_later(1, print)
    assert timer.loop is None
    assert len(timer) == 0


@each_backend(virtual=True)
async def test_timer_binds_to_the_loop_of_first_use(backend: str) -> None:
    timer = ap.Timer()
    timer.call_later(1, print).cancel()
    if backend.startswith("trio"):
        assert timer.loop is None  # no asyncio loop on trio
        assert timer.backend == "trio"
    else:
        assert timer.loop is asyncio.get_running_loop()
        assert timer.backend == "asyncio"
    assert timer._driver is not None
    assert timer._driver.owner is current_owner()


# -- float rounding at tick boundaries (core bug) -----------------------------------------------


def run_virtual_bounded(
    main: Callable[[], Awaitable[T]], limit: float, backend: str = "asyncio-virtual"
) -> T:
    """Run ``main()`` on virtual time in a thread; fail if it is not done in ``limit`` s.

    ``backend`` is ``"asyncio-virtual"`` or ``"trio-virtual"``. A livelock on
    virtual time does not advance the clock, so a timeout inside the run would
    never fire: the watchdog has to be the wall clock. On a hang the run is
    stopped from this thread (the asyncio loop stopped, trio's main task cancelled).
    """
    result: list[T] = []
    errors: list[BaseException] = []
    stop: list[Callable[[], object]] = []

    async def bounded() -> T:
        if trio.lowlevel.in_trio_run():
            token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as scope:
                stop.append(lambda: token.run_sync_soon(scope.cancel))
                return await main()
            raise RuntimeError("stopped by the watchdog")
        loop = asyncio.get_running_loop()
        stop.append(lambda: loop.call_soon_threadsafe(loop.stop))
        return await main()

    def target() -> None:
        try:
            result.append(run_on(backend, bounded))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit)
    hung = thread.is_alive()
    if hung:
        for fn in stop:
            fn()
        thread.join(10)
    if hung:
        pytest.fail(f"the virtual-time run made no progress within {limit} s (livelock)")
    if errors:
        raise errors[0]
    return result[0]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("backend", VIRTUAL)
def test_deadlines_on_float_unfriendly_tick_boundaries_fire(backend: str) -> None:
    # 2001 * 0.001 / 0.001 is just below 2001: a driver that decides "due" by that
    # division finds nothing due at the armed instant and re-arms for the same
    # instant forever (a livelock on virtual time; a busy spin on real loops).
    bad = [e for e in range(1_990, 2_100) if (e * TICK) / TICK < e]
    assert bad  # the float effect this test is about exists

    async def main() -> list[tuple[float, float]]:
        timer = ap.Timer()
        fired: list[tuple[float, float]] = []
        for e in bad:
            timer.call_at(e * TICK, lambda w: fired.append((w, now())), e * TICK)
        await anyio.sleep(3)
        return fired

    fired = run_virtual_bounded(main, 10.0, backend)
    assert fired == [(w, w) for w in sorted(e * TICK for e in bad)]


@pytest.mark.parametrize("backend", VIRTUAL)
def test_bounded_runner_reports_results(backend: str) -> None:
    async def main() -> float:
        await anyio.sleep(5)
        return now()

    assert run_virtual_bounded(main, 10.0, backend) == 5.0


# -- real time, on asyncio, uvloop and trio ------------------------------------------------------


# uvloop rounds call_at to whole milliseconds: with a 1 ms tick the driver arms for
# whole milliseconds and uvloop is never early, so the ticks that are not whole
# milliseconds are the ones that make it wake the driver early (by up to a tick),
# and check that the driver re-checks the clock and re-arms instead of trusting it.
# trio is never early by its own clock (a scope is cancelled once the clock has
# reached its deadline); the same wheels check the driver's re-arming there.
REALTIME_WHEELS = [(0.001, 20), (0.0007, 20), (0.0015, 3)]


@pytest.mark.realtime
@pytest.mark.parametrize(("tick", "wheel_size"), REALTIME_WHEELS)
@each_backend
async def test_never_early_on_real_loops(tick: float, wheel_size: int) -> None:
    timer = ap.Timer(tick=tick, wheel_size=wheel_size)
    rng = random.Random(11)
    n = 2_000
    fired: dict[int, tuple[float, float]] = {}  # i -> (when, fired at)
    duplicates: list[int] = []
    done = anyio.Event()
    expected: set[int] = set()

    def fire(i: int, when: float) -> None:
        if i in fired:
            duplicates.append(i)
        fired[i] = (when, now())
        if len(fired) == len(expected):
            done.set()

    handles = []
    for i in range(n):
        when = now() + rng.uniform(-0.005, 0.1)
        handles.append(timer.call_at(when, fire, i, when))
    for i in range(0, n, 3):  # a third are cancelled before they fire
        handles[i].cancel()
    expected = {i for i in range(n) if i % 3}
    assert len(timer) == len(expected)
    with anyio.fail_after(30):
        await done.wait()
    await anyio.sleep(0.05)
    assert set(fired) == expected
    assert duplicates == []
    early = [(when, at) for when, at in fired.values() if at < when]
    assert early == []
    lateness = [at - when for when, at in fired.values()]
    assert max(lateness) < 2.0  # generous: a shared 2-core CI machine
    assert len(timer) == 0
    assert armed_at(timer) is None


@pytest.mark.realtime
@pytest.mark.parametrize("tick", [0.001, 0.0007])
@each_backend
async def test_timers_spread_over_time_never_fire_early(tick: float) -> None:
    # Scheduled a few at a time while the loop is running, so the driver re-arms
    # often, with the clock between ticks: the case uvloop's early wake-ups hit.
    timer = ap.Timer(tick=tick)
    rng = random.Random(5)
    early: list[float] = []
    count = 0
    all_fired = anyio.Event()

    def fire(when: float) -> None:
        nonlocal count
        count += 1
        if count == 1_000:
            all_fired.set()
        t = now()
        if t < when:
            early.append(when - t)

    for _ in range(40):
        for _ in range(25):
            when = now() + rng.uniform(0, 0.03)
            timer.call_at(when, fire, when)
        await anyio.sleep(rng.uniform(0, 0.003))
    with anyio.fail_after(30):
        await all_fired.wait()
    assert count == 1_000
    assert early == []


# -- next_due(): when the timer next has work to do --------------------------------------


@each_backend(virtual=True)
async def test_next_due_is_the_start_of_the_earliest_tick_with_work() -> None:
    timer = ap.Timer(tick=0.5)  # binary: exact products
    rec = Recorder()
    assert timer.next_due() is None  # nothing pending (not even bound yet)
    timer.call_later(1.2, rec, "late")  # tick ceil(2.4) = 3 -> 1.5 s
    assert timer.next_due() == 1.5  # staged entries count
    await next_iteration()  # into the wheel
    assert timer.next_due() == 1.5
    early = timer.call_later(0.7, rec, "early")  # tick 2 -> 1.0 s
    assert timer.next_due() == 1.0
    await next_iteration()
    assert timer.next_due() == 1.0
    early.cancel()
    assert timer.next_due() == 1.5  # an emptied bucket is dropped
    await anyio.sleep(2)
    assert rec.calls == [("late", 1.5)]
    assert timer.next_due() is None


@each_backend(virtual=True)
async def test_next_due_of_an_entry_already_due_is_not_in_the_future() -> None:
    timer = ap.Timer()
    await anyio.sleep(10)
    timer.call_later(-5, lambda: None)
    due = timer.next_due()
    assert due is not None
    assert due <= now()
    await next_iteration()
    assert timer.next_due() is None  # it ran


@pytest.mark.parametrize("seed", range(5))
@each_backend(virtual=True)
async def test_next_due_bounds_the_earliest_pending_callback(seed: int) -> None:
    # Without cancellations: the earliest when <= next_due < it + tick, and the
    # earliest callback runs at next_due exactly on virtual time.
    rng = random.Random(seed)
    timer = ap.Timer()
    rec = Recorder()
    whens = [now() + rng.expovariate(1 / rng.choice([0.005, 0.3, 40.0])) for _ in range(200)]
    for when in whens:
        timer.call_at(when, rec, when)
    for step in range(2):
        due = timer.next_due()
        assert due is not None
        earliest = min(whens)
        assert earliest <= due < earliest + timer.tick
        if step == 0:
            await next_iteration()  # the same in the wheel as on the stage
    while (due := timer.next_due()) is not None:
        pending_before = len(timer)
        # asyncio: sleep(due - now), as before; trio sleeps until exactly ``due``
        # (trio.sleep would add the delay back to the clock, maybe an ulp off).
        await anyio.sleep_until(due)
        await next_iteration()
        assert len(timer) < pending_before
        assert rec.calls[-1][1] == due  # ran at the instant next_due() named
    assert sorted(rec.names) == sorted(whens)
