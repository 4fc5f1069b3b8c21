"""The Redis layer's errors, and the short cause a failed connection is reported with.

Both publishers raise them (:class:`~aiopurgatory.redis.RedisTriggers` and
:class:`~aiopurgatory.redis.SyncPublisher`); ``aiopurgatory.redis`` shows them
as its own (their ``__module__``), so tracebacks and pickle name the public module.
"""

from __future__ import annotations

import asyncio

from redis.exceptions import AuthenticationError, AuthorizationError

from .._errors import PurgatoryError, TriggersClosedError

__all__ = ["RedisTriggersClosedError", "RedisTriggersError", "connection_cause"]


class RedisTriggersError(PurgatoryError):
    """Redis could not be reached or refused the connection (message redacted)."""


class RedisTriggersClosedError(RedisTriggersError, TriggersClosedError):
    """Use of a RedisTriggers before ``async with`` or after ``aclose()``.

    An :class:`aiopurgatory.TriggersClosedError` (so a ``RuntimeError``), as every
    transport's.
    """


def connection_cause(exc: BaseException) -> str:
    """A short name for why a connection failed, for the one-line error."""
    text = str(exc)
    if isinstance(exc, AuthenticationError | AuthorizationError) or any(
        marker in text for marker in ("WRONGPASS", "NOAUTH", "invalid password", "NOPERM")
    ):
        return "authentication failed"
    if isinstance(exc, asyncio.TimeoutError) or "Timeout" in type(exc).__name__:
        return "timed out"
    return "unreachable"
