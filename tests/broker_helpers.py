"""Shared helpers of the example broker's tests: an in-process broker, clients, polling."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from examples.broker import Broker, BrokerConfig


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
