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
* Facts are the fields of :class:`aiopurgatory.events.EventRecorder` (schema 2),
  taken by a lean recorder on the purgatory's ``set_recorder`` hook, with the
  virtual clock as ``ts``; the tests check it against EventRecorder itself.

Kafka's real ``acks=all`` waits for every in-sync replica and shrinks the ISR
after ``replica.lag.time.max.ms``; the quorum model keeps the what-if knobs
(timeout, min-insync, tick) and the purgatory mechanics, not the ISR dynamics.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import simulation
from .._operation import DelayedOperation, Outcome
from .._purgatory import Purgatory
from ..events import EventRecorder
from .schema import FACT_COLUMNS, fact_arrow_schema

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ReplayParams",
    "ReplayedProduce",
    "parse_sweep",
    "replay_requests",
    "replay_table",
    "replay_trace",
    "replay_trace_table",
    "split_brokers",
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


#: The fields an op event carries: the fact columns after ``scenario`` and ``source``.
_FACT_FIELDS = tuple(FACT_COLUMNS)[2:]


class _Finished:
    """A lean recorder: each finished operation and the clock when it finished.

    Everything else a fact holds follows from the plan (see :func:`_facts`), so
    the replay's per-op cost is two appends. Several times cheaper than
    :class:`EventRecorder`'s keyword dicts; the tests check that both give
    identical facts (``use_event_recorder=True``).
    """

    __slots__ = ("ops", "time", "times")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.ops: list[DelayedOperation] = []
        self.times: list[float] = []
        self.time = loop.time

    def __call__(self, op: DelayedOperation) -> None:
        self.ops.append(op)
        self.times.append(self.time())


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


@dataclass(slots=True)
class _Plan:
    """One broker's requests in replay order, and the time-sorted events to replay.

    ``times``, ``kinds`` and ``index`` are the events (Python lists: the replay
    loop reads them one by one); the arrays, indexed by request position in
    replay order, are what the facts are built from.
    """

    times: list[float]
    kinds: list[int]
    index: list[int]
    keys: list[str]
    request_ids: list[int]
    required: list[int]
    request_id: Any  # int64 array
    arrival: Any  # float64 array
    needs: Any  # int64 array: replicas required (1: completes when watched)
    key_index: Any  # int64 array into key_names
    key_names: list[str]


def _column(table: Any, name: str, dtype: str) -> Any:
    """A trace column as a numpy array of ``dtype``; nulls refused."""
    import pyarrow as pa

    column = table.column(name)
    if column.null_count:
        raise ValueError(f"requests: {name} must not be null")
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _partition_keys(table: Any, order: Any) -> tuple[Any, list[str]]:
    """Each request's watch key ``topic-partition``, as indices into the distinct keys.

    Strings are made once per distinct key, not once per request.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    topic = table.column("topic")
    if topic.null_count:
        raise ValueError("requests: topic must not be null")
    encoded = pc.dictionary_encode(topic)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.unify_dictionaries().combine_chunks()
    topics = encoded.dictionary.to_pylist()
    topic_index = encoded.indices.to_numpy(zero_copy_only=False).astype("int64")[order]
    partition = _column(table, "partition", "int64")[order]
    if not len(partition):
        return np.empty(0, dtype="int64"), []
    low = int(partition.min())
    width = int(partition.max()) - low + 1
    distinct, key_index = np.unique(topic_index * width + (partition - low), return_inverse=True)
    names = [f"{topics[code // width]}-{code % width + low}" for code in distinct.tolist()]
    return key_index.astype("int64", copy=False), names


def _delay_matrix(delays: Any, rows: Any) -> Any:
    """The ``replica_delays`` of ``rows`` as a float64 matrix, or None if ragged or null.

    Null and non-finite delays become ``inf`` (never).
    """
    import numpy as np
    import pyarrow as pa

    if isinstance(delays, pa.ChunkedArray):
        delays = delays.combine_chunks()
    if delays.null_count:
        return None
    offsets = delays.offsets.to_numpy()
    lengths = np.diff(offsets)
    if not len(lengths) or (lengths != lengths[0]).any():
        return None if len(lengths) else np.empty((0, 0))
    width = int(lengths[0])
    values = delays.flatten().to_numpy(zero_copy_only=False).astype("float64")
    matrix = values.reshape(len(lengths), width)[rows]
    matrix[~np.isfinite(matrix)] = np.inf
    return matrix


def _first_acks(
    arrival: Any, delays: Any, waiting: Any, needed: int, request_id: Any
) -> tuple[Any, Any]:
    """The ``needed`` earliest finite acknowledgement times of each waiting request.

    ``delays`` is the trace's ``replica_delays`` column in replay order.
    Returns (times, request indices), request by request, earliest first;
    requests with fewer than ``needed`` finite delays get none (they expire).

    Raises:
        ValueError: a request that gets acknowledgements has a negative delay.
    """
    import numpy as np

    matrix = _delay_matrix(delays, waiting)
    if matrix is None:
        # Ragged or null delay lists: one request at a time.
        return _first_acks_ragged(arrival, delays.to_pylist(), waiting, needed, request_id)
    if not len(waiting) or matrix.shape[1] < needed:
        return np.empty(0, dtype="float64"), np.empty(0, dtype="int64")
    matrix.sort(axis=1)
    enough = np.isfinite(matrix[:, needed - 1])
    rows = waiting[enough]
    negative = matrix[enough, 0] < 0
    if negative.any():
        i = int(rows[np.argmax(negative)])
        raise ValueError(f"requests: negative replica delay in request {request_id[i]}")
    times = (arrival[rows][:, None] + matrix[enough, :needed]).ravel()
    return times, np.repeat(rows, needed)


def _first_acks_ragged(
    arrival: Any, delays: list[Any], waiting: Any, needed: int, request_id: Any
) -> tuple[Any, Any]:
    import numpy as np

    isfinite = math.isfinite
    ack_time: list[float] = []
    ack_index: list[int] = []
    for i in waiting.tolist():
        raw = delays[i]
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
    return np.asarray(ack_time, dtype="float64"), np.asarray(ack_index, dtype="int64")


def _plan(requests: Any, params: ReplayParams) -> _Plan:
    """Order requests (by arrival, then request id) and list the events in time order."""
    import numpy as np

    arrival = _column(requests, "arrival", "float64")
    request_id = _column(requests, "request_id", "int64")
    if len(arrival) and not np.isfinite(arrival).all():
        raise ValueError("requests: arrival must be finite")
    order = np.lexsort((request_id, arrival))
    arrival = arrival[order]
    request_id = request_id[order]
    acks = _column(requests, "acks", "int64")[order]
    key_index, key_names = _partition_keys(requests, order)
    n = len(order)
    needs = np.where(acks == -1, params.min_insync, 1).astype("int64")
    needed = params.min_insync - 1
    if needed > 0:
        delays = requests.column("replica_delays").take(order)
        waiting = np.flatnonzero(acks == -1)
        ack_time, ack_index = _first_acks(arrival, delays, waiting, needed, request_id)
    else:
        ack_time, ack_index = np.empty(0, dtype="float64"), np.empty(0, dtype="int64")
    times = np.concatenate([arrival, ack_time])
    kinds = np.concatenate(
        [np.full(n, _ARRIVAL, dtype="int8"), np.full(len(ack_time), _ACK, dtype="int8")]
    )
    index = np.concatenate([np.arange(n, dtype="int64"), ack_index])
    # Ties: arrivals before acks, then trace order; fixed, so replays are exact.
    sort = np.lexsort((index, kinds, times))
    return _Plan(
        times=times[sort].tolist(),
        kinds=kinds[sort].tolist(),
        index=index[sort].tolist(),
        keys=np.array(key_names, dtype=object)[key_index].tolist() if n else [],
        request_ids=request_id.tolist(),
        required=needs.tolist(),
        request_id=request_id,
        arrival=arrival,
        needs=needs,
        key_index=key_index,
        key_names=key_names,
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
    plan: _Plan,
    purgatory: Purgatory[ReplayedProduce],
    ops: list[ReplayedProduce | None],
    op_timeout: float,
) -> None:
    """The reference: the loop gets a turn (and moves the clock) before every new time."""
    times, kinds, index = plan.times, plan.kinds, plan.index
    keys, request_ids, required = plan.keys, plan.request_ids, plan.required
    watch = purgatory.try_complete_else_watch
    trigger = purgatory.check_and_complete
    for when, kind, i in zip(times, kinds, index, strict=True):
        if when > loop.time():
            await _sleep_until(loop, when)
        if kind == _ARRIVAL:
            op = ReplayedProduce(op_timeout, request_ids[i], required[i], i)
            ops[i] = op
            watch(op, [keys[i]])
        else:
            acked = ops[i]
            assert acked is not None
            if acked.outcome is None:
                acked.acked += 1
                trigger(keys[i])


async def _run_batched(
    loop: simulation.VirtualTimeLoop,
    plan: _Plan,
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
    times, kinds, index = plan.times, plan.kinds, plan.index
    keys, request_ids, required = plan.keys, plan.request_ids, plan.required
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
    # ReplayedProduce(op_timeout, request_ids[i], required[i], i), field by field
    # without the Python frame of its __init__ (the tests compare with the plain path).
    new, init = ReplayedProduce.__new__, DelayedOperation.__init__
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
            op = new(ReplayedProduce)
            init(op, op_timeout)
            op.op_id = request_ids[i]
            op.required = required[i]
            op.order = i
            op.acked = 1
            ops[i] = op
            if not watch(op, [keys[i]]) and not staged:
                # Pending, so staged: the first since the last turn, the earliest deadline.
                staged = True
                deadline: float = op.deadline  # type: ignore[assignment]
                if deadline < limit:
                    limit = deadline
        else:
            acked = ops[i]
            assert acked is not None
            if acked.outcome is None:
                acked.acked += 1
                trigger(keys[i])


async def _drive(
    plan: _Plan,
    params: ReplayParams,
    name: str,
    fast: bool,
    use_event_recorder: bool,
) -> tuple[list[DelayedOperation], list[float]] | list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, simulation.VirtualTimeLoop)  # run by simulation.run (_replay)
    purgatory: Purgatory[ReplayedProduce] = Purgatory(
        name, tick=params.tick, wheel_size=params.wheel_size, logger=_quiet_logger()
    )
    sink = _Rows()
    recorder = EventRecorder(sink, clock=loop.time)
    finished = _Finished(loop)
    order: list[int] = []
    if use_event_recorder:

        def record(op: DelayedOperation) -> None:
            order.append(op.order)  # type: ignore[attr-defined]
            recorder.record(purgatory, op)

        purgatory.set_recorder(record)
    else:
        purgatory.set_recorder(finished)
    ops: list[ReplayedProduce | None] = [None] * len(plan.keys)
    try:
        if fast:
            await _run_batched(loop, plan, purgatory, ops, params.timeout)
        else:
            await _run_plain(loop, plan, purgatory, ops, params.timeout)
        if purgatory.pending:
            # Everything still pending was watched by now: let the wheel expire it.
            await asyncio.sleep(params.timeout + 2 * params.tick)
        purgatory.close()
    finally:
        # The recorder holds the ops and each op its purgatory: a cycle that only
        # the garbage collector (paused during replays) would free.
        purgatory.set_recorder(None)
    if not use_event_recorder:
        return finished.ops, finished.times
    rows = sink.rows
    outcomes = [row["outcome"] for row in rows]
    for run in _expiry_ties(outcomes, [row["finished_at"] for row in rows]):
        rows[run] = [row for _, row in sorted(zip(order[run], rows[run], strict=True))]
    return rows


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


def _facts(
    plan: _Plan,
    ops: list[DelayedOperation],
    times: list[float],
    params: ReplayParams,
    purgatory: str,
    source: str,
) -> Any:
    """The fact table (Arrow) from the finished ops and their finish times, built by columns.

    A fact needs only the op's position in the plan, its outcome and when it
    finished: its request id and key come from the plan, it was watched at its
    arrival, and it was scheduled (deadline ``arrival + timeout``, as the
    purgatory computes it) iff it needed a follower; one that was not completed
    when first checked and was never watched (no keys).
    """
    import numpy as np
    import pyarrow as pa

    n = len(ops)
    position = np.fromiter((op.order for op in ops), dtype="int64", count=n)  # type: ignore[attr-defined]
    outcomes = [op.outcome for op in ops]
    completed_, expired_ = Outcome.COMPLETED, Outcome.EXPIRED
    # Outcome members hash in Python: compare by identity instead.
    code = np.fromiter(
        (0 if o is completed_ else 1 if o is expired_ else 2 for o in outcomes),
        dtype="int8",
        count=n,
    )
    now = np.array(times, dtype="float64")
    # Runs of simultaneous expiries in watch order (see _expiry_ties), stably.
    expired = code == 1
    same = np.zeros(n, dtype=bool)
    same[1:] = expired[1:] & expired[:-1] & (now[1:] == now[:-1])
    run = np.cumsum(~same)
    sort = np.lexsort((np.where(expired, position, 0), run))
    position, code, now, expired = position[sort], code[sort], now[sort], expired[sort]
    if (code == 2).any():
        others = [outcomes[i] for i in sort[code == 2].tolist()]
        labels = pa.array(["completed", "expired", *(o.value for o in others if o is not None)])
        code_index = code.astype("int64")
        code_index[code == 2] = 2 + np.arange(len(others))
    else:
        labels = pa.array(["completed", "expired"])
        code_index = code.astype("int64")

    timeout = params.timeout
    scheduled = plan.needs[position] > 1
    deadline = plan.arrival[position] + timeout
    watched_at = np.where(scheduled, deadline - timeout, now)
    late = expired & scheduled
    key_offsets = np.zeros(n + 1, dtype="int32")
    np.cumsum(scheduled, out=key_offsets[1:])
    key_values = pa.array(plan.key_names, pa.string()).take(
        pa.array(plan.key_index[position[scheduled]])
    )
    return pa.Table.from_arrays(
        [
            pa.repeat(pa.scalar(params.label), n),
            pa.repeat(pa.scalar(source), n),
            pa.repeat(pa.scalar(purgatory), n),
            pa.array(plan.request_id[position]).cast(pa.string()),
            pa.repeat(pa.scalar(ReplayedProduce.__name__), n),
            pa.ListArray.from_arrays(pa.array(key_offsets), key_values),
            pa.array(np.full(n, timeout)),
            pa.array(watched_at),
            pa.array(now),
            labels.take(pa.array(code_index)),
            pa.nulls(n, pa.string()),  # a replayed request has no error answer
            pa.array(now - watched_at),
            pa.array(np.where(late, now - deadline, 0.0), mask=~late),
            pa.array(now),
        ],
        schema=fact_arrow_schema(),
    )


def _facts_from_rows(rows: list[dict[str, Any]], params: ReplayParams, source: str) -> Any:
    """The fact table (Arrow) from :class:`EventRecorder` events."""
    import pyarrow as pa

    columns = {name: [row[name] for row in rows] for name in _FACT_FIELDS}
    columns["op_id"] = [str(op_id) for op_id in columns["op_id"]]
    n = len(rows)
    return pa.Table.from_pydict(
        {"scenario": [params.label] * n, "source": [source] * n, **columns},
        schema=fact_arrow_schema(),
    )


def _check_requests(requests: Any) -> Any:
    """``requests`` (pandas or Arrow) as an Arrow table of the trace columns."""
    import pyarrow as pa

    columns = getattr(requests, "columns", None)
    names = requests.column_names if isinstance(requests, pa.Table) else columns
    if names is None:
        raise TypeError(
            f"requests must be a pandas DataFrame or a pyarrow Table, got {type(requests).__name__}"
        )
    missing = set(_REQUEST_COLUMNS) - set(names)
    if missing:
        raise ValueError(f"requests: missing columns {sorted(missing)}")
    if isinstance(requests, pa.Table):
        return requests
    from .trace import arrow_trace

    return arrow_trace(requests, _REQUEST_COLUMNS)


_REQUEST_COLUMNS = ("request_id", "topic", "partition", "arrival", "acks", "replica_delays")


def replay_table(
    requests: Any,
    params: ReplayParams,
    *,
    purgatory: str = "broker",
    source: str = "",
    fast: bool = True,
    use_event_recorder: bool = False,
) -> Any:
    """Replay one broker's requests through a fresh purgatory on virtual time.

    A pure function of its arguments: the same requests (in any row order) and
    parameters give the same facts on every run and on every machine.

    Args:
        requests: a ``pyarrow.Table`` (or pandas DataFrame) with the trace columns
            ``request_id``, ``topic``, ``partition``, ``arrival``, ``acks``,
            ``replica_delays`` (see :data:`~aiopurgatory.pipeline.schema.TRACE_COLUMNS`);
            other columns are ignored.
        params: the parameter set.
        purgatory: the purgatory's name (the facts' ``purgatory`` column).
        source: the facts' ``source`` column (the trace's path).
        fast: skip the event loop when it would only move the clock (same results;
            False runs every event through the loop, for checking that claim).
        use_event_recorder: record through :class:`EventRecorder` (slower; same
            facts as the default lean recorder, for checking that claim).

    Returns:
        The per-op fact table as a ``pyarrow.Table``
        (:func:`~aiopurgatory.pipeline.schema.fact_arrow_schema`), one row per
        request in the order the ops finished (ops that expire at the same
        instant in the order they were watched).

    Raises:
        TypeError: ``params`` is not a ReplayParams, ``requests`` not a table.
        ValueError: a column is missing or has nulls, an arrival is not finite, a
            delay is negative.
    """
    if not isinstance(params, ReplayParams):
        raise TypeError(f"params must be a ReplayParams, got {type(params).__name__}")
    table = _check_requests(requests)
    with _collector_paused():
        plan = _plan(table, params)
        result = simulation.run(_drive(plan, params, purgatory, fast, use_event_recorder))
        if isinstance(result, list):
            return _facts_from_rows(result, params, source)
        ops, times = result
        return _facts(plan, ops, times, params, purgatory, source)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (if on) for the block.

    A replay allocates millions of small objects and keeps every op (and the
    trace) alive to the end, so the collector would rescan an ever larger heap,
    again and again, for cycles the replay does not make: a quarter of the time
    at a million requests. Reference counting frees everything as usual.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def replay_requests(
    requests: pd.DataFrame,
    params: ReplayParams,
    *,
    purgatory: str = "broker",
    source: str = "",
    fast: bool = True,
    use_event_recorder: bool = False,
) -> pd.DataFrame:
    """:func:`replay_table` for pandas: the same facts as a DataFrame.

    ``keys`` holds lists of str, ``op_id`` str, and ``lateness`` NaN where the
    fact table has null.
    """
    facts = replay_table(
        requests,
        params,
        purgatory=purgatory,
        source=source,
        fast=fast,
        use_event_recorder=use_event_recorder,
    )
    return _to_pandas(facts)


def _to_pandas(facts: Any) -> pd.DataFrame:
    frame: pd.DataFrame = facts.drop_columns(["keys"]).to_pandas()
    frame.insert(list(FACT_COLUMNS).index("keys"), "keys", facts.column("keys").to_pylist())
    return frame


def split_brokers(trace: Any) -> list[tuple[int, Any]]:
    """A trace table's rows per broker, in broker order: ``[(broker, table), ...]``."""
    import numpy as np

    broker = _column(trace, "broker", "int64")
    order = np.argsort(broker, kind="stable")
    brokers, starts = np.unique(broker[order], return_index=True)
    bounds = [*starts.tolist(), len(order)]
    return [
        (b, trace.take(order[bounds[k] : bounds[k + 1]])) for k, b in enumerate(brokers.tolist())
    ]


def replay_trace_table(
    trace: Any,
    param_sets: Sequence[ReplayParams],
    *,
    source: str = "",
    fast: bool = True,
) -> Any:
    """Replay a whole trace table in this process: every parameter set, every broker.

    The reference for the Spark replay (same function per group, so identical
    facts), and ``aiopurgatory replay --local``.

    Args:
        trace: the request trace as a ``pyarrow.Table`` (with a ``broker`` column).
        param_sets: at least one parameter set.
        source: the facts' ``source`` column.
        fast: see :func:`replay_table`.

    Returns:
        The fact table (Arrow) of all scenarios and brokers, scenario by scenario
        in the order given, brokers in ascending order.

    Raises:
        ValueError: ``param_sets`` is empty; see :func:`replay_table`.
    """
    import pyarrow as pa

    if not param_sets:
        raise ValueError("param_sets must not be empty")
    with _collector_paused():
        groups = split_brokers(trace)
        parts = [
            replay_table(group, params, purgatory=f"broker-{broker}", source=source, fast=fast)
            for params in param_sets
            for broker, group in groups
        ]
    if not parts:
        return fact_arrow_schema().empty_table()
    return pa.concat_tables(parts)


def replay_trace(
    trace: pd.DataFrame,
    param_sets: Sequence[ReplayParams],
    *,
    source: str = "",
    fast: bool = True,
) -> pd.DataFrame:
    """:func:`replay_trace_table` for a pandas trace: the facts as a DataFrame.

    Raises:
        ValueError: ``param_sets`` is empty; see :func:`replay_table`.
    """
    from .trace import arrow_trace

    if not param_sets:
        raise ValueError("param_sets must not be empty")
    return _to_pandas(replay_trace_table(arrow_trace(trace), param_sets, source=source, fast=fast))
