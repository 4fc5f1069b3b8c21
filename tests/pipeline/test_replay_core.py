"""The replay core and the trace generator, without Spark (fast)."""

from __future__ import annotations

import asyncio
import gc
import math
import random
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from aiopurgatory import DelayedOperation, Purgatory, simulation
from aiopurgatory.pipeline import replay_core
from aiopurgatory.pipeline.replay_core import (
    ReplayParams,
    parse_sweep,
    replay_requests,
    replay_trace,
)
from aiopurgatory.pipeline.schema import FACT_COLUMNS, fact_arrow_schema, trace_arrow_schema
from aiopurgatory.pipeline.trace import (
    TraceSpec,
    arrow_trace,
    generate_trace,
    generate_trace_table,
    main,
    read_trace_pandas,
    read_trace_table,
    write_trace,
)


def _trace(rows: list[tuple[int, float, int, list[float | None]]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "request_id": [r[0] for r in rows],
            "broker": [0] * len(rows),
            "topic": ["t"] * len(rows),
            "partition": [r[0] % 2 for r in rows],
            "arrival": [r[1] for r in rows],
            "acks": [r[2] for r in rows],
            "replica_delays": [r[3] for r in rows],
        }
    )


HAND = _trace(
    [
        (0, 0.0, -1, [0.2, None]),  # one follower acks at 0.2
        (1, 0.5, -1, [None, math.inf]),  # nobody acks: expires at 1.5
        (2, 0.25, 1, [5.0, 5.0]),  # acks=1: completes at once
        (3, 0.3, -1, [2.0, 0.5]),  # fastest follower at 0.8
    ]
)


def _by_id(facts: pd.DataFrame) -> dict[str, dict[str, Any]]:
    return {
        str(row["op_id"]): {str(k): v for k, v in row.items()} for row in facts.to_dict("records")
    }


def test_hand_trace_min_insync_2() -> None:
    facts = replay_requests(HAND, ReplayParams(timeout=1.0, min_insync=2), purgatory="b0")
    assert list(facts.columns) == list(FACT_COLUMNS)
    rows = _by_id(facts)
    assert {k: r["outcome"] for k, r in rows.items()} == {
        "0": "completed",
        "1": "expired",
        "2": "completed",
        "3": "completed",
    }
    assert rows["0"]["finished_at"] == 0.2
    assert rows["0"]["wait"] == 0.2
    assert list(rows["0"]["keys"]) == ["t-0"]
    assert rows["2"]["wait"] == 0.0
    assert list(rows["2"]["keys"]) == []
    assert rows["3"]["finished_at"] == pytest.approx(0.8, abs=1e-12)
    assert rows["1"]["finished_at"] == 1.5
    assert rows["1"]["lateness"] == 0.0
    assert math.isnan(rows["0"]["lateness"])
    assert set(facts["purgatory"]) == {"b0"}
    assert set(facts["scenario"]) == {"timeout=1 min_insync=2 tick=0.001"}


def test_hand_trace_min_insync_3_and_tick_rounding() -> None:
    facts = replay_requests(HAND, ReplayParams(timeout=1.0, min_insync=3, tick=0.4))
    rows = _by_id(facts)
    # 0: one follower only -> never 3 replicas; 3: second follower at 2.3 > deadline 1.3.
    assert rows["0"]["outcome"] == "expired"
    assert rows["3"]["outcome"] == "expired"
    assert rows["2"]["outcome"] == "completed"
    # Deadlines round up to the 0.4 s tick: 1.0 -> 1.2, 1.3 -> 1.6, 1.5 -> 1.6.
    assert rows["0"]["finished_at"] == pytest.approx(1.2)
    assert rows["3"]["finished_at"] == pytest.approx(1.6)
    assert rows["1"]["finished_at"] == pytest.approx(1.6)
    for op_id in ("0", "1", "3"):
        assert 0 <= rows[op_id]["lateness"] < 0.4


def test_fast_path_lean_recorder_and_row_order_change_nothing() -> None:
    # Three brokers so that requests have followers: acks trigger check_and_complete.
    # (Replayed as one purgatory: replay_requests ignores the broker column.)
    trace = generate_trace(TraceSpec(requests=3000, brokers=3, seed=3, rate=2000.0))
    params = ReplayParams(timeout=0.05, min_insync=2)
    fast = replay_requests(trace, params)
    slow = replay_requests(trace, params, fast=False)
    shuffled = replay_requests(trace.sample(frac=1.0, random_state=1), params)
    via_events = replay_requests(trace, params, use_event_recorder=True)
    pd.testing.assert_frame_equal(fast, slow, check_exact=True)
    pd.testing.assert_frame_equal(fast, via_events, check_exact=True)
    pd.testing.assert_frame_equal(fast, shuffled, check_exact=True)
    assert set(fast["outcome"]) == {"completed", "expired"}
    assert len(fast) == 3000


def _count_turns(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the loop turns the replay asks for (calls of its _sleep_until)."""
    turns = [0]
    sleep_until = replay_core._sleep_until

    async def counting(loop: simulation.VirtualTimeLoop, when: float) -> None:
        turns[0] += 1
        await sleep_until(loop, when)

    monkeypatch.setattr(replay_core, "_sleep_until", counting)
    return turns


def test_fast_path_skips_most_loop_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    # Keeps the equality tests meaningful: the fast path really batches events.
    trace = generate_trace(TraceSpec(requests=3000, brokers=3, seed=3, rate=2000.0))
    params = ReplayParams(timeout=0.05, min_insync=2)
    turns = _count_turns(monkeypatch)
    replay_requests(trace, params, fast=False)
    plain, turns[0] = turns[0], 0
    replay_requests(trace, params)
    assert plain > 4000  # one per distinct event time (arrivals and acks)
    assert turns[0] < plain / 4


def _random_trace(rng: random.Random, n: int, rate: float) -> pd.DataFrame:
    rows: list[tuple[int, float, int, Any, int]] = []
    t = 0.0
    for request_id in range(n):
        t += rng.expovariate(rate)
        arrival = t
        if rows and rng.random() < 0.05:
            arrival = rows[-1][1]  # exactly simultaneous arrivals
        elif rows and rng.random() < 0.02:
            arrival = rows[-1][1] + rng.choice([1e-10, 4e-10, 9e-10])  # within 1 ns
        delays: list[float | None] = []
        for _ in range(2):
            x = rng.random()
            delays.append(
                None
                if x < 0.1
                else math.inf
                if x < 0.15
                else rng.lognormvariate(math.log(0.005), 1.2)
            )
        acks = rng.choice([-1, -1, -1, 1, 0])
        rows.append((request_id, arrival, acks, delays, rng.randrange(3)))
    return pd.DataFrame(
        {
            "request_id": [r[0] for r in rows],
            "broker": 0,
            "topic": "t",
            "partition": [r[4] for r in rows],
            "arrival": [r[1] for r in rows],
            "acks": [r[2] for r in rows],
            "replica_delays": [r[3] for r in rows],
        }
    )


@pytest.mark.parametrize("seed", range(16))
def test_fast_path_equals_plain_loop_on_random_traces(seed: int) -> None:
    # Timeouts from 0 to beyond the first wheel levels, coarse and odd ticks, tiny
    # wheels, dense and sparse arrivals, ties and sub-nanosecond gaps: every op must
    # finish at the same time with the same facts, rows in the same order.
    rng = random.Random(seed)
    tick = rng.choice([0.001, 0.0007, 0.01, 0.05])
    params = ReplayParams(
        timeout=rng.choice([0.0, 0.0004, 0.003, 0.0195, 0.02, 0.05, 0.2, 1.0, 30.0, 17 * tick]),
        min_insync=rng.choice([1, 2, 3]),
        tick=tick,
        wheel_size=rng.choice([2, 3, 20]),
    )
    trace = _random_trace(rng, rng.choice([300, 1000]), rng.choice([50.0, 1000.0, 20000.0]))
    fast = replay_requests(trace, params)
    plain = replay_requests(trace, params, fast=False)
    pd.testing.assert_frame_equal(fast, plain, check_exact=True)
    assert len(fast) == len(trace)


def test_fast_path_equals_plain_loop_with_a_huge_batch() -> None:
    # 10000 arrivals in 0.1 s with a 1 s timeout: no timer is due for a second, so
    # the fast path runs them all in one batch, beyond the 4096 entries at which
    # the timer moves its stage into the wheel early.
    trace = _random_trace(random.Random(99), 10_000, 100_000.0)
    params = ReplayParams(timeout=1.0, min_insync=3)
    fast = replay_requests(trace, params)
    pd.testing.assert_frame_equal(
        fast, replay_requests(trace, params, fast=False), check_exact=True
    )
    assert set(fast["outcome"]) == {"completed", "expired"}


def test_events_within_a_nanosecond_happen_at_their_own_time() -> None:
    # asyncio runs a handle due within its clock resolution (1 ns) without moving
    # the clock; the replay still watches each request at its own arrival.
    trace = _trace([(0, 0.1, -1, [None, None]), (1, 0.1 + 4e-10, -1, [None, None])])
    params = ReplayParams(timeout=1.0)
    for fast in (True, False):
        rows = _by_id(replay_requests(trace, params, fast=fast))
        for op_id, arrival in (("0", 0.1), ("1", 0.1 + 4e-10)):
            assert rows[op_id]["watched_at"] == (arrival + 1.0) - 1.0
        # Deadlines 1.1 and 1.1000000004 round up to different 1 ms ticks.
        assert rows["0"]["finished_at"] == pytest.approx(1.1, abs=1e-12)
        assert rows["1"]["finished_at"] == pytest.approx(1.101, abs=1e-12)


def test_ties_expiry_before_events_at_that_instant_and_in_watch_order() -> None:
    trace = _trace(
        [
            (5, 0.0, -1, [1.0, None]),  # its only ack comes exactly at its deadline
            (2, 0.0, -1, [None, None]),
            (7, 0.0, -1, [None, None]),
            (4, 1.0, 1, [None, None]),  # arrives at that instant, completes at once
        ]
    )
    for fast in (True, False):
        facts = replay_requests(trace, ReplayParams(timeout=1.0), fast=fast)
        assert list(facts["op_id"]) == ["2", "5", "7", "4"]
        assert list(facts["outcome"]) == ["expired"] * 3 + ["completed"]
        assert set(facts["finished_at"]) == {1.0}


def test_ragged_delay_lists_plan_like_uniform_ones() -> None:
    uniform = _trace(
        [
            (0, 0.0, -1, [0.3, None]),
            (1, 0.1, -1, [None, None]),
            (2, 0.2, -1, [0.05, 0.01]),
        ]
    )
    ragged = uniform.copy()
    ragged["replica_delays"] = pd.Series([[0.3], None, [0.05, 0.01]], dtype=object)
    for min_insync in (2, 3):
        params = ReplayParams(timeout=1.0, min_insync=min_insync)
        pd.testing.assert_frame_equal(
            replay_requests(uniform, params), replay_requests(ragged, params), check_exact=True
        )
    for delays in ([[0.3, -0.1], [None, None], [0.05, 0.01]], [[0.3], None, [-0.1, 0.2]]):
        bad = uniform.copy()
        bad["replica_delays"] = pd.Series(delays, dtype=object)
        with pytest.raises(ValueError, match="negative replica delay in request"):
            replay_requests(bad, ReplayParams(timeout=1.0))


def test_replay_restores_the_garbage_collector() -> None:
    assert gc.isenabled()
    replay_requests(HAND, ReplayParams(timeout=1.0))
    assert gc.isenabled()
    gc.disable()
    try:
        replay_requests(HAND, ReplayParams(timeout=1.0))
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Timed(DelayedOperation):
    finished_at: float | None = None

    def on_complete(self) -> None:
        self.finished_at = asyncio.get_running_loop().time()


def test_core_expiry_keeps_its_tick_after_a_wake_up_a_nanosecond_early() -> None:
    async def main() -> tuple[float | None, float | None]:
        purgatory: Purgatory[_Timed] = Purgatory("p", tick=0.001)
        op = _Timed(0.1)
        purgatory.try_complete_else_watch(op, ["k"])
        await asyncio.sleep(0.1 - 5e-10)  # another event just before the deadline
        await asyncio.sleep(0.01)
        await purgatory.close()
        return op.finished_at, op.deadline

    finished_at, deadline = simulation.run(main())
    assert deadline == 0.1
    assert finished_at == 0.1  # got 0.1009999995: lateness is a whole tick


def test_replay_trace_covers_brokers_and_scenarios() -> None:
    trace = generate_trace(TraceSpec(requests=600, brokers=3, seed=5))
    sweep = parse_sweep("0.01,1", "2", "0.001")
    facts = replay_trace(trace, sweep, source="t.parquet")
    assert len(facts) == 2 * 600
    assert set(facts["purgatory"]) == {"broker-0", "broker-1", "broker-2"}
    assert set(facts["source"]) == {"t.parquet"}
    expired = facts.groupby("scenario")["outcome"].apply(lambda s: (s == "expired").sum())
    # A longer timeout can only save requests.
    assert (
        expired["timeout=0.01 min_insync=2 tick=0.001"]
        >= expired["timeout=1 min_insync=2 tick=0.001"]
    )


def test_params_and_sweep_validation() -> None:
    assert len(parse_sweep("0.5,1,30", "2,3", "0.001")) == 6
    with pytest.raises(ValueError, match="timeout"):
        ReplayParams(timeout=-1)
    with pytest.raises(ValueError, match="tick"):
        ReplayParams(tick=0)
    with pytest.raises(TypeError, match="min_insync"):
        ReplayParams(min_insync=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_insync"):
        ReplayParams(min_insync=0)
    with pytest.raises(ValueError, match="timeout"):
        parse_sweep("fast", "2", "0.001")
    with pytest.raises(TypeError, match="params"):
        replay_requests(HAND, {"timeout": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="missing columns"):
        replay_requests(HAND.drop(columns=["acks"]), ReplayParams())


def test_generate_trace_is_deterministic_and_shaped() -> None:
    spec = TraceSpec(requests=2000, brokers=4, replication=3, seed=7, failed_replicas=0.2)
    a, b = generate_trace(spec), generate_trace(spec)
    pd.testing.assert_frame_equal(a, b)
    other = generate_trace(TraceSpec(requests=2000, brokers=4, seed=8))
    assert not a["arrival"].equals(other["arrival"])
    assert a["arrival"].is_monotonic_increasing
    assert set(a["acks"]) <= {-1, 1}
    assert {len(d) for d in a["replica_delays"]} == {2}
    flat = [d for row in a["replica_delays"] for d in row]
    assert any(d is None for d in flat)  # failed replicas and the outage
    assert all(d is None or d > 0 for d in flat)
    with pytest.raises(ValueError, match="acks_all"):
        TraceSpec(acks_all=1.5)
    with pytest.raises(TypeError, match="requests"):
        TraceSpec(requests=1.0)  # type: ignore[arg-type]


def test_csv_and_parquet_traces_replay_the_same(tmp_path: Path) -> None:
    trace = generate_trace(TraceSpec(requests=500, brokers=2, seed=2, failed_replicas=0.3))
    csv = read_trace_pandas(write_trace(trace, tmp_path / "t.csv"))
    parquet = read_trace_pandas(write_trace(trace, tmp_path / "t.parquet"))
    params = [ReplayParams(timeout=0.05)]
    pd.testing.assert_frame_equal(replay_trace(csv, params), replay_trace(parquet, params))


def test_gen_trace_cli(tmp_path: Path) -> None:
    out = tmp_path / "trace.parquet"
    assert main(["--out", str(out), "--requests", "300", "--brokers", "2", "--seed", "1"]) == 0
    assert len(read_trace_pandas(out)) == 300
    assert main(["--out", str(out), "--requests", "0"]) == 2


def test_arrow_replay_equals_the_pandas_one_and_is_typed() -> None:
    trace = generate_trace(TraceSpec(requests=2000, brokers=1, seed=11, failed_replicas=0.2))
    params = ReplayParams(timeout=0.05, min_insync=2)
    table = replay_core.replay_table(arrow_trace(trace), params, purgatory="b", source="s")
    assert table.schema == fact_arrow_schema()
    frame = replay_requests(trace, params, purgatory="b", source="s")
    pd.testing.assert_frame_equal(replay_core._to_pandas(table), frame, check_exact=True)
    # Lateness is null (not NaN) except for expiries; only watched ops have keys.
    lateness = table.column("lateness")
    expired = [o == "expired" for o in table.column("outcome").to_pylist()]
    assert [v is not None for v in lateness.to_pylist()] == expired
    assert all(v == v for v in lateness.drop_null().to_pylist())
    assert {len(k) for k in table.column("keys").to_pylist()} == {0, 1}


def test_replay_leaves_no_ops_for_the_collector() -> None:
    trace = generate_trace(TraceSpec(requests=1000, brokers=1, seed=2))
    replay_requests(trace, ReplayParams(timeout=0.05))
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        replay_requests(trace, ReplayParams(timeout=0.05))
        gc.collect()
        # The recorder held every op and each op its purgatory: that cycle is
        # broken after the run, so reference counting frees the ops.
        left = [o for o in gc.garbage if isinstance(o, DelayedOperation)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == []


@pytest.mark.parametrize("column", ["arrival", "topic", "partition", "acks", "request_id"])
def test_null_trace_fields_are_refused_by_name(column: str) -> None:
    table = arrow_trace(HAND)
    index = table.column_names.index(column)
    values = table.column(column).to_pylist()
    values[1] = None
    bad = table.set_column(index, column, pa.array(values, table.schema.field(column).type))
    with pytest.raises(ValueError, match=f"{column} must not be null"):
        replay_core.replay_table(bad, ReplayParams(timeout=1.0))
    with pytest.raises(TypeError, match="requests must be"):
        replay_core.replay_table([1, 2], ReplayParams())


def test_trace_as_arrow_from_numpy_equals_the_pandas_trace(tmp_path: Path) -> None:
    for spec in (
        TraceSpec(requests=1500, brokers=4, seed=3),
        TraceSpec(requests=500, brokers=1, seed=1),  # no followers: empty lists
    ):
        table = generate_trace_table(spec)
        assert table.schema == trace_arrow_schema()
        assert table.equals(arrow_trace(generate_trace(spec)))
        path = write_trace(table, tmp_path / f"t{spec.seed}.parquet")
        assert read_trace_table(path).equals(table)
        # CSV from Arrow is the CSV from pandas (which keeps pandas' float format).
        csv = write_trace(table, tmp_path / f"a{spec.seed}.csv").read_bytes()
        assert csv == write_trace(generate_trace(spec), tmp_path / f"p{spec.seed}.csv").read_bytes()
