"""Where the connections go: one server, the primary a set of Sentinels names, a cluster.

One dispatch for both sides: :func:`locate` parses a URL once into a
:class:`Location` (its :class:`Topology`, what to show, the password to keep out
of every text), which ``RedisTriggers`` (asyncio, :func:`target_for`) and
``SyncPublisher`` (redis-py's sync client) both start from; a Sentinel's
settings are built once (:func:`sentinel_settings`) for either client.

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
  for TLS): no pool, the seed nodes and the settings (:func:`parse_cluster_url`;
  the connections are :mod:`._cluster`'s and :mod:`._sharded`'s).
* A ``redis.asyncio.Redis`` client: its pool (a Sentinel-managed client's is a
  ``SentinelConnectionPool``, which works the same way).
"""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.connection import Connection

from ._redact import Redactor, describe_url, url_password

__all__ = [
    "CLUSTER_SCHEMES",
    "Address",
    "ClusterSeeds",
    "Location",
    "SentinelURL",
    "Target",
    "Topology",
    "credentials",
    "describe_pool",
    "locate",
    "nodes_url",
    "parse_cluster_url",
    "parse_sentinel_url",
    "seeds_of_client",
    "sentinel_settings",
    "shown_auth",
    "target_for",
]

_SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}

#: URL schemes of a Redis Cluster, and whether they mean TLS.
CLUSTER_SCHEMES: Final = {"redis+cluster": False, "rediss+cluster": True}

Address = tuple[str, int]


@dataclass
class ClusterSeeds:
    """What a cluster URL or client says: seed nodes and the connections' settings."""

    seeds: list[Address]
    options: dict[str, Any] = field(default_factory=dict)
    where: str = ""


def nodes_url(url: str, what: str) -> tuple[str | None, str | None, list[Address], str]:
    """The user, the password, the ``host:port`` list and the path of a URL naming
    several nodes (a cluster's seeds, a set of sentinels).

    Raises:
        ValueError: a node is not ``host:port`` (``what`` names it).
    """
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    username = password = None
    if len(netloc) == 2:
        user, _, secret = netloc[0].partition(":")
        username = unquote(user) or None
        password = unquote(secret) if secret else None
    nodes: list[Address] = []
    for item in netloc[-1].split(","):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{what} must be host:port, got {item!r}")
        nodes.append((host.strip("[]"), int(port)))
    return username, password, nodes, parts.path + ("?" + parts.query if parts.query else "")


def shown_auth(username: str | None, password: str | None) -> str:
    """The credentials part of a URL as shown (the password never)."""
    return f"{username or ''}:***@" if password else (f"{username}@" if username else "")


def credentials(username: str | None, password: str | None) -> dict[str, Any]:
    """The connection settings a URL's user and password make (only those it gives)."""
    options: dict[str, Any] = {}
    if username is not None:
        options["username"] = username
    if password is not None:
        options["password"] = password
    return options


def parse_cluster_url(url: str) -> ClusterSeeds:
    """``redis+cluster://[[user]:password@]host:port[,host:port...]`` (``rediss+`` for TLS).

    Raises:
        ValueError: not such a URL (the message never holds the password).
    """
    scheme = url.split("://", 1)[0].lower()
    tls = CLUSTER_SCHEMES[scheme]
    username, password, seeds, rest = nodes_url(url, "a cluster node")
    if rest.strip("/"):
        raise ValueError(
            "a cluster URL names nodes only (a cluster has one database): "
            "redis+cluster://host:port[,host:port...]"
        )
    options = credentials(username, password)
    if tls:
        from redis.asyncio.connection import SSLConnection

        options["connection_class"] = SSLConnection
    nodes = ",".join(f"{host}:{port}" for host, port in seeds)
    return ClusterSeeds(seeds, options, f"{scheme}://{shown_auth(username, password)}{nodes}")


def seeds_of_client(client: Any) -> ClusterSeeds:
    """The seeds and settings of a ``redis.asyncio.cluster.RedisCluster`` (not used otherwise)."""
    manager = client.nodes_manager
    seeds: dict[Address, None] = {}
    for node in (*manager.startup_nodes.values(), *manager.nodes_cache.values()):
        seeds[(node.host, int(node.port))] = None
    given = client.get_connection_kwargs()
    connection_class = given.get("connection_class") or Connection
    # Only what a connection takes (the client's own settings, max_connections
    # say, are not the connections').
    accepted = {
        name
        for cls in connection_class.__mro__
        if "__init__" in vars(cls)
        for name in inspect.signature(vars(cls)["__init__"]).parameters
    }
    options = {
        k: v
        for k, v in given.items()
        if k in accepted and k not in ("host", "port", "redis_connect_func")
    }
    options["connection_class"] = connection_class
    nodes = ",".join(f"{host}:{port}" for host, port in seeds)
    tls = "SSL" in getattr(options.get("connection_class"), "__name__", "")
    return ClusterSeeds(list(seeds), options, f"{'rediss' if tls else 'redis'}+cluster://{nodes}")


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


class Topology(enum.Enum):
    """What a URL names."""

    #: One server (``redis://``, ``rediss://``, ``unix://``).
    SINGLE = "single"
    #: The primary a set of Sentinels names (``redis+sentinel://``, ``rediss+sentinel://``).
    SENTINEL = "sentinel"
    #: A Redis Cluster, by some of its nodes (``redis+cluster://``, ``rediss+cluster://``).
    CLUSTER = "cluster"


@dataclass(frozen=True)
class Location:
    """A URL parsed once, for the async and the sync side alike (:func:`locate`).

    Attributes:
        url: the URL as given.
        topology: what it names.
        where: how to show it (the password hidden).
        redactor: keeps its password out of every text.
        sentinel: the sentinels, service and database (``SENTINEL`` only).
        cluster: the seed nodes and settings (``CLUSTER`` only).
    """

    url: str
    topology: Topology
    where: str
    redactor: Redactor
    sentinel: SentinelURL | None = None
    cluster: ClusterSeeds | None = None

    def unusable(self, exc: BaseException) -> ValueError:
        """The ValueError for a URL a client refused (``exc``), the password hidden."""
        return ValueError(f"url_or_client: not a usable Redis URL ({self.redactor.error(exc)})")


def locate(url: str) -> Location:
    """What ``url`` names (see the module documentation).

    Raises:
        ValueError: a Sentinel or cluster URL that cannot be used (the message
            never holds the password). A plain URL is checked by the client
            made from it (:meth:`Location.unusable`).
    """
    redactor = Redactor(url_password(url))
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    try:
        if scheme in _SENTINEL_SCHEMES:
            parsed = parse_sentinel_url(url)
            return Location(url, Topology.SENTINEL, parsed.where, redactor, sentinel=parsed)
        if scheme in CLUSTER_SCHEMES:
            seeds = parse_cluster_url(url)
            return Location(url, Topology.CLUSTER, seeds.where, redactor, cluster=seeds)
    except ValueError as exc:
        raise ValueError(f"url_or_client: not a usable Redis URL ({redactor.error(exc)})") from None
    return Location(url, Topology.SINGLE, describe_url(url), redactor)


def sentinel_settings(parsed: SentinelURL, timeout: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """How to reach ``parsed``'s sentinels, and its primary, on either side.

    Returns:
        The sentinels' client settings (each asked within ``timeout`` seconds,
        without a password: the URL's is the data servers'), and the primary's
        connection settings (database, credentials, TLS, the connect bounded by
        ``timeout``), to which each side adds its own.
    """
    sentinels = {"socket_connect_timeout": timeout, "socket_timeout": timeout}
    primary: dict[str, Any] = {"db": parsed.db, "socket_connect_timeout": timeout}
    primary.update(credentials(parsed.username, parsed.password))
    if parsed.tls:
        primary["ssl"] = True
    return sentinels, primary


def target_for(location: Location, timeout: float) -> Target:
    """The pool (asyncio) for ``location`` (see the module documentation).

    Raises:
        ValueError: a URL redis-py refuses (the message never holds the password).
    """
    if location.topology is Topology.CLUSTER:
        return Target(None, location.where, cluster=location.cluster)
    if location.topology is Topology.SENTINEL:
        assert location.sentinel is not None
        return _sentinel(location.sentinel, timeout)
    try:
        pool = aioredis.ConnectionPool.from_url(location.url, socket_connect_timeout=timeout)
    except ValueError as exc:
        raise location.unusable(exc) from None
    return Target(pool, location.where)


def _sentinel(parsed: SentinelURL, timeout: float) -> Target:
    from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

    sentinels, primary = sentinel_settings(parsed, timeout)
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        parsed.hosts, sentinel_kwargs=sentinels, socket_connect_timeout=timeout
    )
    pool = SentinelConnectionPool(parsed.service, sentinel, **primary)  # type: ignore[no-untyped-call]
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
