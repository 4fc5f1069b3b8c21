"""``aiopurgatory bench redis-fanout`` at a tiny size: the report's shape and sanity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aiopurgatory.bench import cli, redis_fanout

# A benchmark's plumbing (processes, a real redis-server): once, not per core and Python.
pytestmark = pytest.mark.not_library


def test_a_tiny_run_compares_two_checkouts_and_every_operation_completes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fanout.json"
    here = str(redis_fanout.HERE)
    sizes = ["--processes", "2", "--keys", "60", "--rounds", "2", "--batch", "0", "--idle", "1"]
    status = cli.main(["redis-fanout", *sizes, "--baseline", here, "--json", str(out)])
    assert status == 0
    report = json.loads(out.read_text())
    assert report["command"] == "redis-fanout"
    assert report["params"]["baseline"] == here
    runs = report["runs"]
    assert [(r["topology"], r["side"], r["processes"]) for r in runs] == [
        ("single", "baseline", 2),
        ("single", "library", 2),
    ]
    for run in runs:
        assert "error" not in run, run
        assert run["library"] == here  # the workers imported the named checkout
        assert run["triggers"] == 60 * 2
        assert run["watched"] == 60  # the watchers share the keys, each key once
        assert run["completed"] == 60  # every operation saw its key reach the last round
        # --batch 0: a message per trigger, and (broadcast or not) no watcher
        # receives more messages than were published.
        assert run["messages_published"] == run["triggers"]
        assert 0 < run["received_per_process"] <= run["messages_published"]
        assert 0 < run["applied_per_process"] <= run["triggers"]
        assert run["watcher_cpu_s_per_process"] > 0
        assert run["redis_cpu_s"] > 0
        assert run["redis_out_bytes"] > 0
        assert run["publisher_cpu_us_per_trigger"] > 0
        assert run["publisher_triggers_per_s"] > 0
        assert run["end_to_end_triggers_per_s"] > 0
        # The idle process reports what reached it: everything with a broadcast
        # library, nothing with interest routing; never more than a watcher got.
        (idle_received,) = run["idle_received"]
        assert 0 <= idle_received <= run["received_max"]
    (compared,) = report["comparisons"]
    assert compared["processes"] == 2
    assert all(ratio > 0 for ratio in compared.values() if isinstance(ratio, float))
    printed = capsys.readouterr().out
    assert printed.count("messages/process") == 2 + 1  # a line a run, and the comparison


def test_a_checkout_without_the_library_is_refused_before_any_run(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["redis-fanout", "--baseline", str(tmp_path)])
    assert exit_.value.code == 2
