"""Reads of stored watermarks that cannot be starved, poisoned or hung (issue 38).

Against a real redis-server: many concurrent ``triggers.watch()`` on a URL (the
default client), Redis SIGKILLed and restarted, Redis SIGSTOPped.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

import aiopurgatory as ap
from aiopurgatory.redis import RedisTriggers, RedisTriggersClosedError, RedisTriggersError
from aiopurgatory.redis.testing import RedisServer
from tests.redis.test_redis import client_names, eventually

pytestmark = pytest.mark.realtime

N = 1_000


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level("DEBUG", logger="aiopurgatory")
    return caplog


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().split(" ")[0] == name]


@pytest_asyncio.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What reaches the loop's exception handler ("Task exception was never retrieved"...)."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    yield seen
    gc.collect()  # a task or future collected with an error unseen reports it now
    loop.set_exception_handler(previous)


async def advanced_elsewhere(url: str, sub: RedisTriggers, keys: list[str]) -> None:
    """Advance ``keys`` to 1 from another instance; ``sub`` receives it and keeps nothing."""
    received = sub.statistics().received
    async with RedisTriggers(None, url, channel=sub.channel) as pub:
        for key in keys:
            pub.advance(key, 1)
        await pub.flush()
    # Nothing here watches them: their partitions are not subscribed (no message
    # reaches this process), their watermarks are stored in Redis.
    assert sub.statistics().received == received
    purgatory = sub.purgatory
    assert purgatory is not None
    assert purgatory.watermark(keys[0]) is None  # nobody watched: not kept here


async def watch_all(sub: RedisTriggers, keys: list[str], op_timeout: float) -> list[ap.Outcome]:
    """Watch one op per key (threshold 1) at once; their outcomes."""
    ops = [ap.WatermarkOperation(op_timeout) for _ in keys]
    return await asyncio.gather(
        *(sub.watch(op, {key: 1}) for op, key in zip(ops, keys, strict=True))
    )


async def test_a_thousand_watches_on_keys_advanced_just_before_complete_at_once(
    redis_server: RedisServer, redis_client: aioredis.Redis
) -> None:
    keys = [f"job-{i}" for i in range(N)]
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("here")
    async with RedisTriggers(purgatory, redis_server.url) as sub:
        await advanced_elsewhere(redis_server.url, sub, keys)
        loop = asyncio.get_running_loop()
        started = loop.time()
        outcomes = await watch_all(sub, keys, op_timeout=10)
        elapsed = loop.time() - started
        assert outcomes == [ap.Outcome.COMPLETED] * N
        assert elapsed < 1.0, f"{N} watches took {elapsed:.2f} s"
        stats = sub.statistics()
        # Coalesced: the watches of a loop iteration share one read (far fewer than N).
        assert 1 <= stats.reads <= 10
        assert stats.read_errors == 0
        # Bounded: the instance's own connections, however many watches.
        mine = [name for name in await client_names(redis_client) if sub.instance in name]
        assert sorted(name.split("-")[1] for name in mine) == ["pub", "read", "sub"]


async def test_a_thousand_watches_right_after_redis_was_killed_and_restarted(
    redis_server: RedisServer, logs: pytest.LogCaptureFixture
) -> None:
    keys = [f"job-{i}" for i in range(N)]
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("here")
    url = redis_server.url
    async with (
        RedisTriggers(purgatory, url, reconnect_delay=(0.5, 1.0)) as sub,
        RedisTriggers(None, url) as pub,
    ):
        await advanced_elsewhere(url, sub, keys)
        # Every connection is used once, so that each dies with Redis.
        assert await sub.fetch_watermark(keys[0]) == 1
        pub.advance("other", 1)
        await pub.flush()

        redis_server.kill()
        redis_server.start()  # the append-only file kept the watermarks
        loop = asyncio.get_running_loop()
        started = loop.time()
        outcomes = await watch_all(sub, keys, op_timeout=10)
        elapsed = loop.time() - started
        assert outcomes == [ap.Outcome.COMPLETED] * N
        # A watch subscribes its keys' partitions before it reads (interest routing),
        # so the subscriber's reconnect delay (0.5 s here) is on this path: about
        # 0.5 s alone, up to 1.2 s seen on a loaded 2-core machine. A watch that
        # waited for a failed read's retry (backoff) or a round trip per watch would
        # take far longer.
        assert elapsed < 2.0, f"{N} watches took {elapsed:.2f} s"
        # The dead connections were replaced, not failed on: no read, publish or
        # fetch fails after Redis is back.
        assert await sub.fetch_watermark(keys[-1]) == 1
        pub.advance("other", 2)
        await asyncio.wait_for(pub.flush(), 5)
        assert await pub.fetch_watermark("other") == 2
        assert sub.statistics().read_errors == 0
        assert (pub.statistics().publish_errors, pub.statistics().read_errors) == (0, 0)
        await eventually(lambda: sub.connected, within=10)
    assert events(logs, "aiopurgatory.redis.read_failed") == []


async def test_a_hung_redis_never_holds_a_watch_past_its_timeout(
    redis_server: RedisServer,
    logs: pytest.LogCaptureFixture,
    loop_errors: list[dict[str, Any]],
) -> None:
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("here")
    url = redis_server.url
    async with RedisTriggers(
        purgatory, url, command_timeout=0.3, reconnect_delay=(0.05, 0.2)
    ) as sub:
        await advanced_elsewhere(url, sub, ["stored"])
        loop = asyncio.get_running_loop()
        redis_server.pause()
        try:
            # One watch alone, then many at once: each returns at its own timeout.
            started = loop.time()
            assert await sub.watch(ap.WatermarkOperation(0.5), {"k": 1}) is ap.Outcome.EXPIRED
            assert loop.time() - started < 0.5 + 0.2
            started = loop.time()
            outcomes = await watch_all(sub, [f"k{i}" for i in range(100)], op_timeout=0.5)
            assert outcomes == [ap.Outcome.EXPIRED] * 100
            assert loop.time() - started < 0.5 + 0.2
            # A fetch is one attempt, bounded by command_timeout.
            started = loop.time()
            with pytest.raises(RedisTriggersError, match="cannot read the watermark"):
                await sub.fetch_watermark("stored")
            assert loop.time() - started < 2 * 0.3 + 0.5  # behind a read in flight at most
            # A watch on a stored watermark: its partition's SUBSCRIBE, then its
            # read, wait for Redis...
            healed = asyncio.ensure_future(sub.watch(ap.WatermarkOperation(10), {"stored": 1}))
            await asyncio.sleep(1.0)
            assert not healed.done()
        finally:
            redis_server.resume()
        # ... and completes once Redis answers again.
        assert await asyncio.wait_for(healed, 5) is ap.Outcome.COMPLETED
        stats = sub.statistics()
        assert stats.last_error is not None
        assert "within 0.3 s" in stats.last_error
    # Counted every time, logged once for the outage, and once for its end.
    assert len(events(logs, "aiopurgatory.redis.read_failed")) == 1
    assert len(events(logs, "aiopurgatory.redis.read_resumed")) == 1
    assert loop_errors == []


async def test_closing_while_redis_hangs_ends_every_call(
    redis_server: RedisServer, loop_errors: list[dict[str, Any]]
) -> None:
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("here")
    triggers = RedisTriggers(purgatory, redis_server.url, close_timeout=0.5)
    await triggers.__aenter__()
    redis_server.pause()
    try:
        op = ap.WatermarkOperation(30)
        watching = asyncio.ensure_future(triggers.watch(op, {"k": 1}))
        fetching = asyncio.ensure_future(triggers.fetch_watermark("k"))  # read in flight
        await asyncio.sleep(0.05)
        triggers.advance("k", 1)  # completes op here; its send hangs
        assert await watching is ap.Outcome.COMPLETED
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await triggers.aclose()
        assert loop.time() - started < 0.5 + 1.0
        with pytest.raises(RedisTriggersClosedError):
            await fetching
        assert [t for t in asyncio.all_tasks() if "aiopurgatory-redis" in t.get_name()] == []
    finally:
        redis_server.resume()
    assert loop_errors == []


async def test_a_killed_connection_is_replaced_without_an_error(
    redis_server: RedisServer, redis_client: aioredis.Redis
) -> None:
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("here")
    async with RedisTriggers(purgatory, redis_server.url) as sub:
        await advanced_elsewhere(redis_server.url, sub, ["a", "b"])
        assert await sub.watch(ap.WatermarkOperation(10), {"a": 1}) is ap.Outcome.COMPLETED
        sub.advance("c", 1)
        await sub.flush()
        # Redis ends the reader's and the sender's connections (an idle timeout,
        # CLIENT KILL): the next read and publish open new ones.
        killed = await redis_client.client_kill_filter(_type="normal", skipme=True)
        assert killed >= 2
        assert await sub.watch(ap.WatermarkOperation(10), {"b": 1}) is ap.Outcome.COMPLETED
        sub.advance("c", 2)
        await asyncio.wait_for(sub.flush(), 5)
        assert await sub.fetch_watermark("c") == 2
        stats = sub.statistics()
        assert (stats.read_errors, stats.publish_errors) == (0, 0)


@pytest.mark.parametrize(
    "keys",
    [
        {("topic", 0): 5},  # the README's key shape, as a threshold
        [("topic", 0)],
        ["fine", ("topic", 0)],
        [True],
        {1.5: 1},
    ],
)
async def test_watch_refuses_keys_that_cannot_cross_the_wire(
    redis_server: RedisServer, keys: Any
) -> None:
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("here")
    async with RedisTriggers(purgatory, redis_server.url) as triggers:
        bad = next(key for key in keys if not isinstance(key, str))
        with pytest.raises(TypeError) as refused_by_advance:
            triggers.advance(bad, 1)
        op = ap.WatermarkOperation(10)
        with pytest.raises(TypeError) as refused:
            await triggers.watch(op, keys)
        assert str(refused.value) == str(refused_by_advance.value)
        # Before anything was watched: the op is untouched and can still be watched.
        assert purgatory.keys() == []
        assert purgatory.pending == 0
        assert not op.done()
        assert triggers.statistics().reads == 0  # nothing to read at the start
        waiting = asyncio.ensure_future(triggers.watch(op, {"fine": 1}))
        await asyncio.sleep(0.05)
        triggers.advance("fine", 1)
        assert await asyncio.wait_for(waiting, 5) is ap.Outcome.COMPLETED
