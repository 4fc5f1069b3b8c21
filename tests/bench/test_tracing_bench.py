"""python -m aiopurgatory.bench.tracing: a small run measures every variant."""

from __future__ import annotations

import json

import pytest

from aiopurgatory.bench import tracing as bench


def test_a_small_run_reports_the_cpu_of_each_variant(capsys: pytest.CaptureFixture[str]) -> None:
    result = bench.main(["--waits", "200", "--rounds", "1", "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert printed == result
    assert set(result["cpu_per_wait_us"]) == {"off", "trace_waits", "span"}
    assert all(cpu > 0 for cpu in result["cpu_per_wait_us"].values())
    assert set(result["extra_per_wait_us"]) == {"trace_waits", "span"}
    assert result["waits"] == 200


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="variant must be one of"):
        bench.run_round("both", 10)
    with pytest.raises(ValueError, match="waits must be at least 1"):
        bench.run_round("off", 0)
    with pytest.raises(ValueError, match="loop must be asyncio or uvloop"):
        bench.run_round("off", 10, loop="trio")
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "0"])
