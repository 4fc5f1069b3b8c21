"""The running loop's shared :class:`~aiopurgatory.Timer`, and ``ap.timeout()`` on it."""

from __future__ import annotations

import weakref

from ._backends import current_owner
from ._timeout import Timeout
from ._timer import Timer

__all__ = ["shared_timer", "timeout", "timeout_at"]

# Keyed by id(loop) (or id of the trio run's token), values held weakly: a Timer
# refers to its loop, so a WeakKeyDictionary would keep every loop that ever used
# ap.timeout() alive. A Timer with pending work is kept alive by its loop (a
# handle) or run; an idle one is cheap to make again.
_shared: weakref.WeakValueDictionary[int, Timer] = weakref.WeakValueDictionary()


def shared_timer() -> Timer:
    """The running loop's (or trio run's) shared :class:`Timer`, created on demand.

    ``ap.timeout()`` and ``ap.timeout_at()`` use it, and purgatories may
    (``Purgatory(timer=ap.shared_timer())``). It cannot be closed
    (``close()`` raises ``RuntimeError``): it goes away with its loop.

    Raises:
        RuntimeError: no running event loop.
    """
    owner = current_owner()
    timer = _shared.get(id(owner))
    if timer is None or timer._driver.owner is not owner:  # type: ignore[union-attr]
        timer = _shared[id(owner)] = Timer()
        timer._bind()
        timer._shared = True
    return timer


def timeout(delay: float | None) -> Timeout:
    """``asyncio.timeout(delay)`` on the running loop's shared :class:`Timer`.

    Raises:
        TypeError, ValueError: ``delay`` is not None and not a finite number.
        RuntimeError: no running event loop.
    """
    return shared_timer().timeout(delay)


def timeout_at(when: float | None) -> Timeout:
    """``asyncio.timeout_at(when)`` on the running loop's shared :class:`Timer`."""
    return shared_timer().timeout_at(when)
