"""RedisTriggers: a purgatory's triggers shared by every process through Redis.

How it works (the docs page ``distributed.md`` has the user's view). The work is
split by job, one module each, and this class ties them together and keeps the
lifecycle (:class:`_State`):

* :mod:`._partitions`: which channel carries a key's triggers and which Redis
  key stores its watermark (a channel's keys are spread over partitions).
* :mod:`._publisher`: ``check_and_complete(key)`` / ``advance(key, value)`` apply
  to the local purgatory at once, then join the *pending batch*; a sender task
  sends the batch of one loop iteration in one round trip (one message per
  partition, advances through the atomic-max script), keeps and retries it on
  failure.
* :mod:`._subscriber`: subscribes to the partitions of the keys the purgatory
  watches (and no others), proves with a canary that the subscription delivers,
  renews it when it does not, and applies what other processes publish.
* :mod:`._reader`: the one path that reads stored watermarks, for the catch-up
  of a new watch, the resync after a (re)subscription, and ``fetch_watermark()``.
* :mod:`._link`: the library's own connections (one per job, never redis-py's
  pool, which runs out under many concurrent callers and hands out connections
  that died while Redis was away), every call bounded by ``command_timeout``.

Every message carries the sender's instance id; a process's own messages come
back to it only if it watches their keys, and are skipped (they were applied
locally already).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import math
import os
import random
import secrets
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, AuthorizationError

from .._detect import current_backend
from .._errors import PurgatoryError
from .._logging import LazyLogger
from .._operation import Outcome
from .._purgatory import Purgatory
from .._validation import as_seconds
from ._cluster import ClusterLink, ShardedSubscription, SlotMap, seeds_of_client
from ._link import CONNECTION_ERRORS, CONNECTION_LOST, Link, closed_transport
from ._partitions import DEFAULT_PARTITIONS, Partitions, check_partitions
from ._publisher import MAX_MESSAGE_TRIGGERS, Sender
from ._reader import WatermarkReader
from ._redact import Redactor, describe_client, describe_url, url_password
from ._subscriber import Subscriber
from ._topology import Target, describe_pool, target_for_url
from ._wire import Key, Value, check_key, check_value

__all__ = [
    "DEFAULT_CHANNEL",
    "DEFAULT_PARTITIONS",
    "MAX_MESSAGE_TRIGGERS",
    "RedisTriggers",
    "RedisTriggersClosedError",
    "RedisTriggersError",
    "RedisTriggersStatistics",
]

#: The channel used when none is given.
DEFAULT_CHANNEL: Final = "aiopurgatory"

# Kept under these names for the tests and the code that imported them from here.
_CONNECTION_ERRORS: Final = CONNECTION_ERRORS
_CONNECTION_LOST: Final = CONNECTION_LOST
_closed_transport: Final = closed_transport


class RedisTriggersError(PurgatoryError):
    """Redis could not be reached or refused the connection (message redacted)."""


class RedisTriggersClosedError(RedisTriggersError, RuntimeError):
    """Use of a RedisTriggers before ``async with`` or after ``aclose()``."""


class _State(enum.Enum):
    """A RedisTriggers' lifecycle: NEW -> RUNNING -> CLOSING -> CLOSED (or NEW -> CLOSED)."""

    NEW = "new"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


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
        published: messages published (one per partition of a batch, or per
            :data:`MAX_MESSAGE_TRIGGERS` triggers).
        publish_errors: attempts to send a batch that failed (it is kept and retried).
        received: messages from other processes (only those of the partitions
            of keys watched here reach a process).
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
        subscribed: partition channels subscribed now (0 for a publisher only,
            or a process watching nothing).
        deaf_detected: times the subscription was found connected but not
            delivering (its canary did not come back) and renewed.
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
    subscribed: int = 0
    deaf_detected: int = 0


def check_channel(channel: object) -> str:
    """``channel``, or :data:`DEFAULT_CHANNEL` for None; TypeError/ValueError otherwise."""
    if channel is None:
        return DEFAULT_CHANNEL
    if not isinstance(channel, str):
        raise TypeError(f"channel must be a str or None, got {type(channel).__name__}")
    if not channel:
        raise ValueError("channel must not be empty")
    return channel


def _positive(value: object, argument: str) -> float:
    """:func:`as_seconds`, above zero: the timeouts and intervals of this package."""
    try:
        seconds = as_seconds(value, argument)
    except ValueError:
        seconds = math.nan  # NaN or infinite: the one message below
    if not seconds > 0:
        raise ValueError(f"{argument} must be positive and finite, got {value!r}")
    return seconds


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
    what other processes publish to this process's purgatory. A channel's keys
    are spread over ``partitions`` partition channels, and a process subscribes
    only to the partitions of the keys its purgatory watches: a process that
    watches nothing receives no trigger. Three Redis connections per instance
    (a subscription, a sender's, a reader's), its own, however many operations
    wait; a connection that died (Redis restarted) is replaced before use.
    Triggers of one loop iteration leave in one round trip (a message per
    partition); advances of one key in it keep the highest value. Watermarks are
    also stored in Redis (atomic max, expiring ``watermark_ttl`` seconds after
    their last advance) and re-read for every watched key whenever the
    subscription (re)starts, so a message missed while disconnected costs a
    delay until the reconnect, never more.

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
            ``rediss://`` for TLS, ``unix://``; redis-py's ``from_url``), a
            Sentinel-managed primary's
            (``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]``,
            ``rediss+sentinel://`` for TLS), or a ``redis.asyncio.Redis``
            client (a Sentinel-managed one too). Of a client passed in, only
            its connection settings are used (its pool is the application's:
            the instance opens its own connections); it is not closed.
        channel: the Redis channel (default ``"aiopurgatory"``); processes that
            share triggers use the same one. Its partitions' channels are
            ``{<tag>}<channel>:t`` and its watermarks are stored under
            ``{<tag>}<channel>:wm:*`` (one hash tag per partition).
        watermark_ttl: seconds a stored watermark lives after its last advance
            (default one day).
        health_check_interval: seconds of silence on the subscription after
            which a PING goes down it and a canary message is published to this
            instance's own canary channel; no PONG within as long again means
            the connection is dead, a PONG without the canary that it is deaf
            (``deaf_detected``); either way it is renewed (default 5).
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
        partitions: how many partition channels a channel's keys are spread
            over (default 16,384, one per Redis Cluster slot); every process
            and :class:`SyncPublisher` on the channel must use the same.
        linger: seconds a partition stays subscribed after its last watched
            key is gone (default 5), so that short-lived keys do not subscribe
            and unsubscribe each time.
        sweep_interval: seconds between two looks at the purgatory's watched
            keys (default 0.25): a key watched on the purgatory directly, not
            through :meth:`watch`, has its partition subscribed within that
            long (and is then checked once, so no trigger is lost), and idle
            partitions are released.
        logger: a structlog-compatible logger (default: the library's).

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: a duration is not positive and finite; an empty channel;
            ``partitions`` not from 1 to 16,384.
        RuntimeError: constructed under trio.
    """

    def __init__(
        self,
        purgatory: Purgatory[Any] | None,
        url_or_client: str | aioredis.Redis | AsyncRedisCluster,
        *,
        channel: str | None = None,
        watermark_ttl: float = 86_400.0,
        health_check_interval: float = 5.0,
        reconnect_delay: tuple[float, float] = (0.1, 10.0),
        close_timeout: float = 5.0,
        command_timeout: float = 5.0,
        partitions: int = DEFAULT_PARTITIONS,
        linger: float = 5.0,
        sweep_interval: float = 0.25,
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
        channel = check_channel(channel)
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
        partition_count = check_partitions(partitions)
        linger_for = _positive(linger, "linger")
        sweep_every = _positive(sweep_interval, "sweep_interval")
        if logger is not None and not callable(getattr(logger, "bind", None)):
            raise TypeError(
                f"logger must be a structlog-compatible logger (with bind()), "
                f"got {type(logger).__name__}"
            )

        self._id = f"{os.getpid()}-{secrets.token_hex(4)}"
        if isinstance(url_or_client, str):
            self._redactor = Redactor(url_password(url_or_client))
            self._where = describe_url(url_or_client)
            try:
                # Only the URL's settings are used (see _connection_factory): no
                # connection is ever taken from this pool.
                target = target_for_url(url_or_client, call_timeout)
            except ValueError as exc:
                raise ValueError(
                    f"url_or_client: not a usable Redis URL ({self._redactor.error(exc)})"
                ) from None
            self._where = target.where or self._where
        elif isinstance(url_or_client, aioredis.Redis):
            pool = url_or_client.connection_pool
            target = Target(pool, "")
            kwargs = pool.connection_kwargs
            self._redactor = Redactor(kwargs.get("password"))
            self._where = describe_pool(pool) or describe_client(kwargs)
        elif isinstance(url_or_client, AsyncRedisCluster):
            seeds = seeds_of_client(url_or_client)
            target = Target(None, seeds.where, cluster=seeds)
            self._redactor = Redactor(seeds.options.get("password"))
            self._where = seeds.where
        else:
            given: object = url_or_client  # type: ignore[unreachable]
            kind = type(given).__name__
            raise TypeError(
                "url_or_client must be a Redis URL (str), a redis.asyncio.Redis or a "
                f"redis.asyncio.cluster.RedisCluster client, got {kind}"
            )
        self._target = target
        cluster = target.cluster
        if cluster is None:
            assert target.pool is not None
            self._options = dict(target.pool.connection_kwargs)
            self._connection_class: Any = target.pool.connection_class
        else:
            self._options = dict(cluster.options)
            self._options.setdefault("socket_connect_timeout", call_timeout)
            self._connection_class = self._options.pop("connection_class", None) or Connection
        self._purgatory = purgatory
        self._advance_local: Callable[[Hashable, float], int] | None = (
            None if purgatory is None else purgatory.advance
        )
        self._channel = channel
        self._partitions = Partitions(channel, partition_count, self._id)
        self._reconnect_first = first
        self._reconnect_longest = longest
        self._close_timeout = close_wait
        self._command_timeout = call_timeout
        base_logger = LazyLogger() if logger is None else logger
        self._logger: Any = base_logger.bind(channel=channel, instance=self._id)
        # The library's own connections, one per job, none shared with the
        # application: the sender's, the reader's, and the subscriber's.
        # On a cluster: one connection per master for each job, routed by slot.
        self._slots: SlotMap | None = None
        send_link: Link | ClusterLink
        read_link: Link | ClusterLink
        sub_factory: Callable[[], Any]
        if cluster is None:
            send_link = Link(self._connection_factory("pub"), call_timeout)
            read_link = Link(self._connection_factory("read"), call_timeout)
            sub_factory = self._connection_factory("sub")
        else:
            slots = self._slots = SlotMap(
                cluster.seeds, self._node_connection_factory("map"), call_timeout
            )
            send_link = ClusterLink(slots, self._node_connection_factory("pub"), call_timeout)
            read_link = ClusterLink(slots, self._node_connection_factory("read"), call_timeout)
            sub_connect = self._node_connection_factory("sub")
            sub_factory = lambda: ShardedSubscription(  # noqa: E731
                slots, sub_connect, self._partitions.control, self._partitions.canary
            )
        self._sender = Sender(
            self._id,
            send_link,
            self._partitions,
            ttl_ms=str(max(1, round(ttl * 1000))).encode("ascii"),
            publish=b"PUBLISH" if cluster is None else b"SPUBLISH",
            backoff=lambda attempt: self._backoff(attempt),
            record_error=self._record_error,
            record_bug=self._record_bug,
            on_result=self._published,
            logger=self._logger,
        )
        self._reader = WatermarkReader(
            purgatory,
            read_link,
            self._partitions.stored_key,
            partition_of=None if cluster is None else self._partitions.of,
            backoff=lambda attempt: self._backoff(attempt),
            record_error=self._record_error,
            logger=self._logger,
        )
        self._subscriber: Subscriber | None = (
            None
            if purgatory is None
            else Subscriber(
                self._id,
                purgatory,
                self._partitions,
                sub_factory,
                self._reader,
                self._sender,
                health_check_interval=health,
                command_timeout=call_timeout,
                linger=linger_for,
                sweep_interval=sweep_every,
                backoff=lambda attempt: self._backoff(attempt),
                record_error=self._record_error,
                record_bug=self._record_bug,
                logger=self._logger,
            )
        )

        self._state = _State.NEW
        self._tasks: list[asyncio.Task[None]] = []
        self._publisher_connected = False  # a publisher only: the last send succeeded
        self._connection_errors = 0
        self._triggers = 0
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
        subscriber = self._subscriber
        if self._state is not _State.RUNNING:
            return False
        return self._publisher_connected if subscriber is None else subscriber.connected

    def __repr__(self) -> str:
        role = "publisher" if self._purgatory is None else f"purgatory={self._purgatory.name!r}"
        link = "connected" if self.connected else "disconnected"
        return (
            f"<RedisTriggers channel={self._channel!r} redis={self._where} {role} "
            f"{self._state.value} {link}>"
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
        sender = self._sender
        sender.pending.check(key)
        self._triggers += 1
        sender.wakeup.set()
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
        sender = self._sender
        sender.pending.advance(key, value)
        self._triggers += 1
        sender.wakeup.set()
        return completed

    async def flush(self) -> None:
        """Wait until every trigger made so far has been sent to Redis.

        While Redis is unreachable this waits for it (the sender retries with
        backoff); wrap it in a timeout to bound the wait.

        Raises:
            RedisTriggersClosedError: the instance was closed before they were sent.
        """
        if self._state is _State.NEW:
            raise RedisTriggersClosedError("RedisTriggers is not started: use `async with`")
        if not self._sender:
            return
        if self._state is _State.CLOSED:
            raise RedisTriggersClosedError("RedisTriggers is closed: pending triggers were dropped")
        await self._sender.wait_sent()

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
        assert self._subscriber is not None  # there is a purgatory
        # Subscribed first (if its partition is not yet), read next.
        self._subscriber.need(wire)
        try:
            outcome: Outcome = await op
        except asyncio.CancelledError:
            op.cancel()
            raise
        return outcome

    def statistics(self) -> RedisTriggersStatistics:
        """A snapshot of the counters (see :class:`RedisTriggersStatistics`)."""
        sub = self._subscriber
        sender = self._sender
        reader = self._reader
        return RedisTriggersStatistics(
            channel=self._channel,
            instance=self._id,
            purgatory=None if self._purgatory is None else self._purgatory.name,
            connected=self.connected,
            reconnects=0 if sub is None else sub.reconnects,
            connection_errors=self._connection_errors,
            triggers=self._triggers,
            pending=len(sender),
            published=sender.published,
            publish_errors=sender.publish_errors,
            received=0 if sub is None else sub.received,
            echoes=0 if sub is None else sub.echoes,
            malformed=0 if sub is None else sub.malformed,
            applied=0 if sub is None else sub.applied,
            completed=reader.completed + (0 if sub is None else sub.completed),
            resyncs=reader.resyncs,
            last_error=self._last_error,
            reads=reader.reads,
            read_errors=reader.read_errors,
            subscribed=0 if sub is None else sub.subscribed,
            deaf_detected=0 if sub is None else sub.deaf_detected,
        )

    async def __aenter__(self) -> Self:
        if current_backend() == "trio":
            raise RuntimeError("aiopurgatory.redis.RedisTriggers needs an asyncio event loop")
        if self._state is not _State.NEW:
            raise RedisTriggersClosedError("a RedisTriggers can be entered once")
        failure: BaseException | None = None
        connection: Any = None
        try:
            # The whole start is one call to Redis for command_timeout.
            async with asyncio.timeout(self._command_timeout):
                with CONNECTION_LOST:
                    reply = (await self._sender.link.execute(("PING",)))[0]
                    if isinstance(reply, Exception):
                        raise reply
                    if self._subscriber is not None:
                        connection = await self._subscribe()
                        await self._reader.serve(resync=True)
        except TimeoutError:
            failure = TimeoutError(f"no answer within {self._command_timeout:g} s")
        except CONNECTION_ERRORS as exc:
            failure = exc
        except BaseException:  # cancelled while connecting: leave nothing open
            if connection is not None:
                await connection.disconnect(nowait=True)
            await self._close_connections()
            self._state = _State.CLOSED
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
            self._state = _State.CLOSED
            raise RedisTriggersError(message)
        # The resync done above is the start's; the one the subscription asked
        # for would only repeat it.
        self._reader.cancel_resync()
        self._publisher_connected = True
        self._state = _State.RUNNING
        self._start_task(self._sender.run(), "send")
        self._start_task(self._reader.run(), "read")
        if self._subscriber is not None:
            self._start_task(self._subscriber.run(connection, lambda: self._subscribe()), "sub")
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
        if self._state in (_State.CLOSING, _State.CLOSED):
            return
        if self._state is _State.NEW:
            self._state = _State.CLOSED
            return
        self._state = _State.CLOSING
        dropped = 0
        sender = self._sender
        try:
            if sender:
                try:
                    await asyncio.wait_for(self._drain(), self._close_timeout)
                except TimeoutError:
                    dropped = len(sender)
        finally:
            # Also when the closing task is cancelled: nothing is left running.
            tasks, self._tasks = self._tasks, []
            for task in tasks:
                task.cancel()
            for task in tasks:
                # A task that died of a bug was logged by _task_ended already.
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            subscriber = self._subscriber
            if subscriber is not None:
                await subscriber.drop()
            await self._close_connections()
            self._reader.fail_fetches(
                RedisTriggersClosedError("RedisTriggers closed before the watermark was read")
            )
            self._state = _State.CLOSED
        sender.fail_waiters(
            RedisTriggersClosedError("RedisTriggers closed before the triggers were sent")
        )
        if dropped:
            self._logger.warning("aiopurgatory.redis.dropped_on_close", triggers=dropped)
        self._logger.info("aiopurgatory.redis.closed")

    # -- internals -------------------------------------------------------------------

    def _check_running(self) -> None:
        if self._state is not _State.RUNNING:
            raise RedisTriggersClosedError(
                "RedisTriggers is not started: use `async with`"
                if self._state is _State.NEW
                else "RedisTriggers is closed"
            )

    def _start_task(self, work: Any, role: str) -> None:
        task = asyncio.create_task(work, name=f"aiopurgatory-redis-{role}-{self._id}")
        task.add_done_callback(self._task_ended)
        self._tasks.append(task)

    async def _subscribe(self) -> Any:
        """A new subscription, confirmed (the subscriber calls it through here: tests gate it)."""
        assert self._subscriber is not None
        return await self._subscriber.subscribe()

    async def _close_connections(self) -> None:
        """Close the sender's and the reader's connections (the subscriber's is apart),
        and the clients made to ask the sentinels."""
        await self._sender.link.drop()
        await self._reader.drop()
        await self._target.aclose()

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        # The loops end only when aclose() cancels them; anything else is a bug,
        # and must not go unnoticed.
        if task.cancelled():
            return
        exc = task.exception()  # retrieved in every case: never "never retrieved"
        if self._state is not _State.RUNNING:
            return
        self._last_error = "ended" if exc is None else self._redactor.error(exc)
        self._logger.error(
            "aiopurgatory.redis.task_ended", task=task.get_name(), error=self._last_error
        )

    def _record_error(self, exc: BaseException) -> str:
        """A connection failure: counted, kept as the last error; its redacted text."""
        text = self._redactor.error(exc)
        self._last_error = text
        self._connection_errors += 1
        return text

    def _record_bug(self, exc: BaseException) -> str:
        """An unexpected failure: kept as the last error; its redacted text."""
        text = self._redactor.error(exc)
        self._last_error = text
        return text

    def _published(self, ok: bool) -> None:
        self._publisher_connected = ok

    def _backoff(self, attempt: int) -> float:
        ceiling = min(self._reconnect_longest, self._reconnect_first * 2 ** min(attempt - 1, 30))
        return random.uniform(ceiling / 2, ceiling)

    async def _drain(self) -> None:
        while self._sender:
            await self._sender.wait_sent()

    def _connection_options(self, role: str) -> dict[str, Any]:
        """The settings of the library's connections for ``role``: the URL's (or the
        client's), with what the library needs."""
        options = dict(self._options)
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
        return options

    def _connection_factory(self, role: str) -> Callable[[], Any]:
        """Makes new connections for ``role`` with the URL's (or the client's) settings."""
        options = self._connection_options(role)
        connection_class = self._connection_class
        return lambda: connection_class(**options)

    def _node_connection_factory(self, role: str) -> Callable[[tuple[str, int]], Any]:
        """Makes new connections for ``role`` to a cluster node ``(host, port)``."""
        options = self._connection_options(role)
        connection_class = self._connection_class
        return lambda address: connection_class(**options, host=address[0], port=address[1])
