"""Exceptions raised by aiopurgatory (argument checks: :mod:`aiopurgatory._validation`)."""

from __future__ import annotations

__all__ = [
    "OperationStateError",
    "PurgatoryClosedError",
    "PurgatoryError",
    "PurgatoryFullError",
    "TimerClosedError",
    "TriggersClosedError",
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


class TriggersClosedError(PurgatoryError, RuntimeError):
    """A :class:`~aiopurgatory.Triggers` transport used before ``async with`` or after ``aclose()``.

    Every transport's own "closed" error is one (``RedisTriggersClosedError`` too),
    so code written against the protocol catches this.
    """

    __module__ = "aiopurgatory"
