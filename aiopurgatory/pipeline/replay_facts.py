"""The facts of a replay: the recorders a replay runs with, and the fact table they give.

The lean recorder (:class:`_Finished`: each finished op and when) and the
:class:`~aiopurgatory.events.EventRecorder` sink (:class:`_Rows`) that the tests
compare it with; the fact table (Arrow, :func:`~aiopurgatory.pipeline.schema.fact_arrow_schema`)
built by columns from the plan and the finished ops, with simultaneous expiries
in watch order. Used by :mod:`aiopurgatory.pipeline.replay_core`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from .._operation import DelayedOperation, Outcome
from .replay_model import ReplayedProduce, ReplayParams
from .replay_plan import _Plan
from .schema import FACT_COLUMNS, fact_arrow_schema

__all__: list[str] = []


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
