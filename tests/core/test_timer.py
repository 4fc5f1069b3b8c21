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
import random
import sys
import weakref
from collections.abc import Sequence
from math import inf, nan
from typing import Any

import anyio
import pytest
import trio
import trio.testing

import aiopurgatory as ap
from aiopurgatory import simulation
from aiopurgatory._backends import current_owner
from tests.support.backends import VIRTUAL, each_backend, now, run_on
from tests.support.purgatory import Op
from tests.support.timer import (
    TICK,
    Recorder,
    advance,
    armed_at,
    due_time,
    next_iteration,
)

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


# -- deadlines the wheel cannot count ----------------------------------------------------


def test_a_delay_beyond_the_wheel_is_refused_and_others_still_fire() -> None:
    # Used to raise OverflowError inside the driver and lose every other timer
    # scheduled in the same loop iteration.
    async def main() -> tuple[list[str], int]:
        timer = ap.Timer()
        fired: list[str] = []
        timer.call_later(0.01, fired.append, "a")
        with pytest.raises(ValueError, match="delay"):
            timer.call_later(sys.float_info.max, fired.append, "never")
        with pytest.raises(ValueError, match="when"):
            timer.call_at(1e306, fired.append, "never")
        timer.call_later(0.02, fired.append, "b")
        await asyncio.sleep(1)
        return fired, len(timer)

    assert simulation.run(main()) == (["a", "b"], 0)


def test_a_timeout_beyond_the_wheel_is_refused_before_any_state_changes() -> None:
    async def main() -> None:
        purgatory: ap.Purgatory[Op] = ap.Purgatory()
        before = purgatory.statistics()
        huge = Op(1e306)
        with pytest.raises(ValueError, match="timeout"):
            purgatory.try_complete_else_watch(huge, ["k"])
        assert purgatory.statistics() == before
        assert huge.outcome is None
        assert huge.deadline is None
        short = Op(0.5)
        assert not purgatory.try_complete_else_watch(short, ["k"])
        await asyncio.sleep(1)
        assert short.outcome is ap.Outcome.EXPIRED

    simulation.run(main())


# -- used from another loop: refused before anything changes -------------------------------


def test_timer_on_a_closed_loop_refuses_without_changing_state() -> None:
    timer = ap.Timer()

    async def first() -> None:
        timer.call_later(0.001, lambda: None)
        await asyncio.sleep(0.01)

    asyncio.run(first())

    async def second() -> None:
        with pytest.raises(RuntimeError):
            timer.call_later(0.001, lambda: None)
        assert len(timer) == 0

    asyncio.run(second())


# -- a clock patched on the loop instance --------------------------------------------------------


def test_a_loop_clock_patched_on_the_instance_is_used() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        loop.time = lambda: 1000.0  # type: ignore[method-assign]
        timer = ap.Timer()
        handle = timer.call_later(1.0, lambda: None)
        when = handle.when()
        handle.cancel()
        return when, loop.time()

    when, now = asyncio.run(main())
    assert when == now + 1.0


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
