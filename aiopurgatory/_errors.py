"""Exceptions raised by aiopurgatory, and argument checks shared by its modules."""

from __future__ import annotations

import numbers
from typing import Any

__all__ = [
    "OperationStateError",
    "PurgatoryClosedError",
    "PurgatoryError",
    "PurgatoryFullError",
    "TimerClosedError",
]


# Each error names its public home (aiopurgatory.PurgatoryError in a traceback,
# not aiopurgatory._errors.PurgatoryError); pickle finds it there too.
class PurgatoryError(Exception):
    """Base class of every error raised by aiopurgatory itself."""

    __module__ = "aiopurgatory"


class PurgatoryClosedError(PurgatoryError):
    """A purgatory was used after ``close()``."""

    __module__ = "aiopurgatory"


class TimerClosedError(PurgatoryError, RuntimeError):
    """A :class:`~aiopurgatory.Timer` was used after ``close()``.

    A ``RuntimeError``, as asyncio raises for ``loop.call_later`` on a closed loop.
    """

    __module__ = "aiopurgatory"


class PurgatoryFullError(PurgatoryError):
    """``max_pending`` operations are already pending (backpressure)."""

    __module__ = "aiopurgatory"


class OperationStateError(PurgatoryError):
    """An operation was already watched, is finished, or belongs to another purgatory."""

    __module__ = "aiopurgatory"


def as_seconds(value: Any, name: str) -> float:
    """Return ``value`` as a finite float number of seconds, or raise naming ``name``.

    Raises:
        TypeError: ``value`` is not a real number, or is a bool.
        ValueError: ``value`` is NaN or infinite.
    """
    if type(value) is not float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
        try:
            value = float(value)
        except OverflowError:
            raise ValueError(f"{name} must be finite, got {value!r}") from None
    seconds: float = value
    if seconds - seconds:  # NaN and +-inf, and only they, make this non-zero (NaN is truthy)
        raise ValueError(f"{name} must be finite, got {seconds!r}")
    return seconds
