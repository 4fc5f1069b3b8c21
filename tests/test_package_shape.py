"""The package's shape: one-way imports among the core modules, no private loop internals."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import aiopurgatory

PACKAGE = Path(aiopurgatory.__file__).parent

# The flow of data: operations -> purgatory -> timer (and its timeout) -> wheel and
# driver (the backend's: asyncio or trio) -> loop. A module may import only modules
# to its right.
CORE_ORDER = [
    "_purgatory",
    "_latency",
    "_operation",
    "_timer",
    "_timeout",
    "_backends",
    "_trio_driver",
    "_asyncio_driver",
    "_wheel",
    "_histogram",
]
SHARED = {"_errors", "_logging"}


def _package_imports(path: Path) -> set[str]:
    """Private top-level modules of the package that ``path`` imports, anywhere in it
    (module level, functions, ``if TYPE_CHECKING``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module is not None:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiopurgatory."):
            found.add(node.module.split(".")[1])  # type: ignore[union-attr]
    return {name for name in found if name.startswith("_")}


@pytest.mark.parametrize("module", CORE_ORDER)
def test_core_modules_import_only_downstream(module: str) -> None:
    imports = _package_imports(PACKAGE / f"{module}.py")
    allowed = set(CORE_ORDER[CORE_ORDER.index(module) + 1 :]) | SHARED
    assert imports <= allowed, f"{module} imports {sorted(imports - allowed)}"


def test_no_import_cycle_among_private_modules() -> None:
    graph = {
        path.stem: _package_imports(path)
        for path in PACKAGE.glob("_*.py")
        if path.stem != "__init__"
    }
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        assert name not in visiting, f"import cycle: {' -> '.join([*visiting, name])}"
        if name in done or name not in graph:
            return
        visiting.append(name)
        for dep in sorted(graph[name]):
            visit(dep)
        visiting.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)
    assert {"_wheel", "_timer", "_operation", "_purgatory"} <= done


PRIVATE_LOOP_ATTRIBUTES = {"_ready", "_scheduled"}


def test_no_private_event_loop_attributes_are_read() -> None:
    # The simulation and the replay use public hooks (select's timeout,
    # VirtualTimeLoop.advance_to, Timer.next_due), not asyncio's internals.
    offenders = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.Attribute) and node.attr in PRIVATE_LOOP_ATTRIBUTES)
        or (isinstance(node, ast.Constant) and node.value in PRIVATE_LOOP_ATTRIBUTES)
    ]
    assert offenders == []
