"""aiopurgatory.tracing: a span per wait, with the SDK's in-memory exporter.

A real TracerProvider with a SimpleSpanProcessor and an InMemorySpanExporter (each
test its own, never the global one); exact times on the virtual-time loop, where a
span lasts the virtual wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace import SpanKind, StatusCode

import aiopurgatory as ap
from aiopurgatory.tracing import (
    ATTRIBUTE_COMPLETED_BY,
    ATTRIBUTE_KEYS,
    ATTRIBUTE_LATENESS,
    ATTRIBUTE_OUTCOME,
    EVENT_CANCELLED,
    EVENT_EXPIRED,
    WaitTracing,
    trace_waits,
)


class Ready(ap.DelayedOperation):
    """Completes on a trigger once ``ready`` is set."""

    def __init__(self, timeout: float = 10.0) -> None:
        super().__init__(timeout)
        self.ready = False

    def try_complete(self) -> bool:
        return self.ready and self.force_complete()


class Broken(ap.DelayedOperation):
    def try_complete(self) -> bool:
        if self.keys:  # watched: its first check passes, a trigger's raises
            raise LookupError("no such offset")
        return False


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def waits(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name.startswith("wait ")]


def named(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    (span,) = [span for span in exporter.get_finished_spans() if span.name == name]
    return span


def now() -> float:
    return asyncio.get_running_loop().time()


@pytest.mark.virtual_time
async def test_a_wait_completed_by_a_trigger_is_a_child_span_linked_to_the_trigger(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    purgatory: ap.Purgatory[Ready] = ap.Purgatory("fetch")
    tracer = provider.get_tracer("app")
    parked = Ready()

    async def request() -> ap.Outcome:
        with tracer.start_as_current_span("GET /messages"):
            return await purgatory.watch(parked, ["topic-1", "topic-2"])

    with trace_waits(purgatory, tracer_provider=provider):
        task = asyncio.ensure_future(request())
        await asyncio.sleep(0)
        start = now()  # the watch
        await asyncio.sleep(2.5)
        with tracer.start_as_current_span("POST /messages"):
            parked.ready = True
            assert purgatory.check_and_complete("topic-2") == 1
        assert await task is ap.Outcome.COMPLETED
    (wait,) = waits(exporter)
    get, post = named(exporter, "GET /messages"), named(exporter, "POST /messages")
    assert wait.name == "wait fetch"
    assert wait.kind is SpanKind.INTERNAL
    assert wait.parent is not None
    assert wait.parent.span_id == get.context.span_id
    assert wait.context.trace_id == get.context.trace_id
    assert dict(wait.attributes or {}) == {
        ATTRIBUTE_OUTCOME: "completed",
        ATTRIBUTE_KEYS: 2,
        ATTRIBUTE_COMPLETED_BY: "topic-2",
    }
    assert [link.context.span_id for link in wait.links] == [post.context.span_id]
    assert wait.links[0].context.trace_id == post.context.trace_id
    assert wait.end_time is not None
    assert wait.start_time is not None
    assert wait.end_time - wait.start_time == 2_500_000_000  # the virtual wait
    assert now() - start == 2.5
    assert wait.status.status_code is StatusCode.UNSET


@pytest.mark.virtual_time
async def test_an_advance_completes_a_callback_style_watch_awaited_as_an_op(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    purgatory: ap.Purgatory = ap.Purgatory("acks")
    tracer = provider.get_tracer("app")
    with trace_waits(purgatory, tracer_provider=provider):
        with tracer.start_as_current_span("produce") as produce:
            op = ap.WatermarkOperation(5.0)
            assert purgatory.try_complete_else_watch(op, {("orders", 0): 42}) is False
        await asyncio.sleep(1)
        with tracer.start_as_current_span("replicate") as replicate:
            assert purgatory.advance(("orders", 0), 41) == 0
            assert purgatory.advance(("orders", 0), 42) == 1
        assert await op is ap.Outcome.COMPLETED
    (wait,) = waits(exporter)
    assert wait.parent is not None
    assert wait.parent.span_id == produce.get_span_context().span_id
    assert wait.attributes is not None
    assert wait.attributes[ATTRIBUTE_COMPLETED_BY] == "('orders', 0)"
    assert wait.attributes[ATTRIBUTE_KEYS] == 1
    assert [link.context.span_id for link in wait.links] == [replicate.get_span_context().span_id]
    assert wait.end_time is not None
    assert wait.start_time is not None
    assert wait.end_time - wait.start_time == 1_000_000_000


@pytest.mark.virtual_time
async def test_an_expiry_has_its_lateness_and_a_cancellation_its_event(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    purgatory: ap.Purgatory = ap.Purgatory("fetch")
    with trace_waits(purgatory, tracer_provider=provider):
        assert await purgatory.watch(ap.DelayedOperation(2.0), ["k"]) is ap.Outcome.EXPIRED
        task = asyncio.ensure_future(purgatory.watch(ap.DelayedOperation(9.0), ["k", "j"]))
        await asyncio.sleep(1.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    expired, cancelled = waits(exporter)
    assert expired.attributes is not None
    assert cancelled.attributes is not None
    assert expired.attributes[ATTRIBUTE_OUTCOME] == "expired"
    assert ATTRIBUTE_COMPLETED_BY not in expired.attributes
    assert expired.links == ()
    (event,) = expired.events
    assert event.name == EVENT_EXPIRED
    assert event.attributes is not None
    lateness = event.attributes[ATTRIBUTE_LATENESS]
    assert isinstance(lateness, float)
    assert 0 <= lateness <= 0.001  # at most a tick of the timer's wheel late
    assert expired.end_time is not None
    assert expired.start_time is not None
    assert expired.end_time - expired.start_time == round((2.0 + lateness) * 1e9)
    assert event.timestamp == expired.end_time
    assert cancelled.attributes[ATTRIBUTE_OUTCOME] == "cancelled"
    assert cancelled.attributes[ATTRIBUTE_KEYS] == 2
    assert [event.name for event in cancelled.events] == [EVENT_CANCELLED]
    assert cancelled.end_time is not None
    assert cancelled.start_time is not None
    assert cancelled.end_time - cancelled.start_time == 1_500_000_000


@pytest.mark.virtual_time
async def test_a_failed_wait_records_the_exception_and_errs(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    purgatory: ap.Purgatory = ap.Purgatory("fetch")
    with trace_waits(purgatory, tracer_provider=provider):
        op = Broken(5.0)
        purgatory.try_complete_else_watch(op, ["k"])
        assert purgatory.check_and_complete("k") == 0
        with pytest.raises(LookupError):
            await op
    (wait,) = waits(exporter)
    assert wait.attributes is not None
    assert wait.attributes[ATTRIBUTE_OUTCOME] == "failed"
    assert ATTRIBUTE_COMPLETED_BY not in wait.attributes
    assert wait.status.status_code is StatusCode.ERROR
    assert wait.status.description == "LookupError: no such offset"
    (event,) = wait.events
    assert event.name == "exception"
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "LookupError"


@pytest.mark.virtual_time
async def test_a_watch_its_first_check_completes_is_a_span_without_trigger(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    purgatory: ap.Purgatory[Ready] = ap.Purgatory("fetch")
    tracer = provider.get_tracer("app")
    with trace_waits(purgatory, tracer_provider=provider):
        op = Ready()
        op.ready = True
        with tracer.start_as_current_span("GET"):
            # Inside a trigger of the same key too: the op's own check completed it.
            other = Ready()
            purgatory.try_complete_else_watch(other, ["k"])

            class Cascade(Ready):
                def on_complete(self) -> None:
                    assert purgatory.try_complete_else_watch(op, ["k"]) is True

            cascade = Cascade()
            cascade.ready = True
            purgatory.try_complete_else_watch(cascade, ["j"])
        assert op.outcome is ap.Outcome.COMPLETED
    spans = {span.context.span_id: span for span in waits(exporter)}
    assert len(spans) == 3  # other is still pending: ended by close(), without outcome
    finished = [
        span for span in spans.values() if span.attributes and ATTRIBUTE_OUTCOME in span.attributes
    ]
    assert len(finished) == 2
    for span in finished:
        assert span.attributes is not None
        assert span.attributes[ATTRIBUTE_OUTCOME] == "completed"
        assert ATTRIBUTE_COMPLETED_BY not in span.attributes
        assert span.links == ()
        assert span.end_time == span.start_time
    (pending,) = [span for span in spans.values() if span not in finished]
    assert [event.name for event in pending.events] == ["aiopurgatory.tracing_closed"]
    assert other.outcome is None


@pytest.mark.virtual_time
async def test_completed_by_names_only_a_key_of_the_op_and_no_self_link(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    purgatory: ap.Purgatory[Ready] = ap.Purgatory("fetch")
    tracer = provider.get_tracer("app")
    first, second = Ready(), Ready()

    class Chain(Ready):
        def on_complete(self) -> None:
            second.force_complete()  # completed inside a trigger of a key it has not

    chain = Chain()
    with trace_waits(purgatory, tracer_provider=provider):
        with tracer.start_as_current_span("GET") as get:
            purgatory.try_complete_else_watch(chain, ["a"])
            purgatory.try_complete_else_watch(second, ["b"])
            purgatory.try_complete_else_watch(first, ["c"])
            # Completed where its own parent is current: no link to its own parent.
            first.force_complete()
        chain.ready = True
        with tracer.start_as_current_span("POST") as post:
            assert purgatory.check_and_complete("a") == 1
    # In the order they ended: second inside chain's on_complete, before chain's.
    first_span, second_span, chain_span = waits(exporter)
    assert first_span.links == ()
    assert first_span.attributes is not None
    assert ATTRIBUTE_COMPLETED_BY not in first_span.attributes
    assert chain_span.attributes is not None
    assert second_span.attributes is not None
    assert chain_span.attributes[ATTRIBUTE_COMPLETED_BY] == "a"
    assert ATTRIBUTE_COMPLETED_BY not in second_span.attributes
    for span in (chain_span, second_span):
        assert span.parent is not None
        assert span.parent.span_id == get.get_span_context().span_id
        assert [link.context.span_id for link in span.links] == [post.get_span_context().span_id]


@pytest.mark.virtual_time
async def test_an_unsampled_trace_makes_no_span_and_keeps_nothing(
    exporter: InMemorySpanExporter,
) -> None:
    provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    purgatory: ap.Purgatory[Ready] = ap.Purgatory("fetch")
    tracing = trace_waits(purgatory, tracer_provider=provider)
    try:
        op = Ready()
        with provider.get_tracer("app").start_as_current_span("GET"):
            purgatory.try_complete_else_watch(op, ["k"])
        assert purgatory._tracer._spans == {}
        op.ready = True
        assert purgatory.check_and_complete("k") == 1
    finally:
        tracing.close()
    assert exporter.get_finished_spans() == ()


class FailingExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise OSError("collector unreachable")


class FailingProcessor(SpanProcessor):
    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("processor bug")


class FailingTracer:
    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("tracer bug")


class FailingTracerProvider:
    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        return FailingTracer()


@pytest.mark.virtual_time
@pytest.mark.parametrize("broken", ["exporter", "processor", "tracer"])
async def test_a_broken_exporter_or_tracer_never_breaks_a_wait(broken: str) -> None:
    provider: Any
    if broken == "tracer":
        provider = FailingTracerProvider()
    else:
        provider = TracerProvider()
        if broken == "exporter":
            provider.add_span_processor(SimpleSpanProcessor(FailingExporter()))
        else:
            provider.add_span_processor(FailingProcessor())
    purgatory: ap.Purgatory[Ready] = ap.Purgatory("fetch")
    recorded: list[ap.Outcome | None] = []
    purgatory.set_recorder(lambda op: recorded.append(op.outcome))
    with trace_waits(purgatory, tracer_provider=provider) as tracing:
        completed = Ready()
        task = asyncio.ensure_future(purgatory.watch(completed, ["k"]))
        await asyncio.sleep(1)
        completed.ready = True
        assert purgatory.check_and_complete("k") == 1
        assert await task is ap.Outcome.COMPLETED
        assert await purgatory.watch(Ready(1.0), ["k"]) is ap.Outcome.EXPIRED
    assert recorded == [ap.Outcome.COMPLETED, ap.Outcome.EXPIRED]
    # The SDK contains an exporter's failure itself; the others are ours to contain.
    assert tracing.failures == (0 if broken == "exporter" else 2)
    assert purgatory.statistics().completed == 1


@pytest.mark.virtual_time
async def test_close_restores_the_hooks_and_the_users_recorder_stays_called(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    purgatory: ap.Purgatory[Ready] = ap.Purgatory("fetch")
    seen: list[str] = []

    def first(op: ap.DelayedOperation) -> None:
        seen.append("first")

    def second(op: ap.DelayedOperation) -> None:
        seen.append("second")

    purgatory.set_recorder(first)
    tracing = trace_waits(purgatory, tracer_provider=provider)
    assert isinstance(tracing, WaitTracing)
    assert traced(tracing) == (purgatory,)
    assert not is_closed(tracing)
    assert purgatory.recorder is first
    assert await purgatory.watch(Ready(0.5), ["k"]) is ap.Outcome.EXPIRED
    purgatory.set_recorder(second)
    assert purgatory.recorder is second
    assert await purgatory.watch(Ready(0.5), ["k"]) is ap.Outcome.EXPIRED
    pending = Ready()
    purgatory.try_complete_else_watch(pending, ["k"])
    tracing.close()
    tracing.close()  # idempotent
    assert tracing.closed
    assert traced(tracing) == ()
    assert purgatory.recorder is second
    assert purgatory._tracer is None
    assert len(waits(exporter)) == 3  # the pending one ended by close()
    pending.cancel()
    assert await purgatory.watch(Ready(0.5), ["k"]) is ap.Outcome.EXPIRED
    assert len(waits(exporter)) == 3  # not traced any more
    assert seen == ["first", "second", "second", "second"]
    # Traced again afterwards.
    with trace_waits(purgatory, tracer_provider=provider):
        assert await purgatory.watch(Ready(0.5), ["k"]) is ap.Outcome.EXPIRED
    assert len(waits(exporter)) == 4


# Calls, not attributes: mypy would keep their narrowing across close().
def is_closed(tracing: WaitTracing) -> bool:
    return tracing.closed


def traced(tracing: WaitTracing) -> tuple[ap.Purgatory[Any], ...]:
    return tracing.purgatories


def test_bad_arguments_are_refused_and_change_nothing(provider: TracerProvider) -> None:
    one: ap.Purgatory = ap.Purgatory("one")
    two: ap.Purgatory = ap.Purgatory("two")
    with pytest.raises(ValueError, match="at least one Purgatory"):
        trace_waits()
    with pytest.raises(TypeError, match=r"purgatories must be aiopurgatory\.Purgatory, got str"):
        trace_waits(one, "two")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'one' is given twice"):
        trace_waits(one, two, one)
    with pytest.raises(TypeError, match="tracer_provider must be an OpenTelemetry"):
        trace_waits(one, tracer_provider=object())  # type: ignore[arg-type]
    assert one._tracer is None
    assert two._tracer is None
    with trace_waits(one, tracer_provider=provider) as tracing:
        assert repr(tracing) == "<WaitTracing 'one'>"
        with pytest.raises(ValueError, match="'one' is already traced"):
            trace_waits(two, one, tracer_provider=provider)
        assert two._tracer is None
    assert repr(tracing) == "<WaitTracing closed>"


@pytest.mark.virtual_time
async def test_the_global_tracer_provider_is_the_default(
    provider: TracerProvider, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    purgatory: ap.Purgatory = ap.Purgatory("fetch")
    with trace_waits(purgatory):
        assert await purgatory.watch(ap.DelayedOperation(0.25), ["k"]) is ap.Outcome.EXPIRED
    assert [span.name for span in waits(exporter)] == ["wait fetch"]


async def test_a_trigger_from_another_thread_links_to_that_threads_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # check_and_complete_threadsafe runs on the loop in the calling thread's context
    # (asyncio's and uvloop's call_soon_threadsafe copy it): a worker's task span.
    purgatory: ap.Purgatory[Ready] = ap.Purgatory("jobs")
    tracer = provider.get_tracer("worker")
    parked = Ready()

    def worker() -> int:
        with tracer.start_as_current_span("job") as job:
            parked.ready = True
            purgatory.check_and_complete_threadsafe("job-1").result(timeout=10)
            return job.get_span_context().span_id

    with trace_waits(purgatory, tracer_provider=provider):
        purgatory.try_complete_else_watch(parked, ["job-1"])
        job_span_id = await asyncio.to_thread(worker)
        assert await parked is ap.Outcome.COMPLETED
    (wait,) = waits(exporter)
    assert wait.attributes is not None
    assert wait.attributes[ATTRIBUTE_COMPLETED_BY] == "job-1"
    assert [link.context.span_id for link in wait.links] == [job_span_id]


@pytest.mark.virtual_time
async def test_a_first_check_that_raises_ends_its_span_failed(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    class Raising(ap.DelayedOperation):
        def try_complete(self) -> bool:
            raise KeyError("gone")

    purgatory: ap.Purgatory = ap.Purgatory("fetch")
    with trace_waits(purgatory, tracer_provider=provider), pytest.raises(KeyError):
        await purgatory.watch(Raising(5.0), ["k"])
    (wait,) = waits(exporter)
    assert wait.attributes is not None
    assert wait.attributes[ATTRIBUTE_OUTCOME] == "failed"
    assert wait.status.status_code is StatusCode.ERROR


def test_a_wait_on_trio_is_traced_alike(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    import trio
    import trio.testing

    purgatory: ap.Purgatory = ap.Purgatory("fetch")
    tracer = provider.get_tracer("app")

    async def main() -> None:
        op = ap.WatermarkOperation(30.0)

        async def get() -> None:
            with tracer.start_as_current_span("GET"):
                assert await purgatory.watch(op, {"k": 1}) is ap.Outcome.COMPLETED

        async with trio.open_nursery() as nursery:
            nursery.start_soon(get)
            await trio.testing.wait_all_tasks_blocked()  # the GET parked
            with tracer.start_as_current_span("POST"):
                assert purgatory.advance("k", 1) == 1

    with trace_waits(purgatory, tracer_provider=provider):
        trio.run(main)
    (wait,) = waits(exporter)
    get, post = named(exporter, "GET"), named(exporter, "POST")
    assert wait.parent is not None
    assert wait.parent.span_id == get.context.span_id
    assert [link.context.span_id for link in wait.links] == [post.context.span_id]
    assert wait.attributes is not None
    assert wait.attributes[ATTRIBUTE_COMPLETED_BY] == "k"
