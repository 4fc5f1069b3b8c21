"""``bench parked``: what one parked request costs, the library against hand-written code.

``waits`` requests are parked at once on ``keys`` keys with a ``timeout`` (s) that
never passes during the run (a long-poll or job-wait server holding its clients),
in four ways:

- ``callback``: :meth:`Purgatory.try_complete_else_watch` of an operation, no task;
- ``hand-callback``: the same without the library: an asyncio Future, a
  ``loop.call_later`` timeout and a dict of lists of waiters per key;
- ``awaited``: a task per request awaiting ``purgatory.watch(op, [key])``;
- ``hand-awaited``: a task per request awaiting a Future put in a dict of lists,
  with a ``call_later`` timeout cancelled in ``finally``.

Measured, each run in a fresh process: resident memory per wait (RSS growth over
the parking, divided by ``waits``; RSS, not ``tracemalloc``, which would slow the
parking and miss what the allocator keeps), CPU to park one (``process_time``
from creating the first to the last one parked, the collector enabled as in a
server), the growth of ``len(gc.get_objects())`` (objects the cyclic collector
tracks), and the wall time of one full ``gc.collect()`` with all of them parked;
then the same collection after ``gc.freeze()`` (what a server can do once its
waits are long-lived: see docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

from ._common import Result, Spec, peak_rss_mib, rss_mib, run_on
from ._registry import register

__all__ = ["DEFAULTS", "IMPLS", "run_parked", "run_spec"]

IMPLS = {
    "callback": "callback: try_complete_else_watch",
    "hand-callback": "hand-written callback",
    "awaited": "awaited: await watch()",
    "hand-awaited": "hand-written awaited",
}

DEFAULTS: dict[str, Any] = {"waits": 100_000, "keys": 1000, "timeout": 3600.0}


def _expire(fut: asyncio.Future[Any]) -> None:  # pragma: no cover - never fires in a run
    if not fut.done():
        fut.set_result(False)


async def _hand_awaited(
    loop: asyncio.AbstractEventLoop, waiters: dict[int, list[Any]], key: int, seconds: float
) -> bool:
    fut = loop.create_future()
    waiters.setdefault(key, []).append(fut)
    handle = loop.call_later(seconds, _expire, fut)
    try:
        result: bool = await fut
        return result
    finally:
        handle.cancel()


async def _awaited(purgatory: Any, op: Any, key: int) -> Any:
    return await purgatory.watch(op, [key])


async def _workload(impl: str, waits: int, keys: int, seconds: float) -> Result:
    import aiopurgatory as ap

    class Parked(ap.DelayedOperation):
        __slots__ = ()

        def try_complete(self) -> bool:
            return False

    loop = asyncio.get_running_loop()
    purgatory: Any = ap.Purgatory("parked") if impl in ("callback", "awaited") else None
    waiters: dict[int, list[Any]] = {}
    kept: list[Any] = []  # the callback styles' handles: a server keeps its requests
    await asyncio.sleep(0)
    gc.collect()
    objects0 = len(gc.get_objects())
    rss0 = rss_mib()
    cpu0 = time.process_time()
    if impl == "callback":
        for i in range(waits):
            op = Parked(seconds)
            purgatory.try_complete_else_watch(op, [i % keys])
            kept.append(op)
    elif impl == "hand-callback":
        for i in range(waits):
            fut = loop.create_future()
            waiters.setdefault(i % keys, []).append(fut)
            loop.call_later(seconds, _expire, fut)
            kept.append(fut)
    elif impl == "awaited":
        kept += [
            loop.create_task(_awaited(purgatory, Parked(seconds), i % keys)) for i in range(waits)
        ]
    else:
        kept += [
            loop.create_task(_hand_awaited(loop, waiters, i % keys, seconds)) for i in range(waits)
        ]
    # The tasks' first steps are queued before this wake-up: one iteration parks them all.
    await asyncio.sleep(0)
    cpu = time.process_time() - cpu0
    rss1 = rss_mib()
    objects1 = len(gc.get_objects())
    if impl == "awaited":
        if purgatory.watched != waits:
            raise RuntimeError(f"{purgatory.watched} of {waits} waits parked")
    elif impl == "hand-awaited" and sum(map(len, waiters.values())) != waits:
        raise RuntimeError("not every hand-written wait parked")
    t0 = time.perf_counter()
    gc.collect()
    collect = time.perf_counter() - t0
    gc.freeze()
    t0 = time.perf_counter()
    gc.collect()
    collect_frozen = time.perf_counter() - t0
    gc.unfreeze()
    result = {
        "waits": waits,
        "keys": keys,
        "rss_per_wait_bytes": (rss1 - rss0) * 1024 * 1024 / waits,
        "cpu_us_per_wait": cpu / waits * 1e6,
        "gc_objects": objects1 - objects0,
        "gc_objects_per_wait": (objects1 - objects0) / waits,
        "collect_ms": collect * 1e3,
        "collect_frozen_ms": collect_frozen * 1e3,
        "peak_rss_mib": peak_rss_mib(),
    }
    # Leave quickly: end the waits without a million cancellations at loop close.
    if purgatory is not None:
        purgatory.close(expire_pending=True)
        await asyncio.sleep(0)
    if purgatory is None:
        for fut in kept:
            fut.cancel()
    await asyncio.sleep(0)
    return result


def run_parked(
    impl: str,
    loop: str = "asyncio",
    *,
    waits: int = DEFAULTS["waits"],
    keys: int = DEFAULTS["keys"],
    timeout: float = DEFAULTS["timeout"],
) -> Result:
    """Park ``waits`` requests once, in this process, and return the measurements.

    Args:
        impl: one of :data:`IMPLS`.
        loop: ``"asyncio"``, ``"uvloop"`` or ``"virtual"``.
        waits: requests parked at once; at least 1.
        keys: keys they are spread over (round robin); at least 1.
        timeout: their timeout in seconds; above 60 (it must not pass during the run).

    Raises:
        ValueError: an unknown name or an out-of-range number.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if waits < 1:
        raise ValueError(f"waits must be at least 1, got {waits}")
    if keys < 1:
        raise ValueError(f"keys must be at least 1, got {keys}")
    if not timeout > 60.0:
        raise ValueError(f"timeout must be above 60 s (it must not pass), got {timeout}")
    result = run_on(loop, lambda: _workload(impl, waits, keys, timeout))
    result.update(impl=IMPLS[impl], loop=loop)
    return result


def run_spec(spec: Spec) -> Result:
    """Run a ``{"bench": "parked", "impl", "loop", "params"}`` spec."""
    return run_parked(spec["impl"], spec["loop"], **spec.get("params", {}))


register("parked", run_spec)
