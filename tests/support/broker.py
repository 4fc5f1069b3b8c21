"""Shared helpers of the example broker's tests: an in-process broker, clients, polling."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from examples.broker import Broker, BrokerConfig
from examples.broker.codec import Reader
from examples.broker.rawclient import RawConnection


class RecordingLogger:
    """A structlog-compatible logger that keeps (level, event, fields) in memory."""

    def __init__(self, events: list[tuple[str, str, dict[str, Any]]] | None = None, **ctx: Any):
        self.events = [] if events is None else events
        self._ctx = ctx

    def bind(self, **kw: Any) -> RecordingLogger:
        return RecordingLogger(self.events, **{**self._ctx, **kw})

    def _log(self, level: str, event: str, **kw: Any) -> None:
        self.events.append((level, event, {**self._ctx, **kw}))

    def debug(self, event: str, **kw: Any) -> None:
        self._log("debug", event, **kw)

    def info(self, event: str, **kw: Any) -> None:
        self._log("info", event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._log("warning", event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        self._log("error", event, **kw)

    def names(self) -> list[str]:
        return [event for _, event, _ in self.events]


@contextlib.asynccontextmanager
async def running_broker(**settings: Any) -> AsyncIterator[Broker]:
    """A started broker on a free port (no periodic stats), logging to a RecordingLogger."""
    settings.setdefault("port", 0)
    settings.setdefault("stats_interval", 0)
    broker = Broker(BrokerConfig(**settings), logger=RecordingLogger())
    await broker.start()
    try:
        yield broker
    finally:
        await broker.close()


@contextlib.asynccontextmanager
async def raw(broker: Broker) -> AsyncIterator[RawConnection]:
    """A raw protocol connection to ``broker``."""
    conn = await RawConnection.open("127.0.0.1", broker.port)
    try:
        yield conn
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def _started(client: Any) -> AsyncIterator[Any]:
    # aiokafka producers and consumers share the start()/stop() life cycle.
    await client.start()
    try:
        yield client
    finally:
        await client.stop()


def producer(broker: Broker, **settings: Any) -> contextlib.AbstractAsyncContextManager[Any]:
    """A started aiokafka producer connected to ``broker``."""
    return _started(AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{broker.port}", **settings))


def consumer(broker: Broker, **settings: Any) -> contextlib.AbstractAsyncContextManager[Any]:
    """A started aiokafka consumer (no auto-commit) connected to ``broker``."""
    return _started(
        AIOKafkaConsumer(
            bootstrap_servers=f"127.0.0.1:{broker.port}", enable_auto_commit=False, **settings
        )
    )


async def eventually(condition: Any, within: float = 5.0) -> None:
    """Wait until ``condition()`` is true (polling), or fail."""
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 - the conditions are plain attributes
            await asyncio.sleep(0.01)


def make_batch(
    values: list[bytes],
    *,
    base_offset: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
) -> bytes:
    """A v2 record batch (valid CRC) of ``values``, built by aiokafka's batch builder."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=int(transactional),
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 20,
    )
    for i, value in enumerate(values):
        builder.append(base_offset + i, timestamp=None, key=None, value=value, headers=[])
    return bytes(builder.build())


def frame(body: bytes) -> bytes:
    """A size-prefixed frame."""
    return struct.pack(">i", len(body)) + body


def _single_partition(body: Reader) -> int:
    """Skip the one-topic, one-partition header of a response; return its error code."""
    assert body.int32() == 1  # topics
    body.string()
    assert body.int32() == 1  # partitions
    body.int32()  # partition index
    return body.int16()


def produce_result(body: Reader) -> tuple[int, int]:
    """(error_code, base_offset) of the single partition of a Produce v3 response."""
    error, offset = _single_partition(body), body.int64()
    body.int64()  # log_append_time
    assert body.int32() == 0  # throttle_time_ms
    assert body.remaining == 0
    return error, offset


def fetch_result(body: Reader) -> tuple[int, int, bytes]:
    """(error_code, high_watermark, records) of the single partition of a Fetch v4 response."""
    body.int32()  # throttle
    error, hw = _single_partition(body), body.int64()
    body.int64()  # last_stable_offset
    assert body.int32() == 0  # aborted_transactions
    records = body.nullable_bytes() or b""
    assert body.remaining == 0
    return error, hw, records
