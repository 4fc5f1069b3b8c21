"""aiopurgatory.redis against a real redis-server: triggers and watermarks across processes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

import aiopurgatory as ap
from aiopurgatory.redis import RedisTriggers, RedisTriggersClosedError
from aiopurgatory.redis._wire import watermark_prefix
from aiopurgatory.redis.testing import RedisServer
from tests.redis_helpers import Worker, encode_key

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
            await asyncio.sleep(0)
            ready = True
            await worker.request("check", key=encode_key(7))
            assert await asyncio.wait_for(waiting, 5) is ap.Outcome.COMPLETED
            stats = triggers.statistics()
            assert stats.received == 1
            assert stats.applied == 1
            assert stats.completed == 1
            assert stats.echoes == 2  # our own two messages came back and were skipped
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
        triggers.check_and_complete("k")
        assert op.checks == 2
        await triggers.flush()
        await eventually(lambda: triggers.statistics().echoes == 1)
        assert op.checks == 2
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


async def test_one_loop_iteration_is_one_publish(
    redis_server: RedisServer, redis_client: aioredis.Redis
) -> None:
    listener = redis_client.pubsub()
    await listener.subscribe("c")
    confirmation = await listener.get_message(timeout=5)
    assert confirmation is not None
    assert confirmation["type"] == "subscribe"
    async with RedisTriggers(None, redis_server.url, channel="c") as triggers:
        for i in range(100):
            triggers.advance("a", i)  # only the highest, 99, is sent
            triggers.advance(b"b", 100 - i)  # 100
            triggers.check_and_complete(i % 7)  # 0..6 once each
        await triggers.flush()
        assert triggers.statistics().published == 1
        message = await listener.get_message(timeout=5)
        assert message is not None
        sender, checks, advances = json.loads(message["data"])[1:]
        assert sender == triggers.instance
        assert checks == list(range(7))
        assert advances == ["a", 99, {"b": "b"}, 100]
        assert await listener.get_message(timeout=0.2) is None
        prefix = watermark_prefix("c")
        assert await redis_client.mget([prefix + b"sa", prefix + b"bb"]) == [b"99", b"100"]
        ttl = await redis_client.pttl(prefix + b"sa")
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
        assert len(await client_names(redis_client)) == 2  # the subscriber and a command
        triggers.advance("k", 5)  # pending at close: sent by aclose
    assert await redis_client.get(watermark_prefix("c") + b"sk") == b"5"
    assert set(asyncio.all_tasks()) == before
    await eventually(lambda: True)
    assert await subscribers(redis_client, "c") == 0
    assert await client_names(redis_client) == []
    assert not triggers.connected
    with pytest.raises(RedisTriggersClosedError, match="closed"):
        triggers.advance("k", 6)
    await triggers.aclose()  # idempotent
    assert purgatory.closed is False  # the purgatory is the caller's
