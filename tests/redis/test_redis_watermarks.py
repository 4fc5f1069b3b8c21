"""Watermarks across processes: thresholds, stored watermarks and their resync."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

import aiopurgatory as ap
from aiopurgatory.redis import RedisTriggers
from aiopurgatory.redis.testing import RedisServer
from tests.redis.test_redis import eventually, gate_reconnects, routed, subscribers
from tests.support.redis import Worker, encode_key

pytestmark = pytest.mark.realtime


@pytest.mark.parametrize("worker_loop", ["asyncio", "uvloop"])
async def test_thresholds_across_two_processes(redis_server: RedisServer, worker_loop: str) -> None:
    worker = Worker(redis_server.url, "c", loop=worker_loop)
    try:
        await worker.start()
        purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("here")
        async with RedisTriggers(purgatory, redis_server.url, channel="c") as triggers:
            # There: waits for "t" >= 5 (its try_complete reads the watermark).
            await worker.request("watch", id="a", thresholds=[[encode_key("t"), 5]])
            assert triggers.advance("t", 3) == 0
            await triggers.flush()
            assert triggers.advance("t", 5) == 0  # nobody waits here
            assert (await worker.expect("done", id="a"))["outcome"] == "COMPLETED"
            # Here: waits for b"x" >= 2 and for 7 >= 1.5; the worker advances them.
            x = ap.WatermarkOperation(30)
            seven = ap.WatermarkOperation(30)
            waiting = [
                asyncio.ensure_future(purgatory.watch(x, {b"x": 2})),
                asyncio.ensure_future(purgatory.watch(seven, {7: 1.5})),
            ]
            await routed(triggers, b"x", 7)  # watched directly: found by the sweep
            await worker.request("advance", key=encode_key(b"x"), value=1)
            await worker.request("advance", key=encode_key("7"), value=2)  # a str: not 7
            await worker.request("flush")
            await asyncio.sleep(0.2)
            assert not x.done()
            assert not seven.done()
            assert purgatory.watermark(b"x") == 1
            assert purgatory.watermark(7) is None
            await worker.request("advance", key=encode_key(b"x"), value=2)
            await worker.request("advance", key=encode_key(7), value=1.5)
            assert await asyncio.wait_for(asyncio.gather(*waiting), 5) == [
                ap.Outcome.COMPLETED,
                ap.Outcome.COMPLETED,
            ]
            assert purgatory.watermark(b"x") is None  # no watchers left: not kept
            assert await triggers.fetch_watermark(b"x") == 2  # but stored in Redis
            assert await triggers.fetch_watermark("t") == 5
    finally:
        assert await worker.close() == 0


async def test_a_threshold_reached_during_a_gap_completes_at_the_resync(
    redis_server: RedisServer, redis_client: aioredis.Redis
) -> None:
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("here")
    url = redis_server.url
    async with (
        RedisTriggers(purgatory, url, channel="c", reconnect_delay=(0.05, 0.1)) as sub,
        RedisTriggers(None, url, channel="c", reconnect_delay=(0.05, 0.05)) as pub,
    ):
        gate = gate_reconnects(sub)
        op = ap.WatermarkOperation(30)
        waiting = asyncio.ensure_future(purgatory.watch(op, {"offsets": 100}))
        await asyncio.sleep(0)
        assert "offsets" in list(purgatory.keys())
        redis_server.kill()
        await eventually(lambda: not sub.connected)
        redis_server.start()
        pub.advance("offsets", 100)
        await asyncio.wait_for(pub.flush(), 5)
        assert await subscribers(redis_client, "c") == 0  # the subscriber missed it
        await asyncio.sleep(0.1)
        assert not op.done()
        gate.set()
        assert await asyncio.wait_for(waiting, 10) is ap.Outcome.COMPLETED
        assert sub.statistics().reconnects == 1


async def test_watch_catches_up_with_an_advance_made_before_it(redis_server: RedisServer) -> None:
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("here")
    async with (
        RedisTriggers(purgatory, redis_server.url) as sub,
        RedisTriggers(None, redis_server.url) as pub,
    ):
        pub.advance("topic", 10)
        await pub.flush()
        # Nobody watched "topic" here when the advance came: it was not even
        # received (its partition is not subscribed), and nothing was kept.
        assert sub.statistics().received == 0
        assert purgatory.watermark("topic") is None
        # Watched on the purgatory directly: the next sweep of the watched keys
        # subscribes its partition and reads the stored watermark.
        plain = ap.WatermarkOperation(5)
        assert await purgatory.watch(plain, {"topic": 5}) is ap.Outcome.COMPLETED
        # RedisTriggers.watch reads the stored watermark after watching, at once.
        caught_up = ap.WatermarkOperation(30)
        assert await sub.watch(caught_up, {"topic": 5}) is ap.Outcome.COMPLETED
        # Not reached yet: waits, and a later advance completes it.
        later = ap.WatermarkOperation(30)
        waiting = asyncio.ensure_future(sub.watch(later, {"topic": 11}))
        await asyncio.sleep(0.1)
        assert not later.done()
        pub.advance("topic", 11)
        assert await asyncio.wait_for(waiting, 5) is ap.Outcome.COMPLETED
        # Cancelling the awaiting task cancels the op, as Purgatory.watch does.
        cancelled = ap.WatermarkOperation(30)
        waiting = asyncio.ensure_future(sub.watch(cancelled, {"topic": 99}))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert cancelled.cancelled()
        assert purgatory.keys() == []


async def test_a_killed_subscription_resyncs_thousands_of_keys(
    redis_server: RedisServer, redis_client: aioredis.Redis
) -> None:
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("here")
    url = redis_server.url
    n = 2_500  # three MGETs at the resync, three messages from the publisher
    async with (
        RedisTriggers(purgatory, url, channel="c", reconnect_delay=(0.05, 0.1)) as sub,
        RedisTriggers(None, url, channel="c") as pub,
    ):
        gate = gate_reconnects(sub)
        ops = [ap.WatermarkOperation(60) for _ in range(n)]
        for i, op in enumerate(ops):
            assert not purgatory.try_complete_else_watch(op, {i: 1})
        # Redis drops the subscriber's connection (as an output-buffer limit would).
        killed = await redis_client.client_kill_filter(_type="pubsub")
        assert killed == 1
        await eventually(lambda: not sub.connected)
        for i in range(n):
            pub.advance(i, 1)
        await pub.flush()
        # One message per partition of the keys.
        of = sub._partitions.of
        assert pub.statistics().published == len({of(i) for i in range(n)})
        assert await subscribers(redis_client, "c") == 0
        assert not any(op.done() for op in ops)
        gate.set()
        await eventually(lambda: all(op.done() for op in ops), within=10)
        assert all(op.outcome is ap.Outcome.COMPLETED for op in ops)
        stats = sub.statistics()
        assert (stats.reconnects, stats.resyncs, stats.received) == (1, 2, 0)
        assert stats.completed == n
        assert purgatory.keys() == []
