"""aiopurgatory.redis.SyncPublisher against a real redis-server and async subscribers elsewhere.

The subscribers are ``tests.support.redis_worker`` processes (a purgatory with a
RedisTriggers); the publisher is called from threads of this process, as a
Celery task or a Django view would call it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

import aiopurgatory as ap
from aiopurgatory.redis import (
    RedisTriggers,
    RedisTriggersClosedError,
    RedisTriggersError,
    SyncPublisher,
)
from aiopurgatory.redis._partitions import DEFAULT_PARTITIONS, Partitions
from aiopurgatory.redis.testing import RedisServer
from tests.support.redis import Worker, encode_key

pytestmark = pytest.mark.realtime
# An async test's own loop only drives the worker processes: one loop is enough.
one_loop = pytest.mark.asyncio(loop_factories=["asyncio"])

PASSWORD = "s3cr:et@/p%ss"


def stored_watermark(server: RedisServer, channel: str, key: str | bytes | int) -> bytes | None:
    client = redis.Redis.from_url(server.url)
    try:
        value = client.get(Partitions(channel, DEFAULT_PARTITIONS).stored_key(key))
        assert value is None or isinstance(value, bytes)
        return value
    finally:
        client.close()


@pytest.fixture
def publisher(redis_server: RedisServer) -> Iterator[SyncPublisher]:
    with SyncPublisher(redis_server.url, channel="jobs") as publisher:
        yield publisher


async def in_thread(call: Callable[[], Any]) -> Any:
    """``call()`` in a thread of its own (not the loop's), as sync code runs it."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    await asyncio.to_thread(thread.join)
    if errors:
        raise errors[0]
    return result[0]


async def done(worker: Worker, name: str) -> dict[str, Any]:
    """The worker's ``done`` event for op ``name`` (already read, or the next one)."""
    for event in worker.events:
        if event["event"] == "done" and event["id"] == name:
            return event
    return await worker.expect("done", id=name)


# -- across processes -------------------------------------------------------------------


@one_loop
@pytest.mark.parametrize("worker_loop", ["asyncio", "uvloop"])
async def test_a_sync_advance_in_a_thread_completes_an_op_parked_in_another_process(
    redis_server: RedisServer, publisher: SyncPublisher, worker_loop: str
) -> None:
    worker = Worker(redis_server.url, "jobs", loop=worker_loop)
    try:
        await worker.start()
        latencies = []
        for job in range(5):
            key = f"job-{job}"
            await worker.request("watch", id=key, thresholds=[[encode_key(key), 3]], timeout=30)
            await in_thread(functools.partial(publisher.advance, key, 2))  # below: still parked
            started = time.monotonic()
            await in_thread(functools.partial(publisher.advance, key, 3))
            done = await worker.expect("done", id=key)
            latencies.append(time.monotonic() - started)
            assert done["outcome"] == "COMPLETED"
            assert [e for e in worker.events if e["event"] == "done" and e["id"] == key] == [done]
            assert stored_watermark(redis_server, "jobs", key) == b"3"
        # Generous bounds on a shared 2-core machine: the typical case is the claim.
        assert statistics.median(latencies) < 0.1, latencies
        assert max(latencies) < 2.0, latencies

        # A plain check reaches the same process's watchers.
        await worker.request("watch", id="plain", keys=[encode_key(b"plain")], timeout=30)
        await worker.request("arm", id="plain")
        await in_thread(lambda: publisher.check_and_complete(b"plain"))
        assert (await worker.expect("done", id="plain"))["outcome"] == "COMPLETED"
        stats = await worker.request("stats")
        assert stats["malformed"] == 0
        assert stats["received"] == 11  # 10 advances and 1 check, none of its own
    finally:
        await worker.close()


@one_loop
async def test_a_stored_watermark_reaches_a_subscriber_that_was_away(
    redis_server: RedisServer, publisher: SyncPublisher
) -> None:
    # The advance is state in Redis: a process that watches after it (here, after
    # its subscription restarts) catches up from the stored watermark.
    publisher.advance(7, 10)
    client = redis.Redis.from_url(redis_server.url)
    ttl = client.pttl(Partitions("jobs", DEFAULT_PARTITIONS).stored_key(7))
    client.close()
    assert 86_390_000 < int(ttl) <= 86_400_000
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("late")
    async with RedisTriggers(purgatory, redis_server.url, channel="jobs") as triggers:
        op = ap.WatermarkOperation(30)
        assert await asyncio.wait_for(triggers.watch(op, {7: 10}), 5) is ap.Outcome.COMPLETED


@one_loop
async def test_many_threads_share_one_publisher(
    redis_server: RedisServer, publisher: SyncPublisher
) -> None:
    threads, per_thread = 8, 40
    worker = Worker(redis_server.url, "jobs")
    try:
        await worker.start()
        for n in range(threads):
            await worker.request(
                "watch", id=f"t{n}", thresholds=[[encode_key(f"t{n}"), per_thread - 1]]
            )
        await worker.request(
            "watch", id="shared", thresholds=[[encode_key("shared"), threads * per_thread - 1]]
        )

        def work(n: int) -> None:
            for i in range(per_thread):
                publisher.advance(f"t{n}", i)
                publisher.advance("shared", n * per_thread + i)
                publisher.check_and_complete(f"t{n}")

        with ThreadPoolExecutor(threads) as pool:
            await asyncio.gather(
                *(asyncio.wrap_future(pool.submit(work, n)) for n in range(threads))
            )
        # Each call had reached Redis when it returned: the state is final now.
        for n in range(threads):
            assert stored_watermark(redis_server, "jobs", f"t{n}") == str(per_thread - 1).encode()
        assert (
            stored_watermark(redis_server, "jobs", "shared")
            == str(threads * per_thread - 1).encode()
        )
        for name in [*(f"t{n}" for n in range(threads)), "shared"]:
            assert (await done(worker, name))["outcome"] == "COMPLETED"
        # Every message is in Redis's output buffer for the worker; it may not
        # have read the last ones yet when it answers.
        expected = threads * per_thread * 3
        deadline = time.monotonic() + 10
        while (stats := await worker.request("stats"))["received"] < expected:
            assert time.monotonic() < deadline, stats
            await asyncio.sleep(0.05)
        assert stats["received"] == expected
        assert stats["malformed"] == 0
    finally:
        await worker.close()


@one_loop
async def test_the_stored_watermark_is_the_max_of_sync_and_async_advances(
    redis_server: RedisServer, publisher: SyncPublisher
) -> None:
    # Async advances from another process (the worker's RedisTriggers) and sync
    # ones from threads here, on the same keys at the same time: whatever the
    # interleaving, each key's stored watermark is the highest value sent.
    keys = [f"k{n}" for n in range(4)]
    rounds = 60
    worker = Worker(redis_server.url, "jobs")
    try:
        await worker.start()

        def sync_side(key: str) -> None:
            # Odd values, rising then a low one: the low one must not win.
            for i in range(rounds):
                publisher.advance(key, 2 * i + 1)
            publisher.advance(key, 1)

        async def async_side() -> None:
            for i in range(rounds):
                for key in keys:
                    worker.send(cmd="advance", key=encode_key(key), value=2 * i)
            worker.send(cmd="flush")
            await worker.expect("flush", within=20)

        with ThreadPoolExecutor(len(keys)) as pool:
            await asyncio.gather(
                async_side(), *(asyncio.wrap_future(pool.submit(sync_side, k)) for k in keys)
            )
        for key in keys:
            assert stored_watermark(redis_server, "jobs", key) == str(2 * rounds - 1).encode()
        # And a lower async advance afterwards changes nothing either.
        await worker.request("advance", key=encode_key("k0"), value=5)
        await worker.request("flush")
        assert stored_watermark(redis_server, "jobs", "k0") == str(2 * rounds - 1).encode()
        # Floats and ints compare as numbers in the script, as for RedisTriggers.
        publisher.advance("f", 2.5)
        await worker.request("advance", key=encode_key("f"), value=2)
        await worker.request("flush")
        assert stored_watermark(redis_server, "jobs", "f") == b"2.5"
    finally:
        await worker.close()


# -- bad input --------------------------------------------------------------------------


BAD_KEYS: list[Any] = [True, 1.5, ("topic", 0), None, ["k"]]
BAD_VALUES: list[Any] = [True, "3", None, float("nan"), float("inf"), 2**60]


@one_loop
async def test_bad_keys_and_values_are_refused_as_redis_triggers_refuses_them(
    redis_server: RedisServer, publisher: SyncPublisher
) -> None:
    reference = RedisTriggers(None, redis_server.url, channel="jobs")  # never started
    watcher = aioredis.from_url(redis_server.url)
    pubsub = watcher.pubsub()
    await pubsub.subscribe("jobs")
    try:
        for key in BAD_KEYS:
            with pytest.raises(TypeError) as sync_error:
                publisher.advance(key, 1)
            with pytest.raises(TypeError) as async_error:
                reference.advance(key, 1)
            assert str(sync_error.value) == str(async_error.value)
            assert "key must be a str, bytes or int" in str(sync_error.value)
            with pytest.raises(TypeError, match="key must be"):
                publisher.check_and_complete(key)
        for value in BAD_VALUES:
            with pytest.raises((TypeError, ValueError)) as sync_refusal:
                publisher.advance("k", value)
            with pytest.raises((TypeError, ValueError)) as async_refusal:
                reference.advance("k", value)
            assert type(sync_refusal.value) is type(async_refusal.value)
            assert str(sync_refusal.value) == str(async_refusal.value)
            assert "value must" in str(sync_refusal.value)
        # Nothing was stored, and nothing published.
        assert await watcher.keys("*") == []
        assert await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2) is None
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await watcher.aclose()
        await reference.aclose()


def test_bad_construction_arguments(redis_server: RedisServer) -> None:
    url = redis_server.url
    with pytest.raises(TypeError, match="url_or_client must be"):
        SyncPublisher(42)  # type: ignore[arg-type]
    client = aioredis.from_url(url)
    with pytest.raises(TypeError, match="use RedisTriggers in async code"):
        SyncPublisher(client)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="url_or_client: not a usable Redis URL"):
        SyncPublisher("http://example.com")
    with pytest.raises(TypeError, match="channel must be a str"):
        SyncPublisher(url, channel=b"jobs")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="channel must not be empty"):
        SyncPublisher(url, channel="")
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="watermark_ttl must be positive"):
            SyncPublisher(url, watermark_ttl=bad)
        with pytest.raises(ValueError, match="timeout must be positive"):
            SyncPublisher(url, timeout=bad)
    with pytest.raises(TypeError, match="watermark_ttl must be a number"):
        SyncPublisher(url, watermark_ttl=True)
    with pytest.raises(TypeError, match="timeout must be a number"):
        SyncPublisher(url, timeout="5")  # type: ignore[arg-type]


# -- life cycle, failures, credentials --------------------------------------------------


def test_close_and_a_client_passed_in(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url)
    publisher = SyncPublisher(client, channel="jobs")
    publisher.advance("k", 1)  # usable without `with`: connects on the first call
    assert repr(publisher) == (
        f"<SyncPublisher channel='jobs' redis=redis://127.0.0.1:{redis_server.port}/0 open>"
    )
    publisher.close()
    publisher.close()  # idempotent
    assert publisher.closed
    assert "closed>" in repr(publisher)
    with pytest.raises(RedisTriggersClosedError, match="closed"):
        publisher.advance("k", 2)
    with pytest.raises(RedisTriggersClosedError):
        publisher.check_and_complete("k")
    assert client.get(Partitions("jobs", DEFAULT_PARTITIONS).stored_key("k")) == b"1"  # left open
    client.close()

    with SyncPublisher(redis_server.url) as owned:
        owned.check_and_complete("k")
        names = [c["name"] for c in redis.Redis.from_url(redis_server.url).client_list()]
        assert f"aiopurgatory-syncpub-{owned.instance}" in names
    assert owned.closed
    with pytest.raises(RedisTriggersClosedError):
        owned.advance("k", 1)


def test_redis_down_keeps_the_trigger_and_ping_is_a_clear_error_at_once(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url
    redis_server.kill()
    publisher = SyncPublisher(url, timeout=5)
    started = time.monotonic()
    publisher.advance("k", 1)  # kept for delivery: no error for a blip
    assert time.monotonic() - started < 2.0  # a refused port answers at once
    assert publisher.statistics().pending == 1
    for call in (publisher.ping, publisher.__enter__):
        started = time.monotonic()
        with pytest.raises(RedisTriggersError, match="unreachable") as caught:
            call()
        assert time.monotonic() - started < 2.0
        assert f"cannot publish to Redis at {url}" in str(caught.value)
        assert caught.value.__context__ is None
    assert publisher.close(timeout=0.1) == 1  # never delivered: reported


def test_a_hung_redis_holds_one_call_for_the_timeout_then_none(redis_server: RedisServer) -> None:
    publisher = SyncPublisher(redis_server.url, channel="jobs", timeout=0.5)
    publisher.advance("k", 1)  # a connection in the pool
    assert redis_server.process is not None
    os.kill(redis_server.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        publisher.advance("k", 2)  # times out, then kept
        elapsed = time.monotonic() - started
        assert 0.45 < elapsed < 3.0, elapsed  # the timeout, not retried
        started = time.monotonic()
        publisher.advance("k", 3)  # joins what is kept: no wait for Redis
        publisher.check_and_complete("k")
        assert time.monotonic() - started < 0.1
        stats = publisher.statistics()
        assert (stats.sent, stats.kept, stats.pending, stats.outages) == (1, 3, 2, 1)
        assert stats.last_error is not None
        assert "Timeout" in stats.last_error
    finally:
        os.kill(redis_server.process.pid, signal.SIGCONT)
    assert publisher.flush(timeout=10) == 0
    assert stored_watermark(redis_server, "jobs", "k") == b"3"
    assert publisher.close() == 0


def test_a_restarted_redis_is_reconnected_to_without_an_error(
    redis_server: RedisServer,
) -> None:
    with SyncPublisher(redis_server.url, channel="jobs") as publisher:
        publisher.advance("k", 1)  # its connection is pooled
        redis_server.restart()  # the pooled connection is dead now
        publisher.advance("k", 2)  # replaced and sent again: no error
        publisher.check_and_complete("k")
    assert stored_watermark(redis_server, "jobs", "k") == b"2"


def test_no_password_in_errors_or_repr(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    import traceback
    from urllib.parse import quote

    server = redis_server_factory(password=PASSWORD)
    wrong = server.url_for(None, PASSWORD[::-1])
    texts: list[str] = []
    for url in (wrong, server.url_for(None, None)):
        publisher = SyncPublisher(url)
        with pytest.raises(RedisTriggersError, match="authentication failed") as caught:
            publisher.advance("k", 1)
        texts += ["".join(traceback.format_exception(caught.value)), repr(publisher)]
        publisher.close()
    with SyncPublisher(server.url) as publisher:
        publisher.advance("k", 1)
        texts.append(repr(publisher))
        assert ":***@" in repr(publisher)
    client = redis.Redis.from_url(server.url)
    texts.append(repr(SyncPublisher(client)))
    client.close()
    for text in texts:
        for secret in (PASSWORD, PASSWORD[::-1], quote(PASSWORD, safe=""), "s3cr"):
            assert secret not in text, text
