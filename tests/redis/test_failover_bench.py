"""``aiopurgatory bench redis-fanout --failover``, tiny: one failover on real Sentinel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aiopurgatory.bench import redis_fanout

pytestmark = [pytest.mark.realtime, pytest.mark.not_library]


def test_one_failover_is_timed_from_the_kill_to_delivery_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "failover.json"
    status = redis_fanout.main(["--failover", "1", "--topology", "sentinel", "--json", str(out)])
    assert status == 0
    (row,) = json.loads(out.read_text())["runs"]
    assert row["topology"] == "sentinel"
    assert row["repetitions"] == 1
    (seconds,) = row["seconds"]
    # The sentinels need down-after-milliseconds (1 s) before they act: delivery
    # cannot resume sooner; the run fails on its own past 60 s.
    assert 1.0 < seconds < 60
    assert row["median_s"] == row["max_s"] == seconds
    assert "sentinel failover to delivery resumed: median" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--failover", "1", "--topology", "single"],
        ["--failover", "-1"],
        ["--topology", "sentinel"],
    ],
)
def test_a_failover_run_needs_a_topology_that_can_fail_over(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert redis_fanout.main(argv) != 0
    assert "--failover" in capsys.readouterr().err
