"""``bench timer``: many timers, most of them cancelled right after being added.

The workload Kafka's ``SystemTimer`` was measured on (see KAFKA.md): ``n`` timers
with delays uniform in [0, 1) s (``max_delay``); a fixed 90% (``cancel_fraction``) are cancelled
right after being added, the rest fire. Implementations:

* ``ap``: ``ap.Timer().call_later`` (a timing wheel, one loop handle);
* ``loop``: the loop's own ``loop.call_later`` (a heap of handles on asyncio, C on uvloop).

Timers are added in batches of ``batch`` with a loop iteration in between, as a
server would between requests; adding a million timers in one callback would
stall the loop for a second and turn "lateness" into a measure of that stall.

Measured per run: CPU seconds (``time.process_time`` from the first add until the
last timer fired: adds, cancels, the loop's own timer housekeeping and firing),
add+cancel CPU time per timer (only inside the batches), fired and early counts
(early: ``loop.time()`` in the callback is before the handle's ``when()``),
lateness (``loop.time()`` in the callback minus ``when()``), peak RSS.

On trio (``loop="trio"`` or ``"trio-virtual"``) the same workload runs against
trio's own deadlines instead of ``loop.call_later``: see
:mod:`aiopurgatory_trio_bench.timer` (a package of its own beside this one, so
that the library imports trio only where it must).
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

from ._common import (
    TRIO_LOOPS,
    Result,
    Spec,
    rss_mib,
    run_on,
    trio_baselines,
)
from ._registry import register
from .workload import timer_inputs, timer_recorder, timer_result

__all__ = ["IMPLS", "TRIO_IMPLS", "impls", "run_spec", "run_timer"]

#: Implementation key -> label used in tables and JSON (asyncio and uvloop).
IMPLS = {"ap": "ap.Timer", "loop": "loop.call_later"}

#: The same on trio, against trio's own deadlines (see :mod:`aiopurgatory_trio_bench.timer`).
TRIO_IMPLS = {
    "ap": "ap.Timer",
    "task": "trio task + sleep_until",
    "scope": "trio.move_on_at",
}


def impls(loop: str) -> dict[str, str]:
    """The implementations (key -> label) that run on ``loop``."""
    return TRIO_IMPLS if loop in TRIO_LOOPS else IMPLS


DEFAULTS: dict[str, Any] = {
    "n": 1_000_000,
    "cancel_fraction": 0.9,
    "max_delay": 1.0,
    "batch": 1000,
    "seed": 1,
}


async def _workload(
    impl: str, n: int, cancel_fraction: float, max_delay: float, batch: int, seed: int
) -> Result:
    loop = asyncio.get_running_loop()
    delays, keep = timer_inputs(n, cancel_fraction, max_delay, seed)
    kept_total = sum(keep)
    handles: list[Any] = []
    # Due instants of kept timers by our own reckoning (loop.time() at add + delay),
    # used only where a handle has no when(): uvloop turns delays it rounds to 0 ms
    # into plain call_soon handles.
    added_due: list[float] = []
    rss_before = rss_mib()

    clock = loop.time
    all_fired = loop.create_future()
    fired_at, remaining, fired = timer_recorder(
        clock, kept_total, functools.partial(all_fired.set_result, None)
    )

    if impl == "ap":
        import aiopurgatory as ap

        timer = ap.Timer()
        call_later: Any = timer.call_later
    elif impl == "loop":
        call_later = loop.call_later
    else:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")

    append = handles.append
    due_append = added_due.append
    perf = time.perf_counter
    # CPU time, not wall time: on a shared machine other processes' time slices
    # would otherwise land in whichever batch they interrupted.
    cpu_clock = time.process_time
    add_cpu = 0.0
    j = 0
    cpu0 = time.process_time()
    wall0 = perf()
    for start in range(0, n, batch):
        t0 = cpu_clock()
        for i in range(start, min(start + batch, n)):
            if keep[i]:
                append(call_later(delays[i], fired, j))
                due_append(clock() + delays[i])
                j += 1
            else:
                call_later(delays[i], fired, -1).cancel()
        add_cpu += cpu_clock() - t0
        await asyncio.sleep(0)
    if kept_total:
        await all_fired
    cpu = time.process_time() - cpu0
    wall = perf() - wall0

    lateness: list[float] = []
    for handle, at, due in zip(handles, fired_at, added_due, strict=True):
        when = getattr(handle, "when", None)
        lateness.append(at - (when() if when is not None else due))
    return timer_result(
        cpu=cpu,
        wall=wall,
        add_cpu=add_cpu,
        n=n,
        kept_total=kept_total,
        remaining=remaining[0],
        lateness=lateness,
        rss_before=rss_before,
    )


def run_timer(
    impl: str,
    loop: str = "asyncio",
    *,
    n: int = DEFAULTS["n"],
    cancel_fraction: float = DEFAULTS["cancel_fraction"],
    max_delay: float = DEFAULTS["max_delay"],
    batch: int = DEFAULTS["batch"],
    seed: int = DEFAULTS["seed"],
) -> Result:
    """Run the timer workload once, in this process, and return its measurements.

    Args:
        impl: ``"ap"`` (``ap.Timer``) or ``"loop"`` (``loop.call_later``); on
            trio ``"ap"``, ``"task"`` or ``"scope"`` (see :data:`TRIO_IMPLS`).
        loop: ``"asyncio"``, ``"uvloop"``, ``"virtual"``, ``"trio"`` or
            ``"trio-virtual"``.
        n: number of timers.
        cancel_fraction: share of timers cancelled right after being added.
        max_delay: delays are uniform in [0, max_delay) seconds (Kafka's run: 1).
        batch: timers added per loop iteration.
        seed: random seed of delays and cancellations.

    Raises:
        ValueError: unknown ``impl``/``loop``, ``n < 0``, ``batch < 1`` or a
            ``cancel_fraction`` outside [0, 1].
    """
    if n < 0:
        raise ValueError(f"n must not be negative, got {n}")
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    if not 0.0 <= cancel_fraction <= 1.0:
        raise ValueError(f"cancel_fraction must be in [0, 1], got {cancel_fraction}")
    if not 0.0 < max_delay < 3600.0:
        raise ValueError(f"max_delay must be in (0, 3600) seconds, got {max_delay}")
    labels = impls(loop)
    if impl not in labels:
        raise ValueError(f"impl must be one of {', '.join(labels)} on {loop}, got {impl!r}")
    if loop in TRIO_LOOPS:
        with trio_baselines(loop):
            from aiopurgatory_trio_bench import timer as trio_timer

        workload = trio_timer.workload
    else:
        workload = _workload
    result = run_on(loop, lambda: workload(impl, n, cancel_fraction, max_delay, batch, seed))
    result.update(impl=labels[impl], loop=loop)
    return result


def run_spec(spec: Spec) -> Result:
    """Run a ``{"bench": "timer", "impl", "loop", "params"}`` spec (see :mod:`._common`)."""
    return run_timer(spec["impl"], spec["loop"], **spec.get("params", {}))


register("timer", run_spec)
