"""The long-poll example's own Redis code on a Redis Cluster and on Sentinel.

The example's topics (the append and read scripts, the topics set, idempotency
records, ``WAIT`` before a POST is acknowledged) through the clients the example
makes for ``redis+cluster://`` and ``redis+sentinel://`` URLs (redis-py's
``RedisCluster`` and Sentinel-managed ``Redis``), on real servers started by
tests/support/redis_cluster.py: an acknowledged append survives its primary's death.
The cross-process triggers on these topologies are the library's
(``aiopurgatory.redis``), tested with it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis.exceptions

from examples.longpoll.redisfeed import (
    APPEND,
    READ,
    REDIS_DOWN,
    RedisUnavailable,
    RedisWaiter,
    check_redis,
)
from examples.longpoll.redisstore import (
    REGISTER,
    RedisTarget,
    append_replicated,
    close_client,
    open_client,
    parse_redis_url,
)
from tests.support.redis_cluster import (
    ClusterServers,
    SentinelServers,
    redis_cluster,
    redis_sentinel,
)

pytestmark = pytest.mark.not_library

__all__ = ["redis_cluster", "redis_sentinel"]  # the fixtures, used by name below

T = TypeVar("T")


# -- URLs ------------------------------------------------------------------------------


def test_a_server_url_goes_to_redis_py_as_it_is() -> None:
    target = parse_redis_url("rediss://:pw@example.org:6380/2")
    assert target == RedisTarget("server", "rediss://:pw@example.org:6380/2", tls=True)
    assert target.default_replicas == 0


def test_a_sentinel_url_names_its_sentinels_service_database_and_credentials() -> None:
    target = parse_redis_url("redis+sentinel://alice:p%40ss@10.0.0.1:26379,10.0.0.2/cache/3")
    assert target.topology == "sentinel"
    assert target.nodes == (("10.0.0.1", 26379), ("10.0.0.2", 26379))
    assert (target.service, target.db) == ("cache", 3)
    assert (target.username, target.password) == ("alice", "p@ss")
    assert target.default_replicas == 1


def test_a_cluster_url_names_its_seed_nodes() -> None:
    target = parse_redis_url("rediss+cluster://:secret@h1:7000,h2:7001?ssl_ca_certs=/ca.pem")
    assert target.topology == "cluster"
    assert target.nodes == (("h1", 7000), ("h2", 7001))
    assert (target.username, target.password, target.tls) == (None, "secret", True)
    assert target.ssl_ca_certs == "/ca.pem"
    assert target.default_replicas == 1


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://h:1", "scheme must be one of"),
        ("redis+sentinel://h:26379", "names its service"),
        ("redis+cluster://h:7000/1", "database 0 only"),
        ("redis+cluster://h:port", "is not host:port"),
        ("redis+cluster://h:70000", "is not host:port"),
        ("redis+sentinel://h:1/svc/x", "not a database number"),
        ("redis+cluster://h:1?retry=3", "unknown URL options: retry"),
    ],
)
def test_a_bad_url_is_refused_saying_why(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_redis_url(url)
    with pytest.raises(ValueError, match=message):
        RedisWaiter(url)


def test_the_waiter_refuses_negative_replicas_and_a_replica_wait_past_the_deadline() -> None:
    with pytest.raises(ValueError, match="replicas must be 0 or more"):
        RedisWaiter("redis+cluster://h:7000", replicas=-1)
    with pytest.raises(ValueError, match="replica_timeout must be above 0 and below"):
        RedisWaiter("redis+cluster://h:7000", command_timeout=1.0, replica_timeout=1.0)
    assert RedisWaiter("redis+cluster://h:7000").replicas == 1
    assert RedisWaiter("redis://h:6379/0").replicas == 0


# -- on real servers -------------------------------------------------------------------


class Topics:
    """The example's scripts on a topology, through the client the example makes."""

    def __init__(self, url: str) -> None:
        self.waiter = RedisWaiter(url)  # for its key names; never entered
        self.client: Any = open_client(self.waiter.target, timeout=2.0, max_connections=16)

    def keys(self, name: str, token: str) -> list[str]:
        key = self.waiter.key
        return [key(name, "meta"), key(name, "log"), key(name, f"idem:{token}")]

    async def register(self, name: str, max_topics: int = 100) -> int:
        return int(await self.client.eval(REGISTER, 1, "longpoll:topics", name, max_topics))

    async def append(self, name: str, body: str, token: str) -> tuple[list[int], int]:
        reply, confirmed = await append_replicated(
            self.client,
            APPEND,
            self.keys(name, token),
            [body, 1000, token, 60_000],
            replicas=1,
            replica_timeout=1.0,
        )
        return [int(v) for v in reply], confirmed

    async def read(self, name: str) -> list[str]:
        key = self.waiter.key
        reply = await self.client.eval(READ, 2, key(name, "meta"), key(name, "log"), 0, 10**6)
        return [item.decode() for item in reply[4:]]

    async def aclose(self) -> None:
        await close_client(self.client)


async def until_redis_answers(make: Callable[[], Awaitable[T]], within: float = 15.0) -> T:
    """What the feed's call() does across a failover: the command again, until it goes."""
    async with asyncio.timeout(within):
        while True:
            try:
                return await make()
            except REDIS_DOWN:
                await asyncio.sleep(0.2)


async def acknowledged_posts_survive_their_primary(
    topics: Topics, kill_primary: Callable[[str], object]
) -> None:
    names = ["alpha", "beta", "gamma"]  # topics in several slots (and masters)
    acknowledged: dict[str, list[str]] = {}
    for name in names:
        assert await topics.register(name) == 1
        for i in range(5):
            body = f"{name}-{i}"
            (offset, _, replayed), confirmed = await topics.append(name, body, f"c:{body}")
            assert (offset, replayed, confirmed) == (i, 0, 1)  # on a replica: acknowledged
            acknowledged.setdefault(name, []).append(body)
    # A retry with the same token answers the first offset and stores nothing.
    (offset, _, replayed), confirmed = await topics.append("alpha", "alpha-1", "c:alpha-1")
    assert (offset, replayed, confirmed) == (1, 1, 1)
    (offset, _, _), _ = await topics.append("alpha", "another body", "c:alpha-1")
    assert offset == -2

    await asyncio.to_thread(kill_primary, "alpha")

    for name in names:
        assert await until_redis_answers(lambda n=name: topics.read(n)) == acknowledged[name]  # type: ignore[misc]
    # Appends go on, on the promoted replica, at the next offset (dense, none lost).
    reply, _ = await until_redis_answers(
        lambda: topics.append("alpha", "alpha-after", "c:alpha-after")
    )
    assert (reply[0], reply[2]) == (5, 0)
    assert await topics.read("alpha") == [*acknowledged["alpha"], "alpha-after"]


def test_on_a_cluster_an_acknowledged_post_survives_its_master(
    redis_cluster: ClusterServers,
) -> None:
    def kill_primary(name: str) -> None:
        meta = RedisWaiter(redis_cluster.url).key(name, "meta")
        redis_cluster.kill_master(redis_cluster.master_of_key(meta).port)

    async def scenario() -> None:
        topics = Topics(redis_cluster.url)
        try:
            await acknowledged_posts_survive_their_primary(topics, kill_primary)
        finally:
            await topics.aclose()

    try:
        asyncio.run(scenario())  # once, not per event loop: a failover takes seconds
    finally:
        redis_cluster.heal()


def test_on_sentinel_an_acknowledged_post_survives_the_primary(
    redis_sentinel: SentinelServers,
) -> None:
    async def scenario() -> None:
        topics = Topics(redis_sentinel.url)
        try:
            await acknowledged_posts_survive_their_primary(
                topics, lambda name: redis_sentinel.kill_primary()
            )
        finally:
            await topics.aclose()

    try:
        asyncio.run(scenario())
    finally:
        redis_sentinel.heal()


@pytest.mark.parametrize("topology", ["cluster", "sentinel"])
async def test_appends_read_back_and_replay_on_each_event_loop(
    topology: str, redis_cluster: ClusterServers, redis_sentinel: SentinelServers
) -> None:
    url = redis_cluster.url if topology == "cluster" else redis_sentinel.url
    topics = Topics(url)
    name = f"loop-{uuid.uuid4().hex[:8]}"
    try:
        bodies = [f"m{i}" for i in range(3)]
        for i, body in enumerate(bodies):
            (offset, total, replayed), confirmed = await topics.append(name, body, f"c:{body}")
            assert (offset, total, replayed, confirmed) == (i, 2 * (i + 1), 0, 1)
        (offset, _, replayed), _ = await topics.append(name, "m0", "c:m0")
        assert (offset, replayed) == (0, 1)
        assert await topics.read(name) == bodies
    finally:
        await topics.aclose()


def test_the_topics_set_caps_topics_on_a_cluster(redis_cluster: ClusterServers) -> None:
    async def scenario() -> None:
        topics = Topics(redis_cluster.url)
        try:
            await topics.client.delete("longpoll:topics")
            assert [await topics.register(f"cap-{i}", max_topics=2) for i in range(3)] == [1, 1, 0]
            assert await topics.register("cap-0", max_topics=2) == 1  # known: still fine
        finally:
            await topics.aclose()

    asyncio.run(scenario())


def test_an_append_without_a_replica_is_not_confirmed(redis_sentinel: SentinelServers) -> None:
    replica = next(s for s in redis_sentinel.servers.values() if s is not redis_sentinel.primary())

    async def scenario() -> None:
        topics = Topics(redis_sentinel.url)
        try:
            (offset, _, _), confirmed = await topics.append("lonely", "m", "c:lonely-m")
            assert confirmed == 1
            replica.pause()  # connected, silent: it acknowledges nothing
            try:
                (offset, _, _), confirmed = await topics.append("lonely", "n", "c:lonely-n")
                assert (offset, confirmed) == (1, 0)  # stored on the primary only
            finally:
                replica.resume()
        finally:
            await topics.aclose()

    asyncio.run(scenario())
    redis_sentinel.wait_ready()


def test_the_start_up_check_reaches_a_cluster_and_a_sentinel_primary(
    redis_cluster: ClusterServers, redis_sentinel: SentinelServers
) -> None:
    check_redis(redis_cluster.url)
    check_redis(redis_sentinel.url)
    wrong = redis_sentinel.url.replace("/mymaster", "/nosuchservice")
    with pytest.raises(RedisUnavailable, match="unreachable"):
        check_redis(wrong)


def test_redis_down_covers_a_cluster_failing_over() -> None:
    assert issubclass(redis.exceptions.ClusterDownError, REDIS_DOWN)
    assert issubclass(redis.exceptions.TryAgainError, REDIS_DOWN)
    assert issubclass(redis.exceptions.SlotNotCoveredError, REDIS_DOWN)
