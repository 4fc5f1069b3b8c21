"""Misconfiguration is loud (issue 48): publishers and subscribers of one channel that disagree.

Against a real redis-server: a publisher (``SyncPublisher`` or a publisher-only
``RedisTriggers``) on a channel nobody subscribes to while subscribers listen on
another, on another database, with another ``partitions``, or facing a subscriber
of another wire version, logs one warning naming the mismatch within seconds and
counts it in ``statistics()``; agreeing processes find nothing, and the check
costs one ``PUBSUB NUMSUB`` per interval.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
import redis
import redis.asyncio as aioredis

import aiopurgatory as ap
from aiopurgatory.redis import RedisTriggers, SyncPublisher
from aiopurgatory.redis.testing import RedisServer
from tests.redis.test_redis_sync_outage import Recorder

pytestmark = pytest.mark.realtime
one_loop = pytest.mark.asyncio(loop_factories=["asyncio"])

EVERY = 0.2  # config_check_interval in these tests (5 s by default)


def url_of(server: RedisServer, db: int = 0) -> str:
    return server.url_for(None, None, db)


@pytest_asyncio.fixture
async def subscriber(redis_server: RedisServer) -> AsyncIterator[RedisTriggers]:
    """A process watching on channel "jobs", database 0, default partitions."""
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("sub")
    async with RedisTriggers(
        purgatory, redis_server.url, channel="jobs", config_check_interval=EVERY
    ) as triggers:
        yield triggers


async def publish_until(publisher: SyncPublisher, done: Callable[[], bool], most: float) -> None:
    """Advance now and then (a check starts from a call that reached Redis) until
    ``done()`` or ``most`` seconds."""
    deadline = time.monotonic() + most
    value = 0
    while not done() and time.monotonic() < deadline:
        value += 1
        await asyncio.to_thread(publisher.advance, "k", value)
        await asyncio.sleep(EVERY / 4)


async def eventually(condition: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.02)


def findings(log: Recorder) -> list[dict[str, Any]]:
    return [fields for _, _, fields in log.named("aiopurgatory.redis.misconfigured")]


# Without a finding, how long a publisher runs (several checks); with one, how
# long it runs on after it (more checks: the finding is not repeated).
QUIET = 0.8
AFTER = 0.6


async def sync_finding(url: str, **options: Any) -> list[dict[str, Any]]:
    """What a SyncPublisher on ``url`` finds while it publishes (up to 5 s for a finding)."""
    log = Recorder()
    publisher = SyncPublisher(url, config_check_interval=EVERY, logger=log, **options)
    try:
        await publish_until(publisher, lambda: bool(findings(log)), 5.0)
        await publish_until(publisher, lambda: False, AFTER if findings(log) else 0.0)
        await asyncio.to_thread(time.sleep, EVERY)  # a check in flight ends
        stats = publisher.statistics()
        found = findings(log)
        assert stats.mismatches == len(found)
        if found:
            assert stats.last_mismatch == found[-1]["detail"]
        return found
    finally:
        publisher.close()


async def sync_quiet(url: str, **options: Any) -> list[dict[str, Any]]:
    """What a SyncPublisher on ``url`` finds in QUIET seconds of publishing."""
    log = Recorder()
    publisher = SyncPublisher(url, config_check_interval=EVERY, logger=log, **options)
    try:
        await publish_until(publisher, lambda: False, QUIET)
        await asyncio.to_thread(time.sleep, EVERY)  # a check in flight ends
        assert publisher.statistics().mismatches == len(findings(log))
        return findings(log)
    finally:
        publisher.close()


async def async_finding(url: str, *, quiet: bool = False, **options: Any) -> list[dict[str, Any]]:
    """What a publisher-only RedisTriggers on ``url`` finds (up to 5 s for a finding,
    QUIET seconds if ``quiet``)."""
    log = Recorder()
    async with RedisTriggers(
        None, url, config_check_interval=EVERY, logger=log, **options
    ) as publisher:
        if quiet:
            await asyncio.sleep(QUIET)
        else:
            await eventually(lambda: bool(findings(log)))
            await asyncio.sleep(AFTER)
        found = findings(log)
        assert publisher.statistics().mismatches == len(found)
        return found


@one_loop
async def test_agreeing_publishers_find_nothing_and_the_check_is_one_command_per_interval(
    redis_server: RedisServer, subscriber: RedisTriggers, redis_client: aioredis.Redis
) -> None:
    await redis_client.config_resetstat()
    started = time.monotonic()
    assert await sync_quiet(redis_server.url, channel="jobs") == []
    assert await async_finding(redis_server.url, channel="jobs", quiet=True) == []
    elapsed = time.monotonic() - started
    stats = await redis_client.info("commandstats")
    numsub = stats.get("cmdstat_pubsub|numsub", {}).get("calls", 0)
    # The subscriber's, the sync and the async publisher's checks: about one each
    # per interval, and no scan of Redis's channels (nothing disagrees).
    assert 0 < numsub <= 3 * (elapsed / EVERY + 2), (numsub, elapsed)
    assert "cmdstat_pubsub|channels" not in stats
    assert subscriber.statistics().mismatches == 0


@one_loop
async def test_a_publisher_on_a_channel_nobody_subscribes_to_names_the_ones_in_use(
    redis_server: RedisServer, subscriber: RedisTriggers
) -> None:
    found: list[dict[str, Any]]
    for found in (
        await sync_finding(redis_server.url, channel="jbos"),
        await async_finding(redis_server.url, channel="jbos"),
    ):
        assert [f["kind"] for f in found] == ["channel"]  # once, however many calls
        assert "nobody subscribes to channel 'jbos'" in found[0]["detail"]
        assert "'jobs'" in found[0]["detail"]
    # Nobody on any channel (a deployment starting): nothing to say yet.
    await subscriber.aclose()
    assert await sync_quiet(redis_server.url, channel="jbos") == []


@one_loop
async def test_a_publisher_on_another_database_is_reported(
    redis_server: RedisServer, subscriber: RedisTriggers
) -> None:
    found: list[dict[str, Any]]
    for found in (
        await sync_finding(url_of(redis_server, 1), channel="jobs"),
        await async_finding(url_of(redis_server, 1), channel="jobs"),
    ):
        assert [f["kind"] for f in found] == ["database"]
        assert "use Redis database 0 and this publisher database 1" in found[0]["detail"]
    # Two subscribers that disagree find it too, each of them.
    log = Recorder()
    other: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("other-db")
    async with RedisTriggers(
        other, url_of(redis_server, 2), channel="jobs", config_check_interval=EVERY, logger=log
    ) as elsewhere:
        await eventually(lambda: elsewhere.statistics().mismatches == 1)
        await eventually(lambda: subscriber.statistics().mismatches == 1)
        last = subscriber.statistics().last_mismatch
        assert last is not None
        assert "database 2 and this process database 0" in last
        [theirs] = findings(log)
        assert theirs["kind"] == "database"


@one_loop
async def test_a_publisher_with_other_partitions_is_reported(
    redis_server: RedisServer, subscriber: RedisTriggers, redis_client: aioredis.Redis
) -> None:
    await redis_client.config_resetstat()
    found: list[dict[str, Any]]
    for found in (
        await sync_finding(redis_server.url, channel="jobs", partitions=16),
        await async_finding(redis_server.url, channel="jobs", partitions=16),
    ):
        assert [f["kind"] for f in found] == ["partitions"]
        assert "use partitions=16384 and this publisher partitions=16" in found[0]["detail"]
    # The scan of Redis's channels: once per publisher, not at every check.
    stats = await redis_client.info("commandstats")
    assert stats["cmdstat_pubsub|channels"]["calls"] == 2
    assert stats["cmdstat_pubsub|numsub"]["calls"] >= 6


def test_the_agreement_scans_only_when_the_counts_change() -> None:
    from aiopurgatory.redis._agreement import Agreement, Config

    agreement = Agreement("jobs", b"jobs", Config(1, 16384, 0), role="publisher")
    assert agreement.probe() == ("PUBSUB", "NUMSUB", b"jobs", b"jobs:cfg:v1:p16384:d0")
    assert agreement.counted([b"jobs", 2, b"jobs:cfg:v1:p16384:d0", 2]) is None  # all agree
    scan = agreement.counted([b"jobs", 3, b"jobs:cfg:v1:p16384:d0", 2])
    assert scan == ("PUBSUB", "CHANNELS", b"jobs:cfg:*")
    [(kind, text)] = agreement.scanned([b"jobs:cfg:v1:p16384:d0", b"jobs:cfg:v1:p16384:d3"])
    assert kind == "database"
    assert "database 3 and this publisher database 0" in text
    assert agreement.counted([b"jobs", 3, b"jobs:cfg:v1:p16384:d0", 2]) is None  # explained
    assert agreement.counted([(b"jobs", 4), (b"jobs:cfg:v1:p16384:d0", 2)]) is not None
    assert agreement.scanned(["jobs:cfg:v1:p16384:d3", "jobs:cfg:v1:p16384:d0"]) == []  # known
    # Nobody on the channel: scanned on the second check in a row, then rarely.
    other = Agreement("j[1]", b"j[1]", Config(1, 16384, 0), role="publisher")
    assert other.counted([b"j[1]", 0, b"j[1]:cfg:v1:p16384:d0", 0]) is None
    assert other.counted([b"j[1]", 0, b"j[1]:cfg:v1:p16384:d0", 0]) is not None
    assert other.scanned([]) == []  # nobody anywhere: nothing to say
    assert [other.counted([b"j[1]", 0, b"x", 0]) for _ in range(11)] == [None] * 11
    assert other.counted([b"j[1]", 0, b"x", 0]) is not None
    [(kind, text)] = other.scanned([b"jobs:cfg:v1:p16384:d0"])
    assert kind == "channel"
    assert "'jobs'" in text
    assert other.mismatches == 1
    # A channel name with glob characters is matched literally.
    assert other.counted([b"j[1]", 2, b"j[1]:cfg:v1:p16384:d0", 1]) == (
        "PUBSUB",
        "CHANNELS",
        b"j\\[1\\]:cfg:*",
    )


@one_loop
async def test_a_subscriber_of_another_wire_version_is_reported(
    redis_server: RedisServer, subscriber: RedisTriggers
) -> None:
    # A subscriber of a later version announces itself on its own configuration
    # channel; one of an earlier version does not announce itself at all.
    later = redis.Redis.from_url(redis_server.url).pubsub()  # type: ignore[no-untyped-call]
    later.subscribe("jobs", "jobs:cfg:v2:p16384:d0")
    try:
        [found] = await sync_finding(redis_server.url, channel="jobs")
        assert found["kind"] == "version"
        assert "speak wire version 2 and this publisher version 1" in found["detail"]
        await eventually(lambda: subscriber.statistics().mismatches == 1)
    finally:
        later.close()
    earlier = redis.Redis.from_url(redis_server.url).pubsub()  # type: ignore[no-untyped-call]
    earlier.subscribe("jobs")
    try:
        [found] = await async_finding(redis_server.url, channel="jobs")
        assert found["kind"] == "version"
        assert "1 subscriber(s) of channel 'jobs' do not announce" in found["detail"]
    finally:
        earlier.close()


def test_config_check_interval_is_checked() -> None:
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="config_check_interval must be positive"):
            SyncPublisher("redis://127.0.0.1:1/0", config_check_interval=bad)
        with pytest.raises(ValueError, match="config_check_interval must be positive"):
            RedisTriggers(None, "redis://127.0.0.1:1/0", config_check_interval=bad)


@one_loop
async def test_an_acl_without_pubsub_ends_the_checks_quietly(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory(
        extra_args=["--user", "limited", "on", ">pw", "~*", "&*", "+@all", "-pubsub"]
    )
    url = server.url_for("limited", "pw")
    log = Recorder()
    publisher = SyncPublisher(url, channel="jobs", config_check_interval=EVERY, logger=log)
    try:
        await publish_until(publisher, lambda: False, QUIET)  # every call succeeds
        assert publisher.statistics().sent > 0
    finally:
        publisher.close()
    async_log = Recorder()
    async with RedisTriggers(
        None, url, channel="jobs", config_check_interval=EVERY, logger=async_log
    ) as triggers:
        await asyncio.sleep(QUIET)
        assert triggers.statistics().mismatches == 0
    for events in (log, async_log):
        [(level, _, fields)] = events.named("aiopurgatory.redis.config_check_unavailable")
        assert level == "info"
        assert "NOPERM" in fields["error"] or "permission" in fields["error"]
        assert [e for e in events.events if e[0] == "error"] == []  # no task ended
