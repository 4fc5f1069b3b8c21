"""``bench purgatory --acks``: acks=all produce requests waiting for a high watermark.

The case watermark watches were made for (issue 28). A partition leader holds
``pending`` produce requests per partition, on ``partitions`` partitions; each is a
*task* that awaits its request until the partition's high watermark reaches the
request's offset (the offset of its last record). The high watermark advances in
steps of ``step`` offsets, each step one *trigger*, which completes the ``step``
oldest requests of the partition; ``step`` new requests arrive behind them, so
``pending`` stay pending throughout. Measured: CPU per trigger (``process_time``
of the timed rounds divided by the triggers), which covers the trigger itself, the
completed requests' tasks waking up and the new requests' tasks starting and
watching: the same work for every implementation, except how the waiting
requests are found. Also measured: the time spent inside the trigger calls
alone (``call_us_per_trigger``: ``perf_counter_ns`` around each call, on the one
thread that runs everything, so wall time there is that call's CPU unless the
machine preempts it), which is what finding and completing the requests costs,
without their tasks; the two clock reads (about 0.1 us) are in every
implementation's figures alike.

Implementations (every request has a timeout, 60 s, which never fires):

* ``advance``: ``ap.Purgatory``; the request is an op with a plain Python
  ``try_complete`` (``partition.high_watermark >= required_offset``, as
  ``examples/acks_all.py``'s ``DelayedProduce``) watched with a threshold,
  ``purgatory.watch(op, {key: required_offset})``; the trigger is
  ``purgatory.advance(key, high_watermark)``: it checks only the ops the
  watermark reached;
* ``wm``: the same with :class:`aiopurgatory.WatermarkOperation` (no
  ``try_complete`` written);
* ``check``: the same op watched without threshold, ``watch(op, [key])``; the
  trigger is ``check_and_complete(key)``: Kafka's way, every pending op of the
  partition checked at every trigger;
* ``force``: a reference for the cost of a threshold: the same op watched
  without threshold, ``watch(op, [key])``, completed by the driver itself with
  ``op.force_complete()`` on the ops the watermark reached, oldest first (it
  knows them: a deque per partition in offset order), no ``try_complete`` call
  and no scan;
* ``scan``: what an asyncio user writes first: per partition a list of
  ``(offset, future, timer handle)``, scanned at every advance (entries reached
  are resolved, the others kept); a ``loop.call_later`` per request for its timeout;
* ``heap``: a careful hand-written index: per partition a ``heapq`` of
  ``(offset, seq, future, timer handle)``; an advance pops what it reached;
* ``heap_op``: a reference for what the operation itself costs: the hand-written
  heap, whose requests also build ``advance``'s op (the same ``DelayedOperation``
  subclass, never watched) and call its ``try_complete`` where the purgatory
  does, once at the request and once when the watermark reaches it. What it
  costs above ``heap`` is the op's own cost; what ``advance`` costs above it is
  what the purgatory's index, timer and waiting cost beyond the heap's;
* ``null``: the driver and the tasks alone: per partition a deque of futures in
  offset order, resolved from the left, no timer at all. No purgatory can do
  less; what another implementation costs above it is its own.

The hand-written ones check the high watermark before waiting, as the purgatory's
``watch`` calls ``try_complete`` once first. Before the timed rounds, every request
is pending and watched, then ``gc.collect()`` and ``gc.freeze()``, so that the
collections during the rounds walk only what the rounds allocate (what a server
with a large backlog should do; the same for every implementation).

The rounds stop after ``rounds`` or once ``cpu_budget`` seconds of CPU were
spent, whichever comes first (at least ``min_rounds``): the scans grow with
``pending`` and the indexed implementations do not, so a fixed count would be
either too short for these or too long for those. The state is the same in every
round, so the CPU per trigger does not depend on how many rounds ran. After the
timed part the watermark is advanced past every request and each request's task
is awaited, so that every run checks that every request completed exactly once.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from ._common import TRIO_LOOPS, Result, Spec, run_on
from ._registry import register

__all__ = ["DEFAULTS", "IMPLS", "run_acks", "run_spec"]

#: Implementation key -> label used in tables and JSON.
IMPLS = {
    "null": "null (driver + tasks)",
    "advance": "ap advance, try_complete",
    "wm": "ap advance, WatermarkOperation",
    "check": "ap check_and_complete",
    "force": "ap plain watch, force_complete",
    "scan": "hand-written list scan",
    "heap": "hand-written heap",
    "heap_op": "hand-written heap + the op",
}

DEFAULTS: dict[str, Any] = {
    "pending": 1000,
    "partitions": 4,
    "step": 4,
    "rounds": 2000,
    "min_rounds": 20,
    "cpu_budget": 1.0,
    "timeout": 60.0,
}


class _Partition:
    """The leader's view of a partition: its high watermark (offsets count records)."""

    __slots__ = ("high_watermark",)

    def __init__(self) -> None:
        self.high_watermark = 0


class _Counts:
    """What every implementation takes and counts the same way, in its request tasks.

    Subclasses define ``_request(p, offset)`` (a request's task) and ``advance``,
    and set up their own state in ``_setup``.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        partitions: list[_Partition],
        keys: list[str],
        timeout: float,
        kind: str,
    ) -> None:
        self.loop = loop
        self.create_task = loop.create_task
        self.partitions = partitions
        self.timeout = timeout
        self.completed = 0
        self.expired = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self._setup(keys, kind)

    def _setup(self, keys: list[str], kind: str) -> None:
        """Its own state (``keys``: the partitions' keys; ``kind``: a key of :data:`IMPLS`)."""

    def spawn(self, coro: Any) -> None:
        task = self.create_task(coro)
        tasks = self.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def produce(self, p: int, offset: int) -> None:
        self.spawn(self._request(p, offset))

    def _request(self, p: int, offset: int) -> Coroutine[Any, Any, None]:
        raise NotImplementedError


# -- aiopurgatory ----------------------------------------------------------------------


@functools.cache
def _produce_op() -> type[Any]:
    """The produce request of ``advance``, ``check``, ``force`` and ``heap_op``."""
    import aiopurgatory as ap

    class ProduceOp(ap.DelayedOperation):
        """A produce request: committed once the high watermark reaches its offset."""

        __slots__ = ("partition", "required_offset")

        def __init__(self, timeout: float, partition: _Partition, offset: int) -> None:
            super().__init__(timeout)
            self.partition = partition
            self.required_offset = offset

        def try_complete(self) -> bool:
            return self.partition.high_watermark >= self.required_offset

    return ProduceOp


class _Ap(_Counts):
    """``ap.Purgatory``: ``watch`` with a threshold or without, ``advance`` or ``check``."""

    def _setup(self, keys: list[str], kind: str) -> None:
        import aiopurgatory as ap

        self.purgatory: ap.Purgatory[Any] = ap.Purgatory("acks")
        self.keys = keys
        self.op = _produce_op()
        self.wm_op = ap.WatermarkOperation
        self.completed_outcome = ap.Outcome.COMPLETED
        requests: dict[str, Callable[[int, int], Coroutine[Any, Any, None]]] = {
            "advance": self._threshold,
            "wm": self._watermark,
            "check": self._plain,
            "force": self._forced,
        }
        self.request = requests[kind]
        self.fifos: list[deque[Any]] = [deque() for _ in self.partitions]
        if kind == "check":
            self.advance: Callable[[int, int], int] = self._check
            self._check_key = self.purgatory.check_and_complete
        elif kind == "force":
            self.advance = self._force
        else:
            self.advance = self._advance
            self._advance_key = self.purgatory.advance

    def produce(self, p: int, offset: int) -> None:
        self.spawn(self.request(p, offset))

    # Each request counts its outcome in place, as the hand-written ones do (a
    # shared helper would add a call to these figures alone).

    async def _threshold(self, p: int, offset: int) -> None:
        op = self.op(self.timeout, self.partitions[p], offset)
        if await self.purgatory.watch(op, {self.keys[p]: offset}) is self.completed_outcome:
            self.completed += 1
        else:
            self.expired += 1

    async def _watermark(self, p: int, offset: int) -> None:
        op = self.wm_op(self.timeout)
        if await self.purgatory.watch(op, {self.keys[p]: offset}) is self.completed_outcome:
            self.completed += 1
        else:
            self.expired += 1

    async def _plain(self, p: int, offset: int) -> None:
        op = self.op(self.timeout, self.partitions[p], offset)
        if await self.purgatory.watch(op, [self.keys[p]]) is self.completed_outcome:
            self.completed += 1
        else:
            self.expired += 1

    async def _forced(self, p: int, offset: int) -> None:
        op = self.op(self.timeout, self.partitions[p], offset)
        self.fifos[p].append(op)
        if await self.purgatory.watch(op, [self.keys[p]]) is self.completed_outcome:
            self.completed += 1
        else:
            self.expired += 1

    def _advance(self, p: int, high_watermark: int) -> int:
        return self._advance_key(self.keys[p], high_watermark)

    def _check(self, p: int, high_watermark: int) -> int:
        return self._check_key(self.keys[p])

    def _force(self, p: int, high_watermark: int) -> int:
        fifo = self.fifos[p]
        completed = 0
        while fifo and fifo[0].required_offset <= high_watermark:
            if fifo.popleft().force_complete():
                completed += 1
        return completed


# -- hand-written ----------------------------------------------------------------------


def _expire(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)


class _Scan(_Counts):
    """Futures in a list per partition, the whole list scanned at every advance."""

    def _setup(self, keys: list[str], kind: str) -> None:
        self.waiters: list[list[tuple[int, asyncio.Future[bool], asyncio.TimerHandle]]] = [
            [] for _ in self.partitions
        ]

    async def _request(self, p: int, offset: int) -> None:
        if self.partitions[p].high_watermark >= offset:
            self.completed += 1
            return
        loop = self.loop
        future = loop.create_future()
        handle = loop.call_later(self.timeout, _expire, future)
        self.waiters[p].append((offset, future, handle))
        if await future:
            self.completed += 1
        else:
            self.expired += 1

    def advance(self, p: int, high_watermark: int) -> int:
        completed = 0
        kept = []
        for entry in self.waiters[p]:
            future = entry[1]
            if future.done():
                continue  # expired
            if entry[0] <= high_watermark:
                entry[2].cancel()
                future.set_result(True)
                completed += 1
            else:
                kept.append(entry)
        self.waiters[p] = kept
        return completed


class _Heap(_Counts):
    """Futures in a heap per partition by required offset; an advance pops what it reached."""

    def _setup(self, keys: list[str], kind: str) -> None:
        self.seq = 0
        self.heaps: list[list[tuple[int, int, asyncio.Future[bool], asyncio.TimerHandle]]] = [
            [] for _ in self.partitions
        ]

    async def _request(self, p: int, offset: int) -> None:
        if self.partitions[p].high_watermark >= offset:
            self.completed += 1
            return
        loop = self.loop
        future = loop.create_future()
        handle = loop.call_later(self.timeout, _expire, future)
        self.seq = seq = self.seq + 1
        heapq.heappush(self.heaps[p], (offset, seq, future, handle))
        if await future:
            self.completed += 1
        else:
            self.expired += 1

    def advance(self, p: int, high_watermark: int) -> int:
        heap = self.heaps[p]
        pop = heapq.heappop
        completed = 0
        while heap and heap[0][0] <= high_watermark:
            _, _, future, handle = pop(heap)
            if not future.done():  # else expired: left in the heap until reached
                handle.cancel()
                future.set_result(True)
                completed += 1
        return completed


class _HeapOp(_Heap):
    """The heap, whose requests also build the purgatory's op and call its ``try_complete``.

    Its methods repeat ``_Heap``'s with the op added, rather than share a helper:
    a shared call would add its own cost to the figures of both.
    """

    def _setup(self, keys: list[str], kind: str) -> None:
        super()._setup(keys, kind)
        self.op = _produce_op()

    async def _request(self, p: int, offset: int) -> None:
        op = self.op(self.timeout, self.partitions[p], offset)
        if op.try_complete():
            self.completed += 1
            return
        loop = self.loop
        future = loop.create_future()
        handle = loop.call_later(self.timeout, _expire, future)
        self.seq = seq = self.seq + 1
        heap: list[Any] = self.heaps[p]
        heapq.heappush(heap, (offset, seq, future, handle, op))
        if await future:
            self.completed += 1
        else:
            self.expired += 1

    def advance(self, p: int, high_watermark: int) -> int:
        heap: list[Any] = self.heaps[p]
        pop = heapq.heappop
        completed = 0
        not_ready = None
        while heap and heap[0][0] <= high_watermark:
            entry = pop(heap)
            _, _, future, handle, op = entry
            if future.done():
                continue  # expired
            # The op says whether it is ready, as the purgatory asks it; one that
            # says no goes back in the heap, as it would stay watched there.
            if op.try_complete():
                handle.cancel()
                future.set_result(True)
                completed += 1
            elif not_ready is None:
                not_ready = [entry]
            else:
                not_ready.append(entry)
        if not_ready is not None:
            for entry in not_ready:
                heapq.heappush(heap, entry)
        return completed


class _Null(_Counts):
    """The driver and the tasks: futures in offset order per partition, no timer."""

    def _setup(self, keys: list[str], kind: str) -> None:
        self.queues: list[deque[tuple[int, asyncio.Future[bool]]]] = [
            deque() for _ in self.partitions
        ]

    async def _request(self, p: int, offset: int) -> None:
        if self.partitions[p].high_watermark >= offset:
            self.completed += 1
            return
        future = self.loop.create_future()
        self.queues[p].append((offset, future))
        await future
        self.completed += 1

    def advance(self, p: int, high_watermark: int) -> int:
        queue = self.queues[p]
        completed = 0
        while queue and queue[0][0] <= high_watermark:
            queue.popleft()[1].set_result(True)
            completed += 1
        return completed


_IMPL_CLASSES: dict[str, type[Any]] = {
    "null": _Null,
    "advance": _Ap,
    "wm": _Ap,
    "check": _Ap,
    "force": _Ap,
    "scan": _Scan,
    "heap": _Heap,
    "heap_op": _HeapOp,
}


# -- the workload ----------------------------------------------------------------------


async def _settle() -> None:
    """Let every task that can run, run (new requests watch, completed ones return)."""
    for _ in range(3):
        await asyncio.sleep(0)


async def _workload(
    impl_name: str,
    *,
    pending: int,
    partitions: int,
    step: int,
    rounds: int,
    min_rounds: int,
    cpu_budget: float,
    timeout: float,  # noqa: ASYNC109 - the requests' timeout in seconds, not this call's
) -> Result:
    loop = asyncio.get_running_loop()
    parts = [_Partition() for _ in range(partitions)]
    keys = [f"orders-{p}" for p in range(partitions)]
    impl = _IMPL_CLASSES[impl_name](loop, parts, keys, timeout, impl_name)
    produce, advance = impl.produce, impl.advance
    ends = [0] * partitions  # the log end offset of each partition
    for p in range(partitions):
        for offset in range(1, pending + 1):
            produce(p, offset)
        ends[p] = pending
    await _settle()
    gc.collect()
    gc.freeze()
    gc0 = sum(s["collections"] for s in gc.get_stats())
    sleep0 = asyncio.sleep
    clock = time.process_time
    ns = time.perf_counter_ns
    done = 0
    completions = 0
    trigger_ns = 0
    cpu0 = clock()
    while done < rounds:
        for p in range(partitions):
            part = parts[p]
            high_watermark = part.high_watermark + step
            part.high_watermark = high_watermark
            t0 = ns()
            completions += advance(p, high_watermark)
            trigger_ns += ns() - t0
            end = ends[p]
            for offset in range(end + 1, end + step + 1):
                produce(p, offset)
            ends[p] = end + step
        await sleep0(0)
        done += 1
        if done >= min_rounds and clock() - cpu0 >= cpu_budget:
            break
    cpu = clock() - cpu0
    gc_collections = sum(s["collections"] for s in gc.get_stats()) - gc0
    gc.unfreeze()
    triggers = done * partitions
    # Not timed: every request left completes, and every task returns.
    for p in range(partitions):
        parts[p].high_watermark = ends[p]
        advance(p, ends[p])
    await _settle()
    if impl.tasks:
        await asyncio.gather(*impl.tasks)
    expected = ends[0] * partitions
    if impl.completed + impl.expired != expected:
        raise RuntimeError(
            f"{impl_name}: {impl.completed} completed + {impl.expired} expired "
            f"of {expected} requests"
        )
    return {
        "pending": pending,
        "partitions": partitions,
        "step": step,
        "rounds": done,
        "triggers": triggers,
        "trigger_completions": completions,
        "cpu_s": cpu,
        "cpu_us_per_trigger": cpu / triggers * 1e6,
        "call_us_per_trigger": trigger_ns / triggers / 1e3,
        "cpu_us_per_completion": cpu / (triggers * step) * 1e6,
        "requests": expected,
        "completed": impl.completed,
        "expired": impl.expired,
        "gc_collections": gc_collections,
    }


def run_acks(impl: str, loop: str = "asyncio", **params: Any) -> Result:
    """Run the acks=all workload once, in this process (params: :data:`DEFAULTS`).

    Args:
        impl: a key of :data:`IMPLS`.
        loop: ``"asyncio"``, ``"uvloop"`` or ``"virtual"`` (asyncio loops only).
        params: ``pending`` requests per partition, ``partitions``, ``step``
            (offsets per trigger, each completing that many requests), ``rounds``
            (most timed rounds, a trigger per partition each), ``min_rounds``,
            ``cpu_budget`` (seconds of CPU after which the rounds stop) and
            ``timeout`` (seconds, of every request).

    Raises:
        ValueError: an unknown implementation, loop or parameter, or one out of range.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if loop in TRIO_LOOPS:
        raise ValueError("the acks=all workload runs on asyncio loops (asyncio, uvloop, virtual)")
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown parameters: {', '.join(sorted(unknown))}")
    merged = dict(DEFAULTS, **params)
    for name in ("pending", "partitions", "step", "rounds", "min_rounds"):
        value = merged[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not merged["cpu_budget"] > 0 or not math.isfinite(merged["cpu_budget"]):
        raise ValueError(f"cpu_budget must be positive and finite, got {merged['cpu_budget']}")
    if not merged["timeout"] > 0 or not math.isfinite(merged["timeout"]):
        raise ValueError(f"timeout must be positive and finite, got {merged['timeout']}")
    result = run_on(loop, lambda: _workload(impl, **merged))
    import aiopurgatory

    result.update(impl=IMPLS[impl], loop=loop, compiled=aiopurgatory.COMPILED)
    return result


def run_spec(spec: Spec) -> Result:
    """Run a ``{"bench": "acks", "impl", "loop", "params"}`` spec."""
    return run_acks(spec["impl"], spec["loop"], **spec.get("params", {}))


register("acks", run_spec)
