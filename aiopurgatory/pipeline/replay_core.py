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

This module drives the purgatory through a plan and holds the public entry
points; the parts are modules of their own: the parameter sets and the
operation (:mod:`~aiopurgatory.pipeline.replay_model`, re-exported here), the
plan (:mod:`~aiopurgatory.pipeline.replay_plan`) and the facts
(:mod:`~aiopurgatory.pipeline.replay_facts`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .. import simulation
from .._operation import DelayedOperation
from .._purgatory import Purgatory
from ..events import EventRecorder

# The parts of a replay, each in its own module; the model's names are public here too.
from .replay_facts import _expiry_ties, _facts, _facts_from_rows, _Finished, _Rows
from .replay_model import ReplayedProduce, ReplayParams, parse_sweep
from .replay_plan import _ARRIVAL, _column, _Plan, _plan
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
