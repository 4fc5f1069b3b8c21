"""Traces across processes through a real PostgreSQL: a trigger's sampled span travels with it.

The waits are traced here (a TracerProvider with an in-memory exporter); the
triggers are made in another process (tests.support.postgres_worker, with a
TracerProvider of its own), or by a SyncPublisher in a thread. What crosses the
wire is read off the partition channels with a plain asyncpg connection.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span

import aiopurgatory as ap
from aiopurgatory.postgres import PostgresTriggers, SyncPublisher
from aiopurgatory.postgres._wire import (
    DEFAULT_PARTITIONS,
    decode,
    partition_channel,
    partition_of,
    split_sender,
)
from aiopurgatory.tracing import ATTRIBUTE_COMPLETED_BY, trace_waits
from tests.support.postgres import PostgresServer, Worker, connected, eventually

pytestmark = pytest.mark.realtime


class Process:
    """One process's tracing: its provider and what it exported."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("app")

    def spans(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans() if span.name == name]


class Armed(ap.DelayedOperation):
    """Completes at a check once armed."""

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.armed = False

    def try_complete(self) -> bool:
        return self.force_complete() if self.armed else False


class FailingTracer:
    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("tracer bug")


class FailingTracerProvider:
    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        return FailingTracer()


@pytest.fixture
def here() -> Iterator[Process]:
    process = Process()
    yield process
    process.provider.shutdown()


@pytest.fixture
async def worker(postgres_server: PostgresServer) -> AsyncIterator[Worker]:
    worker = Worker(postgres_server.dsn, "chan")
    try:
        await worker.start()
        yield worker
    finally:
        assert await worker.close() == 0


@pytest.fixture
async def wire(postgres_server: PostgresServer) -> AsyncIterator[list[str]]:
    """Every payload NOTIFYed on the partitions of the keys these tests use."""
    payloads: list[str] = []
    async with connected(postgres_server.dsn) as connection:
        keys = ("feed-7", "feed-8", "feed-9", "k", "c", "job-1")
        for n in {partition_of(key, DEFAULT_PARTITIONS) for key in keys}:
            channel = partition_channel("chan", n)
            await connection.add_listener(channel, lambda *args: payloads.append(args[3]))
        yield payloads


async def covered(triggers: PostgresTriggers, *keys: str) -> None:
    """Until the partitions of ``keys`` are listened to (what is committed next is
    received) and the catch-up reads of the watches are done (what is committed
    next completes through a notification, never through a late read)."""
    listener = triggers._listener
    assert listener is not None
    await eventually(lambda: listener.covers(list(keys)) and triggers._reader.idle)


def linked_to(span: ReadableSpan) -> list[tuple[str, str]]:
    return [
        (format(link.context.trace_id, "032x"), format(link.context.span_id, "016x"))
        for link in span.links
    ]


def carried(instance: str, trace_id: str, span_id: str) -> re.Pattern[str]:
    """The sender field of a payload from ``instance`` made in that span (sampled flag set)."""
    return re.compile(rf"{re.escape(instance)} 00-{trace_id}-{span_id}-[0-9a-f][13579bdf]")


def ids(span: Span) -> tuple[str, str]:
    where = span.get_span_context()
    return format(where.trace_id, "032x"), format(where.span_id, "016x")


async def test_waits_woken_by_triggers_of_another_process_link_to_their_spans(
    postgres_server: PostgresServer, here: Process, worker: Worker, wire: list[str]
) -> None:
    purgatory: ap.Purgatory[Any] = ap.Purgatory("feed")
    async with PostgresTriggers(purgatory, postgres_server.dsn, channel="chan") as triggers:
        with trace_waits(purgatory, tracer_provider=here.provider):

            async def get(op: ap.DelayedOperation, keys: Any) -> ap.Outcome:
                with here.tracer.start_as_current_span("GET /feed"):
                    return await triggers.watch(op, keys)

            polled = asyncio.ensure_future(get(ap.WatermarkOperation(30.0), {"feed-7": 3}))
            armed = Armed(30.0)
            checked = asyncio.ensure_future(get(armed, ["feed-8"]))
            committed = asyncio.ensure_future(get(ap.WatermarkOperation(30.0), {"feed-9": 1}))
            await covered(triggers, "feed-7", "feed-8", "feed-9")
            post = await worker.request("advance", key="feed-7", value=3, span="POST /feed")
            assert await asyncio.wait_for(polled, 5) is ap.Outcome.COMPLETED
            armed.armed = True
            nudge = await worker.request("check", key="feed-8", span="POST /nudge")
            assert await asyncio.wait_for(checked, 5) is ap.Outcome.COMPLETED
            # advance_in: the span current at the call, carried by the caller's transaction.
            done = await worker.request("advance_in", key="feed-9", value=1, span="POST /done")
            assert await asyncio.wait_for(committed, 5) is ap.Outcome.COMPLETED
    waits = {span.attributes[ATTRIBUTE_COMPLETED_BY]: span for span in here.spans("wait feed")}  # type: ignore[index]
    assert linked_to(waits["feed-7"]) == [(post["trace_id"], post["span_id"])]
    assert linked_to(waits["feed-8"]) == [(nudge["trace_id"], nudge["span_id"])]
    assert linked_to(waits["feed-9"]) == [(done["trace_id"], done["span_id"])]
    assert all(link.context.is_remote for span in waits.values() for link in span.links)
    gets = {span.context.span_id for span in here.spans("GET /feed")}
    assert {span.parent.span_id for span in waits.values() if span.parent} == gets
    # On the wire: "<sender id> <traceparent>" in the sender field, nothing more;
    # advance_in's sender id is "" (applied by every process).
    await eventually(lambda: len(wire) >= 3)
    instance = worker.events[0]["instance"]
    (advanced, nudged, in_transaction) = (decode(payload) for payload in wire)
    assert carried(instance, post["trace_id"], post["span_id"]).fullmatch(advanced[0])
    assert advanced[1:] == ([], [("feed-7", 3)])
    assert carried(instance, nudge["trace_id"], nudge["span_id"]).fullmatch(nudged[0])
    assert nudged[1:] == (["feed-8"], [])
    assert carried("", done["trace_id"], done["span_id"]).fullmatch(in_transaction[0])
    assert in_transaction[1:] == ([], [("feed-9", 1)])


async def test_an_unsampled_trigger_carries_nothing_and_old_payloads_still_apply(
    postgres_server: PostgresServer, here: Process, worker: Worker, wire: list[str]
) -> None:
    purgatory: ap.Purgatory[Any] = ap.Purgatory("feed")
    async with PostgresTriggers(purgatory, postgres_server.dsn, channel="chan") as triggers:
        with trace_waits(purgatory, tracer_provider=here.provider):
            waits = [
                asyncio.ensure_future(triggers.watch(ap.WatermarkOperation(30.0), {"k": n}))
                for n in (1, 2)
            ]
            await covered(triggers, "k")
            unsampled = await worker.request(
                "advance", key="k", value=1, span="POST", sampled=False
            )
            assert await asyncio.wait_for(waits[0], 5) is ap.Outcome.COMPLETED
            await worker.request("advance", key="k", value=2)  # no span at all
            assert await asyncio.wait_for(waits[1], 5) is ap.Outcome.COMPLETED
            # As the version before sends them; and a trace context that is not one.
            later = asyncio.ensure_future(triggers.watch(ap.WatermarkOperation(30.0), {"k": 5}))
            first = Armed(30.0)
            checked = asyncio.ensure_future(triggers.watch(first, ["c"]))
            await covered(triggers, "k", "c")
            await asyncio.sleep(0.05)  # the catch-up reads of k and c done
            first.armed = True
            channel = partition_channel("chan", partition_of("k", DEFAULT_PARTITIONS))
            async with connected(postgres_server.dsn) as connection:
                await connection.execute(
                    "SELECT pg_notify($1, $2)", channel, '[1,"1-00000000",[],["k",5]]'
                )
                await connection.execute(
                    "SELECT pg_notify($1, $2)",
                    partition_channel("chan", partition_of("c", DEFAULT_PARTITIONS)),
                    '[1,"1-00000000 not-a-traceparent",["c"],[]]',
                )
            assert await asyncio.wait_for(later, 5) is ap.Outcome.COMPLETED
            assert await asyncio.wait_for(checked, 5) is ap.Outcome.COMPLETED
            assert triggers.statistics().malformed == 0
    assert unsampled["trace_id"] != "0" * 32  # a real trace, which its sampler dropped
    instance = worker.events[0]["instance"]
    await eventually(lambda: len(wire) >= 4)
    assert [decode(payload) for payload in wire[:2]] == [
        (instance, [], [("k", 1)]),
        (instance, [], [("k", 2)]),
    ]
    assert [span.links for span in here.spans("wait feed")] == [(), (), (), ()]


def test_a_traced_payload_reads_in_the_version_before_as_a_trigger_of_another_process() -> None:
    # The version before decodes the list of four as here, then compares the
    # sender field with its own id ("<pid>-<hex>", no space): never equal, applied.
    payload = '[1," 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",[],["k",1]]'
    sender, checks, advances = decode(payload)
    assert " " in sender
    assert (checks, advances) == ([], [("k", 1)])
    assert split_sender(sender) == ("", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    assert split_sender("1-ab") == ("1-ab", None)


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


async def test_a_notification_is_applied_outside_the_context_the_listener_started_in(
    postgres_server: PostgresServer, here: Process, worker: Worker
) -> None:
    seen: list[str] = []

    class Seeing(ap.WatermarkOperation):
        def on_complete(self) -> None:
            seen.append(REQUEST_ID.get())

    purgatory: ap.Purgatory[Any] = ap.Purgatory("feed")
    with trace_waits(purgatory, tracer_provider=here.provider):
        with here.tracer.start_as_current_span("startup"):
            REQUEST_ID.set("startup")
            triggers = PostgresTriggers(purgatory, postgres_server.dsn, channel="chan")
            await triggers.__aenter__()
        try:
            REQUEST_ID.set("none")
            waits = [asyncio.ensure_future(triggers.watch(Seeing(30.0), {key: 1})) for key in "ab"]
            await covered(triggers, "a", "b")
            await worker.request("advance", key="a", value=1)
            post = await worker.request("advance", key="b", value=1, span="POST")
            for wait in waits:
                assert await asyncio.wait_for(wait, 5) is ap.Outcome.COMPLETED
        finally:
            await triggers.__aexit__(None, None, None)
    assert seen == ["none", "none"]
    links = {span.attributes[ATTRIBUTE_COMPLETED_BY]: span for span in here.spans("wait feed")}  # type: ignore[index]
    assert linked_to(links["a"]) == []  # never the startup span
    assert linked_to(links["b"]) == [(post["trace_id"], post["span_id"])]


async def test_stored_watermarks_read_back_are_applied_outside_the_entering_and_watching_contexts(
    postgres_server: PostgresServer, here: Process
) -> None:
    # Completed by reads, not notifications: "early" by the first resync of
    # __aenter__, "late" by the catch-up read its watch asks for. Neither runs
    # in the context of the code that entered the triggers (its span, its
    # variables) nor in the watcher's: the reads serve everyone at once.
    publisher = SyncPublisher(postgres_server.dsn, channel="chan")
    try:
        publisher.advance("early", 1)
        publisher.advance("late", 1)
    finally:
        publisher.close()
    seen: dict[str, str] = {}

    class Seeing(ap.WatermarkOperation):
        def __init__(self, name: str) -> None:
            super().__init__(30.0)
            self.name = name

        def on_complete(self) -> None:
            seen[self.name] = REQUEST_ID.get()

    async def watch_late(triggers: PostgresTriggers) -> ap.Outcome:
        REQUEST_ID.set("request")
        return await triggers.watch(Seeing("late"), {"late": 1})

    purgatory: ap.Purgatory[Any] = ap.Purgatory("feed")
    with trace_waits(purgatory, tracer_provider=here.provider):
        early = asyncio.ensure_future(purgatory.watch(Seeing("early"), {"early": 1}))
        await asyncio.sleep(0)
        with here.tracer.start_as_current_span("startup"):
            REQUEST_ID.set("startup")
            triggers = PostgresTriggers(purgatory, postgres_server.dsn, channel="chan")
            await triggers.__aenter__()
        try:
            assert await asyncio.wait_for(early, 5) is ap.Outcome.COMPLETED
            late = asyncio.ensure_future(watch_late(triggers))
            assert await asyncio.wait_for(late, 5) is ap.Outcome.COMPLETED
        finally:
            await triggers.__aexit__(None, None, None)
    assert seen == {"early": "none", "late": "none"}
    assert [linked_to(span) for span in here.spans("wait feed")] == [[], []]  # never "startup"


async def test_a_sync_publisher_trigger_from_a_thread_with_a_span_links_to_it(
    postgres_server: PostgresServer, here: Process
) -> None:
    worker_process = Process()  # a job worker's tracing
    purgatory: ap.Purgatory[Any] = ap.Purgatory("jobs")
    publisher = SyncPublisher(postgres_server.dsn, channel="chan")
    made: list[Span] = []

    def job() -> None:
        with worker_process.tracer.start_as_current_span("job") as span:
            publisher.advance("job-1", 100)
            made.append(span)

    try:
        async with PostgresTriggers(purgatory, postgres_server.dsn, channel="chan") as triggers:
            with trace_waits(purgatory, tracer_provider=here.provider):
                waiting = asyncio.ensure_future(
                    triggers.watch(ap.WatermarkOperation(30.0), {"job-1": 100})
                )
                await covered(triggers, "job-1")
                thread = threading.Thread(target=job)
                thread.start()
                await asyncio.to_thread(thread.join)
                assert await asyncio.wait_for(waiting, 5) is ap.Outcome.COMPLETED
    finally:
        publisher.close()
        worker_process.provider.shutdown()
    (wait,) = here.spans("wait jobs")
    assert linked_to(wait) == [ids(made[0])]


async def test_a_broken_tracer_never_breaks_a_wait_woken_by_a_traced_trigger(
    postgres_server: PostgresServer, worker: Worker
) -> None:
    purgatory: ap.Purgatory[Any] = ap.Purgatory("feed")
    async with PostgresTriggers(purgatory, postgres_server.dsn, channel="chan") as triggers:
        with trace_waits(purgatory, tracer_provider=FailingTracerProvider()) as tracing:  # type: ignore[arg-type]
            waiting = asyncio.ensure_future(
                triggers.watch(ap.WatermarkOperation(30.0), {"feed-7": 1})
            )
            await covered(triggers, "feed-7")
            await worker.request("advance", key="feed-7", value=1, span="POST")
            assert await asyncio.wait_for(waiting, 5) is ap.Outcome.COMPLETED
        assert tracing.failures == 1
        assert triggers.statistics().completed == 1


async def test_triggers_of_one_iteration_leave_as_one_payload_per_trace_context(
    postgres_server: PostgresServer, here: Process, wire: list[str]
) -> None:
    async with PostgresTriggers(None, postgres_server.dsn, channel="chan") as triggers:
        with here.tracer.start_as_current_span("one") as one:
            triggers.advance("k", 1)
            triggers.check_and_complete("k")
        triggers.advance("k", 2)
        with here.tracer.start_as_current_span("two") as two:
            triggers.advance("k", 3)
        await triggers.flush()
        assert triggers.statistics().pending == 0
    await eventually(lambda: len(wire) >= 3)
    decoded = sorted((decode(payload) for payload in wire), key=lambda m: len(m[0]))
    instance = triggers.instance
    assert decoded[0] == (instance, [], [("k", 2)])
    by_span = {split_sender(sender)[1]: (checks, advances) for sender, checks, advances in decoded}
    for span, expected in ((one, (["k"], [("k", 1)])), (two, ([], [("k", 3)]))):
        (traceparent,) = [tp for tp in by_span if tp and tp.split("-")[2] == ids(span)[1]]
        assert by_span[traceparent] == expected
    async with connected(postgres_server.dsn) as connection:
        assert await connection.fetchval('SELECT value FROM "chan_watermarks"') == 3


def test_triggers_made_without_a_span_import_nothing_of_opentelemetry(
    postgres_server: PostgresServer,
) -> None:
    code = """
import asyncio, sys
import psycopg
import aiopurgatory as ap
from aiopurgatory.postgres import PostgresTriggers, SyncPublisher

def otel():
    return {m for m in sys.modules if m.startswith(("opentelemetry", "aiopurgatory.tracing"))}

before = otel()

async def main(dsn):
    here = ap.Purgatory()
    async with PostgresTriggers(here, dsn) as waiting, PostgresTriggers(None, dsn) as posting:
        task = asyncio.ensure_future(waiting.watch(ap.WatermarkOperation(5.0), {"k": 1}))
        while not waiting._listener.covers(["k"]):
            await asyncio.sleep(0.01)
        posting.advance("k", 1)
        assert await task is ap.Outcome.COMPLETED
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        await posting.advance_in(conn, "k", 2)
        await conn.close()
    with SyncPublisher(dsn) as publisher:
        publisher.check_and_complete("k")

asyncio.run(main(sys.argv[1]))
print(sorted(otel() - before), sorted(before))
"""
    out = subprocess.run(
        [sys.executable, "-c", code, postgres_server.dsn],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == "[] []"


async def test_through_failed_sends_the_sender_keeps_each_trace_context_and_sends_it_after(
    postgres_server: PostgresServer, here: Process
) -> None:
    # The table locked by another transaction: the publisher's statements time
    # out (kept, retried) while the waiter's listener stays connected, so what
    # completes the waits is the notification, not a resync's read of the table.
    dsn = postgres_server.dsn
    fast: dict[str, Any] = {"reconnect_delay": (0.05, 0.2), "command_timeout": 0.3}
    purgatory: ap.Purgatory[Any] = ap.Purgatory("feed")
    async with (
        PostgresTriggers(purgatory, dsn, channel="chan") as waiter,
        PostgresTriggers(None, dsn, channel="chan", **fast) as publisher,
        connected(dsn) as locker,
    ):
        with trace_waits(purgatory, tracer_provider=here.provider):
            waits = {
                key: asyncio.ensure_future(waiter.watch(ap.WatermarkOperation(30.0), {key: 2}))
                for key in ("a", "b")
            }
            await covered(waiter, "a", "b")
            await asyncio.sleep(0.1)  # their catch-up reads done
            locking = locker.transaction()
            await locking.start()
            await locker.execute('LOCK TABLE "chan_watermarks" IN ACCESS EXCLUSIVE MODE')
            with here.tracer.start_as_current_span("POST a") as post_a:
                publisher.advance("a", 1)
            await eventually(lambda: publisher.statistics().publish_errors >= 1)
            with here.tracer.start_as_current_span("POST b") as post_b:
                publisher.advance("b", 2)
            with trace.use_span(post_a):  # the same span again: merged with what was kept
                publisher.advance("a", 2)
            await eventually(lambda: publisher.statistics().publish_errors >= 2)
            assert publisher.statistics().pending == 2
            assert not any(wait.done() for wait in waits.values())
            await locking.commit()
            for wait in waits.values():
                assert await asyncio.wait_for(wait, 10) is ap.Outcome.COMPLETED
            await asyncio.wait_for(publisher.flush(), 10)
            assert waiter.statistics().reconnects == 0
    spans = {span.attributes[ATTRIBUTE_COMPLETED_BY]: span for span in here.spans("wait feed")}  # type: ignore[index]
    assert linked_to(spans["a"]) == [ids(post_a)]
    assert linked_to(spans["b"]) == [ids(post_b)]
