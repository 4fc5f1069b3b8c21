"""One Redis connection owned by RedisTriggers: opened on use, replaced when dead, bounded in time.

Why not redis-py's pool: a pool shared by every caller runs out (its default
holds 100 connections, and more than 100 concurrent commands fail with
``MaxConnectionsError``), and redis-py 8.1's pool hands out connections that
died while Redis was away (its check for them is skipped while maintenance
notifications are "auto", the default), so the first command on each fails
after Redis is back. A :class:`Link` is one connection with one user (a task of
RedisTriggers, which sends its commands one round trip at a time), so:

* it is **bounded**: one connection per link, however many callers wait behind
  the task that uses it;
* a connection found **dead before use** (the server closed it: its reader is at
  end of file, or it holds bytes nobody asked for) is dropped and a new one
  opened, so a restarted Redis costs no failed command; a command that still
  meets a closed connection it did not open is sent once more on a new one (the
  library's commands are idempotent: an atomic max, a read, a PUBLISH of
  idempotent triggers);
* every call, the connect included, is **bounded** by ``timeout`` seconds; a call
  that runs out drops its connection (a late reply would put the next one out of
  step) and raises ``TimeoutError``;
* its commands are **packed** by :func:`pack_commands` (about three times faster
  than redis-py's packer for a publisher's commands, which carry two or more
  arguments per trigger: profiled, redis-py's packing was most of a publisher's
  CPU).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Final, Protocol

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from ._compat import has_pending_input

__all__ = [
    "CONNECTION_ERRORS",
    "CONNECTION_LOST",
    "CommandLink",
    "Link",
    "closed_transport",
    "pack_commands",
]

# Errors that mean "Redis is unreachable, refused us or did not answer in time":
# the connection is dropped and the call retried later. Anything else escaping a
# loop of RedisTriggers is a bug, logged loudly (and retried as well).
CONNECTION_ERRORS: Final = (RedisError, OSError, asyncio.TimeoutError, EOFError)


def _argument(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value).encode("ascii")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"a Redis command argument must be bytes, str, int or float, got {value!r:.40}")


def pack_commands(commands: Sequence[Command]) -> bytes:
    """``commands`` in Redis's protocol (RESP), as redis-py packs them.

    As redis-py does, a first argument with spaces (``"SCRIPT LOAD"``) is split into words.
    """
    out: list[bytes] = []
    append = out.append
    for args in commands:
        first = args[0]
        if isinstance(first, str) and " " in first:
            args = (*first.split(), *args[1:])
        append(b"*%d\r\n" % len(args))
        for arg in args:
            if type(arg) is not bytes:
                arg = _argument(arg)
            append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return b"".join(out)


def closed_transport(exc: BaseException) -> bool:
    """True for uvloop's error on a write to a connection that has closed.

    asyncio's own transports drop such a write (the read then fails with
    ``ConnectionError``); uvloop's raise ``RuntimeError("unable to perform
    operation on <TCPTransport closed=True ...>; the handler is closed")``,
    which redis-py (it maps ``OSError``) lets through: seen when Redis went away
    between a connect and its first command.
    """
    return type(exc) is RuntimeError and str(exc).endswith("the handler is closed")


class _ConnectionLost:
    """``with CONNECTION_LOST:`` around Redis I/O: :func:`closed_transport` errors
    become redis-py's ``ConnectionError``, handled as every lost connection is."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and closed_transport(exc):
            raise RedisConnectionError(f"the connection closed under a write ({exc})") from exc


CONNECTION_LOST: Final = _ConnectionLost()

Command = Sequence[Any]


def _lost(exc: BaseException) -> bool:
    """A connection that closed (not one that stopped answering: that is a timeout)."""
    return isinstance(exc, RedisConnectionError | OSError) and not isinstance(exc, TimeoutError)


class CommandLink(Protocol):
    """What the sender and the reader send their commands on: a :class:`Link` (one
    server), or a :class:`~._cluster.ClusterLink` (a cluster: a link per master).

    Used by one task at a time.
    """

    #: Seconds a call may take, the (re)connect included.
    timeout: float

    @property
    def connected(self) -> bool:
        """A connection is open (it may still turn out dead at its next use)."""
        ...

    async def execute(self, *commands: Command) -> list[Any]:
        """Send ``commands`` and read one reply each (an error reply returned as its
        ``ResponseError``, not raised).

        Raises:
            TimeoutError: no complete answer within ``timeout`` seconds.
            redis.exceptions.RedisError, OSError: Redis cannot be reached.
        """
        ...

    async def drop(self) -> None:
        """Close the connection(s); the next call opens new ones."""
        ...


class Link:
    """One connection to Redis, made by ``factory`` (a redis-py asyncio ``Connection``).

    Used by one task at a time (calls are not interleaved on the connection).

    Args:
        factory: makes a new, unconnected connection.
        timeout: seconds a call may take, the (re)connect included.
    """

    __slots__ = ("_connection", "_factory", "timeout")

    def __init__(self, factory: Callable[[], Any], timeout: float) -> None:
        self._factory = factory
        self._connection: Any = None
        self.timeout = timeout

    @property
    def connected(self) -> bool:
        """A connection is open (it may still turn out dead at its next use)."""
        connection = self._connection
        return connection is not None and bool(connection.is_connected)

    async def execute(self, *commands: Command) -> list[Any]:
        """Send ``commands`` in one write and read their replies (one round trip).

        Returns:
            One reply per command; an error reply is returned as its
            ``ResponseError`` (the connection stays in step), not raised.

        Raises:
            TimeoutError: no complete answer within ``timeout`` seconds.
            redis.exceptions.ConnectionError, OSError: Redis cannot be reached
                (after one more try on a new connection if the one used was not new).
        """
        try:
            async with asyncio.timeout(self.timeout):
                fresh = await self._ensure_open()
                try:
                    return await self._round_trip(commands)
                except Exception as exc:
                    if fresh or not _lost(exc):
                        raise
                # It closed while idle and the loop had not told us yet: once more.
                await self.drop()
                await self._ensure_open()
                return await self._round_trip(commands)
        except TimeoutError:
            await self.drop()
            raise TimeoutError(f"no reply from Redis within {self.timeout:g} s") from None
        except BaseException:
            # A failure (or a cancellation) mid-call leaves the connection out of step.
            await self.drop()
            raise

    async def drop(self) -> None:
        """Close the connection (if any); the next call opens a new one."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.disconnect(nowait=True)

    async def _ensure_open(self) -> bool:
        """Make sure a live connection is open; True if it was opened now."""
        connection = self._connection
        if connection is not None:
            if connection.is_connected:
                try:
                    # Idle, nothing was asked: bytes or end of file here mean the
                    # server closed it (Redis restarted) or it is out of step.
                    if not await has_pending_input(connection):
                        return False
                except (RedisConnectionError, OSError):
                    pass
            await self.drop()
        connection = self._factory()
        self._connection = connection  # a failed or cancelled connect drops it
        await connection.connect()
        return True

    async def _round_trip(self, commands: Sequence[Command]) -> list[Any]:
        connection = self._connection
        with CONNECTION_LOST:
            await connection.send_packed_command(pack_commands(commands), check_health=False)
            replies: list[Any] = []
            for _ in commands:
                try:
                    # No timeout of redis-py's own: execute() bounds the whole call.
                    replies.append(await connection.read_response(timeout=math.inf))
                except ResponseError as exc:  # an error reply: the connection is in step
                    replies.append(exc)
            return replies
