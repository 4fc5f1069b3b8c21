"""Traces across processes through a real Redis: a trigger's sampled span travels with it.

The waits are traced here (a TracerProvider with an in-memory exporter); the
triggers are made in another process (tests.support.redis_worker, with a
TracerProvider of its own), by a publisher-only RedisTriggers here, or by a
SyncPublisher in a thread. What crosses the wire is read off the channel with a
plain redis-py client.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import re
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span

import aiopurgatory as ap
from aiopurgatory.redis import RedisTriggers, SyncPublisher
from aiopurgatory.redis._partitions import Partitions
from aiopurgatory.redis._publisher import publish_commands
from aiopurgatory.redis._wire import Batch, PublishMode, decode, sender_field, split_sender
from aiopurgatory.redis.testing import RedisServer
from aiopurgatory.tracing import ATTRIBUTE_COMPLETED_BY, trace_waits
from tests.support.redis import Worker, encode_key


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


@pytest.fixture
def here() -> Iterator[Process]:
    process = Process()
    yield process
    process.provider.shutdown()


@pytest.fixture
async def worker(redis_server: RedisServer) -> AsyncIterator[Worker]:
    worker = Worker(redis_server.url, "chan")
    try:
        await worker.start()
        yield worker
    finally:
        assert await worker.close() == 0


class Wire:
    """Every trigger message published on the channel's partitions, as JSON."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.pubsub = client.pubsub()
        self.messages: list[list[Any]] = []

    async def __aenter__(self) -> Wire:
        await self.pubsub.psubscribe("*chan:t")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pubsub.aclose()  # type: ignore[no-untyped-call]

    async def collect(self, count: int, within: float = 5.0) -> list[list[Any]]:
        async with asyncio.timeout(within):
            while len(self.messages) < count:
                message = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                if message is not None:
                    self.messages.append(json.loads(message["data"]))
        return self.messages


async def covered(triggers: RedisTriggers, *keys: str) -> None:
    """Until the partitions of ``keys`` are subscribed (what is published next is received)."""
    subscriber = triggers._subscriber
    assert subscriber is not None
    async with asyncio.timeout(10):
        while not subscriber.covers(keys):  # noqa: ASYNC110 - no event says so
            await asyncio.sleep(0.005)


def linked_to(span: ReadableSpan) -> list[tuple[str, str]]:
    return [
        (format(link.context.trace_id, "032x"), format(link.context.span_id, "016x"))
        for link in span.links
    ]


def carried(instance: str, trace_id: str, span_id: str) -> re.Pattern[str]:
    """The sender field of a message from ``instance`` made in that span (sampled flag set)."""
    return re.compile(rf"{instance} 00-{trace_id}-{span_id}-[0-9a-f][13579bdf]")


def ids(span: Span) -> tuple[str, str]:
    where = span.get_span_context()
    return format(where.trace_id, "032x"), format(where.span_id, "016x")


async def test_a_long_poll_woken_by_a_post_in_another_process_links_to_the_posts_span(
    redis_server: RedisServer, here: Process, worker: Worker, redis_client: aioredis.Redis
) -> None:
    purgatory: ap.Purgatory[Any] = ap.Purgatory("feed")
    async with (
        RedisTriggers(purgatory, redis_server.url, channel="chan") as triggers,
        Wire(redis_client) as wire,
    ):
        with trace_waits(purgatory, tracer_provider=here.provider):

            async def get(op: ap.DelayedOperation, keys: Any) -> ap.Outcome:
                with here.tracer.start_as_current_span("GET /feed"):
                    return await triggers.watch(op, keys)

            polled = asyncio.ensure_future(get(ap.WatermarkOperation(30.0), {"feed-7": 3}))
            armed = Armed(30.0)
            checked = asyncio.ensure_future(get(armed, ["feed-8"]))
            await covered(triggers, "feed-7", "feed-8")
            post = await worker.request(
                "advance", key=encode_key("feed-7"), value=3, span="POST /feed"
            )
            assert await asyncio.wait_for(polled, 5) is ap.Outcome.COMPLETED
            armed.armed = True
            nudge = await worker.request("check", key=encode_key("feed-8"), span="POST /nudge")
            assert await asyncio.wait_for(checked, 5) is ap.Outcome.COMPLETED
        (advanced, nudged) = await wire.collect(2)
    waits = {span.attributes[ATTRIBUTE_COMPLETED_BY]: span for span in here.spans("wait feed")}  # type: ignore[index]
    assert linked_to(waits["feed-7"]) == [(post["trace_id"], post["span_id"])]
    assert linked_to(waits["feed-8"]) == [(nudge["trace_id"], nudge["span_id"])]
    assert all(link.context.is_remote for link in waits["feed-7"].links)
    gets = {span.context.span_id for span in here.spans("GET /feed")}
    assert {span.parent.span_id for span in waits.values() if span.parent} == gets
    # On the wire: "<sender id> <traceparent>" in the sender field, nothing more.
    instance = worker.events[0]["instance"]
    assert advanced[::2] == [1, []]
    assert advanced[3] == ["feed-7", 3]
    assert carried(instance, post["trace_id"], post["span_id"]).fullmatch(advanced[1])
    assert nudged[::2] == [1, ["feed-8"]]
    assert nudged[3] == []
    assert carried(instance, nudge["trace_id"], nudge["span_id"]).fullmatch(nudged[1])


async def test_an_unsampled_trigger_carries_nothing_and_a_traced_message_reads_as_before(
    redis_server: RedisServer, here: Process, worker: Worker, redis_client: aioredis.Redis
) -> None:
    purgatory: ap.Purgatory[Any] = ap.Purgatory("feed")
    async with (
        RedisTriggers(purgatory, redis_server.url, channel="chan") as triggers,
        Wire(redis_client) as wire,
    ):
        with trace_waits(purgatory, tracer_provider=here.provider):
            waits = [
                asyncio.ensure_future(triggers.watch(ap.WatermarkOperation(30.0), {"k": n}))
                for n in (1, 2)
            ]
            await covered(triggers, "k")
            unsampled = await worker.request(
                "advance", key=encode_key("k"), value=1, span="POST", sampled=False
            )
            assert await asyncio.wait_for(waits[0], 5) is ap.Outcome.COMPLETED
            await worker.request("advance", key=encode_key("k"), value=2)  # no span at all
            assert await asyncio.wait_for(waits[1], 5) is ap.Outcome.COMPLETED
            sampled = await worker.request("advance", key=encode_key("k"), value=3, span="POST")
        messages = await wire.collect(3)
    assert unsampled["trace_id"] != "0" * 32  # a real trace, which its sampler dropped
    instance = worker.events[0]["instance"]
    assert messages[:2] == [[1, instance, [], ["k", 1]], [1, instance, [], ["k", 2]]]
    # What every released version checks before applying a message (_wire.decode):
    # a list of four, version 1, a str sender, two lists. The traced one passes;
    # its sender is not theirs, so they apply it (without its trace).
    traced = messages[2]
    assert len(traced) == 4
    assert traced[0] == 1
    assert [type(part) for part in traced[1:]] == [str, list, list]
    assert carried(instance, sampled["trace_id"], sampled["span_id"]).fullmatch(traced[1])
    assert len(traced[1]) == len(instance) + 1 + 55
    assert [span.links for span in here.spans("wait feed")] == [(), ()]


async def test_an_old_format_message_still_applies(
    redis_server: RedisServer, here: Process, redis_client: aioredis.Redis
) -> None:
    purgatory: ap.Purgatory[Any] = ap.Purgatory("feed")
    async with RedisTriggers(purgatory, redis_server.url, channel="chan") as triggers:
        with trace_waits(purgatory, tracer_provider=here.provider):
            first = Armed(30.0)
            waits = [
                asyncio.ensure_future(triggers.watch(ap.WatermarkOperation(30.0), {"k": 5})),
                asyncio.ensure_future(triggers.watch(first, ["c"])),
            ]
            await covered(triggers, "k", "c")
            first.armed = True
            channel = triggers._partitions.channel
            # As every released version sends them; and a trace context that is not one.
            await redis_client.publish(channel("k"), b'[1,"1-00000000",[],["k",5]]')
            await redis_client.publish(channel("c"), b'[1,"1-00000000 not-a-traceparent",["c"],[]]')
            for wait in waits:
                assert await asyncio.wait_for(wait, 5) is ap.Outcome.COMPLETED
            # Both messages read and applied. (The check-once after subscribing may
            # have completed the armed op before the second message arrived: seen on
            # Python 3.12, whose loop ran the subscriber's follow-up check later.)
            async with asyncio.timeout(5):
                while triggers.statistics().applied < 2:  # noqa: ASYNC110 - no event says so
                    await asyncio.sleep(0.005)
            assert triggers.statistics().received == 2
            assert triggers.statistics().malformed == 0
    assert [span.links for span in here.spans("wait feed")] == [(), ()]


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


async def test_a_message_is_applied_outside_the_context_the_instance_was_entered_in(
    redis_server: RedisServer, here: Process, worker: Worker
) -> None:
    # An application that enters RedisTriggers inside a span (its startup's) and
    # with context variables set: what a message completes sees neither.
    seen: list[str] = []

    class Seeing(ap.WatermarkOperation):
        def on_complete(self) -> None:
            seen.append(REQUEST_ID.get())

    purgatory: ap.Purgatory[Any] = ap.Purgatory("feed")
    await worker.request("advance", key=encode_key("s"), value=1)  # stored in Redis
    await worker.request("flush")
    with trace_waits(purgatory, tracer_provider=here.provider):
        # Watched before the start, completed by the start's catch-up read.
        early = ap.WatermarkOperation(30.0)
        purgatory.try_complete_else_watch(early, {"s": 1})
        with here.tracer.start_as_current_span("startup"):
            REQUEST_ID.set("startup")
            triggers = RedisTriggers(purgatory, redis_server.url, channel="chan")
            await triggers.__aenter__()
        try:
            REQUEST_ID.set("none")
            waits = [asyncio.ensure_future(triggers.watch(Seeing(30.0), {key: 1})) for key in "ab"]
            await covered(triggers, "a", "b")
            await worker.request("advance", key=encode_key("a"), value=1)
            post = await worker.request("advance", key=encode_key("b"), value=1, span="POST")
            for wait in waits:
                assert await asyncio.wait_for(wait, 5) is ap.Outcome.COMPLETED
        finally:
            await triggers.aclose()
    assert seen == ["none", "none"]
    waits_done = {span.attributes[ATTRIBUTE_COMPLETED_BY]: span for span in here.spans("wait feed")}  # type: ignore[index]
    (startup,) = here.spans("startup")
    assert early.outcome is ap.Outcome.COMPLETED
    assert waits_done["s"].links == ()
    assert waits_done["a"].links == ()
    assert linked_to(waits_done["b"]) == [(post["trace_id"], post["span_id"])]
    assert startup.context.span_id != int(post["span_id"], 16)


async def test_triggers_of_one_iteration_leave_as_one_message_per_trace_context(
    redis_server: RedisServer, redis_client: aioredis.Redis
) -> None:
    poster = Process()
    async with (
        RedisTriggers(None, redis_server.url, channel="chan", partitions=1) as triggers,
        Wire(redis_client) as wire,
    ):
        await asyncio.sleep(0.05)  # the pattern subscription is confirmed
        triggers.advance("a", 1)
        with poster.tracer.start_as_current_span("one") as one:
            triggers.advance("b", 1)
            triggers.check_and_complete("c")
            triggers.advance("b", 4)  # coalesced within its trace context
        with poster.tracer.start_as_current_span("two") as two:
            triggers.advance("a", 2)
        triggers.check_and_complete("d")
        await triggers.flush()
        messages = await wire.collect(3)
        assert triggers.statistics().published == 3
    me = triggers.instance
    trace_one, span_one = ids(one)
    trace_two, span_two = ids(two)
    assert messages[0] == [1, me, ["d"], ["a", 1]]
    assert [message[2:] for message in messages[1:]] == [[["c"], ["b", 4]], [[], ["a", 2]]]
    assert carried(me, trace_one, span_one).fullmatch(messages[1][1])
    assert carried(me, trace_two, span_two).fullmatch(messages[2][1])
    # The stored watermark is the highest of every group's.
    assert await redis_client.get(Partitions("chan", 1, me).stored_key("a")) == b"2"
    poster.provider.shutdown()


async def test_a_sync_publisher_trigger_from_a_thread_with_a_span_links_to_it(
    redis_server: RedisServer, here: Process, redis_client: aioredis.Redis
) -> None:
    worker_process = Process()  # a job worker's tracing
    purgatory: ap.Purgatory[Any] = ap.Purgatory("jobs")
    publisher = SyncPublisher(redis_server.url, channel="chan")
    made: list[Span] = []

    def job() -> None:
        with worker_process.tracer.start_as_current_span("job") as span:
            publisher.advance("job-1", 100)
            made.append(span)

    try:
        async with RedisTriggers(purgatory, redis_server.url, channel="chan") as triggers:
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
    (wait,) = here.spans("wait jobs")
    assert linked_to(wait) == [ids(made[0])]
    worker_process.provider.shutdown()


def test_triggers_made_without_a_span_import_nothing_of_opentelemetry(
    redis_server: RedisServer,
) -> None:
    # redis-py 8 imports OpenTelemetry's API itself when it is installed: what
    # was imported then is the baseline; the library's triggers add nothing to it.
    code = """
import asyncio, sys
import aiopurgatory as ap
from aiopurgatory.redis import RedisTriggers, SyncPublisher

def otel():
    return {m for m in sys.modules if m.startswith(("opentelemetry", "aiopurgatory.tracing"))}

before = otel()

async def main(url):
    here = ap.Purgatory()
    async with RedisTriggers(here, url) as waiting, RedisTriggers(None, url) as posting:
        task = asyncio.ensure_future(waiting.watch(ap.WatermarkOperation(5.0), {"k": 1}))
        while not waiting._subscriber.covers(["k"]):
            await asyncio.sleep(0.01)
        posting.advance("k", 1)
        assert await task is ap.Outcome.COMPLETED
    with SyncPublisher(url) as publisher:
        publisher.check_and_complete("k")

asyncio.run(main(sys.argv[1]))
print(sorted(otel() - before))
"""
    out = subprocess.run(
        [sys.executable, "-c", code, redis_server.url],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == "[]"


async def test_through_an_outage_the_sender_keeps_a_trace_context_and_the_outbox_drops_it(
    redis_server: RedisServer,
) -> None:
    # Both publishers meet a killed Redis with a trigger made in a sampled span.
    # RedisTriggers keeps its batch with its trace context and sends it when Redis
    # is back (its retry comes 1.5 s to 3 s after the failure: the wire is read by
    # then). SyncPublisher keeps its trigger in the outbox, delivered (at flush()) without it.
    poster = Process()
    # The outbox's thread retries only when flush() asks it to: on its own backoff
    # (0.1 s first) it could deliver before the wire below is subscribed.
    publisher = SyncPublisher(
        redis_server.url, channel="chan", partitions=1, reconnect_delay=(30.0, 30.0)
    )
    client = aioredis.from_url(redis_server.url)
    try:
        async with RedisTriggers(
            None, redis_server.url, channel="chan", partitions=1, reconnect_delay=(3.0, 3.0)
        ) as triggers:
            redis_server.kill()
            with poster.tracer.start_as_current_span("job") as job:
                triggers.advance("a", 1)
                await asyncio.to_thread(publisher.advance, "b", 1)  # the span goes along
                triggers.advance("c", 1)
            triggers.advance("c", 2)  # no span: a group of its own
            await asyncio.sleep(0.1)
            assert triggers.statistics().publish_errors == 1
            assert publisher.statistics().kept == 1
            redis_server.start()
            async with Wire(client) as wire:
                assert triggers.statistics().published == 0
                assert publisher.flush(5) == 0
                await asyncio.wait_for(triggers.flush(), 10)
                messages = await wire.collect(3)
    finally:
        publisher.close()
        await client.aclose()
    trace_id, span_id = ids(job)
    by_sender = {message[1]: message[2:] for message in messages}
    assert len(by_sender) == 3
    assert by_sender.pop(publisher.instance) == [[], ["b", 1]]
    assert by_sender.pop(triggers.instance) == [[], ["c", 2]]
    ((traced, rest),) = by_sender.items()
    assert carried(triggers.instance, trace_id, span_id).fullmatch(traced)
    assert rest == [[], ["a", 1, "c", 1]]
    poster.provider.shutdown()


def test_the_sender_field_splits_at_the_first_space_only() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert split_sender("4242-1a2b3c4d") == ("4242-1a2b3c4d", None)
    assert split_sender(sender_field("4242-1a2b3c4d", parent)) == ("4242-1a2b3c4d", parent)
    assert split_sender("4242-1a2b3c4d a b") == ("4242-1a2b3c4d", "a b")
    assert sender_field("4242-1a2b3c4d", None) == "4242-1a2b3c4d"
    # A cluster's commands (one per partition) carry it as the batch script's do.
    batch = Batch()
    batch.check("k")
    partitions = Partitions("chan", 4, "4242-1a2b3c4d")
    for command in publish_commands(
        sender_field("4242-1a2b3c4d", parent), batch, partitions, b"1000", PublishMode.SHARDED
    ):
        assert decode(command[-1]) == (f"4242-1a2b3c4d {parent}", ["k"], [])
