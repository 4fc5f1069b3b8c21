"""The long-poll feed kept in Redis, so that several processes serve the same topics.

``python -m examples.longpoll --redis URL [--workers N]`` uses :class:`RedisFeed`
instead of the in-memory :class:`~examples.longpoll.feed.Feed`:

* **The log is in Redis.** Per topic, a hash ``{prefix}:{t:NAME}:meta`` (``start``:
  the oldest retained offset, ``next``: the offset the next message gets,
  ``bytes``: the UTF-8 bytes ever appended) and a list ``{prefix}:{t:NAME}:log``
  whose element ``i`` is the message at offset ``start + i``, stored as
  ``"<bytes up to and including it>:<text>"``. A POST is one Lua script
  (:data:`~examples.longpoll.redisstore.APPEND`): it assigns the offset, appends,
  trims to ``--retain`` and answers ``(offset, bytes)`` atomically, so an offset
  names the same message in every process and every acknowledged POST is in the
  log exactly once. A POST is
  acknowledged only after Redis answered the script (with ``appendfsync always``:
  after the write reached its disk). A GET reads with one script
  (:data:`~examples.longpoll.redisstore.READ`).
* **The wait is a threshold watch.** A topic's watermark is its ``bytes`` count. A
  GET from offset ``N`` with ``min_bytes=B`` is answerable once the watermark
  reaches ``position(N) + B`` (``position(N)``: the bytes before message ``N``), so
  it parks as an :class:`aiopurgatory.WatermarkOperation` watched under the topic
  with that threshold, in the process's own purgatory. A POST on any process
  advances the topic's watermark through :class:`aiopurgatory.redis.RedisTriggers`:
  at once in its own purgatory, by one PUBLISH in every other process's.
* **Redis down.** Every command has a deadline (``command_timeout + 0.5`` s); one
  whose connection failed is sent once more on a new connection, so a connection
  that died while Redis was away is replaced, not failed on. That is safe for an
  append because each carries a token (the client's ``Idempotency-Key``, else the
  server's own) that the script stores with the message: a token already stored
  answers with its first offset. A POST Redis could not store answers 503; a
  parked GET is answered from a read made when its wait ends, or 503 if that read
  fails (never an empty answer before its wait); ``/healthz`` says ``degraded``.
  A monitor pings Redis every second; the first failure of an outage and the
  recovery are logged once each; when Redis answers again, the process re-reads
  the watermark of every topic it has GETs parked on (a POST whose notice was lost
  meanwhile completes them then), and :class:`~aiopurgatory.redis.RedisTriggers`
  resubscribes by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, Self, TypeVar

import redis.asyncio as aioredis
import redis.exceptions
import structlog

import aiopurgatory as ap
from aiopurgatory.redis import describe_url

from .feed import Appended, FeedError, Fetched, Settings
from .redisstore import (
    APPEND,
    READ,
    REGISTER,
    append_replicated,
    close_client,
    close_sync_client,
    open_client,
    parse_redis_url,
    sync_client,
)
from .shared import Coalescer, StoredFeed, View
from .waiters import PurgatoryWaiter

__all__ = [
    "APPEND",
    "READ",
    "Coalescer",
    "RedisFeed",
    "RedisUnavailable",
    "RedisWaiter",
    "check_redis",
]

T = TypeVar("T")

#: Errors that mean "Redis is not there now" (the connection, not the command).
REDIS_DOWN: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    # A cluster failing over: CLUSTERDOWN, TRYAGAIN, a slot with no master known yet.
    redis.exceptions.ClusterError,
    redis.exceptions.TryAgainError,
    redis.exceptions.RedisClusterException,
    TimeoutError,
    OSError,
)


def closed_transport(exc: RuntimeError) -> bool:
    """uvloop's error on a write to a connection that has closed, which redis-py lets
    through (it maps ``OSError``; asyncio's transports drop such a write instead):
    Redis went away between a connect and its first command. A lost connection."""
    return str(exc).endswith("the handler is closed")


def _scrub(message: str, url: str) -> str:
    password = urllib.parse.urlsplit(url).password
    if password:
        message = message.replace(password, "***")
        unquoted = urllib.parse.unquote(password)
        if unquoted:
            message = message.replace(unquoted, "***")
    return message


async def _lost_is_connection_error(make: Callable[[], Awaitable[T]]) -> T:
    try:
        return await make()
    except RuntimeError as exc:
        if not closed_transport(exc):
            raise
        raise redis.exceptions.ConnectionError(str(exc)) from exc


class RedisUnavailable(Exception):
    """Redis cannot be used at start: the message names the cause, never the password."""


def check_redis(url: str, timeout: float = 3.0) -> None:
    """Connect, authenticate and PING once (blocking), as the server does before it starts.

    Raises:
        RedisUnavailable: one line naming the cause (unreachable, authentication,
            anything else Redis refused), with the URL redacted.
    """
    shown = describe_url(url)
    try:
        target = parse_redis_url(url)
        # redis-py checks a server's URL as it makes the client; a cluster client
        # reads the slot map as it is made (below: it can fail for Redis's reasons).
        client = sync_client(target, timeout=timeout) if target.topology == "server" else None
    except ValueError as exc:
        raise RedisUnavailable(f"bad --redis URL {shown}: {_scrub(str(exc), url)}") from None
    try:
        if client is None:
            client = sync_client(target, timeout=timeout)
        client.ping()
    except redis.exceptions.AuthenticationError as exc:
        cause = f"authentication failed ({_scrub(str(exc), url)})"
    except redis.exceptions.ResponseError as exc:
        text = _scrub(str(exc), url)
        if "NOAUTH" in text or "HELLO must be called" in text:
            cause = "authentication required: the server wants a password, the URL has none"
        elif "AUTH" in text or "WRONGPASS" in text:
            cause = f"authentication failed ({text})"
        else:
            cause = f"refused: {text}"
    except REDIS_DOWN as exc:
        cause = f"unreachable ({_scrub(str(exc), url)})"
    else:
        return
    finally:
        if client is not None:
            close_sync_client(client)
    raise RedisUnavailable(f"redis at {shown}: {cause}")


class RedisWaiter(PurgatoryWaiter):
    """A purgatory whose triggers cross processes through Redis, and the Redis client.

    ``async with`` connects (one command pool, one subscription through
    :class:`~aiopurgatory.redis.RedisTriggers`) and starts the health monitor.

    Args:
        url: ``redis://[[user]:password@]host[:port][/db]`` (or ``rediss://``), or a
            Sentinel or Redis Cluster URL (:mod:`examples.longpoll.redisstore`).
        prefix: the prefix of every key and of the trigger channel.
        command_timeout: seconds a command may take before Redis counts as down.
        replicas: replicas that must have a message before its POST is acknowledged
            (``WAIT``); default: 0 on one server, 1 on Sentinel and a cluster.
        replica_timeout: seconds an append waits for them (below ``command_timeout``;
            default: 1, or half of ``command_timeout`` when that is less).

    Raises:
        ValueError: a URL of no known kind; ``replicas`` < 0; ``replica_timeout`` not
            below ``command_timeout``.
    """

    name = "purgatory"

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "longpoll",
        command_timeout: float = 2.0,
        replicas: int | None = None,
        replica_timeout: float | None = None,
    ) -> None:
        self.target = parse_redis_url(url)
        if replicas is not None and replicas < 0:
            raise ValueError(f"replicas must be 0 or more, got {replicas}")
        if replica_timeout is None:
            replica_timeout = min(1.0, command_timeout / 2)
        if not 0 < replica_timeout < command_timeout:
            raise ValueError(
                f"replica_timeout must be above 0 and below command_timeout "
                f"({command_timeout}), got {replica_timeout}"
            )
        super().__init__()
        self.replicas = self.target.default_replicas if replicas is None else replicas
        self.replica_timeout = replica_timeout
        self.url = url
        self.prefix = prefix
        self.command_timeout = command_timeout
        self.client: aioredis.Redis | None = None
        self.triggers: Any = None
        #: False from a connection error until Redis answers again.
        self.redis_ok = True
        self.last_error: str | None = None
        self.redis_errors = 0
        #: Request commands that timed out (counted, Redis not marked down for them).
        self.timeouts = 0
        #: Commands sent a second time on a new connection after a connection error.
        self.retries = 0
        self._dropped_at = -math.inf
        self.resyncs = 0
        self._log = structlog.get_logger("examples.longpoll.redis")
        self._monitor: asyncio.Task[None] | None = None
        self._on_recovery: Callable[[], Coroutine[Any, Any, None]] | None = None
        #: The feed's figures, logged when the waiter closes (``longpoll.redis_summary``).
        self._summary: Callable[[], dict[str, object]] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._closing = False
        from aiopurgatory.metrics.prometheus import RedisTriggersCollector

        self._triggers_collector = RedisTriggersCollector(registry=None)
        #: Topics in Redis, as the monitor last counted them.
        self.topic_total = 0

    def collectors(self) -> list[Any]:
        """Prometheus collectors for the application's registry: the triggers' statistics
        (``aiopurgatory_redis_*``), reported once ``async with`` connected them."""
        return [self._triggers_collector]

    def make_feed(self, settings: Settings) -> RedisFeed:
        """The feed the application serves (see :func:`~examples.longpoll.app.create_app`)."""
        return RedisFeed(settings, self)

    def key(self, name: str, part: str) -> str:
        # One hash tag per topic: a topic's keys share a Redis Cluster slot.
        return f"{self.prefix}:{{t:{name}}}:{part}"

    async def __aenter__(self) -> Self:
        from aiopurgatory.redis import RedisTriggers

        await super().__aenter__()
        # No retries inside redis-py (but a cluster's redirections): call() retries
        # itself, once, on a new connection, and only what may run twice (reads;
        # appends with a token).
        self.client = open_client(self.target, timeout=self.command_timeout, max_connections=256)
        self.read_script = self.client.register_script(READ)
        try:
            # The library may refuse a URL the example takes (a topology it does not
            # support): that too must leave nothing open behind.
            triggers = RedisTriggers(self.purgatory, self.url, channel=f"{self.prefix}:triggers")
            await triggers.__aenter__()
        except BaseException:
            # Redis went away since the start-up check: leave nothing open behind.
            await close_client(self.client)
            await super().__aexit__(None, None, None)
            raise
        self.triggers = triggers
        self._triggers_collector.register(triggers)
        self._monitor = asyncio.create_task(self._watch_health())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closing = True
        if self._summary is not None:
            self._log.info("longpoll.redis_summary", **self._summary())
        stopping = list(self._background)
        if self._monitor is not None:
            stopping.append(self._monitor)
        for task in stopping:
            task.cancel()
        if stopping:
            # Bounded: a close must never wait on them (the monitor also stops at _closing).
            await asyncio.wait(stopping, timeout=self.command_timeout + 1)
        try:
            if self.triggers is not None:
                await self.triggers.aclose()
            if self.client is not None:
                await close_client(self.client)
        finally:
            await super().__aexit__(exc_type, exc, tb)

    async def call(
        self, make: Callable[[], Awaitable[Any]], *, probe: bool = False, retry: bool = False
    ) -> Any:
        """Run one Redis command within ``command_timeout + 0.5`` seconds; a connection
        problem is a 503 and marks Redis down.

        ``retry``: the command may safely run twice (a read, or an append carrying an
        idempotency token). A connection that failed (one that died while Redis was
        away, say) is then replaced, with every idle one of the pool, and the command
        sent once more within the same deadline: once Redis is back, no request fails
        for a connection it left behind.

        A timeout marks Redis down only for the health monitor's ``probe``: a request's
        command can time out because this process is overloaded (its loop late), which
        is no news about Redis.

        Raises:
            FeedError: 503 when Redis is unreachable or slower than the deadline.
        """
        try:
            async with asyncio.timeout(self.command_timeout + 0.5):
                try:
                    result = await _lost_is_connection_error(make)
                except redis.exceptions.ConnectionError:
                    if not retry:
                        raise
                    self.retries += 1
                    await self._drop_idle_connections()
                    result = await _lost_is_connection_error(make)
        except REDIS_DOWN as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # A cancellation that met a timeout (ours or redis-py's) in flight can
                # surface as TimeoutError: never swallow it (the task is being cancelled).
                raise asyncio.CancelledError from None
            if probe or not isinstance(exc, TimeoutError | redis.exceptions.TimeoutError):
                self.mark_down(exc)
            else:
                self.timeouts += 1
            raise FeedError(503, f"redis unavailable ({type(exc).__name__})") from None
        if not self.redis_ok:
            self.mark_up()
        return result

    async def _drop_idle_connections(self) -> None:
        # The pool's idle connections may have died with the one that failed (Redis
        # restarted): drop them all, so the retry connects anew. At most once a
        # second: a burst of failures must not keep closing the connections that the
        # retries before it just made.
        now = asyncio.get_running_loop().time()
        if now - self._dropped_at < 1.0:
            return
        self._dropped_at = now
        assert self.client is not None
        pool = getattr(self.client, "connection_pool", None)
        if pool is not None:  # a cluster client has a pool per node and renews them itself
            await pool.disconnect(inuse_connections=False)

    def mark_down(self, exc: BaseException) -> None:
        self.redis_errors += 1
        self.last_error = _scrub(f"{type(exc).__name__}: {exc}", self.url)
        if self.redis_ok:
            self.redis_ok = False
            self._log.warning("longpoll.redis_down", error=self.last_error)

    def mark_up(self) -> None:
        if not self.redis_ok:
            self.redis_ok = True
            self._log.warning("longpoll.redis_up", errors=self.redis_errors)
            if self._on_recovery is not None:
                self.resyncs += 1
                self.spawn(self._on_recovery())

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background, kept until it ends; an error it ends with is
        logged (``longpoll.background_failed``), never left unretrieved."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._log.error(
                "longpoll.background_failed", error=_scrub(f"{type(exc).__name__}: {exc}", self.url)
            )

    async def _watch_health(self) -> None:
        assert self.client is not None
        client = self.client
        topics = f"{self.prefix}:topics"
        while not self._closing:
            with contextlib.suppress(FeedError):
                self.topic_total = int(
                    await self.call(lambda: client.scard(topics), probe=True, retry=True)
                )
            await asyncio.sleep(1.0)

    @property
    def subscribed(self) -> bool:
        """The trigger subscription is connected (as far as the triggers know)."""
        if self.triggers is None:
            return False
        return bool(getattr(self.triggers.statistics(), "connected", True))


class RedisFeed(StoredFeed):
    """Topics in Redis, GETs parked in this process's purgatory (see the module's docs).

    Args:
        settings: limits; ``retain`` and ``max_topics`` are applied in Redis (every
            process of one feed should be given the same).
        waiter: the connected :class:`RedisWaiter`.
    """

    waiter: RedisWaiter

    def __init__(self, settings: Settings, waiter: RedisWaiter) -> None:
        super().__init__(settings, waiter)
        self.redis = waiter
        waiter._on_recovery = self._resync
        waiter._summary = self.summary
        # GETs of one topic and offset asking in one loop iteration share one read.
        self._reads = Coalescer()
        self._byte_reads = Coalescer()
        self._catching_up: set[str] = set()
        #: Topics this process knows to be in the topics set.
        self._registered: set[str] = set()
        #: POSTs stored but not confirmed by enough replicas in time (answered 503).
        self.unreplicated = 0

    # -- posting ---------------------------------------------------------------------------

    async def append(
        self, name: str, body: bytes, *, idempotency_key: str | None = None
    ) -> Appended:
        """Append ``body`` to topic ``name`` in Redis; its offset once Redis stored it.

        Every append carries a token, kept in Redis beside the topic and written by
        the same script: the client's ``idempotency_key`` (kept
        ``Settings.idempotency_ttl`` seconds), else one of the server's own (kept a
        minute). So the server may send the script again on a new connection when
        its connection failed, and a client may retry with its key: a token already
        stored answers with its first offset (``replayed``), nothing stored twice.

        Raises:
            FeedError: bad input (400/413), one topic too many (409), a key already
                used with another body (422), Redis down (503).
        """
        self.check_body(name, body)
        w = self.redis
        if idempotency_key is None:
            token, ttl = f"s:{uuid.uuid4().hex}", 60.0
        else:
            token, ttl = f"c:{idempotency_key}", self.settings.idempotency_ttl
        keys = [w.key(name, "meta"), w.key(name, "log"), w.key(name, f"idem:{token}")]
        args: list[str | bytes | int] = [
            body,
            self.settings.retain,
            token,
            max(1, round(ttl * 1000)),
        ]
        try:
            if name not in self._registered:
                await self._register(name)
            reply, confirmed = await w.call(
                lambda: append_replicated(
                    w.client,
                    APPEND,
                    keys,
                    args,
                    replicas=w.replicas,
                    replica_timeout=w.replica_timeout,
                ),
                retry=True,
            )
        except FeedError as exc:
            if exc.status == 503:
                self.unavailable["post"] += 1
            raise exc from None
        offset, total, replayed = (int(v) for v in reply)
        if offset == -2:
            raise FeedError(422, "this Idempotency-Key was used for another body")
        # The server's own token found: its first attempt stored the message, then
        # lost the reply. Stored by this request, so no replay for the client.
        replayed = replayed and idempotency_key is not None
        if replayed:
            self.replayed += 1
        else:
            self.messages_posted += 1
        # Stored: tell every process (this one at once) that the topic grew. A replay
        # tells it again: the first one's notice may be what was lost.
        w.triggers.advance(name, total)
        if confirmed < w.replicas:
            # On the primary, not yet on enough replicas: not acknowledged (its death
            # now could lose it). The same Idempotency-Key gets this offset back.
            self.unreplicated += 1
            self.unavailable["post"] += 1
            raise FeedError(
                503,
                f"stored but not confirmed by {w.replicas} replica(s) within "
                f"{w.replica_timeout} s: retry with the same Idempotency-Key",
            )
        return Appended(offset, replayed=bool(replayed))

    async def _register(self, name: str) -> None:
        """Add a new topic to the topics set (``max_topics``), once per process: topics
        are never removed, so a name this process registered stays registered.

        Raises:
            FeedError: 409 for one topic too many, 503 Redis down.
        """
        w = self.redis
        topics = f"{w.prefix}:topics"
        client = w.client
        assert client is not None
        known = await w.call(
            lambda: client.eval(REGISTER, 1, topics, name, self.settings.max_topics), retry=True
        )
        if not int(known):
            raise FeedError(409, f"the feed already holds {self.settings.max_topics} topics")
        self._registered.add(name)

    # -- fetching --------------------------------------------------------------------------

    async def _read(self, name: str, offset: int) -> View:
        w = self.redis
        keys = [w.key(name, "meta"), w.key(name, "log")]
        args = [offset, self.settings.max_response_bytes]
        reply = await self._reads.run(
            (name, offset), lambda: w.call(lambda: w.read_script(keys=keys, args=args), retry=True)
        )
        start, end, total, position = (int(v) for v in reply[:4])
        messages = [m.decode() for m in reply[4:]]
        first = max(offset, start)
        return View(start, end, total, position, Fetched(first, messages, first + len(messages)))

    async def _wait(self, name: str, wait: float, threshold: int) -> None:
        purgatory: ap.Purgatory[Any] = self.redis.purgatory
        # Completes once the topic's watermark reaches the threshold: advance() checks
        # it then and never before; its own check reads the purgatory's watermark.
        op = ap.WatermarkOperation(wait)
        with self.parking(name):
            try:
                if not purgatory.try_complete_else_watch(op, {name: threshold}):
                    # A post stored after our read whose notice arrived before the watch
                    # was in place advanced nothing here: read the end again, beside the
                    # wait (a hung Redis must not hold the GET past its wait).
                    self._catch_up(name)
                    await op
            except asyncio.CancelledError:
                op.cancel()
                raise

    def _catch_up(self, name: str) -> None:
        """Advance the purgatory to the topic's byte count in Redis, in the background;
        GETs parking on one topic in one loop iteration share one read."""
        if name not in self._catching_up:
            self._catching_up.add(name)
            self.redis.spawn(self._advance_from_redis(name))

    async def _advance_from_redis(self, name: str) -> None:
        # Forget the topic before reading: a GET parking from now on asks again, so it
        # never relies on a read issued before it watched.
        self._catching_up.discard(name)
        try:
            total = await self._topic_bytes(name)
        except FeedError:
            return  # Redis down: its recovery re-reads every topic with parked GETs
        if total is not None:
            self.redis.purgatory.advance(name, total)

    async def _topic_bytes(self, name: str) -> int | None:
        """The topic's byte count in Redis (its watermark), None for a topic not posted to."""
        w = self.redis
        client = w.client
        assert client is not None
        key = w.key(name, "meta")
        total = await self._byte_reads.run(
            name, lambda: w.call(lambda: client.hget(key, "bytes"), retry=True)
        )
        return None if total is None else int(total)

    async def _resync(self) -> None:
        """Redis is back: re-read the watermark of every topic with parked GETs."""
        purgatory: ap.Purgatory[Any] = self.redis.purgatory
        for name in list(self.parked_by_topic):
            try:
                total = await self._topic_bytes(name)
            except FeedError:
                return
            if total is not None:
                purgatory.advance(name, total)

    def summary(self) -> dict[str, object]:
        """What this process met of Redis: 503s by request, the most a parked GET was
        answered after its wait (seconds), commands retried, POSTs replayed, connection
        errors, resyncs (logged at close as ``longpoll.redis_summary``)."""
        w = self.redis
        return {
            "unavailable": dict(self.unavailable),
            "lateness_max": round(self.lateness_max, 3),
            "retries": w.retries,
            "replayed": self.replayed,
            "redis_errors": w.redis_errors,
            "resyncs": w.resyncs,
        }

    # -- state -----------------------------------------------------------------------------

    def topic_count(self) -> int:
        """Topics in Redis, as the health monitor last counted them (every second)."""
        return self.redis.topic_total

    def metric_families(self) -> list[Any]:
        """Redis up, connection errors, resyncs (``longpoll_redis_*``)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        w = self.redis
        unavailable = CounterMetricFamily(
            "longpoll_unavailable",
            "Requests answered 503 because Redis could not be read or written: post, get "
            "(a new GET), parked (a parked GET, at the end of its wait).",
            labels=["request"],
        )
        for request, count in self.unavailable.items():
            unavailable.add_metric([request], count)
        # value=: a family of one sample without labels.
        return [
            GaugeMetricFamily(
                "longpoll_redis_up",
                "1 while Redis answers this process.",
                value=1 if w.redis_ok else 0,
            ),
            CounterMetricFamily(
                "longpoll_redis_errors",
                "Redis commands that failed for a connection problem.",
                value=w.redis_errors,
            ),
            CounterMetricFamily(
                "longpoll_redis_timeouts",
                "Request commands slower than the command timeout (Redis not marked down).",
                value=w.timeouts,
            ),
            CounterMetricFamily(
                "longpoll_redis_resyncs",
                "Times Redis came back and parked topics were re-read.",
                value=w.resyncs,
            ),
            CounterMetricFamily(
                "longpoll_redis_retries",
                "Commands sent again on a new connection after their connection failed.",
                value=w.retries,
            ),
            unavailable,
            CounterMetricFamily(
                "longpoll_replayed_posts",
                "POSTs whose Idempotency-Key was stored already: answered with the first offset.",
                value=self.replayed,
            ),
            GaugeMetricFamily(
                "longpoll_parked_lateness_max_seconds",
                "The most a parked GET was answered after its wait (from its arrival).",
                value=self.lateness_max,
            ),
        ]

    def health(self) -> tuple[int, dict[str, object]]:
        if self.closing:
            return 503, {"status": "stopping", "waiter": self.waiter.name}
        w = self.redis
        body: dict[str, object] = {
            "status": "ok",
            "waiter": self.waiter.name,
            "redis": "up" if w.redis_ok else "down",
            "subscribed": w.subscribed,
            "pid": os.getpid(),
            "parked": self.parked,
        }
        if w.redis_ok and w.subscribed:
            return 200, body
        body["status"] = "degraded"
        body["error"] = w.last_error
        return 503, body
