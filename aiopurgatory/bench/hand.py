"""The hand-written asyncio purgatory: the baseline of ``bench purgatory`` and of its
realistic headline (:mod:`.realistic`).

What a careful asyncio programmer writes without a library: per op one future and
one ``loop.call_later`` for its timeout, a dict of ops per key (left at once on
completion), expiry lateness read against the handle's deadline. The realistic
headline awaits each op in a task of its own (:meth:`HandImpl.watch` there runs in
that task); ``bench purgatory`` watches the ops directly.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Hashable, Sequence

from .workload import Flagged, WatchLists

__all__ = ["HandFlagOp", "HandImpl", "HandOp", "hand_ops"]


class HandOp:
    """An op completed from outside (completion ``force``): no condition to read."""

    __slots__ = ("deadline", "future", "handle", "keys", "timeout")
    deadline: float
    future: asyncio.Future[bool]
    handle: asyncio.TimerHandle
    keys: Sequence[Hashable]

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    def try_complete(self) -> bool:  # pragma: no cover - completion "force" never checks
        return False


class HandFlagOp(Flagged, HandOp):
    """An op whose condition is a flag the producer sets (completion ``check``)."""

    __slots__ = ("ready", "ready_at")

    def try_complete(self) -> bool:
        return self.ready and not self.future.done()


def hand_ops(clock: Callable[[], float]) -> dict[str, type[HandOp]]:
    """The op class of each completion: ``force``, ``check`` and ``clock`` (whose
    condition is ``clock() >= ready_at``)."""

    class HandClockOp(HandFlagOp):
        __slots__ = ()

        def try_complete(self) -> bool:
            return clock() >= self.ready_at and not self.future.done()

    return {"force": HandOp, "check": HandFlagOp, "clock": HandClockOp}


class HandImpl(WatchLists[HandOp]):
    """The hand-written purgatory: ``make(timeout_s)``, ``watch``, ``check``,
    ``complete``; expiry lateness goes to ``late``."""

    def __init__(self, late: list[float], clock: Callable[[], float], completion: str) -> None:
        super().__init__(late, clock)
        self.loop = asyncio.get_running_loop()
        self.make: Callable[[float], HandOp] = hand_ops(clock)[completion]

    def watch(self, op: HandOp, keys: Sequence[Hashable]) -> None:
        loop = self.loop
        op.future = loop.create_future()
        handle = op.handle = loop.call_later(op.timeout, self._expire, op)
        op.deadline = handle.when()
        op.keys = keys
        oid = id(op)
        watchers = self.watchers
        for key in keys:
            ops = watchers.get(key)
            if ops is None:
                watchers[key] = {oid: op}
            else:
                ops[oid] = op
        self.count += 1

    def complete(self, op: HandOp) -> None:
        future = op.future
        if future.done():
            return
        op.handle.cancel()
        self._detach(op)
        self.completed += 1
        future.set_result(True)

    def _expire(self, op: HandOp) -> None:
        future = op.future
        if future.done():  # pragma: no cover - complete() cancels the handle first
            return
        self.late.append(self.clock() - op.deadline)
        self._detach(op)
        self.expired += 1
        future.set_result(False)

    def poll(self, now: float) -> None:
        pass

    def next_due(self) -> float:
        return math.inf
