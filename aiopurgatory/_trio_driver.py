"""The trio driver of a :class:`~aiopurgatory.Timer`, trio's waiter and deadline scope.

The contract of :mod:`aiopurgatory._backends` (``Driver``, ``RunningLoop``,
``DeadlineScope``), on trio: one *system task* per timer sleeps in a cancel scope whose
deadline is the armed instant, so trio's own deadline machinery wakes it (never
early by ``trio.current_time()``, and a mock clock jumps straight to it). A
flush request reschedules the sleeping task; it then runs on a later scheduler
batch, never inside the calling code. With nothing armed the task sleeps with no
deadline: no polling, no CPU, nothing for an autojumping clock to jump to.

The task is spawned on first use and ends when the timer is closed, when the
trio run ends, or when the timer is garbage-collected. It holds the driver only
weakly while it sleeps; an armed or flushing driver is kept alive by its run
(as asyncio keeps a timer alive through its ``call_at`` handle), so dropping a
busy timer does not lose its callbacks and dropping an idle one leaks nothing.

A timeout's deadline (:class:`TrioDeadlineScope`) is a trio cancel scope around
the block, cancelled by the timer at the deadline: trio's deadlines are per
scope, not per task.

This module imports trio; :mod:`aiopurgatory._backends` imports it only once a
trio run asks for a driver.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Generator
from math import inf
from types import TracebackType
from typing import Any

import trio

from ._logging import LazyLogger

__all__ = ["TrioDeadlineScope", "TrioDriver", "TrioWaiter"]

_current_trio_token = trio.lowlevel.current_trio_token
_reschedule = trio.lowlevel.reschedule
_SUCCEEDED = trio.lowlevel.Abort.SUCCEEDED

# Drivers that are armed or have a flush pending, per trio run: what keeps a busy
# timer alive (the run variable dies with its run).
_BUSY: trio.lowlevel.RunVar[dict[int, TrioDriver]] = trio.lowlevel.RunVar("aiopurgatory_busy")

_log = LazyLogger()


def _running_token() -> trio.lowlevel.TrioToken | None:
    """The running trio run's token, or None outside one."""
    try:
        return _current_trio_token()
    except RuntimeError:
        return None


def _busy_drivers() -> dict[int, TrioDriver]:
    try:
        return _BUSY.get()
    except LookupError:
        busy: dict[int, TrioDriver] = {}
        _BUSY.set(busy)
        return busy


class _Parking:
    """Where one task parks (``wait_task_rescheduled``) until woken once.

    The driver task sleeps in one (:class:`_Bed`), a task awaiting an operation
    in another (:class:`TrioWaiter`).
    """

    __slots__ = ("task",)

    def __init__(self) -> None:
        #: The parked task (None while none is, or once woken or cancelled).
        self.task: trio.lowlevel.Task | None = None

    def wake(self) -> None:
        """Reschedule the parked task, if any."""
        task = self.task
        if task is not None:
            self.task = None
            _reschedule(task)

    def abort(self, _raise_cancel: Any) -> trio.lowlevel.Abort:
        """The parked task was cancelled: let it go (``wait_task_rescheduled``'s abort)."""
        self.task = None
        return _SUCCEEDED


class _Bed(_Parking):
    """Where the driver task sleeps: shared by the task and its driver.

    The task holds this strongly and the driver weakly; the driver holds this.
    """

    __slots__ = ("__weakref__", "ended", "scope", "token")

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        super().__init__()
        self.token = token
        #: The driver task has ended (its run is ending): nothing more is served.
        self.ended = False
        #: The cancel scope it sleeps in (its deadline is the armed instant).
        self.scope: trio.CancelScope | None = None

    def driver_collected(self, _ref: object) -> None:
        # Garbage collection may run in any thread: go through the run's token.
        with contextlib.suppress(trio.RunFinishedError):
            self.token.run_sync_soon(self.wake)


class TrioDriver:
    """Wakes a timer up in the running trio run (see the module documentation).

    Args:
        on_wake: called from the driver task when the armed instant has come.
        on_flush: called from the driver task after a :meth:`request_flush`.

    Raises:
        RuntimeError: no active trio run in this thread.
    """

    __slots__ = (
        "__weakref__",
        "_armed",
        "_bed",
        "_busy",
        "_closed",
        "_flush",
        "_on_flush",
        "_on_wake",
        "_ref",
        "_spawned",
        "owner",
        "time",
    )

    #: The backend's name.
    backend = "trio"
    #: Not an asyncio loop.
    loop = None
    #: No thread test: only :meth:`is_current` knows.
    running_here = None

    def __init__(self, on_wake: Callable[[], None], on_flush: Callable[[], None]) -> None:
        #: The run this driver belongs to (its ``TrioToken``).
        self.owner = token = _current_trio_token()
        #: The run's clock, in seconds (``trio.current_time()``, one call less).
        self.time: Callable[[], float] = trio.lowlevel.current_clock().current_time
        self._on_wake = on_wake
        self._on_flush = on_flush
        self._armed = inf
        self._flush = False
        self._closed = False
        self._spawned = False
        self._bed = bed = _Bed(token)
        self._busy = _busy_drivers()
        self._ref = weakref.ref(self, bed.driver_collected)

    # -- for the running trio run, no driver needed -------------------------------------

    @staticmethod
    def running_owner() -> trio.lowlevel.TrioToken:
        """The running trio run's token (RuntimeError outside one)."""
        return _current_trio_token()

    @staticmethod
    def running_time() -> float:
        """``trio.current_time()`` (RuntimeError outside a run)."""
        return float(trio.current_time())

    @staticmethod
    def new_waiter() -> TrioWaiter:
        """A waiter to park a task on."""
        return TrioWaiter()

    @staticmethod
    def running_call_soon_threadsafe() -> Callable[..., object]:
        """The running run's ``TrioToken.run_sync_soon`` (RuntimeError outside one)."""
        return _current_trio_token().run_sync_soon

    @staticmethod
    def done_callback_scheduler() -> Callable[..., object]:
        """``schedule(fn, op, context)``: ``fn(op)`` soon in this run (``run_sync_soon``)."""
        run_sync_soon = _current_trio_token().run_sync_soon

        def schedule(fn: Callable[[Any], object], op: Any, context: Any) -> None:
            # A run that has finished runs nothing more, as a closed asyncio loop.
            with contextlib.suppress(trio.RunFinishedError):
                run_sync_soon(_run_done_callback, fn, op, context)

        return schedule

    @staticmethod
    def deadline_scope() -> TrioDeadlineScope:
        """A cancel scope for a timeout's block."""
        return TrioDeadlineScope()

    # -- the driver interface ---------------------------------------------------------

    def is_current(self) -> bool:
        """True if called from inside this driver's trio run."""
        return _running_token() is self.owner

    def call_soon_threadsafe(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` in the run, from any thread (``TrioToken.run_sync_soon``).

        Raises:
            RuntimeError: the run has finished (``trio.RunFinishedError``).
        """
        self.owner.run_sync_soon(fn)

    def waiter(self) -> TrioWaiter:
        """A waiter to park a task on (as :meth:`new_waiter`)."""
        return TrioWaiter()

    def arm(self, when: float) -> None:
        """Call ``on_wake()`` at time ``when``, instead of any earlier arming."""
        self._armed = when
        self._busy[id(self)] = self
        scope = self._bed.scope
        if scope is not None:
            scope.deadline = when
        elif not self._spawned:
            self._spawn()

    def disarm(self) -> None:
        """Drop the armed wake-up, if any."""
        if self._armed != inf:
            self._armed = inf
            if not self._flush:
                self._busy.pop(id(self), None)
            scope = self._bed.scope
            if scope is not None:
                scope.deadline = inf

    def request_flush(self) -> None:
        """Call ``on_flush()`` from the driver task on a later scheduler batch.

        Raises:
            RuntimeError: called from outside this driver's trio run, or while the
                run is ending (its driver task has ended): nothing has changed then.
        """
        if not self.is_current():
            raise RuntimeError("this timer is bound to another trio run or event loop")
        if self._bed.ended:
            raise RuntimeError("the trio run of this timer is ending: nothing can be scheduled")
        if not self._spawned:
            self._spawn()  # first, so that a refusal changes nothing
        self._flush = True
        self._busy[id(self)] = self
        self._bed.wake()

    def close(self) -> None:
        """Drop the armed wake-up and a requested flush; the driver task ends."""
        self._closed = True
        self._armed = inf
        self._flush = False
        self._busy.pop(id(self), None)
        self._bed.wake()

    def report(self, exc: BaseException, entry: object) -> None:
        """Log an exception from a timer callback (trio has no loop exception handler)."""
        _log.error(
            "aiopurgatory.timer_callback_failed",
            entry=repr(entry),
            error=repr(exc),
            exc_info=exc,
        )

    # -- the driver task -----------------------------------------------------------------

    def _spawn(self) -> None:
        trio.lowlevel.spawn_system_task(
            _serve, self._ref, self._bed, name=f"aiopurgatory timer driver {id(self):#x}"
        )
        self._spawned = True

    def _serve_once(self) -> None:
        """Run what is due: the flush, then the wake-up if its instant has come."""
        if self._flush:
            self._flush = False
            self._on_flush()
        if self._armed <= self.time():
            self._armed = inf
            self._on_wake()
        if self._armed == inf and not self._flush:
            self._busy.pop(id(self), None)


async def _serve(ref: weakref.ref[TrioDriver], bed: _Bed) -> None:
    """The driver task: sleep until the armed instant or a flush request, serve, repeat.

    It sleeps in one cancel scope, whose deadline :meth:`TrioDriver.arm` moves,
    for as long as flushes wake it; only the deadline (which cancels the scope for
    good) makes it open a new one. It holds its driver only while serving it, so
    an idle timer can be collected. When the run ends (trio cancels its system
    tasks) it serves a flush still pending once, as asyncio runs its ready
    callbacks, and from then on the driver refuses new work.
    """
    wait = trio.lowlevel.wait_task_rescheduled
    current_task = trio.lowlevel.current_task
    try:
        while True:
            driver = _live(ref)
            if driver is None:
                return
            deadline = driver._armed
            del driver
            with trio.CancelScope(deadline=deadline) as scope:
                bed.scope = scope
                try:
                    while True:
                        driver = _live(ref)
                        if driver is None:
                            return
                        flush = driver._flush
                        del driver
                        if flush:
                            # Asked for before this task ran, or within its step
                            # (by a callback): serve on a later batch.
                            await trio.lowlevel.checkpoint()
                        else:
                            bed.task = current_task()
                            try:
                                await wait(bed.abort)
                            finally:
                                bed.task = None
                        if not _serve_driver(ref):
                            return
                finally:
                    bed.scope = None
            # The deadline came: the scope caught its Cancelled.
            if not _serve_driver(ref):
                return
    finally:
        bed.ended = True
        driver = _live(ref)
        if driver is not None and driver._flush:
            _serve_driver(ref)


def _run_done_callback(fn: Callable[[Any], object], op: Any, context: Any) -> None:
    """An operation's done callback, in the trio run: an exception from it is logged.

    (Raised out of ``run_sync_soon`` it would end the run as a TrioInternalError;
    asyncio hands it to the loop's exception handler, which logs it.)
    """
    try:
        context.run(fn, op)
    except Exception as exc:
        _log.error(
            "aiopurgatory.done_callback_failed",
            callback=repr(fn),
            op=repr(op),
            error=repr(exc),
            exc_info=exc,
        )


def _live(ref: weakref.ref[TrioDriver]) -> TrioDriver | None:
    """The driver behind ``ref``, unless it is gone or closed."""
    driver = ref()
    return None if driver is None or driver._closed else driver


def _serve_driver(ref: weakref.ref[TrioDriver]) -> bool:
    """Serve the driver behind ``ref``; False if it is gone or closed."""
    driver = _live(ref)
    if driver is None:
        return False
    try:
        driver._serve_once()
    except Exception as exc:  # the timer contains callbacks; this is a last resort
        driver.report(exc, driver)
    return True


class TrioWaiter(_Parking):
    """A one-shot waiter for trio, shaped like the asyncio future ``watch()`` uses.

    ``set_result(None)`` wakes the task awaiting it; ``await`` returns at once
    once set. Cancelling the awaiting task (a cancel scope) raises ``Cancelled``
    out of the ``await``, as trio does.
    """

    __slots__ = ("_set",)

    def __init__(self) -> None:
        super().__init__()
        self._set = False

    def done(self) -> bool:
        """True once :meth:`set_result` was called."""
        return self._set

    def set_result(self, _result: None) -> None:
        """Mark as set and wake the waiting task, if any."""
        self._set = True
        self.wake()

    async def _wait(self) -> None:
        if self._set:
            await trio.lowlevel.checkpoint()
            return
        self.task = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self.abort)

    def __await__(self) -> Generator[Any, None, None]:
        return self._wait().__await__()


class TrioDeadlineScope:
    """The block of a timeout on trio: a cancel scope the deadline cancels.

    Leaving it after the deadline's ``Cancelled`` reached it is a timeout, as
    anyio's ``fail_after`` has it on every backend; a block that caught the
    ``Cancelled`` and went on leaves normally (as with ``asyncio.timeout``).
    """

    __slots__ = ("_scope",)

    def __init__(self) -> None:
        self._scope = trio.CancelScope()

    @staticmethod
    def time() -> float:
        """``trio.current_time()``."""
        return float(trio.current_time())

    def enter(self) -> None:
        """Open the cancel scope around the block."""
        self._scope.__enter__()

    def cancel(self) -> None:
        """Cancel the scope (also before it is entered: it then starts cancelled)."""
        self._scope.cancel()

    def run_due(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` now: a cancelled scope interrupts the block at its next checkpoint."""
        callback()

    def exit(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool:
        """Close the scope; True if it caught the ``Cancelled`` of :meth:`cancel`."""
        self._scope.__exit__(exc_type, exc_val, exc_tb)
        return self._scope.cancelled_caught
