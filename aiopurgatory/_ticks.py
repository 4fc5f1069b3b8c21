"""Loop-time seconds to wheel ticks and back, never early (sans-IO, as the wheel is).

A :class:`~aiopurgatory.Timer` files its entries in the wheel by integer tick
and asks its driver to wake it up at a loop time. The rules that keep every
entry from running before its ``when``:

* A deadline rounds *up* (:func:`ceil_tick`: the least ``e`` with
  ``e * tick >= when``) and the clock rounds *down* (:func:`floor_tick`: the
  largest ``n`` with ``n * tick <= now``). A bucket runs only once the
  rounded-down clock has reached it.
* Both use the same float product ``n * tick`` that the driver is armed at,
  corrected after the division (which can land one off, e.g.
  ``2001 * 0.001 / 0.001``): a wake-up at exactly the armed time always finds
  its bucket due, and since float multiplication by a positive number is
  monotonic, ``n >= e`` implies ``now >= n * tick >= e * tick >= when``.
* Nothing is scheduled beyond :data:`MAX_TICKS` ticks either way (a timer
  refuses it, naming the argument): clamped there, a tick fits a C long long in
  the compiled core.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_TICKS", "ceil_tick", "floor_tick"]

#: Ticks a timer counts up to, either way (2**62 ms is about 146 million years).
MAX_TICKS: Final = 2**62


def floor_tick(now: float, tick: float, limit: float) -> int:
    """The largest tick ``n`` with ``n * tick <= now``, in float arithmetic.

    ``limit`` is ``MAX_TICKS * tick``: ``now`` beyond it either way is clamped.
    """
    if now > limit:
        now = limit
    elif now < -limit:
        now = -limit
    q = now / tick
    n = int(q)
    if n > q:  # int() truncates toward zero: make it floor(q)
        n -= 1
    if n * tick > now:
        n -= 1
    elif (n + 1) * tick <= now:
        n += 1
    return n


def ceil_tick(when: float, tick: float, limit: float) -> int:
    """The least tick ``e`` with ``e * tick >= when`` (see :func:`floor_tick`).

    ``when`` is at most ``limit`` (the timer refused later ones); one long past
    is clamped to ``-limit``: due now, whatever its exact tick.
    """
    if when < -limit:
        when = -limit
    q = when / tick
    e = int(q)
    if e < q:  # int() truncates toward zero: make it ceil(q)
        e += 1
    # Correct the division's rounding with the product the driver compares against.
    if e * tick < when:
        e += 1
    elif (e - 1) * tick >= when:
        e -= 1
    return e
