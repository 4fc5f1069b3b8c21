"""What the purgatory's tests share: a test operation, outcomes, and backend-neutral tasks.

The helpers of tests/core/test_purgatory*.py and test_watch.py: :class:`Op` records
its calls and completes on demand; :func:`start` runs a call in a task of an anyio task group
(asyncio or trio); :func:`loop_errors` collects what escapes to the backend's last resort.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar, cast
from unittest import mock

import anyio
import anyio.abc
import anyio.to_thread
import trio

import aiopurgatory as ap
from aiopurgatory._trio_driver import TrioDriver
from tests.support.backends import now, settle

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


class FailingOnComplete(ap.DelayedOperation):
    """An operation whose ``on_complete`` raises :class:`Boom`."""

    def on_complete(self) -> None:
        raise Boom("on_complete failed")


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


async def observe(op: ap.DelayedOperation) -> ap.Outcome:
    """Await ``op``: an observer, as a call :func:`start` can run."""
    return await op


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
