"""The package's shape: one-way imports among the core modules, backend code only in the
drivers, public names between modules, no private loop internals."""

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
    "_watch",
    "_purgatory_core",
    "_thresholds",
    "_histograms",
    "_operation",
    "_shared_timer",
    "_timer",
    "_timer_handle",
    "_timer_entry",
    "_timeout",
    "_backends",
    "_trio_driver",
    "_asyncio_driver",
    "_detect",
    "_ticks",
    "_timer_states",
    "_wheel",
    "_duration_counts",
]
SHARED = {"_errors", "_logging", "_validation"}


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


def _imported_modules(path: Path) -> set[str]:
    """Top-level names of the absolute imports of ``path``, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


# Backend code lives in the drivers. trio is imported only by its driver, by virtual
# time (simulation.run_trio) and by the pytest plugin (its trio-virtual runner):
# nothing else of the library names trio, in any subpackage. The benchmarks' trio
# baselines (trio's own deadlines and tasks, in plain trio) live outside the
# package, in aiopurgatory_trio_bench; bench starts a trio run with anyio.run.
TRIO_MAY_BE_IMPORTED_BY = {"_trio_driver.py", "simulation.py", "pytest_plugin.py"}


def test_trio_is_imported_only_by_its_driver_virtual_time_and_the_plugin() -> None:
    importers = {
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if "trio" in _imported_modules(path)
    }
    assert importers <= TRIO_MAY_BE_IMPORTED_BY, sorted(importers - TRIO_MAY_BE_IMPORTED_BY)
    assert "_trio_driver.py" in importers


def test_the_distribution_imports_trio_only_there_and_in_the_trio_baselines() -> None:
    # Every package the distribution ships (pyproject's packages.find, as a wheel
    # build finds them): outside the library's three modules, only the trio
    # baselines of the benchmarks import trio, and they are shipped.
    import tomllib

    from setuptools import find_namespace_packages

    root = PACKAGE.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_namespace_packages(str(root), include=include)
    assert "aiopurgatory_trio_bench" in packages
    assert not any(name.split(".")[0] in {"tests", "examples"} for name in packages)
    importers = {
        str(path.relative_to(root))
        for name in packages
        for path in sorted((root / name.replace(".", "/")).glob("*.py"))
        if "trio" in _imported_modules(path)
    }
    library = {f"aiopurgatory/{name}" for name in TRIO_MAY_BE_IMPORTED_BY}
    outside = importers - library
    assert outside == {
        "aiopurgatory_trio_bench/purgatory.py",
        "aiopurgatory_trio_bench/timer.py",
    }, sorted(outside)


def _trio_lookups(path: Path) -> list[int]:
    """Lines of ``path`` that reach trio without importing it: ``sys.modules["trio"]``,
    ``sys.modules.get("trio")``, ``importlib.import_module("trio")``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules":
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and node.args
            and ast.unparse(node.func)
            in {
                "sys.modules.get",
                "importlib.import_module",
            }
        ):
            key = node.args[0]
        else:
            continue
        if isinstance(key, ast.Constant) and str(key.value).split(".")[0] == "trio":
            lines.append(node.lineno)
    return lines


def test_no_other_module_reaches_trio_through_sys_modules() -> None:
    allowed = TRIO_MAY_BE_IMPORTED_BY | {"_detect.py"}  # detection asks sys.modules
    offenders = [
        f"{path.relative_to(PACKAGE)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if str(path.relative_to(PACKAGE)) not in allowed
        for line in _trio_lookups(path)
    ]
    assert offenders == []


@pytest.mark.parametrize("module", ["_timeout", "_timer", "_purgatory", "_watch", "_backends"])
def test_core_modules_import_no_backend(module: str) -> None:
    # The deadline of a Timeout, the timer's clock and wake-ups and the purgatory's
    # waiters all go through the driver: these modules import neither library
    # (typing-only imports under TYPE_CHECKING aside).
    path = PACKAGE / f"{module}.py"
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    runtime = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import) and id(node) not in typing_only
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.level == 0
        and node.module
        and id(node) not in typing_only
    }
    assert not runtime & {"asyncio", "trio", "anyio", "sniffio"}, sorted(runtime)


def test_the_backend_is_detected_in_one_leaf_module() -> None:
    # in_trio_task / in_trio_run / _get_running_loop: the questions that tell the
    # backends apart are asked in _detect alone, and _detect imports nothing of ours.
    probes = {"in_trio_task", "in_trio_run", "_get_running_loop"}
    askers = {
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in probes
    }
    # The asyncio driver's probe of its own loop (one C call on the hot path) is
    # not detection: it asks "is this my loop?", never "which library?".
    assert askers <= {"_detect.py", "_asyncio_driver.py"}, sorted(askers)
    assert _package_imports(PACKAGE / "_detect.py") == set()
    driver = (PACKAGE / "_asyncio_driver.py").read_text()
    assert "in_trio" not in driver


# Modules built on the core that must use only its public names.
PUBLIC_CLIENTS = [
    "events.py",
    "asgi.py",
    "cli.py",
    *(str(path.relative_to(PACKAGE)) for path in sorted((PACKAGE / "metrics").glob("*.py"))),
]


@pytest.mark.parametrize("module", PUBLIC_CLIENTS)
def test_clients_of_the_core_use_only_public_names(module: str) -> None:
    # No attribute with a leading underscore on anything but self/cls, and no
    # import from the core's private modules: what events.py, cli.py and metrics/
    # need is public (Purgatory.recorder, Timer.time(), statistics()).
    tree = ast.parse((PACKAGE / module).read_text())
    private_reads = [
        f"{module}:{node.lineno} {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"})
    ]
    assert private_reads == []
    core = {"_purgatory", "_operation", "_timer", "_timeout", "_wheel", "_backends"}
    private_imports = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module is not None
        and node.module.lstrip(".").split(".")[-1] in core
    }
    assert private_imports == set()


def test_watch_returns_one_small_object_on_both_cores() -> None:
    # issue 54: what watch() returns is one small object that is the coroutine
    # and parks its task on the exact asyncio future the core made (no coroutine
    # frame, no keys list, no future iterator per parked request), compiled with
    # the core; Purgatory.watch still reads as a coroutine function.
    import inspect

    from aiopurgatory._compiled import COMPILED, CORE_MODULES
    from aiopurgatory._watch import _Watch

    assert "_watch" in CORE_MODULES
    assert (PACKAGE / "_watch.pxd").exists()
    watch = aiopurgatory.Purgatory.watch
    assert inspect.iscoroutinefunction(watch)
    assert watch.__module__ == "aiopurgatory._watch"
    assert watch.__qualname__ == "Purgatory.watch"
    assert _Watch.__slots__ == ("_op", "_state")
    # Compiled, a C type (and its am_send and tp_iternext C functions: _watch.pxd).
    assert (type(_Watch.send).__name__ == "cython_function_or_method") is COMPILED
