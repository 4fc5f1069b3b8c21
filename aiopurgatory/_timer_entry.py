"""A timer's entries: their states, and the one way an entry leaves the timer.

An entry (a :class:`~aiopurgatory.TimerHandle` or a delayed operation) is in one
of four states, kept in ``entry._state`` (their values are in
:mod:`aiopurgatory._timer_states`):

* ``IDLE``: not pending: never scheduled, or it ran, was withdrawn, or was told
  that its timer closed.
* ``STAGED``: pending, in the timer's stage (``_staged``): scheduled within the
  current loop iteration, its deadline not yet in ticks (see :mod:`aiopurgatory._timer`).
* ``WAITING``: pending, in a bucket of the wheel, ``entry._tick`` its deadline in ticks.
* ``DUE``: pending, out of the stage and the wheel: in a batch about to run.

An entry leaves the timer in one place, :meth:`_EntrySet._unschedule`, whatever
takes it out: a cancel, the purgatory withdrawing an operation, the timer
running it, the timer closing. The :class:`_EntrySet` holds what that exit
touches (the count, the stage, the armed wake-up); :class:`~aiopurgatory.Timer`
is one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._timer_states import IDLE, STAGED, UNARMED, WAITING
from ._wheel import Entry

if TYPE_CHECKING:
    from ._backends import Driver

__all__ = ["_EntrySet", "_TimerEntry"]


class _TimerEntry(Entry):
    """Something a timer can schedule: knows its deadline and how to fire."""

    __slots__ = ("_state", "_when")

    # The loop time it is due at; set by Timer._schedule (delayed operations keep
    # NO_DEADLINE here until they are scheduled). A C double in the compiled core.
    _when: float
    # IDLE, STAGED, WAITING or DUE (see the module documentation). Entries made
    # without __init__ (TimerHandle) set it before anything reads it.
    _state: int

    def _fire(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _timer_closed(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class _EntrySet:
    """The pending entries of a timer: how many, the stage, and the armed wake-up.

    The base of :class:`~aiopurgatory.Timer`, apart so that a handle's
    ``cancel`` reaches :meth:`_unschedule` without the timer's module.
    """

    __slots__ = ("_armed", "_count", "_driver", "_staged")

    def __init__(self) -> None:
        # Pending entries: scheduled, not yet run, withdrawn or closed.
        self._count = 0
        # Entries in the STAGED state, in scheduling order (see Timer._schedule).
        self._staged: list[_TimerEntry] = []
        # The tick the driver is armed for; UNARMED when it is not.
        self._armed: int = UNARMED
        # Set on first use (Timer._bind).
        self._driver: Driver | None = None

    def _unschedule(self, entry: _TimerEntry) -> None:
        """Take a pending ``entry`` out of the timer: the one exit, of every pending entry.

        The entry becomes ``IDLE``; the caller then runs it, or tells it that it
        was cancelled or that the timer closed. Disarms the driver when nothing is
        left pending. For a pending entry only (``entry._state`` is not ``IDLE``).
        """
        state = entry._state
        entry._state = IDLE
        if state == WAITING:
            del entry._bucket[entry._id_key]  # type: ignore[union-attr]
            entry._bucket = None
        elif state == STAGED:
            # Scheduled and withdrawn within one loop iteration (a request's
            # timeout, call_later(...).cancel()): if it was the last one staged,
            # let go of it now, not at the next flush, so that it is freed at
            # once instead of living on (and being traversed by the garbage
            # collector) until then. Others wait for the flush, which skips them.
            staged = self._staged
            if staged[-1] is entry:
                staged.pop()
        self._count = count = self._count - 1
        if not count:
            self._disarm()

    def _disarm(self) -> None:
        if self._armed != UNARMED:
            self._armed = UNARMED
            self._driver.disarm()  # type: ignore[union-attr]
