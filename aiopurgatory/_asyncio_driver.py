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
* ``close()``: drop the wake-up and the flush.

This one is for asyncio (and uvloop, and any ``asyncio.AbstractEventLoop``):
one ``loop.call_at`` handle and one ``loop.call_soon`` per iteration with new
entries. A driver for another backend sits beside it on the same wheel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["AsyncioDriver"]


class AsyncioDriver:
    """Wakes a timer up on the running asyncio loop (see the module documentation).

    Args:
        on_wake: called from the armed ``call_at`` handle.
        on_flush: called from the ``call_soon`` asked for by :meth:`request_flush`.

    Raises:
        RuntimeError: no running event loop.
    """

    __slots__ = ("_handle", "_on_flush", "_on_wake", "_soon", "loop", "time")

    def __init__(self, on_wake: Callable[[], None], on_flush: Callable[[], None]) -> None:
        #: The loop this driver (and its timer) belongs to.
        self.loop = loop = asyncio.get_running_loop()
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
            RuntimeError: the loop is closed (nothing has changed then).
        """
        self._soon = self.loop.call_soon(self._flush)

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
