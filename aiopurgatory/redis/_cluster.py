"""Redis Cluster: the slot map, commands routed per master, and sharded subscriptions.

A :class:`RedisTriggers` on a cluster keeps its design (a connection per job,
every call bounded by ``command_timeout``), with one connection per master for
each job instead of one in all:

* :class:`SlotMap` knows which master serves each of the 16,384 slots (``CLUSTER
  SLOTS``, asked of a known node); it is refreshed whenever a reply or a failure
  says it is out of date (``MOVED``, a master unreachable, a shard channel
  unsubscribed by the server).
* :class:`ClusterLink` has :class:`~._link.Link`'s interface: a round trip of
  commands, each sent to the master of its slot (all of a partition's keys and
  its channel share one slot, so no command spans slots), the masters asked in
  parallel. ``MOVED`` refreshes the map and sends again; ``ASK`` (a slot being
  migrated) sends ``ASKING`` and the command to the importing master;
  ``TRYAGAIN`` waits a little and sends again, all within the call's time.
* :class:`ShardedSubscription` looks to :class:`~._subscriber.Subscriber` like one
  subscribed connection: ``SUBSCRIBE`` of partition channels becomes
  ``SSUBSCRIBE`` on the master of each channel's slot (a connection per master),
  and the replies and messages of every master come back through one
  ``read_response``. The control channel is subscribed (plain ``SUBSCRIBE``,
  which a cluster broadcasts) on one master; the canary has a channel on each
  master (:attr:`ShardedSubscription.canary_channels`) and counts as back only
  once it came back from every master. When the topology changes under it (a
  master's connection lost, a shard channel unsubscribed by the server because
  its slot moved), it fails like a lost connection: the subscriber renews the
  whole subscription from a fresh slot map, then resyncs.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from redis.asyncio.connection import Connection
from redis.exceptions import AskError, ConnectionError, MovedError, ResponseError, TryAgainError

from ._link import Link
from ._partitions import SLOTS, _tags, key_slot

__all__ = [
    "CLUSTER_SCHEMES",
    "ClusterLink",
    "ClusterSeeds",
    "ShardedSubscription",
    "SlotMap",
    "parse_cluster_url",
]

#: URL schemes of a Redis Cluster, and whether they mean TLS.
CLUSTER_SCHEMES: Final = {"redis+cluster": False, "rediss+cluster": True}

Address = tuple[str, int]
# Redirections followed within one call (MOVED, ASK, TRYAGAIN) before giving up.
_REDIRECTIONS: Final = 5


class TopologyChanged(ConnectionError):
    """The cluster's slots moved under a subscription: it is renewed from a fresh map."""


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


class SlotMap:
    """Which master serves each slot, asked of the cluster, refreshed on demand.

    Args:
        seeds: nodes to ask first (the URL's); masters learnt since are asked too.
        connect: makes an unconnected connection to ``(host, port)``.
        timeout: seconds one node may take to answer.
    """

    def __init__(
        self, seeds: Sequence[Address], connect: Callable[[Address], Any], timeout: float
    ) -> None:
        self._seeds = list(seeds)
        self._connect = connect
        self._timeout = timeout
        self._masters: list[Address] = []  # per slot
        self._lock = asyncio.Lock()
        # Nodes that failed us lately: asked last (a hung one costs a timeout).
        self._suspects: dict[Address, None] = {}
        self.stale = True
        self.refreshes = 0

    def master(self, slot: int) -> Address:
        """The master serving ``slot`` (by the last refresh)."""
        return self._masters[slot]

    def masters(self) -> list[Address]:
        """Every master serving slots, in the order of their first slot."""
        return list(dict.fromkeys(self._masters))

    def snapshot(self) -> list[Address]:
        """The master of each slot, as a list that later refreshes do not change."""
        return list(self._masters)

    def first_slot(self, master: Address) -> int:
        """The lowest slot ``master`` serves."""
        return self._masters.index(master)

    def suspect(self, address: Address) -> None:
        """``address`` failed a call: the map is stale, and that node is asked last."""
        self._suspects[address] = None
        self.stale = True

    async def ensure(self) -> None:
        """Refresh the map if it is stale (or was never read)."""
        if self.stale:
            await self.refresh()

    async def refresh(self) -> None:
        """Ask the cluster's nodes in turn for the slot map, until one answers whole.

        Raises:
            redis.exceptions.ConnectionError: no node answered with every slot served.
        """
        async with self._lock:
            if self._masters and not self.stale:
                return  # refreshed by another task meanwhile
            failures: list[str] = []
            candidates = dict.fromkeys([*self.masters(), *self._seeds])
            ordered = [a for a in candidates if a not in self._suspects]
            ordered += [a for a in candidates if a in self._suspects]
            for address in ordered:
                try:
                    masters = await self._ask(address)
                except (OSError, TimeoutError, ConnectionError, ResponseError) as exc:
                    self.suspect(address)
                    failures.append(f"{address[0]}:{address[1]}: {exc}")
                    continue
                self._suspects.pop(address, None)
                if masters is None:
                    failures.append(f"{address[0]}:{address[1]}: not every slot is served")
                    continue
                self._masters = masters
                self.stale = False
                self.refreshes += 1
                return
            raise ConnectionError(
                "no cluster node gave a whole slot map (" + "; ".join(failures[-3:]) + ")"
            )

    async def _ask(self, address: Address) -> list[Address] | None:
        connection = self._connect(address)
        try:
            # A live node answers at once; a hung one must not eat the caller's time.
            async with asyncio.timeout(min(1.0, self._timeout / 3)):
                await connection.connect()
                await connection.send_command("CLUSTER", "SLOTS", check_health=False)
                reply = await connection.read_response(timeout=math.inf)
        finally:
            await connection.disconnect(nowait=True)
        if isinstance(reply, ResponseError):
            raise reply
        masters: list[Address | None] = [None] * SLOTS
        for entry in reply:
            start, end, node = int(entry[0]), int(entry[1]), entry[2]
            host = node[0].decode() if isinstance(node[0], bytes) else str(node[0])
            # An empty or unknown host means "the node you asked".
            where = (host if host not in ("", "?") else address[0], int(node[1]))
            masters[start : end + 1] = [where] * (end + 1 - start)
        if any(m is None for m in masters):
            return None  # a slot without a master (a failover under way): ask another
        return [m for m in masters if m is not None]


def _slot_of(command: Sequence[Any]) -> int | None:
    """The slot a command must go to (None: any master will do)."""
    name = command[0].upper() if isinstance(command[0], str) else command[0].decode().upper()
    if name in ("EVALSHA", "EVAL"):
        return key_slot(command[3]) if int(command[2]) else None
    if name in ("PUBLISH", "SPUBLISH", "MGET", "GET", "SET"):
        return key_slot(command[1])
    if name == "PUBSUB" and len(command) > 2 and _as_bytes(command[1]).upper().startswith(b"SHARD"):
        return key_slot(_as_bytes(command[2]))  # the node of the shard channel's slot
    return None


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")


class ClusterLink:
    """:class:`~._link.Link`'s interface over a cluster: each command to its slot's master.

    Args:
        slots: the shared slot map.
        connect: makes an unconnected connection to ``(host, port)``.
        timeout: seconds a call may take, redirections and reconnects included.
    """

    def __init__(self, slots: SlotMap, connect: Callable[[Address], Any], timeout: float) -> None:
        self._slots = slots
        self._connect = connect
        self._links: dict[Address, Link] = {}
        self.timeout = timeout

    @property
    def connected(self) -> bool:
        """A connection to some master is open."""
        return any(link.connected for link in self._links.values())

    def _link(self, address: Address) -> Link:
        link = self._links.get(address)
        if link is None:
            # A little less than the call's time: a master that hangs fails its
            # part (and is suspected) before the whole call runs out.
            link = self._links[address] = Link(lambda: self._connect(address), self.timeout * 0.8)
        return link

    async def execute(self, *commands: Sequence[Any]) -> list[Any]:
        """Send ``commands`` (each to the master of its slot) and return their replies.

        As :meth:`Link.execute`: error replies are returned, not raised; a
        ``SCRIPT`` command goes to every master (the first master's reply is
        returned); ``MOVED``, ``ASK`` and ``TRYAGAIN`` are followed.

        Raises:
            TimeoutError: no complete answer within ``timeout`` seconds.
            redis.exceptions.ConnectionError, OSError: a master cannot be reached
                (the map is refreshed before the next call).
        """
        try:
            async with asyncio.timeout(self.timeout):
                return await self._execute(commands)
        except TimeoutError:
            self._slots.stale = True
            raise TimeoutError(f"no reply from the cluster within {self.timeout:g} s") from None
        except (OSError, ConnectionError):
            self._slots.stale = True
            raise

    async def _execute(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        slots = self._slots
        await slots.ensure()
        replies: list[Any] = [None] * len(commands)
        # Per command: where it goes, and whether it must be preceded by ASKING.
        todo: dict[int, tuple[Address | None, bool]]
        todo = dict.fromkeys(range(len(commands)), (None, False))
        for attempt in range(_REDIRECTIONS + 1):
            if attempt:
                await slots.ensure()
            groups: dict[Address, list[tuple[int, bool]]] = {}
            broadcast: list[int] = []
            for i, (where, asking) in todo.items():
                command = commands[i]
                if where is None:
                    if _as_bytes(command[0]).upper() == b"SCRIPT":
                        broadcast.append(i)
                        continue
                    slot = _slot_of(command)
                    where = slots.masters()[0] if slot is None else slots.master(slot)
                groups.setdefault(where, []).append((i, asking))
            calls = []
            targets: list[Address] = []
            for where, items in groups.items():
                batch: list[Sequence[Any]] = []
                for i, asking in items:
                    if asking:
                        batch.append(("ASKING",))
                    batch.append(commands[i])
                calls.append(self._link(where).execute(*batch))
                targets.append(where)
            everywhere = slots.masters()
            for i in broadcast:
                calls.extend(self._link(m).execute(commands[i]) for m in everywhere)
                targets += everywhere
            gathered = await asyncio.gather(*calls, return_exceptions=True)
            results: list[list[Any]] = []
            failure: BaseException | None = None
            for where, result in zip(targets, gathered, strict=True):
                if isinstance(result, BaseException):
                    slots.suspect(where)
                    failure = failure or result
                else:
                    results.append(result)
            if failure is not None:
                raise failure
            todo = {}
            retry_later = False
            for (_where, items), result in zip(groups.items(), results, strict=False):
                position = 0
                for i, asking in items:
                    if asking:
                        position += 1  # ASKING's +OK
                    reply = result[position]
                    position += 1
                    if isinstance(reply, MovedError):
                        slots.stale = True
                        todo[i] = (None, False)
                    elif isinstance(reply, AskError):
                        todo[i] = (reply.node_addr, True)
                    elif isinstance(reply, TryAgainError):
                        todo[i] = (None, False)
                        retry_later = True
                    else:
                        replies[i] = reply
            rest = results[len(groups) :]
            for k, i in enumerate(broadcast):
                replies[i] = rest[k * len(everywhere)][0]
            if not todo:
                return replies
            if retry_later:
                await asyncio.sleep(0.05)  # a multi-key command met a slot half migrated
        for i in todo:
            replies[i] = ConnectionError("too many cluster redirections")
        return replies

    async def drop(self) -> None:
        """Close every connection; the next call opens new ones from a fresh map."""
        links, self._links = self._links, {}
        self._slots.stale = True
        for link in links.values():
            await link.drop()


async def _send_each(connection: Any, command: str, channels: list[bytes]) -> None:
    """One command per channel, in one write: shard channels of different slots
    cannot share an SSUBSCRIBE (CROSSSLOT)."""
    packed = connection.pack_commands([(command, channel) for channel in channels])
    await connection.send_packed_command(packed, check_health=False)


_KINDS: Final = {
    b"smessage": b"message",
    b"ssubscribe": b"subscribe",
    b"sunsubscribe": b"unsubscribe",
}


class ShardedSubscription:
    """Several masters' subscribed connections as one (see the module documentation).

    Args:
        slots: the shared slot map.
        connect: makes an unconnected connection to ``(host, port)``.
        control: the control channel (plain SUBSCRIBE, on one master).
        canary: the subscriber's canary channel (name shown to the subscriber).
    """

    def __init__(
        self, slots: SlotMap, connect: Callable[[Address], Any], control: bytes, canary: bytes
    ) -> None:
        self._slots = slots
        self._connect = connect
        self._control = control
        self._canary = canary
        self._connections: dict[Address, Any] = {}
        self._master_of: list[Address] = []  # per slot, as at connect()
        self._delivered: dict[Address, int] = {}  # messages read, per master
        self._readers: list[asyncio.Task[None]] = []
        self._replies: asyncio.Queue[Any] = asyncio.Queue()
        # Per master, its canary channel: tagged into a slot it serves.
        self.canary_channels: list[bytes] = []
        self._canary_of: dict[bytes, Address] = {}
        self._canary_confirmations = 0
        self._canary_back: dict[bytes, set[bytes]] = {}  # message -> channels it came back on
        self._unsubscribing: dict[bytes, int] = {}
        self._pongs_due: dict[int, int] = {}  # probe number -> masters yet to answer
        self._probe = 0
        self.is_connected = False

    async def connect(self) -> None:
        """Read a fresh slot map and connect to every master."""
        slots = self._slots
        slots.stale = True
        await slots.refresh()
        # Routed by the map as it is now, for the life of this subscription (the
        # shared map may be refreshed meanwhile: a channel sent to a master that
        # lost its slot is answered MOVED, which renews the subscription).
        self._master_of = slots.snapshot()
        tags = _tags(SLOTS)
        for master in dict.fromkeys(self._master_of):
            connection = self._connect(master)
            self._connections[master] = connection
            self._delivered[master] = 0
            await connection.connect()
            channel = b"{" + tags[self._master_of.index(master)] + b"}" + self._canary
            self.canary_channels.append(channel)
            self._canary_of[channel] = master
        self.is_connected = True
        for master, connection in self._connections.items():
            self._readers.append(asyncio.create_task(self._read(master, connection)))

    def activity(self) -> tuple[int, ...]:
        """Messages delivered so far by each master (the subscriber's watchdog
        probes when one of them has been silent)."""
        return tuple(self._delivered.values())

    async def _read(self, master: Address, connection: Any) -> None:
        delivered = self._delivered
        try:
            while True:
                reply = await connection.read_response(timeout=math.inf)
                if type(reply) is list and reply and reply[0] in (b"smessage", b"message"):
                    delivered[master] += 1
                self._replies.put_nowait(reply)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._replies.put_nowait(
                exc if isinstance(exc, Exception) else ConnectionError(repr(exc))
            )

    async def send_command(self, name: str, *args: Any, check_health: bool = False) -> None:
        """SUBSCRIBE / UNSUBSCRIBE / PING, each sent where it belongs."""
        masters = self._connections
        if name == "PING":
            self._probe += 1
            self._pongs_due[self._probe] = len(masters)
            for connection in masters.values():
                await connection.send_command("PING", check_health=False)
            return
        plain: list[bytes] = []
        per_master: dict[Address, list[bytes]] = {}
        for channel in args:
            if channel == self._control:
                plain.append(channel)
            elif channel == self._canary:
                for own, master in self._canary_of.items():
                    per_master.setdefault(master, []).append(own)
            else:
                per_master.setdefault(self._master_of[key_slot(channel)], []).append(channel)
        if name == "SUBSCRIBE":
            if plain:
                await next(iter(masters.values())).send_command("SUBSCRIBE", *plain)
            for master, channels in per_master.items():
                await _send_each(masters[master], "SSUBSCRIBE", channels)
        elif name == "UNSUBSCRIBE":
            if plain:
                await next(iter(masters.values())).send_command("UNSUBSCRIBE", *plain)
            for master, channels in per_master.items():
                for channel in channels:
                    self._unsubscribing[channel] = self._unsubscribing.get(channel, 0) + 1
                await _send_each(masters[master], "SUNSUBSCRIBE", channels)
        else:
            raise ValueError(f"not a subscription command: {name}")

    async def read_response(self, timeout: float = math.inf) -> Any:  # noqa: ASYNC109
        """The next reply or message of any master, as one connection would give it."""
        while True:
            reply = await self._replies.get()
            if isinstance(reply, BaseException):
                raise reply
            if isinstance(reply, ResponseError):
                raise reply
            if type(reply) is list and reply and reply[0] == b"pong":
                done = [n for n in self._pongs_due if n <= self._probe]
                if not done:
                    continue
                first = min(done)
                left = self._pongs_due[first] - 1
                if left:
                    self._pongs_due[first] = left
                    continue
                del self._pongs_due[first]
                return reply
            if type(reply) is not list or len(reply) != 3:
                return reply
            kind = _KINDS.get(reply[0], reply[0])
            channel = reply[1]
            if channel in self._canary_of:
                if kind == b"message":
                    back = self._canary_back.setdefault(reply[2], set())
                    back.add(channel)
                    if len(back) < len(self._canary_of):
                        continue
                    del self._canary_back[reply[2]]
                elif kind == b"subscribe":
                    self._canary_confirmations += 1
                    if self._canary_confirmations < len(self._canary_of):
                        continue
                elif kind == b"unsubscribe":
                    raise TopologyChanged("the canary's slot moved")
                return [kind, self._canary, reply[2]]
            if kind == b"unsubscribe" and reply[0] == b"sunsubscribe":
                pending = self._unsubscribing.get(channel, 0)
                if not pending:
                    # Redis ends a shard channel's subscriptions when its slot
                    # leaves the master: renew everything from a fresh map.
                    self._slots.stale = True
                    raise TopologyChanged(f"the server unsubscribed {channel!r:.60} (slot moved)")
                if pending == 1:
                    del self._unsubscribing[channel]
                else:
                    self._unsubscribing[channel] = pending - 1
            return [kind, channel, reply[2]]

    async def disconnect(self, nowait: bool = False) -> None:
        """Close every master's connection (a read waiting fails at once, as on one
        connection closed under it)."""
        self.is_connected = False
        self._replies.put_nowait(ConnectionError("the subscription was closed"))
        readers, self._readers = self._readers, []
        for task in readers:
            task.cancel()
        connections, self._connections = self._connections, {}
        for connection in connections.values():
            await connection.disconnect(nowait=True)
        for task in readers:
            with contextlib.suppress(BaseException):  # cancelled: nothing to keep
                await task
