"""aiopurgatory.redis on the redis-py versions it supports: 5.3+ on one server and
Sentinel, 8.0+ on a Redis Cluster (refused, saying so, on an older one)."""

from __future__ import annotations

import pytest
import redis

import aiopurgatory as ap
from aiopurgatory.redis import RedisTriggers, SyncPublisher, _compat

CLUSTER_URL = "redis+cluster://127.0.0.1:7000,127.0.0.1:7001"


def test_the_installed_version_is_read() -> None:
    assert _compat.REDIS_PY_VERSION[:2] == tuple(int(p) for p in redis.__version__.split(".")[:2])
    assert _compat.REDIS_PY_VERSION >= (5, 3)


@pytest.mark.parametrize("installed", [(5, 3, 1), (7, 4, 0)])
def test_a_cluster_is_refused_on_an_older_redis_py(
    installed: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_compat, "REDIS_PY_VERSION", installed)
    with pytest.raises(RuntimeError, match=r"redis-py >= 8\.0 for a Redis Cluster"):
        RedisTriggers(ap.Purgatory("c"), CLUSTER_URL)
    with pytest.raises(RuntimeError, match=r"redis-py >= 8\.0 for a Redis Cluster"):
        SyncPublisher(CLUSTER_URL)


def test_a_cluster_is_taken_on_redis_py_8() -> None:
    if _compat.REDIS_PY_VERSION < _compat.CLUSTER_MIN_VERSION:
        with pytest.raises(RuntimeError, match=redis.__version__):
            RedisTriggers(ap.Purgatory("c"), CLUSTER_URL)
    else:
        # Made, not entered: nothing connects to the (absent) nodes.
        RedisTriggers(ap.Purgatory("c"), CLUSTER_URL)
