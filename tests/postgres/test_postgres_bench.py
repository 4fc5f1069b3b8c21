"""The benchmark command runs and reports what docs/postgres.md cites."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.postgres import ROOT

pytestmark = pytest.mark.realtime


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m aiopurgatory.postgres.bench ARGS``, run to its end (2 minutes at most)."""
    return subprocess.run(
        [sys.executable, "-m", "aiopurgatory.postgres.bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_latency_benchmark_measures_postgres_and_redis_in_one_run(tmp_path: Path) -> None:
    output = tmp_path / "latency.json"
    done = bench("--wakes", "30", "--interval", "0.002", "--output", str(output))
    assert done.returncode == 0, done.stderr
    results = json.loads(output.read_text())["results"]
    assert [row["transport"] for row in results] == ["postgres", "redis"]
    for row in results:
        assert row["wakes"] == 30
        assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"] <= row["max_ms"] < 5000
    assert "postgres p50 / redis p50" in done.stdout


def test_the_writers_benchmark_compares_commits_with_and_without_notify(tmp_path: Path) -> None:
    output = tmp_path / "writers.json"
    done = bench("--writers", "1,2", "--seconds", "0.3", "--output", str(output))
    assert done.returncode == 0, done.stderr
    rows = json.loads(output.read_text())["writers"]
    assert [row["writers"] for row in rows] == [1, 2]
    assert all(row["plain"] > 0 and row["notify"] > 0 for row in rows)


def test_the_throughput_benchmark_alternates_rounds_and_reports_cpu_per_trigger(
    tmp_path: Path,
) -> None:
    output = tmp_path / "throughput.json"
    done = bench("--throughput", "--triggers", "300", "--rounds", "2", "--output", str(output))
    assert done.returncode == 0, done.stderr
    report = json.loads(output.read_text())
    assert len(report["rounds"]) == len(report["ratios"]) == 2
    for pg, redis in report["rounds"]:
        assert (pg["transport"], redis["transport"]) == ("postgres", "redis")
        for row in (pg, redis):
            assert row["triggers"] == 300
            assert row["triggers_per_s"] > 0
            assert row["seconds"] > 0
            assert row["publisher_us"] > 0
            assert row["sink_us"] > 0
            assert row["server_us"] >= 0  # clock ticks of 10 ms: 0 on a short run
            assert 0 < row["messages"] <= 300
    assert "round 2 postgres / redis: throughput" in done.stdout


def test_the_job_trigger_benchmark_times_finish_job_with_and_without_the_trigger(
    tmp_path: Path,
) -> None:
    output = tmp_path / "trigger.json"
    done = bench("--job-trigger", "--jobs", "100", "--rounds", "2", "--output", str(output))
    assert done.returncode == 0, done.stderr
    report = json.loads(output.read_text())
    assert report["jobs"] == 100
    assert report["crc32_us"] > 0
    assert len(report["rounds"]) == 2
    for row in report["rounds"]:
        assert row["with_us"] > 0
        assert row["without_us"] > 0
    assert "round 2: procrastinate_finish_job" in done.stdout
