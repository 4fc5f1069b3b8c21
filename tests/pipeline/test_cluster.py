"""The pipeline on a real standalone Spark cluster and through Spark Connect.

One session-scoped cluster (``spark_cluster`` in conftest.py: a Master, two
Workers of one core each and a Spark Connect server, all on 127.0.0.1). Every
job runs in a subprocess through the ``aiopurgatory`` CLI, as a user runs it (a
process has one classic Spark driver, and a Connect session switches the whole
process to Connect mode). Results are compared row for row with the same command
run in this process on the tests' shared ``local[2]`` session (conftest.py; no
driver JVM of its own), which proves the executors imported and ran this package.

Also: a Worker (with its executor) killed by SIGKILL in the middle of a replay,
after which Spark reruns the lost tasks and the facts are still exactly the
single-process replay's; and executors whose Python lacks aiopurgatory, which
the CLI reports in one line.

These tests start JVMs and take minutes, so they run once in ``make test``: in
the compiled-core run, not in the pure-Python rerun (the local Spark tests of
the pipeline run in both).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import textwrap
import time
import venv
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from aiopurgatory.pipeline.cluster import LocalCluster, _free_port, _get_json
from aiopurgatory.pipeline.cluster_processes import _children, _start_ticks
from aiopurgatory.pipeline.demo import write_sample_event_log
from aiopurgatory.pipeline.replay_core import ReplayParams, replay_trace
from aiopurgatory.pipeline.trace import TraceSpec, generate_trace, read_trace_pandas, write_trace

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(
        os.environ.get("AIOPURGATORY_NO_EXTENSIONS", "") not in ("", "0"),
        reason="cluster tests run once per `make test`: in the compiled-core run",
    ),
    # Fixtures count: the first test also starts the cluster and the local runs.
    pytest.mark.timeout(900),
]

#: Every CLI run gets this long (JVM start-ups on a shared 2-core machine).
RUN_TIMEOUT = 600
#: Each (scenario, broker) group and each scenario stays under 10,000 ops, where
#: percentile_approx is exact, so partitioning cannot change a percentile.
TIMEOUTS = "0.01,1"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiopurgatory.cli", *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        env=env,
        check=False,
    )


def _ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-4000:]}"


def _rows(table: Path | pd.DataFrame) -> pd.DataFrame:
    """A table (or Parquet directory) with lists as tuples, sorted by every column:
    comparable row for row."""
    frame = pd.read_parquet(table) if isinstance(table, Path) else table.copy()
    for column in frame.columns:
        if frame[column].dtype == object:
            frame[column] = frame[column].map(
                lambda v: tuple(v) if hasattr(v, "__len__") and not isinstance(v, str) else v
            )
    return frame.sort_values(list(frame.columns), na_position="first").reset_index(drop=True)


def _assert_same_tables(got: Path, want: Path, tables: list[str]) -> None:
    for table in tables:
        left, right = _rows(got / table), _rows(want / table)
        assert len(left) > 0, table
        pd.testing.assert_frame_equal(left, right, check_exact=True, obj=table)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cluster-inputs")
    spec = TraceSpec(requests=9000, brokers=3, seed=9, failed_replicas=0.05)
    trace = write_trace(generate_trace(spec), root / "trace.parquet")
    events = root / "events"
    (events / "sub").mkdir(parents=True)
    write_sample_event_log(events / "a.jsonl", ops=1500, seed=1)
    write_sample_event_log(events / "sub" / "b.jsonl", ops=1000, seed=2)
    return {"trace": trace, "events": events, "root": root}


def _argv(command: str, inputs: dict[str, Path], master: str, out: Path) -> list[str]:
    """``replay`` (the trace, both timeouts, no report) or ``analyze`` (the events)."""
    if command == "replay":
        argv = ["replay", str(inputs["trace"]), "--timeout", TIMEOUTS, "--no-report"]
    else:
        argv = ["analyze", str(inputs["events"])]
    return [*argv, "--out", str(out), "--master", master]


def _replay(inputs: dict[str, Path], master: str, out: Path) -> subprocess.CompletedProcess[str]:
    return _cli(*_argv("replay", inputs, master, out))


def _analyze(inputs: dict[str, Path], master: str, out: Path) -> subprocess.CompletedProcess[str]:
    return _cli(*_argv("analyze", inputs, master, out))


def _in_process(command: str, inputs: dict[str, Path], out: Path) -> None:
    """The command on the shared local session (the CLI takes the active session:
    no driver JVM of its own)."""
    from aiopurgatory.cli import main as cli

    assert cli(_argv(command, inputs, "local[2]", out)) == 0


@pytest.fixture(scope="module")
def local_replay(spark: Any, inputs: dict[str, Path]) -> Path:
    out = inputs["root"] / "replay-local"
    _in_process("replay", inputs, out)
    return out


@pytest.fixture(scope="module")
def local_analysis(spark: Any, inputs: dict[str, Path]) -> Path:
    out = inputs["root"] / "analysis-local"
    _in_process("analyze", inputs, out)
    return out


def _master(cluster: LocalCluster, kind: str) -> str:
    return cluster.master_url if kind == "standalone" else cluster.connect_url


def _apps_on_workers(cluster: LocalCluster) -> dict[str, str]:
    """Applications that have had an executor on a Worker: work directory -> app name."""
    data = cluster.master_json()
    names = {app["id"]: app["name"] for app in data["activeapps"] + data["completedapps"]}
    return {
        str(executor): names.get(executor.parent.name, "?")
        for executor in cluster.directory.glob("work/worker-*/app-*/*")
    }


def _assert_ran_on_the_workers(
    cluster: LocalCluster, kind: str, before: dict[str, str], app_name: str
) -> None:
    """The job's tasks ran in executors on the Workers (not in a local driver)."""
    after = _apps_on_workers(cluster)
    if kind == "standalone":
        # A new application of that name, with executors on both Workers.
        new = {path for path, name in after.items() if path not in before and name == app_name}
        assert {Path(path).parts[-3] for path in new} == {"worker-1", "worker-2"}, after
    else:
        # The Connect server is the application; its executors come and go with work.
        assert "aiopurgatory Spark Connect server" in after.values(), after


REPLAY_TABLES = ["facts", "rollups", "hot_keys", "summary", "scenarios"]
ANALYSIS_TABLES = ["facts", "rollups", "hot_keys", "summary", "malformed"]


@pytest.mark.parametrize("kind", ["standalone", "connect"])
def test_replay_on_the_cluster_equals_local(
    kind: str,
    spark_cluster: LocalCluster,
    inputs: dict[str, Path],
    local_replay: Path,
    tmp_path: Path,
) -> None:
    master = _master(spark_cluster, kind)
    before = _apps_on_workers(spark_cluster)
    _ok(_replay(inputs, master, tmp_path / "replay"))
    _assert_ran_on_the_workers(spark_cluster, kind, before, "aiopurgatory-replay")
    _assert_same_tables(tmp_path / "replay", local_replay, REPLAY_TABLES)
    facts = pd.read_parquet(tmp_path / "replay" / "facts")
    assert len(facts) == 2 * 9000
    assert set(facts["outcome"]) == {"completed", "expired"}


@pytest.mark.parametrize("kind", ["standalone", "connect"])
def test_analyze_on_the_cluster_equals_local(
    kind: str,
    spark_cluster: LocalCluster,
    inputs: dict[str, Path],
    local_analysis: Path,
    tmp_path: Path,
) -> None:
    master = _master(spark_cluster, kind)
    before = _apps_on_workers(spark_cluster)
    _ok(_analyze(inputs, master, tmp_path / "analysis"))
    _assert_ran_on_the_workers(spark_cluster, kind, before, "aiopurgatory-analyze")
    out = tmp_path / "analysis"
    _assert_same_tables(out, local_analysis, ANALYSIS_TABLES)
    quality = json.loads((out / "quality.json").read_text())
    assert quality == json.loads((local_analysis / "quality.json").read_text())
    assert quality["events"] == 2500
    assert quality["malformed"] == 4
    assert (out / "report.md").read_text().count("**malformed: 4**") == 1
    assert (out / "wait_by_outcome.png").stat().st_size > 0


def test_a_port_taken_before_the_master_binds_it_is_picked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port is free when picked, not necessarily when the JVM binds it (another
    process picking ports meanwhile may get and bind the same one): the start
    picks new ports rather than failing."""
    from aiopurgatory.pipeline import cluster as module
    from tests.pipeline.conftest import FAST_JVM

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        picks = [taken]  # the Master's port, picked first
        real = module._free_port
        monkeypatch.setattr(module, "_free_port", lambda: picks.pop() if picks else real())
        cluster = LocalCluster(
            tmp_path / "cluster", workers=1, connect=False, java_options=FAST_JVM
        )
        with cluster:
            assert cluster.master_url.startswith("spark://127.0.0.1:")
            assert not cluster.master_url.endswith(f":{taken}")
            data = cluster.master_json()
            assert data["status"] == "ALIVE"
            assert [w["state"] for w in data["workers"]] == ["ALIVE"]
    # The first Master failed on the taken port (its log is appended to).
    log = (tmp_path / "cluster" / "logs" / "master.log").read_text()
    assert "Address already in use: Service 'sparkMaster' failed" in log
    assert not picks


def _bare_python(root: Path) -> Path:
    """A Python with this environment's libraries (pyspark, pandas, pyarrow, ...)
    but without aiopurgatory: a venv whose .pth file adds the site-packages
    directory, where the editable install's own .pth is then not run."""
    venv.EnvBuilder(with_pip=False).create(root)
    purelib = Path(sysconfig.get_paths()["purelib"])
    bare_purelib = Path(
        sysconfig.get_paths(vars={"base": str(root), "platbase": str(root)})["purelib"]
    )
    (bare_purelib / "deps.pth").write_text(f"{purelib}\n")
    return root / "bin" / "python"


def test_executors_without_the_package_fail_in_one_line(
    spark_cluster: LocalCluster, inputs: dict[str, Path], tmp_path: Path
) -> None:
    python = _bare_python(tmp_path / "bare")
    probe = subprocess.run(
        [str(python), "-c", "import pyspark, pandas, pyarrow; import aiopurgatory"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert "No module named 'aiopurgatory'" in probe.stderr  # the premise
    env = {**os.environ, "PYSPARK_PYTHON": str(python), "PYSPARK_DRIVER_PYTHON": sys.executable}
    result = _cli(
        "replay",
        str(inputs["trace"]),
        "--out",
        str(tmp_path / "out"),
        "--master",
        spark_cluster.master_url,
        env=env,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"aiopurgatory replay: the executors of {spark_cluster.master_url}")
    assert "No module named 'aiopurgatory'" in last
    assert "install aiopurgatory[spark]" in last
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


# -- a Worker lost in the middle of a replay ---------------------------------------

#: Four (scenario, broker) groups of 50k requests in five tasks: both executors
#: stay busy long enough for the test to see it (polls every 0.2 s) and kill one
#: mid-stage. Measured with KILL_DRIVER and no kill, at load 10-11 on the 2 cores:
#: both were busy for 12 s (--io spark) and 8 s (--io files) at 100k requests, 16 s
#: and 9 s at 150k; a few seconds of that is task start-up, which does not shrink
#: with the trace, so a quiet machine several times faster should still leave a
#: dozen polls. (It was 300k: three times the replay's CPU, here and in kill_trace.)
KILL_SPEC = TraceSpec(requests=100_000, brokers=2, seed=21, failed_replicas=0.05)
KILL_SWEEP = [ReplayParams(timeout=0.01), ReplayParams(timeout=1.0)]
KILL_TASKS = 5

KILL_DRIVER = textwrap.dedent(
    """
    import sys
    from aiopurgatory.pipeline.replay import read_trace, replay_files, replay_spark
    from aiopurgatory.pipeline.replay_core import ReplayParams
    from aiopurgatory.pipeline.session import get_spark

    master, trace, out, ui_port, tasks, io = sys.argv[1:]
    # The driver's web UI is on (on a free port) only for the test to watch the stage.
    spark = get_spark(
        master,
        app_name="aiopurgatory-worker-kill",
        conf={"spark.ui.enabled": "true", "spark.ui.port": ui_port},
    )
    sweep = [ReplayParams(timeout=0.01), ReplayParams(timeout=1.0)]
    if io == "files":
        replay_files(spark, trace, out, sweep, source="kill", partitions=int(tasks))
    else:
        trace = read_trace(spark, trace)
        replay_spark(spark, trace, sweep, source="kill", partitions=int(tasks)).write.parquet(out)
    spark.stop()
    """
)


@pytest.fixture(scope="module")
def kill_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    """The trace both kill tests replay, and its single-process replay (rows as
    :func:`_rows` gives them): made once, as both tests replay the same."""
    trace = write_trace(
        generate_trace(KILL_SPEC), tmp_path_factory.mktemp("kill") / "trace.parquet"
    )
    return trace, _rows(replay_trace(read_trace_pandas(trace), KILL_SWEEP, source="kill"))


def _replay_stage_busy(ui: str) -> bool:
    """True while the replay stage (``KILL_TASKS`` tasks) runs a task on each executor
    (one core each), read from the driver's REST API."""
    try:
        apps = _get_json(f"{ui}/api/v1/applications")
        stages = _get_json(f"{ui}/api/v1/applications/{apps[0]['id']}/stages?status=active")
    except (OSError, ValueError, IndexError, KeyError):
        return False  # the driver's UI is not up yet
    return any(s["numTasks"] == KILL_TASKS and s["numActiveTasks"] >= 2 for s in stages)


@pytest.mark.parametrize("io", ["spark", "files"])
def test_a_worker_killed_mid_replay_changes_nothing(
    io: str,
    spark_cluster: LocalCluster,
    kill_trace: tuple[Path, pd.DataFrame],
    tmp_path: Path,
) -> None:
    trace, want = kill_trace
    out = tmp_path / "facts"
    port = _free_port()
    ui = f"http://127.0.0.1:{port}"
    argv = [spark_cluster.master_url, str(trace), str(out), str(port), str(KILL_TASKS), io]
    driver = subprocess.Popen(
        [sys.executable, "-c", KILL_DRIVER, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    killed: list[int] = []
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while driver.poll() is None and time.monotonic() < deadline:
            if _replay_stage_busy(ui):
                worker = spark_cluster.worker_pid(1)
                # The Worker and its executor JVM (with the executor's Python workers).
                running = [p for p in [worker, *_children(worker)] if _start_ticks(p) is not None]
                assert worker in running
                assert len(running) >= 2, running
                killed = spark_cluster.kill_worker(1)
                break
            time.sleep(0.2)
        assert killed, "the replay ended (or timed out) before both executors were busy"
        assert not (out / "_SUCCESS").exists()  # the job was still running
        for _ in range(100):
            if all(_start_ticks(pid) is None for pid in killed):
                break
            time.sleep(0.1)
        assert [pid for pid in killed if _start_ticks(pid) is not None] == []
        _, stderr = driver.communicate(timeout=RUN_TIMEOUT)
    finally:
        if driver.poll() is None:
            driver.send_signal(signal.SIGTERM)
            driver.communicate(timeout=60)
        if killed:
            spark_cluster.restart_worker(1)
    assert driver.returncode == 0, stderr[-4000:]
    # The driver saw the executor go and reran its tasks on the other one.
    assert "Lost executor" in stderr
    got = _rows(out)
    # Spark's Parquet has narrower integer types than pandas: compare values.
    pd.testing.assert_frame_equal(got, want, check_exact=True, check_dtype=False)
    assert len(got) == len(KILL_SWEEP) * KILL_SPEC.requests
    if io == "files":  # the killed attempts' parts were never renamed into place
        assert sorted(p.name for p in out.iterdir() if not p.name.startswith("part-")) == [
            "_SUCCESS"
        ]
