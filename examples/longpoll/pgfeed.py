"""The long-poll feed kept in PostgreSQL, so that several processes serve the same topics.

``python -m examples.longpoll --postgres DSN [--workers N]`` uses :class:`PostgresFeed`
instead of the in-memory :class:`~examples.longpoll.feed.Feed`:

* **The log is in tables** (:mod:`examples.longpoll.pgsql`): a row per topic
  (``start``, ``next``, ``bytes``), a row per retained message, a row per
  idempotency token. A POST is one transaction: the append function (it assigns
  the offset under the topic's row lock, appends, trims to ``--retain``, records
  the token) and then :meth:`aiopurgatory.postgres.PostgresTriggers.advance_in`,
  which raises the topic's watermark and queues its notification **in the same
  transaction**. The message and the wake-up commit together: a rolled-back
  append (:meth:`PostgresFeed.append_in` inside the application's own
  transaction, say) stores nothing and wakes nobody. A POST is acknowledged once
  the commit returned.
* **The wait is a threshold watch**, as on Redis: a topic's watermark is its
  ``bytes``; a GET from offset ``N`` with ``min_bytes=B`` parks as an
  :class:`aiopurgatory.WatermarkOperation` on ``{topic: position(N) + B}`` through
  ``PostgresTriggers.watch``, which LISTENs to the topic's partition before it
  reads the stored watermark (nothing committed in between is missed).
* **PostgreSQL down.** Every statement has a deadline (``command_timeout + 0.5``
  s); one whose connection failed is sent once more on a new connection (safe for
  an append: its token makes a second run answer with the first one's offset). A
  POST PostgreSQL could not store answers 503; a parked GET is answered from a read
  made when its wait ends, or 503 if that read fails; ``/healthz`` says
  ``degraded``. A monitor probes the server every second; the outage and the
  recovery are logged once each. The triggers resynchronise by themselves (their
  listener re-reads every watched key's watermark when it reconnects), so a
  notification lost meanwhile costs a delay, never a stranded GET.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self

import asyncpg
import structlog

import aiopurgatory as ap

from .feed import (
    Appended,
    FeedError,
    Fetched,
    Settings,
    body_digest,
)
from .pgsql import (
    KEY_REUSED,
    REPLAYED,
    TOO_MANY_TOPICS,
    append_sql,
    check_prefix,
    count_sql,
    read_sql,
    schema_sql,
)
from .shared import Coalescer, StoredFeed, View
from .waiters import PurgatoryWaiter

__all__ = [
    "PG_DOWN",
    "PostgresFeed",
    "PostgresUnavailable",
    "PostgresWaiter",
    "check_postgres",
    "describe_dsn",
]

#: Errors that mean "PostgreSQL is not there now" (the connection, not the statement).
PG_DOWN: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # shutting down, starting up
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.InterfaceError,
    # A connection the server ended (a restart) while this loop had not run yet: asyncpg
    # (on uvloop) finds the server's last message in the way of the next statement.
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
    EOFError,
)


def describe_dsn(dsn: str) -> str:
    """``postgresql://user:***@host:port/db`` of a DSN: the password never shown."""
    try:
        parts = urllib.parse.urlsplit(dsn)
        host = parts.hostname or "localhost"
        port = parts.port or 5432
    except ValueError:
        return "postgresql://?"
    user = parts.username or ""
    secret = ":***" if parts.password else ""
    at = "@" if user or secret else ""
    return f"{parts.scheme}://{user}{secret}{at}{host}:{port}/{parts.path.lstrip('/')}"


def _scrub(message: str, dsn: str) -> str:
    with contextlib.suppress(ValueError):
        password = urllib.parse.urlsplit(dsn).password
        if password:
            message = message.replace(password, "***")
            message = message.replace(urllib.parse.unquote(password), "***")
    return message


def _check_dsn(dsn: str) -> str:
    if not isinstance(dsn, str) or not dsn.startswith(("postgresql://", "postgres://")):
        raise ValueError("the DSN must be a postgresql:// URL")
    return dsn


class PostgresUnavailable(Exception):
    """PostgreSQL cannot be used at start: the message names the cause, never the password."""


def check_postgres(dsn: str, timeout: float = 3.0) -> None:
    """Connect, authenticate and run ``SELECT 1`` once (blocking), as the server does
    before it starts.

    Raises:
        PostgresUnavailable: one line naming the cause (a bad DSN, unreachable,
            authentication, anything else refused), with the password redacted.
    """
    import psycopg

    shown = describe_dsn(dsn)
    try:
        _check_dsn(dsn)
    except ValueError as exc:
        raise PostgresUnavailable(f"bad --postgres DSN {shown}: {exc}") from None
    try:
        with psycopg.connect(dsn, connect_timeout=max(1, round(timeout))) as conn:
            conn.execute("SELECT 1")
        return
    except psycopg.Error as exc:
        text = _scrub(" ".join(str(exc).split()), dsn)
    lowered = text.lower()
    if "password" in lowered or "authentication" in lowered:
        cause = f"authentication failed ({text})"
    elif "connect" in lowered or "timeout" in lowered or "refused" in lowered:
        cause = f"unreachable ({text})"
    else:
        cause = f"refused: {text}"
    raise PostgresUnavailable(f"postgresql at {shown}: {cause}")


class PostgresWaiter(PurgatoryWaiter):
    """A purgatory whose triggers cross processes through PostgreSQL, and a connection pool.

    ``async with`` creates the feed's tables if missing, opens the pool and a
    :class:`~aiopurgatory.postgres.PostgresTriggers` (channel ``<prefix>_triggers``)
    and starts the health monitor.

    Args:
        dsn: a ``postgresql://`` DSN.
        prefix: the prefix of the feed's tables and trigger channel (``[a-z_][a-z0-9_]*``).
        command_timeout: seconds a statement may take before PostgreSQL counts as down.
        pool_size: connections of the feed's pool (the triggers hold three more).

    Raises:
        ValueError: a DSN that is not ``postgresql://``, a bad prefix, a pool size below 1.
    """

    name = "purgatory"

    def __init__(
        self,
        dsn: str,
        *,
        prefix: str = "longpoll",
        command_timeout: float = 2.0,
        pool_size: int = 10,
    ) -> None:
        self.dsn = _check_dsn(dsn)
        self.prefix = check_prefix(prefix)
        if not 0 < command_timeout < math.inf:
            raise ValueError(f"command_timeout must be positive, got {command_timeout!r}")
        if pool_size < 1:
            raise ValueError(f"pool_size must be 1 or more, got {pool_size}")
        super().__init__()
        self.command_timeout = command_timeout
        self.pool_size = pool_size
        self.pool: asyncpg.Pool | None = None
        self.triggers: Any = None
        #: False from a connection error until PostgreSQL answers again.
        self.pg_ok = True
        self.last_error: str | None = None
        self.pg_errors = 0
        #: Request statements that timed out (counted, PostgreSQL not marked down for them).
        self.timeouts = 0
        #: Statements sent a second time on a new connection after a connection error.
        self.retries = 0
        self._expired_at = -math.inf
        #: Topics in PostgreSQL, as the monitor last counted them.
        self.topic_total = 0
        self._log = structlog.get_logger("examples.longpoll.postgres")
        self._monitor: asyncio.Task[None] | None = None
        self._summary: Callable[[], dict[str, object]] | None = None
        self._closing = False

    def make_feed(self, settings: Settings) -> PostgresFeed:
        """The feed the application serves (see :func:`~examples.longpoll.app.create_app`)."""
        return PostgresFeed(settings, self)

    async def __aenter__(self) -> Self:
        from aiopurgatory.postgres import PostgresTriggers

        await super().__aenter__()
        try:
            self.pool = await asyncpg.create_pool(
                self.dsn,
                min_size=1,
                max_size=self.pool_size,
                timeout=self.command_timeout,
                command_timeout=self.command_timeout,
            )
            async with self.pool.acquire() as conn, conn.transaction():
                await conn.execute(schema_sql(self.prefix))
            triggers = PostgresTriggers(
                self.purgatory,
                self.dsn,
                channel=f"{self.prefix}_triggers",
                command_timeout=self.command_timeout,
                reconnect_delay=(0.1, 2.0),
                health_check_interval=2.0,
            )
            await triggers.__aenter__()
        except BaseException:
            # PostgreSQL went away since the start-up check: leave nothing open behind.
            if self.pool is not None:
                self.pool.terminate()
            await super().__aexit__(None, None, None)
            raise
        self.triggers = triggers
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
            self._log.info("longpoll.postgres_summary", **self._summary())
        if self._monitor is not None:
            self._monitor.cancel()
            await asyncio.wait([self._monitor], timeout=self.command_timeout + 1)
        try:
            if self.triggers is not None:
                await self.triggers.aclose()
            if self.pool is not None:
                try:
                    async with asyncio.timeout(self.command_timeout):
                        await self.pool.close()
                except TimeoutError:
                    self.pool.terminate()
        finally:
            await super().__aexit__(exc_type, exc, tb)

    async def call(
        self,
        work: Callable[[Any], Awaitable[Any]],
        *,
        probe: bool = False,
        retry: bool = False,
    ) -> Any:
        """Run ``work(connection)`` on a pool connection within ``command_timeout + 0.5``
        seconds; a connection problem is a 503 and marks PostgreSQL down.

        ``retry``: the work may safely run twice (a read; an append carrying a token).
        A connection that failed (one that died with a restarted server, say) is then
        replaced, with every idle one of the pool, and the work run once more within
        the same deadline. A timeout marks PostgreSQL down only for the monitor's
        ``probe`` (a request's statement may be late because this process is busy).

        Raises:
            FeedError: 503 when PostgreSQL is unreachable or slower than the deadline.
        """
        pool = self.pool
        assert pool is not None

        async def once() -> Any:
            async with pool.acquire() as conn:
                return await work(conn)

        try:
            async with asyncio.timeout(self.command_timeout + 0.5):
                try:
                    result = await once()
                except PG_DOWN as exc:
                    if not retry or isinstance(exc, TimeoutError):
                        raise
                    self.retries += 1
                    await self._expire_idle_connections()
                    result = await once()
        except PG_DOWN as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError from None
            if probe or not isinstance(exc, TimeoutError):
                self.mark_down(exc)
            else:
                self.timeouts += 1
            raise FeedError(503, f"postgresql unavailable ({type(exc).__name__})") from None
        if not self.pg_ok:
            self.mark_up()
        return result

    async def _expire_idle_connections(self) -> None:
        # The pool's other connections may have died with the one that failed: have
        # the pool replace them all on their next use, at most once a second (a burst
        # of failures must not keep expiring the connections its retries just made).
        now = asyncio.get_running_loop().time()
        if now - self._expired_at >= 1.0 and self.pool is not None:
            self._expired_at = now
            await self.pool.expire_connections()

    def mark_down(self, exc: BaseException) -> None:
        self.pg_errors += 1
        self.last_error = _scrub(f"{type(exc).__name__}: {exc}", self.dsn)
        if self.pg_ok:
            self.pg_ok = False
            self._log.warning("longpoll.postgres_down", error=self.last_error)

    def mark_up(self) -> None:
        if not self.pg_ok:
            self.pg_ok = True
            self._log.warning("longpoll.postgres_up", errors=self.pg_errors)

    async def _watch_health(self) -> None:
        statement = count_sql(self.prefix)
        while not self._closing:
            with contextlib.suppress(FeedError):
                self.topic_total = int(
                    await self.call(lambda conn: conn.fetchval(statement), probe=True, retry=True)
                )
            await asyncio.sleep(1.0)

    @property
    def subscribed(self) -> bool:
        """The triggers' listener is connected."""
        return self.triggers is not None and bool(self.triggers.connected)


class PostgresFeed(StoredFeed):
    """Topics in PostgreSQL, GETs parked in this process's purgatory (see the module's docs).

    Args:
        settings: limits; ``retain`` and ``max_topics`` are applied in PostgreSQL
            (every process of one feed should be given the same).
        waiter: the connected :class:`PostgresWaiter`.
    """

    waiter: PostgresWaiter

    def __init__(self, settings: Settings, waiter: PostgresWaiter) -> None:
        super().__init__(settings, waiter)
        self.pg = waiter
        waiter._summary = self.summary
        self._append = append_sql(waiter.prefix)
        self._read_statement = read_sql(waiter.prefix)
        # GETs of one topic and offset asking in one loop iteration share one read.
        self._reads = Coalescer()

    # -- posting ---------------------------------------------------------------------------

    async def append(
        self, name: str, body: bytes, *, idempotency_key: str | None = None
    ) -> Appended:
        """Append ``body`` to topic ``name``, in a transaction of its own; its offset once
        committed. Every append carries a token (the client's ``idempotency_key``, kept
        ``Settings.idempotency_ttl`` seconds, else one of the server's own, kept a
        minute), so a transaction whose connection failed is run once more safely.

        Raises:
            FeedError: bad input (400/413), one topic too many (409), a key already
                used with another body (422), PostgreSQL down (503).
        """
        self.check_body(name, body)
        token = None if idempotency_key is not None else f"s:{uuid.uuid4().hex}"

        async def work(conn: Any) -> Appended:
            async with conn.transaction():
                return await self.append_in(
                    conn, name, body, idempotency_key=idempotency_key, _token=token
                )

        try:
            appended: Appended = await self.pg.call(work, retry=True)
        except FeedError as exc:
            if exc.status == 503:
                self.unavailable["post"] += 1
            raise exc from None
        if appended.replayed:
            self.replayed += 1
        else:
            self.messages_posted += 1
        return appended

    async def append_in(
        self,
        conn: Any,
        name: str,
        body: bytes,
        *,
        idempotency_key: str | None = None,
        _token: str | None = None,
    ) -> Appended:
        """Append ``body`` to topic ``name`` inside ``conn``'s open transaction (an
        ``asyncpg`` connection): the message and its wake-up commit with it, and
        neither happens if it rolls back.

        Raises:
            FeedError: bad input (400/413), one topic too many (409), a key already
                used with another body (422).
            asyncpg.PostgresError, OSError: what the driver raises (the transaction
                is then aborted).
        """
        text = self.check_body(name, body)
        if idempotency_key is not None:
            token, ttl = f"c:{idempotency_key}", self.settings.idempotency_ttl
        else:
            token, ttl = (_token or f"s:{uuid.uuid4().hex}"), 60.0
        offset, total, status = await conn.fetchrow(
            self._append,
            name,
            text,
            len(body),
            self.settings.retain,
            token,
            max(1, round(ttl * 1000)),
            body_digest(body),
            self.settings.max_topics,
        )
        if status == TOO_MANY_TOPICS:
            raise FeedError(409, f"the feed already holds {self.settings.max_topics} topics")
        if status == KEY_REUSED:
            raise FeedError(422, "this Idempotency-Key was used for another body")
        # In the same transaction: the waiters everywhere wake when it commits. A
        # replay raises it again (a no-op for the stored watermark: an atomic max).
        await self.pg.triggers.advance_in(conn, name, total)
        # The server's own token found: this request's first run committed, then its
        # reply was lost. Stored by this request, so no replay for the client.
        return Appended(offset, replayed=status == REPLAYED and idempotency_key is not None)

    # -- fetching --------------------------------------------------------------------------

    async def _read(self, name: str, offset: int) -> View:
        statement = self._read_statement
        limit = self.settings.max_response_bytes

        async def work(conn: Any) -> list[Any]:
            rows: list[Any] = await conn.fetch(statement, name, offset, limit)
            return rows

        rows = await self._reads.run((name, offset), lambda: self.pg.call(work, retry=True))
        if not rows:
            return View(0, 0, 0, 0, Fetched(offset, [], offset))
        start, end, total, position = rows[0][0], rows[0][1], rows[0][2], rows[0][3]
        messages = [row[5] for row in rows if row[4] is not None]
        first = max(offset, start)
        position = total if position is None else position
        return View(start, end, total, position, Fetched(first, messages, first + len(messages)))

    async def _wait(self, name: str, wait: float, threshold: int) -> None:
        # PostgresTriggers.watch LISTENs to the topic's partition, then reads its stored
        # watermark: a POST committed after our read completes the op either way. It
        # waits for the op, never for that read (a hung server holds nobody past the wait).
        op = ap.WatermarkOperation(wait)
        with self.parking(name):
            await self.pg.triggers.watch(op, {name: threshold})

    def summary(self) -> dict[str, object]:
        """What this process met of PostgreSQL (logged at close as
        ``longpoll.postgres_summary``)."""
        w = self.pg
        stats = None if w.triggers is None else w.triggers.statistics()
        return {
            "unavailable": dict(self.unavailable),
            "lateness_max": round(self.lateness_max, 3),
            "retries": w.retries,
            "replayed": self.replayed,
            "postgres_errors": w.pg_errors,
            "resyncs": 0 if stats is None else stats.resyncs,
        }

    # -- state -----------------------------------------------------------------------------

    def topic_count(self) -> int:
        """Topics in PostgreSQL, as the health monitor last counted them (every second)."""
        return self.pg.topic_total

    def metric_families(self) -> list[Any]:
        """PostgreSQL up, errors, the triggers' link (``longpoll_postgres_*``)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        w = self.pg
        stats = None if w.triggers is None else w.triggers.statistics()
        unavailable = CounterMetricFamily(
            "longpoll_unavailable",
            "Requests answered 503 because PostgreSQL could not be read or written: post, "
            "get (a new GET), parked (a parked GET, at the end of its wait).",
            labels=["request"],
        )
        for request, count in self.unavailable.items():
            unavailable.add_metric([request], count)
        return [
            GaugeMetricFamily(
                "longpoll_postgres_up",
                "1 while PostgreSQL answers this process.",
                value=1 if w.pg_ok else 0,
            ),
            GaugeMetricFamily(
                "longpoll_postgres_triggers_connected",
                "1 while the triggers' listener is connected.",
                value=1 if w.subscribed else 0,
            ),
            CounterMetricFamily(
                "longpoll_postgres_errors",
                "Statements that failed for a connection problem.",
                value=w.pg_errors,
            ),
            CounterMetricFamily(
                "longpoll_postgres_timeouts",
                "Request statements slower than the command timeout (not marked down).",
                value=w.timeouts,
            ),
            CounterMetricFamily(
                "longpoll_postgres_retries",
                "Statements run again on a new connection after their connection failed.",
                value=w.retries,
            ),
            CounterMetricFamily(
                "longpoll_postgres_resyncs",
                "Times the triggers' listener reconnected and re-read the watched watermarks.",
                value=0 if stats is None else stats.resyncs,
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
        w = self.pg
        body: dict[str, object] = {
            "status": "ok",
            "waiter": self.waiter.name,
            "postgres": "up" if w.pg_ok else "down",
            "subscribed": w.subscribed,
            "pid": os.getpid(),
            "parked": self.parked,
        }
        if w.pg_ok and w.subscribed:
            return 200, body
        body["status"] = "degraded"
        body["error"] = w.last_error
        return 503, body
