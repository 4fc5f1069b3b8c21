"""Where the connections go: one server, or the primary a set of Sentinels names.

A :class:`RedisTriggers` never uses a redis-py pool's connections; it takes a
pool's *settings* and makes its own connections from them. This module turns
what the user passed (a URL, or a client) into such a pool:

* ``redis://``, ``rediss://``, ``unix://``: redis-py's ``ConnectionPool.from_url``.
* ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]``
  (``rediss+sentinel://`` for TLS to the data servers): a
  ``SentinelConnectionPool``, whose connections ask a sentinel for the current
  primary each time they connect. A connection renewed after a failover (lost,
  or found deaf by its canary) therefore lands on the new primary. The password
  is the data servers'; the sentinels are asked without one.
* ``redis+cluster://[[user]:password@]host:port[,host:port...]`` (``rediss+cluster://``
  for TLS): no pool, the seed nodes and the settings (:mod:`._cluster`).
* A ``redis.asyncio.Redis`` client: its pool (a Sentinel-managed client's is a
  ``SentinelConnectionPool``, which works the same way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis

from ._cluster import (
    CLUSTER_SCHEMES,
    ClusterSeeds,
    credentials,
    nodes_url,
    parse_cluster_url,
    shown_auth,
)

__all__ = [
    "SentinelURL",
    "Target",
    "describe_pool",
    "is_sentinel_url",
    "parse_sentinel_url",
    "target_for_url",
]

_SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}


@dataclass
class Target:
    """A pool whose settings make the connections, and what to close with it."""

    pool: aioredis.ConnectionPool | None
    where: str
    # Clients the library made to reach the sentinels (closed by aclose()).
    sentinel_clients: list[aioredis.Redis] = field(default_factory=list)
    # A Redis Cluster's seed nodes and connection settings (pool is None then).
    cluster: ClusterSeeds | None = None

    async def aclose(self) -> None:
        clients, self.sentinel_clients = self.sentinel_clients, []
        for client in clients:
            await client.aclose()


def target_for_url(url: str, timeout: float) -> Target:
    """The pool for ``url`` (see the module documentation).

    Raises:
        ValueError: not a usable URL (the message never holds the password).
    """
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in _SENTINEL_SCHEMES:
        return _sentinel(url, timeout)
    if scheme in CLUSTER_SCHEMES:
        seeds = parse_cluster_url(url)
        return Target(None, seeds.where, cluster=seeds)
    pool = aioredis.ConnectionPool.from_url(url, socket_connect_timeout=timeout)
    return Target(pool, "")


@dataclass
class SentinelURL:
    """What a ``redis+sentinel://`` URL names."""

    username: str | None
    password: str | None
    hosts: list[tuple[str, int]]
    service: str
    db: int
    tls: bool

    @property
    def where(self) -> str:
        """The URL to show (the password hidden)."""
        seeds = ",".join(f"{host}:{port}" for host, port in self.hosts)
        auth = shown_auth(self.username, self.password)
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}+sentinel://{auth}{seeds}/{self.service}/{self.db}"


def is_sentinel_url(url: str) -> bool:
    """``url`` names a Sentinel-managed primary (``redis+sentinel://``, ``rediss+sentinel://``)."""
    return "://" in url and url.split("://", 1)[0].lower() in _SENTINEL_SCHEMES


def parse_sentinel_url(url: str) -> SentinelURL:
    """The sentinels, service, database and credentials ``url`` names.

    Raises:
        ValueError: not a usable Sentinel URL (the message never holds the password).
    """
    tls = _SENTINEL_SCHEMES[url.split("://", 1)[0].lower()]
    username, password, hosts, rest = nodes_url(url, "a sentinel")
    path = [p for p in urlsplit(rest).path.split("/") if p]
    if not path or len(path) > 2:
        raise ValueError(
            "a Sentinel URL names its service: redis+sentinel://host:port/service[/db]"
        )
    service = unquote(path[0])
    db = 0
    if len(path) == 2:
        if not path[1].isdigit():
            raise ValueError(f"the database must be a number, got {path[1]!r}")
        db = int(path[1])
    return SentinelURL(username, password, hosts, service, db, tls)


def _sentinel(url: str, timeout: float) -> Target:
    from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

    parsed = parse_sentinel_url(url)
    username, password, hosts = parsed.username, parsed.password, parsed.hosts
    service, db, tls = parsed.service, parsed.db, parsed.tls
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        hosts,
        sentinel_kwargs={"socket_connect_timeout": timeout, "socket_timeout": timeout},
        socket_connect_timeout=timeout,
    )
    options: dict[str, Any] = {"db": db, "socket_connect_timeout": timeout}
    options.update(credentials(username, password))
    if tls:
        options["ssl"] = True
    pool = SentinelConnectionPool(service, sentinel, **options)  # type: ignore[no-untyped-call]
    return Target(pool, parsed.where, list(sentinel.sentinels))


def describe_pool(pool: aioredis.ConnectionPool) -> str | None:
    """How to show a Sentinel-managed pool (None for any other: shown by its settings)."""
    from redis.asyncio.sentinel import SentinelConnectionPool

    if isinstance(pool, SentinelConnectionPool):
        manager = pool.sentinel_manager
        seeds = ",".join(
            f"{s.connection_pool.connection_kwargs.get('host')}:"
            f"{s.connection_pool.connection_kwargs.get('port')}"
            for s in manager.sentinels
        )
        return f"redis+sentinel://{seeds}/{pool.service_name}"
    return None
