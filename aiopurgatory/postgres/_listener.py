"""Listening: the partitions of the watched keys, on one connection, kept alive and delivering.

A :class:`Listener` owns one connection (from a DSN its own; from a pool, one of
the pool's, held while it runs) and, run by :meth:`Listener.run`:

* **Interest.** The connection LISTENs to this process's canary channel and to
  the partition channels (:mod:`._wire`) of the keys the purgatory watches, no
  others: a process that watches nothing receives no trigger. A key watched
  through ``PostgresTriggers.watch`` is known at once (:meth:`Listener.need`); a
  key watched on the purgatory directly is found by a sweep of the purgatory's
  keys every ``sweep_interval`` seconds. A key whose partition is not listened
  to yet waits for its LISTEN to complete, then is read *and checked* once:
  listening first, reading next, so nothing committed in between slips through.
  A partition is UNLISTENed once no watched key has been in it for ``linger``
  seconds.
* **Liveness.** Every ``health_check_interval`` seconds the connection sends
  itself a canary (``pg_notify`` on its canary channel, bounded by the interval)
  and reads ``pg_notification_queue_usage()``. A statement that does not
  answer in time means the server is paused or the network gone; a canary not
  back by the next check means the connection is *deaf* (``deaf_detected``).
  Either way the connection is terminated and renewed. A connection the server
  closed (restarted, ``pg_terminate_backend``) is seen at once (asyncpg's
  termination callback).
* **Renewal.** Any failure ends the connection, never the task: it reconnects
  with backoff and jitter, LISTENs to every partition still wanted, and asks the
  reader for a *resync* (every watched key read, advanced and checked).
* **Context.** Each notification is applied in a context of its own (asyncpg
  would run it in the context the connection was made in: the span current
  when the listener started), with the span of its ``traceparent`` current if
  it carries one and OpenTelemetry is imported here, so a traced wait it
  completes links to the span that made the trigger.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
from contextvars import Context
from typing import Any

from .._purgatory import Purgatory
from .._transport import Key, Value
from ._connections import CONNECTION_ERRORS, Source
from ._reader import WatermarkReader
from ._wire import (
    MalformedMessage,
    decode,
    partition_channel,
    partition_of,
    split_sender,
    wire_keys,
)

__all__ = ["DeafListener", "Listener"]


class DeafListener(ConnectionError):
    """The listener's canary did not come back within a health-check interval."""


class Listener:
    """The LISTEN connection of one PostgresTriggers (see the module documentation)."""

    def __init__(
        self,
        instance: str,
        purgatory: Purgatory[Any],
        source: Source,
        reader: WatermarkReader,
        *,
        channel: str,
        partitions: int,
        health_check_interval: float,
        command_timeout: float,
        linger: float,
        sweep_interval: float,
        logger: Any,
    ) -> None:
        self._id = instance
        self._purgatory = purgatory
        self._source = source
        self._reader = reader
        self._channel = channel
        self._count = partitions
        self._interval = health_check_interval
        self._command_timeout = command_timeout
        self._linger = linger
        self._sweep_interval = sweep_interval
        self._logger = logger
        self._advance = purgatory.advance
        self._check = purgatory.check_and_complete
        self.canary_channel = f"{channel}_c_{instance.rsplit('-', 1)[-1]}"
        self._by_channel = {partition_channel(channel, n): n for n in range(partitions)}
        # Partition -> the loop time a watched key was last seen in it.
        self._wanted: dict[int, float] = {}
        # Partitions LISTENed to on the current connection.
        self._listening: set[int] = set()
        # Keys waiting for their partition's LISTEN, then read and checked.
        self._waiting: dict[int, dict[Key, None]] = {}
        self._changed = asyncio.Event()
        self._lost = False
        self._generation = 0  # of the current connection (see _terminated)
        # The sweep's view (as the Redis subscriber's).
        self._swept: set[Any] = set()
        self._key_partition: dict[Key, int] = {}
        self._key_count: dict[int, int] = {}
        self._idle: dict[int, float] = {}
        self._canary: str | None = None
        self.connection: Any = None
        self.connected = False
        self.reconnects = 0
        self.received = 0
        self.echoes = 0
        self.malformed = 0
        self.applied = 0
        self.completed = 0
        self.deaf_detected = 0
        self.health_check_failures = 0
        self.queue_usage: float | None = None

    @property
    def listening(self) -> int:
        """Partition channels LISTENed to now."""
        return len(self._listening)

    def covers(self, keys: list[Key]) -> bool:
        """The partitions of ``keys`` are all listened to now (for benchmarks and tests)."""
        return all(partition_of(key, self._count) in self._listening for key in keys)

    # -- interest ------------------------------------------------------------------------

    def need(self, keys: list[Key]) -> None:
        """``keys`` were just watched: catch them up (after their partition's LISTEN)."""
        now = asyncio.get_running_loop().time()
        count = self._count
        ready: list[Key] = []
        for key in keys:
            n = partition_of(key, count)
            self._wanted[n] = now
            if n not in self._key_count:
                self._idle[n] = now  # released after linger unless the sweep finds its key
            if n in self._listening:
                ready.append(key)
            else:
                self._waiting.setdefault(n, {})[key] = None
                self._changed.set()
        if ready:
            self._reader.want(ready)

    def sweep(self) -> None:
        """LISTEN to the partitions of keys watched directly; release the idle ones."""
        purgatory = self._purgatory
        if purgatory.closed:
            return
        now = asyncio.get_running_loop().time()
        keys = set(purgatory.keys())
        count = self._key_count
        for key in self._swept - keys:
            n = self._key_partition.pop(key, None)
            if n is None:
                continue
            count[n] -= 1
            if not count[n]:
                del count[n]
                self._idle[n] = now
        for key in wire_keys(keys - self._swept):
            n = self._key_partition[key] = partition_of(key, self._count)
            count[n] = count.get(n, 0) + 1
            self._idle.pop(n, None)
            self._wanted[n] = now
            if n not in self._listening:
                self._waiting.setdefault(n, {})[key] = None
                self._changed.set()
        self._swept = keys
        for n in [n for n, since in self._idle.items() if now - since > self._linger]:
            del self._idle[n]
            self._wanted.pop(n, None)
            self._waiting.pop(n, None)
            if n in self._listening:
                self._changed.set()

    # -- the task ------------------------------------------------------------------------

    async def connect(self) -> Any:
        """A new connection LISTENing to every wanted partition; resync asked.

        Bounded by ``command_timeout``, the connect included.
        """
        connection = None
        try:
            async with asyncio.timeout(self._command_timeout):
                connection = await self._source.acquire()
                self._lost = False
                self._generation += 1
                generation = self._generation
                connection.add_termination_listener(lambda _: self._terminated(generation))
                await connection.add_listener(self.canary_channel, self._on_canary)
                listening: set[int] = set()
                for n in list(self._wanted):
                    await connection.add_listener(
                        partition_channel(self._channel, n), self._on_notify
                    )
                    listening.add(n)
        except BaseException:
            if connection is not None:
                await self._source.release(connection, broken=True)
            raise
        self.connection = connection
        self.connected = True
        self._listening = listening
        # The resync reads and checks every watched key: the waiting ones too.
        self._waiting = {n: keys for n, keys in self._waiting.items() if n not in listening}
        if self._waiting:
            self._changed.set()
        self._reader.request_resync()
        return connection

    def _terminated(self, generation: int) -> None:
        # A connection dropped before (its callback may run late) is not this one.
        if generation == self._generation:
            self._lost = True
            self._changed.set()

    async def run(self, connection: Any) -> None:
        """Listen until cancelled: on ``connection`` (from :meth:`connect`), then on
        new ones after each loss."""
        attempt = 0
        logged: str | None = None
        sweeping = asyncio.create_task(self._sweep_loop(), name=f"aiopurgatory-pg-sweep-{self._id}")
        try:
            while True:
                if connection is None:
                    try:
                        connection = await self.connect()
                    except CONNECTION_ERRORS as exc:
                        attempt += 1
                        text = self._source.record_error(exc)
                        log = self._logger.debug if text == logged else self._logger.warning
                        logged = text
                        log("aiopurgatory.postgres.reconnect_failed", error=text, attempt=attempt)
                        await asyncio.sleep(self._source.backoff(attempt))
                        continue
                    self.reconnects += 1
                    self._logger.warning("aiopurgatory.postgres.reconnected", attempts=attempt + 1)
                    attempt = 0
                    logged = None
                try:
                    await self._keep(connection)
                except CONNECTION_ERRORS as exc:
                    text = self._source.record_error(exc)
                    self._logger.warning("aiopurgatory.postgres.disconnected", error=text)
                except Exception as exc:  # a bug: log it, reconnect, never end silently
                    text = self._source.record_bug(exc)
                    self._logger.error("aiopurgatory.postgres.listener_failed", error=text)
                await self.drop()
                connection = None
                # Even the first attempt waits a little: a restarted server is
                # not hit by every process at once.
                attempt = 1
                await asyncio.sleep(self._source.backoff(attempt))
        finally:
            sweeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeping

    async def drop(self, *, broken: bool = True) -> None:
        """End the connection: terminated after a failure (``broken``), closed at close
        (its LISTENs undone first, so that a pool's connection goes back clean)."""
        connection, self.connection = self.connection, None
        self._generation += 1
        self.connected = False
        listening, self._listening = self._listening, set()
        self._canary = None
        if connection is None:
            return
        try:
            if not broken:
                try:
                    async with asyncio.timeout(min(1.0, self._command_timeout)):
                        await connection.remove_listener(self.canary_channel, self._on_canary)
                        for n in listening:
                            channel = partition_channel(self._channel, n)
                            await connection.remove_listener(channel, self._on_notify)
                except CONNECTION_ERRORS:
                    broken = True
        except BaseException:
            # Cancelled (or failed) undoing the LISTENs: the connection still goes
            # back, terminated (a pool's would otherwise be missing from it, and
            # the pool's close() would wait for it forever).
            await self._source.release(connection, broken=True)
            raise
        await self._source.release(connection, broken=broken)

    async def _keep(self, connection: Any) -> None:
        """LISTEN/UNLISTEN as asked, and check the connection every interval (only
        returns by raising)."""
        loop = asyncio.get_running_loop()
        interval = self._interval
        changed = self._changed
        next_check = loop.time() + interval
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_check - loop.time())):
                    await changed.wait()
            if self._lost or connection.is_closed():
                raise ConnectionResetError("the server closed the listener's connection")
            if changed.is_set():
                changed.clear()
                async with asyncio.timeout(self._command_timeout):
                    await self._apply_changes(connection)
            if loop.time() >= next_check:
                next_check = loop.time() + interval
                await self._check_health(connection, interval)

    async def _apply_changes(self, connection: Any) -> None:
        channel = self._channel
        for n in [n for n in self._listening if n not in self._wanted]:
            self._listening.discard(n)
            await connection.remove_listener(partition_channel(channel, n), self._on_notify)
        for n in [n for n in self._wanted if n not in self._listening]:
            await connection.add_listener(partition_channel(channel, n), self._on_notify)
            self._listening.add(n)
            keys = self._waiting.pop(n, None)
            if keys:
                self._reader.want(keys, check=True)

    async def _check_health(self, connection: Any, interval: float) -> None:
        if self._canary is not None:
            self.deaf_detected += 1
            self._logger.warning("aiopurgatory.postgres.deaf_listener", seconds=interval)
            raise DeafListener(f"the listener's canary did not come back within {interval:g} s")
        self._canary = token = secrets.token_hex(4)
        try:
            row = await connection.fetchrow(
                "SELECT pg_notify($1, $2), pg_notification_queue_usage()",
                self.canary_channel,
                token,
                timeout=interval,
            )
        except BaseException:
            self.health_check_failures += 1
            raise
        usage = float(row[1])
        if usage >= 0.5 and (self.queue_usage is None or self.queue_usage < 0.5):
            self._logger.warning("aiopurgatory.postgres.notify_queue_filling", usage=usage)
        self.queue_usage = usage

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_interval)
            try:
                self.sweep()
            except Exception as exc:  # a bug: loud, and the sweeps go on
                text = self._source.record_bug(exc)
                self._logger.error("aiopurgatory.postgres.sweep_failed", error=text)

    # -- notifications -------------------------------------------------------------------

    def _on_canary(self, connection: Any, pid: int, channel: str, payload: str) -> None:
        if payload == self._canary:
            self._canary = None

    def _on_notify(self, connection: Any, pid: int, channel: str, payload: str) -> None:
        try:
            sender, checks, advances = decode(payload)
        except MalformedMessage as exc:
            self.malformed += 1
            if self.malformed == 1:
                self._logger.warning("aiopurgatory.postgres.malformed_message", error=str(exc))
            return
        traceparent = None
        if " " in sender:  # made in a sampled span: "<id> <traceparent>"
            sender, traceparent = split_sender(sender)
        if sender == self._id:
            self.echoes += 1
            return
        self.received += 1
        if self._purgatory.closed:
            return
        if traceparent is not None and sys.modules.get("opentelemetry.trace") is not None:
            Context().run(self._apply_traced, traceparent, checks, advances)
        else:
            Context().run(self._apply, checks, advances)

    def _apply_traced(
        self, traceparent: str, checks: list[Key], advances: list[tuple[Key, Value]]
    ) -> None:
        from ..tracing import _triggered_from  # OpenTelemetry is imported already

        with _triggered_from(traceparent):
            self._apply(checks, advances)

    def _apply(self, checks: list[Key], advances: list[tuple[Key, Value]]) -> None:
        completed = 0
        try:
            advance = self._advance
            for key, value in advances:
                completed += advance(key, value)
            check = self._check
            for key in checks:
                completed += check(key)
        except Exception as exc:  # a bug (callbacks' failures are contained by the purgatory)
            text = self._source.record_bug(exc)
            self._logger.error("aiopurgatory.postgres.apply_failed", error=text)
        self.applied += len(advances) + len(checks)
        self.completed += completed
