"""The asyncio driver of a :class:`~aiopurgatory.Timer`: the clock and the wake-ups.

A :class:`~aiopurgatory.Timer` keeps its entries in a sans-IO wheel
(:mod:`aiopurgatory._wheel`) and decides, in loop-time seconds, when it next has
work to do. A *driver* is the little that depends on the event loop. What each
member must do, who calls it and on which thread is declared in
:mod:`aiopurgatory._backends`: ``Driver`` (per timer: the clock, one wake-up,
a flush per iteration, the way in from other threads), ``RunningLoop`` (the
static methods: questions about the running loop) and ``DeadlineScope`` (the
block a ``Timeout`` may interrupt).

This one is for asyncio (and uvloop, and any ``asyncio.AbstractEventLoop``):
one ``loop.call_at`` handle and one ``loop.call_soon`` per iteration with new
entries; a timeout cancels the enclosing task, as ``asyncio.timeout`` does. The
trio driver (:mod:`aiopurgatory._trio_driver`) sits beside it on the same wheel;
:mod:`aiopurgatory._backends` picks one at first use.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from threading import get_ident
from types import TracebackType
from typing import Any

from ._detect import current_backend

__all__ = ["AsyncioDeadlineScope", "AsyncioDriver", "Future"]

#: The future an asyncio task parks on: what ``Purgatory.watch()`` returns hands
#: it to its task (aiopurgatory._watch), which imports no backend itself.
Future = asyncio.Future

_get_running_loop = asyncio._get_running_loop  # C; None outside a running loop


class AsyncioDriver:
    """Wakes a timer up on the running asyncio loop (see the module documentation).

    Args:
        on_wake: called from the armed ``call_at`` handle.
        on_flush: called from the ``call_soon`` asked for by :meth:`request_flush`.

    Raises:
        RuntimeError: no running event loop.
    """

    __slots__ = (
        "_handle",
        "_on_flush",
        "_on_wake",
        "_soon",
        "call_soon_threadsafe",
        "loop",
        "owner",
        "running_here",
        "time",
        "waiter",
    )

    #: The backend's name.
    backend = "asyncio"

    def __init__(self, on_wake: Callable[[], None], on_flush: Callable[[], None]) -> None:
        #: The loop this driver (and its timer) belongs to.
        self.loop = self.owner = loop = asyncio.get_running_loop()
        # asyncio's BaseEventLoop.time() is time.monotonic() behind a Python
        # method; calling the C function directly saves a frame per timer.
        # Loops with their own clock (uvloop, virtual time, a time() replaced
        # on the instance) keep theirs.
        plain = getattr(loop.time, "__func__", None) is asyncio.BaseEventLoop.time
        #: The loop's clock, in seconds.
        self.time: Callable[[], float] = time.monotonic if plain else loop.time
        #: A new future of the loop (``loop.create_future``).
        self.waiter: Callable[[], asyncio.Future[None]] = loop.create_future
        self._on_wake = on_wake
        self._on_flush = on_flush
        self._handle: asyncio.TimerHandle | None = None
        self._soon: asyncio.Handle | None = None
        # What is_current() tests first, and the timer without calling it: for a
        # loop that does not track its own thread (uvloop), the thread it runs in
        # when bound and its is_running. None for asyncio's own loops
        # (BaseEventLoop: the default loop, virtual time), whose _thread_id
        # is_current() reads instead (None while the loop is stopped).
        #: ``(thread, loop.is_running)`` for loops that do not track their thread.
        self.running_here: tuple[int, Callable[[], bool]] | None = (
            None if isinstance(loop, asyncio.BaseEventLoop) else (get_ident(), loop.is_running)
        )
        #: ``loop.call_soon_threadsafe``.
        self.call_soon_threadsafe: Callable[[Callable[[], object]], object] = (
            loop.call_soon_threadsafe
        )

    # -- for the running loop, no driver needed ------------------------------------------

    @staticmethod
    def running_owner() -> asyncio.AbstractEventLoop:
        """The running loop (RuntimeError if none)."""
        return asyncio.get_running_loop()

    @staticmethod
    def running_time() -> float:
        """The running loop's ``time()`` (RuntimeError if none)."""
        return asyncio.get_running_loop().time()

    @staticmethod
    def new_waiter() -> asyncio.Future[None]:
        """A future of the running loop to park a task on (RuntimeError if none)."""
        return asyncio.get_running_loop().create_future()

    @staticmethod
    def running_call_soon_threadsafe() -> Callable[..., object]:
        """The running loop's ``call_soon_threadsafe`` (RuntimeError if none).

        The function returned raises ``RuntimeError`` once the loop has stopped
        running (not only once it is closed): a callback handed to a loop that is
        never run again would be lost without a word.
        """
        loop = asyncio.get_running_loop()

        def call_soon_threadsafe(fn: Callable[..., object], *args: Any) -> object:
            if not loop.is_running():
                raise RuntimeError("the loop is not running")
            return loop.call_soon_threadsafe(fn, *args)

        return call_soon_threadsafe

    @staticmethod
    def done_callback_scheduler() -> Callable[..., object]:
        """``schedule(fn, op, context)``: ``loop.call_soon(fn, op, context=context)``.

        Nothing once the loop is closed (it runs nothing more), so that finishing
        an operation at shutdown (``close()`` after the loop) does not fail.
        """
        loop = asyncio.get_running_loop()
        call_soon = loop.call_soon

        def schedule(fn: Callable[[Any], object], op: Any, context: Any) -> object:
            if loop.is_closed():
                return None
            return call_soon(fn, op, context=context)

        return schedule

    @staticmethod
    def deadline_scope() -> AsyncioDeadlineScope:
        """The current task, as the block a timeout may cancel (RuntimeError outside a task)."""
        return AsyncioDeadlineScope()

    # -- the driver interface ---------------------------------------------------------

    def is_current(self) -> bool:
        """True if called from a coroutine or callback running on this driver's loop.

        A thread runs one loop at a time, so an asyncio loop running in this
        thread is the running loop. Asking the loop for its thread is cheap;
        ``asyncio._get_running_loop()`` makes a ``getpid()`` system call on each
        call (CPython 3.11), about 1 us here. For other loops (uvloop): if the
        loop is running and this is the thread it was running in when bound, it
        is the running loop (no thread runs two loops at once); otherwise (a
        loop moved to another thread, or not running) ask asyncio.
        """
        loop = self.loop
        here = self.running_here
        if here is None:
            return loop._thread_id == get_ident()  # type: ignore[attr-defined,no-any-return]
        if here[0] == get_ident() and here[1]():
            return True
        return _get_running_loop() is loop

    def arm(self, when: float) -> None:
        """Call ``on_wake()`` at loop time ``when``, instead of any earlier arming."""
        handle = self._handle
        if handle is not None:
            handle.cancel()
        self._handle = self.loop.call_at(when, self._wake)

    def disarm(self) -> None:
        """Drop the armed wake-up, if any."""
        handle = self._handle
        if handle is not None:
            handle.cancel()
            self._handle = None

    def request_flush(self) -> None:
        """Call ``on_flush()`` on a later loop iteration (once per request).

        Raises:
            RuntimeError: called from outside the loop (another loop, or trio), or
                the loop is closed (nothing has changed then).
        """
        loop = self.loop
        # is_running() is cheap and true in the common case; otherwise find out
        # whether another loop or a trio run is using this timer (a stopped loop,
        # between run_until_complete() calls, may be scheduled on, as asyncio's).
        if not loop.is_running() and current_backend() is not None:
            closed = " (closed)" if loop.is_closed() else ""
            raise RuntimeError(f"this timer is bound to another event loop{closed}")
        self._soon = loop.call_soon(self._flush)

    def close(self) -> None:
        """Drop the armed wake-up and a requested flush."""
        self.disarm()
        soon = self._soon
        if soon is not None:
            soon.cancel()
            self._soon = None

    def report(self, exc: BaseException, entry: object) -> None:
        """Hand an exception from a timer callback to the loop's exception handler."""
        self.loop.call_exception_handler(
            {
                "message": f"Exception in timer callback {entry!r}",
                "exception": exc,
                "timer_handle": entry,
            }
        )

    def _wake(self) -> None:
        self._handle = None
        self._on_wake()

    def _flush(self) -> None:
        self._soon = None
        self._on_flush()


class AsyncioDeadlineScope:
    """The block of a timeout on asyncio: the current task, cancelled at the deadline.

    As ``asyncio.timeout`` does: the deadline cancels the task, and leaving the
    block turns that cancellation (and only that one: ``Task.uncancel()`` counts
    them) into ``TimeoutError``.

    Raises:
        RuntimeError: not inside a task.
    """

    __slots__ = ("_cancelled", "_cancelling", "_task")

    def __init__(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Timeout should be used inside a task")
        self._task: asyncio.Task[Any] = task
        # Cancellations requested before the block are not the deadline's.
        self._cancelling = task.cancelling()
        self._cancelled = False

    def time(self) -> float:
        """The task's loop clock."""
        return self._task.get_loop().time()

    def enter(self) -> None:
        """Nothing to open: the task itself is the scope."""

    def cancel(self) -> None:
        """Cancel the task (from the deadline's timer callback)."""
        self._cancelled = True
        self._task.cancel()

    def run_due(self, callback: Callable[[], None]) -> asyncio.Handle:
        """Run ``callback`` on the next loop iteration: at the block's first suspension.

        Not inside the calling code: a task cancelled while it runs ends cancelled
        even if it never suspends again, which ``asyncio.timeout(0)`` avoids too.
        """
        return self._task.get_loop().call_soon(callback)

    def exit(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool:
        """True if the block ended with the cancellation :meth:`cancel` asked for."""
        if not self._cancelled:
            return False
        return self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError
