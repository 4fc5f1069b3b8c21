"""Tests of :class:`aiopurgatory.Timer` and :class:`aiopurgatory.TimerHandle`.

Exact time assertions run on the virtual-time loop (``@pytest.mark.virtual_time``),
where the clock jumps to each armed ``call_at`` exactly. The real-time tests run on
asyncio and uvloop (the default matrix) and assert only "never early", measured
with ``loop.time()`` as the driver sees it, and a generous bound on lateness.

Some tests look at ``Timer._handle``, the driver's one armed ``loop.call_at``
handle: "nothing armed when idle" is a promise about that handle and is not
observable through the public API.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import threading
from collections.abc import Callable, Coroutine
from math import ceil, inf, nan
from typing import Any, cast

import pytest

import aiopurgatory as ap
from aiopurgatory import simulation
from aiopurgatory._asyncio_driver import AsyncioDriver

TICK = 0.001


def due_time(when: float, tick: float = TICK) -> float:
    """The loop time a callback due at ``when`` runs at on virtual time.

    The first tick boundary at or after ``when``: rounded up, never early.
    """
    e = ceil(when / tick)
    if e * tick < when:
        e += 1
    return e * tick


class Recorder:
    """Callbacks that append (name, loop time) when they run."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.calls: list[tuple[Any, float]] = []

    def __call__(self, name: Any) -> None:
        self.calls.append((name, self.loop.time()))

    @property
    def names(self) -> list[Any]:
        return [n for n, _ in self.calls]


@pytest.fixture
def exceptions() -> list[dict[str, Any]]:
    """Route the running loop's exception handler into a list (set by the test)."""
    return []


def armed_handle(timer: ap.Timer) -> asyncio.TimerHandle | None:
    """The driver's armed ``loop.call_at`` handle (white box, see the module docstring)."""
    driver = cast("AsyncioDriver | None", timer._driver)
    return None if driver is None else driver._handle


def collect_exceptions(into: list[dict[str, Any]]) -> None:
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: into.append(ctx))


# -- exact timing on virtual time ----------------------------------------------------


@pytest.mark.virtual_time
@pytest.mark.timeout(30)
async def test_callbacks_run_at_their_time_rounded_up_to_the_tick() -> None:
    timer = ap.Timer()
    rec = Recorder()
    delays = [0.0005, 0.001, 0.0015, 0.0199, 0.02, 0.0105, 0.4, 1.2345, 7.5, 60.0001, 3600.5]
    handles = {d: timer.call_later(d, rec, d) for d in delays}
    assert len(timer) == len(delays)
    await asyncio.sleep(3601)
    assert len(timer) == 0
    fired = dict(rec.calls)
    assert sorted(fired) == sorted(delays)
    for d, at in fired.items():
        assert handles[d].when() == d  # loop time started at 0
        assert at == due_time(d)
        assert d <= at < d + TICK
    assert rec.names == sorted(delays)


@pytest.mark.virtual_time
@pytest.mark.timeout(30)
async def test_call_at_takes_absolute_loop_time() -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(10)
    timer = ap.Timer(tick=0.01, wheel_size=4)
    rec = Recorder()
    h = timer.call_at(12.345, rec, "a")
    assert h.when() == 12.345
    await asyncio.sleep(5)
    assert rec.calls == [("a", due_time(12.345, 0.01))]
    assert loop.time() == 15


@pytest.mark.virtual_time
async def test_callbacks_are_called_with_their_args() -> None:
    timer = ap.Timer()
    got: list[tuple[object, ...]] = []
    timer.call_later(0.01, lambda *a: got.append(a), 1, "two", None)
    timer.call_at(0.0, lambda *a: got.append(a))
    await asyncio.sleep(0.1)
    assert got == [(), (1, "two", None)]


@pytest.mark.virtual_time
@pytest.mark.parametrize("delay", [0, 0.0, -0.5, -3600])
async def test_due_now_runs_on_a_later_iteration_never_synchronously(delay: float) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(1)
    timer = ap.Timer()
    rec = Recorder()
    h = timer.call_later(delay, rec, "now")
    assert rec.calls == []  # not inside call_later
    assert h.when() == 1 + delay
    assert len(timer) == 1
    await asyncio.sleep(0)
    assert rec.calls == [("now", 1.0)]  # the next iteration, the clock standing still
    assert len(timer) == 0
    timer.call_at(loop.time() - 10, rec, "past")
    assert rec.names == ["now"]
    await asyncio.sleep(0)
    assert rec.names == ["now", "past"]


@pytest.mark.virtual_time
async def test_due_now_after_a_long_idle_spell() -> None:
    # The wheel's clock stands still while nothing is pending; scheduling after an
    # idle hour must not place entries relative to the stale clock.
    timer = ap.Timer()
    rec = Recorder()
    timer.call_later(0.005, rec, "first")
    await asyncio.sleep(3600)
    timer.call_later(0.003, rec, "second")
    timer.call_later(0, rec, "third")
    await asyncio.sleep(1)
    assert rec.calls == [
        ("first", 0.005),
        ("third", 3600.0),
        ("second", due_time(3600.003)),
    ]


@pytest.mark.virtual_time
@pytest.mark.timeout(30)
async def test_order_follows_due_time() -> None:
    rng = random.Random(3)
    timer = ap.Timer(wheel_size=4)
    rec = Recorder()
    delays = [rng.randrange(0, 1500) / 1000 for _ in range(300)]
    for i, d in enumerate(delays):
        timer.call_later(d, rec, i)
    await asyncio.sleep(2)
    times = [t for _, t in rec.calls]
    assert times == sorted(times)
    assert sorted(rec.names) == list(range(300))
    for i, at in rec.calls:
        assert at == due_time(delays[i])


# -- len, cancel, cancelled -------------------------------------------------------------


@pytest.mark.virtual_time
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
    await asyncio.sleep(0)
    assert rec.names == ["c"]
    assert len(timer) == 2
    await asyncio.sleep(0.1)
    assert rec.names == ["c", "a"]
    assert len(timer) == 1
    a.cancel()  # after it ran: nothing left to withdraw
    c.cancel()
    assert len(timer) == 1
    d.cancel()
    assert len(timer) == 0


@pytest.mark.virtual_time
async def test_cancel_before_fire_and_cancelled_like_asyncio() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    rec = Recorder()
    ours = [timer.call_later(0.01, rec, "x"), timer.call_later(0, rec, "y")]
    theirs = [loop.call_later(0.01, rec, "x"), loop.call_later(0, rec, "y")]
    handles: list[ap.TimerHandle | asyncio.TimerHandle] = [*ours, *theirs]
    for h in handles:
        assert not h.cancelled()
        h.cancel()
        assert h.cancelled()
        h.cancel()
        assert h.cancelled()
    await asyncio.sleep(1)
    assert rec.calls == []
    assert len(timer) == 0


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


@pytest.mark.virtual_time
async def test_a_cancelled_handle_releases_its_callback() -> None:
    timer = ap.Timer()

    class Big:
        pass

    import weakref

    big = Big()
    ref = weakref.ref(big)
    h = timer.call_later(10, lambda _b: None, big)
    del big
    assert ref() is not None
    h.cancel()
    assert ref() is None


# -- close -------------------------------------------------------------------------------


@pytest.mark.virtual_time
async def test_close_cancels_everything_and_refuses_new_work() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    rec = Recorder()
    handles = [timer.call_later(d, rec, d) for d in (0.01, 5, 86_400)]
    await asyncio.sleep(0)  # new entries reach the wheel on the next iteration
    assert armed_handle(timer) is not None
    handles.append(timer.call_later(0, rec, "due now"))
    handles.append(timer.call_later(3, rec, "not yet in the wheel"))
    timer.close()
    assert len(timer) == 0
    assert all(h.cancelled() for h in handles)
    assert armed_handle(timer) is None
    timer.close()  # idempotent
    with pytest.raises(ap.PurgatoryClosedError):
        timer.call_later(1, rec, "late")
    with pytest.raises(ap.PurgatoryClosedError):
        timer.call_at(loop.time() + 1, rec, "late")
    with pytest.raises(ap.PurgatoryClosedError):
        async with timer.timeout(1):
            pass
    await asyncio.sleep(100_000)
    assert rec.calls == []
    assert len(timer) == 0


def test_close_before_first_use_then_scheduling_raises() -> None:
    timer = ap.Timer()
    timer.close()

    async def main() -> None:
        with pytest.raises(ap.PurgatoryClosedError):
            timer.call_later(1, print)

    simulation.run(main())


def virtual_loop() -> simulation.VirtualTimeLoop:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, simulation.VirtualTimeLoop)
    return loop


@pytest.mark.virtual_time
async def test_close_from_a_callback_cancels_the_rest_of_its_batch() -> None:
    # Entries at ticks 10, 11, 12 become one batch: the clock jumps past all of
    # them before the driver wakes. Within a batch they run in tick order.
    loop = virtual_loop()
    timer = ap.Timer()
    rec = Recorder()
    before = timer.call_at(0.010, rec, "before")
    timer.call_at(0.011, timer.close)
    after = timer.call_at(0.012, rec, "after")
    await asyncio.sleep(0)
    loop.advance(1)
    await asyncio.sleep(1)
    assert rec.calls == [("before", 1.0)]
    assert before.cancelled() is False
    assert after.cancelled() is True
    assert len(timer) == 0
    assert armed_handle(timer) is None


# -- failures are contained ---------------------------------------------------------------


@pytest.mark.virtual_time
async def test_raising_callback_goes_to_the_exception_handler(
    exceptions: list[dict[str, Any]],
) -> None:
    collect_exceptions(exceptions)
    timer = ap.Timer()
    rec = Recorder()

    def boom(what: str) -> None:
        raise ValueError(what)

    timer.call_later(0.01, rec, "a")
    bad = timer.call_later(0.01, boom, "in the wheel")
    timer.call_later(0.01, rec, "b")
    timer.call_later(0, boom, "due now")
    timer.call_later(0, rec, "c")
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


# -- re-entrancy ----------------------------------------------------------------------------


@pytest.mark.virtual_time
async def test_callbacks_may_schedule_and_cancel_other_timers() -> None:
    loop = virtual_loop()
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
    await asyncio.sleep(0)
    loop.advance(0.1)
    await asyncio.sleep(1)
    assert rec.calls == [
        ("first", 0.1),
        ("same batch survivor", 0.1),
        ("due-now child", 0.1),
        ("child", due_time(0.1 + 0.005)),
    ]
    assert all(h.cancelled() for h in victims)
    assert len(timer) == 1
    await asyncio.sleep(100)
    assert rec.calls[-1] == ("far child", due_time(0.1 + 100))
    assert len(timer) == 0
    assert loop.time() == 101.1


@pytest.mark.virtual_time
async def test_two_callbacks_of_one_tick_cancelling_each_other_run_once() -> None:
    timer = ap.Timer()
    rec = Recorder()
    pair: list[ap.TimerHandle] = []

    def cancel_other(me: int) -> None:
        rec(me)
        pair[1 - me].cancel()

    pair.extend(timer.call_later(0.01, cancel_other, i) for i in (0, 1))
    await asyncio.sleep(1)
    assert len(rec.calls) == 1
    ran = rec.names[0]
    assert pair[1 - ran].cancelled()
    assert not pair[ran].cancelled()
    assert len(timer) == 0


@pytest.mark.virtual_time
async def test_a_callback_cancelling_itself_is_harmless() -> None:
    timer = ap.Timer()
    handles: list[ap.TimerHandle] = []
    rec = Recorder()

    def selfish() -> None:
        handles[0].cancel()
        rec("ran")

    handles.append(timer.call_later(0.01, selfish))
    timer.call_later(0.01, rec, "other")
    await asyncio.sleep(1)
    assert sorted(rec.names) == ["other", "ran"]
    assert len(timer) == 0


# -- nothing armed when idle ------------------------------------------------------------------


@pytest.mark.virtual_time
async def test_nothing_armed_after_the_last_cancel_or_fire() -> None:
    timer = ap.Timer()
    rec = Recorder()
    assert armed_handle(timer) is None
    h = timer.call_later(5, rec, "x")
    await asyncio.sleep(0)  # new entries reach the wheel on the next iteration
    assert armed_handle(timer) is not None
    h.cancel()
    assert armed_handle(timer) is None  # disarmed at once, not at the old deadline

    timer.call_later(5, rec, "cancelled while new").cancel()
    await asyncio.sleep(0)
    assert armed_handle(timer) is None  # never armed at all

    timer.call_later(0.01, rec, "y")
    timer.call_later(30, rec, "z")
    await asyncio.sleep(1)
    assert armed_handle(timer) is not None  # armed for z
    await asyncio.sleep(30)
    assert rec.names == ["y", "z"]
    assert armed_handle(timer) is None

    timer.call_later(0, rec, "due now")
    await asyncio.sleep(0)
    assert rec.names[-1] == "due now"
    assert armed_handle(timer) is None  # a due-now entry never needs the handle


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


# -- contexts ----------------------------------------------------------------------------------

var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")


@pytest.mark.virtual_time
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
    await asyncio.sleep(1)
    assert seen == ["at scheduling", "at scheduling"]
    assert var.get() == "changed after"  # the callback's set did not leak back


@pytest.mark.virtual_time
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
    await asyncio.sleep(1)
    assert seen == ["in ctx", "set by callback"]
    assert ctx[var] == "set by callback"  # ran inside ctx itself, not a copy
    assert var.get() == "unset"


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.virtual_time
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
async def test_bad_delay_or_when_is_rejected_and_changes_nothing(
    value: object, error: type[Exception]
) -> None:
    timer = ap.Timer()
    timer.call_later(10, print)
    armed = armed_handle(timer)
    for method, name in ((timer.call_later, "delay"), (timer.call_at, "when")):
        with pytest.raises(error, match=name):
            method(value, print)  # type: ignore[arg-type]
        assert len(timer) == 1
        assert armed_handle(timer) is armed
    if value is not None:  # None is a valid timeout: no deadline
        with pytest.raises(error, match="delay"):
            timer.timeout(value)  # type: ignore[arg-type]


@pytest.mark.virtual_time
async def test_numbers_other_than_float_are_accepted() -> None:
    from fractions import Fraction

    timer = ap.Timer()
    rec = Recorder()
    timer.call_later(1, rec, "int")
    timer.call_later(Fraction(1, 2), rec, "fraction")  # type: ignore[arg-type]
    await asyncio.sleep(2)
    assert rec.calls == [("fraction", 0.5), ("int", 1.0)]


@pytest.mark.virtual_time
@pytest.mark.parametrize("callback", [None, 42, "print"])
async def test_non_callable_callback_is_rejected_and_changes_nothing(callback: object) -> None:
    timer = ap.Timer()
    for method in (timer.call_later, timer.call_at):
        with pytest.raises(TypeError, match="callback"):
            method(1, callback)  # type: ignore[arg-type]
        assert len(timer) == 0
        assert armed_handle(timer) is None


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
    timer = ap.Timer()
    with pytest.raises(RuntimeError, match="running event loop"):
        timer.call_later(1, print)
    assert timer.loop is None
    assert len(timer) == 0


@pytest.mark.virtual_time
async def test_timer_binds_to_the_loop_of_first_use() -> None:
    timer = ap.Timer()
    timer.call_later(1, print).cancel()
    assert timer.loop is asyncio.get_running_loop()


# -- float rounding at tick boundaries (core bug) -----------------------------------------------


def run_virtual_bounded(main: Callable[[], Coroutine[Any, Any, Any]], limit: float) -> Any:
    """Run ``main()`` on a virtual-time loop in a thread; fail if it is not done in ``limit`` s.

    A livelock on virtual time does not advance the clock, so an asyncio timeout
    inside the loop would never fire: the watchdog has to be the wall clock.
    """
    loop = simulation.new_event_loop()
    result: list[Any] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(loop.run_until_complete(main()))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit)
    hung = thread.is_alive()
    if hung:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    loop.close()
    if hung:
        pytest.fail(f"the virtual-time loop made no progress within {limit} s (livelock)")
    if errors:
        raise errors[0]
    return result[0]


@pytest.mark.timeout(30)
def test_deadlines_on_float_unfriendly_tick_boundaries_fire() -> None:
    # 2001 * 0.001 / 0.001 is just below 2001: a driver that decides "due" by that
    # division finds nothing due at the armed instant and re-arms for the same
    # instant forever (a livelock on virtual time; a busy spin on real loops).
    bad = [e for e in range(1_990, 2_100) if (e * TICK) / TICK < e]
    assert bad  # the float effect this test is about exists

    async def main() -> list[tuple[float, float]]:
        loop = asyncio.get_running_loop()
        timer = ap.Timer()
        fired: list[tuple[float, float]] = []
        for e in bad:
            timer.call_at(e * TICK, lambda w: fired.append((w, loop.time())), e * TICK)
        await asyncio.sleep(3)
        return fired

    fired = run_virtual_bounded(main, 10.0)
    assert fired == [(w, w) for w in sorted(e * TICK for e in bad)]


def test_bounded_runner_reports_results() -> None:
    async def main() -> float:
        await asyncio.sleep(5)
        return asyncio.get_running_loop().time()

    assert run_virtual_bounded(main, 10.0) == 5.0


# -- real time, on asyncio and uvloop --------------------------------------------------------------


# uvloop rounds call_at to whole milliseconds: with a 1 ms tick the driver arms for
# whole milliseconds and uvloop is never early, so the ticks that are not whole
# milliseconds are the ones that make it wake the driver early (by up to a tick),
# and check that the driver re-checks the clock and re-arms instead of trusting it.
REALTIME_WHEELS = [(0.001, 20), (0.0007, 20), (0.0015, 3)]


@pytest.mark.realtime
@pytest.mark.parametrize(("tick", "wheel_size"), REALTIME_WHEELS)
async def test_never_early_on_real_loops(tick: float, wheel_size: int) -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer(tick=tick, wheel_size=wheel_size)
    rng = random.Random(11)
    n = 2_000
    fired: dict[int, tuple[float, float]] = {}  # i -> (when, fired at)
    duplicates: list[int] = []
    done = loop.create_future()
    expected: set[int] = set()

    def fire(i: int, when: float) -> None:
        if i in fired:
            duplicates.append(i)
        fired[i] = (when, loop.time())
        if len(fired) == len(expected) and not done.done():
            done.set_result(None)

    handles = []
    for i in range(n):
        when = loop.time() + rng.uniform(-0.005, 0.1)
        handles.append(timer.call_at(when, fire, i, when))
    for i in range(0, n, 3):  # a third are cancelled before they fire
        handles[i].cancel()
    expected = {i for i in range(n) if i % 3}
    assert len(timer) == len(expected)
    await asyncio.wait_for(done, 30)
    await asyncio.sleep(0.05)
    assert set(fired) == expected
    assert duplicates == []
    early = [(when, at) for when, at in fired.values() if at < when]
    assert early == []
    lateness = [at - when for when, at in fired.values()]
    assert max(lateness) < 2.0  # generous: a shared 2-core CI machine
    assert len(timer) == 0
    assert armed_handle(timer) is None


@pytest.mark.realtime
@pytest.mark.parametrize("tick", [0.001, 0.0007])
async def test_timers_spread_over_time_never_fire_early(tick: float) -> None:
    # Scheduled a few at a time while the loop is running, so the driver re-arms
    # often, with the clock between ticks: the case uvloop's early wake-ups hit.
    loop = asyncio.get_running_loop()
    timer = ap.Timer(tick=tick)
    rng = random.Random(5)
    early: list[float] = []
    count = 0
    all_fired = loop.create_future()

    def fire(when: float) -> None:
        nonlocal count
        count += 1
        if count == 1_000:
            all_fired.set_result(None)
        now = loop.time()
        if now < when:
            early.append(when - now)

    for _ in range(40):
        for _ in range(25):
            when = loop.time() + rng.uniform(0, 0.03)
            timer.call_at(when, fire, when)
        await asyncio.sleep(rng.uniform(0, 0.003))
    await asyncio.wait_for(all_fired, 30)
    assert count == 1_000
    assert early == []


# -- next_due(): when the timer next has work to do --------------------------------------


@pytest.mark.virtual_time
async def test_next_due_is_the_start_of_the_earliest_tick_with_work() -> None:
    timer = ap.Timer(tick=0.5)  # binary: exact products
    rec = Recorder()
    assert timer.next_due() is None  # nothing pending (not even bound yet)
    timer.call_later(1.2, rec, "late")  # tick ceil(2.4) = 3 -> 1.5 s
    assert timer.next_due() == 1.5  # staged entries count
    await asyncio.sleep(0)  # into the wheel
    assert timer.next_due() == 1.5
    early = timer.call_later(0.7, rec, "early")  # tick 2 -> 1.0 s
    assert timer.next_due() == 1.0
    await asyncio.sleep(0)
    assert timer.next_due() == 1.0
    early.cancel()
    assert timer.next_due() == 1.5  # an emptied bucket is dropped
    await asyncio.sleep(2)
    assert rec.calls == [("late", 1.5)]
    assert timer.next_due() is None


@pytest.mark.virtual_time
async def test_next_due_of_an_entry_already_due_is_not_in_the_future() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    await asyncio.sleep(10)
    timer.call_later(-5, lambda: None)
    due = timer.next_due()
    assert due is not None
    assert due <= loop.time()
    await asyncio.sleep(0)
    assert timer.next_due() is None  # it ran


@pytest.mark.virtual_time
@pytest.mark.parametrize("seed", range(5))
async def test_next_due_bounds_the_earliest_pending_callback(seed: int) -> None:
    # Without cancellations: the earliest when <= next_due < it + tick, and the
    # earliest callback runs at next_due exactly on virtual time.
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    rec = Recorder()
    whens = [loop.time() + rng.expovariate(1 / rng.choice([0.005, 0.3, 40.0])) for _ in range(200)]
    for when in whens:
        timer.call_at(when, rec, when)
    for step in range(2):
        due = timer.next_due()
        assert due is not None
        earliest = min(whens)
        assert earliest <= due < earliest + timer.tick
        if step == 0:
            await asyncio.sleep(0)  # the same in the wheel as on the stage
    while timer.next_due() is not None:
        due = timer.next_due()
        pending_before = len(timer)
        await asyncio.sleep(max(0.0, due - loop.time()))  # type: ignore[operator]
        await asyncio.sleep(0)
        assert len(timer) < pending_before
        assert rec.calls[-1][1] == due  # ran at the instant next_due() named
    assert sorted(rec.names) == sorted(whens)
