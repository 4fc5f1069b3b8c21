"""Tests of ``Timer.timeout``, ``ap.timeout`` and ``ap.timeout_at``.

They must behave like ``asyncio.timeout``/``asyncio.timeout_at``; several tests
run the same scenario with both and compare. Exact times on the virtual-time loop;
the real-time tests (asyncio and uvloop) check only that no timeout is early.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, suppress
from math import inf, nan
from typing import Any

import pytest

import aiopurgatory as ap

TimeoutFactory = Callable[[float | None], AbstractAsyncContextManager[Any]]


def ours(delay: float | None) -> AbstractAsyncContextManager[Any]:
    return ap.timeout(delay)


def theirs(delay: float | None) -> AbstractAsyncContextManager[Any]:
    return asyncio.timeout(delay)


both = pytest.mark.parametrize("make_timeout", [ours, theirs], ids=["aiopurgatory", "asyncio"])


# -- basics on virtual time -----------------------------------------------------------


@pytest.mark.virtual_time
async def test_raises_timeout_error_exactly_at_the_deadline() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    cm = timer.timeout(0.5)
    assert cm.when() == 0.5
    reached = False

    async def block() -> None:
        nonlocal reached
        async with cm:
            assert not cm.expired()
            await asyncio.sleep(10)
            reached = True

    with pytest.raises(TimeoutError) as info:
        await block()
    assert not reached
    assert loop.time() == 0.5
    assert cm.expired()
    assert isinstance(info.value.__cause__, asyncio.CancelledError)
    assert len(timer) == 0


@pytest.mark.virtual_time
async def test_a_sub_tick_deadline_is_rounded_up_not_early() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer(tick=0.01)
    with pytest.raises(TimeoutError):
        async with timer.timeout(0.123):
            await asyncio.sleep(1)
    assert loop.time() == 0.13


@pytest.mark.virtual_time
async def test_no_error_when_the_block_finishes_in_time() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    async with timer.timeout(0.5) as cm:
        assert len(timer) == 1
        await asyncio.sleep(0.2)
    assert loop.time() == 0.2
    assert not cm.expired()
    assert len(timer) == 0  # the deadline was withdrawn on exit
    await asyncio.sleep(1)  # and does not fire later
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


@pytest.mark.virtual_time
async def test_none_means_no_deadline() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    async with timer.timeout(None) as cm:
        assert cm.when() is None
        assert len(timer) == 0
        await asyncio.sleep(86_400)
    assert loop.time() == 86_400
    assert not cm.expired()


@pytest.mark.virtual_time
async def test_reschedule_moves_the_deadline() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()

    async def block() -> None:
        async with timer.timeout(None) as cm:
            await asyncio.sleep(1)
            cm.reschedule(loop.time() + 2)
            assert cm.when() == 3
            await asyncio.sleep(1)
            cm.reschedule(loop.time() + 5)  # later
            await asyncio.sleep(4)
            cm.reschedule(loop.time() + 0.25)  # earlier
            assert len(timer) == 1
            await asyncio.sleep(100)

    with pytest.raises(TimeoutError):
        await block()
    assert loop.time() == 6.25


@pytest.mark.virtual_time
async def test_reschedule_to_none_removes_the_deadline() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    async with timer.timeout(1) as cm:
        cm.reschedule(None)
        assert cm.when() is None
        assert len(timer) == 0
        await asyncio.sleep(5)
    assert loop.time() == 5
    assert not cm.expired()


@pytest.mark.virtual_time
async def test_reschedule_outside_the_block_raises() -> None:
    timer = ap.Timer()
    cm = timer.timeout(1)
    with pytest.raises(RuntimeError):
        cm.reschedule(2)
    async with cm:
        pass
    with pytest.raises(RuntimeError):
        cm.reschedule(2)


@pytest.mark.virtual_time
async def test_a_timeout_cannot_be_entered_twice() -> None:
    cm = ap.Timer().timeout(1)
    async with cm:
        pass
    with pytest.raises(RuntimeError):
        async with cm:
            pass


@pytest.mark.virtual_time
@pytest.mark.parametrize("delay", [0, -1, -3600.5])
async def test_zero_or_negative_delay_is_already_due(delay: float) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(10)
    cm = ap.Timer().timeout(delay)

    async def block() -> None:
        async with cm:
            assert not cm.expired()  # not synchronously on entry
            await asyncio.sleep(1)

    with pytest.raises(TimeoutError):
        await block()
    assert loop.time() == 10
    assert cm.expired()


@pytest.mark.virtual_time
async def test_timeout_at_takes_absolute_loop_time() -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(100)
    cm = ap.timeout_at(100.75)
    assert cm.when() == 100.75
    with pytest.raises(TimeoutError):
        async with cm:
            await asyncio.sleep(5)
    assert loop.time() == 100.75
    async with ap.timeout_at(None) as no_deadline:
        await asyncio.sleep(5)
    assert not no_deadline.expired()
    async with ap.Timer().timeout_at(loop.time() + 1):
        await asyncio.sleep(0.5)


@pytest.mark.virtual_time
async def test_module_level_timeouts_share_one_timer_per_loop() -> None:
    shared = ap.shared_timer()
    assert ap.shared_timer() is shared
    before = len(shared)
    async with ap.timeout(10), ap.timeout_at(20):
        assert len(shared) == before + 2
    assert len(shared) == before


def test_module_level_timeouts_get_a_new_timer_on_a_new_loop() -> None:
    async def get() -> ap.Timer:
        return ap.shared_timer()

    first = asyncio.run(get())
    second = asyncio.run(get())
    assert first is not second


# -- nesting and cancellation -------------------------------------------------------------


@pytest.mark.virtual_time
async def test_nested_inner_deadline_first() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    async with timer.timeout(1) as outer:
        with pytest.raises(TimeoutError):
            async with timer.timeout(0.5) as inner:
                await asyncio.sleep(10)
        assert loop.time() == 0.5
        await asyncio.sleep(0.25)  # the outer block carries on
    assert inner.expired()
    assert not outer.expired()
    assert loop.time() == 0.75


@pytest.mark.virtual_time
async def test_nested_outer_deadline_first() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    inner_saw: list[type[BaseException]] = []
    outer, inner = timer.timeout(0.3), timer.timeout(1)

    async def block() -> None:
        async with outer:
            try:
                async with inner:
                    await asyncio.sleep(10)
            except BaseException as exc:
                inner_saw.append(type(exc))
                raise

    with pytest.raises(TimeoutError):
        await block()
    # The inner block lets the outer's cancellation through, untouched.
    assert inner_saw == [asyncio.CancelledError]
    assert outer.expired()
    assert not inner.expired()
    assert loop.time() == 0.3


@pytest.mark.virtual_time
async def test_nested_equal_deadlines_outer_reports() -> None:
    timer = ap.Timer()
    with pytest.raises(TimeoutError):
        async with timer.timeout(0.5) as outer, timer.timeout(0.5) as inner:
            await asyncio.sleep(10)
    assert outer.expired()
    assert inner.expired()


@pytest.mark.virtual_time
async def test_an_outer_cancellation_is_not_turned_into_timeout_error() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    entered = asyncio.Event()

    async def body() -> None:
        async with timer.timeout(10) as cm:
            entered.set()
            await asyncio.sleep(100)
        raise AssertionError(f"not reached {cm}")

    task = asyncio.create_task(body())
    await entered.wait()
    await asyncio.sleep(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert loop.time() == 1
    assert len(timer) == 0


@pytest.mark.virtual_time
@both
async def test_cancel_and_deadline_at_once_gives_cancelled_error(
    make_timeout: TimeoutFactory,
) -> None:
    # The task is cancelled from outside in the same loop iteration as the deadline:
    # the outer cancellation wins, as in asyncio.
    loop = asyncio.get_running_loop()

    async def body() -> None:
        async with make_timeout(0.5):
            await asyncio.sleep(10)

    task = asyncio.create_task(body())
    await asyncio.sleep(0)
    loop.call_at(0.5, task.cancel)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert loop.time() == 0.5


@pytest.mark.virtual_time
async def test_a_timed_out_task_can_still_be_cancelled_later() -> None:
    timer = ap.Timer()
    proceed = asyncio.Event()

    async def body() -> None:
        with pytest.raises(TimeoutError):
            async with timer.timeout(0.1):
                await asyncio.sleep(1)
        proceed.set()
        await asyncio.sleep(100)

    task = asyncio.create_task(body())
    await proceed.wait()
    assert task.cancelling() == 0  # the timeout's cancel request was withdrawn
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# -- parity with asyncio.timeout --------------------------------------------------------


@pytest.mark.virtual_time
@both
async def test_parity_zero_delay_without_awaiting_does_not_time_out(
    make_timeout: TimeoutFactory,
) -> None:
    async with make_timeout(0):
        pass
    await asyncio.sleep(0.1)  # nothing left behind to cancel the task


@pytest.mark.virtual_time
@both
async def test_parity_swallowed_cancellation_means_no_timeout_error(
    make_timeout: TimeoutFactory,
) -> None:
    loop = asyncio.get_running_loop()
    async with make_timeout(0.5) as cm:
        with suppress(asyncio.CancelledError):
            await asyncio.sleep(10)
    assert cm.expired()
    assert loop.time() == 0.5


@pytest.mark.virtual_time
@both
async def test_parity_other_exceptions_pass_through(make_timeout: TimeoutFactory) -> None:
    cm = make_timeout(0.5)

    async def block() -> None:
        async with cm:
            await asyncio.sleep(0.1)
            raise KeyError("x")

    with pytest.raises(KeyError):
        await block()
    assert not cm.expired()  # type: ignore[attr-defined]


# -- bad input -----------------------------------------------------------------------


@pytest.mark.virtual_time
@pytest.mark.parametrize(
    ("value", "error"),
    [(nan, ValueError), (inf, ValueError), (-inf, ValueError), ("1", TypeError), (True, TypeError)],
)
async def test_bad_deadlines_are_rejected(value: Any, error: type[Exception]) -> None:
    timer = ap.Timer()
    with pytest.raises(error, match="delay"):
        timer.timeout(value)
    with pytest.raises(error, match="delay"):
        ap.timeout(value)
    with pytest.raises(error, match="when"):
        timer.timeout_at(value)
    with pytest.raises(error, match="when"):
        ap.timeout_at(value)
    async with timer.timeout(1) as cm:
        with pytest.raises(error, match="when"):
            cm.reschedule(value)
        assert cm.when() == 1  # a rejected reschedule changes nothing
        assert len(timer) == 1


def test_timeout_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        ap.timeout(1)
    with pytest.raises(RuntimeError):
        ap.Timer().timeout(1)


# -- real time, on asyncio and uvloop ----------------------------------------------------


@pytest.mark.realtime
async def test_timeout_never_early_on_real_loops() -> None:
    loop = asyncio.get_running_loop()
    rng = random.Random(2)
    results: list[
        tuple[float | None, float]
    ] = []  # (deadline, loop time when TimeoutError arrived)

    async def one(delay: float) -> None:
        with pytest.raises(TimeoutError):
            async with ap.timeout(delay) as cm:
                await asyncio.sleep(5)
        results.append((cm.when(), loop.time()))

    await asyncio.wait_for(
        asyncio.gather(*(one(rng.uniform(0, 0.05)) for _ in range(300))), timeout=30
    )
    assert len(results) == 300
    deadlines = [(w, t) for w, t in results if w is not None]
    assert len(deadlines) == 300
    assert [(w, t) for w, t in deadlines if t < w] == []
    assert max(t - w for w, t in deadlines) < 2.0  # generous, shared CI machine
    assert len(ap.shared_timer()) == 0


@pytest.mark.realtime
async def test_block_finishing_in_time_on_real_loops() -> None:
    async with ap.timeout(5) as cm:
        await asyncio.sleep(0.01)
    assert not cm.expired()
    assert len(ap.shared_timer()) == 0
