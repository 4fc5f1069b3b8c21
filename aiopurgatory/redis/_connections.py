"""Reaching Redis: where a RedisTriggers' connections go, how they are made, what went wrong.

A :class:`Connections` turns what the user passed (a URL or a client) into

* where Redis is, as reprs, logs and errors show it (never a password), and the
  :class:`~._redact.Redactor` every text that leaves the library goes through;
* the library's own connections, one per job (the sender's, the reader's, the
  subscription's): made with the URL's (or the client's) settings and what the
  library needs, never taken from redis-py's pool (which runs out under many
  concurrent callers and hands out connections that died while Redis was away).
  On one server a :class:`~._link.Link` per job; on a cluster a
  :class:`~._cluster.ClusterLink` per job (a connection per master, routed by
  slot) over one shared :class:`~._cluster.SlotMap`;
* the wait before the n-th reconnection (:meth:`Connections.backoff`);
* the record of failures: connection errors counted, the last error kept,
  redacted (``statistics()`` shows both).

:mod:`._topology` says where a URL points (one server, a Sentinel-managed
primary, a cluster's seeds); this module makes the connections from it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ._cluster import ClusterLink
from ._compat import require_cluster_support
from ._link import CommandLink, Link
from ._partitions import Partitions
from ._redact import Redactor, describe_client
from ._sharded import ShardedSubscription
from ._slots import SlotMap
from ._topology import Target, describe_pool, locate, seeds_of_client, target_for
from ._wire import PublishMode

__all__ = ["Connections"]


class Connections:
    """The connections of one RedisTriggers (see the module documentation).

    Args:
        url_or_client: a Redis URL or a ``redis.asyncio`` client, as
            ``RedisTriggers`` takes it (only a client's settings are used).
        instance: the owner's id (its connections' names carry it).
        command_timeout: seconds a call may take, its connect included.
        reconnect_delay: the first and the longest wait between reconnections.

    Raises:
        TypeError: ``url_or_client`` is neither a URL nor such a client.
        ValueError: not a usable Redis URL (the message never holds the password).
        RuntimeError: a cluster on a redis-py older than 8.0 (see :mod:`._compat`).
    """

    def __init__(
        self,
        url_or_client: str | aioredis.Redis | AsyncRedisCluster,
        instance: str,
        *,
        command_timeout: float,
        reconnect_delay: tuple[float, float],
    ) -> None:
        self._id = instance
        self._timeout = command_timeout
        self._first, self._longest = reconnect_delay
        if isinstance(url_or_client, str):
            location = locate(url_or_client)
            self.redactor = location.redactor
            self.where = location.where
            # Only the URL's settings are used (see factory()): no connection is
            # ever taken from this pool.
            target = target_for(location, command_timeout)
        elif isinstance(url_or_client, aioredis.Redis):
            pool = url_or_client.connection_pool
            target = Target(pool, "")
            kwargs = pool.connection_kwargs
            self.redactor = Redactor(kwargs.get("password"))
            self.where = describe_pool(pool) or describe_client(kwargs)
        elif isinstance(url_or_client, AsyncRedisCluster):
            seeds = seeds_of_client(url_or_client)
            target = Target(None, seeds.where, cluster=seeds)
            self.redactor = Redactor(seeds.options.get("password"))
            self.where = seeds.where
        else:
            given: object = url_or_client  # type: ignore[unreachable]
            kind = type(given).__name__
            raise TypeError(
                "url_or_client must be a Redis URL (str), a redis.asyncio.Redis or a "
                f"redis.asyncio.cluster.RedisCluster client, got {kind}"
            )
        cluster = target.cluster
        if cluster is not None:
            require_cluster_support()
        self._target = target
        self._slots: SlotMap | None = None
        if cluster is None:
            assert target.pool is not None
            self._options = dict(target.pool.connection_kwargs)
            self._connection_class: Any = target.pool.connection_class
        else:
            self._options = dict(cluster.options)
            self._options.setdefault("socket_connect_timeout", command_timeout)
            self._connection_class = self._options.pop("connection_class", None) or Connection
            self._slots = SlotMap(cluster.seeds, self.node_factory("map"), command_timeout)
        #: How triggers are published: shard channels on a cluster.
        self.publish = PublishMode.PLAIN if cluster is None else PublishMode.SHARDED
        self.errors = 0  # connection failures (statistics' connection_errors)
        self.last_error: str | None = None

    @property
    def db(self) -> int | None:
        """The Redis database of the connections (None on a cluster, which has one)."""
        if self._slots is not None:
            return None
        return int(self._options.get("db") or 0)

    @property
    def cluster(self) -> bool:
        """Redis is a cluster (its partitions are shard channels, routed by slot)."""
        return self._slots is not None

    def link(self, role: str) -> CommandLink:
        """A new link for ``role`` (its connections are named after it)."""
        slots = self._slots
        if slots is None:
            return Link(self.factory(role), self._timeout)
        return ClusterLink(slots, self.node_factory(role), self._timeout)

    def subscription_factory(self, partitions: Partitions) -> Callable[[], Any]:
        """Makes the subscriber's new, unconnected connections (on a cluster, a
        :class:`~._cluster.ShardedSubscription` over every master)."""
        slots = self._slots
        if slots is None:
            return self.factory("sub")
        connect = self.node_factory("sub")
        return lambda: ShardedSubscription(slots, connect, partitions.control, partitions.canary)

    def factory(self, role: str) -> Callable[[], Any]:
        """Makes new connections for ``role`` with the URL's (or the client's) settings."""
        options = self._role_options(role)
        connection_class = self._connection_class
        return lambda: connection_class(**options)

    def node_factory(self, role: str) -> Callable[[tuple[str, int]], Any]:
        """Makes new connections for ``role`` to a cluster node ``(host, port)``."""
        options = self._role_options(role)
        connection_class = self._connection_class
        return lambda address: connection_class(**options, host=address[0], port=address[1])

    def backoff(self, attempt: int) -> float:
        """The wait before the ``attempt``-th reconnection (from 1), with jitter."""
        ceiling = min(self._longest, self._first * 2 ** min(attempt - 1, 30))
        return random.uniform(ceiling / 2, ceiling)

    def record_error(self, exc: BaseException) -> str:
        """A connection failure: counted, kept as the last error; its redacted text."""
        text = self.redactor.error(exc)
        self.last_error = text
        self.errors += 1
        return text

    def record_bug(self, exc: BaseException) -> str:
        """An unexpected failure: kept as the last error; its redacted text."""
        text = self.redactor.error(exc)
        self.last_error = text
        return text

    async def aclose(self) -> None:
        """Close the clients made to ask the sentinels (the links close themselves)."""
        await self._target.aclose()

    def _role_options(self, role: str) -> dict[str, Any]:
        """The settings of the library's connections for ``role``: the URL's (or the
        client's), with what the library needs."""
        options = dict(self._options)
        options.update(
            # The connections are ours: RESP2 replies, bytes, no retries inside
            # redis-py (our loops retry, reconnect and resync), keep-alive, a
            # name that shows in CLIENT LIST.
            protocol=2,
            decode_responses=False,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
            socket_keepalive=True,
            client_name=f"aiopurgatory-{role}-{self._id}",
            # No socket timeout of redis-py's: every call is bounded by our own
            # asyncio.timeout (command_timeout). With one, redis-py wraps each
            # write in asyncio.wait_for, which on Python 3.11 can swallow a
            # cancellation that comes as the write completes (seen here: aclose()
            # then waited forever for a task it had cancelled).
            socket_timeout=None,
        )
        return options
