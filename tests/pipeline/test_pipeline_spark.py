"""Spark side of the pipeline: analytics against pure Python, malformed lines,
Spark replay equal to the single-process replay, CLIs end to end.

All tests share one ``local[2]`` session (see conftest.py).
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from aiopurgatory.events import EVENT
from aiopurgatory.pipeline import aggregates, analyze, replay, spark_hash, trace
from aiopurgatory.pipeline.replay_core import ReplayParams, replay_table, replay_trace
from aiopurgatory.pipeline.schema import FACT_COLUMNS, fact_schema
from aiopurgatory.pipeline.trace import TraceSpec, generate_trace, write_trace

pytestmark = pytest.mark.spark


def _nearest_rank(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


def _events(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    events = []
    for i in range(n):
        outcome = rng.choices(["completed", "expired", "cancelled", "failed"], [80, 15, 4, 1])[0]
        timeout = 0.1
        watched = rng.uniform(0, 5)
        late = rng.uniform(0, 0.002)
        wait = timeout + late if outcome == "expired" else rng.uniform(0, timeout)
        lateness = late if outcome == "expired" else None
        events.append(
            {
                "event": EVENT,
                "schema": 1,
                "ts": 1.7e9 + watched,
                "purgatory": rng.choice(["produce", "fetch"]),
                "op_id": i if i % 3 else f"op-{i}",
                "op_type": "DelayedProduce",
                "keys": rng.sample([f"t-{k}" for k in range(6)], rng.randint(1, 2)),
                "timeout": timeout,
                "watched_at": watched,
                "finished_at": watched + wait,
                "outcome": outcome,
                "wait": wait,
                "lateness": lateness,
            }
        )
    return events


#: (line text, expected problem prefix or None for "other event").
BAD_LINES = [
    ("not json at all", "not JSON"),
    ('{"event": "aiopurgatory.op_finished", "schema": 1, "wait": "slow"}', "not JSON"),
    ('{"event": "aiopurgatory.op_finished", "schema": 1, "outcome": "completed"}', "missing field"),
    ('{"event": "aiopurgatory.op_finished", "schema": 3, "purgatory": "p"}', "unsupported schema"),
    ('{"schema": 1, "purgatory": "p"}', "missing field: event"),
    ('{"event": "aiopurgatory.purgatory_closed", "purgatory": "p"}', None),
]


@pytest.fixture(scope="module")
def event_logs(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[dict[str, Any]], dict[tuple[str, int], str]]:
    """Two log files (one in a subdirectory) with bad lines at known places."""
    root = tmp_path_factory.mktemp("events")
    events = _events(3000, seed=11)
    expected_bad: dict[tuple[str, int], str] = {}
    (root / "sub").mkdir()
    files = [root / "a.jsonl", root / "sub" / "b.jsonl"]
    chunks = [events[:1700], events[1700:]]
    rng = random.Random(4)
    for path, chunk in zip(files, chunks, strict=True):
        lines = [json.dumps(e) for e in chunk]
        for text, _ in BAD_LINES:
            at = rng.randrange(len(lines) + 1)
            lines.insert(at, text)
        lines.insert(rng.randrange(len(lines)), "")  # blank: ignored, still counts as a line
        with path.open("w") as file:
            file.write("\n".join(lines) + "\n")
        for number, text in enumerate(lines, start=1):
            for bad, problem in BAD_LINES:
                if text == bad and problem is not None:
                    expected_bad[(path.resolve().as_uri(), number)] = problem
    return root, events, expected_bad


def test_analyze_matches_pure_python(
    spark: Any,
    event_logs: tuple[Path, list[dict[str, Any]], dict[tuple[str, int], str]],
    tmp_path: Path,
) -> None:
    root, events, expected_bad = event_logs
    # Small splits, so that line numbers must be stitched across several splits per file.
    spark.conf.set("spark.sql.files.maxPartitionBytes", "65536")
    try:
        quality = analyze.read_events(spark, [str(root)], tmp_path / "facts")
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    assert quality.events == len(events)
    assert quality.malformed == len(expected_bad) == 10
    assert quality.other == 2
    assert quality.lines == len(events) + 2 * len(BAD_LINES)
    located = {
        (e["source"].replace("file:///", "file:/"), e["line"]): e["problem"]
        for e in quality.examples
    }
    expected = {(k[0].replace("file:///", "file:/"), k[1]): v for k, v in expected_bad.items()}
    assert located.keys() == expected.keys()
    for key, problem in expected.items():
        assert located[key].startswith(problem), (key, located[key])

    facts = spark.read.parquet(str(tmp_path / "facts"))
    interval = 0.5
    rollups = analyze.rollups(facts, interval).toPandas()
    groups: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        groups[(e["purgatory"], math.floor(e["finished_at"] / interval) * interval)].append(e)
    assert len(rollups) == len(groups)
    for row in rollups.to_dict("records"):
        group = groups[(row["purgatory"], row["interval_start"])]
        counts = Counter(e["outcome"] for e in group)
        waits = [e["wait"] for e in group]
        late = [e["lateness"] for e in group if e["lateness"] is not None]
        assert row["ops"] == len(group)
        for outcome in ("completed", "expired", "cancelled", "failed"):
            assert row[outcome] == counts[outcome]
        assert row["expiry_rate"] == counts["expired"] / len(group)
        for p in (50, 95, 99):
            assert row[f"wait_p{p}"] == _nearest_rank(waits, p / 100)
        assert row["wait_max"] == max(waits)
        if late:
            assert row["lateness_p99"] == _nearest_rank(late, 0.99)
            assert row["lateness_max"] == max(late)
        else:
            assert pd.isna(row["lateness_max"])

    summary = analyze.summary(facts).toPandas().set_index("purgatory")
    assert summary.loc["(all)", "ops"] == len(events)
    assert summary.loc["(all)", "expired"] == sum(e["outcome"] == "expired" for e in events)
    assert summary.loc["(all)", "wait_p99"] == _nearest_rank([e["wait"] for e in events], 0.99)

    hot = analyze.hot_keys(facts, top=3).toPandas()
    per_key: Counter[tuple[str, str]] = Counter()
    expired_key: Counter[tuple[str, str]] = Counter()
    for e in events:
        for key in e["keys"]:
            per_key[(e["purgatory"], key)] += 1
            expired_key[(e["purgatory"], key)] += e["outcome"] == "expired"
    top_ops = sorted(per_key, key=lambda k: (-per_key[k], k))[:3]
    got = hot.sort_values("rank_by_ops").head(3)
    assert list(zip(got["purgatory"], got["key"], strict=True)) == top_ops
    assert list(got["ops"]) == [per_key[k] for k in top_ops]
    top_expired = sorted(expired_key, key=lambda k: (-expired_key[k], k))[:3]
    got_e = hot[hot["rank_by_expired"] <= 3].sort_values("rank_by_expired")
    assert list(zip(got_e["purgatory"], got_e["key"], strict=True)) == top_expired


def test_spark_replay_equals_single_process_replay(spark: Any, tmp_path: Path) -> None:
    data = generate_trace(TraceSpec(requests=4000, brokers=3, seed=9, failed_replicas=0.05))
    path = write_trace(data, tmp_path / "trace.parquet")
    sweep = [ReplayParams(timeout=0.02, min_insync=2), ReplayParams(timeout=1.0, min_insync=3)]
    frame = replay.read_trace(spark, str(path))
    got = replay.replay_spark(spark, frame, sweep, source="x").toPandas()
    want = replay_trace(trace.read_trace_pandas(path), sweep, source="x")
    order = ["scenario", "purgatory", "op_id"]
    got = got.sort_values(order).reset_index(drop=True)
    want = want.sort_values(order).reset_index(drop=True)
    got["keys"] = got["keys"].map(list)
    want["keys"] = want["keys"].map(list)
    pd.testing.assert_frame_equal(got, want, check_exact=True, check_dtype=False)
    assert len(got) == 2 * 4000
    assert set(got["outcome"]) == {"completed", "expired"}


def test_replay_groups_get_a_task_each(spark: Any) -> None:
    from pyspark.sql import functions as F

    # The Python Murmur3 is Spark's hash() of an int ...
    values = [0, 1, -1, 7, 42, 2**31 - 1, -(2**31), 123456789]
    got = spark.createDataFrame([(v,) for v in values], "v int").select(F.hash("v")).collect()
    assert [row[0] for row in got] == [replay.spark_hash_int(v) for v in values]
    # ... so each task's key lands in that task under repartition(n, key).
    for tasks in (1, 2, 5, 8):
        keys = spark_hash._task_keys(tasks)
        frame = spark.createDataFrame([(k,) for k in keys], "task int").repartition(tasks, "task")
        placed = frame.select("task", F.spark_partition_id().alias("p")).collect()
        assert sorted((keys.index(row["task"]), row["p"]) for row in placed) == [
            (t, t) for t in range(tasks)
        ]


def test_spark_replay_of_an_empty_trace_and_fewer_tasks(spark: Any, tmp_path: Path) -> None:
    data = generate_trace(TraceSpec(requests=500, brokers=3, seed=4))
    frame = replay.read_trace(spark, str(write_trace(data, tmp_path / "trace.parquet")))
    sweep = [ReplayParams(timeout=0.05), ReplayParams(timeout=0.5, min_insync=3)]
    one_task = replay.replay_spark(spark, frame, sweep, partitions=1).toPandas()
    want = replay_trace(data, sweep)
    columns = ["scenario", "op_id", "finished_at"]
    assert sorted(map(tuple, one_task[columns].to_numpy().tolist())) == sorted(
        map(tuple, want[columns].to_numpy().tolist())
    )
    empty = replay.replay_spark(spark, frame.limit(0), sweep)
    assert empty.count() == 0
    assert empty.columns == list(FACT_COLUMNS)
    with pytest.raises(ValueError, match="partitions"):
        replay.replay_spark(spark, frame, sweep, partitions=0)


def test_spark_replay_of_ragged_and_null_delay_lists(spark: Any, tmp_path: Path) -> None:
    # Lists of several lengths (and a null one) travel as arrays, not as columns.
    data = generate_trace(TraceSpec(requests=600, brokers=3, seed=5))
    delays = list(data["replica_delays"])
    delays[::7] = [[0.001]] * len(delays[::7])
    delays[3] = None
    delays[5] = [0.002, None, 0.003]
    data["replica_delays"] = pd.Series(delays, index=data.index, dtype=object)
    frame = replay.read_trace(spark, str(write_trace(data, tmp_path / "ragged.parquet")))
    sweep = [ReplayParams(timeout=0.05), ReplayParams(timeout=0.5, min_insync=3)]
    got = replay.replay_spark(spark, frame, sweep).toPandas()
    want = replay_trace(trace.read_trace_pandas(tmp_path / "ragged.parquet"), sweep)
    columns = ["scenario", "op_id", "finished_at", "outcome"]
    assert sorted(map(tuple, got[columns].to_numpy().tolist())) == sorted(
        map(tuple, want[columns].to_numpy().tolist())
    )


def _sorted_facts(facts: pd.DataFrame) -> pd.DataFrame:
    facts = facts.sort_values(["scenario", "purgatory", "op_id"]).reset_index(drop=True)
    facts["keys"] = facts["keys"].map(list)
    return facts


def test_files_replay_equals_single_process_replay(spark: Any, tmp_path: Path) -> None:
    data = generate_trace(TraceSpec(requests=4000, brokers=3, seed=9, failed_replicas=0.05))
    path = write_trace(data, tmp_path / "trace.parquet")
    sweep = [ReplayParams(timeout=0.02, min_insync=2), ReplayParams(timeout=1.0, min_insync=3)]
    facts = tmp_path / "facts"
    facts.mkdir()
    (facts / "stale.parquet").write_text("an earlier run's file")  # replaced, not mixed in
    done = replay.replay_files(spark, path, facts, sweep, source="x")
    want = replay_trace(trace.read_trace_pandas(path), sweep, source="x")
    got = pd.read_parquet(facts)
    pd.testing.assert_frame_equal(
        _sorted_facts(got), _sorted_facts(want), check_exact=True, check_dtype=False
    )
    # One file per slot (a broker with its parameter sets), committed like Spark's writers.
    names = sorted(p.name for p in facts.iterdir())
    assert names == ["_SUCCESS", *[f"part-{s:05d}.parquet" for s in range(done.files)]]
    assert done == replay.ReplayedFiles(requests=4000, facts=2 * 4000, files=done.files)
    assert 3 <= done.files <= 6
    # Spark reads them with the fact table's types.
    assert spark.read.parquet(str(facts)).schema == fact_schema()


def test_files_replay_with_fewer_tasks_a_directory_trace_and_an_empty_one(
    spark: Any, tmp_path: Path
) -> None:
    data = generate_trace(TraceSpec(requests=900, brokers=3, seed=4))
    # A trace written by Spark: a directory of part files with _SUCCESS and .crc files.
    directory = str(tmp_path / "trace")
    spark.createDataFrame(trace.arrow_trace(data).to_pandas()).repartition(3).write.parquet(
        directory
    )
    sweep = [ReplayParams(timeout=0.05), ReplayParams(timeout=0.5, min_insync=3)]
    done = replay.replay_files(spark, directory, tmp_path / "facts", sweep, partitions=1)
    assert (done.requests, done.facts) == (900, 1800)
    want = replay_trace(data, sweep)
    got = pd.read_parquet(tmp_path / "facts")
    pd.testing.assert_frame_equal(
        _sorted_facts(got), _sorted_facts(want), check_exact=True, check_dtype=False
    )

    # partitionBy("broker"): the broker is in the directory names only.
    by_broker = str(tmp_path / "by-broker")
    spark.read.parquet(directory).write.partitionBy("broker").parquet(by_broker)
    assert (tmp_path / "by-broker" / "broker=0").is_dir()
    replay.replay_files(spark, by_broker, tmp_path / "facts2", sweep)
    pd.testing.assert_frame_equal(
        _sorted_facts(pd.read_parquet(tmp_path / "facts2")),
        _sorted_facts(want),
        check_exact=True,
        check_dtype=False,
    )

    empty = write_trace(data.iloc[:0], tmp_path / "empty.parquet")
    done = replay.replay_files(spark, empty, tmp_path / "none", sweep)
    assert done == replay.ReplayedFiles(requests=0, facts=0, files=1)
    frame = spark.read.parquet(str(tmp_path / "none"))
    assert frame.count() == 0
    assert frame.columns == list(FACT_COLUMNS)


def test_files_replay_refuses_bad_input_and_changes_nothing(spark: Any, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = trace.arrow_trace(generate_trace(TraceSpec(requests=50, brokers=2, seed=3)))
    sweep = [ReplayParams(timeout=0.05)]
    facts = tmp_path / "facts"
    facts.mkdir()
    (facts / "kept").write_text("")
    broker = data.column("broker").to_pylist()
    broker[7] = None
    nulls = data.set_column(1, "broker", pa.array(broker, pa.int32()))
    pq.write_table(nulls, tmp_path / "nulls.parquet")
    with pytest.raises(ValueError, match="1 requests with a null broker"):
        replay.replay_files(spark, tmp_path / "nulls.parquet", facts, sweep)
    pq.write_table(data.drop_columns(["acks"]), tmp_path / "no-acks.parquet")
    with pytest.raises(ValueError, match=r"missing columns \['acks'\]"):
        replay.replay_files(spark, tmp_path / "no-acks.parquet", facts, sweep)
    pq.write_table(data, tmp_path / "ok.parquet")
    with pytest.raises(ValueError, match="param_sets"):
        replay.replay_files(spark, tmp_path / "ok.parquet", facts, [])
    with pytest.raises(ValueError, match="partitions"):
        replay.replay_files(spark, tmp_path / "ok.parquet", facts, sweep, partitions=0)
    with pytest.raises(ValueError, match="would replace the trace"):
        replay.replay_files(spark, tmp_path / "ok.parquet", tmp_path, sweep)
    assert (tmp_path / "ok.parquet").is_file()
    assert [p.name for p in facts.iterdir()] == ["kept"]


def test_files_reachable_takes_local_parquet_paths_only() -> None:
    assert replay.files_reachable("trace.parquet", "/tmp/out")
    assert replay.files_reachable("file:///data/trace", "file:/tmp/out")
    assert not replay.files_reachable("trace.csv", "/tmp/out")
    assert not replay.files_reachable("s3a://bucket/trace", "/tmp/out")
    assert not replay.files_reachable("trace.parquet", "hdfs://namenode/out")
    assert replay._local("file:///data/trace") == Path("/data/trace")
    assert replay._local("file:/data/trace") == Path("/data/trace")


def test_a_task_written_twice_leaves_one_whole_file(tmp_path: Path) -> None:
    """A retried or speculative attempt rewrites its slot's file whole; an attempt
    that fails leaves nothing in place (its part stays under _temporary/)."""
    import pyarrow.parquet as pq

    data = generate_trace(TraceSpec(requests=300, brokers=1, seed=2))
    requests = trace.arrow_trace(data)
    facts = [replay_table(requests, ReplayParams(timeout=t)) for t in (0.05, 1.0)]
    (tmp_path / "_temporary").mkdir()
    assert replay._write_facts(tmp_path, "part-00000.parquet", facts) == 600
    assert replay._write_facts(tmp_path, "part-00000.parquet", facts) == 600
    import pyarrow as pa

    assert pq.read_table(tmp_path / "part-00000.parquet").equals(pa.concat_tables(facts))

    def failing() -> Any:
        yield facts[0]
        raise RuntimeError("executor lost")

    with pytest.raises(RuntimeError, match="executor lost"):
        replay._write_facts(tmp_path, "part-00001.parquet", failing())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_temporary", "part-00000.parquet"]
    assert list((tmp_path / "_temporary").iterdir()) != []


def test_spark_reads_csv_trace_like_parquet(spark: Any, tmp_path: Path) -> None:
    data = generate_trace(TraceSpec(requests=200, brokers=2, seed=1, failed_replicas=0.3))
    csv = replay.read_trace(spark, str(write_trace(data, tmp_path / "t.csv"))).toPandas()
    parquet = replay.read_trace(spark, str(write_trace(data, tmp_path / "t.parquet"))).toPandas()
    for frame in (csv, parquet):
        frame["replica_delays"] = frame["replica_delays"].map(
            lambda row: [None if d is None or d != d else float(d) for d in row]
        )
    pd.testing.assert_frame_equal(csv, parquet, check_exact=True)
    assert any(None in row for row in csv["replica_delays"])


def test_cli_end_to_end(spark: Any, tmp_path: Path) -> None:
    from aiopurgatory.cli import main as cli
    from aiopurgatory.pipeline.demo import write_sample_event_log

    trace_path = tmp_path / "trace.parquet"
    assert cli(["gen-trace", "--out", str(trace_path), "--requests", "1500", "--seed", "2"]) == 0
    replayed = {}
    for io in ("spark", "auto"):
        out = tmp_path / f"replay-{io}"
        argv = ["replay", str(trace_path), "--out", str(out), "--timeout", "0.01,1"]
        assert cli([*argv, "--master", "local[2]", "--io", io]) == 0
        replayed[io] = _sorted_facts(pd.read_parquet(out / "facts"))
        assert len(replayed[io]) == 2 * 1500
    # auto = files for a local Parquet trace: the tasks wrote one file per slot.
    assert (tmp_path / "replay-auto" / "facts" / "part-00000.parquet").is_file()
    pd.testing.assert_frame_equal(replayed["auto"], replayed["spark"], check_dtype=False)
    csv = write_trace(trace.read_trace_pandas(trace_path), tmp_path / "trace.csv")
    assert cli(["replay", str(csv), "--out", str(tmp_path / "x"), "--io", "files"]) == 2
    report = (out / "report.md").read_text()
    assert "timeout=0.01 min_insync=2 tick=0.001" in report
    assert (out / "wait_by_outcome.png").stat().st_size > 0
    assert len(pd.read_parquet(out / "scenarios")) == 2

    events = tmp_path / "events.jsonl"
    count = write_sample_event_log(events, ops=400)
    out = tmp_path / "analysis"
    assert cli(["analyze", str(events), "--out", str(out), "--master", "local[2]"]) == 0
    quality = json.loads((out / "quality.json").read_text())
    assert quality["events"] == count == 400
    assert quality["malformed"] == 2
    assert {e["line"] for e in quality["examples"]} == {401, 402}
    assert "**malformed: 2**" in (out / "report.md").read_text()
    assert len(pd.read_parquet(out / "malformed")) == 2
    assert cli(["analyze", str(events), "--out", str(out), "--interval", "0"]) == 2


def _nearest_rank_or_none(values: list[float], p: float) -> float | None:
    return _nearest_rank(values, p) if values else None


@pytest.fixture(scope="module")
def clean_logs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """Two log files of valid op events only."""
    root = tmp_path_factory.mktemp("clean-events")
    events = _events(2000, seed=5)
    for name, chunk in (("a.jsonl", events[:900]), ("b.jsonl", events[900:])):
        (root / name).write_text("".join(json.dumps(e) + "\n" for e in chunk))
    return root, events


def test_no_malformed_lines_no_second_pass(
    spark: Any,
    clean_logs: tuple[Path, list[dict[str, Any]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Malformed lines are counted in the one parse that writes the facts; the
    text pass that locates them runs only when some were counted."""
    root, events = clean_logs
    passes = []
    locate_pass = analyze._parsed_lines

    def spy(*args: Any) -> Any:
        passes.append(args)
        return locate_pass(*args)

    monkeypatch.setattr(analyze, "_parsed_lines", spy)
    quality = analyze.read_events(spark, [str(root)], tmp_path / "facts")
    assert (quality.lines, quality.events, quality.other, quality.malformed) == (2000, 2000, 0, 0)
    assert quality.examples == []
    assert passes == []
    assert spark.read.parquet(str(tmp_path / "facts")).count() == len(events)

    with (root / "a.jsonl").open("a") as file:
        file.write("not json\n")
    try:
        quality = analyze.read_events(spark, [str(root)], tmp_path / "facts2")
    finally:
        (root / "a.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events[:900]))
    assert (quality.events, quality.malformed) == (2000, 1)
    assert len(passes) == 1
    assert [(e["line"], e["problem"][:8]) for e in quality.examples] == [(901, "not JSON")]


def _exchanges(frame: Any) -> int:
    plan = frame._jdf.queryExecution().executedPlan().toString()
    return int(plan.count("Exchange "))


def test_histograms_from_one_aggregate(
    spark: Any, clean_logs: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    root, events = clean_logs
    analyze.read_events(spark, [str(root)], tmp_path / "facts")
    facts = spark.read.parquet(str(tmp_path / "facts"))
    assert _exchanges(aggregates._histogram_counts(facts)) == 1
    got = analyze.histograms(facts)

    def bin_of(value: float) -> float | None:
        return math.floor(math.log10(value) * analyze.BINS_PER_DECADE) if value > 0 else None

    want: Counter[tuple[str, str, float | None]] = Counter()
    for e in events:
        want[("wait", e["outcome"], bin_of(e["wait"]))] += 1
        if e["lateness"] is not None:
            want[("lateness", e["outcome"], bin_of(e["lateness"]))] += 1
    rows = got.to_dict("records")
    assert {
        (r["metric"], r["outcome"], None if pd.isna(r["bin"]) else int(r["bin"])): r["count"]
        for r in rows
    } == dict(want)
    assert set(got["scenario"]) == {"observed"}


def test_tables_from_one_aggregate_equal_the_baseline_job(
    spark: Any, clean_logs: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """analyze's tables equal those of the plain PySpark job (baseline.py) on the
    same events; rollups and summary come from one aggregate (one shuffle)."""
    from aiopurgatory.pipeline.baseline import run_baseline

    root, events = clean_logs
    facts_path = tmp_path / "analysis" / "facts"
    analyze.read_events(spark, [str(root)], facts_path)
    facts = spark.read.parquet(str(facts_path))
    assert _exchanges(aggregates._tables(facts, 0.5)) == 1
    result = analyze.analyze_facts(
        spark, facts_path, tmp_path / "analysis", interval=0.5, top=4, report=False
    )
    run_baseline(spark, [str(root)], tmp_path / "baseline", interval=0.5, top=4)
    for table in ("facts", "rollups", "summary", "hot_keys"):
        ours = pd.read_parquet(tmp_path / "analysis" / table)
        theirs = pd.read_parquet(tmp_path / "baseline" / table)
        assert set(theirs.columns) <= set(ours.columns), table
        ours = ours[list(theirs.columns)]
        order = [
            c for c in ("scenario", "purgatory", "interval_start", "key", "op_id") if c in theirs
        ]
        ours = ours.sort_values(order).reset_index(drop=True)
        theirs = theirs.sort_values(order).reset_index(drop=True)
        if table == "facts":
            ours["keys"] = ours["keys"].map(list)
            theirs["keys"] = theirs["keys"].map(list)
        pd.testing.assert_frame_equal(ours, theirs, check_dtype=False, check_exact=True)
    # The written tables are sorted, and what analyze_facts returns is what it wrote.
    summary = pd.read_parquet(tmp_path / "analysis" / "summary")
    assert list(summary["purgatory"]) == ["(all)", "fetch", "produce"]
    assert summary.loc[0, "ops"] == len(events)
    assert summary.loc[0, "wait_p95"] == _nearest_rank([e["wait"] for e in events], 0.95)
    late = [e["lateness"] for e in events if e["lateness"] is not None]
    assert summary.loc[0, "lateness_p99"] == _nearest_rank_or_none(late, 0.99)
    pd.testing.assert_frame_equal(result.summary, summary, check_dtype=False)
    rollups = pd.read_parquet(tmp_path / "analysis" / "rollups")
    keys = list(zip(rollups["purgatory"], rollups["interval_start"], strict=True))
    assert keys == sorted(keys)
    hot = pd.read_parquet(tmp_path / "analysis" / "hot_keys")
    assert list(hot["rank_by_ops"]) == sorted(hot["rank_by_ops"])
    pd.testing.assert_frame_equal(result.hot_keys, hot, check_dtype=False)
