"""What the tracing tests of the job integrations share: a wait traced here, a job's span there.

A real worker traces its tasks with a TracerProvider of its own, exporting to a
file (:mod:`tests.jobs.spans`); the test process traces its waits
(:func:`aiopurgatory.tracing.trace_waits`) with the in-memory exporter of
the ``here`` fixture (tests/jobs/conftest.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from aiopurgatory.redis import RedisTriggers
from aiopurgatory.tracing import trace_waits
from tests.jobs.spans import find_span

__all__ = ["linked_to", "parked", "traced_wait", "tracer_here", "worker_span"]


def tracer_here() -> tuple[TracerProvider, InMemorySpanExporter]:
    """A TracerProvider exporting to memory, and its exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def linked_to(span: ReadableSpan) -> list[tuple[str, str]]:
    return [
        (format(link.context.trace_id, "032x"), format(link.context.span_id, "016x"))
        for link in span.links
    ]


async def parked(triggers: RedisTriggers, key: Any) -> None:
    """Until the wait on ``key`` is parked and its partition subscribed."""
    subscriber, purgatory = triggers._subscriber, triggers.purgatory
    assert subscriber is not None
    assert purgatory is not None
    async with asyncio.timeout(10):
        while not (purgatory.pending and subscriber.covers([key])):  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def traced_wait(
    triggers: RedisTriggers,
    key: Any,
    wait: Callable[[], Awaitable[Any]],
    send: Callable[[], Awaitable[Any]],
    here: tuple[TracerProvider, InMemorySpanExporter],
) -> tuple[Any, ReadableSpan]:
    """``wait()`` for a job (traced), sending it with ``send()`` once the wait on
    ``key`` is parked; the wait's outcome (its result or exception) and its span."""
    provider, exporter = here
    purgatory = triggers.purgatory
    assert purgatory is not None
    with trace_waits(purgatory, tracer_provider=provider):
        waiting = asyncio.ensure_future(wait())
        await parked(triggers, key)
        await send()
        try:
            outcome: Any = await waiting
        except Exception as exc:
            outcome = exc
    (span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("wait ")]
    return outcome, span


def worker_span(spans: Path, name: str, attribute: str, job_id: str) -> dict[str, Any]:
    """The worker's span ``name`` whose ``attribute`` is ``job_id`` (once exported)."""
    span = find_span(spans, name, attribute, job_id)
    assert span is not None, f"the worker exported no span {name!r} of job {job_id}"
    return dict(span)
