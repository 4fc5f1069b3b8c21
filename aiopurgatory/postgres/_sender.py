"""Publishing: the pending batch, and the task that sends it in one statement.

``check_and_complete``/``advance`` apply to the local purgatory at once and add
their trigger to the *pending batch*; the sender task, woken once per loop
iteration that made triggers, sends the whole batch as one statement
(:func:`._sql.publish_sql`: the atomic max of every advanced key and a NOTIFY
per partition, one round trip and one transaction). A batch that fails is kept,
merged ahead of what came since, and sent again after a backoff: the statement is
idempotent (a max, and triggers that check or raise), so a retry after a
failure whose commit did happen costs nothing but a duplicate wake-up check.
Triggers made in a sampled OpenTelemetry span are gathered in a batch per W3C
``traceparent`` (:meth:`Sender.traced_batch`), each sent as statements of its
own whose payloads carry it in their sender field (:func:`._wire.sender_field`).
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from ._connections import CONNECTION_ERRORS, Link, Source
from ._wire import Batch, notifications, sender_field, stored_key

__all__ = ["MAX_STATEMENT_TRIGGERS", "Sender", "statement_arguments"]

#: A batch larger than this leaves as several statements (each its own
#: transaction), so that no statement holds PostgreSQL's NOTIFY lock for long.
MAX_STATEMENT_TRIGGERS: Final = 4096


def statement_arguments(
    sender: str, batch: Batch, channel: str, partitions: int
) -> tuple[list[bytes], list[float], list[str], list[str]]:
    """The four arrays of :func:`._sql.publish_sql` that send ``batch``."""
    keys: list[bytes] = []
    values: list[float] = []
    for key, value in batch.advances.items():
        keys.append(stored_key(key))
        values.append(float(value))
    channels, payloads = notifications(sender, batch, channel, partitions)
    return keys, values, channels, payloads


def split(batch: Batch, size: int) -> list[Batch]:
    """``batch`` as batches of at most ``size`` triggers each (itself if it fits)."""
    if len(batch) <= size:
        return [batch]
    parts = [Batch()]
    for key in batch.checks:
        if len(parts[-1]) == size:
            parts.append(Batch())
        parts[-1].checks[key] = None
    for key, value in batch.advances.items():
        if len(parts[-1]) == size:
            parts.append(Batch())
        parts[-1].advances[key] = value
    return parts


class Sender:
    """The pending batch and the task that sends it, on a :class:`~._connections.Link`.

    Args:
        instance: the owner's instance id (carried by every payload).
        link: the connection it sends on.
        source: the owner's connections (backoff, record of failures).
        statement: the publish statement (:func:`._sql.publish_sql`).
        channel: the channel; partitions: its partition count.
        logger: the owner's bound logger.
    """

    def __init__(
        self,
        instance: str,
        link: Link,
        source: Source,
        *,
        statement: str,
        channel: str,
        partitions: int,
        logger: Any,
    ) -> None:
        self._id = instance
        self.link = link
        self._source = source
        self._statement = statement
        self._channel = channel
        self._partitions = partitions
        self._logger = logger
        self.pending = Batch()
        # Triggers made in sampled spans, a batch per traceparent (empty while
        # nothing is traced): a payload carries one trace context at most.
        self.traced: dict[str, Batch] = {}
        self.inflight = 0
        self._pending_waiters: list[asyncio.Future[None]] = []
        self._inflight_waiters: list[asyncio.Future[None]] = []
        self.wakeup = asyncio.Event()
        self.published = 0  # notifications queued (committed)
        self.publish_errors = 0
        self.connected = False

    def wait_sent(self) -> asyncio.Future[None]:
        """A future set when every trigger gathered so far has been sent."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        pending = self.pending or self.traced
        (self._pending_waiters if pending else self._inflight_waiters).append(waiter)
        return waiter

    def fail_waiters(self, exc: BaseException) -> None:
        """Fail every ``wait_sent`` future not yet set (at close)."""
        for waiter in (*self._inflight_waiters, *self._pending_waiters):
            if not waiter.done():
                waiter.set_exception(exc)
        self._inflight_waiters = []
        self._pending_waiters = []

    def __len__(self) -> int:
        """Triggers gathered and not yet sent (distinct keys)."""
        traced = sum(map(len, self.traced.values())) if self.traced else 0
        return len(self.pending) + traced + self.inflight

    def traced_batch(self, traceparent: str) -> Batch:
        """The pending batch of the triggers made in the span of ``traceparent``."""
        batch = self.traced.get(traceparent)
        if batch is None:
            batch = self.traced[traceparent] = Batch()
        return batch

    async def run(self) -> None:
        """Send batches until cancelled; failures are retried, never raised."""
        wakeup = self.wakeup
        failures = 0
        while True:
            await wakeup.wait()
            wakeup.clear()
            while self.pending or self.traced:
                batch, self.pending = self.pending, Batch()
                traced, self.traced = self.traced, {}
                waiters, self._pending_waiters = self._pending_waiters, []
                self.inflight = count = len(batch) + sum(map(len, traced.values()))
                self._inflight_waiters = waiters
                try:
                    await self.send(batch, traced)
                except CONNECTION_ERRORS as exc:
                    failures += 1
                    self.publish_errors += 1
                    text = self._source.record_error(exc)
                    self.connected = False
                    if failures == 1:
                        self._logger.warning(
                            "aiopurgatory.postgres.publish_failed", error=text, triggers=count
                        )
                    # Keep the batches, ahead of what came since; retry after a backoff.
                    batch.merge(self.pending)
                    self.pending = batch
                    for traceparent, newer in self.traced.items():
                        older = traced.setdefault(traceparent, newer)
                        if older is not newer:
                            older.merge(newer)
                    self.traced = traced
                    self._pending_waiters = self._inflight_waiters + self._pending_waiters
                    self.inflight = 0
                    self._inflight_waiters = []
                    await asyncio.sleep(self._source.backoff(failures))
                    continue
                except Exception as exc:  # a bug: never end the sender silently
                    self.publish_errors += 1
                    self._logger.error(
                        "aiopurgatory.postgres.send_failed",
                        error=self._source.record_bug(exc),
                        triggers=count,
                    )
                if failures:
                    self._logger.warning("aiopurgatory.postgres.publish_resumed", attempts=failures)
                    failures = 0
                self.connected = True
                self.inflight = 0
                self._inflight_waiters = []
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)

    async def send(self, batch: Batch, traced: dict[str, Batch] | None = None) -> None:
        """Send ``batch`` now (one statement per :data:`MAX_STATEMENT_TRIGGERS`), and
        each batch of ``traced`` (traceparent -> batch) with its trace context."""
        statement = self._statement
        groups = [(self._id, batch)] if batch else []
        if traced:
            groups += [(sender_field(self._id, tp), part) for tp, part in traced.items()]
        for sender, whole in groups:
            await self._send(sender, whole, statement)

    async def _send(self, sender: str, batch: Batch, statement: str) -> None:
        for part in split(batch, MAX_STATEMENT_TRIGGERS):
            arguments = statement_arguments(sender, part, self._channel, self._partitions)

            async def publish(connection: Any, arguments: Any = arguments) -> Any:
                return await connection.fetchval(statement, *arguments)

            self.published += await self.link.call(publish)
