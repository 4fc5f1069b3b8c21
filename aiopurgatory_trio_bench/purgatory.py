"""``bench purgatory`` on trio: requests that await their outcome, three ways.

The workload of :mod:`aiopurgatory.bench.purgatory` (Kafka's
``TestPurgatoryPerformance``: the same seeded arrivals, latencies and keys, the
same generator), under ``trio.run``. On trio a request that waits is a task, so
each arrival starts one, in a nursery, that watches its op and waits until the
op completes or expires; the generator completes ops as on asyncio
(``force``: from outside; ``check``/``clock``: ``check_and_complete`` on a key).
Implementations:

* ``ap``: the task runs ``await purgatory.watch(op, keys)`` on an
  :class:`aiopurgatory.Purgatory`; expiry on its timing wheel, the task woken
  through the purgatory's trio waiter.
* ``hand``: what a careful trio programmer writes without a library. The task
  puts its op in a dict of ops per key, waits on a ``trio.Event`` inside
  ``trio.move_on_after(timeout)``, and takes the op out of the watch lists in a
  ``finally``; a trigger marks the op done and sets the event. A deadline
  that cancels the wait is an expiry. Expiry is trio's own deadlines: one
  cancel scope with a deadline per request.
* ``floor``: the same tasks, events and watch lists with no deadline at all: as
  every op has the same timeout, expiries come in start order and a FIFO polled
  by the generator sets the events of expired ops. No trio version of these
  request waits can do less.

Every implementation counts an outcome when the request's task learns it
(``completed``, ``expired``), and measures expiry lateness there: trio's clock
when the task resumes, minus the op's deadline. The task starts on the scheduler
batch after its arrival; it computes the deadline then, in every
implementation (``watch()``, ``move_on_after`` and the floor alike). A
completion that comes due before its task has started waits for the
generator's next wake-up (one batch), in every implementation alike.

Measured per run as on asyncio: achieved arrival rate, CPU per request
(``process_time`` from the first arrival until every request's task ended),
completed/expired counts, expiry lateness, peak RSS, and with ``tracemalloc``
after the timed part the memory per pending request (its task included, the
same in every implementation).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Hashable, Sequence
from typing import Any

import trio
import trio.testing

from aiopurgatory.bench._common import Result
from aiopurgatory.bench.workload import (
    LoopParts,
    OwnTimer,
    WatchLists,
    ap_ops,
    done_clock_op,
    measure_purgatory,
    memory_per_pending,
)

__all__ = ["workload"]


# -- the three implementations ----------------------------------------------------
#
# The interface of aiopurgatory.bench.purgatory's (make, watch, complete, check, poll, next_due,
# pending, outcomes), where watch() starts the request's task. pending() counts
# requests from their arrival until their task has ended, so that the generator
# keeps polling (the floor's expiries) until every task is done.


class _ApImpl(OwnTimer):
    def __init__(
        self,
        nursery: trio.Nursery,
        late: list[float],
        clock: Callable[[], float],
        completion: str,
    ) -> None:
        import aiopurgatory as ap

        class StartedOp(ap.DelayedOperation):
            # Set in watch(), before the request's task is started.
            __slots__ = ("started",)

        FlagOp, ClockOp = ap_ops(clock, StartedOp)

        self.make: Callable[[float], Any] = ClockOp if completion == "clock" else FlagOp
        self.purgatory: ap.Purgatory[Any] = ap.Purgatory("bench")
        self.check = self.purgatory.check_and_complete
        self._start_soon = nursery.start_soon
        self._late = late
        self._clock = clock
        self._completed_outcome = ap.Outcome.COMPLETED
        self._expired_outcome = ap.Outcome.EXPIRED
        self.count = 0
        self.completed = 0
        self.expired = 0

    def watch(self, op: Any, keys: Sequence[Hashable]) -> None:
        op.started = False
        self.count += 1
        self._start_soon(self._request, op, keys)

    async def _request(self, op: Any, keys: Sequence[Hashable]) -> None:
        op.started = True
        try:
            outcome = await self.purgatory.watch(op, keys)
        finally:
            self.count -= 1
        if outcome is self._completed_outcome:
            self.completed += 1
        elif outcome is self._expired_outcome:
            self.expired += 1
            self._late.append(self._clock() - op.deadline)

    def pending(self) -> int:
        return self.count

    def outcomes(self) -> tuple[int, int]:
        return self.completed, self.expired


class _TrioOp:
    """An op of the hand-written and floor implementations."""

    __slots__ = (
        "deadline",
        "done",
        "event",
        "keys",
        "ready",
        "ready_at",
        "started",
        "timed_out",
        "timeout",
    )
    deadline: float
    event: trio.Event
    keys: Sequence[Hashable]

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.done = False
        self.timed_out = False
        self.started = False
        self.ready = False
        self.ready_at = math.inf

    def try_complete(self) -> bool:
        return self.ready and not self.done


class _TaskWatchLists(WatchLists[_TrioOp]):
    """Watch lists that each request's task joins when it starts and leaves when it ends.

    ``count`` (what :meth:`pending` returns) goes up at the arrival, in
    :meth:`watch`, and down when the task leaves the lists.
    """

    def __init__(
        self,
        nursery: trio.Nursery,
        late: list[float],
        clock: Callable[[], float],
        completion: str,
    ) -> None:
        super().__init__(late, clock)
        self.make: Callable[[float], _TrioOp] = (
            done_clock_op(clock, _TrioOp) if completion == "clock" else _TrioOp
        )
        self._start_soon = nursery.start_soon

    def watch(self, op: _TrioOp, keys: Sequence[Hashable]) -> None:
        self.count += 1
        self._start_soon(self._request, op, keys)

    async def _request(self, op: _TrioOp, keys: Sequence[Hashable]) -> None:
        raise NotImplementedError

    def _join(self, op: _TrioOp, keys: Sequence[Hashable]) -> trio.Event:
        op.started = True
        op.keys = keys
        event = op.event = trio.Event()
        oid = id(op)
        watchers = self.watchers
        for key in keys:
            ops = watchers.get(key)
            if ops is None:
                watchers[key] = {oid: op}
            else:
                ops[oid] = op
        return event

    def complete(self, op: _TrioOp) -> None:
        if op.done:
            return
        op.done = True
        op.event.set()


class _HandImpl(_TaskWatchLists):
    """What a careful trio programmer writes: an event, waited on under ``move_on_after``."""

    async def _request(self, op: _TrioOp, keys: Sequence[Hashable]) -> None:
        event = self._join(op, keys)
        try:
            with trio.move_on_after(op.timeout) as scope:
                await event.wait()
        finally:
            self._detach(op)
        if op.done:
            # Completed, even if the deadline passed after the trigger set the event.
            self.completed += 1
        else:
            op.done = True
            self.expired += 1
            self.late.append(self.clock() - scope.deadline)

    def poll(self, now: float) -> None:
        pass

    def next_due(self) -> float:
        return math.inf


class _FloorImpl(_TaskWatchLists):
    """The same tasks and watch lists with no deadline: expiry from a FIFO."""

    def __init__(
        self,
        nursery: trio.Nursery,
        late: list[float],
        clock: Callable[[], float],
        completion: str,
    ) -> None:
        super().__init__(nursery, late, clock, completion)
        self.fifo: deque[_TrioOp] = deque()

    async def _request(self, op: _TrioOp, keys: Sequence[Hashable]) -> None:
        event = self._join(op, keys)
        op.deadline = self.clock() + op.timeout
        self.fifo.append(op)
        try:
            await event.wait()
        finally:
            self._detach(op)
        if op.timed_out:
            self.expired += 1
            self.late.append(self.clock() - op.deadline)
        else:
            self.completed += 1

    def poll(self, now: float) -> None:
        # Tasks started in one scheduler batch may append in either order (trio
        # runs a batch forwards or backwards): an op behind a later deadline
        # waits for it, late by at most the batch's spread, never early.
        fifo = self.fifo
        while fifo and fifo[0].deadline <= now:
            op = fifo.popleft()
            if not op.done:
                op.done = True
                op.timed_out = True
                op.event.set()

    def next_due(self) -> float:
        fifo = self.fifo
        while fifo and fifo[0].done:
            fifo.popleft()
        return fifo[0].deadline if fifo else math.inf


_IMPL_CLASSES: dict[str, Callable[[trio.Nursery, list[float], Callable[[], float], str], Any]] = {
    "ap": _ApImpl,
    "hand": _HandImpl,
    "floor": _FloorImpl,
}


# -- the workload ------------------------------------------------------------------


def workload(impl_name: str, **params: Any) -> Coroutine[Any, Any, Result]:
    """One run of ``impl_name`` in the running trio run (see the module documentation)."""
    return measure_purgatory(functools.partial(_trio_parts, impl_name), **params)


def _trio_parts(impl_name: str) -> LoopParts:
    clock: Callable[[], float] = trio.lowlevel.current_clock().current_time
    make = _IMPL_CLASSES[impl_name]

    @contextlib.asynccontextmanager
    async def requests(late: list[float], completion: str) -> AsyncIterator[Any]:
        # Leaving waits for every request's task to end.
        async with trio.open_nursery() as nursery:
            yield make(nursery, late, clock, completion)

    return LoopParts(
        clock=clock,
        # trio's sleeps are exact floats, and epoll rounds its timeout up to a
        # millisecond: no minimum sleep needed against spinning.
        sleep=trio.sleep,
        impl_scope=requests,
        memory=functools.partial(_memory_per_pending, impl_name),
        deferred=True,
    )


async def _memory_per_pending(
    impl_name: str, count: int, timeout_s: float, keysets: list[list[int]]
) -> float:
    """Bytes traced per pending request (its task included), ``count`` pending.

    The requests get a long timeout and are left waiting until every task is
    blocked; then they are all cancelled.
    """
    clock: Callable[[], float] = trio.lowlevel.current_clock().current_time
    async with trio.open_nursery() as nursery:
        impl = _IMPL_CLASSES[impl_name](nursery, [], clock, "force")
        memory = await memory_per_pending(
            impl, count, timeout_s, keysets, trio.testing.wait_all_tasks_blocked
        )
        nursery.cancel_scope.cancel()
    return memory
