"""Interest routing against a real redis-server: a process gets the triggers of its keys only."""

from __future__ import annotations

import asyncio
import enum
from typing import Any

import pytest
import redis.asyncio as aioredis

import aiopurgatory as ap
from aiopurgatory.redis import DEFAULT_PARTITIONS, RedisTriggers, SyncPublisher
from aiopurgatory.redis._partitions import SLOTS, Partitions, key_slot, partition_of
from aiopurgatory.redis._publisher import BATCH_SCRIPT, MAX_MESSAGE_TRIGGERS, batch_command
from aiopurgatory.redis._wire import Batch, Key, PublishMode, decode, parse_stored
from aiopurgatory.redis.testing import RedisServer
from tests.redis.test_redis import Flagged, eventually

pytestmark = pytest.mark.realtime

KEYS = [f"key-{i}" for i in range(10_000)]


async def numsub(client: aioredis.Redis, channel: bytes) -> int:
    reply = await client.pubsub_numsub(channel)
    return int(reply[0][1])


# -- the partitions (sans-IO) -------------------------------------------------------------


def test_a_key_has_one_partition_whoever_computes_it() -> None:
    partitions = Partitions("c", DEFAULT_PARTITIONS)
    # Its type is part of the key, as in a purgatory.
    assert len({partitions.channel(key) for key in ("1", 1, b"1")}) <= 3
    for key in ("a", b"a", 7, "ünï"):
        n = partition_of(key, DEFAULT_PARTITIONS)
        assert partitions.of(key) == n
        assert partitions.channel(key) == partitions.channels[n]
        # The channel and the stored watermark share a slot (one script, no CROSSSLOT).
        assert key_slot(partitions.channel(key)) == key_slot(partitions.stored_key(key))


@pytest.mark.parametrize("count", [1, 3, 1024, DEFAULT_PARTITIONS])
def test_partitions_spread_evenly_over_the_slots(count: int) -> None:
    slots = [key_slot(channel) for channel in Partitions("c", count).channels]
    # Partition n lies in the n-th of `count` equal runs of slots: any split of the
    # slot range into masters' runs gets its share, within one partition per run.
    assert [slot * count // SLOTS for slot in slots] == list(range(count))
    thirds = [sum(1 for s in slots if s * 3 // SLOTS == third) for third in range(3)]
    assert max(thirds) - min(thirds) <= 1


def test_keys_spread_evenly_over_the_partitions() -> None:
    counts = [0] * 64
    for key in KEYS:
        counts[partition_of(key, 64)] += 1
    assert max(counts) < 1.3 * len(KEYS) / 64
    assert min(counts) > 0.7 * len(KEYS) / 64


@pytest.mark.parametrize(
    ("value", "error"),
    [(0, ValueError), (SLOTS + 1, ValueError), (True, TypeError), (2.0, TypeError)],
)
def test_a_bad_partition_count_is_refused(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="partitions"):
        RedisTriggers(None, "redis://127.0.0.1:1", partitions=value)
    with pytest.raises(error, match="partitions"):
        SyncPublisher("redis://127.0.0.1:1", partitions=value)


@pytest.mark.parametrize("argument", ["linger", "sweep_interval"])
def test_bad_durations_are_refused(argument: str) -> None:
    options: dict[str, Any] = {argument: 0}
    with pytest.raises(ValueError, match=argument):
        RedisTriggers(None, "redis://127.0.0.1:1", **options)


# -- a real server --------------------------------------------------------------------------


async def test_an_instance_watching_nothing_receives_nothing(
    redis_server: RedisServer,
) -> None:
    purgatory: ap.Purgatory[Any] = ap.Purgatory("idle")
    async with (
        RedisTriggers(purgatory, redis_server.url, channel="c") as idle,
        RedisTriggers(None, redis_server.url, channel="c") as pub,
    ):
        for key in KEYS:
            pub.advance(key, 1)
        for key in KEYS[:100]:
            pub.check_and_complete(key)
        await pub.flush()
        assert pub.statistics().published > 5000  # one message per partition
        await asyncio.sleep(0.3)  # what would have come has come
        stats = idle.statistics()
        assert (stats.received, stats.applied, stats.malformed, stats.echoes) == (0, 0, 0, 0)
        assert stats.subscribed == 0
        assert stats.connected


async def test_an_instance_watching_100_keys_applies_at_most_ten_times_its_own(
    redis_server: RedisServer,
) -> None:
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("some")
    mine = KEYS[::100]  # 100 keys
    async with (
        RedisTriggers(purgatory, redis_server.url, channel="c") as sub,
        RedisTriggers(None, redis_server.url, channel="c") as pub,
    ):
        ops = [ap.WatermarkOperation(30) for _ in mine]
        waiting = [
            asyncio.ensure_future(sub.watch(op, {key: 1}))
            for op, key in zip(ops, mine, strict=True)
        ]
        expected = len({partition_of(key, DEFAULT_PARTITIONS) for key in mine})
        await eventually(lambda: sub.statistics().subscribed == expected)
        for key in KEYS:
            pub.advance(key, 1)
        await pub.flush()
        outcomes = await asyncio.wait_for(asyncio.gather(*waiting), 10)
        assert outcomes == [ap.Outcome.COMPLETED] * len(mine)
        await asyncio.sleep(0.2)
        stats = sub.statistics()
        # Subscribed before the advances: each of its own came through the channel.
        assert len(mine) <= stats.applied <= 10 * len(mine), stats
        assert stats.completed == len(mine)


async def test_a_trigger_published_before_the_subscription_is_confirmed_is_not_lost(
    redis_server: RedisServer,
) -> None:
    # A check (not state in Redis) published right after the watch, while the
    # key's partition is still being subscribed: the check after the
    # subscription's confirmation makes it good. Many keys, to hit every moment.
    purgatory: ap.Purgatory[Flagged] = ap.Purgatory("race")
    ready: set[int] = set()
    async with (
        RedisTriggers(purgatory, redis_server.url, channel="c") as sub,
        RedisTriggers(None, redis_server.url, channel="c") as pub,
    ):
        waiting = []
        for i in range(200):
            op = Flagged(10, lambda i=i: i in ready)  # type: ignore[misc]
            waiting.append(asyncio.ensure_future(sub.watch(op, [i])))
            await asyncio.sleep(0)
            ready.add(i)
            pub.check_and_complete(i)
            if i % 20 == 0:
                await asyncio.sleep(0.001)
        outcomes = await asyncio.wait_for(asyncio.gather(*waiting), 10)
        assert outcomes == [ap.Outcome.COMPLETED] * 200


async def test_a_key_watched_on_the_purgatory_directly_is_routed_by_the_sweep(
    redis_server: RedisServer,
) -> None:
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("direct")
    async with (
        RedisTriggers(purgatory, redis_server.url, channel="c", sweep_interval=0.05) as sub,
        RedisTriggers(None, redis_server.url, channel="c") as pub,
    ):
        pub.advance("early", 1)  # before anyone watches: stored only
        await pub.flush()
        early = asyncio.ensure_future(purgatory.watch(ap.WatermarkOperation(10), {"early": 1}))
        late = asyncio.ensure_future(purgatory.watch(ap.WatermarkOperation(10), {"late": 1}))
        await eventually(lambda: sub.statistics().subscribed == 2, within=2)
        assert await asyncio.wait_for(early, 2) is ap.Outcome.COMPLETED  # caught up
        pub.advance("late", 1)
        assert await asyncio.wait_for(late, 2) is ap.Outcome.COMPLETED
        assert sub.statistics().received >= 1


async def test_partitions_are_released_after_linger_without_churn(
    redis_server: RedisServer,
    redis_client: aioredis.Redis,
) -> None:
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("linger")
    channel = Partitions("c", DEFAULT_PARTITIONS).channel("topic")
    async with (
        RedisTriggers(
            purgatory, redis_server.url, channel="c", linger=0.6, sweep_interval=0.05
        ) as sub,
        RedisTriggers(None, redis_server.url, channel="c") as pub,
    ):
        # Short-lived watches on one key, one after the other (long polls): the
        # partition stays subscribed between them.
        for value in range(1, 11):
            op = ap.WatermarkOperation(10)
            waiting = asyncio.ensure_future(sub.watch(op, {"topic": value}))
            await eventually(lambda: sub.statistics().subscribed == 1)
            pub.advance("topic", value)
            assert await asyncio.wait_for(waiting, 5) is ap.Outcome.COMPLETED
            assert await numsub(redis_client, channel) == 1
            await asyncio.sleep(0.05)
        assert sub.statistics().subscribed == 1
        # No watcher for longer than linger: released.
        await eventually(lambda: sub.statistics().subscribed == 0, within=3)
        await eventually_async(lambda: numsub(redis_client, channel), 0)
        # And taken again by the next watch.
        op = ap.WatermarkOperation(10)
        waiting = asyncio.ensure_future(sub.watch(op, {"topic": 99}))
        await eventually(lambda: sub.statistics().subscribed == 1)
        pub.advance("topic", 99)
        assert await asyncio.wait_for(waiting, 5) is ap.Outcome.COMPLETED


async def eventually_async(read: Any, expected: Any, within: float = 3.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while (value := await read()) != expected:
        if loop.time() > deadline:
            raise AssertionError(f"still {value!r}, not {expected!r}")
        await asyncio.sleep(0.02)


async def test_a_sync_publisher_publishes_on_the_same_partition_channels(
    redis_server: RedisServer,
) -> None:
    purgatory: ap.Purgatory[Any] = ap.Purgatory("sync")
    publisher = SyncPublisher(redis_server.url, channel="c")
    try:
        async with RedisTriggers(purgatory, redis_server.url, channel="c") as sub:
            ready = False
            checked = Flagged(10, lambda: ready)
            waiting = [
                asyncio.ensure_future(sub.watch(ap.WatermarkOperation(10), {b"raw": 5})),
                asyncio.ensure_future(sub.watch(checked, [42])),
            ]
            await eventually(lambda: sub.statistics().subscribed >= 1)
            subscriber = sub._subscriber
            assert subscriber is not None
            # Subscribed and caught up before the triggers: they must come through.
            await eventually(lambda: subscriber.covers([b"raw", 42]) and sub._reader.idle)
            ready = True
            await asyncio.to_thread(publisher.advance, b"raw", 5)
            await asyncio.to_thread(publisher.check_and_complete, 42)
            outcomes = await asyncio.wait_for(asyncio.gather(*waiting), 5)
            assert outcomes == [ap.Outcome.COMPLETED] * 2
            # Both came through the partition channels (not only the catch-up).
            await eventually(lambda: sub.statistics().received == 2)
    finally:
        publisher.close()


class _Level(enum.IntEnum):
    HIGH = 3


async def test_a_batch_script_publishes_per_partition_what_encode_would(
    redis_server: RedisServer,
) -> None:
    """One call of the batch script: watermarks stored (max), one message per
    partition and per 1,024 triggers, each decoding to exactly its triggers."""
    partitions = Partitions("b", 4, "me")
    client: Any = aioredis.Redis.from_url(redis_server.url)  # redis-py's pub/sub is untyped
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe(*partitions.channels)
        for _ in partitions.channels:
            await pubsub.get_message(timeout=5)  # the confirmations
        keys: list[Key] = [
            'q"uo\\te,',
            "ünï\x00",
            b"\xff,\x00b",
            7,
            -(2**53),
            *[f"n{i}" for i in range(3000)],
        ]
        batch = Batch()
        for i, key in enumerate(keys):
            batch.advance(key, 1.5e300 if i % 2 else i)
        for i in range(500):
            batch.check(f"c{i}")
        batch.check(b"\x01{}")
        batch.advance("enum", _Level.HIGH)  # an IntEnum value crosses as its int
        await client.set(partitions.stored_key(7), "1e301")  # higher: kept
        command = batch_command("me", batch, partitions, b"60000", PublishMode.PLAIN)
        await client.script_load(BATCH_SCRIPT)
        sent = await client.execute_command(*command)
        got: dict[bytes, list[tuple[str, list[Key], list[tuple[Key, float]]]]] = {}
        for _ in range(sent):
            message = await pubsub.get_message(timeout=5)
            assert message is not None
            assert message["type"] == "message"
            decoded = decode(message["data"])
            assert len(decoded[1]) + len(decoded[2]) <= MAX_MESSAGE_TRIGGERS
            got.setdefault(message["channel"], []).append(decoded)
        assert await pubsub.get_message(timeout=0.2) is None  # no more than it said
        for channel, messages in got.items():
            n = partitions.channels.index(channel)
            assert {sender for sender, _, _ in messages} == {"me"}
            assert all(partitions.of(k) == n for _, checks, _ in messages for k in checks)
            assert all(partitions.of(k) == n for _, _, advances in messages for k, _ in advances)
        checks = [k for messages in got.values() for _, c, _ in messages for k in c]
        advances = dict(kv for messages in got.values() for _, _, a in messages for kv in a)
        assert sorted(map(repr, checks)) == sorted(map(repr, batch.checks))
        assert advances == batch.advances
        # Each message's share: the partition's triggers in as few messages as the cap allows.
        for n, channel in enumerate(partitions.channels):
            mine = sum(1 for k in [*batch.checks, *batch.advances] if partitions.of(k) == n)
            assert len(got.get(channel, [])) == -(-mine // MAX_MESSAGE_TRIGGERS)
        for key, value in batch.advances.items():
            expected = 1e301 if key == 7 else value
            assert parse_stored(await client.get(partitions.stored_key(key))) == expected
            assert 0 < await client.pttl(partitions.stored_key(key)) <= 60000
    finally:
        await pubsub.aclose()
        await client.aclose()


async def test_a_flushed_script_cache_is_reloaded(redis_server: RedisServer) -> None:
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("flushed")
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        async with (
            RedisTriggers(purgatory, redis_server.url, channel="f") as sub,
            RedisTriggers(None, redis_server.url, channel="f") as pub,
        ):
            op = ap.WatermarkOperation(5)
            waiting = asyncio.ensure_future(sub.watch(op, {"k": 2}))
            await eventually(lambda: sub.statistics().subscribed == 1)
            pub.advance("k", 1)
            await pub.flush()
            await client.script_flush()
            pub.advance("k", 2)
            pub.check_and_complete("other")
            await pub.flush()
            assert await asyncio.wait_for(waiting, 5) is ap.Outcome.COMPLETED
            assert pub.statistics().publish_errors == 0
            assert (
                parse_stored(await client.get(Partitions("f", DEFAULT_PARTITIONS).stored_key("k")))
                == 2
            )
    finally:
        await client.aclose()
