"""SyncPublisher: triggers from synchronous code (a Django view, a Celery task), on psycopg 3.

The same table, statement and payloads as :class:`PostgresTriggers`, so an
advance made here completes operations parked in any asyncio process on the
channel. Each call is one statement, sent at once (no batching: synchronous
callers wait for their own call anyway). A call made where a sampled
OpenTelemetry span is current (the calling thread's) carries its
``traceparent``, so the waits it completes elsewhere link to that span.

**Through an outage** (a publisher made from a DSN): a call whose statement meets
a transient failure (the server restarting, refusing connections, a connection
reset; :func:`failure_kind`) does not raise. Its trigger is kept in a bounded,
coalesced outbox and committed by a background thread when the server is back,
with backoff; later calls join the outbox while anything is kept, so none
overtakes it; ``flush(timeout)`` and ``close()`` return how many are still kept;
the outage is logged once (``aiopurgatory.postgres.publisher_outage``, then
``publisher_recovered``); a forked child starts with an empty outbox and a
connection of its own. The outbox is the Redis SyncPublisher's
(:mod:`aiopurgatory._outbox`). What cannot be kept still raises: the outbox full
(``max_pending``), the publisher closed, credentials refused before it ever
reached the server, a statement the server refuses for good (a missing
privilege, say). A publisher on a connection passed in keeps nothing: its
advance belongs to the application's transaction on that connection, and a
failure is the application's to see (:class:`PostgresTriggersError`).
A hung server (paused, unreachable without a reset) holds a call for as long as
libpq waits; the outbox takes over once the connection fails.
"""

from __future__ import annotations

import os
import secrets
import threading
import weakref
from types import TracebackType
from typing import Any, Final, Self

from .._local import _traceparent
from .._logging import LazyLogger
from .._outbox import Kind, Outbox
from .._transport import Key, Value, check_key, check_value
from .._validation import as_seconds
from ._connections import describe_dsn, error_text
from ._errors import PostgresTriggersClosedError, PostgresTriggersError
from ._sender import MAX_STATEMENT_TRIGGERS, split, statement_arguments
from ._sql import PSYCOPG, create_sql, exists_sql, publish_sql
from ._statistics import SyncPublisherStatistics
from ._wire import (
    DEFAULT_CHANNEL,
    DEFAULT_PARTITIONS,
    SENDER_TRANSACTION,
    Batch,
    check_channel,
    check_partitions,
    check_wire_size,
    sender_field,
)

__all__ = ["DEFAULT_MAX_PENDING", "SyncPublisher", "failure_kind"]

#: Triggers (distinct keys) a SyncPublisher keeps at most while the server is away.
DEFAULT_MAX_PENDING: Final = 10_000

# SQLSTATE classes that say "not now": connection exception, insufficient
# resources (too many connections), operator intervention (shutting down,
# starting up), transaction rollback (a serialization failure, a deadlock),
# system error.
_TRANSIENT_CLASSES: Final = frozenset(("08", "53", "57", "40", "58"))


def failure_kind(exc: BaseException) -> Kind:
    """Whether retrying ``exc``'s statement later can succeed.

    ``"auth"``: the credentials were refused (SQLSTATE class 28, or libpq's
    words for it at connect); ``"transient"``: the connection failed, the server
    is shutting down, starting up or out of connections; ``"refused"``: the
    server failed this statement for good (a missing privilege, say).
    """
    import psycopg

    sqlstate = getattr(exc, "sqlstate", None) or ""
    text = str(exc).lower()
    if sqlstate.startswith("28") or any(
        words in text for words in ("password authentication failed", "no password supplied")
    ):
        return "auth"
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | OSError):
        return "transient"
    if sqlstate[:2] in _TRANSIENT_CLASSES or not isinstance(exc, psycopg.Error):
        return "transient"
    return "refused"


# Every live publisher with a connection of its own, for the fork hook (weakly).
_LIVE: weakref.WeakSet[SyncPublisher] = weakref.WeakSet()
# Connections a forked child inherited: never used nor closed there (closing
# would end the parent's session on the shared socket), and kept from the
# garbage collector for the same reason.
_INHERITED: list[Any] = []


def _after_fork_in_child() -> None:
    for publisher in list(_LIVE):
        publisher._reset_after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


class SyncPublisher:
    """Publish triggers to a PostgreSQL channel from synchronous code (psycopg 3).

    ``advance`` and ``check_and_complete`` commit at once, on the publisher's
    connection; while the server cannot be reached, they keep the trigger for
    delivery instead of raising (a publisher from a DSN; see the module's
    documentation). ``advance_in(conn, key, value)`` runs inside the caller's
    transaction on its own ``psycopg.Connection`` (Django's
    ``django.db.connection.connection`` is one): the waiters wake when that
    transaction commits, never if it rolls back. Safe to share between threads
    (one call at a time on its connection).

    Args:
        dsn_or_connection: a ``postgresql://`` DSN (the publisher opens its own
            connection, in autocommit, on first use and again after a loss) or a
            ``psycopg.Connection`` (used as it is, not closed: ``advance`` then
            runs in ``conn.transaction()``, so inside the application's open
            transaction it commits with it).
        channel: as :class:`PostgresTriggers` (default ``"aiopurgatory"``).
        partitions: as :class:`PostgresTriggers` (default 64): the same on
            every process of the channel.
        connect_timeout: seconds a connect may take (default 5).
        max_pending: the most triggers (distinct keys) kept while the server is
            away (default 10,000); one more raises :class:`PostgresTriggersError`.
        reconnect_delay: the first and the longest wait between two delivery
            attempts of kept triggers, in seconds (default 0.1 and 10).
        close_timeout: seconds ``close()`` (and interpreter exit) waits for the
            delivery of kept triggers (default 5).
        logger: a structlog-compatible logger (default: the library's).

    Raises:
        TypeError, ValueError: a bad argument.
    """

    def __init__(
        self,
        dsn_or_connection: Any,
        *,
        channel: str = DEFAULT_CHANNEL,
        partitions: int = DEFAULT_PARTITIONS,
        connect_timeout: float = 5.0,
        max_pending: int = DEFAULT_MAX_PENDING,
        reconnect_delay: tuple[float, float] = (0.1, 10.0),
        close_timeout: float = 5.0,
        logger: Any | None = None,
    ) -> None:
        import psycopg

        self._channel = check_channel(channel)
        self._count = check_partitions(partitions)
        if isinstance(dsn_or_connection, str):
            if not dsn_or_connection.startswith(("postgresql://", "postgres://")):
                raise ValueError("dsn_or_connection must be a postgresql:// DSN or a connection")
            self._dsn: str | None = dsn_or_connection
            self._connection: Any = None
            self._owned = True
            self.where = describe_dsn(dsn_or_connection)
        elif isinstance(dsn_or_connection, psycopg.Connection):
            self._dsn = None
            self._connection = dsn_or_connection
            self._owned = False
            self.where = "a psycopg.Connection"
        else:
            raise TypeError(
                "dsn_or_connection must be a postgresql:// DSN or a psycopg.Connection, "
                f"got {type(dsn_or_connection).__name__}"
            )
        if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, int | float):
            raise TypeError("connect_timeout must be a number of seconds")
        if not 0 < connect_timeout < float("inf"):
            raise ValueError(
                f"connect_timeout must be positive and finite, got {connect_timeout!r}"
            )
        self._connect_timeout = connect_timeout
        if isinstance(max_pending, bool) or not isinstance(max_pending, int):
            raise TypeError(f"max_pending must be an int, got {type(max_pending).__name__}")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        if not isinstance(reconnect_delay, tuple) or len(reconnect_delay) != 2:
            raise TypeError("reconnect_delay must be a tuple (first, longest) of seconds")
        first = _seconds(reconnect_delay[0], "reconnect_delay[0]")
        longest = _seconds(reconnect_delay[1], "reconnect_delay[1]")
        if longest < first:
            raise ValueError(f"reconnect_delay must be (first, longest), got {reconnect_delay!r}")
        self._close_timeout = _seconds(close_timeout, "close_timeout")
        if logger is not None and not callable(getattr(logger, "bind", None)):
            raise TypeError(
                f"logger must be a structlog-compatible logger (with bind()), "
                f"got {type(logger).__name__}"
            )
        self._id = f"{os.getpid()}-{secrets.token_hex(6)}"
        self._logger: Any = (LazyLogger() if logger is None else logger).bind(
            channel=self._channel, instance=self._id
        )
        self._statement = publish_sql(self._channel, PSYCOPG)
        self._lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._table_checked = False
        self._closed = False
        self.published = 0
        self._outbox = Outbox(
            self._send_kept,
            classify=failure_kind,
            error_text=error_text,
            raise_for=self._error,
            closed=PostgresTriggersClosedError,
            full=PostgresTriggersError,
            server="PostgreSQL",
            events="aiopurgatory.postgres",
            max_pending=max_pending,
            reconnect_delay=(first, longest),
            # A call that joined a delivery waits for it: one attempt, a connect
            # at most (twice: the lost connection's, then a new one's) and slack.
            wait_bound=2 * connect_timeout + 1.0,
            close_timeout=self._close_timeout,
            name=f"aiopurgatory-pg-syncpub-{self._id}",
            logger=self._logger,
        )
        if self._owned:
            _LIVE.add(self)

    @property
    def channel(self) -> str:
        """The channel."""
        return self._channel

    @property
    def instance(self) -> str:
        """This publisher's id (``<pid>-<random hex>``)."""
        return self._id

    @property
    def closed(self) -> bool:
        """``close()`` was called."""
        return self._closed

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<SyncPublisher channel={self._channel!r} server={self.where} {state}>"

    def advance(self, key: Key, value: Value) -> None:
        """Raise ``key``'s watermark to ``value`` in the table and wake its waiters everywhere.

        Returns once committed (with a connection passed in: once its
        transaction, or the application's open one, commits), or, from a DSN
        while the server cannot be reached, once the trigger is kept for
        delivery (see the module's documentation).

        Raises:
            TypeError, ValueError: as ``PostgresTriggers.advance``; nothing sent.
            PostgresTriggersClosedError: after :meth:`close`.
            PostgresTriggersError: not kept: ``max_pending`` triggers are kept
                already, the credentials were refused before the publisher ever
                reached the server, or the server failed the statement for good;
                with a connection passed in, any failure (a lost connection of
                the publisher's own is retried once on a new one first).
        """
        key = check_wire_size(check_key(key))
        value = check_value(value)
        batch = Batch()
        batch.advance(key, value)
        self._call(batch, key, value)

    def check_and_complete(self, key: Key) -> None:
        """Check ``key``'s watchers in every process on the channel (commits at once).

        Raises:
            TypeError, ValueError: ``key`` cannot cross the wire; nothing sent.
            PostgresTriggersClosedError: after :meth:`close`.
            PostgresTriggersError: not kept, as :meth:`advance`.
        """
        key = check_wire_size(check_key(key))
        batch = Batch()
        batch.check(key)
        self._call(batch, key, None)

    def advance_in(self, conn: Any, key: Key, value: Value) -> None:
        """Advance ``key`` to ``value`` inside ``conn``'s open transaction.

        Waiters in every process wake when that transaction commits, never if
        it rolls back; on a connection in autocommit it commits at once.

        Args:
            conn: a ``psycopg.Connection`` (Django's ``connection.connection``).
            key, value: as :meth:`advance`.

        Raises:
            TypeError: ``conn`` is not a psycopg.Connection; ``key``/``value`` as
                :meth:`advance`.
            ValueError: as :meth:`advance`.
            PostgresTriggersClosedError: after :meth:`close`.
            psycopg.Error: the statement failed (the caller's transaction is
                then aborted, as for any failed statement).
        """
        import psycopg

        key = check_wire_size(check_key(key))
        value = check_value(value)
        if not isinstance(conn, psycopg.Connection):
            raise TypeError(f"conn must be a psycopg.Connection, got {type(conn).__name__}")
        if self._closed:
            raise PostgresTriggersClosedError("SyncPublisher is closed")
        if not self._table_checked:
            with self._lock:
                self._ensure_table(self._ensure_connection())
        batch = Batch()
        batch.advance(key, value)
        sender = sender_field(SENDER_TRANSACTION, _traceparent())
        arguments = statement_arguments(sender, batch, self._channel, self._count)
        conn.execute(self._statement, arguments)

    def _call(self, batch: Batch, key: Key, value: Value | None) -> None:
        """Send one call's trigger now, or keep it (a publisher of its own connection)."""
        import psycopg

        if self._closed:
            raise PostgresTriggersClosedError("SyncPublisher is closed")
        sender = sender_field(SENDER_TRANSACTION, _traceparent())
        if not self._owned:
            try:
                self._send(batch, sender)
            except psycopg.Error as exc:
                error = self._error(exc)
                raise error from None
            return
        outbox = self._outbox
        if outbox.join(key, value):
            return
        try:
            self._send(batch, sender)
        except (psycopg.Error, OSError) as exc:
            outbox.keep(exc, key, value)  # raises what cannot be kept
        else:
            outbox.sent_now()

    def _send(self, batch: Batch, sender: str) -> None:
        """Commit ``batch`` in one statement (a lost connection of the publisher's own
        is replaced and the statement sent once more); raises the driver's error."""
        import psycopg

        arguments = statement_arguments(sender, batch, self._channel, self._count)
        with self._lock:
            for attempt in range(2):
                try:
                    connection = self._ensure_connection()
                    self._ensure_table(connection)
                    with connection.transaction():
                        connection.execute(self._statement, arguments)
                except psycopg.OperationalError:
                    if not self._owned or attempt:
                        raise
                    self._drop()  # a lost connection: once more on a new one
                    continue
                self.published += 1
                return

    def _send_kept(self, batch: Batch) -> None:
        """The delivery thread's send: ``batch`` in statements of at most
        :data:`~._sender.MAX_STATEMENT_TRIGGERS` triggers (kept triggers carry no
        trace context: they are coalesced per key, whoever made them)."""
        sender = sender_field(SENDER_TRANSACTION, None)
        for part in split(batch, MAX_STATEMENT_TRIGGERS):
            self._send(part, sender)

    def _error(self, failure: BaseException) -> PostgresTriggersError:
        """The one-line error a caller gets for ``failure`` (no password in it)."""
        return PostgresTriggersError(f"cannot publish to {self.where}: {error_text(failure)}")

    def _ensure_connection(self) -> Any:
        import psycopg

        if self._connection is not None and not self._connection.closed:
            return self._connection
        if not self._owned:
            raise PostgresTriggersError("the psycopg.Connection passed to SyncPublisher is closed")
        assert self._dsn is not None
        self._connection = psycopg.connect(
            self._dsn, autocommit=True, connect_timeout=max(1, round(self._connect_timeout))
        )
        return self._connection

    def _ensure_table(self, connection: Any) -> None:
        if self._table_checked:
            return
        with connection.transaction():
            if connection.execute(exists_sql(self._channel)).fetchone()[0] is None:
                connection.execute(create_sql(self._channel))
        self._table_checked = True

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def _reset_after_fork(self) -> None:
        # In a forked child: the parent's connection is not ours to use or close,
        # and its lock may have been held by a thread that does not exist here.
        if self._connection is not None:
            _INHERITED.append(self._connection)
        self._connection = None
        self._lock = threading.Lock()
        self._close_lock = threading.Lock()

    def flush(self, timeout: float | None = None) -> int:
        """Wait until every kept trigger is committed, or ``timeout`` seconds.

        Asks the delivery thread to try at once (not after its backoff).

        Args:
            timeout: seconds to wait at most (None: as long as it takes).

        Returns:
            How many triggers (distinct keys) are still kept: 0 when everything
            was delivered (at once when nothing is kept).

        Raises:
            ValueError: ``timeout`` is negative or not finite.
        """
        return self._outbox.flush(None if timeout is None else _wait(timeout))

    def close(self, timeout: float | None = None) -> int:
        """Deliver what is kept (up to ``timeout`` seconds), stop, close the publisher's
        own connection (a connection passed in stays open).

        Idempotent; later calls raise :class:`PostgresTriggersClosedError`.

        Args:
            timeout: seconds to wait for the delivery of kept triggers (default:
                the ``close_timeout`` given to the constructor).

        Returns:
            How many kept triggers were not delivered (0 when none was kept or all
            were; 0 on a second call). They are counted in ``statistics().dropped``
            and logged (``aiopurgatory.postgres.publisher_dropped``).

        Raises:
            ValueError: ``timeout`` is negative or not finite.
        """
        wait = self._close_timeout if timeout is None else _wait(timeout)
        with self._close_lock:
            if self._closed:
                return 0
            self._closed = True
        left = self._outbox.close(wait)
        _LIVE.discard(self)
        with self._lock:
            if self._owned:
                self._drop()
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
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _seconds(value: object, argument: str) -> float:
    seconds = as_seconds(value, argument)
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{argument} must be positive and finite, got {value!r}")
    return seconds


def _wait(timeout: object) -> float:
    seconds = as_seconds(timeout, "timeout")
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"timeout must be >= 0 and finite, got {timeout!r}")
    return seconds
