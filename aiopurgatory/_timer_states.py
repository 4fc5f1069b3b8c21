"""The named values of a timer's entries: their states, and the unarmed tick.

Plain ints, in a module of their own that is never compiled: the compiled core
modules that test them keep each in a C variable, imported from here once
(a module's own C variables are not importable by the others). What each state
means, and the one way out of them, is in :mod:`aiopurgatory._timer_entry`.
"""

from __future__ import annotations

from math import inf
from typing import Final

__all__ = ["DUE", "IDLE", "NO_DEADLINE", "STAGED", "STATE_NAMES", "UNARMED", "WAITING"]

#: Not pending: never scheduled, or it ran, was withdrawn, or was told that its
#: timer closed. 0, what a new compiled entry holds.
IDLE: Final = 0
#: Pending, in the timer's stage: scheduled in this loop iteration, no tick yet.
STAGED: Final = 1
#: Pending, in a bucket of the wheel, ``entry._tick`` its deadline in ticks.
WAITING: Final = 2
#: Pending, out of the stage and the wheel: in a batch about to run.
DUE: Final = 3

#: The states' names, by value (for reprs).
STATE_NAMES: Final = ("idle", "staged", "waiting", "due")

#: A timer's ``_armed`` while no wake-up is armed: above every tick a timer
#: counts, so that "earlier than the armed expiration" is one comparison.
UNARMED: Final = 2**63 - 1

#: An entry's ``_when`` until a timer schedules it (a delayed operation's
#: ``deadline`` is None then): below every loop time. A float, so that the
#: compiled core keeps ``_when`` as a C double, not a float object per entry.
NO_DEADLINE: Final = -inf
