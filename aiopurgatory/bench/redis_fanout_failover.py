"""``aiopurgatory bench redis-fanout --failover N``: time from a failover to delivery resumed.

On a real 3-master/3-replica Redis Cluster (``--topology cluster``) or a
Sentinel set-up (``--topology sentinel``: a primary, a replica, 3 sentinels),
started with the test harness ``tests/support/redis_cluster.py`` (so only from a
source checkout), each of N repetitions:

1. a publisher (a publisher-only ``RedisTriggers``) advances one key every 10 ms
   (on a cluster, a key whose partition lives on the master about to die), and
   a subscriber (another ``RedisTriggers`` with a purgatory) completes an
   operation parked on it: traffic flows;
2. the publisher pauses and flushes, the master (or the primary) is SIGKILLed,
   and as soon as its process is gone the publisher goes on advancing (its sends
   fail and are retried until the promoted replica answers);
3. an operation parked at the first value advanced after the kill completes: the
   time from the kill to that completion is the figure (it includes the
   promotion itself, which the server's timeouts decide: ``cluster-node-timeout``
   1500 ms, ``down-after-milliseconds`` 1000 ms here);
4. the killed server is started again (it rejoins as a replica) before the next
   repetition.

Both ``RedisTriggers`` use ``reconnect_delay=(0.05, 1.0)``, as the failover tests do.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["failover_times", "summary"]

#: The publisher's pace: one advance per this many seconds.
PACE = 0.01


def _harness(root: Path) -> Any:
    """The test harness module (tests/support/redis_cluster.py) of the checkout ``root``."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from tests.support import redis_cluster

    return redis_cluster


async def _one(
    url: str, channel: str, key: str, kill: Callable[[], None], gone: Callable[[], bool]
) -> float:
    import aiopurgatory as ap
    from aiopurgatory.redis import RedisTriggers

    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("failover")
    delays = (0.05, 1.0)
    async with (
        RedisTriggers(purgatory, url, channel=channel, reconnect_delay=delays) as sub,
        RedisTriggers(None, url, channel=channel, reconnect_delay=delays) as pub,
    ):
        value = 0
        flowing = asyncio.Event()
        flowing.set()

        async def publish() -> None:
            nonlocal value
            while True:
                await flowing.wait()
                value += 1
                pub.advance(key, value)
                await asyncio.sleep(PACE)

        publisher = asyncio.create_task(publish())
        try:
            steady = ap.WatermarkOperation(30)
            outcome = await sub.watch(steady, {key: value + 5})
            if outcome is not ap.Outcome.COMPLETED:
                raise RuntimeError(f"no delivery before the failover: {outcome}")
            flowing.clear()
            await asyncio.wait_for(pub.flush(), 10)
            last = value  # published and delivered before the kill
            op = ap.WatermarkOperation(60)
            resumed = asyncio.ensure_future(sub.watch(op, {key: last + 1}))
            killed_at = time.monotonic()
            killing = asyncio.ensure_future(asyncio.to_thread(kill))
            # Nothing advanced after `last` may reach the dead master (a process's
            # end has no event to await: polled).
            while not gone():  # noqa: ASYNC110
                await asyncio.sleep(0.001)
            flowing.set()
            outcome = await resumed
            took = time.monotonic() - killed_at
            if outcome is not ap.Outcome.COMPLETED:
                raise RuntimeError(f"delivery did not resume within 60 s: {outcome}")
            await killing  # the harness saw the promotion
            return took
        finally:
            publisher.cancel()
            await asyncio.gather(publisher, return_exceptions=True)


def failover_times(topology: str, repetitions: int, directory: Path, root: Path) -> list[float]:
    """Seconds from a master's (``cluster``) or the primary's (``sentinel``) SIGKILL to
    the first operation completed by a trigger advanced after it, per repetition."""
    from aiopurgatory.redis import DEFAULT_PARTITIONS
    from aiopurgatory.redis._partitions import Partitions, key_slot

    harness = _harness(root)
    times: list[float] = []
    if topology == "cluster":
        with harness.ClusterServers(directory / "cluster") as cluster:
            for repetition in range(repetitions):
                channel = f"failover-{repetition}"
                victim = cluster.masters()[0].port
                partitions = Partitions(channel, DEFAULT_PARTITIONS)
                key = next(
                    k
                    for k in (f"key-{i}" for i in range(100_000))
                    if cluster.master_of_slot(key_slot(partitions.channel(k))).port == victim
                )
                server = cluster.servers[victim]
                times.append(
                    asyncio.run(
                        _one(
                            cluster.url,
                            channel,
                            key,
                            lambda v=victim: cluster.kill_master(v),  # type: ignore[misc]
                            lambda s=server: not s.running,  # type: ignore[misc]
                        )
                    )
                )
                cluster.heal()
    elif topology == "sentinel":
        with harness.SentinelServers(directory / "sentinel") as setup:
            for repetition in range(repetitions):
                server = setup.primary()
                times.append(
                    asyncio.run(
                        _one(
                            setup.url,
                            f"failover-{repetition}",
                            "key",
                            setup.kill_primary,
                            lambda s=server: not s.running,  # type: ignore[misc]
                        )
                    )
                )
                setup.heal()
    else:
        raise ValueError(f"topology must be cluster or sentinel, got {topology!r}")
    return times


def summary(topology: str, times: list[float]) -> dict[str, Any]:
    """The report's row for ``times`` (seconds)."""
    return {
        "topology": topology,
        "repetitions": len(times),
        "seconds": times,
        "median_s": statistics.median(times),
        "max_s": max(times),
    }
