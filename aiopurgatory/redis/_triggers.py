"""RedisTriggers: a purgatory's triggers shared by every process through Redis.

How it works (the docs page ``distributed.md`` has the user's view). The work is
split by job, one module each; this class checks its arguments, wires the parts
together and is the public face of them all:

* :mod:`._connections`: where Redis is, the library's own connections (one per
  job, never redis-py's pool), the reconnection backoff and the record of
  failures; :mod:`._topology` says where a URL points.
* :mod:`._lifecycle`: the state (an Enum: NEW, RUNNING, CLOSING, CLOSED), the
  start (``async with``) and the close (``aclose()``) of the parts and their tasks.
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
* :mod:`._link`: one connection, every call bounded by ``command_timeout``.
* :mod:`._errors`, :mod:`._options`, :mod:`._statistics`: the errors, the
  checks of the options shared with :class:`SyncPublisher`, the statistics.

Every message carries the sender's instance id; a process's own messages come
back to it only if it watches their keys, and are skipped (they were applied
locally already). A trigger made where a sampled OpenTelemetry span is current
carries that span's ``traceparent`` too (:mod:`._wire`), and is applied
elsewhere with it current, so a traced wait links to it (:mod:`aiopurgatory.tracing`).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Hashable, Iterable, Mapping
from types import TracebackType
from typing import Any, Self

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from .._detect import current_backend
from .._logging import LazyLogger
from .._operation import Outcome
from .._purgatory import Purgatory
from ._agreement import DEFAULT_CHECK_INTERVAL, Agreement, Config, announced, keep_checking
from ._connections import Connections
from ._errors import RedisTriggersClosedError, RedisTriggersError
from ._lifecycle import Lifecycle, State
from ._options import check_channel, new_instance, positive_seconds
from ._partitions import DEFAULT_PARTITIONS, Partitions, check_partitions
from ._publisher import Sender
from ._reader import WatermarkReader
from ._statistics import RedisTriggersStatistics
from ._subscriber import Subscriber
from ._trace import traceparent
from ._wire import VERSION, Key, Value, check_key, check_value

__all__ = ["RedisTriggers", "refuse_virtual_time"]

_modules = sys.modules


def refuse_virtual_time() -> None:
    """RuntimeError if the running loop is a virtual-time loop (aiopurgatory.simulation).

    Redis, its connections and every timeout of this package run in real time: on
    a virtual clock a timeout fires as soon as the loop is idle (a healthy Redis
    "timed out") or a reply is awaited while timers jump ahead.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    from ..simulation import VirtualTimeLoop

    if isinstance(loop, VirtualTimeLoop):
        raise RuntimeError(
            "aiopurgatory.redis.RedisTriggers cannot run on a virtual-time loop "
            "(aiopurgatory.simulation.VirtualTimeLoop): Redis and its timeouts are in "
            "real time, so on a virtual clock they fire at once or never. Hand the code "
            "under test aiopurgatory.LocalTriggers instead: the same aiopurgatory.Triggers "
            "interface, in memory, on virtual time."
        )


def _timeout_of(op: Any) -> float:
    """``op``'s timeout in seconds (infinite for what is not an operation: the
    purgatory refuses it with its own message)."""
    timeout = getattr(op, "timeout", None)
    return timeout if isinstance(timeout, int | float) else float("inf")


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
    delay until the reconnect, never more. A trigger made where a sampled
    OpenTelemetry span is current carries that span's trace context, so a wait
    traced elsewhere (:mod:`aiopurgatory.tracing`) links to it; what other
    processes publish is applied in a context of its own.

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
        config_check_interval: seconds between two checks that the channel's
            subscribers agree with this instance on the Redis database,
            ``partitions`` and wire version, and that someone subscribes to the
            channel at all (default 5; one ``PUBSUB NUMSUB``, or
            ``SHARDNUMSUB`` on a cluster, each). A mismatch is logged once
            (``aiopurgatory.redis.misconfigured``) and counted in
            :meth:`statistics` (``mismatches``).
        catch_up_grace: seconds (default 0.1, at most ``command_timeout``): a
            :meth:`watch` of an operation whose timeout is shorter reads the
            stored watermarks of its keys *before* watching, waiting at most
            this long for the read, so that ``timeout=0`` sees stored state.
        logger: a structlog-compatible logger (default: the library's).

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: a duration is not positive and finite; an empty channel;
            ``partitions`` not from 1 to 16,384.
        RuntimeError: constructed under trio, or in a running virtual-time loop
            (:class:`aiopurgatory.simulation.VirtualTimeLoop`: Redis and its
            timeouts run in real time; tests on virtual time use
            :class:`aiopurgatory.LocalTriggers`, the same interface in memory);
            a Redis Cluster on a redis-py older than 8.0 (one server and
            Sentinel run on redis-py 5.3 and later).
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
        catch_up_grace: float = 0.1,
        config_check_interval: float = DEFAULT_CHECK_INTERVAL,
        logger: Any | None = None,
    ) -> None:
        refuse_virtual_time()
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
        ttl = positive_seconds(watermark_ttl, "watermark_ttl")
        health = positive_seconds(health_check_interval, "health_check_interval")
        if not isinstance(reconnect_delay, tuple) or len(reconnect_delay) != 2:
            raise TypeError("reconnect_delay must be a tuple (first, longest) of seconds")
        first = positive_seconds(reconnect_delay[0], "reconnect_delay[0]")
        longest = positive_seconds(reconnect_delay[1], "reconnect_delay[1]")
        if longest < first:
            raise ValueError(f"reconnect_delay must be (first, longest), got {reconnect_delay!r}")
        close_wait = positive_seconds(close_timeout, "close_timeout")
        call_timeout = positive_seconds(command_timeout, "command_timeout")
        partition_count = check_partitions(partitions)
        linger_for = positive_seconds(linger, "linger")
        sweep_every = positive_seconds(sweep_interval, "sweep_interval")
        grace = positive_seconds(catch_up_grace, "catch_up_grace")
        check_every = positive_seconds(config_check_interval, "config_check_interval")
        if logger is not None and not callable(getattr(logger, "bind", None)):
            raise TypeError(
                f"logger must be a structlog-compatible logger (with bind()), "
                f"got {type(logger).__name__}"
            )

        self._id = new_instance()
        self._connections = connections = Connections(
            url_or_client,
            self._id,
            command_timeout=call_timeout,
            reconnect_delay=(first, longest),
        )
        self._purgatory = purgatory
        self._advance_local: Callable[[Hashable, float], int] | None = (
            None if purgatory is None else purgatory.advance
        )
        self._channel = channel
        self._partitions = Partitions(channel, partition_count, self._id)
        base_logger = LazyLogger() if logger is None else logger
        self._logger: Any = base_logger.bind(channel=channel, instance=self._id)
        # Checked against the channel's subscribers, and announced to the others
        # (_agreement).
        config = Config(VERSION, partition_count, connections.db or 0)
        self._agreement = Agreement(
            channel,
            self._partitions.control,
            config,
            role="publisher" if purgatory is None else "process",
            cluster=connections.cluster,
        )
        # The library's own connections, one per job, none shared with the
        # application: the sender's, the reader's, and the subscriber's.
        self._sender = Sender(
            self._id,
            connections.link("pub"),
            self._partitions,
            ttl_ms=str(max(1, round(ttl * 1000))).encode("ascii"),
            publish=connections.publish,
            connections=connections,
            logger=self._logger,
        )
        self._reader = WatermarkReader(
            purgatory,
            connections.link("read"),
            self._partitions.stored_key,
            partition_of=self._partitions.of if connections.cluster else None,
            connections=connections,
            logger=self._logger,
        )
        self._subscriber: Subscriber | None = (
            None
            if purgatory is None
            else Subscriber(
                self._id,
                purgatory,
                self._partitions,
                connections.subscription_factory(self._partitions),
                self._reader,
                self._sender,
                health_check_interval=health,
                command_timeout=call_timeout,
                linger=linger_for,
                sweep_interval=sweep_every,
                connections=connections,
                logger=self._logger,
                config_channels=announced(
                    self._partitions.control, config, cluster=connections.cluster
                ),
            )
        )
        agreement = self._agreement
        self._lifecycle = Lifecycle(
            self._id,
            connections,
            self._sender,
            self._reader,
            self._subscriber,
            command_timeout=call_timeout,
            close_timeout=close_wait,
            logger=self._logger,
            checks=lambda: keep_checking(
                agreement,
                self._sender.probe,
                interval=check_every,
                bound=call_timeout,
                logger=self._logger,
            ),
        )
        self._triggers = 0
        # A watch of an op shorter than this reads first (see watch()); the read
        # waits this long at most, and never longer than any call to Redis may.
        self._grace = min(grace, call_timeout)

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
        if self._lifecycle.state is not State.RUNNING:
            return False
        return self._sender.connected if subscriber is None else subscriber.connected

    def __repr__(self) -> str:
        role = "publisher" if self._purgatory is None else f"purgatory={self._purgatory.name!r}"
        link = "connected" if self.connected else "disconnected"
        return (
            f"<RedisTriggers channel={self._channel!r} redis={self._connections.where} {role} "
            f"{self._lifecycle.state.value} {link}>"
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
        self._lifecycle.check_running()
        purgatory = self._purgatory
        completed = 0 if purgatory is None else purgatory.check_and_complete(key)
        sender = self._sender
        # Made in a sampled span: its trace context goes with it (only once
        # OpenTelemetry is imported: before, no span can be current).
        if _modules.get("opentelemetry.trace") is None:
            sender.pending.check(key)
        else:
            sender.traced_batch(traceparent()).check(key)
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
        self._lifecycle.check_running()
        advance_local = self._advance_local
        completed = 0 if advance_local is None else advance_local(key, value)
        sender = self._sender
        if _modules.get("opentelemetry.trace") is None:
            sender.pending.advance(key, value)
        else:
            sender.traced_batch(traceparent()).advance(key, value)
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
        if self._lifecycle.state is State.NEW:
            raise RedisTriggersClosedError("RedisTriggers is not started: use `async with`")
        if not self._sender:
            return
        if self._lifecycle.state is State.CLOSED:
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
        self._lifecycle.check_running()
        connections = self._connections
        failure: str | None = None
        try:
            value = await self._reader.fetch(key)
        except RedisTriggersClosedError:
            raise
        except Exception as exc:
            failure = connections.redactor.error(exc)
        if failure is not None:
            where = connections.where
            raise RedisTriggersError(f"cannot read the watermark from {where}: {failure}")
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

        An operation whose timeout is shorter than ``catch_up_grace`` (0.1 s
        by default; ``timeout=0``, "tell me now", included) would expire before
        that read returns. For it the stored watermarks are read *first*
        (batched with the other reads of the loop iteration), then it is
        watched and the purgatory advanced to them at once, so a condition
        that stored state already meets completes it whatever its timeout.
        That read waits at most ``catch_up_grace``: on a hung Redis such a
        watch takes that long plus the op's timeout (the one place where the
        caller is held past it), then ends as the op does.

        Returns:
            ``Outcome.COMPLETED``, ``EXPIRED`` or ``CANCELLED``, as ``Purgatory.watch``.

        Raises:
            TypeError: a key cannot cross the wire (not a str, bytes or int, as
                :meth:`advance` refuses it: a tuple, a bool...), before anything
                is watched; and whatever ``Purgatory.watch`` raises.
            RedisTriggersClosedError: before ``async with`` or after ``aclose()``,
                or on a publisher only (there is no purgatory to watch in).
        """
        self._lifecycle.check_running()
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
        stored: list[tuple[Key, Value]] = []
        if wire and _timeout_of(op) < self._grace:
            try:
                stored = await self._read_first(wire)
            except BaseException:
                op.cancel()  # abandoned before it is watched: as below
                raise
            self._lifecycle.check_running()
        if purgatory.try_complete_else_watch(op, keys):
            return Outcome.COMPLETED
        if stored:
            completed = 0
            advance = purgatory.advance
            for key, value in stored:
                completed += advance(key, value)
            self._reader.completed += completed
        assert self._subscriber is not None  # there is a purgatory
        # Subscribed first (if its partition is not yet), read next.
        self._subscriber.need(wire)
        try:
            outcome: Outcome = await op
        except BaseException:
            # As Purgatory.watch (and LocalTriggers.watch): cancelled (asyncio's
            # CancelledError, trio's Cancelled, an anyio cancel scope) or abandoned
            # (a BaseException thrown in): the caller owns the op, withdraw it.
            op.cancel()
            raise
        return outcome

    async def _read_first(self, keys: list[Key]) -> list[tuple[Key, Value]]:
        """The stored watermarks of ``keys`` (those that have one), read within the
        grace; nothing if the read fails or takes longer (the read after the
        watch is the one that retries)."""
        fetch = self._reader.fetch
        reads = [fetch(key) for key in dict.fromkeys(keys)]
        gathered = asyncio.gather(*reads)
        try:
            async with asyncio.timeout(self._grace):
                values = await gathered
        except (TimeoutError, Exception):
            for read in reads:
                if read.done() and not read.cancelled():
                    read.exception()  # retrieved: a failed read is counted by the reader
                else:
                    read.cancel()
            return []
        except BaseException:
            # Abandoned (a BaseException thrown in, not only a cancellation of
            # the task, which cancels the gathering itself): no read left behind.
            gathered.cancel()
            raise
        return [
            (key, value)
            for key, value in zip(dict.fromkeys(keys), values, strict=True)
            if value is not None
        ]

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
            connection_errors=self._connections.errors,
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
            last_error=self._connections.last_error,
            reads=reader.reads,
            read_errors=reader.read_errors,
            subscribed=0 if sub is None else sub.subscribed,
            deaf_detected=0 if sub is None else sub.deaf_detected,
            mismatches=self._agreement.mismatches,
            last_mismatch=self._agreement.last_mismatch,
        )

    async def __aenter__(self) -> Self:
        refuse_virtual_time()
        if current_backend() == "trio":
            raise RuntimeError("aiopurgatory.redis.RedisTriggers needs an asyncio event loop")
        await self._lifecycle.start()
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
        await self._lifecycle.close()
