"""The asyncio driver of a :class:`~aiopurgatory.Timer`: the clock and the wake-ups.

A :class:`~aiopurgatory.Timer` keeps its entries in a sans-IO wheel
(:mod:`aiopurgatory._wheel`) and decides, in loop-time seconds, when it next has
work to do. A *driver* is the little that depends on the event loop; it gives the
timer:

* ``time()``: the loop's clock, in seconds;
* ``arm(when)`` / ``disarm()``: one wake-up at loop time ``when`` (re-arming
  replaces the previous one), which calls the timer's ``on_wake()``;
* ``request_flush()``: a call of the timer's ``on_flush()`` on a later loop
  iteration, never inside the calling one (the timer asks at most once per
  iteration);
* ``report(exc, entry)``: where an exception from a callback goes;
* ``close()``: drop the wake-up and the flush;
* ``owner`` (the loop, or trio's run token) and ``is_current()``: whether the
  calling code runs on it;
* ``new_waiter()``: something ``watch()`` parks the calling task on;
* ``call_soon_threadsafe(fn)``: run ``fn()`` on the loop, from any thread.

This one is for asyncio (and uvloop, and any ``asyncio.AbstractEventLoop``):
one ``loop.call_at`` handle and one ``loop.call_soon`` per iteration with new
entries. The trio driver (:mod:`aiopurgatory._trio_driver`) sits beside it on
the same wheel; :mod:`aiopurgatory._backends` picks one at first use.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from threading import get_ident

__all__ = ["AsyncioDriver"]

_get_running_loop = asyncio._get_running_loop  # C; None outside a running loop


def _another_is_running() -> bool:
    """An asyncio loop or a trio run is active in this thread.

    The same question as ``_backends.current_backend() is not None``, asked here
    because imports go one way: ``_backends`` imports the drivers, never the reverse
    (tests/test_package_shape.py).
    """
    if _get_running_loop() is not None:
        return True
    trio = sys.modules.get("trio")
    return trio is not None and bool(trio.lowlevel.in_trio_run())


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
        "_thread_tracked",
        "call_soon_threadsafe",
        "loop",
        "new_waiter",
        "owner",
        "time",
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
        self._on_wake = on_wake
        self._on_flush = on_flush
        self._handle: asyncio.TimerHandle | None = None
        self._soon: asyncio.Handle | None = None
        # asyncio's own loops (BaseEventLoop: the default loop, virtual time) keep
        # the id of the thread running them in _thread_id (None while stopped).
        self._thread_tracked = isinstance(loop, asyncio.BaseEventLoop)
        #: A future to park a task on (``loop.create_future``).
        self.new_waiter: Callable[[], asyncio.Future[None]] = loop.create_future
        #: ``loop.call_soon_threadsafe``.
        self.call_soon_threadsafe: Callable[[Callable[[], object]], object] = (
            loop.call_soon_threadsafe
        )

    def is_current(self) -> bool:
        """True if called from a coroutine or callback running on this driver's loop.

        A thread runs one loop at a time, so an asyncio loop running in this
        thread is the running loop. Asking the loop for its thread is cheap;
        ``asyncio._get_running_loop()`` makes a ``getpid()`` system call on each
        call (CPython 3.11), about 1 us here: it is left to other loops (uvloop).
        """
        if self._thread_tracked:
            return self.loop._thread_id == get_ident()  # type: ignore[attr-defined,no-any-return]
        return _get_running_loop() is self.loop

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
        if not loop.is_running() and _another_is_running():
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
