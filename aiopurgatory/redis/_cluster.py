"""Redis Cluster: commands routed per master (:class:`ClusterLink`).

A :class:`RedisTriggers` on a cluster keeps its design (a connection per job,
every call bounded by ``command_timeout``), with one connection per master for
each job instead of one in all. :class:`ClusterLink` follows
:class:`~._link.CommandLink` as :class:`~._link.Link` does: a round trip of
commands, each sent to the master of its slot by the shared
:class:`~._slots.SlotMap` (all of a partition's keys and its channel share one
slot, so no command spans slots), the masters asked in parallel. ``MOVED``
refreshes the map and sends again; ``ASK`` (a slot being migrated) sends
``ASKING`` and the command to the importing master; ``TRYAGAIN`` waits a little
and sends again, all within the call's time.

The cluster's other parts have modules of their own: its URLs and a client's
seeds (:mod:`._topology`), the slot map (:mod:`._slots`), sharded subscriptions
(:mod:`._sharded`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Final

from redis.exceptions import AskError, ConnectionError, MovedError, TryAgainError

from ._link import Link
from ._partitions import key_slot
from ._slots import SlotMap
from ._topology import Address

__all__ = ["ClusterLink"]

# Redirections followed within one call (MOVED, ASK, TRYAGAIN) before giving up.
_REDIRECTIONS: Final = 5


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
