"""In-process follower replicas: asyncio tasks that fetch from the leader like real followers.

Each follower is one task replicating every partition (as a Kafka follower broker
runs one fetcher per leader). A round is: send a replica fetch carrying the
follower's log end offset per partition (this is how the leader learns what the
follower has, and what moves the high watermark), wait in the leader's replica
fetch purgatory until there is data, sleep ``lag`` seconds (simulated replication
latency), then take the fetched batches as appended. The admin hooks on
:class:`Follower` stall it (no more fetches; it stays in the ISR until
``replica_lag_time_max``), crash it (task gone, out of the ISR at once), and
restart or resume it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .partition import TopicPartition
from .records import next_offset_after

__all__ = ["Follower", "ReplicaFetch"]

#: ``(follower_id, offsets) -> fetched bytes per partition``: the leader's replica fetch.
ReplicaFetch = Callable[[int, dict[TopicPartition, int]], Awaitable[dict[TopicPartition, bytes]]]


class Follower:
    """A follower replica (node id >= 1) of every partition of the broker.

    Args:
        follower_id: its node id.
        fetch: the leader's replica fetch entry point.
        lag: seconds between receiving batches and counting them as replicated.
    """

    def __init__(self, follower_id: int, fetch: ReplicaFetch, lag: float) -> None:
        self.id = follower_id
        self.lag = lag
        #: This replica's log end offset per partition (what it has replicated).
        self.offsets: dict[TopicPartition, int] = {}
        self._fetch = fetch
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._task: asyncio.Task[None] | None = None
        self.fetches = 0
        # Partitions deleted during the current round: what it fetched of them is stale.
        self._forgotten: set[TopicPartition] = set()

    def __repr__(self) -> str:
        return f"<Follower {self.id} {self.state}>"

    @property
    def state(self) -> str:
        """``running``, ``stalled`` or ``crashed``."""
        if self._task is None or self._task.done():
            return "crashed"
        return "running" if self._resumed.is_set() else "stalled"

    def start(self) -> None:
        """Start (or restart after a crash) the replication task on the running loop."""
        if self._task is None or self._task.done():
            self._resumed.set()
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"broker-follower-{self.id}"
            )

    def stall(self) -> None:
        """Stop fetching after the current round (the leader hears nothing more)."""
        self._resumed.clear()

    def resume(self) -> None:
        """Resume fetching after :meth:`stall`."""
        self._resumed.set()

    async def crash(self) -> None:
        """Kill the task (a fetch parked in the leader's purgatory is cancelled with it)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            # wait() does not raise the task's CancelledError (nor swallow ours).
            await asyncio.wait([task])

    def forget(self, tps: set[TopicPartition]) -> None:
        """Drop deleted partitions (a topic recreated under the same name starts empty)."""
        for tp in tps:
            self.offsets.pop(tp, None)
        self._forgotten |= tps

    async def _run(self) -> None:
        while True:
            await self._resumed.wait()
            self._forgotten.clear()
            fetched = await self._fetch(self.id, self.offsets)
            self.fetches += 1
            if not any(fetched.values()):
                continue
            if self.lag > 0:
                await asyncio.sleep(self.lag)
            for tp, data in fetched.items():
                if tp in self._forgotten:
                    continue
                end = next_offset_after(data)
                if end > self.offsets.get(tp, 0):
                    self.offsets[tp] = end
