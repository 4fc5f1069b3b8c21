"""A subscription that stops delivering is found and renewed, on a real redis-server."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

import aiopurgatory as ap
from aiopurgatory.redis import DEFAULT_PARTITIONS, RedisTriggers
from aiopurgatory.redis._partitions import Partitions
from aiopurgatory.redis._wire import Batch, encode
from aiopurgatory.redis.testing import RedisServer
from tests.redis.test_redis import eventually

pytestmark = pytest.mark.realtime

HEALTH = 0.2  # seconds: the probes' interval in these tests


async def test_a_deaf_subscription_is_found_by_its_canary_and_renewed(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    # The subscriber's first connection goes to another server (as a client left
    # on a node that no longer gets the publishes, after a failover): it answers
    # PING, and delivers nothing. The canary, published where triggers go, does
    # not come back: the subscription is renewed, on the right server.
    real = redis_server_factory()
    stale = redis_server_factory()
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("deaf")
    sub = RedisTriggers(
        purgatory, real.url, channel="c", health_check_interval=HEALTH, reconnect_delay=(0.05, 0.1)
    )
    assert sub._subscriber is not None
    to_real = sub._subscriber._new_connection
    to_stale = RedisTriggers(None, stale.url)._connections.factory("sub")
    made: list[str] = []

    def first_stale() -> Any:
        made.append("stale" if not made else "real")
        return to_stale() if len(made) == 1 else to_real()

    sub._subscriber._new_connection = first_stale
    async with sub, RedisTriggers(None, real.url, channel="c") as pub:
        op = ap.WatermarkOperation(30)
        waiting = asyncio.ensure_future(sub.watch(op, {"k": 1}))
        # Subscribed (on the stale server) and caught up (from the real one)
        # before the advance: only the renewed subscription can bring it.
        subscriber = sub._subscriber
        await eventually(lambda: subscriber.covers(["k"]) and sub._reader.idle)
        loop = asyncio.get_running_loop()
        started = loop.time()
        pub.advance("k", 1)
        await pub.flush()
        # Found within two intervals (a silent one, then the probe's), renewed, resynced.
        assert await asyncio.wait_for(waiting, 5) is ap.Outcome.COMPLETED
        elapsed = loop.time() - started
        stats = sub.statistics()
        assert stats.deaf_detected == 1
        assert stats.reconnects == 1
        assert "canary" in (stats.last_error or "")
        assert elapsed < 2 * HEALTH + 1.0, elapsed
        assert made == ["stale", "real"]
        # On the right server now: the canaries come back, nothing more is renewed.
        await asyncio.sleep(5 * HEALTH)
        assert sub.statistics().deaf_detected == 1
        assert sub.connected


async def test_an_idle_subscription_that_delivers_is_left_alone(
    redis_server: RedisServer,
) -> None:
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("idle")
    async with RedisTriggers(purgatory, redis_server.url, health_check_interval=HEALTH) as sub:
        await asyncio.sleep(10 * HEALTH)  # canaries only: no traffic
        stats = sub.statistics()
        assert (stats.deaf_detected, stats.reconnects, stats.received) == (0, 0, 0)
        assert stats.connected


async def test_client_kill_type_pubsub_heals_and_completes_what_was_advanced_meanwhile(
    redis_server: RedisServer, redis_client: aioredis.Redis
) -> None:
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("killed")
    async with (
        RedisTriggers(purgatory, redis_server.url, reconnect_delay=(0.2, 0.3)) as sub,
        RedisTriggers(None, redis_server.url) as pub,
    ):
        ops = [ap.WatermarkOperation(30) for _ in range(20)]
        waiting = [asyncio.ensure_future(sub.watch(op, {i: 1})) for i, op in enumerate(ops)]
        await eventually(lambda: sub._subscriber is not None and sub._subscriber.covers(range(20)))
        assert await redis_client.client_kill_filter(_type="pubsub") == 1
        await eventually(lambda: not sub.connected)
        for i in range(20):
            pub.advance(i, 1)  # while the subscriber is away
        await pub.flush()
        outcomes = await asyncio.wait_for(asyncio.gather(*waiting), 5)
        assert outcomes == [ap.Outcome.COMPLETED] * 20
        stats = sub.statistics()
        assert stats.reconnects == 1
        assert stats.subscribed == len({sub._partitions.of(i) for i in range(20)})


async def test_a_subscriber_killed_by_the_output_buffer_limit_heals(
    redis_server: RedisServer, redis_client: aioredis.Redis
) -> None:
    # Redis closes a pub/sub client whose unread output passes the limit (a slow
    # consumer). Here the subscriber's loop is blocked while a burst arrives.
    await redis_client.config_set("client-output-buffer-limit", "pubsub 256kb 0 0")
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("slow")
    partitions = Partitions("aiopurgatory", DEFAULT_PARTITIONS)
    async with (
        RedisTriggers(purgatory, redis_server.url, reconnect_delay=(0.05, 0.1)) as sub,
        RedisTriggers(None, redis_server.url) as pub,
    ):
        op = ap.WatermarkOperation(30)
        waiting = asyncio.ensure_future(sub.watch(op, {"k": 1}))
        await eventually(lambda: sub._subscriber is not None and sub._subscriber.covers(["k"]))
        batch = Batch()
        for i in range(500):
            batch.check(f"filler-{i:06d}-" + "x" * 40)
        burst = encode("someone-else", batch)  # ~30 kB, on "k"'s partition channel
        channel = partitions.channel("k")

        def flood() -> None:
            client = redis.Redis.from_url(redis_server.url)
            try:
                for _ in range(200):  # ~6 MB
                    client.publish(channel, burst)
            finally:
                client.close()

        flooding = threading.Thread(target=flood)
        flooding.start()
        time.sleep(1.5)  # noqa: ASYNC251  # the subscriber's loop does not read meanwhile
        flooding.join()
        await eventually(lambda: sub.statistics().connection_errors >= 1)
        pub.advance("k", 1)  # maybe while it reconnects: the resync reads it
        assert await asyncio.wait_for(waiting, 5) is ap.Outcome.COMPLETED
        await eventually(lambda: sub.connected)
        assert sub.statistics().reconnects >= 1
        log = redis_server.log_path.read_text(errors="replace")
        assert "output buffer limits" in log
