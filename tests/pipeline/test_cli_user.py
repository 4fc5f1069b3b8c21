"""The ``aiopurgatory`` command as a new user meets it (issue 31): it runs the
installed console script in a subprocess, stderr not a terminal, as in a CI log.

Most tests here fail before any Spark session starts (and say so in one line);
the few that run Spark are marked ``spark``. Of those, one ``replay`` runs as a
subprocess, with a Spark driver JVM of its own (some 35 CPU seconds here; the
cluster tests run ``analyze`` and ``replay`` as subprocesses too); the other runs,
whose point is what the command does rather than how its process starts, call
the same entry point in this process on the tests' shared session (``spark`` in
conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from aiopurgatory._clitools import MARKER
from aiopurgatory.cli import main as cli
from aiopurgatory.pipeline.trace import TraceSpec, generate_trace_table, write_trace
from tests.support.cli import ROOT, SPARK_BANNER, aiopurgatory, lines


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """A small replication-3 trace (3 brokers)."""
    return write_trace(
        generate_trace_table(TraceSpec(requests=400, seed=3)), tmp_path / "t.parquet"
    )


@pytest.fixture
def events(tmp_path: Path) -> Path:
    path = tmp_path / "ops.jsonl"
    from aiopurgatory.pipeline.demo import write_sample_event_log

    write_sample_event_log(path, ops=200)
    return path


def _one_line(result: subprocess.CompletedProcess[str], command: str, status: int = 2) -> str:
    """The single stderr line of a refused command (no traceback, no Spark started)."""
    assert result.returncode == status, result.stderr
    assert SPARK_BANNER not in result.stderr
    (line,) = lines(result.stderr)
    assert line.startswith(f"aiopurgatory {command}: "), line
    return line


# -- item 2: errors before work, in one line -------------------------------------------------


@pytest.mark.parametrize("command", ["analyze", "replay"])
def test_an_unusable_out_is_refused_before_spark(
    command: str, tmp_path: Path, trace: Path, events: Path
) -> None:
    source = str(events if command == "analyze" else trace)
    (tmp_path / "file").write_text("")
    absent = tmp_path / "absent"
    cases = {
        str(absent / "out"): f"its parent directory {absent} does not exist",
        str(tmp_path / "file"): "is a file, expected a directory",
        str(tmp_path / "file" / "out"): "is not a directory",
        "/proc/aiopurgatory-out": "cannot write in /proc",
    }
    for out, problem in cases.items():
        line = _one_line(aiopurgatory(command, source, "--out", out), command)
        assert f"--out {out}" in line
        assert problem in line
    assert not absent.exists()  # nothing created above --out


@pytest.mark.parametrize("command", ["analyze", "replay"])
@pytest.mark.parametrize("master", ["bogus", "local[x]", "local[0]"])
def test_a_bad_master_is_refused_in_one_line(
    command: str, master: str, tmp_path: Path, trace: Path, events: Path
) -> None:
    source = str(events if command == "analyze" else trace)
    result = aiopurgatory(command, source, "--out", str(tmp_path / "o"), "--master", master)
    line = _one_line(result, command)
    assert f"master {master!r} is not a Spark master: expected local, local[N]" in line
    assert "accepts connections" not in result.stderr
    assert not (tmp_path / "o").exists()


def test_replay_refuses_a_trace_that_is_not_parquet(tmp_path: Path, events: Path) -> None:
    noise = tmp_path / "noise.parquet"
    noise.write_bytes(bytes(range(256)) * 40)
    for path in (noise, events):
        line = _one_line(aiopurgatory("replay", str(path), "--out", str(tmp_path / "o")), "replay")
        assert f"trace {path} is not a readable Parquet trace (" in line
    line = _one_line(
        aiopurgatory("replay", str(noise), "--out", str(tmp_path / "o"), "--local"), "replay"
    )
    assert "not a Parquet file" in line


def test_analyze_refuses_a_parquet_file_as_an_event_log(tmp_path: Path, trace: Path) -> None:
    line = _one_line(aiopurgatory("analyze", str(trace), "--out", str(tmp_path / "o")), "analyze")
    assert line.endswith(f"{trace} is a Parquet file, not an event log (JSON lines)")
    binary = tmp_path / "logs" / "x.jsonl"
    binary.parent.mkdir()
    binary.write_bytes(b"\x00\x01" * 100)
    line = _one_line(
        aiopurgatory("analyze", str(binary.parent), "--out", str(tmp_path / "o")), "analyze"
    )
    assert "is not text" in line


# -- item 3: a reused --out never mixes runs -------------------------------------------------


def test_a_reused_out_is_refused_and_overwrite_needs_a_commands_output(
    tmp_path: Path, trace: Path
) -> None:
    out = tmp_path / "replay"
    first = aiopurgatory("replay", str(trace), "--out", str(out), "--local", "--facts-only")
    assert first.returncode == 0, first.stderr
    assert json.loads((out / MARKER).read_text())["command"] == "replay"
    (out / "stale.png").write_text("from an earlier run")
    again = aiopurgatory("replay", str(trace), "--out", str(out), "--local", "--facts-only")
    line = _one_line(again, "replay")
    assert "is not empty (an earlier run?): pass --overwrite to replace it" in line
    assert (out / "stale.png").exists()
    # --overwrite replaces the whole directory: nothing of the earlier run stays.
    again = aiopurgatory(
        "replay", str(trace), "--out", str(out), "--local", "--facts-only", "--overwrite",
        "--timeout", "0.5",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "facts", "scenarios"]
    assert set(pd.read_parquet(out / "facts")["scenario"]) == {
        "timeout=0.5 min_insync=2 tick=0.001"
    }
    assert not list(tmp_path.glob(".replay.*"))  # no staging left behind
    # A directory no command wrote is never replaced.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    line = _one_line(
        aiopurgatory("replay", str(trace), "--out", str(mine), "--local", "--overwrite"), "replay"
    )
    assert f"holds files no aiopurgatory command wrote (no {MARKER})" in line
    assert (mine / "notes.txt").read_text() == "mine"
    # Nor one that holds the input.
    line = _one_line(
        aiopurgatory("replay", str(trace), "--out", str(tmp_path), "--overwrite"), "replay"
    )
    assert f"holds the input {trace}" in line


# -- item 4: settings that contradict the input ----------------------------------------------


def test_replay_refuses_min_insync_above_the_traces_replication(
    tmp_path: Path, trace: Path
) -> None:
    for io in ("--local", "--io=spark"):
        result = aiopurgatory(
            "replay", str(trace), "--out", str(tmp_path / "o"), "--min-insync", "2,7", io
        )
        line = _one_line(result, "replay")
        assert "--min-insync 7 is more than the trace's replication (3: a leader and 2 " in line
    csv = write_trace(generate_trace_table(TraceSpec(requests=50, brokers=2)), tmp_path / "t.csv")
    line = _one_line(
        aiopurgatory("replay", str(csv), "--out", str(tmp_path / "o"), "--min-insync", "3"),
        "replay",
    )
    assert "the trace's replication (2:" in line


def test_gen_trace_refuses_what_contradicts_itself(tmp_path: Path) -> None:
    line = _one_line(
        aiopurgatory(
            "gen-trace",
            "--out",
            str(tmp_path / "t.parquet"),
            "--replication",
            "5",
            "--brokers",
            "2",
        ),
        "gen-trace",
    )
    assert "--replication 5 is more than --brokers 2" in line
    line = _one_line(aiopurgatory("gen-trace", "--out", str(tmp_path / "t.json")), "gen-trace")
    assert "a trace is written as Parquet (name it *.parquet) or CSV (*.csv)" in line
    line = _one_line(
        aiopurgatory("gen-trace", "--out", str(tmp_path / "no" / "t.parquet")), "gen-trace"
    )
    assert f"the directory {tmp_path / 'no'} does not exist" in line
    assert sorted(tmp_path.iterdir()) == []
    # Fewer brokers than the default replication: the default follows them.
    ok = aiopurgatory(
        "gen-trace", "--out", str(tmp_path / "t.pq"), "--brokers", "2", "--requests", "50"
    )
    assert ok.returncode == 0, ok.stderr


# -- items 5 and 7: steps as they go; --local without Spark ----------------------------------


def test_replay_local_facts_only_never_starts_spark(tmp_path: Path, trace: Path) -> None:
    out = tmp_path / "out"
    result = aiopurgatory(
        "replay", str(trace), "--out", str(out), "--local", "--facts-only", "--timeout", "0.05,1"
    )
    assert result.returncode == 0, result.stderr
    assert SPARK_BANNER not in result.stderr
    assert "session" not in result.stderr
    steps = lines(result.stderr)
    assert steps[0].endswith("replay: 2 scenario(s) in this process, no Spark ...")
    assert any("replay: done in" in line for line in steps)
    # The facts are facts/ (a directory of Parquet files), as on Spark.
    assert sorted(p.name for p in (out / "facts").iterdir()) == ["_SUCCESS", "part-00000.parquet"]
    assert len(pd.read_parquet(out / "facts")) == 2 * 400
    assert len(pd.read_parquet(out / "scenarios")) == 2


def _acks_all_events(path: Path, scenario: str) -> list[dict[str, object]]:
    run = subprocess.run(
        [sys.executable, "-m", "examples.acks_all", "--scenario", scenario, "--events", str(path)],
        capture_output=True,
        text=True,
        # A hang guard, not a speed goal: `make test` runs the Spark pass at idle
        # CPU priority, where a saturated machine can pause it for minutes.
        timeout=600,
        cwd=ROOT,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_analyze_shows_the_demos_error_answers(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 1: the two-down demo's NOT_ENOUGH_REPLICAS answers reach analyze's tables,
    report, plots and summary; a schema-1 log beside it still reads.

    The command runs in this process, on the tests' shared session (a driver JVM
    of its own cost some 35 CPU seconds; the cluster tests run ``analyze`` in a
    subprocess, as users do)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    events = _acks_all_events(logs / "two-down.jsonl", "two-down")
    # An older log: schema 1, no error field (its answers are unknown).
    old = [
        {k: v for k, v in dict(e, schema=1, purgatory="old").items() if k != "error"}
        for e in events[:50]
    ]
    (logs / "old.jsonl").write_text("".join(json.dumps(e) + "\n" for e in old))
    out = tmp_path / "analysis"
    capsys.readouterr()
    status = cli(["analyze", str(logs), "--out", str(out), "--master", "local[2]", "--top", "2"])
    run = capsys.readouterr()
    assert status == 0, run.err[-3000:]

    errors = Counter(str(e["error"]) for e in events)
    summary = pd.read_parquet(out / "summary").set_index("purgatory")
    assert summary.loc["produce", "ops"] == len(events)
    assert summary.loc["produce", "completed"] == len(events)
    assert summary.loc["produce", "errors"] == len(events)
    assert summary.loc["produce", "error_rate"] == 1.0
    assert summary.loc["old", "errors"] == 0  # unknown, read as none
    answers = pd.read_parquet(out / "answers")
    produce = answers[answers["purgatory"] == "produce"]
    assert dict(zip(produce["error"], produce["ops"], strict=True)) == dict(errors)
    assert set(produce["outcome"]) == {"completed"}
    rollups = pd.read_parquet(out / "rollups")
    assert rollups[rollups["purgatory"] == "produce"]["errors"].sum() == len(events)
    facts = pd.read_parquet(out / "facts")
    assert facts["error"].isna().sum() == len(old)
    quality = json.loads((out / "quality.json").read_text())
    assert (quality["events"], quality["schema1"], quality["malformed"]) == (
        len(events) + len(old),
        len(old),
        0,
    )
    report = (out / "report.md").read_text()
    assert "## Outcomes and answers" in report
    for code in errors:
        assert f"| observed | produce | completed | {code} |" in report
    assert "100.00%" in report
    assert "op events of schema 1: 50" in report
    # stdout names every error answer.
    for code, count in errors.items():
        assert f"completed {code}: {count:,} ops" in run.out

    # Item 5: the steps, as they went, on a stderr that is not a terminal.
    steps = [line for line in lines(run.err) if line.startswith("aiopurgatory analyze [")]
    started = [line.split("] ", 1)[1].split(":")[0] for line in steps if line.endswith("...")]
    assert started == ["session", "read", "tables", "hot keys", "answers", "report"]
    assert sum("done in" in line for line in steps) == len(started)
    # Item 6: the report's headings follow --top, above as many rows.
    assert "## Hot keys by ops (top 2)" in report
    assert "(top 10)" not in report
    by_ops = report.split("## Hot keys by ops (top 2)")[1].split("##")[0]
    assert sum(line.startswith("| observed | produce |") for line in by_ops.splitlines()) == 2

    # Item 3: a second run into the same --out replaces it whole (in this process,
    # on the shared session: the run above was the user's subprocess).
    assert sorted(p.name for p in out.glob("*.png"))
    again = cli([
        "analyze", str(logs / "old.jsonl"), "--out", str(out), "--master", "local[2]",
        "--no-report", "--overwrite",
    ])  # fmt: skip
    assert again == 0
    assert not (out / "report.md").exists()
    assert not list(out.glob("*.png"))
    assert pd.read_parquet(out / "summary")["purgatory"].tolist() == ["(all)", "old"]
    assert json.loads((out / MARKER).read_text())["argv"][0] == str(logs / "old.jsonl")


@pytest.mark.spark
def test_analyze_of_input_without_an_op_event_is_an_error(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In this process, on the shared session (see the module's docstring)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "app.jsonl").write_text(
        '{"event": "http.request", "path": "/"}\n' * 5 + "not json\n" * 3
    )
    out = tmp_path / "out"
    status = cli(["analyze", str(logs), "--out", str(out), "--master", "local[2]"])
    stderr = capsys.readouterr().err
    assert status == 1, stderr[-3000:]
    errors = [line for line in lines(stderr) if line.startswith("aiopurgatory analyze: ")]
    assert errors == [
        "aiopurgatory analyze: no op event in the input (8 lines: 5 other events, "
        f"3 malformed; first: file:{logs / 'app.jsonl'}:6: not JSON, or a field of the "
        "wrong type); nothing written"
    ]
    assert "Traceback" not in stderr
    assert not out.exists()
    assert not list(tmp_path.glob(".out.*"))


@pytest.mark.spark
def test_replay_local_says_why_it_starts_spark(tmp_path: Path, trace: Path) -> None:
    out = tmp_path / "out"
    result = aiopurgatory(
        "replay", str(trace), "--out", str(out), "--local", "--master", "local[1]", "--no-report"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [line.split("] ", 1)[1] for line in lines(result.stderr) if "replay [" in line]
    assert steps[0] == "replay: 1 scenario(s) in this process, no Spark ..."
    session = [line for line in steps if line.startswith("session: starting")]
    assert session == [
        "session: starting Spark (local[1]) for the tables and report only: the replay ran "
        "without it ..."
    ]
    # Spark starts after the replay, not before it.
    assert steps.index(session[0]) > steps.index(next(s for s in steps if "replay: done" in s))
    assert (out / "facts" / "part-00000.parquet").is_file()
    assert pd.read_parquet(out / "summary")["ops"].iloc[0] == 400


def test_the_wait_plot_has_a_line_per_outcome_and_error(tmp_path: Path) -> None:
    """Item 1: the wait plot's legend splits completed ops by their answer."""
    from matplotlib.figure import Figure

    from aiopurgatory.pipeline import report

    histograms = pd.DataFrame(
        {
            "scenario": ["observed"] * 3,
            "metric": ["wait"] * 3,
            "outcome": ["completed", "completed", "expired"],
            "error": [None, "NOT_ENOUGH_REPLICAS", "REQUEST_TIMED_OUT"],
            "bin": [-20.0, None, -10.0],
            "count": [5, 7, 2],
        }
    )
    labels: list[str] = []
    savefig = Figure.savefig

    def spy(fig: Figure, *args: Any, **kwargs: Any) -> None:
        for ax in fig.axes:
            legend = ax.get_legend()
            assert legend is not None
            labels.extend(text.get_text() for text in legend.get_texts())
        savefig(fig, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Figure, "savefig", spy)
        assert report._plot_histograms(histograms, "wait", tmp_path / "w.png", "wait", True)
    assert labels == [
        "completed",
        "completed: NOT_ENOUGH_REPLICAS (7 at 0)",
        "expired: REQUEST_TIMED_OUT",
    ]
