"""The ``aiopurgatory`` command's manners (issue 31): ``--version``, help with
every default, a missing extra named, and ``bench`` checking its arguments and
output paths before it runs anything, marking a skipped measurement as skipped,
and ``bench all --quick`` as a smoke run that shows where it is.

Each test runs the installed console script (see ``tests/support/cli.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path

import pytest

import aiopurgatory
from tests.support.cli import aiopurgatory as run
from tests.support.cli import lines


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"aiopurgatory {aiopurgatory.__version__} (")


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    from aiopurgatory.bench.cli import _parser as bench_parser
    from aiopurgatory.pipeline import analyze, replay, trace

    found = [
        ("analyze", analyze._build_parser()),
        ("replay", replay._build_parser()),
        ("gen-trace", trace._build_parser()),
    ]
    bench = bench_parser()
    for action in bench._actions:
        if isinstance(action, argparse._SubParsersAction):
            found += [(f"bench {name}", sub) for name, sub in action.choices.items()]
    return found


def test_every_option_has_a_description_and_shows_its_default() -> None:
    checked = 0
    for command, parser in _parsers():
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            name = action.option_strings[-1]
            assert action.help, f"{command} {name}: no description"
            if action.default in (None, False, [], argparse.SUPPRESS):
                continue
            # The default appears in the option's help text.
            formatter = parser._get_formatter()
            shown = " ".join(formatter._expand_help(action).split())
            if not isinstance(action.default, (list, tuple)):
                assert "default" in shown, f"{command} {name}: default not shown: {shown!r}"
                assert str(action.default) in shown or "default:" not in shown, (command, name)
            # argparse wraps lines (also at hyphens): compare without whitespace.
            assert "".join(shown.split()) in "".join(text.split()), (command, name)
            checked += 1
    assert checked > 40


def test_replay_help_says_the_timeout_default() -> None:
    result = run("replay", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert re.search(r"--timeout TIMEOUT produce timeout\(s\), seconds, .*\(default: 30\)", text)
    assert "--overwrite" in text
    assert "--facts-only" in text


def test_a_missing_extra_is_named_in_one_line(tmp_path: Path) -> None:
    # A module that fails to import as a missing one does, first on the path.
    fake = tmp_path / "site"
    fake.mkdir()
    (fake / "rich.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'rich'\", name='rich')\n"
    )
    bench = run(
        "bench", "timer", "-n", "100", "--repeat", "1", "--loop", "asyncio",
        pythonpath=(str(fake),),
    )  # fmt: skip
    assert bench.returncode == 2
    assert lines(bench.stderr) == [
        "aiopurgatory bench timer: needs rich, which is not installed: "
        "pip install 'aiopurgatory[bench]'"
    ]
    events = tmp_path / "e.jsonl"
    events.write_text("{}\n")
    analyze = run("analyze", str(events), "--out", str(tmp_path / "o"), pythonpath=(str(fake),))
    assert analyze.returncode == 2
    # The library's venvs of the other Pythons have no spark extra (docs/pythons.md):
    # then its other modules are named too.
    missing = [m for m in ("pyspark", "pandas", "pyarrow") if importlib.util.find_spec(m) is None]
    names = ", ".join([*missing, "rich"])
    assert lines(analyze.stderr) == [
        f"aiopurgatory analyze: needs {names}, which {'are' if missing else 'is'} not "
        "installed: pip install 'aiopurgatory[spark]'"
    ]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--plot", "/no/such/dir/x.png"], "--plot /no/such/dir/x.png: the directory /no/such/dir"),
        (["--json", "{tmp}"], "--json {tmp}: is a directory, expected a file"),
        (["--json", "{tmp}/f/x.json"], "the directory {tmp}/f is not a directory"),
        (["--cancel-fraction", "1.5"], "--cancel-fraction: must be a fraction in [0, 1], got 1.5"),
        (["-n", "0"], "argument -n: must be at least 1, got 0"),
    ],
)
def test_bench_refuses_before_running(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "f").write_text("")
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in args]
    result = run("bench", "timer", "-n", "200000", "--repeat", "5", "--loop", "both", *argv)
    assert result.returncode == 2
    (line,) = lines(result.stderr)  # one line, no traceback, no progress: nothing ran
    assert line.startswith("aiopurgatory bench timer: ")
    assert message.replace("{tmp}", str(tmp_path)) in line
    assert result.stdout == ""


def test_bench_purgatory_shows_a_skipped_memory_measurement_as_skipped(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    result = run(
        "bench", "purgatory", "--memory-ops", "0", "--num", "500", "--repeat", "1",
        "--loop", "virtual", "--no-headline", "--no-isolate", "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())["purgatory"]
    assert all(cell["memory_skipped"] for cell in report["cells"])
    assert not [t for t in report["targets"] if "memory" in t["name"]]
    rows = [line for line in result.stdout.splitlines() if "low-timeout │ virtual" in line]
    assert len(rows) == 3  # ap, hand-written, floor
    assert all("skipped" in row for row in rows)
    assert not re.search(r"memory.*\bNO\b", result.stdout)


# A smoke run of the benchmark harness (pure Python, the same on every Python; the
# library it drives is checked on each by the core's tests): once, on 3.11, for CI's time.
@pytest.mark.not_library
def test_bench_all_quick_is_a_smoke_run_that_shows_progress(tmp_path: Path) -> None:
    out = tmp_path / "all.json"
    result = run("bench", "all", "--quick", "--loop", "asyncio", "--json", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["quick"] is True
    # Small workloads of milliseconds, one round: seconds, not minutes.
    assert report["timer"]["params"]["n"] <= 10_000
    assert report["timer"]["params"]["max_delay"] <= 0.05
    assert report["timer"]["repeat"] == 1
    assert report["headline"]["rows"]
    assert all(s["num"] <= 2_000 for s in report["purgatory"]["scenarios"])
    assert max(report["scale"]["pendings"]) <= 10_000
    # Progress on stderr although it is not a terminal: a line per benchmark.
    progress = [line for line in lines(result.stderr) if line.startswith("aiopurgatory bench [")]
    benches = {m.group(1) for line in progress if (m := re.search(r": (\w+) \S+ on ", line))}
    assert {"timer", "realistic", "purgatory", "scale"} <= benches
    assert progress[-1].endswith("runs done")
