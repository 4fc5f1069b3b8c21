"""Redis Cluster: sharded subscriptions, several masters' connections seen as one.

:class:`ShardedSubscription` looks to :class:`~._subscriber.Subscriber` like one
subscribed connection: ``SUBSCRIBE`` of partition channels becomes
``SSUBSCRIBE`` on the master of each channel's slot (a connection per master),
and the replies and messages of every master come back through one
``read_response``. The control channel is subscribed (plain ``SUBSCRIBE``,
which a cluster broadcasts) on one master; the canary has a channel on each
master (:attr:`ShardedSubscription.canary_channels`) and counts as back only
once it came back from every master. When the topology changes under it (a
master's connection lost, a shard channel unsubscribed by the server because
its slot moved), it fails like a lost connection
(:class:`~._slots.TopologyChanged`): the subscriber renews the whole
subscription from a fresh slot map, then resyncs.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from typing import Any, Final

from redis.exceptions import ResponseError

from ._partitions import SLOTS, _tags, key_slot
from ._slots import SlotMap, TopologyChanged
from ._topology import Address

__all__ = ["ShardedSubscription"]


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
