"""SyncPublisher: triggers from synchronous code (a Django view, a Celery task), on psycopg 3.

The same table, statement and payloads as :class:`PostgresTriggers`, so an
advance made here completes operations parked in any asyncio process on the
channel. Each call is one statement, sent at once (no batching: synchronous
callers wait for their own call anyway). A call made where a sampled
OpenTelemetry span is current (the calling thread's) carries its
``traceparent``, so the waits it completes elsewhere link to that span.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, Self

from .._local import _traceparent
from .._transport import Key, Value, check_key, check_value
from ._connections import describe_dsn, error_text
from ._errors import PostgresTriggersClosedError, PostgresTriggersError
from ._sender import statement_arguments
from ._sql import PSYCOPG, create_sql, exists_sql, publish_sql
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

__all__ = ["SyncPublisher"]


class SyncPublisher:
    """Publish triggers to a PostgreSQL channel from synchronous code (psycopg 3).

    ``advance`` and ``check_and_complete`` commit at once, on the publisher's
    connection. ``advance_in(conn, key, value)`` runs inside the caller's
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
        self._statement = publish_sql(self._channel, PSYCOPG)
        self._lock = threading.Lock()
        self._table_checked = False
        self._closed = False
        self.published = 0

    @property
    def channel(self) -> str:
        """The channel."""
        return self._channel

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<SyncPublisher channel={self._channel!r} server={self.where} {state}>"

    def advance(self, key: Key, value: Value) -> None:
        """Raise ``key``'s watermark to ``value`` in the table and wake its waiters everywhere.

        Returns once committed (with a connection passed in: once its
        transaction, or the application's open one, commits).

        Raises:
            TypeError, ValueError: as ``PostgresTriggers.advance``; nothing sent.
            PostgresTriggersClosedError: after :meth:`close`.
            PostgresTriggersError: the server could not be reached or failed
                the statement (a lost connection is retried once on a new one).
        """
        key = check_wire_size(check_key(key))
        value = check_value(value)
        batch = Batch()
        batch.advance(key, value)
        self._publish(batch)

    def check_and_complete(self, key: Key) -> None:
        """Check ``key``'s watchers in every process on the channel (commits at once).

        Raises:
            TypeError, ValueError: ``key`` cannot cross the wire; nothing sent.
            PostgresTriggersClosedError: after :meth:`close`.
            PostgresTriggersError: as :meth:`advance`.
        """
        key = check_wire_size(check_key(key))
        batch = Batch()
        batch.check(key)
        self._publish(batch)

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

    def _publish(self, batch: Batch) -> None:
        import psycopg

        sender = sender_field(SENDER_TRANSACTION, _traceparent())
        arguments = statement_arguments(sender, batch, self._channel, self._count)
        with self._lock:
            if self._closed:
                raise PostgresTriggersClosedError("SyncPublisher is closed")
            failure: BaseException | None = None
            for _attempt in range(2):
                try:
                    connection = self._ensure_connection()
                    self._ensure_table(connection)
                    with connection.transaction():
                        connection.execute(self._statement, arguments)
                except psycopg.OperationalError as exc:
                    failure = exc
                    if self._owned:
                        self._drop()
                        continue  # a lost connection: once more on a new one
                except psycopg.Error as exc:
                    failure = exc
                else:
                    self.published += 1
                    return
                break
            assert failure is not None
            text = error_text(failure)
        raise PostgresTriggersError(f"cannot publish to {self.where}: {text}")

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

    def close(self) -> None:
        """Close the publisher's own connection (a connection passed in stays open). Idempotent."""
        with self._lock:
            self._closed = True
            if self._owned:
                self._drop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
