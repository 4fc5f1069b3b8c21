"""SyncPublisher: triggers from synchronous code, for the purgatories of every async process.

A Celery or RQ task, a Django view, a thread or a Spark task has no event loop
to run :class:`~aiopurgatory.redis.RedisTriggers` on. This publisher speaks the
same protocol with redis-py's *sync* client: the same partition channels
(:mod:`._partitions`), the same message format (:mod:`._wire`) and, for an
advance, the same Lua script as the async sender (raise the stored watermark,
atomic max, refresh its TTL, publish; one round trip), so the two kinds of
publisher can advance one key side by side and the stored watermark is still the
highest value either sent.

Each call is one command sent from the calling thread while Redis answers: it
has reached Redis (the watermark stored, the message published) when it
returns. When Redis cannot be reached (restarting, failing over, a network
blip), the trigger is kept in a bounded outbox and delivered by a background
thread when Redis is back (:mod:`._outbox`): a call does not raise for a blip.
redis-py's client is thread-safe (a connection pool: one connection per thread
that is sending at that moment), so one publisher serves every thread of a
process; a forked child (a Celery prefork worker) may use its parent's.
A call made where a sampled OpenTelemetry span is current (a job worker's task
span) carries its trace context, as ``RedisTriggers``' triggers do (not once kept).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, Self

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError, ResponseError
from redis.retry import Retry

from .._logging import LazyLogger
from .._validation import as_seconds
from ._agreement import DEFAULT_CHECK_INTERVAL, Agreement, Config, check_once
from ._compat import require_cluster_support
from ._errors import RedisTriggersClosedError, RedisTriggersError, connection_cause
from ._options import check_channel, new_instance, positive_seconds
from ._outbox import DEFAULT_MAX_PENDING, Outbox
from ._partitions import DEFAULT_PARTITIONS, Partitions, check_partitions
from ._publisher import (
    ADVANCE_SCRIPT,
    BATCH_SCRIPT,
    MAX_SCRIPT_TRIGGERS,
    batch_command,
    publish_commands,
)
from ._redact import Redactor, describe_client
from ._statistics import SyncPublisherStatistics
from ._topology import Location, SentinelURL, Topology, locate, sentinel_settings
from ._trace import traceparent
from ._wire import (
    VERSION,
    Batch,
    Key,
    PublishMode,
    Value,
    check_key,
    check_value,
    encode,
    sender_field,
    stored,
)

__all__ = ["SyncPublisher"]

_modules = sys.modules

# Seconds a connection attempt, and a command's reply, may take (a URL's client).
_DEFAULT_TIMEOUT: Final = 5.0

# Errors that mean Redis could not be reached or refused the command.
_REDIS_ERRORS: Final = (RedisError, RedisClusterException, OSError)


def _sentinel_client(
    parsed: SentinelURL, timeout: float, name: str
) -> tuple[redis.Redis, list[redis.Redis]]:
    """A client of the primary the sentinels of ``parsed`` name, and the sentinels' clients.

    Its connections ask a sentinel for the primary each time they connect; a
    connection to a former primary (a ``READONLY`` reply after a failover) is
    dropped by redis-py and the call sent once more, on a connection to the new one.
    """
    from redis.sentinel import Sentinel

    sentinels, primary = sentinel_settings(parsed, timeout)
    sentinel = Sentinel(parsed.hosts, sentinel_kwargs=sentinels)  # type: ignore[no-untyped-call]
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        parsed.service,
        redis_class=redis.Redis,
        socket_timeout=timeout,
        socket_keepalive=True,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        client_name=name,
        **primary,
    )
    return client, list(sentinel.sentinels)


def _wait_seconds(value: object) -> float:
    """A ``timeout`` argument of flush() or close(): finite seconds, zero or more."""
    seconds = as_seconds(value, "timeout")
    if seconds < 0:
        raise ValueError(f"timeout must not be negative, got {value!r}")
    return seconds


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
    ``RedisTriggers`` itself (same channel, message format and scripts).

    While Redis answers, each call is one round trip made in the calling
    thread, and has reached Redis when it returns. When a call meets a
    transient failure (Redis unreachable, restarting, loading, a failover's
    ``READONLY``, a timeout), the trigger is *kept* (coalesced: one entry per
    key, the highest value of its advances; at most ``max_pending``) and the
    call returns without raising; a daemon thread delivers what is kept when
    Redis answers again, within ``reconnect_delay[1]`` seconds plus a round
    trip, through the same scripts. While anything is kept, later calls join it
    (nothing overtakes what was kept): during the outage they return at once.
    An outage is logged once when it starts and once when it ends, and counted
    in :meth:`statistics`. :meth:`flush` waits for the delivery; :meth:`close`
    delivers within a bound and returns how many triggers it could not deliver.

    Not kept, raised: a wrong password or missing permission before the
    publisher ever reached Redis (a misconfiguration; after it has worked, a
    rotated password is an outage like any other), a command Redis refuses
    (such as a non-string value under a watermark key), and a trigger that does
    not fit in ``max_pending``.

    Safe to share between threads (redis-py's connection pool lends each thread
    its own connection while it sends) and across ``fork()``: a child process
    (a Celery prefork worker, a gunicorn worker) that inherits a publisher
    uses it as its own, with new connections, an empty outbox and its own
    delivery thread. Usable at once after construction (it connects on the
    first call); ``with SyncPublisher(...) as publisher:`` checks the
    connection on entering and closes on leaving.

    A call made where a sampled OpenTelemetry span is current (a job worker's
    task span) carries its trace context, as ``RedisTriggers`` does; a trigger
    kept in the outbox is delivered without it (kept triggers coalesce per key).

    Timeouts (a URL's client): connecting and each reply may take up to
    ``timeout`` seconds (default 5). A connection that breaks (a Redis
    restarted since the last call) is replaced and the command sent once more
    at once (triggers are idempotent: a watermark only rises, a check twice is
    harmless); a timeout is not retried. So the call that finds Redis down
    returns (its trigger kept) within about ``2 * timeout`` (at once when the
    port refuses), and the one that finds it hung within about ``timeout``;
    the calls after it return at once. A client passed in keeps its own
    timeouts and retries.

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
        max_pending: the most triggers (distinct keys) kept while Redis cannot
            be reached (default 10,000); a trigger beyond it raises.
        reconnect_delay: the first and the longest wait between two delivery
            attempts of what is kept, in seconds (default 0.1 and 2); each
            wait is drawn between half and all of ``min(longest, first * 2**attempt)``.
        close_timeout: seconds :meth:`close` (and the interpreter's exit) waits
            for kept triggers to be delivered (default 5).
        config_check_interval: at most how often (seconds, default 5) a call
            that reached Redis starts a check, in a thread of its own, that the
            channel's subscribers agree with this publisher on the Redis
            database, ``partitions`` and wire version, and that someone
            subscribes to the channel at all (one ``PUBSUB NUMSUB``, or
            ``SHARDNUMSUB`` on a cluster). A mismatch is logged once
            (``aiopurgatory.redis.misconfigured``) and counted in
            :meth:`statistics` (``mismatches``).
        logger: a structlog-compatible logger (default: the library's).

    Raises:
        TypeError: an argument has the wrong type (an asyncio client, say).
        ValueError: an unusable URL, an empty channel, a duration that is not
            positive and finite, ``partitions`` not from 1 to 16,384,
            ``max_pending`` below 1.
        RuntimeError: a Redis Cluster on a redis-py older than 8.0 (one server
            and Sentinel run on redis-py 5.3 and later).
    """

    def __init__(
        self,
        url_or_client: str | redis.Redis | RedisCluster,
        *,
        channel: str | None = None,
        watermark_ttl: float = 86_400.0,
        timeout: float = _DEFAULT_TIMEOUT,
        partitions: int = DEFAULT_PARTITIONS,
        max_pending: int = DEFAULT_MAX_PENDING,
        reconnect_delay: tuple[float, float] = (0.1, 2.0),
        close_timeout: float = 5.0,
        config_check_interval: float = DEFAULT_CHECK_INTERVAL,
        logger: Any | None = None,
    ) -> None:
        channel = check_channel(channel)
        ttl = positive_seconds(watermark_ttl, "watermark_ttl")
        wait = positive_seconds(timeout, "timeout")
        partition_count = check_partitions(partitions)
        if isinstance(max_pending, bool) or not isinstance(max_pending, int):
            raise TypeError(f"max_pending must be an int, got {type(max_pending).__name__}")
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending!r}")
        if not isinstance(reconnect_delay, tuple) or len(reconnect_delay) != 2:
            raise TypeError("reconnect_delay must be a tuple (first, longest) of seconds")
        first = positive_seconds(reconnect_delay[0], "reconnect_delay[0]")
        longest = positive_seconds(reconnect_delay[1], "reconnect_delay[1]")
        if longest < first:
            raise ValueError(f"reconnect_delay must be (first, longest), got {reconnect_delay!r}")
        close_wait = positive_seconds(close_timeout, "close_timeout")
        check_every = positive_seconds(config_check_interval, "config_check_interval")
        if logger is not None and not callable(getattr(logger, "bind", None)):
            raise TypeError(
                f"logger must be a structlog-compatible logger (with bind()), "
                f"got {type(logger).__name__}"
            )

        self._id = new_instance()
        self._sentinels: list[redis.Redis] = []  # a Sentinel URL's, closed with the client
        given: object = url_or_client  # checked at run time, whatever the annotation says
        client: redis.Redis | RedisCluster
        self._publish = PublishMode.PLAIN
        if isinstance(given, str):
            # The one dispatch of a URL, the async side's too (_topology.locate).
            location = locate(given)
            self._redactor = location.redactor
            self._where = location.where
            client = self._client_for(location, wait)
            if location.topology is Topology.CLUSTER:
                self._publish = PublishMode.SHARDED
            self._owns_client = True
        elif isinstance(given, RedisCluster):
            require_cluster_support()
            client = given
            kwargs = client.nodes_manager.connection_kwargs
            self._redactor = Redactor(kwargs.get("password"))
            nodes = ",".join(
                f"{n.host}:{n.port}" for n in client.nodes_manager.startup_nodes.values()
            )
            self._where = f"redis+cluster://{nodes}"
            self._publish = PublishMode.SHARDED
            self._owns_client = False
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
        self._batch_script = client.register_script(BATCH_SCRIPT)
        self._channel = channel
        self._partitions = Partitions(channel, partition_count, self._id)
        self._ttl_ms = str(max(1, round(ttl * 1000))).encode("ascii")
        self._timeout = wait
        self._close_timeout = close_wait
        self._closed = False
        self._close_lock = threading.Lock()
        base_logger = LazyLogger() if logger is None else logger
        self._logger: Any = base_logger.bind(channel=channel, instance=self._id)
        self._outbox_name = f"aiopurgatory-syncpub-{self._id}"
        self._outbox = Outbox(
            self._send_batch,
            error_text=self._redactor.error,
            raise_for=self._error,
            max_pending=max_pending,
            reconnect_delay=(first, longest),
            # A call that joined a delivery waits for it: one attempt, which
            # a hung Redis ends after its timeout (twice: connect, then reply).
            wait_bound=2 * wait + 1.0,
            close_timeout=close_wait,
            name=self._outbox_name,
            logger=self._logger,
        )
        # Checked against the channel's subscribers now and then (_agreement).
        cluster = isinstance(client, RedisCluster)
        db = (
            0
            if isinstance(client, RedisCluster)
            else int(client.connection_pool.connection_kwargs.get("db") or 0)
        )
        self._agreement = Agreement(
            channel,
            self._partitions.control,
            Config(VERSION, partition_count, db),
            role="publisher",
            cluster=cluster,
        )
        self._check_every = check_every
        self._next_check = 0.0  # time.monotonic() of the next check
        self._checking = False
        self._checks_off = False
        self._pid = os.getpid()

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
        as they are; the trigger is still published. Returns once Redis has
        the advance, or, while Redis cannot be reached, once it is kept for
        delivery (see the class documentation).

        Args:
            key: a str, bytes or int.
            value: an int or float, finite, within +-2**53 (Redis compares them
                as doubles).

        Raises:
            TypeError: ``key`` or ``value`` has a type that cannot be sent
                (``bool`` included); nothing is sent.
            ValueError: ``value`` is NaN, infinite, or an int beyond +-2**53.
            RedisTriggersClosedError: after ``close()``.
            RedisTriggersError: not kept: ``max_pending`` triggers are kept
                already, the credentials were refused before the publisher
                ever reached Redis, or Redis refused the command (message
                without any password).
        """
        key = check_key(key)
        value = check_value(value)
        self._check_open()
        outbox = self._outbox
        if outbox.join(key, value):
            return
        failure = self._attempt(self._send_advance, key, value, self._sender())
        if failure is None:
            outbox.sent_now()
            self._maybe_check()
        else:
            outbox.keep(failure, key, value)

    def check_and_complete(self, key: Key) -> None:
        """Have every subscribed process check ``key``'s watchers.

        Returns once Redis has published the check, or, while Redis cannot be
        reached, once it is kept for delivery.

        Raises:
            TypeError: ``key`` is not a str, bytes or int (bool is refused too);
                nothing is sent.
            RedisTriggersClosedError: after ``close()``.
            RedisTriggersError: not kept (as :meth:`advance`).
        """
        key = check_key(key)
        self._check_open()
        outbox = self._outbox
        if outbox.join(key, None):
            return
        failure = self._attempt(self._send_check, key, self._sender())
        if failure is None:
            outbox.sent_now()
            self._maybe_check()
        else:
            outbox.keep(failure, key, None)

    def ping(self) -> None:
        """Check that Redis answers (one PING, in the calling thread; never kept).

        Raises:
            RedisTriggersClosedError: after ``close()``.
            RedisTriggersError: Redis could not be reached, timed out or refused.
        """
        self._check_open()
        failure = self._attempt(self._client.ping)
        if failure is not None:
            error = self._error(failure)
            failure = None
            raise error

    def flush(self, timeout: float | None = None) -> int:
        """Wait until every kept trigger is delivered, or ``timeout`` seconds.

        Asks the delivery thread to try at once (not after its backoff).

        Args:
            timeout: seconds to wait at most (None: as long as it takes).

        Returns:
            How many triggers (distinct keys) are still kept: 0 when everything
            was delivered (at once when nothing is kept).

        Raises:
            ValueError: ``timeout`` is negative or not finite.
        """
        return self._outbox.flush(None if timeout is None else _wait_seconds(timeout))

    def close(self, timeout: float | None = None) -> int:
        """Deliver what is kept (up to ``timeout`` seconds), stop, close the connections.

        The connections of a client made from a URL are closed (a client passed
        in stays open). Idempotent; later calls raise
        :class:`RedisTriggersClosedError`. Calls already sending when it is
        called finish or fail as they would.

        Args:
            timeout: seconds to wait for the delivery of kept triggers (default:
                the ``close_timeout`` given to the constructor).

        Returns:
            How many kept triggers were not delivered (0 when none was kept, or
            all were delivered; 0 on a second call). They are also counted in
            ``statistics().dropped`` and logged
            (``aiopurgatory.redis.publisher_dropped``), never dropped silently.

        Raises:
            ValueError: ``timeout`` is negative or not finite.
        """
        wait = self._close_timeout if timeout is None else _wait_seconds(timeout)
        with self._close_lock:
            if self._closed:
                return 0
            self._closed = True
        left = self._outbox.close(wait)
        if self._owns_client:
            self._client.close()
            for sentinel in self._sentinels:
                sentinel.close()
        return left

    def statistics(self) -> SyncPublisherStatistics:
        """A snapshot of the counters (see :class:`SyncPublisherStatistics`)."""
        outbox = self._outbox
        return SyncPublisherStatistics(
            channel=self._channel,
            instance=self._id,
            connected=outbox.connected,
            sent=outbox.sent,
            kept=outbox.kept,
            pending=outbox.pending,
            delivered_late=outbox.delivered_late,
            dropped=outbox.dropped,
            errors=outbox.errors,
            outages=outbox.outages,
            last_error=outbox.last_error,
            mismatches=self._agreement.mismatches,
            last_mismatch=self._agreement.last_mismatch,
        )

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

    def _client_for(self, location: Location, timeout: float) -> redis.Redis | RedisCluster:
        """A sync client for ``location`` (the settings of this publisher's own)."""
        name = f"aiopurgatory-syncpub-{self._id}"
        if location.topology is Topology.CLUSTER:
            require_cluster_support()
            seeds = location.cluster
            assert seeds is not None
            return RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in seeds.seeds],  # type: ignore[no-untyped-call]
                username=seeds.options.get("username"),
                password=seeds.options.get("password"),
                ssl="connection_class" in seeds.options,
                socket_connect_timeout=timeout,
                socket_timeout=timeout,
                socket_keepalive=True,
                # Once more after a lost connection or a moved slot, from a fresh
                # slot map; a master that is away for good fails the call.
                retry=Retry(NoBackoff(), 1),
                client_name=name,
            )
        if location.topology is Topology.SENTINEL:
            assert location.sentinel is not None
            client, self._sentinels = _sentinel_client(location.sentinel, timeout, name)
            return client
        try:
            return redis.Redis.from_url(
                location.url,
                socket_connect_timeout=timeout,
                socket_timeout=timeout,
                socket_keepalive=True,
                # Once, at once, and only for a broken connection: a pooled
                # connection that died with a restarted Redis is replaced
                # instead of failing the call. Not for timeouts: a hung Redis
                # would hold the caller twice as long.
                retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
                client_name=name,
            )
        except ValueError as exc:
            raise location.unusable(exc) from None

    def _check_open(self) -> None:
        if self._closed:
            raise RedisTriggersClosedError("SyncPublisher is closed")

    def _maybe_check(self) -> None:
        """Start a configuration check in a thread of its own if one is due (at
        most one at a time; the calling thread never waits for it)."""
        if self._checks_off:
            return
        now = time.monotonic()
        if now < self._next_check:
            return
        if os.getpid() != self._pid:  # a forked child: the parent's check is not ours
            self._pid = os.getpid()
            self._checking = False
        with self._close_lock:
            if self._checking or now < self._next_check or self._closed:
                return
            self._checking = True
            self._next_check = now + self._check_every
        threading.Thread(
            target=self._check,
            args=(self._agreement,),
            name=f"{self._outbox_name}-check",
            daemon=True,
        ).start()

    def _check(self, agreement: Agreement) -> None:
        try:
            if not check_once(agreement, self._execute, self._logger):
                self._checks_off = True  # PUBSUB refused (an ACL): no more checks
        except _REDIS_ERRORS:
            pass  # Redis is away: the calls see it; the next check will tell
        except Exception as exc:
            # redis-py's client closed under the check (close() raced it) fails
            # with anything; otherwise it is a bug: loud, never ending a thread
            # with a traceback of its own.
            if not self._closed:
                self._logger.error(
                    "aiopurgatory.redis.config_check_failed", error=self._redactor.error(exc)
                )
        finally:
            self._checking = False

    def _execute(self, command: tuple[Any, ...]) -> Any:
        client = self._client
        if isinstance(client, RedisCluster):
            # A shard channel's count or list: on the node of its slot.
            node = client.get_node_from_key(command[2])  # type: ignore[no-untyped-call]
            return client.execute_command(*command, target_nodes=node)  # type: ignore[no-untyped-call]
        return client.execute_command(*command)  # type: ignore[no-untyped-call]

    def _attempt(self, command: Callable[..., object], *args: object) -> BaseException | None:
        """Run ``command``; the error it met, or None."""
        try:
            command(*args)
        except _REDIS_ERRORS as exc:
            return exc
        return None

    def _error(self, failure: BaseException) -> RedisTriggersError:
        """The one-line error a caller gets for ``failure`` (no password in it)."""
        return RedisTriggersError(
            f"cannot publish to Redis at {self._where}: {_cause(failure)} "
            f"({self._redactor.error(failure)})"
        )

    def _sender(self) -> str:
        # A call made in the calling thread's sampled span carries its trace
        # context (looked for only once OpenTelemetry is imported). A trigger
        # kept in the outbox drops it: kept triggers are coalesced per key,
        # whoever made them.
        if _modules.get("opentelemetry.trace") is None:
            return self._id
        return sender_field(self._id, traceparent())

    def _send_advance(self, key: Key, value: Value, sender: str) -> None:
        batch = Batch()
        batch.advance(key, value)
        partitions = self._partitions
        self._script(
            keys=[partitions.stored_key(key)],
            args=[
                self._ttl_ms,
                self._publish.value,
                partitions.channel(key),
                encode(sender, batch),
                stored(value),
            ],
        )

    def _send_check(self, key: Key, sender: str) -> None:
        batch = Batch()
        batch.check(key)
        self._client.execute_command(  # type: ignore[no-untyped-call]
            self._publish.value.decode(), self._partitions.channel(key), encode(sender, batch)
        )

    def _send_batch(self, batch: Batch) -> None:
        """Send ``batch`` (the delivery thread's): on one server one call of the
        batch script per :data:`MAX_SCRIPT_TRIGGERS`; on a cluster, per partition."""
        if self._publish is PublishMode.PLAIN:
            for part in batch.split(MAX_SCRIPT_TRIGGERS):
                command = batch_command(
                    self._id, part, self._partitions, self._ttl_ms, self._publish
                )
                count = command[2]
                self._batch_script(keys=command[3 : 3 + count], args=command[3 + count :])
            return
        for command in publish_commands(
            self._id, batch, self._partitions, self._ttl_ms, self._publish
        ):
            if command[0] == "EVALSHA":
                count = command[2]
                self._script(keys=command[3 : 3 + count], args=command[3 + count :])
            else:
                self._client.execute_command(  # type: ignore[no-untyped-call]
                    command[0].decode(), *command[1:]
                )
