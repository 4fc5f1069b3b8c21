"""The Redis layer's layout: one job per module, as docs/architecture.md describes it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "aiopurgatory" / "redis"
MODULES = sorted(path.name for path in PACKAGE.glob("*.py") if path.name != "__init__.py")
# The public class and its lifecycle sit on top: no part reaches up to them
# (bench.py, a benchmark of the public class, is no part).
TOP = {"_triggers", "_lifecycle"}
PARTS = [m for m in MODULES if m.removesuffix(".py") not in TOP and m != "bench.py"]


def _redis_section() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    start = text.index("## The Redis layer")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _imported(path: Path) -> set[str]:
    """The modules of aiopurgatory.redis that ``path`` imports (relative imports)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_architecture_page_names_every_redis_module_and_no_other() -> None:
    table = [line for line in _redis_section().splitlines() if line.startswith("| `")]
    named = {name for row in table for name in re.findall(r"`(\w+\.py)`", row.split("|")[1])}
    assert named == set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_each_redis_module_says_its_job_and_stays_under_700_lines(name: str) -> None:
    source = (PACKAGE / name).read_text(encoding="utf-8")
    assert ast.get_docstring(ast.parse(source)), f"{name} has no module docstring"
    lines = source.count("\n")
    assert lines < 700, f"{name} has {lines} lines"


@pytest.mark.parametrize("name", PARTS)
def test_no_part_of_the_redis_layer_imports_the_public_class_or_its_lifecycle(name: str) -> None:
    assert not _imported(PACKAGE / name) & TOP
