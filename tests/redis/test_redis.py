"""aiopurgatory.redis against a real redis-server: triggers and watermarks across processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import aiopurgatory as ap
from aiopurgatory.redis import RedisTriggers, RedisTriggersClosedError, RedisTriggersError
from aiopurgatory.redis._partitions import DEFAULT_PARTITIONS, Partitions
from aiopurgatory.redis.testing import RedisServer
from tests.support.redis import Worker, encode_key, write_on_a_closed_uvloop_transport

pytestmark = pytest.mark.realtime


class Flagged(ap.DelayedOperation):
    """Completes when checked while ``ready`` says so; counts its checks."""

    def __init__(self, timeout: float, ready: Callable[[], bool] = lambda: True) -> None:
        super().__init__(timeout)
        self.ready = ready
        self.checks = 0

    def try_complete(self) -> bool:
        self.checks += 1
        return self.force_complete() if self.ready() else False


async def eventually(condition: Callable[[], bool], within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def until(condition: Callable[[], Awaitable[bool]], within: float = 5.0) -> None:
    """Poll an async ``condition`` (e.g. a look at Redis) until it holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await condition():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def gate_reconnects(triggers: RedisTriggers) -> asyncio.Event:
    """Hold ``triggers``' re-subscriptions until the returned event is set.

    Makes a gap certain: what is published before the event is set reaches the
    subscriber only through the resync.
    """
    gate = asyncio.Event()
    subscriber = triggers._subscriber
    assert subscriber is not None
    subscribe = subscriber.subscribe

    async def gated() -> Any:
        await gate.wait()
        return await subscribe()

    subscriber.subscribe = gated  # type: ignore[method-assign]
    return gate


def stored_key(channel: str, key: str | bytes | int) -> bytes:
    """The Redis key under which ``channel``'s watermark of ``key`` is stored."""
    return Partitions(channel, DEFAULT_PARTITIONS).stored_key(key)


async def routed(triggers: RedisTriggers, *keys: str | bytes | int) -> None:
    """Wait until the partitions of ``keys`` are subscribed and caught up.

    A key watched on the purgatory directly (not through ``triggers.watch``) is
    found by the next sweep of the purgatory's keys; a trigger published before
    then is made good by a check, not received.
    """
    subscriber = triggers._subscriber
    assert subscriber is not None
    await eventually(lambda: subscriber.covers(keys))
    reader = triggers._reader
    await eventually(lambda: not (reader._keys or reader._checks or reader._resync))
    await asyncio.sleep(0.05)  # the read in flight, if any


async def subscribers(client: aioredis.Redis, channel: str) -> int:
    reply = await client.pubsub_numsub(channel)
    return int(reply[0][1])


async def client_names(client: aioredis.Redis) -> list[str]:
    return [c["name"] for c in await client.client_list() if c["name"].startswith("aiopurgatory")]


# -- across processes -------------------------------------------------------------------


@pytest.mark.parametrize("worker_loop", ["asyncio", "uvloop"])
async def test_check_and_complete_reaches_another_process(
    redis_server: RedisServer, worker_loop: str
) -> None:
    worker = Worker(redis_server.url, "chan", loop=worker_loop)
    try:
        await worker.start()
        purgatory: ap.Purgatory[Flagged] = ap.Purgatory("here")
        async with RedisTriggers(purgatory, redis_server.url, channel="chan") as triggers:
            # There: an op on "topic" that becomes ready; here: one on b"topic".
            await worker.request("watch", id="a", keys=[encode_key("topic")])
            await worker.request("arm", id="a")
            ready = False
            mine = Flagged(30, lambda: ready)
            waiting = asyncio.ensure_future(purgatory.watch(mine, [b"topic"]))
            await asyncio.sleep(0)
            ready = True
            # A check of b"topic" (bytes) does not touch "topic" (str) elsewhere...
            assert triggers.check_and_complete(b"topic") == 1
            await triggers.flush()
            assert await waiting is ap.Outcome.COMPLETED
            # ... and a check of "topic" completes the op in the other process.
            assert triggers.check_and_complete("topic") == 0
            done = await worker.expect("done", id="a")
            assert done["outcome"] == "COMPLETED"
            # The other way: the worker triggers, our op completes.
            ready = False
            other = Flagged(30, lambda: ready)
            waiting = asyncio.ensure_future(purgatory.watch(other, [7]))
            await routed(triggers, 7)
            ready = True
            await worker.request("check", key=encode_key(7))
            assert await asyncio.wait_for(waiting, 5) is ap.Outcome.COMPLETED
            stats = triggers.statistics()
            assert stats.received == 1
            assert stats.applied == 1
            assert stats.completed == 1
    finally:
        assert await worker.close() == 0


async def test_own_messages_are_not_applied_twice(
    redis_server: RedisServer, redis_client: aioredis.Redis
) -> None:
    purgatory: ap.Purgatory[Flagged] = ap.Purgatory("here")
    async with RedisTriggers(purgatory, redis_server.url) as triggers:
        op = Flagged(30, ready=lambda: False)
        purgatory.try_complete_else_watch(op, ["k"])
        assert op.checks == 1
        await routed(triggers, "k")  # so that its own message comes back
        assert op.checks == 2  # checked once when its partition was subscribed
        triggers.check_and_complete("k")
        assert op.checks == 3
        await triggers.flush()
        await eventually(lambda: triggers.statistics().echoes == 1)
        assert op.checks == 3
        assert triggers.statistics().applied == 0
        op.cancel()


# -- publisher only ---------------------------------------------------------------------


async def test_publisher_only_does_not_subscribe(
    redis_server: RedisServer, redis_client: aioredis.Redis
) -> None:
    purgatory: ap.Purgatory[Flagged] = ap.Purgatory("sub")
    async with (
        RedisTriggers(purgatory, redis_server.url, channel="c") as subscriber,
        RedisTriggers(None, redis_server.url, channel="c") as publisher,
    ):
        assert await subscribers(redis_client, "c") == 1
        names = await client_names(redis_client)
        assert f"aiopurgatory-sub-{subscriber.instance}" in names
        assert f"aiopurgatory-sub-{publisher.instance}" not in names
        ready = False
        op = Flagged(30, lambda: ready)
        waiting = asyncio.ensure_future(purgatory.watch(op, ["job"]))
        await asyncio.sleep(0)
        ready = True
        assert publisher.check_and_complete("job") == 0  # no local purgatory
        assert await asyncio.wait_for(waiting, 5) is ap.Outcome.COMPLETED
        publisher.advance("job", 3)
        await publisher.flush()
        assert await publisher.fetch_watermark("job") == 3
        stats = publisher.statistics()
        assert (stats.purgatory, stats.triggers, stats.published, stats.received) == (
            None,
            2,
            2,
            0,
        )
        assert stats.connected


# -- coalescing -------------------------------------------------------------------------


async def test_one_loop_iteration_is_one_round_trip_one_message_per_partition(
    redis_server: RedisServer, redis_client: aioredis.Redis
) -> None:
    partitions = Partitions("c", DEFAULT_PARTITIONS)
    listener = redis_client.pubsub()
    await listener.psubscribe("{*}c:t")
    confirmation = await listener.get_message(timeout=5)
    assert confirmation is not None
    assert confirmation["type"] == "psubscribe"
    async with RedisTriggers(None, redis_server.url, channel="c") as triggers:
        for i in range(100):
            triggers.advance("a", i)  # only the highest, 99, is sent
            triggers.advance(b"b", 100 - i)  # 100
            triggers.check_and_complete(i % 7)  # 0..6 once each
        await triggers.flush()
        expected = {partitions.of(key) for key in ("a", b"b", *range(7))}
        assert triggers.statistics().published == len(expected)
        checks: list[Any] = []
        advances: list[Any] = []
        for _ in expected:
            message = await listener.get_message(timeout=5)
            assert message is not None
            sender, its_checks, its_advances = json.loads(message["data"])[1:]
            assert sender == triggers.instance
            # Each message carries only its partition's keys.
            channel = message["channel"]
            keys = its_checks + [
                k["b"].encode() if isinstance(k, dict) else k for k in its_advances[::2]
            ]
            assert {partitions.channel(key) for key in keys} == {channel}
            checks += its_checks
            advances += its_advances
        assert sorted(checks) == list(range(7))
        pairs = {json.dumps(k): v for k, v in zip(advances[::2], advances[1::2], strict=True)}
        assert pairs == {'"a"': 99, '{"b": "b"}': 100}
        assert await listener.get_message(timeout=0.2) is None
        assert await redis_client.mget([stored_key("c", "a"), stored_key("c", b"b")]) == [
            b"99",
            b"100",
        ]
        ttl = await redis_client.pttl(stored_key("c", "a"))
        assert 86_000_000 < ttl <= 86_400_000
    await listener.aclose()  # type: ignore[no-untyped-call]


# -- input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "error", "argument"),
    [
        (True, 1, TypeError, "key"),
        (1.5, 1, TypeError, "key"),
        (("a", 1), 1, TypeError, "key"),
        (None, 1, TypeError, "key"),
        ("k", True, TypeError, "value"),
        ("k", "1", TypeError, "value"),
        ("k", None, TypeError, "value"),
        ("k", float("nan"), ValueError, "value"),
        ("k", float("inf"), ValueError, "value"),
        ("k", 2**53 + 1, ValueError, "value"),
    ],
)
async def test_bad_input_is_refused_before_anything_happens(
    redis_server: RedisServer, key: Any, value: Any, error: type[Exception], argument: str
) -> None:
    purgatory: ap.Purgatory[Flagged] = ap.Purgatory("here")
    async with RedisTriggers(purgatory, redis_server.url) as triggers:
        op = Flagged(30, ready=lambda: False)
        if argument == "value":
            purgatory.try_complete_else_watch(op, [key])
        with pytest.raises(error, match=argument):
            triggers.advance(key, value)
        if argument == "key":
            with pytest.raises(TypeError, match="key"):
                triggers.check_and_complete(key)
        assert not op.done() or argument == "key"
        stats = triggers.statistics()
        assert (stats.triggers, stats.pending, stats.published) == (0, 0, 0)


# -- closing ----------------------------------------------------------------------------


async def test_close_sends_pending_and_leaves_nothing(
    redis_server: RedisServer, redis_client: aioredis.Redis
) -> None:
    purgatory: ap.Purgatory[Flagged] = ap.Purgatory("here")
    before = set(asyncio.all_tasks())
    triggers = RedisTriggers(purgatory, redis_server.url, channel="c")
    with pytest.raises(RedisTriggersClosedError, match="not started"):
        triggers.check_and_complete("k")
    async with triggers:
        assert await subscribers(redis_client, "c") == 1
        # The subscriber, the reader's (its first resync's PING) and a command's.
        assert len(await client_names(redis_client)) == 3
        triggers.advance("k", 5)  # pending at close: sent by aclose
    assert await redis_client.get(stored_key("c", "k")) == b"5"
    assert set(asyncio.all_tasks()) == before

    async def gone() -> bool:
        # Redis notices a closed connection on its next event-loop turn.
        return await subscribers(redis_client, "c") == 0 and not await client_names(redis_client)

    await until(gone)
    assert not triggers.connected
    with pytest.raises(RedisTriggersClosedError, match="closed"):
        triggers.advance("k", 6)
    await triggers.aclose()  # idempotent
    assert purgatory.closed is False  # the purgatory is the caller's


# -- Redis down and back ----------------------------------------------------------------


async def test_after_a_restart_the_reader_reconnects_before_a_read_needs_it(
    redis_server: RedisServer,
) -> None:
    # Nothing is watched, so the resync has nothing to read: its PING still
    # replaces the reader's connection that died with Redis, and the first
    # read after the restart (a timeout=0 watch's, within catch_up_grace) is one
    # round trip on an open connection, not a connect and a handshake as well.
    purgatory: ap.Purgatory[Flagged] = ap.Purgatory("here")
    url = redis_server.url
    async with RedisTriggers(purgatory, url, channel="c", reconnect_delay=(0.05, 0.1)) as sub:
        reader = f"aiopurgatory-read-{sub.instance}"
        async with aioredis.from_url(url) as client:
            await until(lambda: reader_open(client, reader))
        redis_server.restart()
        resyncs = sub.statistics().resyncs
        await eventually(lambda: sub.statistics().resyncs > resyncs, within=10)
        async with aioredis.from_url(url) as client:
            assert reader in await client_names(client)  # opened again, before any read
        stats = sub.statistics()
        assert (stats.reads, stats.read_errors) == (0, 0)
        # A timeout=0 watch reads first (within the 0.1 s grace) on that connection.
        async with RedisTriggers(None, url, channel="c") as pub:
            pub.advance("k", 7)
        assert await sub.watch(ap.WatermarkOperation(0), {"k": 7}) is ap.Outcome.COMPLETED
        assert sub.statistics().reads >= 1
        assert sub.statistics().read_errors == 0


async def reader_open(client: aioredis.Redis, name: str) -> bool:
    return name in await client_names(client)


async def test_redis_killed_and_restarted_heals_at_reconnect(
    redis_server: RedisServer, redis_client: aioredis.Redis
) -> None:
    # The "real state" the operations check, as an application's would be.
    offsets: dict[str, int] = {"k": 0}
    purgatory: ap.Purgatory[Flagged] = ap.Purgatory("here")
    url = redis_server.url
    async with (
        RedisTriggers(purgatory, url, channel="c", reconnect_delay=(0.05, 0.1)) as sub,
        RedisTriggers(None, url, channel="c", reconnect_delay=(0.05, 0.05)) as pub,
    ):
        gate = gate_reconnects(sub)
        first = Flagged(30, lambda: offsets["k"] >= 5)
        second = Flagged(30, lambda: offsets["k"] >= 10)
        waiting = [asyncio.ensure_future(purgatory.watch(op, ["k"])) for op in (first, second)]
        await asyncio.sleep(0)
        offsets["k"] = 5
        pub.advance("k", 5)
        assert await asyncio.wait_for(waiting[0], 5) is ap.Outcome.COMPLETED
        received = sub.statistics().received

        redis_server.kill()
        await eventually(lambda: not sub.connected)
        assert sub.statistics().last_error is not None
        redis_server.start()

        # Published while the subscriber is away: it misses the message...
        offsets["k"] = 10
        pub.advance("k", 10)
        await asyncio.wait_for(pub.flush(), 5)
        assert await subscribers(redis_client, "c") == 0
        assert not second.done()
        # ... and completes the operation from the stored watermark at its resync.
        gate.set()
        assert await asyncio.wait_for(waiting[1], 10) is ap.Outcome.COMPLETED
        stats = sub.statistics()
        assert stats.connected
        assert stats.reconnects == 1
        assert stats.resyncs == 2
        assert stats.received == received  # it never saw the message
        assert stats.connection_errors >= 1
        # The watermark written before the crash survived it (appendfsync always).
        assert await pub.fetch_watermark("k") == 10
        # The publisher's connection died with Redis: it was replaced before use,
        # so the advance made after the restart did not fail once (issue 38).
        assert pub.statistics().publish_errors == 0


async def test_a_silent_redis_is_detected_by_the_health_check(redis_server: RedisServer) -> None:
    import os
    import signal

    purgatory: ap.Purgatory[Flagged] = ap.Purgatory("here")
    async with RedisTriggers(
        purgatory, redis_server.url, health_check_interval=0.2, reconnect_delay=(0.05, 0.2)
    ) as sub:
        assert redis_server.process is not None
        pid = redis_server.process.pid
        os.kill(pid, signal.SIGSTOP)  # the connection stays open, nothing answers
        try:
            await eventually(lambda: not sub.connected, within=5)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert "health-check PING" in (sub.statistics().last_error or "")
        await eventually(lambda: sub.connected, within=10)
        assert sub.statistics().reconnects >= 1


async def test_garbage_on_the_channel_is_counted_and_skipped(
    redis_server: RedisServer, redis_client: aioredis.Redis
) -> None:
    purgatory: ap.Purgatory[Flagged] = ap.Purgatory("here")
    async with (
        RedisTriggers(purgatory, redis_server.url, channel="c") as sub,
        RedisTriggers(None, redis_server.url, channel="c") as pub,
    ):
        for garbage in (
            b"hello",
            b"[2, 1, [], []]",
            b'[1, "x", [1.5], []]',
            b'[1, "x", [], ["k"]]',
        ):
            await redis_client.publish("c", garbage)
        ready = False
        op = Flagged(30, lambda: ready)
        waiting = asyncio.ensure_future(purgatory.watch(op, ["k"]))
        await routed(sub, "k")
        ready = True
        pub.check_and_complete("k")
        assert await asyncio.wait_for(waiting, 5) is ap.Outcome.COMPLETED
        # The trigger's message arrives even when a catch-up read still in flight
        # (a loaded machine) saw the advance first and completed the operation.
        await eventually(lambda: sub.statistics().received == 1)
        stats = sub.statistics()
        assert (stats.malformed, stats.received, stats.connected) == (4, 1, True)


async def test_close_with_redis_down_is_bounded(redis_server: RedisServer) -> None:
    purgatory: ap.Purgatory[Flagged] = ap.Purgatory("here")
    triggers = RedisTriggers(purgatory, redis_server.url, close_timeout=0.5)
    async with triggers:
        redis_server.kill()
        await eventually(lambda: not triggers.connected)
        triggers.advance("k", 1)
        flushing = asyncio.ensure_future(triggers.flush())
        loop = asyncio.get_running_loop()
        started = loop.time()
    assert loop.time() - started < 3
    with pytest.raises(RedisTriggersClosedError):
        await flushing
    assert triggers.statistics().pending == 1


# -- credentials ------------------------------------------------------------------------

PASSWORD = "s3cr:et@/p%ss"


def assert_no_password(*texts: str) -> None:
    from urllib.parse import quote

    for text in texts:
        assert PASSWORD not in text
        assert quote(PASSWORD, safe="") not in text
        assert "s3cr" not in text


def everything_about(exc: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level("DEBUG", logger="aiopurgatory")
    return caplog


def logged(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(
        f"{record.getMessage()} {getattr(record, 'aiopurgatory', '')}" for record in caplog.records
    )


async def test_a_wrong_password_is_a_clear_error_without_the_password(
    redis_server_factory: Callable[..., RedisServer], logs: pytest.LogCaptureFixture
) -> None:
    server = redis_server_factory(password=PASSWORD)
    wrong = server.url_for(None, PASSWORD[::-1])
    for url in (wrong, server.url_for(None, None)):
        triggers = RedisTriggers(ap.Purgatory(), url)
        with pytest.raises(RedisTriggersError, match="authentication failed") as caught:
            await triggers.__aenter__()
        assert caught.value.__cause__ is None
        assert caught.value.__context__ is None
        assert_no_password(everything_about(caught.value), repr(triggers))
        assert_no_password(str(triggers.statistics()), logged(logs))
        assert PASSWORD[::-1] not in everything_about(caught.value)


async def test_an_acl_user_passes_through_and_its_password_shows_nowhere(
    redis_server_factory: Callable[..., RedisServer], logs: pytest.LogCaptureFixture
) -> None:
    server = redis_server_factory(
        extra_args=[
            *("--user", "alice", "on", f">{PASSWORD}", "~*", "&*", "+@all"),
            *("--user", "default", "off"),
        ]
    )
    url = server.url_for("alice", PASSWORD)
    with pytest.raises(RedisTriggersError, match="authentication failed") as caught:
        async with RedisTriggers(None, server.url_for("alice", "nope")):
            pass
    assert_no_password(everything_about(caught.value))

    purgatory: ap.Purgatory[Flagged] = ap.Purgatory("here")
    async with (
        RedisTriggers(purgatory, url, reconnect_delay=(0.05, 0.1)) as sub,
        RedisTriggers(None, url) as pub,
    ):
        assert "alice:***@" in repr(sub)
        ready = False
        op = Flagged(30, lambda: ready)
        waiting = asyncio.ensure_future(purgatory.watch(op, [b"k"]))
        await asyncio.sleep(0)
        ready = True
        pub.check_and_complete(b"k")
        assert await asyncio.wait_for(waiting, 5) is ap.Outcome.COMPLETED
        server.kill()
        await eventually(lambda: not sub.connected)
        pub.advance(b"k", 1)
        await eventually(lambda: pub.statistics().publish_errors > 0)
        server.start()
        await eventually(lambda: sub.connected, within=10)
        await asyncio.wait_for(pub.flush(), 10)
        texts = [repr(sub), repr(pub), str(sub.statistics()), str(pub.statistics())]
        assert sub.statistics().last_error is not None
    assert_no_password(*texts, logged(logs))
    assert "aiopurgatory.redis.disconnected" in logged(logs)


async def test_a_redis_error_that_shows_the_url_is_redacted(
    redis_server_factory: Callable[..., RedisServer],
    logs: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError

    server = redis_server_factory(password=PASSWORD)
    url = server.url

    async def failing_connect(self: aioredis.Connection) -> None:
        raise RedisConnectionError(f"Error connecting to {url} (password {PASSWORD})")

    monkeypatch.setattr(aioredis.Connection, "connect", failing_connect)
    triggers = RedisTriggers(None, url)
    with pytest.raises(RedisTriggersError, match="unreachable") as caught:
        await triggers.__aenter__()
    assert "127.0.0.1" in str(caught.value)
    assert_no_password(everything_about(caught.value), str(triggers.statistics()), logged(logs))


def test_redactor_removes_passwords_in_every_form() -> None:
    from urllib.parse import quote, quote_plus

    from aiopurgatory.redis._redact import Redactor, describe_url

    redactor = Redactor(PASSWORD)
    for text in (
        f"redis://:{PASSWORD}@h:1/0",
        f"rediss://user:{quote(PASSWORD, safe='')}@h:1/0 failed",
        f"pw={quote_plus(PASSWORD)}",
        f"bad {PASSWORD} and again {PASSWORD}",
    ):
        redacted = redactor.redact(text)
        assert_no_password(redacted)
        assert "***" in redacted
    # Any URL's password, even one this redactor was not told about.
    assert Redactor().redact("at redis://bob:hunter2@host:6379/0.") == (
        "at redis://bob:***@host:6379/0."
    )
    assert describe_url(f"redis://bob:{quote(PASSWORD, safe='')}@h:6379/1") == (
        "redis://bob:***@h:6379/1"
    )
    assert describe_url("redis://h:6379") == "redis://h:6379"


# -- construction -----------------------------------------------------------------------


def test_trio_is_refused_at_construction() -> None:
    import trio

    async def main() -> None:
        with pytest.raises(RuntimeError, match="asyncio event loop"):
            RedisTriggers(None, "redis://127.0.0.1:1/0")

    trio.run(main)


@pytest.mark.parametrize(
    ("args", "options", "error", "match"),
    [
        (("not a purgatory", "redis://h"), {}, TypeError, "purgatory"),
        ((None, 42), {}, TypeError, "url_or_client"),
        ((None, "redis://h"), {"channel": b"c"}, TypeError, "channel"),
        ((None, "redis://h"), {"channel": ""}, ValueError, "channel"),
        ((None, "redis://h"), {"watermark_ttl": 0}, ValueError, "watermark_ttl"),
        ((None, "redis://h"), {"health_check_interval": True}, TypeError, "health_check"),
        ((None, "redis://h"), {"reconnect_delay": (2.0, 1.0)}, ValueError, "reconnect_delay"),
        ((None, "http://h"), {}, ValueError, "url_or_client"),
    ],
)
def test_bad_construction_arguments(
    args: tuple[Any, ...], options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        RedisTriggers(*args, **options)


# -- metrics ----------------------------------------------------------------------------


async def test_prometheus_exports_the_statistics(redis_server: RedisServer) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from aiopurgatory.metrics.prometheus import RedisTriggersCollector

    def scrape() -> dict[tuple[str, str, str], float]:
        text = generate_latest(registry).decode()
        return {
            (sample.name, sample.labels["purgatory"], sample.labels.get("error", "")): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if not sample.name.endswith("_created")
        }

    registry = CollectorRegistry()
    purgatory: ap.Purgatory[Flagged] = ap.Purgatory("here")
    async with (
        RedisTriggers(purgatory, redis_server.url, reconnect_delay=(0.05, 0.1)) as sub,
        RedisTriggers(None, redis_server.url) as pub,
    ):
        collector = RedisTriggersCollector([sub, pub], registry=registry)
        with pytest.raises(ValueError, match="already registered"):
            collector.register(RedisTriggers(None, redis_server.url))
        with pytest.raises(TypeError, match="RedisTriggers"):
            collector.register(purgatory)  # type: ignore[arg-type]
        op = Flagged(30, lambda: False)
        purgatory.try_complete_else_watch(op, ["k"])
        await routed(sub, "k")
        reads = sub.statistics().reads  # the catch-up of "k"'s new subscription
        pub.advance("k", 1)
        pub.check_and_complete("k")
        await pub.flush()
        await eventually(lambda: sub.statistics().received == 1)
        values = scrape()
        assert values[("aiopurgatory_redis_connected", "here", "")] == 1
        assert values[("aiopurgatory_redis_connected", "", "")] == 1
        assert values[("aiopurgatory_redis_triggers_total", "", "")] == 2
        assert values[("aiopurgatory_redis_published_total", "", "")] == 1
        assert values[("aiopurgatory_redis_received_total", "here", "")] == 1
        assert values[("aiopurgatory_redis_applied_total", "here", "")] == 2
        assert values[("aiopurgatory_redis_resyncs_total", "here", "")] == 1
        assert not any(name.endswith("_info") for name, _, _ in values)
        redis_server.kill()
        await eventually(lambda: not sub.connected)
        values = scrape()
        assert values[("aiopurgatory_redis_connected", "here", "")] == 0
        assert values[("aiopurgatory_redis_last_error_info", "here", "ConnectionError")] == 1
        assert values[("aiopurgatory_redis_connection_errors_total", "here", "")] >= 1
        redis_server.start()
        await eventually(lambda: sub.connected, within=10)
        assert scrape()[("aiopurgatory_redis_reconnects_total", "here", "")] == 1
        # The resync after the reconnect read the watched key's stored watermark.
        await eventually(lambda: sub.statistics().reads == reads + 1)
        values = scrape()
        assert values[("aiopurgatory_redis_reads_total", "here", "")] == reads + 1
        assert values[("aiopurgatory_redis_read_errors_total", "here", "")] == 0
        op.cancel()
    assert collector.unregister(sub)
    assert not collector.unregister(sub)


# -- TLS --------------------------------------------------------------------------------


# What a real CA issues, so that a client verifying strictly accepts it (Python 3.13's
# ssl.create_default_context() sets VERIFY_X509_STRICT, which refuses a CA without
# keyUsage): a CA marked as one (basicConstraints critical, keyUsage keyCertSign and
# cRLSign), a leaf for a TLS server at 127.0.0.1 (keyUsage, extendedKeyUsage
# serverAuth, subjectAltName), both with key identifiers linking them.
CA_EXTENSIONS = """\
[req]
distinguished_name = dn
x509_extensions = ca
[dn]
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
"""
SERVER_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
"""


def make_certificates(directory: Path) -> tuple[str, str, str]:
    """A CA and a server certificate for 127.0.0.1 it signed, made with the openssl command.

    Returns the paths of the server's certificate and key, and the CA's certificate.
    """
    import shutil
    import subprocess

    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("the TLS test needs the openssl command: apt-get install openssl")
    directory.mkdir()
    ca_key, ca, ca_conf, key, csr, cert, ext = (
        str(directory / name)
        for name in ("ca.key", "ca.crt", "ca.cnf", "server.key", "server.csr", "server.crt", "ext")
    )
    Path(ca_conf).write_text(CA_EXTENSIONS)
    Path(ext).write_text(SERVER_EXTENSIONS)
    # EC keys: generated at once, where RSA keys take a noticeable part of a second.
    new_key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    for command in (
        f"req -x509 {new_key} -keyout {ca_key} -out {ca} -days 2 -subj /CN=test-ca "
        f"-config {ca_conf}",
        f"req {new_key} -keyout {key} -out {csr} -subj /CN=127.0.0.1",
        f"x509 -req -in {csr} -CA {ca} -CAkey {ca_key} -CAcreateserial -out {cert} -days 2 "
        f"-extfile {ext}",
    ):
        args = command.split()
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)
    return cert, key, ca


def test_the_test_certificates_pass_strict_verification(tmp_path: Path) -> None:
    # A TLS handshake in memory, the client verifying as 3.13's default context does
    # (VERIFY_X509_STRICT, set here on every version): the Redis TLS test's server
    # must be accepted there too.
    import ssl

    cert, key, ca = make_certificates(tmp_path / "tls")
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    client_context = ssl.create_default_context(cafile=ca)
    client_context.verify_flags |= ssl.VERIFY_X509_STRICT
    wires = [ssl.MemoryBIO() for _ in range(4)]  # client in/out, server in/out
    client = client_context.wrap_bio(wires[0], wires[1], server_hostname="127.0.0.1")
    server = server_context.wrap_bio(wires[2], wires[3], server_side=True)
    done = {client: False, server: False}
    for _ in range(10):  # a TLS 1.3 handshake takes two round trips
        for side in (client, server):
            if not done[side]:
                try:
                    side.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        wires[2].write(wires[1].read())
        wires[0].write(wires[3].read())
        if all(done.values()):
            break
    assert done == {client: True, server: True}
    peer = client.getpeercert()
    assert peer is not None
    assert peer["subject"] == ((("commonName", "127.0.0.1"),),)


async def test_rediss_with_a_password_passes_through(
    redis_server_factory: Callable[..., RedisServer],
    tmp_path: Path,
    logs: pytest.LogCaptureFixture,
) -> None:
    server = redis_server_factory(password=PASSWORD, tls=make_certificates(tmp_path / "tls"))
    assert server.url.startswith("rediss://")
    purgatory: ap.Purgatory[Flagged] = ap.Purgatory("here")
    async with (
        RedisTriggers(purgatory, server.url) as sub,
        RedisTriggers(None, server.url) as pub,
    ):
        ready = False
        op = Flagged(30, lambda: ready)
        waiting = asyncio.ensure_future(purgatory.watch(op, ["k"]))
        await asyncio.sleep(0)
        ready = True
        pub.advance("k", 1)
        assert await asyncio.wait_for(waiting, 5) is ap.Outcome.COMPLETED
        assert await pub.fetch_watermark("k") == 1
        assert repr(sub).startswith("<RedisTriggers channel='aiopurgatory' redis=rediss://:***@")
        texts = [repr(sub), repr(pub)]
    # Plain text to the TLS port is refused: the connection above was TLS.
    plain = server.url_for(None, PASSWORD).replace("rediss://", "redis://").split("?")[0]
    with pytest.raises(RedisTriggersError, match="cannot connect"):
        async with RedisTriggers(None, plain):
            pass
    assert_no_password(*texts, logged(logs))


# -- the benchmark command --------------------------------------------------------------


def test_the_benchmark_command_measures_every_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiopurgatory.redis import bench

    output = tmp_path / "bench.json"
    # Every key parked on: the subscriber's partitions take every trigger.
    argv = ["--triggers", "300", "--loop", "asyncio", "--keys", "300", "--parked", "300"]
    argv += ["--batch", "-1", "--batch", "0", "--batch", "10", "--output", str(output)]
    assert bench.main(argv) == 0
    floor, alone, batched = json.loads(output.read_text())
    for result in (floor, alone, batched):
        assert result["subscriber_applied"] == 301  # every advance, and the final check
        for side in ("publisher", "subscriber", "redis"):
            assert result[f"{side}_cpu_us_per_trigger"] > 0
    assert alone["messages"] == 300  # one per trigger
    # One message per partition of a batch's keys: at most one per partition of
    # each loop iteration's 10 keys (fewer when more gathered behind a send), at
    # least one per partition of all the keys.
    of = Partitions("aiopurgatory-bench", DEFAULT_PARTITIONS).of
    most = sum(len({of(f"k{i}") for i in range(s, s + 10)}) for s in range(0, 300, 10))
    assert len({of(f"k{i}") for i in range(300)}) <= batched["messages"] <= most
    assert capsys.readouterr().out.count("CPU per trigger") == 3


async def test_a_loop_that_dies_of_a_bug_is_not_silent(
    redis_server: RedisServer, logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    purgatory: ap.Purgatory[Flagged] = ap.Purgatory("here")
    async with RedisTriggers(purgatory, redis_server.url, reconnect_delay=(0.05, 0.1)) as sub:

        def broken(attempt: int) -> float:
            raise ZeroDivisionError("a bug")

        monkeypatch.setattr(sub._connections, "backoff", broken)
        redis_server.kill()  # the subscriber reconnects: its backoff raises
        await eventually(lambda: "ZeroDivisionError" in (sub.statistics().last_error or ""))
        assert not sub.connected
    assert "aiopurgatory.redis.task_ended" in logged(logs)


def test_a_missing_redis_server_fails_the_tests_and_says_how_to_install() -> None:
    import os
    import subprocess
    import sys

    from aiopurgatory.redis.testing import INSTALL_HINT

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "AIOPURGATORY_REDIS_SERVER": "/nonexistent/redis-server"}
    run = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA"),
            "tests/redis/test_redis.py::test_publisher_only_does_not_subscribe",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout
    assert "2 errors" in run.stdout or "2 failed" in run.stdout
    assert "skipped" not in run.stdout
    assert "apt-get install -y redis-server" in run.stdout
    assert INSTALL_HINT.split(":")[0] in run.stdout


async def test_a_password_changed_under_a_running_subscriber(
    redis_server_factory: Callable[..., RedisServer], logs: pytest.LogCaptureFixture
) -> None:
    server = redis_server_factory(password=PASSWORD)
    admin = aioredis.from_url(server.url)
    purgatory: ap.Purgatory[Flagged] = ap.Purgatory("here")
    try:
        async with RedisTriggers(purgatory, server.url, reconnect_delay=(0.05, 0.1)) as sub:
            await admin.config_set("requirepass", "rotated-elsewhere")
            await admin.client_kill_filter(_type="pubsub")
            await eventually(lambda: "Authentication" in (sub.statistics().last_error or ""))
            await eventually(lambda: sub.statistics().connection_errors >= 4)
            assert not sub.connected
            await admin.config_set("requirepass", PASSWORD)
            await eventually(lambda: sub.connected)
            assert sub.statistics().reconnects == 1
    finally:
        await admin.aclose()
    warnings = [r.getMessage() for r in logs.records if r.levelname == "WARNING"]
    # One line for the loss, one per distinct cause of failed attempts, one for the return.
    assert sum("reconnect_failed" in line for line in warnings) == 1
    assert sum("reconnected" in line for line in warnings) == 1
    assert_no_password(logged(logs), "\n".join(warnings))


async def test_a_cancelled_close_still_leaves_nothing(
    redis_server: RedisServer, redis_client: aioredis.Redis
) -> None:
    purgatory: ap.Purgatory[Flagged] = ap.Purgatory("here")
    triggers = RedisTriggers(purgatory, redis_server.url, channel="c", close_timeout=30)
    await triggers.__aenter__()
    redis_server.kill()
    await eventually(lambda: not triggers.connected)
    triggers.advance("k", 1)  # cannot be sent: aclose() would wait up to 30 s
    closing = asyncio.ensure_future(triggers.aclose())
    await asyncio.sleep(0.1)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert [t for t in asyncio.all_tasks() if "aiopurgatory-redis" in t.get_name()] == []
    assert triggers.statistics().connected is False
    with pytest.raises(RedisTriggersClosedError):
        triggers.advance("k", 2)


# -- a connection closed under a write, on uvloop ------------------------------------


def test_a_write_on_a_closed_uvloop_transport_is_a_lost_connection() -> None:
    # uvloop raises RuntimeError there (asyncio's transports drop the write), and
    # redis-py maps OSError only: seen in CI when Redis went away between a connect
    # and its first command. The triggers' Redis I/O takes it for a lost connection
    # (retried), not for a bug (a batch dropped, the subscriber ended).
    import uvloop
    from redis.exceptions import ConnectionError as RedisConnectionError

    from aiopurgatory.redis._link import CONNECTION_LOST, closed_transport

    raw = uvloop.run(write_on_a_closed_uvloop_transport(contextlib.nullcontext))
    assert type(raw) is RuntimeError
    assert closed_transport(raw)
    mapped = uvloop.run(write_on_a_closed_uvloop_transport(lambda: CONNECTION_LOST))
    assert isinstance(mapped, RedisConnectionError)
    assert mapped.__cause__ is not None
    assert closed_transport(mapped.__cause__)
    # Any other RuntimeError is left alone.
    with pytest.raises(RuntimeError, match="a bug"), CONNECTION_LOST:
        raise RuntimeError("a bug")
    assert not closed_transport(RuntimeError("a bug"))
