"""More ``ap.timeout()`` promises on every backend, beside ``test_timeout.py``.

On asyncio the deadline cancels the task (as ``asyncio.timeout``); on trio it
cancels a cancel scope around the block. Either way the block is interrupted at
the deadline, never before, and leaving it raises ``TimeoutError``. Here: the
shared timer's ``reschedule``, an outer cancel scope, entering once, parity with
``trio.fail_after`` on trio's virtual time, and timers that refuse to time a block
(closed, or bound to another run) leaving the task's cancel scopes intact. See
``tests/support/backends.py`` for how they run.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest
import trio

import aiopurgatory as ap
from aiopurgatory import simulation
from tests.support.backends import each_backend, now, run_on


@each_backend(virtual=True)
async def test_reschedule_and_none() -> None:
    start = now()
    async with ap.timeout(None) as cm:
        await anyio.sleep(100)
        assert cm.when() is None
        cm.reschedule(now() + 1)
        with pytest.raises(TypeError):
            cm.reschedule("soon")  # type: ignore[arg-type]
        await anyio.sleep(0.5)
        cm.reschedule(None)
        await anyio.sleep(5)
    assert not cm.expired()
    with pytest.raises(TimeoutError):  # noqa: PT012
        async with ap.timeout_at(now() + 2) as cm2:
            cm2.reschedule(now() + 3)
            await anyio.sleep(10)
    assert now() == start + 105.5 + 3


@each_backend(virtual=True)
async def test_an_outer_cancel_scope_is_not_turned_into_timeout_error() -> None:
    start = now()
    with anyio.move_on_after(1) as outer:
        async with ap.timeout(5) as cm:
            await anyio.sleep(10)
    assert outer.cancelled_caught
    assert not cm.expired()
    assert now() == start + 1


@each_backend
async def test_a_timeout_is_entered_once() -> None:
    cm = ap.timeout(1)
    async with cm:
        pass
    with pytest.raises(RuntimeError, match="already been entered"):
        async with cm:
            pass


def test_trio_timeout_on_trio_time_matches_trio_fail_after() -> None:
    # The same block under trio's own fail_after and under ap.timeout ends at the
    # same virtual instant.
    async def ours() -> float:
        with pytest.raises(TimeoutError):
            async with ap.timeout(2.5):
                await trio.sleep_forever()
        return trio.current_time()

    async def theirs() -> float:
        with pytest.raises(trio.TooSlowError):
            with trio.fail_after(2.5):
                await trio.sleep_forever()
        return trio.current_time()

    assert simulation.run_trio(ours) == simulation.run_trio(theirs) == 2.5


def test_a_timer_of_another_run_refuses_to_time_a_block_cleanly() -> None:
    timer = ap.Timer()

    async def bind() -> None:
        async with timer.timeout(1):
            pass

    run_on("asyncio", bind)

    async def use_on_trio() -> str:
        cm = timer.timeout_at(trio.current_time() + 1)
        task = trio.lowlevel.current_task()
        before = task._cancel_status
        with pytest.raises(RuntimeError, match="bound to another"):
            async with cm:
                pass
        # The block was not entered: no cancel scope was left open on the task.
        assert task._cancel_status is before
        with trio.move_on_after(0.01) as scope:
            await trio.sleep(1)
        return "intact" if scope.cancelled_caught else "broken"

    assert run_on("trio", use_on_trio) == "intact"


@each_backend
async def test_a_closed_timer_refuses_to_time_a_block() -> None:
    timer = ap.Timer()
    timer.close()
    cm = timer.timeout(1)
    with pytest.raises(ap.TimerClosedError):
        async with cm:
            pass
    with anyio.move_on_after(0.01) as scope:  # cancel scopes still work
        await anyio.sleep(1)
    assert scope.cancelled_caught


@each_backend
async def test_an_already_due_timeout_interrupts_the_first_suspension() -> None:
    # Real time: with a zero or negative delay the very first await is interrupted
    # (as asyncio.timeout(0) and trio.fail_after(0) do), not one tick later.
    for delay in (0, -1.0):
        with pytest.raises(TimeoutError):
            async with ap.timeout(delay):
                await anyio.lowlevel.checkpoint()
