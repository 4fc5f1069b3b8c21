"""RedisTriggers: a purgatory's triggers shared by every process on a Redis channel.

How it works (the docs page ``distributed.md`` has the user's view):

* Three connections per instance, each owned by this module and used by one
  task (never redis-py's pool, which runs out under many concurrent callers and
  hands out connections that died while Redis was away): the sender's, the
  reader's (both :class:`~._link.Link`: opened on use, replaced when found dead
  before use, every call bounded by ``command_timeout``) and the subscriber's.
* ``check_and_complete(key)`` / ``advance(key, value)`` apply to the local
  purgatory at once, then join the *pending batch*. A sender task wakes on the
  next loop iteration and sends the whole batch as one message (so the triggers
  of one iteration leave as one PUBLISH; a slow round trip lets more gather).
  A batch with advances goes through one Lua script that raises each key's
  stored watermark (atomic max, TTL refreshed) and publishes the message, in one
  round trip. A batch that fails to send is kept (merged with what came after:
  triggers are idempotent, so sending one twice or late is harmless) and retried
  with backoff.
* The subscriber's connection is not redis-py's PubSub, whose own retries would
  reconnect behind our back and skip the resync. Its reads have no timeout; a
  watchdog sends PING after a silent health-check interval, and a second silent
  interval means the connection is dead. Any error ends the connection, never
  the task: it reconnects with exponential backoff and jitter, and after every
  (re)subscription asks the reader for a *resync*: the stored watermark of every
  key the purgatory watches is read and applied, then every watched key is
  checked once. Subscribing comes before reading, so nothing published in
  between is missed.
* The reader (:mod:`._reader`) reads stored watermarks for ``watch()`` (the
  keys of every watch of a loop iteration in one round trip; the watch waits for
  its operation, not for the read), for the resyncs and for
  ``fetch_watermark()``; a failed read is retried, counted and logged once per
  outage.
* Every message carries the sender's instance id; a process's own messages come
  back to it and are skipped (they were applied locally already).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import os
import random
import secrets
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, AuthorizationError, RedisError

from .._detect import current_backend
from .._errors import PurgatoryError
from .._logging import LazyLogger
from .._operation import Outcome
from .._purgatory import Purgatory
from ._link import CONNECTION_ERRORS, CONNECTION_LOST, Link, closed_transport
from ._reader import WatermarkReader
from ._redact import Redactor, describe_url
from ._wire import (
    Batch,
    Key,
    MalformedMessage,
    Value,
    check_key,
    check_value,
    decode,
    encode,
    redis_key,
    stored,
    watermark_prefix,
)

__all__ = [
    "DEFAULT_CHANNEL",
    "MAX_MESSAGE_TRIGGERS",
    "RedisTriggers",
    "RedisTriggersClosedError",
    "RedisTriggersError",
    "RedisTriggersStatistics",
]

#: The channel used when none is given.
DEFAULT_CHANNEL: Final = "aiopurgatory"
#: A batch larger than this leaves as several messages, so that no message grows
#: past what a slow subscriber's output buffer in Redis tolerates.
MAX_MESSAGE_TRIGGERS: Final = 1024

# KEYS: watermark keys. ARGV[1]: TTL in ms, ARGV[2]: channel, ARGV[3]: message,
# ARGV[3 + i]: the value for KEYS[i] (decimal text). Raises each key to at least
# its value and refreshes its TTL, then publishes: one round trip, atomic.
_ADVANCE_SCRIPT: Final = """
local ttl = ARGV[1]
for i, key in ipairs(KEYS) do
  local new = ARGV[i + 3]
  local current = tonumber(redis.call('GET', key) or '')
  if current == nil or current < tonumber(new) then
    redis.call('SET', key, new, 'PX', ttl)
  else
    redis.call('PEXPIRE', key, ttl)
  end
end
return redis.call('PUBLISH', ARGV[2], ARGV[3])
"""
_ADVANCE_SHA: Final = hashlib.sha1(_ADVANCE_SCRIPT.encode("ascii")).hexdigest()

# Kept under these names for the tests and the code that imported them from here.
_CONNECTION_ERRORS: Final = CONNECTION_ERRORS
_CONNECTION_LOST: Final = CONNECTION_LOST
_closed_transport: Final = closed_transport


class RedisTriggersError(PurgatoryError):
    """Redis could not be reached or refused the connection (message redacted)."""


class RedisTriggersClosedError(RedisTriggersError, RuntimeError):
    """Use of a RedisTriggers before ``async with`` or after ``aclose()``."""


@dataclass(frozen=True, slots=True)
class RedisTriggersStatistics:
    """A snapshot of one RedisTriggers' counters (running totals since construction).

    Attributes:
        channel: the Redis channel.
        instance: this instance's id (its messages carry it).
        purgatory: the local purgatory's name, or None for a publisher only.
        connected: the subscription is up (publisher only: the last command
            to Redis succeeded).
        reconnects: successful re-subscriptions after a lost connection.
        connection_errors: connection attempts and connections that failed.
        triggers: ``check_and_complete``/``advance`` calls on this instance.
        pending: triggers gathered and not yet sent (distinct keys); after
            ``aclose()``, those it could not send.
        published: messages published (one per batch, or per
            :data:`MAX_MESSAGE_TRIGGERS` triggers).
        publish_errors: attempts to send a batch that failed (it is kept and retried).
        received: messages from other processes.
        echoes: this instance's own messages coming back (skipped).
        malformed: messages on the channel this version cannot read (skipped).
        applied: triggers from other processes applied to the local purgatory.
        completed: operations those triggers and the resyncs completed.
        resyncs: times the stored watermarks of the watched keys were read and applied.
        last_error: the last error, as ``"Type: message"`` without any password,
            or None.
        reads: round trips that read stored watermarks (the keys watched through
            :meth:`RedisTriggers.watch` in one loop iteration, a resync, the
            fetches of one iteration: one each).
        read_errors: those that failed (each is retried; a failed fetch is the
            caller's error).
    """

    channel: str
    instance: str
    purgatory: str | None
    connected: bool
    reconnects: int
    connection_errors: int
    triggers: int
    pending: int
    published: int
    publish_errors: int
    received: int
    echoes: int
    malformed: int
    applied: int
    completed: int
    resyncs: int
    last_error: str | None
    reads: int = 0
    read_errors: int = 0


def _positive(value: object, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{argument} must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{argument} must be positive and finite, got {value!r}")
    return float(value)


def _cause(exc: BaseException) -> str:
    """A short name for why a connection failed, for the one-line error."""
    text = str(exc)
    if isinstance(exc, AuthenticationError | AuthorizationError) or any(
        marker in text for marker in ("WRONGPASS", "NOAUTH", "invalid password", "NOPERM")
    ):
        return "authentication failed"
    if isinstance(exc, asyncio.TimeoutError) or "Timeout" in type(exc).__name__:
        return "timed out"
    return "unreachable"


class RedisTriggers:
    """Triggers of a purgatory shared with every process subscribed to a Redis channel.

    ``check_and_complete(key)`` and ``advance(key, value)`` apply to the local
    purgatory at once and are published to the channel; a subscriber task applies
    what other processes publish to this process's purgatory. Three Redis
    connections per instance (a subscription, a sender's, a reader's), its own,
    however many operations wait; a connection that died (Redis restarted) is
    replaced before use. Triggers of
    one loop iteration leave as one message; advances of one key in it keep the
    highest value. Watermarks are also stored in Redis (atomic max, expiring
    ``watermark_ttl`` seconds after their last advance) and re-read for every
    watched key whenever the subscription (re)starts, so a message missed while
    disconnected costs a delay until the reconnect, never more.

    Use as an async context manager (``async with RedisTriggers(...) as t:``): entering
    connects (and subscribes) once and raises :class:`RedisTriggersError` if Redis is
    unreachable, refuses the credentials or does not answer within
    ``command_timeout``; leaving (or ``aclose()``)
    sends what is pending, unsubscribes and closes the connections it opened.
    After a successful start, connection losses are retried forever with
    backoff; see :meth:`statistics`.

    Only asyncio event loops (uvloop included) are supported: redis-py's client is
    asyncio-only, so constructing or entering one under trio raises RuntimeError.

    Args:
        purgatory: the local purgatory to apply triggers to, or None for a
            publisher only (it does not subscribe).
        url_or_client: a Redis URL (``redis://[[user]:password@]host[:port][/db]``,
            ``rediss://`` for TLS, ``unix://``; redis-py's ``from_url``) or a
            ``redis.asyncio.Redis`` client. Of a client passed in, only its
            connection settings are used (its pool is the application's: the
            instance opens its own connections); it is not closed.
        channel: the Redis channel (default ``"aiopurgatory"``); processes that
            share triggers use the same one. Its watermarks are stored under
            ``{channel}:wm:*``.
        watermark_ttl: seconds a stored watermark lives after its last advance
            (default one day).
        health_check_interval: seconds of silence on the subscription after
            which a PING is sent; no reply within as long again means the
            connection is dead (default 5).
        reconnect_delay: the first and the longest delay between reconnection
            attempts, in seconds (default 0.1 and 10); each wait is drawn
            between half and all of ``min(longest, first * 2**attempt)``.
        close_timeout: seconds ``aclose()`` waits for pending triggers to be
            sent before dropping them (default 5).
        command_timeout: seconds any one call to Redis may take, its connect
            included (a publish, a read, entering, a subscription); past it the
            connection is taken for dead, dropped and the call retried later
            (default 5). It never holds :meth:`watch`, which waits for its
            operation only.
        logger: a structlog-compatible logger (default: the library's).

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: a duration is not positive and finite; an empty channel.
        RuntimeError: constructed under trio.
    """

    def __init__(
        self,
        purgatory: Purgatory[Any] | None,
        url_or_client: str | aioredis.Redis,
        *,
        channel: str | None = None,
        watermark_ttl: float = 86_400.0,
        health_check_interval: float = 5.0,
        reconnect_delay: tuple[float, float] = (0.1, 10.0),
        close_timeout: float = 5.0,
        command_timeout: float = 5.0,
        logger: Any | None = None,
    ) -> None:
        if current_backend() == "trio":
            raise RuntimeError(
                "aiopurgatory.redis.RedisTriggers needs an asyncio event loop (asyncio or "
                "uvloop): redis-py's client is asyncio-only. Under trio, run the Redis side in "
                "an asyncio process, or call Purgatory.advance_threadsafe from an asyncio thread."
            )
        if purgatory is not None and not isinstance(purgatory, Purgatory):
            raise TypeError(
                "purgatory must be an aiopurgatory.Purgatory or None, "
                f"got {type(purgatory).__name__}"
            )
        if channel is None:
            channel = DEFAULT_CHANNEL
        elif not isinstance(channel, str):
            raise TypeError(f"channel must be a str or None, got {type(channel).__name__}")
        elif not channel:
            raise ValueError("channel must not be empty")
        ttl = _positive(watermark_ttl, "watermark_ttl")
        health = _positive(health_check_interval, "health_check_interval")
        if not isinstance(reconnect_delay, tuple) or len(reconnect_delay) != 2:
            raise TypeError("reconnect_delay must be a tuple (first, longest) of seconds")
        first = _positive(reconnect_delay[0], "reconnect_delay[0]")
        longest = _positive(reconnect_delay[1], "reconnect_delay[1]")
        if longest < first:
            raise ValueError(f"reconnect_delay must be (first, longest), got {reconnect_delay!r}")
        close_wait = _positive(close_timeout, "close_timeout")
        call_timeout = _positive(command_timeout, "command_timeout")
        if logger is not None and not callable(getattr(logger, "bind", None)):
            raise TypeError(
                f"logger must be a structlog-compatible logger (with bind()), "
                f"got {type(logger).__name__}"
            )

        self._id = f"{os.getpid()}-{secrets.token_hex(4)}"
        if isinstance(url_or_client, str):
            self._redactor = Redactor(_url_password(url_or_client))
            self._where = describe_url(url_or_client)
            try:
                # Only the URL's settings are used (see _connection_factory): no
                # connection is ever taken from this pool.
                pool = aioredis.ConnectionPool.from_url(
                    url_or_client, socket_connect_timeout=call_timeout
                )
            except ValueError as exc:
                raise ValueError(
                    f"url_or_client: not a usable Redis URL ({self._redactor.error(exc)})"
                ) from None
        elif isinstance(url_or_client, aioredis.Redis):
            pool = url_or_client.connection_pool
            kwargs = pool.connection_kwargs
            self._redactor = Redactor(kwargs.get("password"))
            self._where = _describe_client(kwargs)
        else:
            raise TypeError(
                "url_or_client must be a Redis URL (str) or a redis.asyncio.Redis client, "
                f"got {type(url_or_client).__name__}"
            )
        self._pool: aioredis.ConnectionPool = pool
        self._purgatory = purgatory
        self._advance_local: Callable[[Hashable, float], int] | None = (
            None if purgatory is None else purgatory.advance
        )
        self._channel = channel
        self._channel_bytes = channel.encode("utf-8", "surrogatepass")
        self._prefix = watermark_prefix(channel)
        self._ttl_ms = str(max(1, round(ttl * 1000))).encode("ascii")
        self._health_check_interval = health
        self._reconnect_first = first
        self._reconnect_longest = longest
        self._close_timeout = close_wait
        self._command_timeout = call_timeout
        base_logger = LazyLogger() if logger is None else logger
        self._logger: Any = base_logger.bind(channel=channel, instance=self._id)
        # The library's own connections, one per job, none shared with the
        # application: the sender's, the reader's, and the subscriber's (made in
        # _subscribe; it is not a Link: it only listens).
        self._sender_link = Link(self._connection_factory("pub"), call_timeout)
        self._new_subscriber_connection = self._connection_factory("sub")
        self._reader = WatermarkReader(
            purgatory,
            Link(self._connection_factory("read"), call_timeout),
            self._prefix,
            backoff=self._backoff,
            record_error=self._record_error,
            logger=self._logger,
        )

        self._state = "new"  # -> "running" -> "closing" -> "closed"
        self._pending = Batch()
        self._pending_waiters: list[asyncio.Future[None]] = []
        self._inflight_waiters: list[asyncio.Future[None]] = []
        self._inflight = 0
        self._wakeup: asyncio.Event | None = None
        self._sender: asyncio.Task[None] | None = None
        self._subscriber: asyncio.Task[None] | None = None
        self._reading: asyncio.Task[None] | None = None  # runs the reader
        self._connection: Any = None  # the subscriber's redis.asyncio.Connection
        self._replies = 0  # replies read on it (the watchdog watches this count)
        self._health_failure: BaseException | None = None

        self._connected = False
        self._reconnects = 0
        self._connection_errors = 0
        self._triggers = 0
        self._published = 0
        self._publish_errors = 0
        self._received = 0
        self._echoes = 0
        self._malformed = 0
        self._applied = 0
        self._completed = 0
        self._last_error: str | None = None

    # -- public API ------------------------------------------------------------------

    @property
    def channel(self) -> str:
        """The Redis channel."""
        return self._channel

    @property
    def instance(self) -> str:
        """This instance's id (``<pid>-<random hex>``), carried by its messages."""
        return self._id

    @property
    def purgatory(self) -> Purgatory[Any] | None:
        """The local purgatory, or None for a publisher only."""
        return self._purgatory

    @property
    def connected(self) -> bool:
        """The subscription is up (publisher only: the last command to Redis succeeded)."""
        return self._connected

    def __repr__(self) -> str:
        role = "publisher" if self._purgatory is None else f"purgatory={self._purgatory.name!r}"
        link = "connected" if self._connected else "disconnected"
        return (
            f"<RedisTriggers channel={self._channel!r} redis={self._where} {role} "
            f"{self._state} {link}>"
        )

    def check_and_complete(self, key: Key) -> int:
        """Check ``key``'s watchers here at once, and in every process on the channel.

        Returns:
            How many operations of the local purgatory this call completed.

        Raises:
            TypeError: ``key`` is not a str, bytes or int (bool is refused too);
                nothing is applied or sent.
            RedisTriggersClosedError: before ``async with`` or after ``aclose()``.
        """
        key = check_key(key)
        self._check_running()
        purgatory = self._purgatory
        completed = 0 if purgatory is None else purgatory.check_and_complete(key)
        self._pending.check(key)
        self._triggers += 1
        self._wakeup.set()  # type: ignore[union-attr]  # set while running
        return completed

    def advance(self, key: Key, value: Value) -> int:
        """Raise ``key``'s watermark to ``value`` here at once, in Redis and in every process.

        Args:
            key: a str, bytes or int.
            value: an int or float, finite, within +-2**53 (Redis compares them
                as doubles).

        Returns:
            How many operations of the local purgatory this call completed.

        Raises:
            TypeError: ``key`` or ``value`` has a type that cannot be sent
                (``bool`` included); nothing is applied or sent.
            ValueError: ``value`` is NaN, infinite, or an int beyond +-2**53.
            RedisTriggersClosedError: before ``async with`` or after ``aclose()``.
        """
        key = check_key(key)
        value = check_value(value)
        self._check_running()
        advance_local = self._advance_local
        completed = 0 if advance_local is None else advance_local(key, value)
        self._pending.advance(key, value)
        self._triggers += 1
        self._wakeup.set()  # type: ignore[union-attr]  # set while running
        return completed

    async def flush(self) -> None:
        """Wait until every trigger made so far has been sent to Redis.

        While Redis is unreachable this waits for it (the sender retries with
        backoff); wrap it in a timeout to bound the wait.

        Raises:
            RedisTriggersClosedError: the instance was closed before they were sent.
        """
        if self._state == "new":
            raise RedisTriggersClosedError("RedisTriggers is not started: use `async with`")
        if not self._pending and not self._inflight:
            return
        if self._state == "closed":
            raise RedisTriggersClosedError("RedisTriggers is closed: pending triggers were dropped")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._pending_waiters if self._pending else self._inflight_waiters).append(waiter)
        await waiter

    async def fetch_watermark(self, key: Key) -> Value | None:
        """The watermark of ``key`` stored in Redis, or None if none or expired.

        Useful before watching with a threshold in a process that had no
        watchers on ``key`` (a purgatory keeps watermarks only of watched keys).
        The fetches of one loop iteration share one read (with the reads of
        :meth:`watch`), on the instance's own connection. One attempt: it
        takes at most ``command_timeout`` once sent (twice that behind a read
        in flight).

        Raises:
            TypeError: ``key`` is not a str, bytes or int.
            RedisTriggersClosedError: before ``async with`` or after ``aclose()``
                (also when closed while it waits).
            RedisTriggersError: Redis could not be read (message redacted).
        """
        key = check_key(key)
        self._check_running()
        failure: str | None = None
        try:
            value = await self._reader.fetch(key)
        except RedisTriggersClosedError:
            raise
        except Exception as exc:
            failure = self._redactor.error(exc)
        if failure is not None:
            raise RedisTriggersError(f"cannot read the watermark from {self._where}: {failure}")
        return value

    async def watch(self, op: Any, keys: Iterable[Hashable] | Mapping[Hashable, float]) -> Outcome:
        """:meth:`Purgatory.watch` in the local purgatory, caught up with Redis.

        Watches ``op`` (as ``purgatory.watch(op, keys)``: the same arguments,
        errors and cancellation: cancelling the awaiting task cancels the op),
        then has the stored watermarks of its keys read and the local purgatory
        advanced to them. A purgatory keeps watermarks of watched keys only, so
        an advance that reached this process just before the watch left nothing
        here; reading after watching closes that gap (an advance after the read
        arrives through the subscription). The keys of every watch of one loop
        iteration are read together (one round trip, on the instance's own
        connection), and the watch does not wait for the read but for its
        operation, which the read may complete: a slow or hung Redis never holds
        the caller past the op's own timeout. A read that fails is retried
        (counted in ``read_errors``) until it succeeds or the op has ended.

        Returns:
            ``Outcome.COMPLETED``, ``EXPIRED`` or ``CANCELLED``, as ``Purgatory.watch``.

        Raises:
            TypeError: a key cannot cross the wire (not a str, bytes or int, as
                :meth:`advance` refuses it: a tuple, a bool...), before anything
                is watched; and whatever ``Purgatory.watch`` raises.
            RedisTriggersClosedError: before ``async with`` or after ``aclose()``,
                or on a publisher only (there is no purgatory to watch in).
        """
        self._check_running()
        purgatory = self._purgatory
        if purgatory is None:
            raise RedisTriggersClosedError("a publisher-only RedisTriggers has no purgatory")
        if isinstance(keys, Mapping):
            keys = dict(keys)
            wire = [check_key(key) for key in keys]
        elif isinstance(keys, str | bytes | tuple):
            wire = []  # refused by the purgatory, with its own message
        else:
            keys = list(keys)  # it is read twice
            wire = [check_key(key) for key in keys]
        if purgatory.try_complete_else_watch(op, keys):
            return Outcome.COMPLETED
        self._reader.want(wire)
        try:
            outcome: Outcome = await op
        except asyncio.CancelledError:
            op.cancel()
            raise
        return outcome

    def statistics(self) -> RedisTriggersStatistics:
        """A snapshot of the counters (see :class:`RedisTriggersStatistics`)."""
        return RedisTriggersStatistics(
            channel=self._channel,
            instance=self._id,
            purgatory=None if self._purgatory is None else self._purgatory.name,
            connected=self._connected,
            reconnects=self._reconnects,
            connection_errors=self._connection_errors,
            triggers=self._triggers,
            pending=len(self._pending) + self._inflight,
            published=self._published,
            publish_errors=self._publish_errors,
            received=self._received,
            echoes=self._echoes,
            malformed=self._malformed,
            applied=self._applied,
            completed=self._completed + self._reader.completed,
            resyncs=self._reader.resyncs,
            last_error=self._last_error,
            reads=self._reader.reads,
            read_errors=self._reader.read_errors,
        )

    async def __aenter__(self) -> Self:
        if current_backend() == "trio":
            raise RuntimeError("aiopurgatory.redis.RedisTriggers needs an asyncio event loop")
        if self._state != "new":
            raise RedisTriggersClosedError("a RedisTriggers can be entered once")
        failure: BaseException | None = None
        connection: Any = None
        try:
            # The whole start is one call to Redis for command_timeout.
            async with asyncio.timeout(self._command_timeout):
                with _CONNECTION_LOST:
                    reply = (await self._sender_link.execute(("PING",)))[0]
                    if isinstance(reply, Exception):
                        raise reply
                    if self._purgatory is not None:
                        connection = await self._subscribe()
                        await self._reader.serve(resync=True)
        except TimeoutError:
            failure = TimeoutError(f"no answer within {self._command_timeout:g} s")
        except _CONNECTION_ERRORS as exc:
            failure = exc
        except BaseException:  # cancelled while connecting: leave nothing open
            if connection is not None:
                await connection.disconnect(nowait=True)
            await self._close_connections()
            self._state = "closed"
            raise
        if failure is not None:
            # Raised outside the except block: no chained redis-py exception
            # (whose text we do not control) travels with ours.
            message = (
                f"cannot connect to Redis at {self._where}: {_cause(failure)} "
                f"({self._redactor.error(failure)})"
            )
            self._last_error = self._redactor.error(failure)
            self._connection_errors += 1
            failure = None
            if connection is not None:
                await connection.disconnect(nowait=True)
            await self._close_connections()
            self._state = "closed"
            raise RedisTriggersError(message)
        self._connection = connection
        self._connected = True
        self._wakeup = asyncio.Event()
        self._state = "running"
        self._sender = asyncio.create_task(
            self._send_loop(), name=f"aiopurgatory-redis-send-{self._id}"
        )
        self._sender.add_done_callback(self._task_ended)
        self._reading = asyncio.create_task(
            self._reader.run(), name=f"aiopurgatory-redis-read-{self._id}"
        )
        self._reading.add_done_callback(self._task_ended)
        if connection is not None:
            self._subscriber = asyncio.create_task(
                self._subscribe_loop(connection), name=f"aiopurgatory-redis-sub-{self._id}"
            )
            self._subscriber.add_done_callback(self._task_ended)
        self._logger.info("aiopurgatory.redis.started", redis=self._where)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Send what is pending (up to ``close_timeout`` seconds), unsubscribe, disconnect.

        Idempotent. Pending triggers that could not be sent in time are dropped
        (logged with their number; their ``flush()`` waiters get
        :class:`RedisTriggersClosedError`). A client passed in is left open.
        Takes at most ``close_timeout`` plus a few loop iterations.
        """
        if self._state in ("closing", "closed"):
            return
        if self._state == "new":
            self._state = "closed"
            return
        self._state = "closing"
        dropped = 0
        try:
            if self._pending or self._inflight:
                try:
                    await asyncio.wait_for(self._drain(), self._close_timeout)
                except TimeoutError:
                    dropped = len(self._pending) + self._inflight
        finally:
            # Also when the closing task is cancelled: nothing is left running.
            tasks = [t for t in (self._subscriber, self._sender, self._reading) if t is not None]
            for task in tasks:
                task.cancel()
            for task in tasks:
                # A task that died of a bug was logged by _task_ended already.
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            connection, self._connection = self._connection, None
            if connection is not None:
                await connection.disconnect(nowait=True)
            await self._close_connections()
            self._reader.fail_fetches(
                RedisTriggersClosedError("RedisTriggers closed before the watermark was read")
            )
            self._connected = False
            self._state = "closed"
        for waiter in (*self._inflight_waiters, *self._pending_waiters):
            if not waiter.done():
                waiter.set_exception(
                    RedisTriggersClosedError("RedisTriggers closed before the triggers were sent")
                )
        self._inflight_waiters = []
        self._pending_waiters = []
        if dropped:
            self._logger.warning("aiopurgatory.redis.dropped_on_close", triggers=dropped)
        self._logger.info("aiopurgatory.redis.closed")

    # -- internals -------------------------------------------------------------------

    def _check_running(self) -> None:
        if self._state != "running":
            raise RedisTriggersClosedError(
                "RedisTriggers is not started: use `async with`"
                if self._state == "new"
                else "RedisTriggers is closed"
            )

    async def _close_connections(self) -> None:
        """Close the sender's and the reader's connections (the subscriber's is apart)."""
        await self._sender_link.drop()
        await self._reader.drop()

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        # The loops end only when aclose() cancels them; anything else is a bug,
        # and must not go unnoticed.
        if task.cancelled():
            return
        exc = task.exception()  # retrieved in every case: never "never retrieved"
        if self._state != "running":
            return
        self._last_error = "ended" if exc is None else self._redactor.error(exc)
        self._connected = False
        self._logger.error(
            "aiopurgatory.redis.task_ended", task=task.get_name(), error=self._last_error
        )

    def _record_error(self, exc: BaseException) -> str:
        text = self._redactor.error(exc)
        self._last_error = text
        self._connection_errors += 1
        return text

    def _backoff(self, attempt: int) -> float:
        ceiling = min(self._reconnect_longest, self._reconnect_first * 2 ** min(attempt - 1, 30))
        return random.uniform(ceiling / 2, ceiling)

    async def _drain(self) -> None:
        while self._pending or self._inflight:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            (self._pending_waiters if self._pending else self._inflight_waiters).append(waiter)
            await waiter

    # The sender -------------------------------------------------------------------

    async def _send_loop(self) -> None:
        wakeup = self._wakeup
        assert wakeup is not None
        failures = 0
        while True:
            await wakeup.wait()
            wakeup.clear()
            while self._pending:
                batch, self._pending = self._pending, Batch()
                waiters, self._pending_waiters = self._pending_waiters, []
                self._inflight = len(batch)
                self._inflight_waiters = waiters
                try:
                    with _CONNECTION_LOST:
                        await self._send(batch)
                except _CONNECTION_ERRORS as exc:
                    failures += 1
                    self._publish_errors += 1
                    text = self._record_error(exc)
                    if self._purgatory is None:
                        self._connected = False
                    if failures == 1:
                        self._logger.warning(
                            "aiopurgatory.redis.publish_failed", error=text, triggers=len(batch)
                        )
                    # Keep the batch, ahead of what came since; retry after a backoff.
                    batch.merge(self._pending)
                    self._pending = batch
                    self._pending_waiters = self._inflight_waiters + self._pending_waiters
                    self._inflight = 0
                    self._inflight_waiters = []
                    await asyncio.sleep(self._backoff(failures))
                    continue
                except Exception as exc:  # a bug: never end the sender silently
                    self._publish_errors += 1
                    self._last_error = self._redactor.error(exc)
                    self._logger.error(
                        "aiopurgatory.redis.send_failed",
                        error=self._last_error,
                        triggers=len(batch),
                    )
                if failures:
                    self._logger.warning("aiopurgatory.redis.publish_resumed", attempts=failures)
                    failures = 0
                if self._purgatory is None:
                    self._connected = True
                self._inflight = 0
                self._inflight_waiters = []
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)

    async def _send(self, batch: Batch) -> None:
        prefix = self._prefix
        link = self._sender_link
        for part in batch.split(MAX_MESSAGE_TRIGGERS):
            message = encode(self._id, part)
            if part.advances:
                await link.script(
                    _ADVANCE_SHA,
                    _ADVANCE_SCRIPT,
                    [redis_key(prefix, key) for key in part.advances],
                    [
                        self._ttl_ms,
                        self._channel_bytes,
                        message,
                        *map(stored, part.advances.values()),
                    ],
                )
            else:
                reply = (await link.execute(("PUBLISH", self._channel_bytes, message)))[0]
                if isinstance(reply, Exception):
                    raise reply
            self._published += 1

    # The subscriber ----------------------------------------------------------------

    def _connection_factory(self, role: str) -> Callable[[], Any]:
        """Makes new connections for ``role`` with the URL's (or the client's) settings."""
        pool = self._pool
        options = dict(pool.connection_kwargs)
        options.update(
            # The connections are ours: RESP2 replies, bytes, no retries inside
            # redis-py (our loops retry, reconnect and resync), keep-alive, a
            # name that shows in CLIENT LIST.
            protocol=2,
            decode_responses=False,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
            socket_keepalive=True,
            client_name=f"aiopurgatory-{role}-{self._id}",
            # No socket timeout of redis-py's: every call is bounded by our own
            # asyncio.timeout (command_timeout). With one, redis-py wraps each
            # write in asyncio.wait_for, which on Python 3.11 can swallow a
            # cancellation that comes as the write completes (seen here: aclose()
            # then waited forever for a task it had cancelled).
            socket_timeout=None,
        )
        connection_class = pool.connection_class
        return lambda: connection_class(**options)

    async def _subscribe(self) -> Any:
        """A new connection subscribed to the channel (the subscription confirmed).

        Bounded by ``command_timeout``, the connect included.
        """
        connection = self._new_subscriber_connection()
        try:
            try:
                async with asyncio.timeout(self._command_timeout):
                    await connection.connect()
                    await connection.send_command(
                        "SUBSCRIBE", self._channel_bytes, check_health=False
                    )
                    reply = await connection.read_response(timeout=math.inf)
            except TimeoutError:
                raise TimeoutError(
                    f"no reply to SUBSCRIBE within {self._command_timeout:g} s"
                ) from None
            if not (isinstance(reply, list) and reply and reply[0] == b"subscribe"):
                raise RedisError(f"unexpected reply to SUBSCRIBE: {reply!r:.80}")
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        return connection

    async def _subscribe_loop(self, connection: Any) -> None:
        attempt = 0
        logged_failure: str | None = None
        while True:
            if connection is None:
                try:
                    with _CONNECTION_LOST:
                        connection = await self._subscribe()
                        self._connection = connection
                except _CONNECTION_ERRORS as exc:
                    if connection is not None:
                        await connection.disconnect(nowait=True)
                        connection = self._connection = None
                    attempt += 1
                    text = self._record_error(exc)
                    # Once per distinct cause (refused while Redis restarts, then
                    # a wrong password...): an outage is a few lines, not one per try.
                    log = self._logger.debug if text == logged_failure else self._logger.warning
                    logged_failure = text
                    log("aiopurgatory.redis.reconnect_failed", error=text, attempt=attempt)
                    await asyncio.sleep(self._backoff(attempt))
                    continue
                self._reconnects += 1
                self._connected = True
                # Subscribed first, read next: nothing published in between is missed.
                self._reader.request_resync()
                self._logger.warning("aiopurgatory.redis.reconnected", attempts=attempt + 1)
                attempt = 0
                logged_failure = None
            try:
                with _CONNECTION_LOST:
                    await self._listen(connection)
            except _CONNECTION_ERRORS as exc:
                text = self._record_error(exc)
                self._logger.warning("aiopurgatory.redis.disconnected", error=text)
            except Exception as exc:  # a bug: log it, reconnect, never end silently
                text = self._record_error(exc)
                self._logger.error("aiopurgatory.redis.subscriber_failed", error=text)
            self._connected = False
            await connection.disconnect(nowait=True)
            connection = self._connection = None
            # Even the first attempt waits a little, so a restarted Redis is
            # not hit by every process at once.
            attempt = 1
            await asyncio.sleep(self._backoff(attempt))

    async def _listen(self, connection: Any) -> None:
        """Apply messages until the connection fails (this only returns by raising).

        The read has no timeout (a timeout per read would cost more than the
        rest of a message's handling); a watchdog task looks at the count of
        replies read instead, once per health-check interval.
        """
        read = connection.read_response
        on_message = self._on_message
        self._health_failure = None
        watchdog = asyncio.create_task(self._watchdog(connection))
        watchdog.add_done_callback(self._watchdog_ended)
        try:
            while True:
                response = await read(timeout=math.inf)
                self._replies += 1
                if type(response) is list and len(response) == 3 and response[0] == b"message":
                    on_message(response[2])
        except BaseException:
            failure = self._health_failure
            if failure is not None:
                raise failure from None
            raise
        finally:
            watchdog.cancel()

    async def _watchdog(self, connection: Any) -> None:
        """PING after an interval of silence; end the connection after a second one."""
        interval = self._health_check_interval
        seen = self._replies
        pinged = False
        while True:
            await asyncio.sleep(interval)
            if self._replies != seen:
                seen = self._replies
                pinged = False
            elif not pinged:
                pinged = True
                # A failed send: the reader sees the broken connection too.
                with contextlib.suppress(*_CONNECTION_ERRORS), _CONNECTION_LOST:
                    await connection.send_command("PING", check_health=False)
            else:
                self._health_failure = TimeoutError(
                    f"no reply to a health-check PING within {interval:g} s"
                )
                # The reader, blocked in its read, fails on the closed connection.
                await connection.disconnect(nowait=True)
                return

    def _watchdog_ended(self, task: asyncio.Task[None]) -> None:
        # Its failures are the connection's (the reader sees them); a bug is logged.
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._last_error = self._redactor.error(exc)
            self._logger.error("aiopurgatory.redis.watchdog_failed", error=self._last_error)

    def _on_message(self, data: bytes) -> None:
        try:
            sender, checks, advances = decode(data)
        except MalformedMessage as exc:
            self._malformed += 1
            if self._malformed == 1:
                self._logger.warning("aiopurgatory.redis.malformed_message", error=str(exc))
            return
        if sender == self._id:
            self._echoes += 1
            return
        self._received += 1
        purgatory = self._purgatory
        advance_local = self._advance_local
        if purgatory is None or advance_local is None or purgatory.closed:
            return
        completed = 0
        try:
            for key, value in advances:
                completed += advance_local(key, value)
            check = purgatory.check_and_complete
            for key in checks:
                completed += check(key)
        except Exception as exc:  # a bug (callbacks' failures are contained by the purgatory)
            self._last_error = self._redactor.error(exc)
            self._logger.error("aiopurgatory.redis.apply_failed", error=self._last_error)
        self._applied += len(advances) + len(checks)
        self._completed += completed


def _url_password(url: str) -> str | None:
    from urllib.parse import unquote, urlsplit

    try:
        password = urlsplit(url).password
    except ValueError:
        return None
    return None if password is None else unquote(password)


def _describe_client(kwargs: dict[str, Any]) -> str:
    if "path" in kwargs:
        where = f"unix://{kwargs['path']}"
    else:
        where = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    user = kwargs.get("username") or ""
    auth = f"{user}:***@" if kwargs.get("password") else (f"{user}@" if user else "")
    return f"redis://{auth}{where}/{kwargs.get('db', 0)}"
