"""The workloads' shared parts, used alike by the asyncio and the trio benchmarks.

* :func:`timer_inputs`: the timer benchmarks' delays and cancellations;
* :func:`purgatory_inputs`: the purgatory benchmarks' arrivals, completion
  latencies and watch keys (Kafka's ``TestPurgatoryPerformance`` distributions);
* :func:`generate`: the open-loop request generator every purgatory
  implementation is driven by, on every loop;
* :class:`WatchLists`: the watch-list bookkeeping of the hand-written purgatories;
* :func:`timer_recorder`, :func:`timer_result`, :func:`measure_purgatory` and
  :func:`memory_per_pending`: what a run measures, read and reported alike on every loop.

Benchmark modules import from here (and from :mod:`._common`), never from each
other: imports go one way.
"""

from __future__ import annotations

import heapq
import math
import random
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Hashable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from ._common import Result, latency_summary, peak_rss_mib, rss_mib

__all__ = [
    "Flagged",
    "KeyedOp",
    "LoopParts",
    "OwnTimer",
    "WatchLists",
    "ap_ops",
    "done_clock_op",
    "generate",
    "measure_purgatory",
    "memory_per_pending",
    "purgatory_inputs",
    "timer_inputs",
    "timer_recorder",
    "timer_result",
]


def timer_inputs(
    n: int, cancel_fraction: float, max_delay: float, seed: int
) -> tuple[list[float], list[bool]]:
    """Delays (s) and whether each timer is kept (else cancelled at once).

    Drawn before any measurement; every implementation, on every loop, gets the
    same ones.
    """
    rng = random.Random(seed)
    delays = [rng.random() * max_delay for _ in range(n)]
    keep = [rng.random() >= cancel_fraction for _ in range(n)]
    return delays, keep


def timer_recorder(
    clock: Callable[[], float], kept_total: int, all_fired: Callable[[], object]
) -> tuple[list[float], list[int], Callable[[int], None]]:
    """The callback of the timers that fire, and what it records.

    Returns ``(fired_at, remaining, fired)``: ``fired(j)`` stores ``clock()`` as
    ``fired_at[j]`` and counts ``remaining[0]`` down, calling ``all_fired()``
    once the last of ``kept_total`` timers has fired.
    """
    fired_at = [0.0] * kept_total
    remaining = [kept_total]

    def fired(j: int) -> None:
        fired_at[j] = clock()
        remaining[0] -= 1
        if not remaining[0]:
            all_fired()

    return fired_at, remaining, fired


def timer_result(
    *,
    cpu: float,
    wall: float,
    add_cpu: float,
    n: int,
    kept_total: int,
    remaining: int,
    lateness: list[float],
    rss_before: float,
) -> Result:
    """A timer run's measurements; ``lateness`` is each fired timer's, early ones below zero."""
    return {
        "cpu_s": cpu,
        "wall_s": wall,
        "add_cancel_ns_per_op": add_cpu / n * 1e9 if n else 0.0,
        "n": n,
        "cancelled": n - kept_total,
        "fired": kept_total - remaining,
        "early": sum(1 for late in lateness if late < 0),
        "lateness": latency_summary(lateness),
        "rss_before_mib": rss_before,
        "peak_rss_mib": peak_rss_mib(),
    }


def purgatory_inputs(
    num: int,
    rate: float,
    pct75: float,
    pct50: float,
    keys: int,
    key_space_size: int,
    seed: int,
) -> tuple[list[float], list[float], list[list[int]]]:
    """Arrival offsets (s), completion latencies (s) and key tuples, per request."""
    rng = random.Random(seed)
    mu = math.log(pct50)
    sigma = (math.log(pct75) - mu) / 0.674490  # the 75th percentile of N(0, 1)
    offsets: list[float] = []
    t = 0.0
    for _ in range(num):
        if rate > 0:
            t += rng.expovariate(rate)
        offsets.append(t)
    latencies = [rng.lognormvariate(mu, sigma) / 1000.0 for _ in range(num)]
    space = range(key_space_size)
    keysets = [rng.sample(space, keys) for _ in range(num)]
    return offsets, latencies, keysets


async def generate(
    impl: Any,
    offsets: list[float],
    latencies: list[float],
    keysets: list[list[int]],
    *,
    timeout_s: float,
    batch: int,
    completion: str,
    clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[object]],
    min_sleep: float = 0.0,
    deferred: bool = False,
) -> tuple[float, float]:
    """Issue the requests to ``impl`` and complete them on schedule, until all finished.

    The open-loop generator every implementation is driven by, on every loop:
    arrivals at ``offsets`` (s), each op watched under its key tuple and, if its
    latency is below the timeout, completed that long after it arrived (a heap of
    pending completions, as Kafka's ``CompletionQueue``); ``sleep`` is the loop's
    sleep, never shorter than ``min_sleep`` unless zero. With ``deferred`` (trio,
    where each request's own task watches its op when it first runs, and the ops
    have a ``started`` flag that it sets), a completion that comes due before its
    op's task has started waits for the generator's next wake-up.

    Returns:
        The clock readings at the start and when the last request had arrived.
    """
    make, watch, complete, poll = impl.make, impl.watch, impl.complete, impl.poll
    check = impl.check
    num = len(offsets)
    forced = completion == "force"
    flagged = completion == "check"
    completions: list[tuple[float, int, Any]] = []
    waiting: list[tuple[float, int, Any]] = []
    push, pop = heapq.heappush, heapq.heappop
    start = first = last = clock()
    arrived = False
    i = 0
    while True:
        now = clock()
        # Arrivals due by now (all of them when rate == 0), at most a batch per
        # wake-up so that expiries and completions get their turn.
        stop = min(num, i + batch)
        while i < stop and start + offsets[i] <= now:
            op = make(timeout_s)
            latency = latencies[i]
            if not forced:
                op.ready_at = now + latency
            watch(op, keysets[i])
            if latency < timeout_s:
                push(completions, (now + latency, i, op))
            i += 1
        if i == num and not arrived:
            arrived = True
            last = clock()
        while completions and completions[0][0] <= now:
            item = pop(completions)
            op = item[2]
            if deferred and not op.started:
                waiting.append(item)
                continue
            if forced:
                complete(op)
            else:
                if flagged:
                    op.ready = True
                check(keysets[item[1]][0])
        if waiting:
            for item in waiting:
                push(completions, item)
            waiting.clear()
        poll(now)
        if i == num and not completions and not impl.pending():
            break
        wake = min(
            start + offsets[i] if i < num else math.inf,
            completions[0][0] if completions else math.inf,
            impl.next_due(),
        )
        if wake == math.inf:
            # Only timer-driven expiries remain: look again a tick from now.
            wake = clock() + 0.001
        delay = wake - clock()
        if 0 < delay < min_sleep:
            delay = min_sleep
        await sleep(delay if delay > 0 else 0)
    return first, last


class LoopParts(NamedTuple):
    """What :func:`measure_purgatory` takes from the loop it runs on.

    ``impl_scope(late, completion)`` gives the implementation for the run (its
    expiry lateness goes to ``late``); leaving it waits for whatever the
    implementation still runs (trio: the requests' tasks), inside the CPU
    measurement. ``memory(memory_ops, timeout_s, keysets)`` measures the memory
    per pending op on a fresh implementation, after the timed part. ``clock``,
    ``sleep``, ``min_sleep`` and ``deferred`` go to :func:`generate`.
    """

    clock: Callable[[], float]
    sleep: Callable[[float], Awaitable[object]]
    impl_scope: Callable[[list[float], str], AbstractAsyncContextManager[Any]]
    memory: Callable[[int, float, list[list[int]]], Awaitable[float]]
    min_sleep: float = 0.0
    deferred: bool = False


async def measure_purgatory(
    loop_parts: Callable[[], LoopParts],
    *,
    num: int,
    rate: float,
    timeout: float,  # noqa: ASYNC109 - the ops' timeout in ms, not a deadline for this call
    pct75: float,
    pct50: float,
    keys: int,
    key_space_size: int,
    batch: int,
    memory_ops: int,
    seed: int,
    completion: str,
) -> Result:
    """One run of the purgatory workload, on any loop, and its measurements.

    ``loop_parts()`` is called once the run is on its loop. The asyncio and trio
    workloads return this coroutine itself rather than await it, so that the
    generator's every wake-up resumes as many frames as it did before.
    """
    clock, sleep, impl_scope, memory, min_sleep, deferred = loop_parts()
    offsets, latencies, keysets = purgatory_inputs(
        num, rate, pct75, pct50, keys, key_space_size, seed
    )
    timeout_s = timeout / 1000.0
    late: list[float] = []
    async with impl_scope(late, completion) as impl:
        rss_before = rss_mib()
        cpu0 = time.process_time()
        first, last = await generate(
            impl,
            offsets,
            latencies,
            keysets,
            timeout_s=timeout_s,
            batch=batch,
            completion=completion,
            clock=clock,
            sleep=sleep,
            min_sleep=min_sleep,
            deferred=deferred,
        )
    cpu = time.process_time() - cpu0
    end = clock()
    completed, expired = impl.outcomes()
    arrivals_s = last - first
    peak = peak_rss_mib()
    bytes_per_op = await memory(memory_ops, timeout_s, keysets)
    return {
        "num": num,
        "target_rate": rate,
        "achieved_rate": num / arrivals_s if arrivals_s > 0 else math.inf,
        "cpu_s": cpu,
        # CPU-bound capacity: what one core could sustain, immune to stolen time.
        "requests_per_cpu_s": num / cpu if cpu > 0 else math.inf,
        "cpu_us_per_request": cpu / num * 1e6 if num else 0.0,
        "wall_s": end - first,
        "completed": completed,
        "expired": expired,
        "expiry_lateness": latency_summary(late),
        "rss_before_mib": rss_before,
        "peak_rss_mib": peak,
        "memory_per_pending_op_bytes": bytes_per_op,
    }


async def memory_per_pending(
    impl: Any,
    count: int,
    timeout_s: float,
    keysets: list[list[int]],
    settle: Callable[[], Awaitable[object]] | None = None,
) -> float:
    """Bytes traced per pending op, ``count`` ops watched on a fresh ``impl`` (NaN: none).

    The ops get a long timeout so that none expires while we look; key tuples are
    shared inputs, allocated before tracing starts. ``settle`` (trio: until every
    request's task is blocked) is awaited after the warm-up op and after the
    traced ones, so that what their tasks allocate when they start is counted.
    """
    if count <= 0 or not keysets:
        return math.nan
    keysets = [keysets[i % len(keysets)] for i in range(count)]
    long_timeout = max(timeout_s, 3600.0)
    make, watch = impl.make, impl.watch
    # Warm up: the first op binds the purgatory to the loop and its timer creates its wheel.
    watch(make(long_timeout), keysets[0])
    if settle is not None:
        await settle()
    ops: list[Any] = [None] * count
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(count):
            op = ops[i] = make(long_timeout)
            watch(op, keysets[i])
        if settle is not None:
            await settle()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # The op list was allocated before tracing; what was traced is per-op state.
    return (after - before) / count


class KeyedOp(Protocol):
    keys: Sequence[Hashable]

    def try_complete(self) -> bool: ...


_OpT = TypeVar("_OpT", bound=KeyedOp)


class WatchLists(Generic[_OpT]):
    """The bookkeeping the hand-written and floor implementations share.

    Both insert into ``watchers`` inline in their ``watch`` (a call per op there
    would add to the very cost being measured).
    """

    def __init__(self, late: list[float], clock: Callable[[], float]) -> None:
        self.watchers: dict[Hashable, dict[int, _OpT]] = {}
        self.late = late
        self.clock = clock
        self.count = 0
        self.completed = 0
        self.expired = 0

    def complete(self, op: _OpT) -> None:
        raise NotImplementedError

    def check(self, key: Hashable) -> int:
        """``check_and_complete``: try every op watched under ``key``, in watch order."""
        ops = self.watchers.get(key)
        if not ops:
            return 0
        completed = 0
        complete = self.complete
        for op in list(ops.values()):
            if op.try_complete():
                complete(op)
                completed += 1
        return completed

    def _detach(self, op: _OpT) -> None:
        oid = id(op)
        watchers = self.watchers
        for key in op.keys:
            ops = watchers[key]
            del ops[oid]
            if not ops:
                del watchers[key]
        self.count -= 1

    def pending(self) -> int:
        return self.count

    def outcomes(self) -> tuple[int, int]:
        return self.completed, self.expired


class Flagged:
    """The condition of an op completed by ``check`` or ``clock``, mixed in before its base.

    ``ready`` is the flag the generator sets, ``ready_at`` the clock reading from
    which the condition holds; the class that mixes this in declares both slots
    (so that this ``__init__`` stands in for its own: no extra call per op).
    """

    __slots__ = ()
    ready: bool
    ready_at: float

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)  # type: ignore[call-arg]
        # The slots are the mixing class's (two slotted bases could not be combined).
        self.ready = False  # type: ignore[misc]
        self.ready_at = math.inf  # type: ignore[misc]


def ap_ops(
    clock: Callable[[], float], base: type[Any] | None = None
) -> tuple[type[Any], type[Any]]:
    """Delayed operations whose ``try_complete`` reads a flag, and the loop clock.

    ``FlagOp`` completes once ``ready`` is set; ``ClockOp`` once ``clock()``
    reaches ``ready_at``. Both derive from ``base`` (default
    :class:`aiopurgatory.DelayedOperation`).
    """
    import aiopurgatory as ap

    parent: type[Any] = ap.DelayedOperation if base is None else base

    class FlagOp(Flagged, parent):  # type: ignore[misc]
        __slots__ = ("ready", "ready_at")

        def try_complete(self) -> bool:
            return self.ready and self.force_complete()

    class ClockOp(FlagOp):
        __slots__ = ()

        def try_complete(self) -> bool:
            return clock() >= self.ready_at and self.force_complete()

    return FlagOp, ClockOp


_DoneT = TypeVar("_DoneT")


def done_clock_op(clock: Callable[[], float], base: type[_DoneT]) -> type[_DoneT]:
    """``base``'s ops (with ``ready_at`` and a ``done`` flag) under completion ``clock``:
    ready once ``clock()`` reaches ``ready_at``, never once done (the floor's, trio's)."""

    class ClockOp(base):  # type: ignore[valid-type,misc]
        __slots__ = ()
        ready_at: float
        done: bool

        def try_complete(self) -> bool:
            return clock() >= self.ready_at and not self.done

    return ClockOp


class OwnTimer:
    """The generator interface of implementations whose ops expire on the purgatory's timer."""

    @staticmethod
    def complete(op: Any) -> None:
        op.force_complete()

    def poll(self, now: float) -> None:
        pass

    def next_due(self) -> float:
        return math.inf
