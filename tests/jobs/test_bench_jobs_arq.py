"""``aiopurgatory bench jobs --systems arq``: a small run of both modes answers every wait.

arq pins redis-py below 6: this runs in ``make test-arq``'s ``.venv-arq`` and is
skipped, saying so, where arq is not importable (as tests/jobs/test_arq.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "arq",
    reason="arq is not installed (it pins redis<6): its tests run in `make test-arq`'s .venv-arq",
)

from tests.jobs.conftest import ROOT

pytestmark = pytest.mark.timeout(180)


def test_a_small_arq_run_answers_every_wait_in_both_modes(tmp_path: Path) -> None:
    out = tmp_path / "jobs.json"
    result = subprocess.run(
        [sys.executable, "-m", "aiopurgatory.cli", "bench", "jobs", "--systems", "arq",
         "--waits", "40", "--rate", "200", "--count-seconds", "0.5", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    runs = json.loads(out.read_text())
    assert [(run["system"], run["mode"]) for run in runs] == [("arq", "triggers"), ("arq", "poll")]
    for run in runs:
        assert run["answered"] == run["waits"] == 40
        assert 0 < run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]
    triggers, poll = runs
    # Parked on triggers, the waits add nothing to the arq worker's own queue
    # polling (~20 commands/s); polled, 40 waits make 160 transactions a second.
    assert (
        triggers["redis_commands_per_s_while_waiting"] < poll["redis_commands_per_s_while_waiting"]
    )
    assert [json.loads(line) for line in result.stdout.splitlines()] == runs
