"""RedisTriggers on a Sentinel-managed primary (a primary, a replica, 3 sentinels; real servers)."""

from __future__ import annotations

import asyncio
import secrets

import pytest
from redis.asyncio.sentinel import Sentinel

import aiopurgatory as ap
from aiopurgatory.redis import RedisTriggers, SyncPublisher
from tests.redis.test_redis import eventually
from tests.support.redis import Worker, encode_key
from tests.support.redis_cluster import SentinelServers, redis_sentinel  # noqa: F401

pytestmark = pytest.mark.realtime


async def test_ops_parked_in_one_process_complete_on_advances_from_another(
    redis_sentinel: SentinelServers,  # noqa: F811
) -> None:
    url = redis_sentinel.url
    channel = f"s-{secrets.token_hex(4)}"  # the set-up is the module's: a fresh channel
    worker = Worker(url, channel)
    try:
        await worker.start()
        async with RedisTriggers(None, url, channel=channel) as pub:
            assert "redis=redis+sentinel://" in repr(pub)
            for i in range(5):
                await worker.request("watch", id=f"w{i}", thresholds=[[encode_key(i), 3]])
            for i in range(5):
                pub.advance(i, 3)
            for i in range(5):
                assert (await worker.expect("done", id=f"w{i}"))["outcome"] == "COMPLETED"
        stats = await worker.request("stats")
        assert stats["received"] == 5
    finally:
        assert await worker.close() == 0


async def test_a_sentinel_managed_client_is_taken_too(
    redis_sentinel: SentinelServers,  # noqa: F811
) -> None:
    sentinel = Sentinel(redis_sentinel.sentinel_addresses)  # type: ignore[no-untyped-call]
    client = sentinel.master_for(redis_sentinel.service)
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("managed")
    channel = f"m-{secrets.token_hex(4)}"
    try:
        async with (
            RedisTriggers(purgatory, client, channel=channel) as sub,
            RedisTriggers(None, client, channel=channel) as pub,
        ):
            assert "redis+sentinel://" in repr(sub)
            waiting = asyncio.ensure_future(sub.watch(ap.WatermarkOperation(10), {"k": 2}))
            await eventually(lambda: sub.statistics().subscribed == 1)
            pub.advance("k", 2)
            assert await asyncio.wait_for(waiting, 5) is ap.Outcome.COMPLETED
            assert await pub.fetch_watermark("k") == 2
    finally:
        await client.aclose()
        for connection in sentinel.sentinels:
            await connection.aclose()


async def test_the_primary_killed_mid_traffic_strands_nothing(
    redis_sentinel: SentinelServers,  # noqa: F811
) -> None:
    # Ops parked on 50 keys; a publisher advances every key again and again while
    # the primary is killed and a replica promoted. Every op completes once its
    # key passes its threshold after the failover: nothing waits for an advance
    # that was lost with the old primary (replication is asynchronous) past the
    # next one, and nothing waits past its timeout.
    url = redis_sentinel.url
    keys = [f"k{i}" for i in range(50)]
    final = 1_000_000
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("failover")
    channel = f"f-{secrets.token_hex(4)}"
    options = {"reconnect_delay": (0.05, 0.5), "health_check_interval": 0.5}
    try:
        async with (
            RedisTriggers(purgatory, url, channel=channel, **options) as sub,  # type: ignore[arg-type]
            RedisTriggers(None, url, channel=channel, **options) as pub,  # type: ignore[arg-type]
        ):
            ops = [ap.WatermarkOperation(60) for _ in keys]
            waiting = [
                asyncio.ensure_future(sub.watch(op, {key: final}))
                for op, key in zip(ops, keys, strict=True)
            ]
            stop = asyncio.Event()

            async def traffic() -> None:
                value = 0
                while not stop.is_set():
                    value += 1
                    for key in keys:
                        pub.advance(key, value)
                    await asyncio.sleep(0.01)

            publishing = asyncio.ensure_future(traffic())
            await asyncio.sleep(0.3)
            old, new = await asyncio.to_thread(redis_sentinel.kill_primary)
            assert old != new
            await asyncio.sleep(0.5)
            stop.set()
            await publishing
            loop = asyncio.get_running_loop()
            started = loop.time()
            for key in keys:
                pub.advance(key, final)
            outcomes = await asyncio.wait_for(asyncio.gather(*waiting), 20)
            assert outcomes == [ap.Outcome.COMPLETED] * len(keys)
            assert loop.time() - started < 10
            stats = sub.statistics()
            assert stats.reconnects >= 1
            assert stats.connected
            assert await pub.fetch_watermark(keys[0]) == final
    finally:
        await asyncio.to_thread(redis_sentinel.heal)


async def test_a_sync_publisher_follows_the_primary_through_a_failover(
    redis_sentinel: SentinelServers,  # noqa: F811
) -> None:
    url = redis_sentinel.url
    channel = f"s-{secrets.token_hex(4)}"
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("sync-sentinel")
    options = {"reconnect_delay": (0.05, 0.5), "health_check_interval": 0.5}
    publisher = SyncPublisher(url, channel=channel, timeout=2.0)
    try:
        assert "redis+sentinel://" in repr(publisher)
        async with RedisTriggers(purgatory, url, channel=channel, **options) as sub:  # type: ignore[arg-type]
            first = asyncio.ensure_future(sub.watch(ap.WatermarkOperation(30), {"k": 1}))
            await eventually(lambda: sub.statistics().subscribed == 1)
            await asyncio.to_thread(publisher.advance, "k", 1)
            assert await asyncio.wait_for(first, 10) is ap.Outcome.COMPLETED
            old, new = await asyncio.to_thread(redis_sentinel.kill_primary)
            assert old != new
            # The next call finds its connection dead, asks a sentinel, and lands
            # on the promoted replica.
            second = asyncio.ensure_future(sub.watch(ap.WatermarkOperation(30), {"k": 2}))
            await asyncio.to_thread(publisher.advance, "k", 2)
            assert await asyncio.wait_for(second, 20) is ap.Outcome.COMPLETED
            assert await sub.fetch_watermark("k") == 2
    finally:
        publisher.close()
        await asyncio.to_thread(redis_sentinel.heal)


def test_a_bad_sentinel_url_is_refused_without_its_password() -> None:
    with pytest.raises(ValueError, match="service") as caught:
        SyncPublisher("redis+sentinel://:s3cret@127.0.0.1:1")
    assert "s3cret" not in str(caught.value)
