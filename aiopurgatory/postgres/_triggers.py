"""PostgresTriggers: a purgatory's triggers shared by every process through PostgreSQL.

The parts, one module each (the Redis transport's layout):

* :mod:`._connections`: where the server is (a DSN or an ``asyncpg.Pool``), the
  connections, backoff and the record of failures;
* :mod:`._sender`: the pending batch, sent by a task in one statement per loop
  iteration (atomic max of the watermarks and a NOTIFY per partition);
* :mod:`._listener`: LISTEN to the partitions of the watched keys, a health check
  with a canary, renewal and resync after a loss;
* :mod:`._reader`: the reads of stored watermarks (catch-up, resync, fetch);
* :mod:`._wire` and :mod:`._sql`: payloads, names and statements (sans-IO).

This class checks arguments, wires the parts together, starts and closes them.
A trigger made where a sampled OpenTelemetry span is current (``advance_in``
included: the span current at the call) carries that span's ``traceparent``
(:mod:`._wire`), and is applied elsewhere with it current, so a traced wait
links to it (:mod:`aiopurgatory.tracing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import secrets
from collections.abc import Coroutine, Hashable, Iterable, Mapping
from types import TracebackType
from typing import Any, Self

import asyncpg

from .._detect import current_backend
from .._local import _traceparent
from .._logging import LazyLogger
from .._operation import Outcome
from .._purgatory import Purgatory
from .._transport import Key, Value, check_key, check_value
from .._validation import as_seconds
from ._connections import CONNECTION_ERRORS, Link, Source
from ._errors import PostgresTriggersClosedError
from ._listener import Listener
from ._reader import WatermarkReader
from ._sender import Sender, statement_arguments
from ._sql import PSYCOPG, create_sql, exists_sql, publish_sql, read_sql
from ._statistics import PostgresTriggersStatistics
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

__all__ = ["PostgresTriggers", "refuse_virtual_time"]

_NEW, _RUNNING, _CLOSING, _CLOSED = "new", "running", "closing", "closed"


def refuse_virtual_time() -> None:
    """Raise RuntimeError on trio or on a virtual-time loop (network I/O cannot run there)."""
    if current_backend() == "trio":
        raise RuntimeError(
            "aiopurgatory.postgres.PostgresTriggers needs an asyncio event loop (asyncio or "
            "uvloop): asyncpg is asyncio-only"
        )
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    from ..simulation import VirtualTimeLoop

    if isinstance(loop, VirtualTimeLoop):
        raise RuntimeError(
            "aiopurgatory.postgres.PostgresTriggers cannot run on a virtual-time loop "
            "(aiopurgatory.simulation): it talks to a real server, on real time. In tests "
            "on virtual time, give the application an aiopurgatory.LocalTriggers instead "
            "(the same Triggers interface, in memory)."
        )


def _positive(value: object, argument: str) -> float:
    try:
        seconds = as_seconds(value, argument)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:
        raise ValueError(f"{argument} must be positive and finite, got {value!r}")
    return seconds


class PostgresTriggers:
    """Triggers of a purgatory shared with every process on a PostgreSQL channel.

    ``check_and_complete(key)`` and ``advance(key, value)`` apply to the local
    purgatory at once and are sent to the server by a task: the triggers of one
    loop iteration in one statement, which raises the advanced keys' stored
    watermarks (an atomic max in the table ``"<channel>_watermarks"``) and
    NOTIFYs the partition channels ``<channel>_<n>`` of their keys. A listener
    connection LISTENs to the partitions of the keys this process watches (no
    others) and applies what other processes send. Watermarks are re-read for
    every watched key whenever the listener (re)connects, so a notification
    missed while disconnected costs a delay, never a lost wake-up.

    :meth:`advance_in` writes an advance inside the caller's own transaction:
    waiters everywhere (this process's too) wake when it commits, never if it
    rolls back.

    Use as an async context manager: entering connects, creates the table if it
    is missing, LISTENs, and raises :class:`PostgresTriggersError` if the server
    is unreachable or does not answer within ``command_timeout``. After a
    successful start, losses are retried forever with backoff (see
    :meth:`statistics`). Connections: from a DSN, three of its own (sender,
    reader, listener); from an ``asyncpg.Pool``, the listener holds one of the
    pool's while it runs and the sender and the reader take one per statement.

    Args:
        purgatory: the local purgatory, or None for a publisher only.
        dsn_or_pool: a ``postgresql://`` DSN or an ``asyncpg.Pool`` (not closed).
        channel: 1 to 40 ASCII letters, digits or underscores (default
            ``"aiopurgatory"``); every process sharing triggers uses the same.
        partitions: NOTIFY channels a channel's keys are spread over (default
            64, from 1 to 4096); every process and SyncPublisher on the channel
            must use the same.
        health_check_interval: seconds between two health checks of the
            listener (default 5): a paused server or a deaf listener is found
            within twice that, and the connection renewed.
        reconnect_delay: the first and the longest delay between retries, in
            seconds (default 0.1 and 10).
        close_timeout: seconds ``aclose()`` waits for pending triggers (default 5).
        command_timeout: seconds any one statement may take, its connect
            included (default 5).
        linger: seconds a partition stays LISTENed to after its last watched
            key is gone (default 5).
        sweep_interval: seconds between two looks at the purgatory's keys, for
            keys watched on the purgatory directly (default 0.25).
        read_first_below: a :meth:`watch` whose operation's timeout is below
            this many seconds reads the stored watermarks *before* watching
            (bounded by ``command_timeout``), so that a stored state that
            already meets it completes it even with a timeout of 0 (default 0.1).
        logger: a structlog-compatible logger (default: the library's).

    Raises:
        TypeError, ValueError: a bad argument.
        RuntimeError: constructed under trio or on a virtual-time loop.
    """

    def __init__(
        self,
        purgatory: Purgatory[Any] | None,
        dsn_or_pool: str | asyncpg.Pool,
        *,
        channel: str = DEFAULT_CHANNEL,
        partitions: int = DEFAULT_PARTITIONS,
        health_check_interval: float = 5.0,
        reconnect_delay: tuple[float, float] = (0.1, 10.0),
        close_timeout: float = 5.0,
        command_timeout: float = 5.0,
        linger: float = 5.0,
        sweep_interval: float = 0.25,
        read_first_below: float = 0.1,
        logger: Any | None = None,
    ) -> None:
        refuse_virtual_time()
        if purgatory is not None and not isinstance(purgatory, Purgatory):
            raise TypeError(
                "purgatory must be an aiopurgatory.Purgatory or None, "
                f"got {type(purgatory).__name__}"
            )
        self._channel = channel = check_channel(channel)
        self._count = check_partitions(partitions)
        health = _positive(health_check_interval, "health_check_interval")
        if not isinstance(reconnect_delay, tuple) or len(reconnect_delay) != 2:
            raise TypeError("reconnect_delay must be a tuple (first, longest) of seconds")
        first = _positive(reconnect_delay[0], "reconnect_delay[0]")
        longest = _positive(reconnect_delay[1], "reconnect_delay[1]")
        if longest < first:
            raise ValueError(f"reconnect_delay must be (first, longest), got {reconnect_delay!r}")
        self._close_timeout = _positive(close_timeout, "close_timeout")
        self._command_timeout = call = _positive(command_timeout, "command_timeout")
        linger_for = _positive(linger, "linger")
        sweep_every = _positive(sweep_interval, "sweep_interval")
        self._read_first_below = as_seconds(read_first_below, "read_first_below")
        if self._read_first_below < 0:
            raise ValueError(f"read_first_below must be >= 0, got {read_first_below!r}")
        if logger is not None and not callable(getattr(logger, "bind", None)):
            raise TypeError(
                f"logger must be a structlog-compatible logger (with bind()), "
                f"got {type(logger).__name__}"
            )
        self._source = source = Source(
            dsn_or_pool, command_timeout=call, reconnect_delay=(first, longest)
        )
        self._id = f"{os.getpid()}-{secrets.token_hex(6)}"
        self._purgatory = purgatory
        self._logger: Any = (LazyLogger() if logger is None else logger).bind(
            channel=channel, instance=self._id
        )
        self._publish_sql = publish_sql(channel)
        self._psycopg_publish_sql = publish_sql(channel, PSYCOPG)
        self._sender = Sender(
            self._id,
            Link(source, call),
            source,
            statement=self._publish_sql,
            channel=channel,
            partitions=self._count,
            logger=self._logger,
        )
        self._reader = WatermarkReader(
            purgatory, Link(source, call), source, statement=read_sql(channel), logger=self._logger
        )
        self._listener: Listener | None = (
            None
            if purgatory is None
            else Listener(
                self._id,
                purgatory,
                source,
                self._reader,
                channel=channel,
                partitions=self._count,
                health_check_interval=health,
                command_timeout=call,
                linger=linger_for,
                sweep_interval=sweep_every,
                logger=self._logger,
            )
        )
        self._state = _NEW
        self._tasks: list[asyncio.Task[None]] = []
        self._triggers = 0

    # -- properties ----------------------------------------------------------------------

    @property
    def channel(self) -> str:
        """The channel."""
        return self._channel

    @property
    def instance(self) -> str:
        """This instance's id (``<pid>-<random hex>``), carried by its payloads."""
        return self._id

    @property
    def purgatory(self) -> Purgatory[Any] | None:
        """The local purgatory, or None for a publisher only."""
        return self._purgatory

    @property
    def connected(self) -> bool:
        """The listener is connected (publisher only: the last publish succeeded)."""
        if self._state != _RUNNING:
            return False
        listener = self._listener
        return self._sender.connected if listener is None else listener.connected

    def __repr__(self) -> str:
        role = "publisher" if self._purgatory is None else f"purgatory={self._purgatory.name!r}"
        link = "connected" if self.connected else "disconnected"
        return (
            f"<PostgresTriggers channel={self._channel!r} server={self._source.where} {role} "
            f"{self._state} {link}>"
        )

    def _check_running(self) -> None:
        if self._state != _RUNNING:
            raise PostgresTriggersClosedError(
                "PostgresTriggers is not started: use `async with`"
                if self._state == _NEW
                else "PostgresTriggers is closed"
            )

    # -- triggers ------------------------------------------------------------------------

    def check_and_complete(self, key: Key) -> int:
        """Check ``key``'s watchers here at once, and in every process on the channel.

        Returns:
            How many operations of the local purgatory this call completed.

        Raises:
            TypeError: ``key`` is not a str, bytes or int (bool refused too).
            ValueError: ``key`` is longer than a notification can carry
                (:data:`~aiopurgatory.postgres.MAX_KEY_BYTES` as JSON).
            PostgresTriggersClosedError: before ``async with`` or after ``aclose()``.
        """
        key = check_wire_size(check_key(key))
        self._check_running()
        purgatory = self._purgatory
        completed = 0 if purgatory is None else purgatory.check_and_complete(key)
        sender = self._sender
        traceparent = _traceparent()
        (sender.pending if traceparent is None else sender.traced_batch(traceparent)).check(key)
        self._triggers += 1
        sender.wakeup.set()
        return completed

    def advance(self, key: Key, value: Value) -> int:
        """Raise ``key``'s watermark to ``value`` here at once, in the table and everywhere.

        Returns:
            How many operations of the local purgatory this call completed.

        Raises:
            TypeError: ``key`` or ``value`` has a type that cannot be sent.
            ValueError: ``value`` is NaN, infinite or an int beyond +-2**53;
                ``key`` is too long for a notification.
            PostgresTriggersClosedError: before ``async with`` or after ``aclose()``.
        """
        key = check_wire_size(check_key(key))
        value = check_value(value)
        self._check_running()
        purgatory = self._purgatory
        completed = 0 if purgatory is None else purgatory.advance(key, value)
        sender = self._sender
        traceparent = _traceparent()
        batch = sender.pending if traceparent is None else sender.traced_batch(traceparent)
        batch.advance(key, value)
        self._triggers += 1
        sender.wakeup.set()
        return completed

    async def advance_in(self, conn: Any, key: Key, value: Value) -> None:
        """Advance ``key`` to ``value`` inside ``conn``'s open transaction.

        The watermark is raised and the notification queued on the caller's own
        connection, in its transaction: every process's waiters (this one's
        too) wake when that transaction commits, and none if it rolls back.
        On a connection outside a transaction it commits at once. The local
        purgatory is not advanced by the call itself (the transaction may still
        roll back): its waiters wake when the notification comes back.

        Args:
            conn: an ``asyncpg.Connection`` (or a pool's connection), or a
                ``psycopg.AsyncConnection``. For SQLAlchemy's asyncio engine, its
                driver connection (``(await conn.get_raw_connection()).driver_connection``).
            key, value: as :meth:`advance`.

        Raises:
            TypeError: ``conn`` is none of those; ``key`` or ``value`` as :meth:`advance`.
            ValueError: as :meth:`advance`.
            PostgresTriggersClosedError: before ``async with`` (which creates the
                table) or after ``aclose()``.
            Exception: what the driver raises for the statement (the caller's
                transaction is then aborted, as for any failed statement).
        """
        key = check_wire_size(check_key(key))
        value = check_value(value)
        kind = _driver(conn)
        self._check_running()
        batch = Batch()
        batch.advance(key, value)
        sender = sender_field(SENDER_TRANSACTION, _traceparent())
        arguments = statement_arguments(sender, batch, self._channel, self._count)
        if kind == "asyncpg":
            await conn.fetchval(self._publish_sql, *arguments)
        else:
            await conn.execute(self._psycopg_publish_sql, arguments)
        self._triggers += 1

    async def flush(self) -> None:
        """Wait until every trigger made so far has been committed to the server.

        While the server is unreachable this waits (the sender retries): wrap it
        in a timeout to bound the wait.

        Raises:
            PostgresTriggersClosedError: before ``async with``, or closed before
                they were sent.
        """
        if self._state == _NEW:
            raise PostgresTriggersClosedError("PostgresTriggers is not started: use `async with`")
        if not self._sender:
            return
        if self._state == _CLOSED:
            raise PostgresTriggersClosedError("PostgresTriggers is closed: triggers were dropped")
        await self._sender.wait_sent()

    async def fetch_watermark(self, key: Key) -> Value | None:
        """The watermark of ``key`` stored in the table (a float), or None.

        One attempt, coalesced with the other reads of the loop iteration.

        Raises:
            TypeError: ``key`` is not a str, bytes or int.
            PostgresTriggersClosedError: before ``async with`` or after ``aclose()``.
            PostgresTriggersError: the read failed.
        """
        key = check_key(key)
        self._check_running()
        try:
            return await self._reader.fetch(key)
        except PostgresTriggersClosedError:
            raise
        except CONNECTION_ERRORS as exc:
            raise self._source.failure("cannot read the watermark from", exc) from None

    async def watch(self, op: Any, keys: Iterable[Hashable] | Mapping[Hashable, float]) -> Outcome:
        """:meth:`Purgatory.watch` in the local purgatory, caught up with the stored watermarks.

        Watches ``op`` (the same arguments, errors and cancellation as
        ``purgatory.watch``), LISTENs to its keys' partitions if needed, then has
        their stored watermarks read and applied: the watch waits for its
        operation, which the read may complete, never for the read. An op whose
        timeout is below ``read_first_below`` has them read first (bounded by
        ``command_timeout``; a failed read only skips the catch-up), so a
        stored state that meets it completes it, a timeout of 0 included.

        Raises:
            TypeError: a key cannot cross the wire, before anything is watched;
                and whatever ``Purgatory.watch`` raises.
            ValueError: a key is too long for a notification.
            PostgresTriggersClosedError: not running, or a publisher only.
        """
        self._check_running()
        purgatory = self._purgatory
        if purgatory is None:
            raise PostgresTriggersClosedError("a publisher-only PostgresTriggers has no purgatory")
        if isinstance(keys, Mapping):
            keys = dict(keys)
            wire = [check_wire_size(check_key(key)) for key in keys]
        elif isinstance(keys, str | bytes | tuple):
            wire = []  # refused by the purgatory, with its own message
        else:
            keys = list(keys)
            wire = [check_wire_size(check_key(key)) for key in keys]
        first: dict[Key, Value | None] = {}
        timeout = getattr(op, "timeout", None)
        if wire and isinstance(timeout, int | float) and timeout < self._read_first_below:
            first = await self._read_first(wire)
        if purgatory.try_complete_else_watch(op, keys):
            return Outcome.COMPLETED
        # In the same step as the watch: a timeout of 0 expires on a later iteration.
        for key, value in first.items():
            if value is not None:
                purgatory.advance(key, value)
        assert self._listener is not None  # there is a purgatory
        if not op.done():
            self._listener.need(wire)
        try:
            outcome: Outcome = await op
        except asyncio.CancelledError:
            op.cancel()
            raise
        return outcome

    async def _read_first(self, keys: list[Key]) -> dict[Key, Value | None]:
        futures = [self._reader.fetch(key) for key in dict.fromkeys(keys)]
        try:
            async with asyncio.timeout(self._command_timeout):
                values = await asyncio.gather(*futures)
        except (TimeoutError, *CONNECTION_ERRORS):
            for future in futures:  # failures are counted by the reader; retrieved here
                if future.done() and not future.cancelled():
                    future.exception()
            return {}
        return dict(zip(dict.fromkeys(keys), values, strict=True))

    def statistics(self) -> PostgresTriggersStatistics:
        """A snapshot of the counters (see :class:`PostgresTriggersStatistics`)."""
        listener = self._listener
        sender = self._sender
        reader = self._reader
        return PostgresTriggersStatistics(
            channel=self._channel,
            instance=self._id,
            purgatory=None if self._purgatory is None else self._purgatory.name,
            connected=self.connected,
            triggers=self._triggers,
            pending=len(sender),
            completed=reader.completed + (0 if listener is None else listener.completed),
            reconnects=0 if listener is None else listener.reconnects,
            connection_errors=self._source.errors,
            published=sender.published,
            publish_errors=sender.publish_errors,
            received=0 if listener is None else listener.received,
            echoes=0 if listener is None else listener.echoes,
            malformed=0 if listener is None else listener.malformed,
            applied=0 if listener is None else listener.applied,
            resyncs=reader.resyncs,
            reads=reader.reads,
            read_errors=reader.read_errors,
            listening=0 if listener is None else listener.listening,
            deaf_detected=0 if listener is None else listener.deaf_detected,
            health_check_failures=0 if listener is None else listener.health_check_failures,
            queue_usage=None if listener is None else listener.queue_usage,
            last_error=self._source.last_error,
        )

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        refuse_virtual_time()
        if self._state != _NEW:
            raise PostgresTriggersClosedError("a PostgresTriggers can be entered once")
        listener = self._listener
        connection: Any = None
        failure: BaseException | None = None
        try:
            async with asyncio.timeout(self._command_timeout):
                await self._sender.link.call(self._ensure_table)
                if listener is not None:
                    connection = await listener.connect()
                    await self._reader.serve(resync=True)
        except (TimeoutError, *CONNECTION_ERRORS) as exc:
            failure = exc
        except BaseException:
            await self._close_connections()
            self._state = _CLOSED
            raise
        if failure is not None:
            error = self._source.failure("cannot start on", failure)
            self._source.record_error(failure)
            failure = None
            await self._close_connections()
            self._state = _CLOSED
            raise error
        self._reader.cancel_resync()
        self._sender.connected = True
        self._state = _RUNNING
        self._start_task(self._sender.run(), "send")
        self._start_task(self._reader.run(), "read")
        if listener is not None:
            self._start_task(listener.run(connection), "listen")
        self._logger.info("aiopurgatory.postgres.started", server=self._source.where)
        return self

    async def _ensure_table(self, connection: Any) -> None:
        if await connection.fetchval(exists_sql(self._channel)) is None:
            async with connection.transaction():
                await connection.execute(create_sql(self._channel))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Send what is pending (up to ``close_timeout`` seconds), stop, disconnect.

        Idempotent. Triggers that could not be sent in time are dropped (logged
        with their number; ``flush()`` waiters get
        :class:`PostgresTriggersClosedError`). A pool passed in is left open.
        """
        if self._state in (_CLOSING, _CLOSED):
            return
        if self._state == _NEW:
            self._state = _CLOSED
            return
        self._state = _CLOSING
        dropped = 0
        sender = self._sender
        try:
            if sender:
                try:
                    async with asyncio.timeout(self._close_timeout):
                        while sender:
                            await sender.wait_sent()
                except TimeoutError:
                    dropped = len(sender)
        finally:
            tasks, self._tasks = self._tasks, []
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self._close_connections()
            self._reader.fail_fetches(
                PostgresTriggersClosedError("PostgresTriggers closed before the read")
            )
            self._state = _CLOSED
        sender.fail_waiters(PostgresTriggersClosedError("PostgresTriggers closed before sending"))
        if dropped:
            self._logger.warning("aiopurgatory.postgres.dropped_on_close", triggers=dropped)
        self._logger.info("aiopurgatory.postgres.closed")

    async def _close_connections(self) -> None:
        if self._listener is not None:
            await self._listener.drop(broken=False)
        await self._sender.link.drop()
        await self._reader.link.drop()

    def _start_task(self, work: Coroutine[Any, Any, None], role: str) -> None:
        # A context of its own: what the tasks complete (a catch-up read, a
        # resync) is not done in the span or the context variables of the code
        # that entered the instance (as the Redis triggers do).
        task = asyncio.create_task(
            work, name=f"aiopurgatory-pg-{role}-{self._id}", context=contextvars.Context()
        )
        task.add_done_callback(self._task_ended)
        self._tasks.append(task)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if self._state != _RUNNING:
            return
        self._source.last_error = "ended" if exc is None else f"{type(exc).__name__}: {exc}"
        self._logger.error(
            "aiopurgatory.postgres.task_ended", task=task.get_name(), error=self._source.last_error
        )


def _driver(conn: object) -> str:
    """``"asyncpg"`` or ``"psycopg"`` for a connection ``advance_in`` can use, else TypeError."""
    if isinstance(conn, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
        return "asyncpg"
    module = type(conn).__module__
    if module.startswith("psycopg"):
        import psycopg

        if isinstance(conn, psycopg.AsyncConnection):
            return "psycopg"
    raise TypeError(
        "conn must be an asyncpg.Connection or a psycopg.AsyncConnection (a sync "
        f"psycopg.Connection goes to SyncPublisher.advance_in), got {type(conn).__name__}"
    )
