"""A timer entry's states and its one way out of the timer (``aiopurgatory._timer_entry``).

Every pending entry is STAGED, WAITING or DUE, and IDLE once it leaves, by
whatever means: a cancel, the timer running it, the timer closing. These tests
follow handles through each state on virtual time, on both cores (the state is a
C int in the compiled one).
"""

from __future__ import annotations

import asyncio

import pytest

import aiopurgatory as ap
from aiopurgatory._timer_states import DUE, IDLE, STAGED, STATE_NAMES, UNARMED, WAITING


async def _next_iteration() -> None:
    # The timer's flush runs on the next loop iteration (call_soon): let it run.
    await asyncio.sleep(0)
    await asyncio.sleep(0)


@pytest.mark.virtual_time
async def test_a_handle_goes_staged_waiting_idle() -> None:
    timer = ap.Timer()
    ran: list[str] = []
    handle = timer.call_later(1.0, ran.append, "fired")
    assert handle._state == STAGED
    assert timer._staged == [handle]
    await _next_iteration()
    assert handle._state == WAITING
    assert timer._staged == []
    # Its deadline in ticks, rounded up: 1 s at 1 ms ticks from the bind instant.
    assert handle._tick * timer.tick >= handle.when()
    assert timer._armed != UNARMED
    await asyncio.sleep(2)
    assert ran == ["fired"]
    assert handle._state == IDLE
    assert len(timer) == 0
    assert timer._armed == UNARMED


@pytest.mark.virtual_time
async def test_entries_of_one_batch_are_due_until_they_run() -> None:
    timer = ap.Timer()
    seen: list[int] = []
    later: list[ap.TimerHandle] = []

    def first() -> None:
        # Taken out of the wheel with it, not yet run.
        seen.append(later[0]._state)

    timer.call_later(0.5, first)
    later.append(timer.call_later(0.5, lambda: None))
    await asyncio.sleep(1)
    assert seen == [DUE]
    assert later[0]._state == IDLE


@pytest.mark.virtual_time
async def test_a_due_entry_cancelled_by_an_earlier_callback_does_not_run() -> None:
    timer = ap.Timer()
    ran: list[str] = []
    second: list[ap.TimerHandle] = []
    timer.call_later(0, lambda: second[0].cancel())
    second.append(timer.call_later(0, ran.append, "second"))
    await _next_iteration()
    assert ran == []
    assert second[0]._state == IDLE
    assert second[0].cancelled()
    assert len(timer) == 0


@pytest.mark.virtual_time
async def test_withdrawn_right_after_staging_leaves_the_stage_at_once() -> None:
    timer = ap.Timer()
    handle = timer.call_later(1.0, lambda: None)
    handle.cancel()
    assert handle._state == IDLE
    # The stage was the one place of the timer holding it: freed once the caller lets go.
    assert timer._staged == []
    assert len(timer) == 0


@pytest.mark.virtual_time
async def test_withdrawn_from_inside_the_stage_waits_for_the_flush_and_is_skipped() -> None:
    timer = ap.Timer()
    ran: list[str] = []
    a = timer.call_later(0.1, ran.append, "a")
    b = timer.call_later(0.1, ran.append, "b")
    a.cancel()
    # Not the last one staged: it stays, IDLE, until the flush drops it.
    assert [h is x for h, x in zip(timer._staged, (a, b), strict=True)] == [True, True]
    assert a._state == IDLE
    assert b._state == STAGED
    assert len(timer) == 1
    await _next_iteration()
    assert timer._staged == []
    assert a._state == IDLE
    assert b._state == WAITING
    await asyncio.sleep(1)
    assert ran == ["b"]


@pytest.mark.virtual_time
async def test_close_takes_every_state_out_and_tells_each() -> None:
    timer = ap.Timer()
    waiting = timer.call_later(5.0, lambda: None)
    await _next_iteration()
    staged = timer.call_later(5.0, lambda: None)
    assert (waiting._state, staged._state) == (WAITING, STAGED)
    timer.close()
    for handle in (waiting, staged):
        assert handle._state == IDLE
        assert handle.cancelled()
    assert len(timer) == 0
    assert timer._armed == UNARMED


@pytest.mark.virtual_time
async def test_the_repr_names_the_state() -> None:
    timer = ap.Timer()
    handle = timer.call_later(1.0, print)
    assert "pending (staged)" in repr(handle)
    await _next_iteration()
    assert "pending (waiting)" in repr(handle)
    handle.cancel()
    assert "cancelled" in repr(handle)
    assert STATE_NAMES[IDLE] == "idle"
