"""The headline of ``bench purgatory``: the case users have, and the full-GC stall.

**The realistic case.** Requests arrive back to back (in batches of ``batch`` per
loop wake-up) and each is a *task* that awaits its operation, as a server's
request handler does. An operation's ``try_complete`` is Python code that reads
state: a flag set by the producer (``completion="check"``) or the loop clock
(``"clock"``). Completion comes, as in Kafka, through ``check_and_complete`` on
the op's first key once its condition holds (a log-normal latency after it
arrived, else it expires). Keys are drawn from a space of ``num // 4``, so watch
lists stay short and a trigger checks a handful of ops; with latencies of
seconds (median 2 s) and a timeout of 10 s, 10^5 (``num=200_000``) to 10^6 operations are
pending at the peak (reported as ``peak_pending``). ``completion="force"``
completes from outside with ``force_complete()`` instead (the flattering case:
no ``try_complete`` runs and no watch list is scanned).

Implementations, all driven by :func:`.workload.generate`:

* ``ap``: each task awaits ``Purgatory.watch(op, keys)``;
* ``hand``: a careful hand-written asyncio purgatory: each task creates a future,
  arms ``loop.call_later`` for the timeout, joins dict-based watch lists and
  awaits the future;
* ``null``: the generator and the tasks alone, nothing watched: each task awaits
  a plain future that the generator resolves at the op's completion instant (or
  at its deadline, from a FIFO). What ``ap`` or ``hand`` cost above it is the
  purgatory's own cost per operation.

Measured: CPU per request (``process_time`` from the first arrival until every
task finished), completed/expired counts, peak pending.

**The full-GC stall** (``bench="gcstall"``): ``pending`` operations watched and
pending (no tasks), then ``gc.collect()`` timed, as an application's full
collection would stall the loop; also the GC-tracked objects per pending op.
"""

from __future__ import annotations

import asyncio
import gc
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from ._common import Result, Spec, run_on
from ._registry import register
from .hand import HandFlagOp, HandImpl, HandOp
from .workload import OwnTimer, ap_ops, generate, purgatory_inputs

__all__ = ["COMPLETIONS", "DEFAULTS", "IMPLS", "run_gc_stall", "run_realistic"]

#: Implementation key -> label (the null run first: the others are read against it).
IMPLS = {"null": "null (generator + tasks)", "ap": "ap.Purgatory.watch", "hand": "hand-written"}

#: How requests complete: a flag read by try_complete, the clock, or force_complete.
COMPLETIONS = ("check", "clock", "force")

DEFAULTS: dict[str, Any] = {
    "num": 200_000,
    "timeout": 10_000.0,
    "pct75": 4000.0,
    "pct50": 2000.0,
    "keys": 3,
    "batch": 1000,
    "seed": 1,
    "completion": "check",
}


class _Ap(OwnTimer):
    def __init__(self, clock: Callable[[], float], completion: str) -> None:
        import aiopurgatory as ap

        FlagOp, ClockOp = ap_ops(clock)
        self.make: Callable[[float], Any] = ClockOp if completion == "clock" else FlagOp
        self.purgatory: ap.Purgatory[Any] = ap.Purgatory("bench")
        self.check = self.purgatory.check_and_complete
        self.create_task = asyncio.get_running_loop().create_task
        self.outstanding = self.peak = 0

    def watch(self, op: Any, keys: Sequence[Hashable]) -> None:
        self.outstanding += 1
        if self.outstanding > self.peak:
            self.peak = self.outstanding
        self.create_task(self._request(op, keys))

    async def _request(self, op: Any, keys: Sequence[Hashable]) -> None:
        await self.purgatory.watch(op, keys)
        self.outstanding -= 1

    def pending(self) -> int:
        return self.outstanding

    def outcomes(self) -> tuple[int, int]:
        stats = self.purgatory.statistics()
        return stats.completed, stats.expired


class _Hand(HandImpl):
    """The hand-written purgatory (:mod:`.hand`), each op awaited by a task."""

    def __init__(self, clock: Callable[[], float], completion: str) -> None:
        super().__init__([], clock, "clock" if completion == "clock" else "check")
        self.create_task = self.loop.create_task
        self.outstanding = self.peak = 0

    def watch(self, op: HandOp, keys: Sequence[Hashable]) -> None:
        self.outstanding += 1
        if self.outstanding > self.peak:
            self.peak = self.outstanding
        self.create_task(self._request(op, keys))

    async def _request(self, op: HandOp, keys: Sequence[Hashable]) -> None:
        HandImpl.watch(self, op, keys)
        try:
            await op.future
        finally:
            self.outstanding -= 1


class _NullOp:
    __slots__ = ("deadline", "future", "ready", "ready_at", "timeout")
    deadline: float
    future: asyncio.Future[bool]

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout


class _Null:
    """The generator and the tasks, nothing watched: completions go straight to the op."""

    #: Tells the generator to call complete(op) instead of check(key).
    direct = True

    def __init__(self, clock: Callable[[], float], completion: str) -> None:
        self.clock = clock
        self.loop = loop = asyncio.get_running_loop()
        self.create_task = loop.create_task
        self.make = _NullOp
        self.fifo: deque[_NullOp] = deque()
        self.outstanding = self.peak = self.completed = self.expired = 0

    def watch(self, op: _NullOp, keys: Sequence[Hashable]) -> None:
        self.outstanding += 1
        if self.outstanding > self.peak:
            self.peak = self.outstanding
        op.future = self.loop.create_future()
        op.deadline = self.clock() + op.timeout
        self.fifo.append(op)
        self.create_task(self._request(op))

    async def _request(self, op: _NullOp) -> None:
        await op.future
        self.outstanding -= 1

    def check(self, key: Hashable) -> int:  # pragma: no cover - direct: never called
        raise AssertionError("the null run completes ops directly")

    def complete(self, op: _NullOp) -> None:
        if not op.future.done():
            self.completed += 1
            op.future.set_result(True)

    def poll(self, now: float) -> None:
        fifo = self.fifo
        while fifo and fifo[0].deadline <= now:
            op = fifo.popleft()
            if not op.future.done():
                self.expired += 1
                op.future.set_result(False)

    def next_due(self) -> float:
        fifo = self.fifo
        while fifo and fifo[0].future.done():
            fifo.popleft()
        return fifo[0].deadline if fifo else math.inf

    def pending(self) -> int:
        return self.outstanding

    def outcomes(self) -> tuple[int, int]:
        return self.completed, self.expired


_IMPLS: dict[str, Callable[[Callable[[], float], str], Any]] = {
    "null": _Null,
    "ap": _Ap,
    "hand": _Hand,
}


async def _workload(
    impl_name: str,
    *,
    num: int,
    timeout: float,  # noqa: ASYNC109 - the ops' timeout in ms, not a deadline for this call
    pct75: float,
    pct50: float,
    keys: int,
    batch: int,
    seed: int,
    completion: str,
) -> Result:
    loop = asyncio.get_running_loop()
    clock = loop.time
    offsets, latencies, keysets = purgatory_inputs(
        num, 0.0, pct75, pct50, keys, max(keys, num // 4), seed
    )
    impl = _IMPLS[impl_name](clock, completion)
    gc0 = sum(s["collections"] for s in gc.get_stats())
    cpu0 = time.process_time()
    first, _ = await generate(
        impl,
        offsets,
        latencies,
        keysets,
        timeout_s=timeout / 1000.0,
        batch=batch,
        completion="force" if getattr(impl, "direct", False) else completion,
        clock=clock,
        sleep=asyncio.sleep,
        # A server handles the events of a millisecond in one loop iteration;
        # waking up for every single completion would measure little but wake-ups.
        min_sleep=0.001,
    )
    cpu = time.process_time() - cpu0
    completed, expired = impl.outcomes()
    return {
        "num": num,
        "completion": completion,
        "cpu_s": cpu,
        "cpu_us_per_request": cpu / num * 1e6,
        "wall_s": clock() - first,
        "completed": completed,
        "expired": expired,
        "peak_pending": impl.peak,
        "gc_collections": sum(s["collections"] for s in gc.get_stats()) - gc0,
    }


def run_realistic(impl: str, loop: str = "asyncio", **params: Any) -> Result:
    """Run the realistic workload once in this process (params: :data:`DEFAULTS`).

    Raises:
        ValueError: an unknown implementation, loop or completion.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown parameters: {', '.join(sorted(unknown))}")
    merged = dict(DEFAULTS, **params)
    if merged["completion"] not in COMPLETIONS:
        raise ValueError(f"completion must be one of {', '.join(COMPLETIONS)}")
    if merged["num"] < 1:
        raise ValueError(f"num must be at least 1, got {merged['num']}")
    result = run_on(loop, lambda: _workload(impl, **merged))
    result.update(impl=IMPLS[impl], loop=loop)
    return result


def run_spec(spec: Spec) -> Result:
    """Run a ``{"bench": "realistic", "impl", "loop", "params"}`` spec."""
    return run_realistic(spec["impl"], spec["loop"], **spec.get("params", {}))


# -- the full-GC stall ---------------------------------------------------------------------


async def _gc_stall(impl: str, pending: int, rounds: int) -> Result:
    loop = asyncio.get_running_loop()
    timeout = 3600.0
    keep: list[Any] = []
    gc.collect()
    tracked0 = len(gc.get_objects())
    if impl == "ap":
        import aiopurgatory as ap

        purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("gc")
        for i in range(pending):
            purgatory.try_complete_else_watch(ap.DelayedOperation(timeout), [i % 1000])
        await asyncio.sleep(0)  # staged entries reach the wheel
        keep.append(purgatory)
    else:
        lists: dict[int, dict[int, Any]] = {}
        for i in range(pending):
            op = HandFlagOp(timeout)
            op.future = loop.create_future()
            op.handle = loop.call_later(timeout, op.future.cancel)
            op.keys = (i % 1000,)
            lists.setdefault(i % 1000, {})[id(op)] = op
        keep.append(lists)
    gc.collect()
    tracked = len(gc.get_objects()) - tracked0
    stalls = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        gc.collect()
        stalls.append(time.perf_counter() - t0)
    return {
        "pending": pending,
        "gc_collect_s": statistics.median(stalls),
        "gc_collect_max_s": max(stalls),
        "tracked_per_pending": tracked / pending,
    }


def run_gc_stall(
    impl: str, loop: str = "asyncio", *, pending: int = 1_000_000, rounds: int = 3
) -> Result:
    """Time a full ``gc.collect()`` with ``pending`` ops pending (``"ap"`` or ``"hand"``)."""
    if impl not in ("ap", "hand"):
        raise ValueError(f"impl must be 'ap' or 'hand', got {impl!r}")
    result = run_on(loop, lambda: _gc_stall(impl, pending, rounds))
    result.update(impl=IMPLS[impl], loop=loop)
    return result


def run_gc_spec(spec: Spec) -> Result:
    """Run a ``{"bench": "gcstall", "impl", "loop", "params"}`` spec."""
    return run_gc_stall(spec["impl"], spec["loop"], **spec.get("params", {}))


register("realistic", run_spec)
register("gcstall", run_gc_spec)
