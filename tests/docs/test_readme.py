"""README.md keeps its word: ``make demo`` installs little, and prints what the excerpt shows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _demo_excerpt() -> list[str]:
    match = re.search(r"make demo` creates.*?```text\n(.*?)^```$", README, re.S | re.M)
    assert match is not None, "README: no demo excerpt"
    return match[1].splitlines()


def test_the_demo_prints_the_readmes_excerpt() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    command = re.search(r"^demo:.*\n\t\$\(PY\) (.*)$", makefile, re.M)
    assert command is not None
    result = subprocess.run(
        [sys.executable, *command[1].split()],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    printed = [line.rstrip() for line in result.stdout.splitlines()]
    for line in _demo_excerpt():
        # The excerpt's notes in parentheses at the end of a line are the README's.
        shown = re.sub(r"\s+\((?:requests by|produce latency)[^)]*\)$", "", line).rstrip()
        if "simulated in" in shown:  # the wall time differs from run to run
            pattern = re.escape(shown).replace(r"0\.89", r"\d+\.\d\d")
            assert any(re.fullmatch(pattern, p) for p in printed), (shown, printed)
        else:
            assert shown in printed, (shown, printed)


def test_make_demo_installs_only_what_the_demo_needs() -> None:
    # `make demo` has its own stamp and the `demo` extra; `make test` (through
    # `install`) still installs every extra.
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    demo = re.search(r"^demo: (.*)$", makefile, re.M)
    assert demo is not None
    assert demo[1].split() == ["$(DEMO_STAMP)"]
    assert "-e '.[demo]'" in makefile
    assert "-e '.[all,dev,docs]'" in makefile
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    extra = re.search(r"^demo = \[(.*)\]$", pyproject, re.M)
    assert extra is not None
    assert "pyspark" not in extra[1]
    assert extra[1] == '"rich>=13"'
