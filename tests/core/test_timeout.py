"""Tests of ``Timer.timeout``, ``ap.timeout`` and ``ap.timeout_at``.

They must behave like ``asyncio.timeout``/``asyncio.timeout_at`` on asyncio, and
like trio's own deadlines on trio (the block runs in a cancel scope that the
deadline cancels; leaving it raises ``TimeoutError``, as ``anyio.fail_after``).

Most tests run on every backend (see ``tests/support/backends.py``): exact times on
virtual time (``@each_backend(virtual=True)``: asyncio's virtual-time loop and
trio's autojumping mock clock, both starting at 0.0), and the real-time tests on
asyncio, uvloop and trio (``@each_backend``), which check only that no timeout is
early. The tests of asyncio's own machinery stay on asyncio (pytest-asyncio,
``@pytest.mark.virtual_time``): parity with ``asyncio.timeout`` (run with both and
compared), and the interplay with ``Task.cancel()``, ``cancelling()`` and
``uncancel()``. Each has a counterpart that runs on trio: on every backend where
the asyncio one cancels a task (here a task group cancels it, a nursery on trio),
and ``test_trio_...`` on trio's virtual time where it compares with
``asyncio.timeout`` (there the reference is ``anyio.fail_after``, trio's deadline
scope raising ``TimeoutError``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager, suppress
from math import inf, nan
from typing import Any

import anyio
import pytest
import trio

import aiopurgatory as ap
from aiopurgatory import simulation
from tests.support.backends import REAL, each_backend, now, run_on

TimeoutFactory = Callable[[float | None], AbstractAsyncContextManager[Any]]


def ours(delay: float | None) -> AbstractAsyncContextManager[Any]:
    return ap.timeout(delay)


def theirs(delay: float | None) -> AbstractAsyncContextManager[Any]:
    return asyncio.timeout(delay)


both = pytest.mark.parametrize("make_timeout", [ours, theirs], ids=["aiopurgatory", "asyncio"])


@contextmanager
def noting(saw: list[type[BaseException]]) -> Iterator[None]:
    """Append the type of an exception leaving the block to ``saw``, and let it go on."""
    try:
        yield
    except BaseException as exc:
        saw.append(type(exc))
        raise


class _FailAfter:
    """``anyio.fail_after`` shaped like a ``Timeout``: ``expired()`` is ``cancel_called``."""

    def __init__(self, scope: anyio.CancelScope) -> None:
        self.scope = scope

    def expired(self) -> bool:
        return self.scope.cancel_called


@asynccontextmanager
async def anyio_fail_after(delay: float | None) -> AsyncIterator[_FailAfter]:
    with anyio.fail_after(delay) as scope:
        yield _FailAfter(scope)


# On trio the reference is a deadline scope: anyio.fail_after (trio's fail_after,
# raising TimeoutError as ap.timeout does on every backend).
both_on_trio = pytest.mark.parametrize(
    "make_timeout", [ours, anyio_fail_after], ids=["aiopurgatory", "anyio.fail_after"]
)


# -- basics on virtual time -----------------------------------------------------------


@each_backend(virtual=True)
async def test_raises_timeout_error_exactly_at_the_deadline() -> None:
    timer = ap.Timer()
    cm = timer.timeout(0.5)
    assert cm.when() == 0.5
    reached = False

    async def block() -> None:
        nonlocal reached
        async with cm:
            assert not cm.expired()
            await anyio.sleep(10)
            reached = True

    with pytest.raises(TimeoutError) as info:
        await block()
    assert not reached
    assert now() == 0.5
    assert cm.expired()
    # Chained from the cancellation: asyncio's CancelledError, trio's Cancelled.
    assert isinstance(info.value.__cause__, anyio.get_cancelled_exc_class())
    assert len(timer) == 0


@each_backend(virtual=True)
async def test_a_sub_tick_deadline_is_rounded_up_not_early() -> None:
    timer = ap.Timer(tick=0.01)
    with pytest.raises(TimeoutError):
        async with timer.timeout(0.123):
            await anyio.sleep(1)
    assert now() == 0.13


@each_backend(virtual=True)
async def test_no_error_when_the_block_finishes_in_time(backend: str) -> None:
    timer = ap.Timer()
    if backend.startswith("trio"):
        task = trio.lowlevel.current_task()
        status = task._cancel_status
    async with timer.timeout(0.5) as cm:
        assert len(timer) == 1
        await anyio.sleep(0.2)
    assert now() == 0.2
    assert not cm.expired()
    assert len(timer) == 0  # the deadline was withdrawn on exit
    await anyio.sleep(1)  # and does not fire later
    if backend.startswith("trio"):
        assert task._cancel_status is status  # the block's cancel scope is gone
    else:
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


@each_backend(virtual=True)
async def test_none_means_no_deadline() -> None:
    timer = ap.Timer()
    async with timer.timeout(None) as cm:
        assert cm.when() is None
        assert len(timer) == 0
        await anyio.sleep(86_400)
    assert now() == 86_400
    assert not cm.expired()


@each_backend(virtual=True)
async def test_reschedule_moves_the_deadline() -> None:
    timer = ap.Timer()

    async def block() -> None:
        async with timer.timeout(None) as cm:
            await anyio.sleep(1)
            cm.reschedule(now() + 2)
            assert cm.when() == 3
            await anyio.sleep(1)
            cm.reschedule(now() + 5)  # later
            await anyio.sleep(4)
            cm.reschedule(now() + 0.25)  # earlier
            assert len(timer) == 1
            await anyio.sleep(100)

    with pytest.raises(TimeoutError):
        await block()
    assert now() == 6.25


@each_backend(virtual=True)
async def test_reschedule_to_none_removes_the_deadline() -> None:
    timer = ap.Timer()
    async with timer.timeout(1) as cm:
        cm.reschedule(None)
        assert cm.when() is None
        assert len(timer) == 0
        await anyio.sleep(5)
    assert now() == 5
    assert not cm.expired()


@each_backend(virtual=True)
async def test_reschedule_outside_the_block_raises() -> None:
    timer = ap.Timer()
    cm = timer.timeout(1)
    with pytest.raises(RuntimeError):
        cm.reschedule(2)
    async with cm:
        pass
    with pytest.raises(RuntimeError):
        cm.reschedule(2)


@each_backend(virtual=True)
async def test_a_timeout_cannot_be_entered_twice() -> None:
    cm = ap.Timer().timeout(1)
    async with cm:
        pass
    with pytest.raises(RuntimeError):
        async with cm:
            pass


@pytest.mark.parametrize("delay", [0, -1, -3600.5])
@each_backend(virtual=True)
async def test_zero_or_negative_delay_is_already_due(delay: float, backend: str) -> None:
    await anyio.sleep(10)
    cm = ap.Timer().timeout(delay)

    async def block() -> None:
        async with cm:
            # asyncio: not synchronously on entry (as asyncio.timeout(0), it comes
            # from a callback before the task resumes); trio: a scope entered past
            # its deadline is cancelled on entry (as trio.fail_after(0)). Either
            # way the first suspension is interrupted.
            assert cm.expired() is backend.startswith("trio")
            await anyio.sleep(1)

    with pytest.raises(TimeoutError):
        await block()
    assert now() == 10
    assert cm.expired()


@each_backend(virtual=True)
async def test_timeout_at_takes_absolute_loop_time() -> None:
    await anyio.sleep(100)
    cm = ap.timeout_at(100.75)
    assert cm.when() == 100.75
    with pytest.raises(TimeoutError):
        async with cm:
            await anyio.sleep(5)
    assert now() == 100.75
    async with ap.timeout_at(None) as no_deadline:
        await anyio.sleep(5)
    assert not no_deadline.expired()
    async with ap.Timer().timeout_at(now() + 1):
        await anyio.sleep(0.5)


@each_backend(virtual=True)
async def test_module_level_timeouts_share_one_timer_per_loop() -> None:
    shared = ap.shared_timer()
    assert ap.shared_timer() is shared
    before = len(shared)
    async with ap.timeout(10), ap.timeout_at(20):
        assert len(shared) == before + 2
    assert len(shared) == before


@pytest.mark.parametrize("backend", REAL)
def test_module_level_timeouts_get_a_new_timer_on_a_new_loop(backend: str) -> None:
    async def get() -> ap.Timer:
        return ap.shared_timer()

    # Kept alive, so the second loop or run cannot reuse the first one's id.
    first = run_on(backend, get)
    second = run_on(backend, get)
    assert first is not second


# -- nesting and cancellation -------------------------------------------------------------


@each_backend(virtual=True)
async def test_nested_inner_deadline_first() -> None:
    timer = ap.Timer()
    async with timer.timeout(1) as outer:
        with pytest.raises(TimeoutError):
            async with timer.timeout(0.5) as inner:
                await anyio.sleep(10)
        assert now() == 0.5
        await anyio.sleep(0.25)  # the outer block carries on
    assert inner.expired()
    assert not outer.expired()
    assert now() == 0.75


@each_backend(virtual=True)
async def test_nested_outer_deadline_first() -> None:
    timer = ap.Timer()
    inner_saw: list[type[BaseException]] = []
    outer, inner = timer.timeout(0.3), timer.timeout(1)

    async def block() -> None:
        async with outer:
            with noting(inner_saw):
                async with inner:
                    await anyio.sleep(10)

    with pytest.raises(TimeoutError):
        await block()
    # The inner block lets the outer's cancellation through, untouched.
    assert inner_saw == [anyio.get_cancelled_exc_class()]
    assert outer.expired()
    assert not inner.expired()
    assert now() == 0.3


@each_backend(virtual=True)
async def test_nested_equal_deadlines_outer_reports() -> None:
    timer = ap.Timer()
    with pytest.raises(TimeoutError):
        async with timer.timeout(0.5) as outer, timer.timeout(0.5) as inner:
            await anyio.sleep(10)
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


@each_backend(virtual=True)
async def test_a_task_group_cancelled_from_outside_is_not_turned_into_timeout_error() -> None:
    # The counterpart of the above on every backend: the block's task is cancelled
    # by its task group (a nursery on trio) from another task, before the deadline.
    timer = ap.Timer()
    entered = anyio.Event()
    saw: list[type[BaseException]] = []

    async def body() -> None:
        with noting(saw):
            async with timer.timeout(10) as cm:
                entered.set()
                await anyio.sleep(100)
            raise AssertionError(f"not reached {cm}")

    async with anyio.create_task_group() as group:
        group.start_soon(body)
        await entered.wait()
        await anyio.sleep(1)
        group.cancel_scope.cancel()
    assert saw == [anyio.get_cancelled_exc_class()]
    assert now() == 1
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


@pytest.mark.parametrize("seed", range(4))
@both_on_trio
def test_trio_a_nursery_cancelled_at_the_deadline_gives_cancelled(
    make_timeout: TimeoutFactory, seed: int
) -> None:
    # The trio counterpart of the above: the block's nursery is cancelled at the
    # deadline's instant (its own deadline). Whichever of the two trio handles
    # first (the seed picks the order of tasks woken together), the outer
    # cancellation wins, as with trio's own deadline scopes.
    async def main() -> tuple[list[type[BaseException]], float]:
        saw: list[type[BaseException]] = []

        async def body() -> None:
            with noting(saw):
                async with make_timeout(0.5):
                    await trio.sleep(10)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(body)
            await trio.lowlevel.checkpoint()
            nursery.cancel_scope.deadline = 0.5
        return saw, trio.current_time()

    assert simulation.run_trio(main, seed=seed) == ([trio.Cancelled], 0.5)


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


@each_backend(virtual=True)
async def test_a_timed_out_block_leaves_its_task_cancellable() -> None:
    # The counterpart of the above on every backend: after a timeout, the task's
    # task group (a nursery on trio) still cancels it, at once.
    timer = ap.Timer()
    proceed = anyio.Event()
    saw: list[type[BaseException]] = []

    async def body() -> None:
        with pytest.raises(TimeoutError):
            async with timer.timeout(0.1):
                await anyio.sleep(1)
        proceed.set()
        with noting(saw):
            await anyio.sleep(100)

    async with anyio.create_task_group() as group:
        group.start_soon(body)
        await proceed.wait()
        group.cancel_scope.cancel()
    assert saw == [anyio.get_cancelled_exc_class()]
    assert now() == 0.1


# -- parity with asyncio.timeout (and trio's deadline scopes) ----------------------------


@pytest.mark.virtual_time
@both
async def test_parity_zero_delay_without_awaiting_does_not_time_out(
    make_timeout: TimeoutFactory,
) -> None:
    async with make_timeout(0):
        pass
    await asyncio.sleep(0.1)  # nothing left behind to cancel the task


@both_on_trio
def test_trio_parity_zero_delay_without_awaiting_does_not_time_out(
    make_timeout: TimeoutFactory,
) -> None:
    async def main() -> None:
        async with make_timeout(0):
            pass
        await trio.sleep(0.1)  # nothing left behind to cancel the task

    run_on("trio-virtual", main)


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


@both_on_trio
def test_trio_parity_swallowed_cancellation_means_no_timeout_error(
    make_timeout: TimeoutFactory,
) -> None:
    async def main() -> None:
        async with make_timeout(0.5) as cm:
            with suppress(trio.Cancelled):
                await trio.sleep(10)
        assert cm.expired()
        assert trio.current_time() == 0.5

    run_on("trio-virtual", main)


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


@both_on_trio
def test_trio_parity_other_exceptions_pass_through(make_timeout: TimeoutFactory) -> None:
    async def main() -> bool:
        entered: list[Any] = []

        async def block() -> None:
            async with make_timeout(0.5) as cm:
                entered.append(cm)
                await trio.sleep(0.1)
                raise KeyError("x")

        with pytest.raises(KeyError):
            await block()
        return bool(entered[0].expired())

    assert run_on("trio-virtual", main) is False


# -- bad input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error"),
    [(nan, ValueError), (inf, ValueError), (-inf, ValueError), ("1", TypeError), (True, TypeError)],
)
@each_backend(virtual=True)
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
    # Outside asyncio and outside trio (imported here, so the check for a trio run is made).
    with pytest.raises(RuntimeError):
        ap.timeout(1)
    with pytest.raises(RuntimeError):
        ap.Timer().timeout(1)


# -- real time, on asyncio, uvloop and trio ----------------------------------------------


@pytest.mark.realtime
@each_backend
async def test_timeout_never_early_on_real_loops() -> None:
    rng = random.Random(2)
    results: list[
        tuple[float | None, float]
    ] = []  # (deadline, the backend's time when TimeoutError arrived)

    async def one(delay: float) -> None:
        with pytest.raises(TimeoutError):
            async with ap.timeout(delay) as cm:
                await anyio.sleep(5)
        results.append((cm.when(), now()))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for _ in range(300):
                group.start_soon(one, rng.uniform(0, 0.05))
    assert len(results) == 300
    deadlines = [(w, t) for w, t in results if w is not None]
    assert len(deadlines) == 300
    assert [(w, t) for w, t in deadlines if t < w] == []
    assert max(t - w for w, t in deadlines) < 2.0  # generous, shared CI machine
    assert len(ap.shared_timer()) == 0


@pytest.mark.realtime
@each_backend
async def test_block_finishing_in_time_on_real_loops() -> None:
    async with ap.timeout(5) as cm:
        await anyio.sleep(0.01)
    assert not cm.expired()
    assert len(ap.shared_timer()) == 0
