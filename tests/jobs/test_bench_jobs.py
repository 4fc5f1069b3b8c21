"""``aiopurgatory bench jobs``: a small run of both modes answers every wait and says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs.conftest import ROOT

pytestmark = pytest.mark.timeout(180)


def check_a_small_run(system: str, tmp_path: Path) -> None:
    """Both modes of ``system``, 40 waits: all answered, and triggers cost Redis less."""
    out = tmp_path / "jobs.json"
    result = subprocess.run(
        [sys.executable, "-m", "aiopurgatory.cli", "bench", "jobs", "--systems", system,
         "--waits", "40", "--rate", "200", "--count-seconds", "0.5", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    runs = json.loads(out.read_text())
    assert [(run["system"], run["mode"]) for run in runs] == [
        (system, "triggers"),
        (system, "poll"),
    ]
    for run in runs:
        assert run["answered"] == run["waits"] == 40
        assert 0 < run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]
    triggers, poll = runs
    # Parked on triggers, 40 waits add nothing to the worker's own commands;
    # polled, they ask 160 times a second.
    assert (
        triggers["redis_commands_per_s_while_waiting"] < poll["redis_commands_per_s_while_waiting"]
    )
    assert [json.loads(line) for line in result.stdout.splitlines()] == runs


def test_a_small_run_answers_every_wait_in_both_modes(tmp_path: Path) -> None:
    check_a_small_run("rq", tmp_path)


def test_restart_redis_mid_run_reports_every_finished_job_answered(tmp_path: Path) -> None:
    """``--restart-redis --kill-worker``: RQ's worker is killed and Redis restarted at
    once; the worker is started again; every waiter of a job RQ finished gets its
    result, the others time out."""
    out = tmp_path / "restart.json"
    result = subprocess.run(
        [sys.executable, "-m", "aiopurgatory.cli", "bench", "jobs", "--systems", "rq",
         "--modes", "triggers", "--waits", "60", "--rate", "60", "--count-seconds", "0.5",
         "--restart-redis", "1", "--kill-worker", "--timeout", "40", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = json.loads(out.read_text())
    assert run["answered"] == run["waits"] == 60
    # RQ may lose the job its worker ran when it was killed:
    # that job's waiter times out. Every job RQ finished was answered with its result.
    assert run["finished_but_not_answered"] == 0, run
    assert 0 < run["jobs_finished"] == run["answered_with_result"], run
    assert run["errors"] == (
        {} if run["jobs_finished"] == 60 else {"timeout": 60 - run["jobs_finished"]}
    )
    assert run["tracebacks_through_aiopurgatory"] == 0
    assert run["worker_restarts"] >= 1  # killed, and started again
