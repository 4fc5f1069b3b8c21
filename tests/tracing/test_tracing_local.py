"""Traces across processes through LocalTriggers: the trigger's span travels with it.

Two LocalTriggers on one bus stand for two processes, each with its own
TracerProvider and in-memory exporter; virtual time.
"""

from __future__ import annotations

import asyncio
import contextvars
import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

import aiopurgatory as ap
from aiopurgatory.tracing import ATTRIBUTE_COMPLETED_BY, ATTRIBUTE_OUTCOME, trace_waits


class Process:
    """One process's tracing: its provider and what it exported."""

    def __init__(self, *, sampled: bool = True) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(sampler=None if sampled else ALWAYS_OFF)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("app")

    def spans(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans() if span.name == name]


@pytest.fixture
def server() -> Iterator[Process]:
    process = Process()
    yield process
    process.provider.shutdown()


@pytest.mark.virtual_time
@pytest.mark.parametrize("latency", [0.0, 0.25])
async def test_a_long_poll_woken_by_a_post_in_another_process_links_to_the_posts_span(
    server: Process, latency: float
) -> None:
    poster = Process()
    bus = ap.LocalBus(latency=latency)
    here: ap.Purgatory = ap.Purgatory("feed")
    async with (
        ap.LocalTriggers(here, bus=bus) as waiting,
        ap.LocalTriggers(None, bus=bus) as posting,
    ):
        with trace_waits(here, tracer_provider=server.provider):

            async def get() -> ap.Outcome:
                with server.tracer.start_as_current_span("GET /feed"):
                    return await waiting.watch(ap.WatermarkOperation(30.0), {"feed-7": 3})

            task = asyncio.ensure_future(get())
            await asyncio.sleep(1)
            with poster.tracer.start_as_current_span("POST /feed") as post:
                posting.advance("feed-7", 3)
            assert await task is ap.Outcome.COMPLETED
    (wait,) = server.spans("wait feed")
    (get_span,) = server.spans("GET /feed")
    assert wait.parent is not None
    assert wait.parent.span_id == get_span.context.span_id
    assert wait.attributes is not None
    assert wait.attributes[ATTRIBUTE_OUTCOME] == "completed"
    assert wait.attributes[ATTRIBUTE_COMPLETED_BY] == "feed-7"
    (link,) = wait.links
    assert link.context.trace_id == post.get_span_context().trace_id
    assert link.context.span_id == post.get_span_context().span_id
    assert link.context.is_remote
    assert wait.end_time is not None
    assert wait.start_time is not None
    assert wait.end_time - wait.start_time == round((1 + latency) * 1e9)
    poster.provider.shutdown()


@pytest.mark.virtual_time
async def test_an_unsampled_trigger_carries_nothing(server: Process) -> None:
    poster = Process(sampled=False)
    bus = ap.LocalBus()
    here: ap.Purgatory = ap.Purgatory("feed")
    async with (
        ap.LocalTriggers(here, bus=bus) as waiting,
        ap.LocalTriggers(None, bus=bus) as posting,
    ):
        with trace_waits(here, tracer_provider=server.provider):
            task = asyncio.ensure_future(waiting.watch(ap.WatermarkOperation(30.0), {"k": 1}))
            await asyncio.sleep(1)
            bus.pause()  # held triggers keep what they carry: nothing here
            with poster.tracer.start_as_current_span("POST /feed") as post:
                assert not post.get_span_context().trace_flags.sampled
                posting.check_and_complete("k")
                posting.advance("k", 1)
            assert [item[4] for item in bus._held] == [None, None]
            bus.resume()
            assert await task is ap.Outcome.COMPLETED
    (wait,) = server.spans("wait feed")
    assert wait.links == ()
    assert wait.attributes is not None
    assert wait.attributes[ATTRIBUTE_COMPLETED_BY] == "k"
    assert poster.exporter.get_finished_spans() == ()
    poster.provider.shutdown()


@pytest.mark.virtual_time
async def test_a_trigger_held_while_the_bus_is_paused_keeps_its_trace(server: Process) -> None:
    poster = Process()
    bus = ap.LocalBus()
    here: ap.Purgatory = ap.Purgatory("feed")
    async with ap.LocalTriggers(here, bus=bus), ap.LocalTriggers(None, bus=bus) as posting:
        with trace_waits(here, tracer_provider=server.provider):
            op = ap.WatermarkOperation(30.0)
            here.try_complete_else_watch(op, {"k": 2})
            bus.pause()
            with poster.tracer.start_as_current_span("POST /feed") as post:
                posting.advance("k", 2)
            await asyncio.sleep(1)
            assert op.outcome is None
            bus.resume()
            assert await op is ap.Outcome.COMPLETED
    (wait,) = server.spans("wait feed")
    assert [link.context.span_id for link in wait.links] == [post.get_span_context().span_id]
    poster.provider.shutdown()


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


@pytest.mark.virtual_time
async def test_a_delivered_trigger_runs_in_a_context_of_its_own() -> None:
    seen: list[str] = []

    class Seeing(ap.WatermarkOperation):
        def on_complete(self) -> None:
            seen.append(REQUEST_ID.get())

    bus = ap.LocalBus()
    here: ap.Purgatory = ap.Purgatory()
    async with (
        ap.LocalTriggers(here, bus=bus) as waiting,
        ap.LocalTriggers(None, bus=bus) as posting,
    ):
        task = asyncio.ensure_future(waiting.watch(Seeing(5.0), {"k": 1}))
        await asyncio.sleep(0)
        REQUEST_ID.set("post-1")  # the sender's, in its own process
        posting.advance("k", 1)
        assert await task is ap.Outcome.COMPLETED
    assert seen == ["none"]


@pytest.mark.virtual_time
async def test_the_catch_up_after_an_outage_links_to_nothing(server: Process) -> None:
    # A watch completed by the stored watermarks read after the bus resumes was
    # woken by the process's own resync, not by the code that resumed the bus.
    bus = ap.LocalBus()
    here: ap.Purgatory = ap.Purgatory("feed")
    async with ap.LocalTriggers(here, bus=bus), ap.LocalTriggers(None, bus=bus) as posting:
        posting.advance("k", 2)  # stored; nothing watches k here yet
        await posting.flush()
        with trace_waits(here, tracer_provider=server.provider):
            op = ap.WatermarkOperation(30.0)
            here.try_complete_else_watch(op, {"k": 2})  # directly: no catch-up read
            bus.pause()
            with server.tracer.start_as_current_span("operator"):
                bus.resume()
            assert await op is ap.Outcome.COMPLETED
    (wait,) = server.spans("wait feed")
    assert wait.attributes is not None
    assert wait.attributes[ATTRIBUTE_COMPLETED_BY] == "k"
    assert wait.links == ()


def test_triggers_made_without_opentelemetry_do_not_import_it() -> None:
    # A trigger asks for its trace context only once OpenTelemetry's API is imported
    # by someone else: before, no span can be current.
    code = """
import asyncio, sys
import aiopurgatory as ap

async def main():
    bus = ap.LocalBus()
    here = ap.Purgatory()
    waiting, posting = ap.LocalTriggers(here, bus=bus), ap.LocalTriggers(None, bus=bus)
    async with waiting, posting:
        task = asyncio.ensure_future(waiting.watch(ap.WatermarkOperation(5.0), {"k": 1}))
        await asyncio.sleep(0)
        posting.advance("k", 1)
        assert await task is ap.Outcome.COMPLETED

asyncio.run(main())
print(sorted(m for m in sys.modules if m.startswith(("opentelemetry", "aiopurgatory.tracing"))))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
