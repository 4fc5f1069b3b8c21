"""SyncPublisher: triggers from synchronous code, for the purgatories of every async process.

A Celery or RQ task, a Django view, a thread or a Spark task has no event loop
to run :class:`~aiopurgatory.redis.RedisTriggers` on. This publisher speaks the
same protocol with redis-py's *sync* client: the same partition channels
(:mod:`._partitions`), the same message format (:mod:`._wire`) and, for an
advance, the same Lua script as the async sender (raise the stored watermark,
atomic max, refresh its TTL, publish; one round trip), so the two kinds of
publisher can advance one key side by side and the stored watermark is still the
highest value either sent.

Nothing is batched or sent in the background: each call is one command, and it
has reached Redis (the watermark stored, the message published) when it
returns, or it raises. redis-py's client is thread-safe (a connection pool: one
connection per thread that is sending at that moment), so one publisher serves
every thread of a process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Final, Self, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.retry import Retry

from ._cluster import CLUSTER_SCHEMES, credentials, parse_cluster_url
from ._errors import RedisTriggersClosedError, RedisTriggersError, connection_cause
from ._options import check_channel, new_instance, positive_seconds
from ._partitions import DEFAULT_PARTITIONS, Partitions, check_partitions
from ._publisher import ADVANCE_SCRIPT
from ._redact import Redactor, describe_client, describe_url, url_password
from ._topology import SentinelURL, is_sentinel_url, parse_sentinel_url
from ._wire import Batch, Key, Value, check_key, check_value, encode, stored

_Parsed = TypeVar("_Parsed")

__all__ = ["SyncPublisher"]

# Seconds a connection attempt, and a command's reply, may take (a URL's client).
_DEFAULT_TIMEOUT: Final = 5.0

# Errors that mean Redis could not be reached or refused the command.
_REDIS_ERRORS: Final = (RedisError, OSError)


def _sentinel_client(
    parsed: SentinelURL, timeout: float, name: str
) -> tuple[redis.Redis, list[redis.Redis]]:
    """A client of the primary the sentinels of ``parsed`` name, and the sentinels' clients.

    Its connections ask a sentinel for the primary each time they connect; a
    connection to a former primary (a ``READONLY`` reply after a failover) is
    dropped by redis-py and the call sent once more, on a connection to the new one.
    """
    from redis.sentinel import Sentinel

    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        parsed.hosts,
        sentinel_kwargs={"socket_connect_timeout": timeout, "socket_timeout": timeout},
    )
    options = credentials(parsed.username, parsed.password)
    if parsed.tls:
        options["ssl"] = True
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        parsed.service,
        redis_class=redis.Redis,
        db=parsed.db,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        socket_keepalive=True,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        client_name=name,
        **options,
    )
    return client, list(sentinel.sentinels)


def _cause(exc: BaseException) -> str:
    """A short name for why a command failed, for the one-line error."""
    cause = connection_cause(exc)
    if cause == "unreachable" and isinstance(exc, ResponseError):
        return "refused the command"
    return cause


class SyncPublisher:
    """Publishes triggers from synchronous code to every process on a Redis channel.

    ``advance(key, value)`` raises ``key``'s watermark stored in Redis (atomic
    max: a lower value than the stored one changes nothing) and publishes the
    trigger; ``check_and_complete(key)`` publishes a check. Every
    :class:`RedisTriggers` subscribed to the channel applies them to its
    purgatory, and a subscriber that was disconnected reads the stored
    watermarks when it reconnects, exactly as for triggers sent by
    ``RedisTriggers`` itself (same channel, message format and script).

    Each call has reached Redis when it returns: it is one round trip, made in
    the calling thread (no background thread, no batching), and it raises
    :class:`RedisTriggersError` if Redis cannot be reached in time. Safe to
    share between threads (redis-py's connection pool lends each thread its own
    connection while it sends). Usable at once after construction (it connects
    on the first call); ``with SyncPublisher(...) as publisher:`` checks the
    connection on entering and closes on leaving.

    Timeouts (a URL's client): connecting and each reply may take up to
    ``timeout`` seconds (default 5). A connection that breaks (a Redis
    restarted since the last call) is replaced and the command sent once more
    at once (triggers are idempotent: a watermark only rises, a check twice is
    harmless); a timeout is not retried. So a call against a Redis that is down
    fails within about ``2 * timeout`` (at once when the port refuses), and one
    against a Redis that hangs within about ``timeout``. A client passed in
    keeps its own timeouts and retries.

    Args:
        url_or_client: a Redis URL (``redis://[[user]:password@]host[:port][/db]``,
            ``rediss://`` for TLS, ``unix://``; redis-py's ``from_url``), a Redis
            Cluster's (``redis+cluster://[[user]:password@]host:port[,host:port...]``,
            ``rediss+cluster://`` for TLS), a Sentinel-managed primary's
            (``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]``,
            ``rediss+sentinel://`` for TLS to the data servers), a ``redis.Redis`` or a
            ``redis.cluster.RedisCluster`` client (sync; a client passed in is
            not closed).
        channel: the Redis channel (default ``"aiopurgatory"``), the one the
            subscribing ``RedisTriggers`` use.
        watermark_ttl: seconds a stored watermark lives after its last advance
            (default one day), as ``RedisTriggers``' option of that name.
        timeout: seconds for connecting and for each reply, for a URL's client
            (default 5).
        partitions: the number of partition channels, as the subscribing
            ``RedisTriggers``' option of that name (default 16,384).

    Raises:
        TypeError: an argument has the wrong type (an asyncio client, say).
        ValueError: an unusable URL, an empty channel, a duration that is not
            positive and finite, ``partitions`` not from 1 to 16,384.
    """

    def __init__(
        self,
        url_or_client: str | redis.Redis | RedisCluster,
        *,
        channel: str | None = None,
        watermark_ttl: float = 86_400.0,
        timeout: float = _DEFAULT_TIMEOUT,
        partitions: int = DEFAULT_PARTITIONS,
    ) -> None:
        channel = check_channel(channel)
        ttl = positive_seconds(watermark_ttl, "watermark_ttl")
        wait = positive_seconds(timeout, "timeout")
        partition_count = check_partitions(partitions)

        self._id = new_instance()
        self._sentinels: list[redis.Redis] = []  # a Sentinel URL's, closed with the client
        given: object = url_or_client  # checked at run time, whatever the annotation says
        client: redis.Redis | RedisCluster
        self._publish = b"PUBLISH"
        if isinstance(given, str) and given.split("://", 1)[0].lower() in CLUSTER_SCHEMES:
            seeds = self._parse(given, parse_cluster_url)
            self._where = seeds.where
            client = RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in seeds.seeds],  # type: ignore[no-untyped-call]
                username=seeds.options.get("username"),
                password=seeds.options.get("password"),
                ssl="connection_class" in seeds.options,
                socket_connect_timeout=wait,
                socket_timeout=wait,
                socket_keepalive=True,
                # Once more after a lost connection or a moved slot, from a fresh
                # slot map; a master that is away for good fails the call.
                retry=Retry(NoBackoff(), 1),
                client_name=f"aiopurgatory-syncpub-{self._id}",
            )
            self._publish = b"SPUBLISH"
            self._owns_client = True
        elif isinstance(given, RedisCluster):
            client = given
            kwargs = client.nodes_manager.connection_kwargs
            self._redactor = Redactor(kwargs.get("password"))
            nodes = ",".join(
                f"{n.host}:{n.port}" for n in client.nodes_manager.startup_nodes.values()
            )
            self._where = f"redis+cluster://{nodes}"
            self._publish = b"SPUBLISH"
            self._owns_client = False
        elif isinstance(given, str) and is_sentinel_url(given):
            parsed = self._parse(given, parse_sentinel_url)
            self._where = parsed.where
            client, self._sentinels = _sentinel_client(
                parsed, wait, f"aiopurgatory-syncpub-{self._id}"
            )
            self._owns_client = True
        elif isinstance(given, str):
            self._redactor = Redactor(url_password(given))
            self._where = describe_url(given)
            try:
                client = redis.Redis.from_url(
                    given,
                    socket_connect_timeout=wait,
                    socket_timeout=wait,
                    socket_keepalive=True,
                    # Once, at once, and only for a broken connection: a pooled
                    # connection that died with a restarted Redis is replaced
                    # instead of failing the call. Not for timeouts: a hung Redis
                    # would hold the caller twice as long.
                    retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
                    client_name=f"aiopurgatory-syncpub-{self._id}",
                )
            except ValueError as exc:
                raise ValueError(
                    f"url_or_client: not a usable Redis URL ({self._redactor.error(exc)})"
                ) from None
            self._owns_client = True
        elif isinstance(given, redis.Redis):
            client = given
            kwargs = client.connection_pool.connection_kwargs
            self._redactor = Redactor(kwargs.get("password"))
            self._where = describe_client(kwargs)
            self._owns_client = False
        else:
            hint = (
                " (an asyncio client: use RedisTriggers in async code)"
                if type(given).__module__.startswith("redis.asyncio")
                else ""
            )
            raise TypeError(
                "url_or_client must be a Redis URL (str), a redis.Redis or a "
                "redis.cluster.RedisCluster client, "
                f"got {type(given).__name__}{hint}"
            )
        self._client = client
        self._script = client.register_script(ADVANCE_SCRIPT)
        self._channel = channel
        self._partitions = Partitions(channel, partition_count, self._id)
        self._ttl_ms = str(max(1, round(ttl * 1000))).encode("ascii")
        self._timeout = wait
        self._closed = False
        self._close_lock = threading.Lock()

    @property
    def channel(self) -> str:
        """The Redis channel."""
        return self._channel

    @property
    def instance(self) -> str:
        """This publisher's id (``<pid>-<random hex>``), carried by its messages."""
        return self._id

    @property
    def closed(self) -> bool:
        """``close()`` was called."""
        return self._closed

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<SyncPublisher channel={self._channel!r} redis={self._where} {state}>"

    def advance(self, key: Key, value: Value) -> None:
        """Raise ``key``'s watermark to ``value`` in Redis and in every subscribed process.

        A value at or below the stored watermark leaves it (and its waiters)
        as they are; the trigger is still published.

        Args:
            key: a str, bytes or int.
            value: an int or float, finite, within +-2**53 (Redis compares them
                as doubles).

        Raises:
            TypeError: ``key`` or ``value`` has a type that cannot be sent
                (``bool`` included); nothing is sent.
            ValueError: ``value`` is NaN, infinite, or an int beyond +-2**53.
            RedisTriggersClosedError: after ``close()``.
            RedisTriggersError: Redis could not be reached, timed out or
                refused (message without any password); the watermark may or
                may not have been stored (sending it again is harmless).
        """
        key = check_key(key)
        value = check_value(value)
        self._check_open()
        batch = Batch()
        batch.advance(key, value)
        message = encode(self._id, batch)
        partitions = self._partitions
        self._call(
            self._script,
            keys=[partitions.stored_key(key)],
            args=[self._ttl_ms, self._publish, partitions.channel(key), message, stored(value)],
        )

    def check_and_complete(self, key: Key) -> None:
        """Have every subscribed process check ``key``'s watchers.

        Raises:
            TypeError: ``key`` is not a str, bytes or int (bool is refused too);
                nothing is sent.
            RedisTriggersClosedError: after ``close()``.
            RedisTriggersError: Redis could not be reached, timed out or refused.
        """
        key = check_key(key)
        self._check_open()
        batch = Batch()
        batch.check(key)
        publish = self._client.spublish if self._publish == b"SPUBLISH" else self._client.publish
        self._call(publish, self._partitions.channel(key), encode(self._id, batch))

    def ping(self) -> None:
        """Check that Redis answers (one PING).

        Raises:
            RedisTriggersClosedError: after ``close()``.
            RedisTriggersError: Redis could not be reached, timed out or refused.
        """
        self._check_open()
        self._call(self._client.ping)

    def close(self) -> None:
        """Close the connections of a client made from a URL (a client passed in stays open).

        Idempotent; later calls raise :class:`RedisTriggersClosedError`. Calls
        already sending when it is called finish or fail as they would.
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._owns_client:
            self._client.close()
            for sentinel in self._sentinels:
                sentinel.close()

    def __enter__(self) -> Self:
        self.ping()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _parse(self, url: str, parse: Callable[[str], _Parsed]) -> _Parsed:
        # A URL naming several nodes: its password redacted from every message,
        # this error's too.
        self._redactor = Redactor(url_password(url))
        try:
            return parse(url)
        except ValueError as exc:
            raise ValueError(
                f"url_or_client: not a usable Redis URL ({self._redactor.error(exc)})"
            ) from None

    def _check_open(self) -> None:
        if self._closed:
            raise RedisTriggersClosedError("SyncPublisher is closed")

    def _call(self, command: Callable[..., object], *args: object, **kwargs: object) -> None:
        failure: BaseException | None = None
        try:
            command(*args, **kwargs)
        except _REDIS_ERRORS as exc:
            failure = exc
        if failure is not None:
            # Raised outside the except block: no chained redis-py exception
            # (whose text we do not control) travels with ours.
            message = (
                f"cannot publish to Redis at {self._where}: {_cause(failure)} "
                f"({self._redactor.error(failure)})"
            )
            failure = None
            raise RedisTriggersError(message)
