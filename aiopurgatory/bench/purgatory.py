"""``bench purgatory``: Kafka's ``TestPurgatoryPerformance`` workload on asyncio.

Each of ``num`` requests arrives (open loop: exponential gaps at ``rate`` req/s,
or back to back with ``rate=0``), is watched under ``keys`` keys drawn from
``key_space_size`` with a ``timeout``, and draws a log-normal completion latency
with median ``pct50`` and 75th percentile ``pct75`` (ms). If the latency is below
the timeout the request is force-completed that long after it arrived, else it
expires. Implementations, all driven by the same generator:

* ``ap``: :class:`aiopurgatory.Purgatory` (``try_complete_else_watch``,
  ``force_complete``, expiry on its timing wheel; nobody awaits the ops);
* ``hand``: a careful hand-written asyncio purgatory: one ``loop.call_later`` and
  one future per op, a dict of ops per key, left at once on completion;
* ``floor``: the same bookkeeping with no expiry timer at all. Because every op
  has the same timeout, expiries come in arrival order and a FIFO checked by the
  generator replaces the timer. No purgatory can do less work than this.

How a request completes (``completion``):

* ``force``: from outside, ``force_complete()`` at arrival + latency (the
  workload of Kafka's ``TestPurgatoryPerformance``);
* ``check``: Kafka's way. At arrival + latency the request's condition becomes
  true (a flag) and ``check_and_complete(key)`` runs on its first key: every
  pending op watched under that key gets its ``try_complete()`` called. The
  hand-written and floor implementations scan the same watch list and call the
  same kind of method;
* ``clock``: as ``check``, but the op's ``try_complete()`` reads the loop clock
  (``loop.time() >= ready_at``) instead of a flag.

The generator itself (arrival schedule, a heap of pending completions as Kafka's
``CompletionQueue``, the loop wake-ups) costs the same for everyone and is part of
every figure, the floor's included.

Measured per run: achieved arrival rate, CPU per request (``process_time`` from
the first arrival until every op finished), completed/expired counts, expiry
lateness (``loop.time()`` at expiry minus the op's deadline), peak RSS and, with
``tracemalloc`` after the timed part, memory per pending op.

On trio (``loop="trio"`` or ``"trio-virtual"``) each request is a task that
awaits its outcome, against a hand-written trio version of the same waits: see
:mod:`aiopurgatory_trio_bench.purgatory` (a package of its own beside this one,
so that the library imports trio only where it must).
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections import deque
from collections.abc import Callable, Coroutine, Hashable, Sequence
from typing import Any

from ._common import (
    TRIO_LOOPS,
    Result,
    Spec,
    run_on,
    trio_baselines,
)
from ._registry import register
from .hand import HandImpl
from .workload import (
    Flagged,
    LoopParts,
    OwnTimer,
    WatchLists,
    ap_ops,
    done_clock_op,
    measure_purgatory,
    memory_per_pending,
)

__all__ = [
    "COMPLETIONS",
    "IMPLS",
    "SCENARIOS",
    "TRIO_IMPLS",
    "impls",
    "run_purgatory",
    "run_spec",
]

#: Implementation key -> label used in tables and JSON (asyncio and uvloop).
IMPLS = {"ap": "ap.Purgatory", "hand": "hand-written", "floor": "floor (no timer)"}

#: The same on trio, where every request is a task that awaits its outcome
#: (see :mod:`aiopurgatory_trio_bench.purgatory`).
TRIO_IMPLS = {
    "ap": "ap.Purgatory.watch",
    "hand": "hand-written trio",
    "floor": "floor trio (no timer)",
}


def impls(loop: str) -> dict[str, str]:
    """The implementations (key -> label) that run on ``loop``."""
    return TRIO_IMPLS if loop in TRIO_LOOPS else IMPLS


#: Kafka's published scenarios: (pct75, pct50) in ms.
SCENARIOS = {"low-timeout": (60.0, 20.0), "high-timeout": (400.0, 200.0)}

#: How requests complete (see the module documentation).
COMPLETIONS = ("force", "check", "clock")

DEFAULTS: dict[str, Any] = {
    "num": 200_000,
    "rate": 0.0,
    "timeout": 200.0,
    "pct75": 60.0,
    "pct50": 20.0,
    "keys": 3,
    "key_space_size": 100,
    "batch": 1000,
    "memory_ops": 20_000,
    "seed": 1,
    "completion": "force",
}


# -- the three implementations ----------------------------------------------------
#
# Each exposes: make(timeout_s) -> op, watch(op, keys), complete(op), check(key)
# (complete the ops of key whose condition holds), poll(now) (expire what is
# due, floor only), next_due() and pending(). Ops have ``ready`` (the condition,
# for completion "check") and ``ready_at`` (for "clock").


class _ApImpl(OwnTimer):
    def __init__(self, late: list[float], clock: Callable[[], float], completion: str) -> None:
        import aiopurgatory as ap

        class BenchOp(ap.DelayedOperation):
            __slots__ = ()

            def on_expiration(self) -> None:
                late.append(clock() - self.deadline)  # type: ignore[operator]

        FlagOp, ClockOp = ap_ops(clock, BenchOp)

        makers: dict[str, Callable[[float], Any]] = {
            "force": BenchOp,
            "check": FlagOp,
            "clock": ClockOp,
        }
        self.make = makers[completion]
        self.purgatory: ap.Purgatory[Any] = ap.Purgatory("bench")
        self.watch = self.purgatory.try_complete_else_watch
        self.check = self.purgatory.check_and_complete

    def pending(self) -> int:
        return self.purgatory.pending

    def outcomes(self) -> tuple[int, int]:
        stats = self.purgatory.statistics()
        return stats.completed, stats.expired


class _FloorOp:
    __slots__ = ("deadline", "done", "keys", "timeout")
    deadline: float
    keys: Sequence[Hashable]

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.done = False

    def try_complete(self) -> bool:  # pragma: no cover - completion "force" never checks
        return False


class _FloorFlagOp(Flagged, _FloorOp):
    __slots__ = ("ready", "ready_at")

    def try_complete(self) -> bool:
        return self.ready and not self.done


class _FloorImpl(WatchLists[_FloorOp]):
    """The hand-written bookkeeping minus any timer: expiry from a FIFO."""

    def __init__(self, late: list[float], clock: Callable[[], float], completion: str) -> None:
        super().__init__(late, clock)
        makers: dict[str, Callable[[float], _FloorOp]] = {
            "force": _FloorOp,
            "check": _FloorFlagOp,
            "clock": done_clock_op(clock, _FloorFlagOp),
        }
        self.make = makers[completion]
        self.fifo: deque[_FloorOp] = deque()

    def watch(self, op: _FloorOp, keys: Sequence[Hashable]) -> None:
        op.deadline = self.clock() + op.timeout
        op.keys = keys
        oid = id(op)
        watchers = self.watchers
        for key in keys:
            ops = watchers.get(key)
            if ops is None:
                watchers[key] = {oid: op}
            else:
                ops[oid] = op
        self.fifo.append(op)
        self.count += 1

    def complete(self, op: _FloorOp) -> None:
        if op.done:
            return
        op.done = True
        self._detach(op)
        self.completed += 1

    def poll(self, now: float) -> None:
        fifo = self.fifo
        while fifo and fifo[0].deadline <= now:
            op = fifo.popleft()
            if not op.done:
                op.done = True
                self.late.append(now - op.deadline)
                self._detach(op)
                self.expired += 1

    def next_due(self) -> float:
        fifo = self.fifo
        while fifo and fifo[0].done:
            fifo.popleft()
        return fifo[0].deadline if fifo else math.inf


_IMPL_CLASSES: dict[str, Callable[[list[float], Callable[[], float], str], Any]] = {
    "ap": _ApImpl,
    "hand": HandImpl,
    "floor": _FloorImpl,
}


# -- the workload ------------------------------------------------------------------


class _Made:
    """The asyncio implementation as :func:`.workload.measure_purgatory` takes it:
    nothing left running at the end of the run."""

    def __init__(self, impl: Any) -> None:
        self.impl = impl

    async def __aenter__(self) -> Any:
        return self.impl

    async def __aexit__(self, *exc_info: object) -> None:
        pass


def _workload(impl_name: str, **params: Any) -> Coroutine[Any, Any, Result]:
    return measure_purgatory(functools.partial(_asyncio_parts, impl_name), **params)


def _asyncio_parts(impl_name: str) -> LoopParts:
    loop = asyncio.get_running_loop()
    clock = loop.time
    make = _IMPL_CLASSES[impl_name]

    async def memory(count: int, timeout_s: float, keysets: list[list[int]]) -> float:
        return await memory_per_pending(make([], clock, "force"), count, timeout_s, keysets)

    return LoopParts(
        clock=clock,
        sleep=asyncio.sleep,
        impl_scope=lambda late, completion: _Made(make(late, clock, completion)),
        memory=memory,
        # uvloop rounds timers to whole milliseconds, down: a shorter sleep returns at
        # once, and an open-loop generator would spin until its next arrival, burning
        # CPU that counts against every implementation alike. Sleep a millisecond at
        # least there (asyncio's selector rounds its timeout up to one anyway).
        min_sleep=0.001 if type(loop).__module__.startswith("uvloop") else 0.0,
    )


def run_purgatory(
    impl: str,
    loop: str = "asyncio",
    *,
    num: int = DEFAULTS["num"],
    rate: float = DEFAULTS["rate"],
    timeout: float = DEFAULTS["timeout"],
    pct75: float = DEFAULTS["pct75"],
    pct50: float = DEFAULTS["pct50"],
    keys: int = DEFAULTS["keys"],
    key_space_size: int = DEFAULTS["key_space_size"],
    batch: int = DEFAULTS["batch"],
    memory_ops: int = DEFAULTS["memory_ops"],
    seed: int = DEFAULTS["seed"],
    completion: str = DEFAULTS["completion"],
) -> Result:
    """Run the purgatory workload once, in this process, and return its measurements.

    Args:
        impl: ``"ap"``, ``"hand"`` or ``"floor"`` (on trio, their trio versions:
            :data:`TRIO_IMPLS`).
        loop: ``"asyncio"``, ``"uvloop"``, ``"virtual"``, ``"trio"`` or
            ``"trio-virtual"``.
        num: number of requests.
        rate: target arrival rate in requests per second; 0 for back to back.
        timeout: op timeout in ms.
        pct75: 75th percentile of the completion latency in ms.
        pct50: median of the completion latency in ms.
        keys: watch keys per request.
        key_space_size: number of distinct keys.
        batch: most arrivals issued per loop wake-up.
        memory_ops: ops pending while memory is traced (0: skip).
        seed: random seed of arrivals, latencies and keys.
        completion: ``"force"``, ``"check"`` or ``"clock"`` (module documentation).

    Raises:
        ValueError: an unknown name or an out-of-range number.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if num < 1:
        raise ValueError(f"num must be at least 1, got {num}")
    if rate < 0 or not math.isfinite(rate):
        raise ValueError(f"rate must be finite and >= 0, got {rate}")
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    if not 0 < pct50 < pct75:
        raise ValueError(f"need 0 < pct50 < pct75, got pct50={pct50}, pct75={pct75}")
    if not 1 <= keys <= key_space_size:
        raise ValueError(f"need 1 <= keys <= key_space_size, got {keys} and {key_space_size}")
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    if completion not in COMPLETIONS:
        raise ValueError(f"completion must be one of {', '.join(COMPLETIONS)}, got {completion!r}")
    workload: Callable[..., Coroutine[Any, Any, Result]] = _workload
    if loop in TRIO_LOOPS:
        with trio_baselines(loop):
            from aiopurgatory_trio_bench import purgatory as trio_purgatory

        workload = trio_purgatory.workload
    result = run_on(
        loop,
        lambda: workload(
            impl,
            num=num,
            rate=rate,
            timeout=timeout,
            pct75=pct75,
            pct50=pct50,
            keys=keys,
            key_space_size=key_space_size,
            batch=batch,
            memory_ops=memory_ops,
            seed=seed,
            completion=completion,
        ),
    )
    result.update(impl=impls(loop)[impl], loop=loop)
    return result


def run_spec(spec: Spec) -> Result:
    """Run a ``{"bench": "purgatory", "impl", "loop", "params"}`` spec."""
    return run_purgatory(spec["impl"], spec["loop"], **spec.get("params", {}))


register("purgatory", run_spec)
