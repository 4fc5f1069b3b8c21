"""Redis Cluster: which master serves each of the 16,384 slots, refreshed on demand.

:class:`SlotMap` asks a known node (``CLUSTER SLOTS``: the URL's seeds, and the
masters learnt since; nodes that failed lately are asked last) and is refreshed
whenever a reply or a failure says it is out of date (``MOVED``, a master
unreachable, a shard channel unsubscribed by the server). One map is shared by
every job's connections (:class:`~._cluster.ClusterLink`,
:class:`~._sharded.ShardedSubscription`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import ConnectionError, ResponseError

from ._partitions import SLOTS
from ._topology import Address

__all__ = ["SlotMap", "TopologyChanged"]


class TopologyChanged(ConnectionError):
    """The cluster's slots moved under a subscription: it is renewed from a fresh map."""


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
