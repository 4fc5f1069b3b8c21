"""``bench scale``: cost of add+cancel as the number of pending timers grows.

First ``pending`` long-lived timers are scheduled (delays uniform in
[``prefill_min``, 2 * ``prefill_min``) s, e.g. idle or session timeouts that rarely
fire); then ``ops`` short timers (delays uniform in [0, 1) s) are each added and
cancelled at once, in batches of ``batch`` with a loop iteration in between.

New timers are shorter than the pending ones, as in a server where request
timeouts come and go among long-lived connection timers: in a binary heap each
push then sifts up to the root, O(log pending), and asyncio's cancelled handles
stay in the heap until they are more than half of it. A timing wheel touches one
bucket whatever is pending.

Measured: CPU per add+cancel (``process_time`` over the batches and the loop
iterations between them, which is where asyncio cleans its heap), resident
memory per pending timer (RSS growth over the prefill, divided by ``pending``)
and, with ``trace_memory``, the bytes ``tracemalloc`` sees per pending timer.
"""

from __future__ import annotations

import asyncio
import random
import time
import tracemalloc
from typing import Any

from ._common import Result, Spec, peak_rss_mib, rss_mib, run_on
from ._registry import register

__all__ = ["IMPLS", "run_scale", "run_spec"]

IMPLS = {"ap": "ap.Timer", "loop": "loop.call_later"}

DEFAULTS: dict[str, Any] = {
    "pending": 1000,
    "ops": 200_000,
    "batch": 1000,
    "prefill_min": 60.0,
    "trace_memory": False,
    "seed": 1,
}


def _noop(*args: Any) -> None:  # pragma: no cover - never fires during a run
    pass


async def _workload(
    impl: str,
    pending: int,
    ops: int,
    batch: int,
    prefill_min: float,
    trace_memory: bool,
    seed: int,
) -> Result:
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    long_delays = [prefill_min * (1.0 + rng.random()) for _ in range(pending)]
    short_delays = [rng.random() for _ in range(ops)]
    timer: Any = None
    if impl == "ap":
        import aiopurgatory as ap

        timer = ap.Timer()
        call_later: Any = timer.call_later
    else:
        call_later = loop.call_later
    handles: list[Any] = [None] * pending

    rss0 = rss_mib()
    if trace_memory:
        tracemalloc.start()
    traced0 = tracemalloc.get_traced_memory()[0] if trace_memory else 0
    for i in range(pending):
        handles[i] = call_later(long_delays[i], _noop)
    traced = tracemalloc.get_traced_memory()[0] - traced0 if trace_memory else 0
    if trace_memory:
        tracemalloc.stop()
    rss1 = rss_mib()
    await asyncio.sleep(0)

    cpu0 = time.process_time()
    for start in range(0, ops, batch):
        for i in range(start, min(start + batch, ops)):
            call_later(short_delays[i], _noop).cancel()
        await asyncio.sleep(0)
    cpu = time.process_time() - cpu0

    for handle in handles:
        handle.cancel()
    return {
        "pending": pending,
        "ops": ops,
        "cpu_s": cpu,
        "cpu_ns_per_op": cpu / ops * 1e9 if ops else 0.0,
        # tracemalloc's own bookkeeping would inflate the RSS growth.
        "rss_per_pending_bytes": (rss1 - rss0) * 1024 * 1024 / pending
        if pending and not trace_memory
        else None,
        "traced_per_pending_bytes": traced / pending if trace_memory and pending else None,
        "peak_rss_mib": peak_rss_mib(),
    }


def run_scale(
    impl: str,
    loop: str = "asyncio",
    *,
    pending: int = DEFAULTS["pending"],
    ops: int = DEFAULTS["ops"],
    batch: int = DEFAULTS["batch"],
    prefill_min: float = DEFAULTS["prefill_min"],
    trace_memory: bool = DEFAULTS["trace_memory"],
    seed: int = DEFAULTS["seed"],
) -> Result:
    """Run the scaling workload once, in this process, and return its measurements.

    Args:
        impl: ``"ap"`` (``ap.Timer``) or ``"loop"`` (``loop.call_later``).
        loop: ``"asyncio"``, ``"uvloop"`` or ``"virtual"``.
        pending: long-lived timers pending while measuring.
        ops: short timers added and cancelled.
        batch: add+cancels per loop iteration.
        prefill_min: the pending timers' delays are uniform in [prefill_min, 2 * prefill_min) s.
        trace_memory: also measure the prefill with ``tracemalloc``.
        seed: random seed of the delays.

    Raises:
        ValueError: an unknown name or an out-of-range number.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if pending < 0:
        raise ValueError(f"pending must not be negative, got {pending}")
    if ops < 1:
        raise ValueError(f"ops must be at least 1, got {ops}")
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    if not prefill_min > 1.0:
        raise ValueError(
            f"prefill_min must be above 1 s (the short delays' range), got {prefill_min}"
        )
    result = run_on(
        loop, lambda: _workload(impl, pending, ops, batch, prefill_min, trace_memory, seed)
    )
    result.update(impl=IMPLS[impl], loop=loop)
    return result


def run_spec(spec: Spec) -> Result:
    """Run a ``{"bench": "scale", "impl", "loop", "params"}`` spec."""
    return run_scale(spec["impl"], spec["loop"], **spec.get("params", {}))


register("scale", run_spec)
