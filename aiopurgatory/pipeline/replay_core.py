"""Trace replay through the real :class:`~aiopurgatory.Purgatory` on virtual time.

This module is the single source of truth for replay results: the Spark job
(:mod:`aiopurgatory.pipeline.replay`) calls :func:`replay_requests` once per
(parameter set, broker) group inside ``applyInPandas``, and
:func:`replay_trace` calls the very same function in one process. Virtual time
makes it deterministic, so both give identical per-op facts.

The model (a quorum reading of ``acks=all``):

* Each broker is the leader of the partitions of its requests and has one
  purgatory (``broker-<id>``); brokers are independent, so splitting the trace by
  broker is exact.
* A request arriving at ``arrival`` becomes a produce operation with the
  parameter set's ``timeout``, watched under its ``topic-partition`` key.
  ``acks`` 0 and 1 need only the leader's write: they complete at once.
  ``acks=-1`` (all) needs ``min_insync`` replicas, the leader included, so it
  completes when the ``min_insync - 1``-th fastest follower acknowledges, at
  ``arrival + delay``; every such acknowledgement triggers
  ``check_and_complete(topic-partition)``, as a follower fetch does in Kafka.
  A follower with a null or infinite delay never acknowledges. If the op is
  still pending at its deadline, the purgatory's timing wheel expires it
  (rounded up to the ``tick``, so ``lateness`` is in ``[0, tick)``).
* Facts are the fields of :class:`aiopurgatory.events.EventRecorder` (schema 1),
  taken by a lean recorder on the purgatory's ``set_recorder`` hook, with the
  virtual clock as ``ts``; the tests check it against EventRecorder itself.

Kafka's real ``acks=all`` waits for every in-sync replica and shrinks the ISR
after ``replica.lag.time.max.ms``; the quorum model keeps the what-if knobs
(timeout, min-insync, tick) and the purgatory mechanics, not the ISR dynamics.
"""

from __future__ import annotations

import asyncio
import gc
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import simulation
from .._operation import DelayedOperation, Outcome
from .._purgatory import Purgatory
from ..events import EventRecorder
from .schema import FACT_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ReplayParams",
    "ReplayedProduce",
    "parse_sweep",
    "replay_requests",
    "replay_trace",
]


def _positive_float(value: object, name: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class ReplayParams:
    """One parameter set of a replay (one scenario of a what-if sweep).

    Args:
        timeout: produce timeout in seconds (``request.timeout.ms``), >= 0.
        min_insync: replicas, the leader included, that must have an
            ``acks=all`` write before it completes; >= 1.
        tick: the purgatory timer's tick in seconds, > 0.
        wheel_size: slots per timing-wheel level, >= 2.

    Raises:
        TypeError: a field has the wrong type.
        ValueError: a field is out of range.
    """

    timeout: float = 30.0
    min_insync: int = 2
    tick: float = 0.001
    wheel_size: int = 20

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "timeout", _positive_float(self.timeout, "timeout", allow_zero=True)
        )
        object.__setattr__(self, "tick", _positive_float(self.tick, "tick"))
        for name, low in (("min_insync", 1), ("wheel_size", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < low:
                raise ValueError(f"{name} must be at least {low}, got {value}")

    @property
    def label(self) -> str:
        """The scenario name in the fact table: ``timeout=0.5 min_insync=2 tick=0.001``."""
        label = f"timeout={self.timeout:g} min_insync={self.min_insync} tick={self.tick:g}"
        if self.wheel_size != 20:
            label += f" wheel_size={self.wheel_size}"
        return label


def parse_sweep(
    timeouts: str, min_insyncs: str, ticks: str, wheel_sizes: str = "20"
) -> list[ReplayParams]:
    """Every combination of comma-separated parameter lists, in the order given.

    Args:
        timeouts: e.g. ``"0.5,1,30"`` (seconds).
        min_insyncs: e.g. ``"2,3"``.
        ticks: e.g. ``"0.001"`` (seconds).
        wheel_sizes: e.g. ``"20"``.

    Raises:
        ValueError: an item is not a number or out of range; a list is empty.
    """

    def items(text: str, name: str, convert: type[float] | type[int]) -> list[Any]:
        values = []
        for item in text.split(","):
            item = item.strip()
            try:
                values.append(convert(item))
            except ValueError:
                raise ValueError(f"{name}: {item!r} is not a valid {convert.__name__}") from None
        if not values:
            raise ValueError(f"{name} must list at least one value")
        return values

    sets = [
        ReplayParams(timeout=t, min_insync=m, tick=k, wheel_size=w)
        for t in items(timeouts, "timeout", float)
        for m in items(min_insyncs, "min_insync", int)
        for k in items(ticks, "tick", float)
        for w in items(wheel_sizes, "wheel_size", int)
    ]
    return list(dict.fromkeys(sets))


class ReplayedProduce(DelayedOperation):
    """A replayed produce request: completes once ``required`` replicas have it.

    Args:
        timeout: seconds until expiry once watched.
        op_id: the trace's ``request_id`` (recorded as the event's ``op_id``).
        required: replicas needed, the leader included; the leader's own write
            counts at once.
        order: the request's position in the replay (arrival, then request id);
            ops expiring at the same instant are recorded in this order.
    """

    __slots__ = ("acked", "op_id", "order", "required")

    def __init__(self, timeout: float, op_id: int, required: int, order: int = 0) -> None:
        super().__init__(timeout)
        self.op_id = op_id
        self.required = required
        self.order = order
        self.acked = 1

    def try_complete(self) -> bool:
        """Complete if enough replicas have acknowledged."""
        if self.acked >= self.required:
            return self.force_complete()
        return False


class _Rows:
    """A structlog-compatible sink that keeps the recorder's events as dicts."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.rows.append(fields)


_FACT_FIELDS = (
    "purgatory",
    "op_id",
    "op_type",
    "keys",
    "timeout",
    "watched_at",
    "finished_at",
    "outcome",
    "wait",
    "lateness",
    "ts",
)


class _Columns:
    """A lean recorder: the fields :class:`EventRecorder` writes, as columns.

    It keeps only the finished operation and the clock per call and reads the
    rest at the end: a finished operation's deadline, timeout, keys and outcome
    never change again. Several times cheaper than EventRecorder's keyword dicts;
    the tests check that both give identical facts (``use_event_recorder=True``).
    """

    def __init__(self, name: str, loop: asyncio.AbstractEventLoop) -> None:
        self.name = name
        self.loop = loop
        self.ops: list[DelayedOperation] = []
        self.times: list[float] = []

    def __call__(self, op: DelayedOperation) -> None:
        self.ops.append(op)
        self.times.append(self.loop.time())

    def rows(self) -> dict[str, Any]:
        """The fact columns (as lists and float64 arrays), in the order recorded."""
        import numpy as np

        ops = self.ops
        outcomes = [op.outcome for op in ops]
        for run in _expiry_ties(outcomes, self.times):
            ops[run] = sorted(ops[run], key=_order_of)  # all EXPIRED, one time: only ops move
        now = np.array(self.times, dtype="float64")
        # A deadline of None (completed at once, never scheduled) becomes NaN.
        deadline = np.array([op.deadline for op in ops], dtype="float64")
        timeout = np.array([op.timeout for op in ops], dtype="float64")
        scheduled = ~np.isnan(deadline)
        watched_at = np.where(scheduled, deadline - timeout, now)
        # (Outcome members hash in Python: compare by identity instead.)
        expired_ = Outcome.EXPIRED
        completed_ = Outcome.COMPLETED
        outcome = [
            "completed" if o is completed_ else "expired" if o is expired_ else o.value  # type: ignore[union-attr]
            for o in outcomes
        ]
        expired = np.array([o is expired_ for o in outcomes], dtype=bool)
        op_keys = [op.keys for op in ops]
        names = {key: tuple(str(k) for k in key) for key in set(op_keys)}
        keys = [list(names[key]) for key in op_keys]
        return {
            "purgatory": [self.name] * len(ops),
            "op_id": [op.op_id for op in ops],  # type: ignore[attr-defined]
            "op_type": [type(op).__name__ for op in ops],
            "keys": keys,
            "timeout": timeout,
            "watched_at": watched_at,
            "finished_at": now,
            "outcome": outcome,
            "wait": now - watched_at,
            "lateness": np.where(expired & scheduled, now - deadline, np.nan),
            "ts": now,
        }


def _order_of(op: DelayedOperation) -> int:
    return op.order  # type: ignore[attr-defined, no-any-return]


def _expiry_ties(outcomes: Sequence[Outcome | str | None], times: Sequence[float]) -> list[slice]:
    """Runs of two or more consecutive records of ops that expired at the same time.

    The wheel files an op on a level that depends on when it reached the wheel,
    and ops of one tick come out of a cascade after those filed on level 0
    directly; so the order of simultaneous expiries says how the timer was
    driven, not what happened. The facts list them in watch order instead (a
    stable refinement: everything else stays in the order it finished).
    """
    runs = []
    expired = [i for i, o in enumerate(outcomes) if o is Outcome.EXPIRED or o == "expired"]
    start = 0
    while start < len(expired):
        stop = start + 1
        first = expired[start]
        while (
            stop < len(expired)
            and expired[stop] == first + stop - start
            and times[expired[stop]] == times[first]
        ):
            stop += 1
        if stop - start > 1:
            runs.append(slice(first, first + stop - start))
        start = stop
    return runs


def _quiet_logger() -> Any:
    # Replays run inside Spark tasks: the purgatory's info events (one per close)
    # would flood worker output; warnings and errors still reach stderr.
    import logging
    import sys

    import structlog

    return structlog.wrap_logger(
        structlog.PrintLogger(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        processors=[structlog.processors.KeyValueRenderer()],
    )


_ARRIVAL = 0
_ACK = 1


def _first_acks(
    arrival: Any, delays: Any, waiting: Any, needed: int, request_id: Any
) -> tuple[Any, Any] | None:
    """The ``needed`` earliest finite acknowledgement times of each waiting request.

    Vectorized for the usual trace, where every delay list has the same length;
    None (the caller loops) when the lists are ragged or a list is null.
    Returns (times, request indices), request by request, earliest first;
    requests with fewer than ``needed`` finite delays get none (they expire).

    Raises:
        ValueError: a request that gets acknowledgements has a negative delay.
    """
    import numpy as np

    if not len(waiting):
        return np.empty(0, dtype="float64"), np.empty(0, dtype="int64")
    try:
        matrix = np.array([delays[i] for i in waiting.tolist()], dtype="float64")
    except (TypeError, ValueError):
        return None
    if matrix.ndim != 2:
        return None
    matrix[~np.isfinite(matrix)] = np.inf  # null, NaN and +-inf: never
    matrix.sort(axis=1)
    enough = np.isfinite(matrix[:, needed - 1]) if matrix.shape[1] >= needed else None
    if enough is None or not enough.any():
        return np.empty(0, dtype="float64"), np.empty(0, dtype="int64")
    rows = waiting[enough]
    negative = matrix[enough, 0] < 0
    if negative.any():
        i = int(rows[np.argmax(negative)])
        raise ValueError(f"requests: negative replica delay in request {request_id[i]}")
    times = (arrival[rows][:, None] + matrix[enough, :needed]).ravel()
    return times, np.repeat(rows, needed)


def _plan(requests: pd.DataFrame, params: ReplayParams) -> tuple[list[Any], ...]:
    """Order requests and build the time-sorted event list (arrivals and acks)."""
    import numpy as np

    arrival = requests["arrival"].to_numpy(dtype="float64")
    request_id = requests["request_id"].to_numpy(dtype="int64")
    if len(arrival) and not np.isfinite(arrival).all():
        raise ValueError("requests: arrival must be finite")
    order = np.lexsort((request_id, arrival))
    arrival = arrival[order]
    request_id = request_id[order]
    acks = requests["acks"].to_numpy(dtype="int64")[order]
    topics = requests["topic"].to_numpy(dtype=object)[order]
    partitions = requests["partition"].to_numpy(dtype="int64")[order]
    delays_column = requests["replica_delays"].to_numpy(dtype=object)[order]

    n = len(order)
    keys = [f"{t}-{p}" for t, p in zip(topics.tolist(), partitions.tolist(), strict=True)]
    required = np.where(acks == -1, params.min_insync, 1).astype("int64")
    needed = params.min_insync - 1
    ack_time: Any = []
    ack_index: Any = []
    if needed > 0:
        waiting = np.flatnonzero(acks == -1)
        acked = _first_acks(arrival, delays_column, waiting, needed, request_id)
        if acked is not None:
            ack_time, ack_index = acked
        else:
            # Ragged or null delay lists: one request at a time.
            isfinite = math.isfinite
            for i in waiting.tolist():
                raw = delays_column[i]
                if raw is None:
                    continue
                finite = sorted(d for d in raw if d is not None and isfinite(d))
                if len(finite) < needed:
                    continue  # can never reach min_insync: it will expire
                if finite[0] < 0:
                    raise ValueError(f"requests: negative replica delay in request {request_id[i]}")
                start = arrival[i]
                for d in finite[:needed]:
                    ack_time.append(start + d)
                    ack_index.append(i)
    times = np.concatenate([arrival, np.asarray(ack_time, dtype="float64")])
    kinds = np.concatenate(
        [np.full(n, _ARRIVAL, dtype="int8"), np.full(len(ack_time), _ACK, dtype="int8")]
    )
    index = np.concatenate([np.arange(n, dtype="int64"), np.asarray(ack_index, dtype="int64")])
    # Ties: arrivals before acks, then trace order; fixed, so replays are exact.
    sort = np.lexsort((index, kinds, times))
    return (
        times[sort].tolist(),
        kinds[sort].tolist(),
        index[sort].tolist(),
        keys,
        request_id.tolist(),
        required.tolist(),
    )


async def _sleep_until(loop: simulation.VirtualTimeLoop, when: float) -> None:
    """Let the loop run until virtual time ``when``.

    The virtual loop jumps its clock to a handle's ``when`` exactly and runs it
    only then, so the wait ends with the clock at ``when``.
    """
    future: asyncio.Future[None] = loop.create_future()
    handle = loop.call_at(when, future.set_result, None)
    try:
        await future
    finally:
        handle.cancel()


async def _run_plain(
    loop: simulation.VirtualTimeLoop,
    plan: tuple[list[Any], ...],
    purgatory: Purgatory[ReplayedProduce],
    ops: list[ReplayedProduce | None],
    op_timeout: float,
) -> None:
    """The reference: the loop gets a turn (and moves the clock) before every new time."""
    times, kinds, index, keys, request_ids, required = plan
    watch = purgatory.try_complete_else_watch
    trigger = purgatory.check_and_complete
    for when, kind, i in zip(times, kinds, index, strict=True):
        if when > loop.time():
            await _sleep_until(loop, when)
        if kind == _ARRIVAL:
            op = ReplayedProduce(op_timeout, request_ids[i], required[i], i)
            ops[i] = op
            watch(op, (keys[i],))
        else:
            op = ops[i]
            assert op is not None
            if op.outcome is None:
                op.acked += 1
                trigger(keys[i])


async def _run_batched(
    loop: simulation.VirtualTimeLoop,
    plan: tuple[list[Any], ...],
    purgatory: Purgatory[ReplayedProduce],
    ops: list[ReplayedProduce | None],
    op_timeout: float,
) -> None:
    """Like :func:`_run_plain`, giving the loop a turn only when one could matter.

    The replay is the loop's only task, its operations have no awaiters, and its
    purgatory has a timer of its own. Between two turns, the loop's state then
    changes only through that timer: ``try_complete_else_watch`` *stages* each
    new pending op (it reaches the wheel from one flush per loop iteration), and
    finishing an op takes it out of the stage or the wheel (disarming the timer
    when nothing is left). Nothing arms a new wake-up. A turn would therefore:

    * flush the staged ops into the wheel. A staged op keeps its absolute
      deadline, so flushing it later files it under the same tick as long as that
      tick has not come. All ops share one timeout, so the first op watched
      (and still pending) since the last turn has the earliest deadline of them
      all, and deadlines round *up* to ticks: nothing staged can be due before
      that deadline (``limit`` below);
    * run the timer's wake-up, if the event is at or after the timer's next due
      instant (:meth:`~aiopurgatory.Timer.next_due`, read after each turn: it
      cannot move earlier between turns). A wake-up the timer armed for a bucket
      emptied since is skipped; it finds nothing due whenever it runs.

    So an event strictly before both is run at once with the clock set by
    :meth:`~aiopurgatory.simulation.VirtualTimeLoop.advance_to`. Otherwise the
    loop gets its turn exactly as in the plain path (flush at the current time,
    then handles in time order: expiries at a time come before events at that
    time). Every op therefore completes, or expires, at the same time as in the
    plain path; only the wheel level that a late-flushed op sits on can differ,
    which is why the facts are put in a canonical order (see
    :func:`_expiry_ties`).
    """
    times, kinds, index, keys, request_ids, required = plan
    watch = purgatory.try_complete_else_watch
    trigger = purgatory.check_and_complete
    advance_to = loop.advance_to
    next_due = purgatory.timer.next_due
    inf = math.inf
    now = loop.time()
    due = next_due()
    limit = inf if due is None else due
    # Whether an op has been staged since the last turn.
    staged = False
    for when, kind, i in zip(times, kinds, index, strict=True):
        if when > now:
            if when < limit:
                advance_to(when)
            else:
                await _sleep_until(loop, when)
                due = next_due()
                limit = inf if due is None else due
                staged = False
            now = when
        if kind == _ARRIVAL:
            op = ReplayedProduce(op_timeout, request_ids[i], required[i], i)
            ops[i] = op
            if not watch(op, (keys[i],)) and not staged:
                # Pending, so staged: the first since the last turn, the earliest deadline.
                staged = True
                deadline: float = op.deadline  # type: ignore[assignment]
                if deadline < limit:
                    limit = deadline
        else:
            op = ops[i]
            assert op is not None
            if op.outcome is None:
                op.acked += 1
                trigger(keys[i])


async def _drive(
    plan: tuple[list[Any], ...],
    params: ReplayParams,
    name: str,
    fast: bool,
    use_event_recorder: bool,
) -> Any:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, simulation.VirtualTimeLoop)  # run by simulation.run (_replay)
    purgatory: Purgatory[ReplayedProduce] = Purgatory(
        name, tick=params.tick, wheel_size=params.wheel_size, logger=_quiet_logger()
    )
    sink = _Rows()
    recorder = EventRecorder(sink, clock=loop.time)
    columns = _Columns(name, loop)
    order: list[int] = []
    if use_event_recorder:

        def record(op: DelayedOperation) -> None:
            order.append(op.order)  # type: ignore[attr-defined]
            recorder.record(purgatory, op)

        purgatory.set_recorder(record)
    else:
        purgatory.set_recorder(columns)
    ops: list[ReplayedProduce | None] = [None] * len(plan[3])
    if fast:
        await _run_batched(loop, plan, purgatory, ops, params.timeout)
    else:
        await _run_plain(loop, plan, purgatory, ops, params.timeout)
    if purgatory.pending:
        # Everything still pending was watched by now: let the wheel expire it.
        await asyncio.sleep(params.timeout + 2 * params.tick)
    purgatory.close()
    if not use_event_recorder:
        return columns.rows()
    rows = sink.rows
    outcomes = [row["outcome"] for row in rows]
    for run in _expiry_ties(outcomes, [row["finished_at"] for row in rows]):
        rows[run] = [row for _, row in sorted(zip(order[run], rows[run], strict=True))]
    return rows


def replay_requests(
    requests: pd.DataFrame,
    params: ReplayParams,
    *,
    purgatory: str = "broker",
    source: str = "",
    fast: bool = True,
    use_event_recorder: bool = False,
) -> pd.DataFrame:
    """Replay one broker's requests through a fresh purgatory on virtual time.

    A pure function of its arguments: the same requests (in any row order) and
    parameters give the same facts on every run and on every machine.

    Args:
        requests: rows with the trace columns ``request_id``, ``topic``,
            ``partition``, ``arrival``, ``acks``, ``replica_delays`` (see
            :data:`~aiopurgatory.pipeline.schema.TRACE_COLUMNS`).
        params: the parameter set.
        purgatory: the purgatory's name (the facts' ``purgatory`` column).
        source: the facts' ``source`` column (the trace's path).
        fast: skip the event loop when it would only move the clock (same results;
            False runs every event through the loop, for checking that claim).
        use_event_recorder: record through :class:`EventRecorder` (slower; same
            facts as the default lean recorder, for checking that claim).

    Returns:
        The per-op fact table (:data:`~aiopurgatory.pipeline.schema.FACT_COLUMNS`),
        one row per request in the order the ops finished (ops that expire at
        the same instant in the order they were watched).

    Raises:
        TypeError: ``params`` is not a ReplayParams.
        ValueError: a column is missing, an arrival is not finite, a delay is negative.
    """

    if not isinstance(params, ReplayParams):
        raise TypeError(f"params must be a ReplayParams, got {type(params).__name__}")
    missing = {"request_id", "topic", "partition", "arrival", "acks", "replica_delays"} - set(
        requests.columns
    )
    if missing:
        raise ValueError(f"requests: missing columns {sorted(missing)}")
    # The replay allocates millions of small objects and keeps every op (and the
    # trace) alive to the end, so the cyclic collector would rescan an ever
    # larger heap, again and again, for cycles the replay does not make: a
    # quarter of the time at a million requests. It is paused meanwhile;
    # reference counting frees everything as usual.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _replay(requests, params, purgatory, source, fast, use_event_recorder)
    finally:
        if collecting:
            gc.enable()


def _replay(
    requests: pd.DataFrame,
    params: ReplayParams,
    purgatory: str,
    source: str,
    fast: bool,
    use_event_recorder: bool,
) -> pd.DataFrame:
    import pandas as pd

    plan = _plan(requests, params)
    rows = simulation.run(_drive(plan, params, purgatory, fast, use_event_recorder))
    if use_event_recorder:
        facts = pd.DataFrame.from_records(rows, columns=list(_FACT_FIELDS))
    else:
        facts = pd.DataFrame(rows, columns=list(_FACT_FIELDS))
    facts["op_id"] = facts["op_id"].astype("int64").astype(str)
    facts["lateness"] = facts["lateness"].astype("float64")
    facts.insert(0, "scenario", params.label)
    facts.insert(1, "source", source)
    return facts[list(FACT_COLUMNS)]


def replay_trace(
    trace: pd.DataFrame,
    param_sets: Sequence[ReplayParams],
    *,
    source: str = "",
    fast: bool = True,
) -> pd.DataFrame:
    """Replay a whole trace in this process: every parameter set, every broker.

    The reference for the Spark replay (same function per group, so identical
    facts); also fine on its own for traces that fit in memory.

    Args:
        trace: the request trace (with a ``broker`` column).
        param_sets: at least one parameter set.
        source: the facts' ``source`` column.
        fast: see :func:`replay_requests`.

    Returns:
        The fact table of all scenarios and brokers.

    Raises:
        ValueError: ``param_sets`` is empty; see :func:`replay_requests`.
    """
    import pandas as pd

    if not param_sets:
        raise ValueError("param_sets must not be empty")
    parts = [
        replay_requests(group, params, purgatory=f"broker-{broker}", source=source, fast=fast)
        for params in param_sets
        for broker, group in trace.groupby("broker", sort=True)
    ]
    if not parts:
        return pd.DataFrame({name: pd.Series(dtype=object) for name in FACT_COLUMNS})
    return pd.concat(parts, ignore_index=True)
