"""The Purgatory against SPEC.md (sections DelayedOperation, Purgatory, Errors).

The tests are backend-neutral (anyio's functions, ``now()`` and ``settle()`` from
``tests/support/backends.py``) and run on every backend: ``@each_backend(virtual=True)``
on virtual time, asyncio's (``simulation.run``) and trio's (``simulation.run_trio``,
its mock clock, seeded), where both clocks start at 0 and exact time assertions
are sound; ``@each_backend`` on the real loops (asyncio, uvloop and trio), where
they assert only "never early" against the backend's clock. See
``tests/support/backends.py`` for how they run.

A few stay on asyncio because asyncio is what they test (``asyncio.timeout``, a
task cancelled after its wake-up, two asyncio loops); each is next to its trio
counterpart. Sync tests that touch no loop are plain functions.

The last section keeps regression tests for core bugs these tests found (once
strict xfails, lifted when the core was fixed).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import gc
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar, cast
from unittest import mock

import anyio
import anyio.abc
import anyio.to_thread
import pytest
import trio
from structlog.testing import capture_logs

import aiopurgatory as ap
from aiopurgatory import simulation
from aiopurgatory._trio_driver import TrioDriver
from tests.support.backends import REAL, VIRTUAL, each_backend, now, run_on, settle

COMPLETED = ap.Outcome.COMPLETED
EXPIRED = ap.Outcome.EXPIRED
CANCELLED = ap.Outcome.CANCELLED
FAILED = ap.Outcome.FAILED

T = TypeVar("T")


class Op(ap.DelayedOperation):
    """A test operation that records everything that happens to it.

    Args:
        timeout: seconds.
        completable: ``try_complete`` completes the op when this is true.
        complete_on_try: ``try_complete`` completes the op on this call number (1-based).
        raise_in: names of callbacks that raise ``Boom`` (``try_complete`` raises
            after completing if ``completable``).
        name: a label for assertion messages.
    """

    def __init__(
        self,
        timeout: float = 1.0,
        *,
        completable: bool = False,
        complete_on_try: int | None = None,
        raise_in: frozenset[str] = frozenset(),
        name: str = "",
    ) -> None:
        super().__init__(timeout)
        self.name = name
        self.completable = completable
        self.complete_on_try = complete_on_try
        self.raise_in = raise_in
        self.tries = 0
        self.calls: list[str] = []
        self.completed_at: list[float] = []
        self.expired_at: list[float] = []
        self.on_try: Callable[[], object] | None = None
        self.after_complete: Callable[[], object] | None = None
        self.after_expire: Callable[[], object] | None = None

    def __repr__(self) -> str:
        return f"<Op {self.name} {self.outcome}>"

    def try_complete(self) -> bool:
        self.tries += 1
        self.calls.append("try_complete")
        if self.on_try is not None:
            self.on_try()
        result = False
        if self.completable or self.tries == self.complete_on_try:
            result = self.force_complete()
        if "try_complete" in self.raise_in:
            raise Boom(f"try_complete of {self.name}")
        return result

    def on_complete(self) -> None:
        self.calls.append("on_complete")
        self.completed_at.append(now())
        if self.after_complete is not None:
            self.after_complete()
        if "on_complete" in self.raise_in:
            raise Boom(f"on_complete of {self.name}")

    def on_expiration(self) -> None:
        self.calls.append("on_expiration")
        self.expired_at.append(now())
        if self.after_expire is not None:
            self.after_expire()
        if "on_expiration" in self.raise_in:
            raise Boom(f"on_expiration of {self.name}")

    def callbacks(self) -> list[str]:
        return [c for c in self.calls if c != "try_complete"]


class Boom(Exception):
    """What the test callbacks raise."""


def outcome(op: ap.DelayedOperation) -> ap.Outcome | None:
    """``op.outcome`` read through a call, so that type checkers do not narrow it."""
    return op.outcome


def failures(logs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [e for e in logs if e["event"] == "aiopurgatory.callback_failed"]


async def collect_garbage() -> None:
    """Collect operations nobody keeps, and let the loop make the logs they hand it.

    A failure nobody received is logged once its operation is garbage-collected
    (as asyncio's "exception was never retrieved"), from the loop.
    """
    await settle()  # the timer lets go of finished operations on its next flush
    gc.collect()
    await settle()


@contextlib.contextmanager
def loop_errors() -> Iterator[list[dict[str, Any]]]:
    """What escapes the purgatory to the backend's last resort (must stay empty).

    On asyncio: everything that reaches the running loop's exception handler (a
    timer callback's exception, a future's exception never retrieved, ...).
    trio has no loop exception handler: there a timer callback's exception goes
    to the timer driver's ``report`` (logged as ``aiopurgatory.timer_callback_failed``),
    which is what this collects; anything else left uncontained fails the run
    itself. (It wraps ``TrioDriver.report`` rather than capturing logs, because
    the tests capture their own logs with ``capture_logs``, which does not nest.)
    """
    errors: list[dict[str, Any]] = []
    if trio.lowlevel.in_trio_run():
        report = TrioDriver.report

        def recording_report(driver: TrioDriver, exc: BaseException, entry: object) -> None:
            errors.append({"exception": exc, "timer_handle": entry})
            report(driver, exc, entry)

        with mock.patch.object(TrioDriver, "report", recording_report):
            yield errors
    else:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        try:
            yield errors
        finally:
            loop.set_exception_handler(None)


class Task(Generic[T]):
    """A child task started with :func:`start`: what the tests need of an ``asyncio.Task``.

    ``cancel()`` cancels it through a cancel scope of its own (asyncio task
    cancellation on asyncio, a cancel scope on trio); once it has finished,
    ``cancelled`` says whether that cancellation came out of the awaited call.
    """

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.cancelled = False
        self._finished = anyio.Event()
        self._value: T | None = None
        self._error: Exception | None = None

    def done(self) -> bool:
        return self._finished.is_set()

    def cancel(self) -> None:
        self.scope.cancel()

    async def wait(self) -> None:
        """Wait until the task has finished (returned, raised or been cancelled)."""
        await self._finished.wait()

    async def result(self) -> T:
        """Wait, then return what the call returned or raise what it raised."""
        await self.wait()
        if self._error is not None:
            raise self._error
        if self.cancelled:
            raise AssertionError("the task was cancelled")
        return cast("T", self._value)


def start(tg: anyio.abc.TaskGroup, fn: Callable[..., Awaitable[T]], *args: Any) -> Task[T]:
    """Run ``await fn(*args)`` in a new task of ``tg``; its result is kept in the Task."""
    task: Task[T] = Task()

    async def run() -> None:
        try:
            with task.scope:
                try:
                    task._value = await fn(*args)
                except Exception as exc:
                    task._error = exc
            task.cancelled = task.scope.cancelled_caught
        finally:
            task._finished.set()

    tg.start_soon(run)
    return task


def assert_clean(p: ap.Purgatory[Any]) -> None:
    """Nothing is pending: no watch entry, no key, nothing in the timer."""
    stats = p.statistics()
    assert (stats.watched, stats.delayed, stats.keys, stats.pending) == (0, 0, 0, 0)
    assert len(p.timer) == 0


# =====================================================================================
# Kafka's DelayedOperationTest, in our words, with immediate watch-list removal
# =====================================================================================


@each_backend(virtual=True)
async def test_kafka_check_and_complete_unknown_key_is_zero() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    assert p.check_and_complete("nobody") == 0
    assert p.cancel_for_key("nobody") == []
    p.try_complete_else_watch(Op(), ["k"])
    assert p.check_and_complete("other") == 0


@each_backend(virtual=True)
async def test_kafka_request_satisfaction() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    r1, r2 = Op(100, name="r1"), Op(100, name="r2")
    assert p.check_and_complete("t") == 0
    assert p.try_complete_else_watch(r1, ["t"]) is False
    assert p.try_complete_else_watch(r2, ["t"]) is False
    assert p.check_and_complete("t") == 0  # nothing completable: both stay
    assert outcome(r1) is None
    assert outcome(r2) is None
    assert (p.watched, p.delayed) == (2, 2)
    r1.completable = True
    assert p.check_and_complete("t") == 1
    assert p.check_and_complete("t") == 0
    assert r1.outcome is COMPLETED
    assert r1.callbacks() == ["on_complete"]
    assert outcome(r2) is None
    assert (p.watched, p.delayed) == (1, 1)
    r2.cancel()
    assert_clean(p)


@each_backend(virtual=True)
async def test_kafka_request_expiry_never_before_timeout() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    r1, r2 = Op(0.020, name="r1"), Op(0.200, name="r2")
    p.try_complete_else_watch(r1, ["t"])
    p.try_complete_else_watch(r2, ["t"])
    assert r1.deadline == 0.020
    assert r2.deadline == 0.200
    await anyio.sleep(0.0195)
    assert outcome(r1) is None  # never early
    await anyio.sleep(0.001)
    assert r1.outcome is EXPIRED
    assert r1.completed_at == [0.020]
    assert r1.expired_at == [0.020]
    assert r1.callbacks() == ["on_complete", "on_expiration"]
    assert outcome(r2) is None
    assert (p.watched, p.delayed) == (1, 1)
    await r2
    assert r2.expired_at == [0.200]
    assert now() == 0.200
    assert_clean(p)


@each_backend(virtual=True)
async def test_sub_tick_deadline_rounds_up_to_the_next_tick() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    await anyio.sleep(0.0005)
    op = Op(0.020)
    p.try_complete_else_watch(op, ["t"])
    assert op.deadline == 0.0205
    assert await op is EXPIRED
    assert op.expired_at == [0.021]  # ceil to the 1 ms tick: late by < 1 tick, never early


@each_backend(virtual=True)
async def test_expiry_on_a_coarse_tick_is_exact() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory(tick=0.25, wheel_size=4)
    ops = [Op(t) for t in (0.1, 0.25, 0.3, 1.0, 1.1, 1.9)]
    for op in ops:
        p.try_complete_else_watch(op, ["t"])
    for op in ops:
        await op
    assert [op.expired_at[0] for op in ops] == [0.25, 0.25, 0.5, 1.0, 1.25, 2.0]


@each_backend(virtual=True)
async def test_kafka_purgatory_size_and_delayed_with_immediate_removal() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    r1, r2, r3 = Op(100, name="r1"), Op(100, name="r2"), Op(100, name="r3")
    p.try_complete_else_watch(r1, ["t1"])
    p.try_complete_else_watch(r2, ["t1", "t2"])
    p.try_complete_else_watch(r3, ["t1", "t2", "t3"])
    assert (p.delayed, p.watched, p.statistics().keys) == (3, 6, 3)
    r2.completable = True
    assert p.check_and_complete("t2") == 1
    # Kafka would still count r2's entry under t1 until a purge; we drop it at once.
    assert (p.delayed, p.watched, p.statistics().keys) == (2, 4, 3)
    assert p.check_and_complete("t1") == 0  # r2 is no longer under t1 either
    assert r2.callbacks() == ["on_complete"]


@each_backend(virtual=True)
async def test_kafka_cancel_for_key_returns_its_ops_uncompleted() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    r1, r2, r3 = Op(100, name="r1"), Op(100, name="r2"), Op(100, name="r3")
    p.try_complete_else_watch(r1, ["a", "b"])
    p.try_complete_else_watch(r2, ["b"])
    p.try_complete_else_watch(r3, ["a", "c"])
    assert p.cancel_for_key("a") == [r1, r3]  # watch order
    for op in (r1, r3):
        assert op.outcome is CANCELLED
        assert not op.is_completed
        assert op.callbacks() == []
    # Gone from the other keys' lists and from the timer too.
    assert (p.watched, p.delayed, p.statistics().keys) == (1, 1, 1)
    assert p.cancel_for_key("c") == []
    assert p.cancel_for_key("a") == []
    assert p.cancel_for_key("b") == [r2]
    assert_clean(p)
    assert p.statistics().cancelled == 3


# =====================================================================================
# try_complete_else_watch: check, watch, check again, schedule
# =====================================================================================


@each_backend(virtual=True)
async def test_completed_in_first_check_touches_no_list_and_no_timer() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    seen: list[tuple[int, int]] = []
    op = Op(1.0, completable=True)
    op.on_try = lambda: seen.append((p.watched, p.delayed))
    assert p.try_complete_else_watch(op, ["a", "b"]) is True
    assert op.tries == 1
    assert seen == [(0, 0)]
    assert op.deadline is None
    assert op.outcome is COMPLETED
    assert op.callbacks() == ["on_complete"]
    assert_clean(p)
    assert p.statistics().completed == 1


@each_backend(virtual=True)
async def test_try_complete_runs_once_per_watch() -> None:
    # One check when watched (Kafka 2.7+): an op whose condition would hold at a
    # second check stays watched until a trigger on one of its keys checks it.
    p: ap.Purgatory[Op] = ap.Purgatory()
    seen: list[tuple[int, int]] = []
    op = Op(1.0, complete_on_try=2)
    op.on_try = lambda: seen.append((p.watched, p.delayed))
    assert p.try_complete_else_watch(op, ["a", "b"]) is False
    assert op.tries == 1
    assert seen == [(0, 0)]  # checked before joining any watch list or the timer
    assert (p.watched, p.delayed, p.pending) == (2, 1, 1)
    assert op.deadline is not None
    assert p.check_and_complete("b") == 1
    assert op.tries == 2
    assert op.outcome is COMPLETED
    assert op.callbacks() == ["on_complete"]
    assert_clean(p)


class TriggersItsOwnKey(Op):
    """Its condition becomes true, and its key is triggered, inside its own first check."""

    def __init__(self, purgatory: ap.Purgatory[Op]) -> None:
        super().__init__(1.0)
        self.purgatory = purgatory
        self.missed_trigger: int | None = None

    def try_complete(self) -> bool:
        self.tries += 1
        if self.completable:
            return self.force_complete()
        if self.tries == 1:
            # The only code that can run between the check and the watch is the
            # op's own try_complete: its trigger cannot see the op yet.
            self.completable = True
            self.missed_trigger = self.purgatory.check_and_complete("k")
        return False


@each_backend(virtual=True)
async def test_trigger_from_inside_try_complete_is_seen_by_the_next_trigger() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = TriggersItsOwnKey(p)
    assert p.try_complete_else_watch(op, ["k"]) is False
    assert op.missed_trigger == 0
    assert op.tries == 1
    assert outcome(op) is None
    assert p.check_and_complete("k") == 1
    assert op.tries == 2
    assert op.outcome is COMPLETED
    assert_clean(p)


@each_backend(virtual=True)
async def test_pending_op_is_watched_then_scheduled() -> None:
    await anyio.sleep(0.25)
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(0.5)
    assert p.try_complete_else_watch(op, ["a", "b", "a", "c", "b"]) is False  # duplicates ignored
    assert op.tries == 1
    assert outcome(op) is None
    assert not op.done()
    assert op.deadline == now() + 0.5 == 0.75
    stats = p.statistics()
    assert (stats.watched, stats.delayed, stats.keys, stats.pending) == (3, 1, 3, 1)
    assert len(p.timer) == 1
    op.completable = True
    assert p.check_and_complete("c") == 1
    assert_clean(p)


@each_backend(virtual=True)
async def test_check_and_complete_checks_in_watch_order() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    order: list[str] = []
    ops = [Op(1.0, name=str(i)) for i in range(5)]
    for op in ops:
        p.try_complete_else_watch(op, ["k", op.name])
        op.on_try = lambda op=op: order.append(op.name)
    ops[1].cancel()
    assert p.check_and_complete("k") == 0
    assert order == ["0", "2", "3", "4"]


class EqualToEverything(Op):
    """An op class with its own equality (and so no hash): watch lists must not care."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = None  # type: ignore[assignment]


@each_backend(virtual=True)
async def test_ops_with_their_own_equality_are_kept_apart() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    a, b, c = (EqualToEverything(1.0, name=n) for n in "abc")
    for op in (a, b, c):
        assert p.try_complete_else_watch(op, ["k"]) is False
    assert (p.watched, p.delayed) == (3, 3)
    b.completable = True
    assert p.check_and_complete("k") == 1
    assert outcome(a) is None
    assert b.outcome is COMPLETED
    # Compared by name: these ops' own == would call any two lists equal.
    assert [op.name for op in p.cancel_for_key("k")] == ["a", "c"]
    assert a.outcome is CANCELLED
    assert c.outcome is CANCELLED
    assert_clean(p)


@each_backend(virtual=True)
async def test_keys_may_be_any_hashable_and_any_iterable() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    key_set = {("topic", 0), 7, frozenset({1}), None}
    assert p.try_complete_else_watch(op, (k for k in key_set)) is False
    assert p.watched == 4
    op.completable = True
    assert p.check_and_complete(None) == 1
    assert_clean(p)


# =====================================================================================
# watch(): outcomes and cancellation
# =====================================================================================


@each_backend(virtual=True)
async def test_watch_returns_completed_when_triggered() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    async with anyio.create_task_group() as tg:
        task = start(tg, p.watch, op, ["k"])
        await anyio.sleep(0.1)
        assert not task.done()
        op.completable = True
        assert p.check_and_complete("k") == 1
        assert await task.result() is COMPLETED
    assert now() == 0.1


@each_backend(virtual=True)
async def test_watch_returns_completed_at_once_when_completable() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    assert await p.watch(Op(1.0, completable=True), ["k"]) is COMPLETED
    assert now() == 0


@each_backend(virtual=True)
async def test_watch_returns_expired() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(0.3)
    assert await p.watch(op, ["k"]) is EXPIRED
    assert now() == 0.3
    assert op.callbacks() == ["on_complete", "on_expiration"]
    assert_clean(p)


@each_backend(virtual=True)
@pytest.mark.parametrize("how", ["op.cancel", "cancel_for_key", "close"])
async def test_watch_returns_cancelled_when_someone_else_cancels(how: str) -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    async with anyio.create_task_group() as tg:
        task = start(tg, p.watch, op, ["k"])
        await anyio.sleep(0.1)
        if how == "op.cancel":
            assert op.cancel() is True
        elif how == "cancel_for_key":
            assert p.cancel_for_key("k") == [op]
        else:
            p.close()
        assert await task.result() is CANCELLED
    assert op.callbacks() == []
    assert_clean(p)


@each_backend(virtual=True)
async def test_cancelling_the_watching_task_cancels_the_op() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    async with anyio.create_task_group() as tg:
        observer = start(tg, _observe, op)
        task = start(tg, p.watch, op, ["a", "b"])
        await anyio.sleep(0.1)
        assert (p.watched, p.delayed) == (2, 1)
        task.cancel()  # asyncio task cancellation on asyncio, a cancel scope on trio
        await task.wait()
        assert task.cancelled  # the cancellation came out of watch()
        assert op.outcome is CANCELLED
        assert op.callbacks() == []
        assert_clean(p)
        assert p.statistics().cancelled == 1
        assert await observer.result() is CANCELLED  # observers are released with the outcome
        await anyio.sleep(2)  # the old deadline passes: nothing fires
    assert op.callbacks() == []


@pytest.mark.virtual_time  # asyncio only: a cancel thrown into a task already woken
async def test_task_cancelled_after_the_op_finished_keeps_the_outcome() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    task = asyncio.create_task(p.watch(op, ["k"]))
    await settle()
    assert op.force_complete() is True  # wakes the task...
    task.cancel()  # ...which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await task
    assert op.outcome is COMPLETED
    assert op.callbacks() == ["on_complete"]
    assert p.statistics().cancelled == 0


@each_backend(virtual=True)
async def test_cancel_scope_cancelled_after_the_op_finished_keeps_the_outcome() -> None:
    # The counterpart of the test above on every backend. A cancel scope (trio's,
    # or anyio's on asyncio) delivers its cancellation at the task's next
    # checkpoint, and a task whose waiter is already set has none left in watch():
    # the op keeps its outcome and the task gets it.
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    async with anyio.create_task_group() as tg:
        task = start(tg, p.watch, op, ["k"])
        await settle()
        assert op.force_complete() is True  # wakes the task...
        task.cancel()  # ...whose scope is cancelled before it runs again
        assert await task.result() is COMPLETED
    assert not task.cancelled
    assert op.outcome is COMPLETED
    assert op.callbacks() == ["on_complete"]
    assert p.statistics().cancelled == 0


@pytest.mark.virtual_time  # asyncio only: asyncio.timeout; on every backend below
async def test_watch_under_asyncio_timeout_cancels_the_op() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await p.watch(op, ["k"])
    assert op.outcome is CANCELLED
    assert asyncio.get_running_loop().time() == 0.2
    assert_clean(p)


@asynccontextmanager
async def _fail_after(seconds: float) -> AsyncIterator[None]:
    with anyio.fail_after(seconds):
        yield


@each_backend(virtual=True)
@pytest.mark.parametrize(
    "deadline", [_fail_after, ap.timeout], ids=["anyio.fail_after", "ap.timeout"]
)
async def test_watch_under_a_deadline_cancels_the_op(
    deadline: Callable[[float], contextlib.AbstractAsyncContextManager[object]],
) -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    with pytest.raises(TimeoutError):
        async with deadline(0.2):
            await p.watch(op, ["k"])
    assert op.outcome is CANCELLED
    assert now() == 0.2
    assert_clean(p)


async def _observe(op: ap.DelayedOperation) -> ap.Outcome:
    return await op


@each_backend(virtual=True)
async def test_await_op_is_observing_only() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(0.5)
    async with anyio.create_task_group() as tg:
        watcher = start(tg, p.watch, op, ["k"])
        observers = [start(tg, _observe, op) for _ in range(3)]
        await anyio.sleep(0.1)
        observers[0].cancel()
        await observers[0].wait()
        assert observers[0].cancelled
        assert outcome(op) is None
        assert not watcher.done()
        assert (p.watched, p.delayed) == (1, 1)
        assert await watcher.result() is EXPIRED
        assert [await o.result() for o in observers[1:]] == [EXPIRED, EXPIRED]


# =====================================================================================
# Expiry and callbacks
# =====================================================================================


@each_backend(virtual=True)
async def test_zero_timeout_expires_on_a_later_iteration_never_synchronously() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(0)
    assert p.try_complete_else_watch(op, ["k"]) is False
    assert outcome(op) is None
    assert op.callbacks() == []
    assert (p.watched, p.delayed) == (1, 1)
    assert op.deadline == 0
    await settle()
    assert op.outcome is EXPIRED
    assert op.expired_at == [0.0]
    assert now() == 0.0
    assert_clean(p)


@each_backend(virtual=True)
async def test_zero_timeout_watch_returns_expired() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    assert await p.watch(Op(0), ["k"]) is EXPIRED
    assert now() == 0


@each_backend(virtual=True)
async def test_zero_timeout_can_still_be_triggered_before_it_expires() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(0)
    p.try_complete_else_watch(op, ["k"])
    op.completable = True
    assert p.check_and_complete("k") == 1
    await settle()
    assert op.outcome is COMPLETED
    assert op.callbacks() == ["on_complete"]


@each_backend(virtual=True)
async def test_callbacks_per_outcome() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    completed, expired, cancelled = Op(0.1), Op(0.1), Op(0.1)
    for op in (completed, expired, cancelled):
        p.try_complete_else_watch(op, ["k"])
    assert completed.force_complete() is True
    assert cancelled.cancel() is True
    await anyio.sleep(1)
    assert completed.callbacks() == ["on_complete"]
    assert expired.callbacks() == ["on_complete", "on_expiration"]
    assert cancelled.callbacks() == []
    assert [completed.is_completed, expired.is_completed, cancelled.is_completed] == [
        True,
        True,
        False,
    ]
    assert all(op.done() for op in (completed, expired, cancelled))
    for op in (completed, expired, cancelled):
        assert op.force_complete() is False
        assert op.cancel() is False
    assert expired.callbacks() == ["on_complete", "on_expiration"]
    stats = p.statistics()
    assert (stats.completed, stats.expired, stats.cancelled, stats.failed) == (1, 1, 1, 0)


@each_backend(virtual=True)
async def test_deadline_stays_after_finish() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(0.5)
    p.try_complete_else_watch(op, ["k"])
    op.force_complete()
    assert op.deadline == 0.5


# =====================================================================================
# Exactly once under races
# =====================================================================================


def _record_force_complete(results: dict[str, bool], op: Op) -> None:
    results[op.name] = op.force_complete()


@each_backend(virtual=True)
async def test_complete_and_expire_in_the_same_tick() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    ops = [Op(0.05, name=str(i)) for i in range(10)]
    results: dict[str, bool] = {}
    for op in ops:
        # A callback at the same instant as the purgatory's bucket, from a timer of
        # its own per op (as a loop.call_at per op would be, on any backend): on
        # asyncio call_at handles of one loop iteration, on trio driver tasks woken
        # in one batch (in a shuffled order). Either may win (here each does, for
        # some of the ops).
        ap.Timer().call_at(0.05, _record_force_complete, results, op)
        p.try_complete_else_watch(op, ["k"])
    await anyio.sleep(0.1)
    for op in ops:
        if op.outcome is COMPLETED:
            assert results[op.name] is True
            assert op.callbacks() == ["on_complete"]
        else:
            assert op.outcome is EXPIRED
            assert results[op.name] is False
            assert op.callbacks() == ["on_complete", "on_expiration"]
    stats = p.statistics()
    assert stats.completed + stats.expired == 10
    assert_clean(p)


@each_backend(virtual=True)
async def test_expiry_callback_finishing_other_ops_of_the_same_tick() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    a, b, c, d = (Op(0.05, name=n) for n in "abcd")
    for op in (a, b, c, d):
        p.try_complete_else_watch(op, ["k"])
    # Whichever of a/b expires first finishes the other (complete or cancel).
    a.after_expire = lambda: b.force_complete()
    b.after_expire = lambda: a.force_complete()
    c.after_complete = lambda: d.cancel()
    d.after_complete = lambda: c.cancel()
    with loop_errors() as errors:
        await anyio.sleep(0.1)
    assert {a.outcome, b.outcome} == {EXPIRED, COMPLETED}
    assert {c.outcome, d.outcome} == {EXPIRED, CANCELLED}
    for op in (a, b, c, d):
        assert op.calls.count("on_complete") == (0 if op.outcome is CANCELLED else 1)
        assert op.calls.count("on_expiration") == (1 if op.outcome is EXPIRED else 0)
    assert_clean(p)
    assert errors == []


@each_backend(virtual=True)
async def test_cancel_inside_on_complete_of_another_op() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    a, b = Op(1.0, completable=True, name="a"), Op(1.0, completable=True, name="b")
    a.completable = b.completable = False
    p.try_complete_else_watch(a, ["k"])
    p.try_complete_else_watch(b, ["k"])
    a.completable = b.completable = True
    a.after_complete = lambda: b.cancel()
    assert p.check_and_complete("k") == 1
    assert a.outcome is COMPLETED
    assert b.outcome is CANCELLED
    assert b.callbacks() == []
    assert_clean(p)


# =====================================================================================
# Containment of callback failures
# =====================================================================================


@each_backend(virtual=True)
async def test_try_complete_raising_while_watching() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0, name="x")
    failing_try = 1  # the only check
    op.on_try = lambda: _raise_if(op.tries == failing_try)
    with capture_logs() as logs:
        with pytest.raises(Boom):
            p.try_complete_else_watch(op, ["a", "b"])
        assert op.outcome is FAILED
        assert op.done()
        assert not op.is_completed
        assert op.callbacks() == []
        assert op.tries == failing_try
        assert_clean(p)
        assert p.statistics().failed == 1
        with pytest.raises(Boom):
            await op
        assert op.force_complete() is False
        assert op.cancel() is False
    # Raised to the caller: received, so not also logged (issue 30).
    assert failures(logs) == []


def _raise_if(condition: bool) -> None:
    if condition:
        raise Boom("try_complete")


@each_backend(virtual=True)
async def test_try_complete_raising_inside_watch_propagates() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0, raise_in=frozenset({"try_complete"}))
    with capture_logs() as logs:
        with pytest.raises(Boom):
            await p.watch(op, ["k"])
        assert op.outcome is FAILED
        del op
        await collect_garbage()
    assert failures(logs) == []  # raised to the caller of watch(): not also logged
    assert_clean(p)


@each_backend(virtual=True)
async def test_try_complete_raising_after_force_complete_keeps_completed() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0, completable=True, raise_in=frozenset({"try_complete"}))
    with capture_logs() as logs:
        with pytest.raises(Boom):
            p.try_complete_else_watch(op, ["k"])
        assert op.outcome is COMPLETED
        assert op.is_completed
        assert op.callbacks() == ["on_complete"]
        stats = p.statistics()
        assert (stats.completed, stats.failed) == (1, 0)
        with pytest.raises(Boom):
            await op
        del op
        await collect_garbage()
    assert failures(logs) == []  # raised to the caller
    assert_clean(p)


@each_backend(virtual=True)
async def test_try_complete_raising_in_check_and_complete_is_contained() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    before, bad, late_bad, after = (Op(1.0, name=n) for n in ("before", "bad", "late", "after"))
    for op in (before, bad, late_bad, after):
        p.try_complete_else_watch(op, ["k", op.name])
    with loop_errors() as errors, capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            watcher = start(tg, _observe, bad)
            await settle()
            before.completable = after.completable = late_bad.completable = True
            bad.raise_in = late_bad.raise_in = frozenset({"try_complete"})
            # before, late_bad (completed, then raised), after
            assert p.check_and_complete("k") == 3
            assert bad.outcome is FAILED
            assert bad.callbacks() == []
            assert late_bad.outcome is COMPLETED
            assert late_bad.callbacks() == ["on_complete"]
            assert before.outcome is COMPLETED
            assert after.outcome is COMPLETED
            with pytest.raises(Boom):
                await watcher.result()
        assert_clean(p)
        stats = p.statistics()
        assert (stats.completed, stats.failed) == (3, 1)
        # bad's failure reached its watcher; late_bad's reached nobody: logged
        # once late_bad is gone.
        late_repr = repr(late_bad)
        assert failures(logs) == []
        # (bad's traceback holds the trigger's frame, which on the pure-Python
        # core holds the operations it checked: let go of it too.)
        del late_bad, op, bad, watcher
        await collect_garbage()
    assert [e["op"] for e in failures(logs)] == [late_repr]
    assert errors == []


@each_backend(virtual=True)
async def test_on_complete_raising_during_expiry_skips_on_expiration() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    bad = Op(0.1, raise_in=frozenset({"on_complete"}), name="bad")
    same_tick, later = Op(0.1, name="same"), Op(0.3, name="later")
    for op in (bad, same_tick, later):
        p.try_complete_else_watch(op, ["k"])
    with loop_errors() as errors, capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            watcher = start(tg, _observe, bad)
            await anyio.sleep(0.2)
            assert bad.outcome is EXPIRED
            assert bad.callbacks() == ["on_complete"]
            assert same_tick.callbacks() == ["on_complete", "on_expiration"]
            with pytest.raises(Boom):
                await watcher.result()
            assert await later is EXPIRED  # the timer keeps working
        del bad
        await collect_garbage()
    assert failures(logs) == []  # its watcher received it
    assert p.statistics().expired == 3
    assert errors == []
    assert_clean(p)


@each_backend(virtual=True)
async def test_on_expiration_raising_keeps_expired() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(0.1, raise_in=frozenset({"on_expiration"}))
    with loop_errors() as errors:
        with capture_logs() as logs:
            with pytest.raises(Boom):
                await p.watch(op, ["k"])
            assert op.outcome is EXPIRED
            assert op.callbacks() == ["on_complete", "on_expiration"]
            del op
            await collect_garbage()
        assert failures(logs) == []  # watch() raised it
    assert errors == []
    assert await p.watch(Op(0.1), ["k"]) is EXPIRED
    assert_clean(p)


@each_backend(virtual=True)
async def test_on_complete_raising_in_trigger_keeps_completed() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0, raise_in=frozenset({"on_complete"}))
    other = Op(1.0)
    p.try_complete_else_watch(op, ["k"])
    p.try_complete_else_watch(other, ["k"])
    op.completable = other.completable = True
    with capture_logs() as logs:
        assert p.check_and_complete("k") == 2
        assert op.outcome is COMPLETED
        assert other.outcome is COMPLETED
        assert op.force_complete() is False
        assert failures(logs) == []  # not yet: someone may still ask op for it
        op_repr = repr(op)
        del op
        await collect_garbage()
    # Nobody received it: logged once the operation is gone.
    [entry] = failures(logs)
    assert entry["callback"] == "on_complete"
    assert entry["op"] == op_repr
    assert isinstance(entry["exc_info"], Boom)


# =====================================================================================
# Re-entrancy
# =====================================================================================


@each_backend(virtual=True)
async def test_callbacks_watch_complete_and_cancel_on_the_key_being_checked() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    a, b, c, d = (Op(1.0, completable=False, name=n) for n in "abcd")
    for op in (a, b, c, d):
        p.try_complete_else_watch(op, ["k"])
    e = Op(1.0, name="e")
    inner: list[int] = []

    def a_done() -> None:
        assert p.try_complete_else_watch(e, ["k"]) is False  # joins the list being checked
        assert c.force_complete() is True
        assert d.cancel() is True
        inner.append(p.check_and_complete("k"))  # nested trigger on the same key

    a.after_complete = a_done
    a.completable = b.completable = c.completable = d.completable = True
    assert p.check_and_complete("k") == 1  # a; b was completed by the nested call
    assert inner == [1]  # b (c, d already gone; e not completable)
    assert [op.outcome for op in (a, b, c, d, e)] == [
        COMPLETED,
        COMPLETED,
        COMPLETED,
        CANCELLED,
        None,
    ]
    for op in (a, b, c):
        assert op.callbacks() == ["on_complete"]
    assert d.callbacks() == []
    assert e.tries == 2  # one check on watch, one from the nested trigger
    assert (p.watched, p.delayed, p.pending) == (1, 1, 1)
    e.completable = True
    assert p.check_and_complete("k") == 1
    assert_clean(p)


@each_backend(virtual=True)
async def test_callback_making_a_later_op_completable_is_seen_by_the_same_trigger() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    a, b = Op(1.0, name="a"), Op(1.0, name="b")
    p.try_complete_else_watch(a, ["k"])
    p.try_complete_else_watch(b, ["k"])
    a.after_complete = lambda: setattr(b, "completable", True)
    a.completable = True
    assert p.check_and_complete("k") == 2
    assert_clean(p)


@each_backend(virtual=True)
async def test_op_watched_during_a_trigger_is_not_checked_by_it() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    a = Op(1.0, name="a")
    p.try_complete_else_watch(a, ["k"])
    late = Op(1.0, name="late")
    a.after_complete = lambda: p.try_complete_else_watch(late, ["k"])
    a.completable = True
    assert p.check_and_complete("k") == 1
    assert late.tries == 1
    assert outcome(late) is None
    assert p.watched == 1


@each_backend(virtual=True)
async def test_callbacks_touching_other_ops_during_close() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    ops = [Op(1.0, name=str(i)) for i in range(6)]
    for op in ops:
        p.try_complete_else_watch(op, ["k", op.name])
    ops[0].after_expire = lambda: ops[1].force_complete()
    ops[2].after_complete = lambda: ops[3].cancel()
    # Watching from a callback during close fails (closed): contained and logged.
    ops[4].after_complete = lambda: p.try_complete_else_watch(Op(1.0), ["k"])
    with capture_logs() as logs:
        p.close(expire_pending=True)
        assert all(op.done() for op in ops)
        for op in ops:
            assert op.calls.count("on_complete") == (0 if op.outcome is CANCELLED else 1)
        ops.clear()
        del op
        await collect_garbage()
    assert failures(logs)
    assert all(e["error"].startswith("PurgatoryClosedError") for e in failures(logs))
    assert_clean(p)


# =====================================================================================
# Sharing a Timer
# =====================================================================================


@each_backend(virtual=True)
async def test_purgatories_share_one_timer() -> None:
    timer = ap.Timer(tick=0.01, wheel_size=8)
    p1: ap.Purgatory[Op] = ap.Purgatory("one", timer=timer)
    p2: ap.Purgatory[Op] = ap.Purgatory("two", timer=timer)
    assert p1.timer is timer
    assert p2.timer is timer
    a, b, c = Op(0.05), Op(0.12), Op(0.5)
    p1.try_complete_else_watch(a, ["k"])
    p2.try_complete_else_watch(b, ["k"])
    p2.try_complete_else_watch(c, ["k"])
    assert len(timer) == 3
    assert (p1.delayed, p2.delayed) == (1, 2)
    assert p1.check_and_complete("k") == 0
    assert await a is EXPIRED
    assert a.expired_at == [0.05]
    assert await b is EXPIRED
    assert b.expired_at == [0.12]
    p1.close()
    assert len(timer) == 1  # a shared timer is not closed by one of its purgatories
    assert await c is EXPIRED
    assert c.expired_at == [0.5]
    assert len(timer) == 0
    assert (p1.statistics().expired, p2.statistics().expired) == (1, 2)
    p2.close()
    timer.close()


@each_backend(virtual=True)
async def test_closing_a_shared_timer_cancels_its_ops() -> None:
    timer = ap.Timer()
    p: ap.Purgatory[Op] = ap.Purgatory(timer=timer)
    op = Op(1.0)
    async with anyio.create_task_group() as tg:
        task = start(tg, p.watch, op, ["k"])
        await settle()
        timer.close()
        assert await task.result() is CANCELLED
    assert_clean(p)
    before = p.statistics()
    with pytest.raises(ap.TimerClosedError):
        p.try_complete_else_watch(Op(1.0), ["k"])
    assert p.statistics() == before


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"tick": 0.01}, "tick=0.01"),
        ({"wheel_size": 8}, "wheel_size=8"),
        # The defaults' values are "given" too: a sentinel, not a comparison.
        ({"tick": 0.001}, "tick=0.001"),
        ({"wheel_size": 20}, "wheel_size=20"),
        ({"tick": 0.001, "wheel_size": 20}, "tick=0.001 and wheel_size=20"),
        # Before the value is checked: the combination is the error.
        ({"tick": -1}, "tick=-1"),
    ],
)
def test_timer_with_tick_or_wheel_size_is_a_type_error_naming_both(
    kwargs: dict[str, float], named: str
) -> None:
    timer = ap.Timer()
    with pytest.raises(TypeError) as info:
        ap.Purgatory(timer=timer, **kwargs)  # type: ignore[arg-type]
    assert "timer=" in str(info.value)
    assert named in str(info.value)
    p: ap.Purgatory[Op] = ap.Purgatory(timer=timer)
    assert p.timer is timer


def test_tick_and_wheel_size_without_a_timer_reach_its_timer() -> None:
    assert ap.Purgatory().timer.tick == 0.001
    assert ap.Purgatory().timer.wheel_size == 20
    p: ap.Purgatory[Op] = ap.Purgatory(tick=0.01, wheel_size=8)
    assert (p.timer.tick, p.timer.wheel_size) == (0.01, 8)
    with pytest.raises(ValueError, match="tick"):
        ap.Purgatory(tick=0)
    with pytest.raises(ValueError, match="wheel_size"):
        ap.Purgatory(wheel_size=1)


# =====================================================================================
# Backpressure
# =====================================================================================


@each_backend(virtual=True)
async def test_max_pending_raises_full_and_changes_nothing() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory(max_pending=2)
    assert p.max_pending == 2
    a, b = Op(1.0), Op(1.0)
    p.try_complete_else_watch(a, ["k"])
    p.try_complete_else_watch(b, ["k"])
    before = p.statistics()
    extra = Op(1.0, completable=True)
    with pytest.raises(ap.PurgatoryFullError, match="max_pending"):
        p.try_complete_else_watch(extra, ["k", "x"])
    with pytest.raises(ap.PurgatoryFullError):
        await p.watch(extra, ["k"])
    assert p.statistics() == before
    assert extra.tries == 0
    assert outcome(extra) is None
    assert extra.deadline is None
    # An op completed at once never counts as pending, and finishing frees a slot.
    a.force_complete()
    assert p.try_complete_else_watch(extra, ["k", "x"]) is True
    c = Op(1.0)
    assert p.try_complete_else_watch(c, ["k"]) is False
    assert p.pending == 2


# =====================================================================================
# close() and async with
# =====================================================================================


@each_backend(virtual=True)
async def test_close_cancels_pending_and_is_idempotent() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    ops = [Op(1.0) for _ in range(3)]
    async with anyio.create_task_group() as tg:
        tasks = [start(tg, p.watch, op, ["k", i]) for i, op in enumerate(ops)]
        await settle()
        done = Op(1.0, completable=True)
        p.try_complete_else_watch(done, ["k"])
        with capture_logs() as logs:
            p.close()
            p.close()
    assert p.closed
    assert [await task.result() for task in tasks] == [CANCELLED] * 3
    assert all(op.callbacks() == [] for op in ops)
    assert done.outcome is COMPLETED
    assert_clean(p)
    assert [e["event"] for e in logs].count("aiopurgatory.purgatory_closed") == 1
    stats = p.statistics()
    assert (stats.completed, stats.cancelled) == (1, 3)
    assert p.check_and_complete("k") == 0
    assert p.cancel_for_key("k") == []
    with pytest.raises(ap.PurgatoryClosedError):
        p.try_complete_else_watch(Op(1.0), ["k"])
    with pytest.raises(ap.PurgatoryClosedError):
        await p.watch(Op(1.0), ["k"])
    assert p.statistics() == stats


@each_backend(virtual=True)
async def test_close_expire_pending_expires_now() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    ops = [Op(5.0) for _ in range(3)]
    async with anyio.create_task_group() as tg:
        tasks = [start(tg, p.watch, op, ["k"]) for op in ops]
        await anyio.sleep(0.5)
        p.close(expire_pending=True)
    assert [await task.result() for task in tasks] == [EXPIRED] * 3
    assert all(op.completed_at == op.expired_at == [0.5] for op in ops)
    assert all(op.callbacks() == ["on_complete", "on_expiration"] for op in ops)
    assert now() == 0.5
    assert_clean(p)
    assert p.statistics().expired == 3


@each_backend(virtual=True)
async def test_close_closes_only_an_owned_timer() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    p.try_complete_else_watch(Op(1.0), ["k"])
    p.close()
    with pytest.raises(ap.TimerClosedError):
        p.timer.call_later(1, lambda: None)


@each_backend(virtual=True)
async def test_async_with_closes() -> None:
    async with anyio.create_task_group() as tg:
        async with ap.Purgatory[Op]("ctx") as p:
            assert isinstance(p, ap.Purgatory)
            op = Op(1.0)
            task = start(tg, p.watch, op, ["k"])
            await settle()
        assert p.closed
        assert await task.result() is CANCELLED


@each_backend
async def test_close_on_an_unused_purgatory() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    p.close()
    assert p.closed
    assert_clean(p)


# =====================================================================================
# Bad input: clear errors, no state change
# =====================================================================================


class Forgetful(ap.DelayedOperation):
    def __init__(self) -> None:  # forgot super().__init__
        self.something = 1


@each_backend(virtual=True)
@pytest.mark.parametrize(
    ("keys", "error", "match"),
    [
        ([], ValueError, "keys"),
        ((), TypeError, "tuple"),
        (("orders", 0), TypeError, r"\[\('orders', 0\)\]"),
        ({}, ValueError, "keys"),
        ({"k": "1"}, TypeError, "threshold of key 'k'"),
        ({"k": True}, TypeError, "threshold of key 'k'"),
        ({"k": None}, TypeError, "threshold of key 'k'"),
        ({"k": float("nan")}, ValueError, "threshold of key 'k'"),
        (iter([]), ValueError, "keys"),
        ("abc", TypeError, "keys"),
        (b"abc", TypeError, "keys"),
        (bytearray(b"abc"), TypeError, "keys"),
        (5, TypeError, "keys"),
        (None, TypeError, "keys"),
        ([["unhashable"]], TypeError, "keys"),
        (["ok", {"un": "hashable"}], TypeError, "keys"),
    ],
)
async def test_bad_keys_change_nothing(keys: Any, error: type, match: str) -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    p.try_complete_else_watch(Op(1.0), ["existing", "ok"])
    before = p.statistics()
    op = Op(1.0)
    with pytest.raises(error, match=match):
        p.try_complete_else_watch(op, keys)
    with pytest.raises(error, match=match):
        await p.watch(op, keys)
    assert p.statistics() == before
    assert op.tries == 0
    assert outcome(op) is None
    assert p.try_complete_else_watch(op, ["k"]) is False  # the op is still usable


@each_backend(virtual=True)
async def test_bad_ops_change_nothing() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    other: ap.Purgatory[Op] = ap.Purgatory("other")
    watched, foreign, finished = Op(1.0), Op(1.0), Op(1.0)
    p.try_complete_else_watch(watched, ["k"])
    other.try_complete_else_watch(foreign, ["k"])
    finished.cancel()
    before, other_before = p.statistics(), other.statistics()
    for op in (watched, foreign, finished):
        with pytest.raises(ap.OperationStateError):
            p.try_complete_else_watch(op, ["k", "new"])
        with pytest.raises(ap.OperationStateError):
            await p.watch(op, ["k"])
    with pytest.raises(TypeError, match="op"):
        p.try_complete_else_watch(object(), ["k"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="__init__"):
        p.try_complete_else_watch(Forgetful(), ["k"])  # type: ignore[arg-type]
    assert p.statistics() == before
    assert other.statistics() == other_before
    assert outcome(watched) is None
    assert outcome(foreign) is None
    # A finished op owned by this purgatory cannot come back either.
    watched.force_complete()
    with pytest.raises(ap.OperationStateError):
        p.try_complete_else_watch(watched, ["k"])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"name": 3}, TypeError, "name"),
        ({"max_pending": 0}, ValueError, "max_pending"),
        ({"max_pending": True}, TypeError, "max_pending"),
        ({"max_pending": 1.5}, TypeError, "max_pending"),
        ({"timer": "timer"}, TypeError, "timer"),
        ({"tick": 0}, ValueError, "tick"),
        ({"tick": -1.0}, ValueError, "tick"),
        ({"tick": float("nan")}, ValueError, "tick"),
        ({"tick": True}, TypeError, "tick"),
        ({"wheel_size": 1}, ValueError, "wheel_size"),
        ({"wheel_size": 2.0}, TypeError, "wheel_size"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ap.Purgatory(**kwargs)


@each_backend(virtual=True)
async def test_unhashable_trigger_key_raises_type_error() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    p.try_complete_else_watch(Op(1.0), ["k"])
    before = p.statistics()
    with pytest.raises(TypeError):
        p.check_and_complete(["k"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        p.cancel_for_key(["k"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        p.check_and_complete_threadsafe(["k"])  # type: ignore[arg-type]
    assert p.statistics() == before


@each_backend(virtual=True)
async def test_unhashable_trigger_key_message_names_the_argument() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    before = p.statistics()
    with pytest.raises(TypeError, match="key must be hashable"):
        p.check_and_complete(["k"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be hashable"):
        p.cancel_for_key(["k"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be hashable"):
        p.check_and_complete_threadsafe(["k"])  # type: ignore[arg-type]
    assert p.statistics() == before


@each_backend(virtual=True)
async def test_unhashable_tuple_key_message_names_the_argument() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    before = p.statistics()
    with pytest.raises(TypeError, match="keys: unhashable key"):
        p.try_complete_else_watch(Op(1.0), [(1, [2])])
    assert p.statistics() == before


@pytest.mark.parametrize("backend", [*REAL, *VIRTUAL])
def test_first_use_outside_a_loop_raises_and_changes_nothing(backend: str) -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    before = p.statistics()
    with pytest.raises(RuntimeError, match="running event loop"):
        p.try_complete_else_watch(op, ["k"])
    assert p.statistics() == before
    assert op.tries == 0
    assert outcome(op) is None

    async def use() -> bool:
        return p.try_complete_else_watch(op, ["k"])

    assert run_on(backend, use) is False  # still usable from a loop


def test_watch_on_a_different_loop_raises_runtime_error() -> None:
    # Two asyncio loops, the first still open; trio's counterpart below.
    p: ap.Purgatory[Op] = ap.Purgatory()
    first = Op(1.0)

    async def bind() -> None:
        p.try_complete_else_watch(first, ["k"])

    async def watch_elsewhere() -> None:
        with pytest.raises(RuntimeError, match="another event loop"):
            await p.watch(Op(1.0), ["k"])

    with asyncio.Runner(loop_factory=simulation.new_event_loop) as runner:
        runner.run(bind())
        before = p.statistics()
        with asyncio.Runner(loop_factory=simulation.new_event_loop) as other:
            other.run(watch_elsewhere())
        assert p.statistics() == before
        first.cancel()


def test_watch_in_another_trio_run_raises_runtime_error() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    first = Op(1.0)

    async def bind() -> None:
        p.try_complete_else_watch(first, ["k"])

    async def watch_elsewhere() -> None:
        with pytest.raises(RuntimeError, match="another event loop"):
            await p.watch(Op(1.0), ["k"])

    simulation.run_trio(bind)
    before = p.statistics()
    simulation.run_trio(watch_elsewhere)  # a later run is another run
    assert p.statistics() == before
    first.cancel()
    assert_clean(p)


@pytest.mark.parametrize("backend", VIRTUAL)
def test_timer_bound_to_another_loop_raises_runtime_error(backend: str) -> None:
    # On trio: a timer bound to one trio run, used by a purgatory in a later run.
    timer = ap.Timer()

    async def bind_timer() -> None:
        timer.call_later(0, lambda: None)

    async def use() -> None:
        p: ap.Purgatory[Op] = ap.Purgatory(timer=timer)
        with pytest.raises(RuntimeError):
            p.try_complete_else_watch(Op(1.0), ["k"])
        assert_clean(p)

    run_on(backend, bind_timer)
    run_on(backend, use)


# =====================================================================================
# statistics()
# =====================================================================================


@each_backend(virtual=True)
async def test_statistics_fields() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory("stats")
    stats = p.statistics()
    assert isinstance(stats, ap.PurgatoryStatistics)
    assert dataclasses.is_dataclass(stats)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.watched = 5  # type: ignore[misc]
    names = {f.name for f in dataclasses.fields(stats)}
    assert {"name", "watched", "keys", "pending", "completed", "expired", "cancelled"} <= names
    # Kafka's NumDelayedOperations is an alias of pending, not a second field.
    assert "delayed" not in names
    assert stats.delayed == stats.pending == 0
    assert stats.name == "stats"
    ops = [Op(0.1), Op(0.1), Op(0.1), Op(1.0), Op(1.0, completable=True)]
    p.try_complete_else_watch(ops[0], ["a", "b"])
    p.try_complete_else_watch(ops[1], ["b", "c"])
    p.try_complete_else_watch(ops[2], ["c"])
    p.try_complete_else_watch(ops[3], ["d"])
    p.try_complete_else_watch(ops[4], ["e"])
    stats = p.statistics()
    assert (stats.watched, stats.delayed, stats.keys, stats.pending) == (6, 4, 4, 4)
    assert (stats.completed, stats.expired, stats.cancelled, stats.failed) == (1, 0, 0, 0)
    ops[0].force_complete()
    ops[3].cancel()
    await anyio.sleep(0.2)
    stats = p.statistics()
    assert (stats.watched, stats.delayed, stats.keys, stats.pending) == (0, 0, 0, 0)
    assert (stats.completed, stats.expired, stats.cancelled, stats.failed) == (2, 2, 1, 0)
    assert (p.watched, p.delayed, p.pending) == (0, 0, 0)


# =====================================================================================
# check_and_complete_threadsafe (single-thread behaviour; races in test_purgatory_threads)
# =====================================================================================


@each_backend
async def test_threadsafe_trigger_from_another_thread() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(60.0)
    async with anyio.create_task_group() as tg:
        task = start(tg, p.watch, op, ["k"])
        await settle()
        op.completable = True
        future = await anyio.to_thread.run_sync(p.check_and_complete_threadsafe, "k")
        assert isinstance(future, concurrent.futures.Future)
        assert await anyio.to_thread.run_sync(future.result, 10) == 1
        assert await task.result() is COMPLETED


def test_threadsafe_trigger_on_an_unbound_purgatory_is_zero() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    results: list[int] = []
    thread = threading.Thread(
        target=lambda: results.append(p.check_and_complete_threadsafe("k").result(1))
    )
    thread.start()
    thread.join()
    assert results == [0]


# =====================================================================================
# Real loops (asyncio, uvloop and trio): tolerances only, never early by the backend's clock
# =====================================================================================


@pytest.mark.realtime
@each_backend
async def test_real_loop_expiry_is_never_early() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    ops = [Op(0.001 * (i % 7) + 0.0003 * i) for i in range(40)]
    with anyio.fail_after(10):
        for op in ops:
            p.try_complete_else_watch(op, ["k", id(op) % 5])
            await anyio.sleep(0.0002)
        for op in ops:
            await op
    for op in ops:
        assert op.outcome is EXPIRED
        assert op.deadline is not None
        assert op.expired_at[0] >= op.deadline, (op.expired_at[0], op.deadline)
    assert now() >= max(op.deadline or 0 for op in ops)
    assert_clean(p)


@pytest.mark.realtime
@each_backend
async def test_real_loop_watch_trigger_and_cancel() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    completed, expired, cancelled = Op(5.0), Op(0.01), Op(5.0)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tasks = [start(tg, p.watch, op, ["k"]) for op in (completed, expired, cancelled)]
            # Until every task has watched (a fixed short sleep was not enough
            # for trio on a loaded machine: the trigger found no op to complete).
            while p.pending + (expired.outcome is not None) < 3:  # noqa: ASYNC110 (no event to await)
                await anyio.sleep(0.001)
            completed.completable = True
            assert p.check_and_complete("k") == 1
            tasks[2].cancel()
    assert await tasks[0].result() is COMPLETED
    assert await tasks[1].result() is EXPIRED
    assert tasks[2].cancelled
    assert cancelled.outcome is CANCELLED
    assert_clean(p)
    p.close()


@pytest.mark.realtime
@each_backend
async def test_real_loop_zero_timeout_is_not_synchronous() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(0)
    p.try_complete_else_watch(op, ["k"])
    assert outcome(op) is None
    with anyio.fail_after(10):
        assert await op is EXPIRED


# =====================================================================================
# Regressions: core bugs found by these tests (strict xfails until fixed)
# =====================================================================================


@each_backend(virtual=True)
@pytest.mark.parametrize("seconds", [2.001, 2.005, 16.002, 257.234])
async def test_expiry_on_a_tick_whose_float_product_rounds_down(seconds: float) -> None:
    # 2001 * 0.001 / 0.001 == 2000.9999999999998: a driver that rounded the clock
    # down with floor() alone never saw such a bucket as due and re-armed for the
    # same instant forever (a hang on virtual time, a spin on real loops).
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(seconds)
    p.try_complete_else_watch(op, ["k"])
    try:
        await anyio.sleep(seconds)
        await settle()  # if the driver spins, the clock cannot move: give it turns
        assert op.outcome is EXPIRED
        assert op.expired_at == [seconds]
    finally:
        p.timer.close()  # stops a spinning driver, so the loop can shut down
