"""``TimerHandle``: a callback scheduled on a :class:`~aiopurgatory.Timer`.

What ``Timer.call_later`` and ``Timer.call_at`` return, as ``loop.call_later``
returns an ``asyncio.TimerHandle``: ``when()``, ``cancel()``, ``cancelled()``.
A handle is an entry of its timer (:mod:`aiopurgatory._timer_entry`); cancelling
it takes it out through the timer's one exit, ``_unschedule``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from ._timer_entry import _EntrySet, _TimerEntry
from ._timer_states import IDLE, STATE_NAMES

__all__ = ["TimerHandle"]


class TimerHandle(_TimerEntry):
    """A callback scheduled on a :class:`Timer`; returned by ``call_later``/``call_at``."""

    __slots__ = ("_args", "_callback", "_cancelled", "_context", "_timer")

    # Handles are made by Timer._new_handle (for call_later and call_at), which
    # sets these slots directly.
    _timer: _EntrySet
    _callback: Callable[..., object] | None
    _args: tuple[Any, ...] | None
    _context: contextvars.Context | None
    _cancelled: bool

    def __init__(self) -> None:
        raise TypeError("TimerHandle objects are created by Timer.call_later() and call_at()")

    def __repr__(self) -> str:
        if self._cancelled:
            state = "cancelled"
        elif self._state != IDLE:
            state = f"pending ({STATE_NAMES[self._state]})"
        else:
            state = "done"
        return f"<TimerHandle {state} when={self._when!r} callback={self._callback!r}>"

    def when(self) -> float:
        """The loop time (seconds) the callback is due at."""
        return self._when

    def cancelled(self) -> bool:
        """True once :meth:`cancel` has been called (as in asyncio)."""
        return self._cancelled

    def cancel(self) -> None:
        """Cancel the callback if it has not run yet. Idempotent, O(1)."""
        if self._cancelled:
            return
        self._cancelled = True
        self._callback = self._args = self._context = None
        if self._state != IDLE:
            self._timer._unschedule(self)

    def _fire(self) -> None:
        args = self._args
        context = self._context
        self._args = self._context = None
        # A pending handle always has a context: the caller's, or a copy of the
        # one current at scheduling time (as asyncio does). The callback is let go
        # only once it has returned: a failure's report (the handle's repr, as
        # asyncio's) names it.
        context.run(self._callback, *args)  # type: ignore[arg-type, misc, union-attr]
        self._callback = None

    def _timer_closed(self) -> None:
        self._cancelled = True
        self._callback = self._args = self._context = None
