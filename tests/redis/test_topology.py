"""One dispatch of a URL for both sides (``_topology.locate``), no server needed."""

from __future__ import annotations

import pytest

import aiopurgatory as ap
from aiopurgatory.redis import RedisTriggers, SyncPublisher
from aiopurgatory.redis._topology import Topology, locate, parse_sentinel_url, sentinel_settings
from aiopurgatory.redis._wire import PublishMode


@pytest.mark.parametrize(
    ("url", "topology", "where"),
    [
        ("redis://:s3cret@127.0.0.1:1/2", Topology.SINGLE, "redis://:***@127.0.0.1:1/2"),
        ("unix:///tmp/redis.sock", Topology.SINGLE, "unix:///tmp/redis.sock"),
        (
            "redis+sentinel://:s3cret@h1:26379,h2:26379/svc/3",
            Topology.SENTINEL,
            "redis+sentinel://:***@h1:26379,h2:26379/svc/3",
        ),
        (
            "REDISS+CLUSTER://u:s3cret@h1:7000,h2:7001",
            Topology.CLUSTER,
            "rediss+cluster://u:***@h1:7000,h2:7001",
        ),
    ],
)
def test_a_url_is_located_once_with_its_password_hidden(
    url: str, topology: Topology, where: str
) -> None:
    location = locate(url)
    assert location.topology is topology
    assert (location.sentinel is not None) == (topology is Topology.SENTINEL)
    assert (location.cluster is not None) == (topology is Topology.CLUSTER)
    assert "s3cret" not in location.where
    assert location.where.lower() == where.lower()


@pytest.mark.parametrize("url", ["redis+sentinel://:s3cret@h1:26379", "redis+cluster://:s3cret@"])
def test_an_unusable_url_is_refused_alike_on_both_sides_without_its_password(url: str) -> None:
    with pytest.raises(ValueError, match="not a usable Redis URL") as located:
        locate(url)
    assert "s3cret" not in str(located.value)
    with pytest.raises(ValueError, match="not a usable Redis URL") as sync:
        SyncPublisher(url)
    with pytest.raises(ValueError, match="not a usable Redis URL") as async_:
        RedisTriggers(ap.Purgatory("p"), url)
    assert str(sync.value) == str(async_.value) == str(located.value)


def test_sentinel_settings_are_built_once_for_either_client() -> None:
    parsed = parse_sentinel_url("rediss+sentinel://u:s3cret@h1:26379/svc/3")
    sentinels, primary = sentinel_settings(parsed, 2.5)
    assert sentinels == {"socket_connect_timeout": 2.5, "socket_timeout": 2.5}
    assert primary["db"] == 3
    assert primary["ssl"] is True
    assert primary["socket_connect_timeout"] == 2.5
    assert (primary.get("username"), primary.get("password")) == ("u", "s3cret")


def test_both_sides_publish_on_shard_channels_on_a_cluster_only() -> None:
    publisher = SyncPublisher("redis://127.0.0.1:1/0")
    try:
        assert publisher._publish is PublishMode.PLAIN
    finally:
        publisher.close(timeout=0)
    triggers = RedisTriggers(None, "redis://127.0.0.1:1/0")
    assert triggers._connections.publish is PublishMode.PLAIN
    triggers = RedisTriggers(None, "redis+cluster://127.0.0.1:1")
    assert triggers._connections.publish is PublishMode.SHARDED
