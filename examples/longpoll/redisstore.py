"""Where the long-poll feed keeps its topics in Redis: one server, Sentinel or a Cluster.

``--redis`` takes three kinds of URL:

* ``redis://[[user]:password@]host[:port][/db]`` (``rediss://`` for TLS): one server;
* ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]``: the
  primary that the sentinels name for ``service`` (the credentials are the data
  servers'; the sentinels are asked without);
* ``redis+cluster://[[user]:password@]host:port[,host:port...]``: a Redis Cluster,
  from any of its nodes (``rediss+sentinel://``, ``rediss+cluster://`` for TLS).

A topic's keys carry one hash tag (``{t:NAME}``), so on a cluster they share a slot
and one script touches them all. The set of topic names (``{prefix}:topics``, for
``max_topics``) is the one key outside a topic's slot: a new topic is added to it by
its own script (:data:`REGISTER`) before its first append.

**Acknowledged means replicated.** With ``replicas`` > 0 (the default on Sentinel and
a cluster: 1), an append is followed, on the same connection, by ``WAIT replicas
timeout``: the POST is acknowledged only when that many replicas have the message,
so the primary's death right after the answer loses nothing acknowledged (the
sentinels and a cluster promote the replica with the most data). When fewer
replicas confirm in time, the message is stored on the primary but not
acknowledged: the POST answers 503, and a retry with the same ``Idempotency-Key``
gets the first offset (and waits for the replicas again), never a second copy.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

__all__ = [
    "APPEND",
    "READ",
    "REGISTER",
    "RedisTarget",
    "append_replicated",
    "close_client",
    "close_sync_client",
    "open_client",
    "parse_redis_url",
    "sync_client",
]

#: KEYS: the topics set. ARGV: name, max_topics.
#: Returns 1 when the topic is known (now or before), 0 when it would be one too many.
REGISTER = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then
  return 1
end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('SADD', KEYS[1], ARGV[1])
return 1
"""

#: KEYS: meta, log, the POST's idempotency record (one topic's keys: one slot).
#: ARGV: body, retain, token ("" for none), the record's TTL in ms.
#: Returns {offset, bytes, 0} once stored; {first offset, bytes now, 1} when the
#: token's record exists (a retry: nothing stored); {-2, 0, 0} when the record was
#: made for another body. (The topic is in the topics set already: REGISTER.)
APPEND = """
local meta, log, record = KEYS[1], KEYS[2], KEYS[3]
local body, token = ARGV[1], ARGV[3]
local retain = tonumber(ARGV[2])
local digest = ''
if token ~= '' then
  digest = redis.sha1hex(body)
  local seen = redis.call('GET', record)
  if seen then
    local sep = string.find(seen, ':', 1, true)
    if string.sub(seen, sep + 1) ~= digest then
      return {-2, 0, 0}
    end
    local total = tonumber(redis.call('HGET', meta, 'bytes')) or 0
    return {tonumber(string.sub(seen, 1, sep - 1)), total, 1}
  end
end
local offset = redis.call('HINCRBY', meta, 'next', 1) - 1
local total = redis.call('HINCRBY', meta, 'bytes', #body)
redis.call('RPUSH', log, string.format('%d:', total) .. body)
local length = redis.call('LLEN', log)
if length >= 2 * retain then
  local drop = length - retain
  redis.call('LTRIM', log, drop, -1)
  redis.call('HINCRBY', meta, 'start', drop)
end
if token ~= '' then
  redis.call('SET', record, string.format('%d:', offset) .. digest, 'PX', ARGV[4])
end
return {offset, total, 0}
"""

#: KEYS: meta, log. ARGV: offset, max_bytes.
#: Returns {start, next, bytes, position of the first message returned, text...}:
#: the messages from max(offset, start) up to max_bytes (at least one); position is
#: the bytes before the first one (``bytes`` when there is none).
READ = """
local meta, log = KEYS[1], KEYS[2]
local offset, max_bytes = tonumber(ARGV[1]), tonumber(ARGV[2])
local m = redis.call('HMGET', meta, 'start', 'next', 'bytes')
local start, last, total = tonumber(m[1]) or 0, tonumber(m[2]) or 0, tonumber(m[3]) or 0
local out = {start, last, total, total}
local first = math.max(offset, start)
if first >= last then
  return out
end
local index, size, taken = first - start, 0, 0
while true do
  local items = redis.call('LRANGE', log, index, index + 63)
  if #items == 0 then
    return out
  end
  for _, item in ipairs(items) do
    local sep = string.find(item, ':', 1, true)
    local text = string.sub(item, sep + 1)
    if taken == 0 then
      out[4] = tonumber(string.sub(item, 1, sep - 1)) - #text
    elseif size + #text > max_bytes then
      return out
    end
    taken = taken + 1
    size = size + #text
    out[4 + taken] = text
  end
  index = index + 64
end
"""

_TOPOLOGIES = {
    "redis": ("server", False),
    "rediss": ("server", True),
    "unix": ("server", False),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
}
_DEFAULT_PORTS = {"sentinel": 26379, "cluster": 6379}


@dataclass(frozen=True)
class RedisTarget:
    """A parsed ``--redis`` URL."""

    topology: str  # "server", "sentinel" or "cluster"
    url: str  # as given (a server's URL goes to redis-py as it is)
    nodes: tuple[tuple[str, int], ...] = ()  # the sentinels, or the cluster's seed nodes
    service: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    ssl_ca_certs: str | None = None

    @property
    def default_replicas(self) -> int:
        """Replicas an append waits for unless told: 1 where a failover can happen."""
        return 0 if self.topology == "server" else 1


def parse_redis_url(url: str) -> RedisTarget:
    """The topology, nodes and credentials of a ``--redis`` URL (see the module's docs).

    Raises:
        ValueError: an unknown scheme, no host, a bad port, a Sentinel URL without a
            service, a cluster URL with a database (a cluster has only 0).
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in _TOPOLOGIES:
        raise ValueError(f"the scheme must be one of {', '.join(_TOPOLOGIES)}://")
    topology, tls = _TOPOLOGIES[scheme]
    if topology == "server":
        return RedisTarget("server", url, tls=tls)
    rest, _, query = rest.partition("?")
    authority, _, path = rest.partition("/")
    userinfo, at, hosts = authority.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = urllib.parse.unquote(user) or None
        password = urllib.parse.unquote(secret) if colon else None
    nodes = []
    for item in hosts.split(","):
        host, colon, port = item.rpartition(":")
        if not colon:
            host, port = item, str(_DEFAULT_PORTS[topology])
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{item!r} is not host:port")
        nodes.append((host.strip("[]"), int(port)))
    parts = [part for part in path.split("/") if part]
    service = None
    db = 0
    if topology == "sentinel":
        if not parts:
            raise ValueError("a redis+sentinel URL names its service: .../SERVICE[/DB]")
        service = urllib.parse.unquote(parts[0])
        parts = parts[1:]
    if parts:
        if len(parts) > 1 or not parts[0].isdigit():
            raise ValueError(f"{path!r} is not a database number")
        db = int(parts[0])
        if topology == "cluster" and db != 0:
            raise ValueError("a Redis Cluster has database 0 only")
    options = urllib.parse.parse_qs(query)
    unknown = set(options) - {"ssl_ca_certs"}
    if unknown:
        raise ValueError(f"unknown URL options: {', '.join(sorted(unknown))}")
    ca = options.get("ssl_ca_certs", [None])[-1]
    return RedisTarget(topology, url, tuple(nodes), service, db, username, password, tls, ca)


def _connection_options(target: RedisTarget, timeout: float) -> dict[str, Any]:
    options: dict[str, Any] = {
        "username": target.username,
        "password": target.password,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
    }
    if target.tls:
        options["ssl"] = True
        if target.ssl_ca_certs:
            options["ssl_ca_certs"] = target.ssl_ca_certs
    return options


def open_client(target: RedisTarget, *, timeout: float, max_connections: int) -> Any:
    """redis-py's asyncio client of the target: a ``Redis`` on a blocking pool (one
    server), a Sentinel-managed ``Redis`` (its primary), or a ``RedisCluster``.

    No retries inside redis-py on one server or Sentinel: the feed retries itself, once,
    what may run twice. A cluster client follows MOVED/ASK redirections and refreshes
    its slot map after a failover by itself.
    """
    if target.topology == "server":
        pool = aioredis.BlockingConnectionPool.from_url(
            target.url,
            max_connections=max_connections,
            timeout=timeout,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        return aioredis.Redis.from_pool(pool)
    options = _connection_options(target, timeout)
    if target.topology == "sentinel":
        assert target.service is not None
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(target.nodes),
            sentinel_kwargs={"socket_timeout": timeout, "socket_connect_timeout": timeout},
            **options,
        )
        return sentinel.master_for(
            target.service,
            db=target.db,
            max_connections=max_connections,
            retry=Retry(NoBackoff(), 0),
        )
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
        max_connections=max_connections,
        **options,
    )


def sync_client(target: RedisTarget, *, timeout: float) -> Any:
    """redis-py's blocking client of the target, for the check before the server starts."""
    import redis
    import redis.cluster
    import redis.sentinel

    if target.topology == "server":
        return redis.Redis.from_url(
            target.url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=None
        )
    options = _connection_options(target, timeout)
    if target.topology == "sentinel":
        assert target.service is not None
        sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.nodes),
            sentinel_kwargs={"socket_timeout": timeout, "socket_connect_timeout": timeout},
            **options,
        )
        return sentinel.master_for(target.service, db=target.db)  # type: ignore[no-untyped-call]
    return redis.cluster.RedisCluster(
        startup_nodes=[
            redis.cluster.ClusterNode(host, port)  # type: ignore[no-untyped-call]
            for host, port in target.nodes
        ],
        **options,
    )


def _sentinels(client: Any) -> list[Any]:
    """The clients of the sentinels behind a Sentinel-managed client (none otherwise)."""
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    return list(manager.sentinels) if manager is not None else []


async def close_client(client: Any) -> None:
    """Close a client of :func:`open_client`, and the sentinels' connections behind it."""
    await client.aclose()
    for sentinel in _sentinels(client):
        await sentinel.aclose()


def close_sync_client(client: Any) -> None:
    """Close a client of :func:`sync_client`, and the sentinels' connections behind it."""
    client.close()
    for sentinel in _sentinels(client):
        sentinel.close()


async def append_replicated(
    client: Any,
    script: str,
    keys: list[str],
    args: list[Any],
    *,
    replicas: int,
    replica_timeout: float,
) -> tuple[list[Any], int]:
    """Run the append ``script`` and, on the same connection, ``WAIT replicas`` (when
    ``replicas`` > 0): WAIT counts the replicas that have this connection's writes.

    Returns:
        The script's reply and how many replicas confirmed (``replicas`` when none
        were asked for).
    """
    if replicas <= 0:
        reply: list[Any] = await client.eval(script, len(keys), *keys, *args)
        return reply, 0
    pipe = client.pipeline(transaction=False)
    pipe.eval(script, len(keys), *keys, *args)
    wait = ("WAIT", replicas, max(1, round(replica_timeout * 1000)))
    if isinstance(client, RedisCluster):
        await client.initialize()  # its slot map (a no-op once made)
        # A pipeline sends each node's commands on one connection: WAIT goes to the
        # node of the topic's slot, after the script.
        pipe.execute_command(*wait, target_nodes=client.get_node_from_key(keys[0]))
    else:
        pipe.execute_command(*wait)
    reply, confirmed = await pipe.execute()
    return reply, int(confirmed)
