"""Every module of the package and the examples stays under 700 lines (STYLE.md: one job
per module). A module that grows past it is split into modules of one job each,
as tests/redis/test_layout.py asks of the Redis layer.

Reads the checkout's files only: no import, no extra needed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 700


def _modules() -> list[str]:
    found = [
        path.relative_to(ROOT).as_posix()
        for top in ("aiopurgatory", "examples")
        for path in (ROOT / top).rglob("*.py")
        if "__pycache__" not in path.parts
    ]
    return sorted(found)


MODULES = _modules()


def _lines(name: str) -> int:
    return (ROOT / name).read_text(encoding="utf-8").count("\n")


def test_the_modules_are_found() -> None:
    # Guards the collection: an empty list would test nothing.
    assert "aiopurgatory/_timer.py" in MODULES
    assert "examples/broker/server.py" in MODULES
    assert "aiopurgatory/pipeline/replay_core.py" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_module_stays_under_700_lines(name: str) -> None:
    lines = _lines(name)
    assert lines < LIMIT, f"{name} has {lines} lines: split it into modules of one job each"
