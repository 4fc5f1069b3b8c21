"""More Timer promises on every backend, beside ``test_timer.py`` (on every backend too).

Real time on asyncio, uvloop and trio: never early by the backend's own clock,
due-now callbacks, a failing callback contained (the loop's exception handler on
asyncio, a log record on trio), close, binding to the backend in use, one shared
timer per loop or run. Virtual time: cancelled handles leave the timer disarmed.
A timer bound to one backend or run refuses another; and the trio driver's life
cycle (its task ends when the timer is closed or collected, a dropped busy timer
still runs its callbacks, an idle one holds no deadline). See
``tests/support/backends.py`` for how they run.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import weakref
from math import inf
from typing import Any, cast

import anyio
import anyio.lowlevel
import pytest
import trio
import trio.testing
import uvloop

import aiopurgatory as ap
from aiopurgatory._backends import current_owner
from aiopurgatory._detect import current_backend
from aiopurgatory._timer_states import UNARMED
from aiopurgatory._trio_driver import TrioDriver
from tests.support.backends import each_backend, now, run_on, settle


@each_backend
async def test_never_early_by_the_backends_clock() -> None:
    timer = ap.Timer()
    rng = random.Random(7)
    late: list[float] = []
    done = anyio.Event()
    count = 300

    def fire(when: float) -> None:
        late.append(now() - when)
        if len(late) == count:
            done.set()

    start = now()
    for _ in range(count):
        when = start + rng.uniform(0.0, 0.05)
        timer.call_at(when, fire, when)
    with anyio.fail_after(10):
        await done.wait()
    assert min(late) >= 0.0  # never early
    assert sorted(late)[count // 2] < 0.5  # and not wildly late (tolerance: a loaded machine)


@each_backend(virtual=True)
async def test_cancelled_handles_never_run_and_leave_the_timer_idle() -> None:
    timer = ap.Timer()
    ran: list[int] = []
    handles = [timer.call_later(1.0 + i, ran.append, i) for i in range(5)]
    await settle()  # the handles reach the wheel; the driver is armed
    assert timer._driver is not None
    assert timer._armed != UNARMED
    for handle in handles[1:]:
        handle.cancel()
    assert len(timer) == 1
    await anyio.sleep(10)
    assert ran == [0]
    assert all(h.cancelled() for h in handles[1:])
    # Idle: nothing pending, nothing armed.
    assert len(timer) == 0
    assert timer._armed == UNARMED
    assert timer.next_due() is None


@each_backend
async def test_zero_and_past_delays_run_later_never_inside_the_call() -> None:
    timer = ap.Timer()
    ran: list[str] = []
    all_ran = anyio.Event()

    def run(name: str) -> None:
        ran.append(name)
        if len(ran) == 3:
            all_ran.set()

    timer.call_later(0, run, "zero")
    timer.call_later(-1.0, run, "negative")
    timer.call_at(now() - 5, run, "past")
    assert ran == []
    with anyio.fail_after(5):
        await all_ran.wait()
    assert sorted(ran) == ["negative", "past", "zero"]


@each_backend
async def test_a_failing_callback_is_contained(backend: str) -> None:
    timer = ap.Timer()
    ran: list[int] = []
    reported: list[BaseException] = []
    events = [anyio.Event() for _ in range(3)]

    def run(i: int) -> None:
        ran.append(i)
        events[i - 1].set()

    def boom() -> None:
        raise ZeroDivisionError("boom")

    if backend == "trio":
        # trio has no loop exception handler: the failure is logged.
        class Capture(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                assert record.exc_info is not None
                assert record.exc_info[1] is not None
                reported.append(record.exc_info[1])

        handler = Capture(level=logging.ERROR)
        logging.getLogger("aiopurgatory").addHandler(handler)
    else:
        loop = current_owner()
        loop.set_exception_handler(  # type: ignore[attr-defined]
            lambda _loop, context: reported.append(context["exception"])
        )
    try:
        timer.call_later(0.001, run, 1)
        timer.call_later(0.001, boom)
        timer.call_later(0.001, run, 2)
        with anyio.fail_after(5):
            await events[1].wait()
    finally:
        if backend == "trio":
            logging.getLogger("aiopurgatory").removeHandler(handler)
    assert ran == [1, 2]
    assert len(reported) == 1
    assert isinstance(reported[0], ZeroDivisionError)
    # The timer goes on working.
    timer.call_later(0.001, run, 3)
    with anyio.fail_after(5):
        await events[2].wait()
    assert ran == [1, 2, 3]


@each_backend
async def test_close_cancels_pending_handles_and_refuses_new_ones() -> None:
    timer = ap.Timer()
    ran: list[int] = []
    handle = timer.call_later(0.01, ran.append, 1)
    timer.close()
    assert handle.cancelled()
    assert len(timer) == 0
    with pytest.raises(ap.TimerClosedError):
        timer.call_later(0.01, ran.append, 2)
    await anyio.sleep(0.05)
    assert ran == []
    timer.close()  # idempotent


@each_backend
async def test_binds_to_the_backend_in_use(backend: str) -> None:
    assert ap.Timer().backend is None
    assert ap.Timer().loop is None
    timer = ap.Timer()
    timer.call_later(0.001, lambda: None)
    expected = "trio" if backend == "trio" else "asyncio"
    assert timer.backend == expected
    if backend == "trio":
        assert timer.loop is None
    else:
        assert timer.loop is current_owner()
    await anyio.sleep(0.01)


@each_backend
async def test_shared_timer_is_one_per_loop_or_run() -> None:
    first = ap.shared_timer()
    assert ap.shared_timer() is first
    assert first._driver is not None
    assert first._driver.owner is current_owner()


def test_a_timer_bound_to_one_backend_refuses_another() -> None:
    timer = ap.Timer()

    async def use() -> None:
        timer.call_later(0.001, lambda: None)
        await anyio.sleep(0.01)

    run_on("trio", use)
    with pytest.raises(RuntimeError, match="bound to another"):
        run_on("asyncio", use)
    with pytest.raises(RuntimeError, match="bound to another"):
        run_on("trio", use)  # another trio run
    other = ap.Timer()
    run_on("asyncio", lambda: _use(other))
    with pytest.raises(RuntimeError, match="bound to another"):
        run_on("trio", lambda: _use(other))


async def _use(timer: ap.Timer) -> None:
    timer.call_later(0.001, lambda: None)
    await anyio.sleep(0.01)


# -- the trio driver's life cycle ---------------------------------------------------


def test_trio_an_idle_dropped_timer_is_collected_and_its_task_ends() -> None:
    async def main() -> None:
        timer = ap.Timer()
        timer.call_later(0.001, lambda: None)
        await trio.sleep(0.01)
        # Fired: idle again. On a loaded machine this task and the driver may be
        # woken in one batch, in either order: give the driver its turn.
        for _ in range(200):
            if not len(timer):
                break
            await trio.sleep(0.005)
        assert len(timer) == 0
        tasks_before = trio.lowlevel.current_statistics().tasks_living
        ref = weakref.ref(timer)
        del timer
        gc.collect()
        assert ref() is None
        await trio.sleep(0.01)
        # The driver task of the collected timer has ended.
        tasks_after = trio.lowlevel.current_statistics().tasks_living
        assert tasks_after == tasks_before - 1

    trio.run(main)


def test_trio_a_busy_dropped_timer_still_runs_its_callbacks() -> None:
    async def main() -> list[int]:
        ran: list[int] = []
        timer = ap.Timer()
        timer.call_later(0.5, ran.append, 1)  # a fire-and-forget handle
        await trio.testing.wait_all_tasks_blocked()  # armed
        timer.call_later(0.6, ran.append, 2)  # staged: a flush is pending
        del timer
        gc.collect()
        await trio.sleep(1)
        return ran

    assert run_on("trio-virtual", main) == [1, 2]


def test_trio_close_ends_the_driver_task() -> None:
    async def main() -> None:
        timer = ap.Timer()
        timer.call_later(10, lambda: None)
        await trio.testing.wait_all_tasks_blocked()
        before = trio.lowlevel.current_statistics().tasks_living
        timer.close()
        await trio.testing.wait_all_tasks_blocked()
        assert trio.lowlevel.current_statistics().tasks_living == before - 1

    run_on("trio-virtual", main)


def test_trio_nothing_armed_when_idle() -> None:
    async def main() -> None:
        timer = ap.Timer()
        handle = timer.call_later(50.0, lambda: None)
        await trio.testing.wait_all_tasks_blocked()  # in the wheel: the driver sleeps till 50 s
        driver = cast("TrioDriver", timer._driver)
        assert driver._bed.scope is not None
        assert driver._bed.scope.deadline == pytest.approx(50.0)
        handle.cancel()
        # The sleeping driver task's deadline is gone: no wake-up, no clock jump.
        assert driver._armed == inf
        assert driver._bed.scope.deadline == inf
        await trio.sleep(7)
        assert trio.current_time() == 7.0

    run_on("trio-virtual", main)


# -- found in review: run ends, guest mode, a stopped asyncio loop -----------------------


def test_trio_a_flush_pending_as_the_run_ends_is_served_and_then_the_timer_refuses() -> None:
    timer = ap.Timer()
    fired: list[str] = []

    async def main() -> None:
        timer.call_later(100, fired.append, "far")  # binds; the driver sleeps until 100 s
        await trio.testing.wait_all_tasks_blocked()
        timer.call_later(-1, fired.append, "due")  # a flush pending as main returns

    run_on("trio", main)
    assert fired == ["due"]  # served as the run ended, as asyncio runs ready callbacks
    assert not timer._flush_requested  # nothing left half-done
    assert len(timer) == 1  # "far" is still pending, as on a closed asyncio loop

    async def later() -> None:
        timer.call_later(0, fired.append, "later")

    with pytest.raises(RuntimeError, match="bound to another"):
        run_on("trio", later)
    assert fired == ["due"]
    assert not timer._flush_requested


def test_trio_a_callback_rescheduling_itself_does_not_keep_the_run_alive() -> None:
    timer = ap.Timer()
    runs: list[int] = []

    def again() -> None:
        runs.append(1)
        timer.call_later(0, again)

    async def main() -> None:
        timer.call_later(0, again)
        await trio.sleep(0.01)

    # Returns (it used to spin forever as the run ended): the rescheduling done
    # after the driver task ended is refused and logged, not served.
    run_on("trio", main)
    assert len(runs) >= 2


def test_trio_guest_mode_on_an_asyncio_host_is_detected_as_trio() -> None:
    async def trio_main() -> tuple[str | None, ap.Outcome]:
        p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
        outcome = await p.watch(ap.DelayedOperation(0.01), ["k"])
        p.close()
        return current_backend(), outcome

    async def host() -> object:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[object] = loop.create_future()
        trio.lowlevel.start_guest_run(
            trio_main,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=done.set_result,
        )
        return (await done).unwrap()  # type: ignore[attr-defined]

    assert asyncio.run(host()) == ("trio", ap.Outcome.EXPIRED)


@pytest.mark.parametrize("host_loop", ["asyncio", "uvloop"])
def test_a_trio_guest_task_watches_in_a_purgatory_of_the_asyncio_host(host_loop: str) -> None:
    # Both libraries run in one thread: the purgatory is bound to the host loop,
    # and a trio task awaits watch() (it must get a waiter it can wait on).
    async def host() -> tuple[object, ap.Outcome | None]:
        loop = asyncio.get_running_loop()
        p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
        p.try_complete_else_watch(ap.DelayedOperation(10), ["bind"])  # bound here
        op = ap.DelayedOperation(0.01)

        async def trio_main() -> ap.Outcome:
            return await p.watch(op, ["k"])

        done: asyncio.Future[Any] = loop.create_future()
        trio.lowlevel.start_guest_run(
            trio_main,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=done.set_result,
            # uvloop sets the signal wakeup fd itself.
            host_uses_signal_set_wakeup_fd=host_loop == "uvloop",
        )
        outcome = (await done).unwrap()
        p.close()
        return outcome, op.outcome

    factory = asyncio.new_event_loop if host_loop == "asyncio" else uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        assert runner.run(host()) == (ap.Outcome.EXPIRED, ap.Outcome.EXPIRED)


def test_an_asyncio_host_task_watches_in_a_purgatory_of_a_trio_guest_run() -> None:
    async def host() -> tuple[object, ap.Outcome | None]:
        loop = asyncio.get_running_loop()
        holder: dict[str, ap.Purgatory[ap.DelayedOperation]] = {}
        bound = asyncio.Event()

        async def trio_main() -> None:
            p: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory()
            p.try_complete_else_watch(ap.DelayedOperation(10), ["bind"])  # bound in trio
            holder["p"] = p
            loop.call_soon_threadsafe(bound.set)
            await trio.sleep(0.5)
            p.close()

        done: asyncio.Future[Any] = loop.create_future()
        trio.lowlevel.start_guest_run(
            trio_main,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=done.set_result,
        )
        await bound.wait()
        op = ap.DelayedOperation(0.01)
        outcome = await holder["p"].watch(op, ["k"])
        (await done).unwrap()
        return outcome, op.outcome

    assert asyncio.run(host()) == (ap.Outcome.EXPIRED, ap.Outcome.EXPIRED)


def test_asyncio_a_timer_may_be_used_while_its_loop_is_stopped() -> None:
    # Between run_until_complete() calls, as loop.call_later may.
    loop = asyncio.new_event_loop()
    try:
        timer = ap.Timer()

        async def bind() -> None:
            timer.call_later(10, int).cancel()

        loop.run_until_complete(bind())
        fired: list[int] = []
        timer.call_later(0.01, fired.append, 1)
        loop.run_until_complete(asyncio.sleep(0.05))
        assert fired == [1]
    finally:
        loop.close()
