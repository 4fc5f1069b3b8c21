"""``aiopurgatory bench parked`` with tiny sizes: structure and counts, never timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aiopurgatory.bench import cli as bench_cli
from aiopurgatory.bench.parked import IMPLS, run_parked

# The parked-waits benchmark's runs (pure Python harness, the same on every Python; the
# library it drives is checked on each by the core's tests): once, on 3.11, for CI's time.
pytestmark = pytest.mark.not_library


@pytest.mark.parametrize("impl", list(IMPLS))
def test_every_way_parks_every_wait_and_reports_its_cost(impl: str) -> None:
    r = run_parked(impl, "asyncio", waits=3000, keys=10)
    assert (r["waits"], r["keys"], r["impl"], r["loop"]) == (3000, 10, IMPLS[impl], "asyncio")
    # Every way keeps at least one GC-tracked object per parked wait (a future or
    # an op); a task per wait keeps more (the task and its coroutine at least).
    assert r["gc_objects_per_wait"] >= (3 if "awaited" in impl else 1)
    assert r["gc_objects"] == pytest.approx(r["gc_objects_per_wait"] * 3000)
    assert r["cpu_us_per_wait"] > 0
    assert r["collect_ms"] > 0
    assert r["collect_frozen_ms"] >= 0
    assert r["peak_rss_mib"] > 0


def test_run_parked_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="impl must be one of"):
        run_parked("nope")
    with pytest.raises(ValueError, match="waits must be at least 1"):
        run_parked("awaited", waits=0)
    with pytest.raises(ValueError, match="keys must be at least 1"):
        run_parked("awaited", keys=0)
    with pytest.raises(ValueError, match="timeout must be above 60 s"):
        run_parked("awaited", timeout=1.0)


def test_cli_runs_side_by_side_and_reports_ratios(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "parked.json"
    status = bench_cli.main(
        [
            *("parked", "--sizes", "500,1000", "--keys", "7", "--loop", "asyncio"),
            *("--repeat", "1", "--no-progress", "--json", str(out)),
        ]
    )
    assert status == 0
    p = json.loads(out.read_text())["parked"]
    assert p["sizes"] == [500, 1000]
    assert {(c["impl"], c["waits"]) for c in p["cells"]} == {
        (name, size) for name in IMPLS.values() for size in (500, 1000)
    }
    assert all(run["isolated"] for run in p["runs"])  # a fresh process per run
    assert {(r["pair"], r["waits"]) for r in p["ratios"]} == {
        (pair, size)
        for pair in ("callback / hand-callback", "awaited / hand-awaited")
        for size in (500, 1000)
    }
    assert all(r["memory"] > 0 and r["gc_objects"] > 0 for r in p["ratios"])
    printed = capsys.readouterr().out
    assert "bench parked" in printed
    assert "library / hand-written" in printed


def test_cli_runs_the_implementations_asked_for(tmp_path: Path) -> None:
    # One side of a pair alone: its cells, no ratios.
    out = tmp_path / "parked.json"
    status = bench_cli.main(
        [
            *("parked", "--sizes", "200", "--impls", "awaited", "--loop", "asyncio"),
            *("--repeat", "1", "--no-isolate", "--no-progress", "--quiet", "--json", str(out)),
        ]
    )
    assert status == 0
    p = json.loads(out.read_text())["parked"]
    assert [c["impl"] for c in p["cells"]] == [IMPLS["awaited"]]
    assert p["ratios"] == []


@pytest.mark.parametrize(
    "args",
    [
        ["--sizes", "0"],
        ["--sizes", "10,-1"],
        ["--sizes", "ten"],
        ["--impls", "awaited,nope"],
        ["--impls", ""],
        ["--keys", "0"],
        ["--loop", "trio"],
    ],
)
def test_cli_rejects_bad_arguments(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_cli.main(["parked", "--no-progress", *args])
    assert exc.value.code == 2
    assert "parked" in capsys.readouterr().err
