"""The ``aiopurgatory`` command as a new user meets it (issue 31): it runs the
installed console script in a subprocess, stderr not a terminal, as in a CI log.

Most tests here fail before any Spark session starts (and say so in one line);
the few that run Spark are marked ``spark``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The console script installed next to this interpreter, as a user runs it.
SCRIPT = Path(sys.executable).with_name("aiopurgatory")


def aiopurgatory(
    *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``aiopurgatory ARGS`` (this checkout's code: PYTHONPATH first)."""
    assert SCRIPT.is_file(), f"no console script at {SCRIPT}: install the project (make install)"
    environ = dict(os.environ if env is None else env)
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environ,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def _acks_all_events(path: Path, scenario: str) -> list[dict[str, object]]:
    run = subprocess.run(
        [sys.executable, "-m", "examples.acks_all", "--scenario", scenario, "--events", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.spark
def test_analyze_shows_the_demos_error_answers(tmp_path: Path) -> None:
    """Item 1: the two-down demo's NOT_ENOUGH_REPLICAS answers reach analyze's tables,
    report, plots and summary; a schema-1 log beside it still reads."""
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
    run = aiopurgatory(
        "analyze", str(logs), "--out", str(out), "--master", "local[1]", "--top", "2"
    )
    assert run.returncode == 0, run.stderr[-3000:]

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
        assert f"completed {code}: {count:,} ops" in run.stdout
