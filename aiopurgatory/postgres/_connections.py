"""Where PostgreSQL is, the transport's connections, and the record of their failures.

A :class:`Source` hands out connections: from a DSN, connections of the
transport's own (asyncpg ``connect``); from an ``asyncpg.Pool`` the
application passed, the pool's (so the transport never opens more than the pool
allows). A :class:`Link` is one user's connection (the sender's, the reader's):
taken on use, every call bounded by ``command_timeout``, and a connection that
failed (the server restarted, its backend was terminated, a call ran out of
time on a paused server) terminated and replaced by the next call. From a DSN a
link keeps its connection between calls; from a pool it gives it back after
each call.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import asyncpg

from ._errors import PostgresTriggersError

__all__ = ["CONNECTION_ERRORS", "Link", "Source", "describe_dsn"]

T = TypeVar("T")

#: Errors that mean "PostgreSQL is unreachable, refused us, failed the statement or
#: did not answer in time": the connection is dropped and the work retried later.
#: Anything else escaping a loop of the transport is a bug, logged loudly (and
#: retried as well).
CONNECTION_ERRORS: Final = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    OSError,
    TimeoutError,
    EOFError,
)


def describe_dsn(dsn: str) -> str:
    """``host:port/database`` of a DSN, never its password (for logs and errors)."""
    try:
        parts = urllib.parse.urlsplit(dsn)
        host = parts.hostname or "localhost"
        port = parts.port or 5432
    except ValueError:
        return "postgresql://?"
    database = parts.path.lstrip("/") or "?"
    return f"{host}:{port}/{database}"


class Source:
    """Connections to one server: from a DSN, or an application's ``asyncpg.Pool``.

    Args:
        dsn_or_pool: a ``postgresql://`` DSN or an ``asyncpg.Pool``.
        command_timeout: seconds a connect (or a pool's acquire) may take.
        reconnect_delay: the first and the longest delay between retries.
    """

    def __init__(
        self,
        dsn_or_pool: str | asyncpg.Pool,
        *,
        command_timeout: float,
        reconnect_delay: tuple[float, float],
    ) -> None:
        if isinstance(dsn_or_pool, str):
            if not dsn_or_pool.startswith(("postgresql://", "postgres://")):
                raise ValueError(
                    "dsn_or_pool must be a postgresql:// DSN or an asyncpg.Pool, got a str "
                    "that is not a postgresql:// URL"
                )
            self.dsn: str | None = dsn_or_pool
            self.pool: asyncpg.Pool | None = None
            self.where = describe_dsn(dsn_or_pool)
        elif isinstance(dsn_or_pool, asyncpg.Pool):
            self.dsn = None
            self.pool = dsn_or_pool
            self.where = "an asyncpg.Pool"
        else:
            raise TypeError(
                "dsn_or_pool must be a postgresql:// DSN or an asyncpg.Pool, "
                f"got {type(dsn_or_pool).__name__}"
            )
        self.command_timeout = command_timeout
        self._first, self._longest = reconnect_delay
        self.errors = 0
        self.last_error: str | None = None

    async def acquire(self) -> Any:
        """A connection (bounded by ``command_timeout``).

        Raises:
            Exception: one of :data:`CONNECTION_ERRORS`.
        """
        if self.pool is not None:
            return await self.pool.acquire(timeout=self.command_timeout)
        assert self.dsn is not None
        return await asyncpg.connect(self.dsn, timeout=self.command_timeout)

    async def release(self, connection: Any, *, broken: bool = False) -> None:
        """Give ``connection`` back: a pool's to its pool, ours closed. A ``broken``
        one is terminated (its state is unknown: never reused, nothing awaited on it)."""
        if broken:
            connection.terminate()
        if self.pool is not None:
            # The pool resets it (UNLISTEN * included), or terminates one it cannot
            # reset and frees its place; its release is shielded from cancellation,
            # so a cancelled caller still gives the connection back. Nothing to undo
            # here: the proxy is detached by then, and terminating it would raise an
            # InterfaceError in place of the caller's CancelledError.
            with contextlib.suppress(*CONNECTION_ERRORS):
                await self.pool.release(connection, timeout=self.command_timeout)
        elif not broken:
            try:
                await connection.close(timeout=min(1.0, self.command_timeout))
            except CONNECTION_ERRORS:
                connection.terminate()

    @property
    def keeps(self) -> bool:
        """A link keeps its connection between calls (ours: yes; a pool's: no)."""
        return self.pool is None

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before the ``attempt``-th retry (full jitter, capped)."""
        ceiling = min(self._longest, self._first * 2 ** min(attempt - 1, 30))
        return random.uniform(ceiling / 2, ceiling)

    def record_error(self, exc: BaseException) -> str:
        """Count a failed connection or call; its text (no password) as the last error."""
        self.errors += 1
        self.last_error = error_text(exc)
        return self.last_error

    def record_bug(self, exc: BaseException) -> str:
        """Keep a failure that is a bug as the last error; its text."""
        self.last_error = error_text(exc)
        return self.last_error

    def failure(self, what: str, exc: BaseException) -> PostgresTriggersError:
        """The one-line error raised to a caller for ``exc`` (no password)."""
        return PostgresTriggersError(f"{what} {self.where}: {error_text(exc)}")


def error_text(exc: BaseException) -> str:
    """``"Type: message"``; asyncpg and psycopg never put the password in their messages."""
    text = str(exc) or "(no message)"
    return f"{type(exc).__name__}: {text}"


class Link:
    """One user's connection, bounded in time and replaced when it failed.

    Args:
        source: where connections come from.
        timeout: seconds any one call (its connect included) may take.
    """

    def __init__(self, source: Source, timeout: float) -> None:
        self._source = source
        self._timeout = timeout
        self._connection: Any = None

    async def call(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """``await work(connection)`` within ``timeout`` seconds, the connect included.

        A failure (timeout, lost connection, an error of the statement) terminates
        the connection, so the next call starts on a new one.

        Raises:
            Exception: one of :data:`CONNECTION_ERRORS` (``TimeoutError`` past
                ``timeout``), or what ``work`` raised.
        """
        source = self._source
        connection = None
        try:
            async with asyncio.timeout(self._timeout):
                connection = self._connection
                if connection is None or connection.is_closed():
                    self._connection = None
                    connection = await source.acquire()
                result = await work(connection)
        except BaseException:
            self._connection = None
            if connection is not None:
                await source.release(connection, broken=True)
            raise
        if source.keeps:
            self._connection = connection
        else:
            await source.release(connection)
        return result

    async def drop(self) -> None:
        """Close the kept connection, if any (at close)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await self._source.release(connection)
