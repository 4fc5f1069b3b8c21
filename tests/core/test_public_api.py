"""The public surface: the names of SPEC.md, ``__all__`` everywhere, and a light import."""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import subprocess
import sys
import types

import pytest

import aiopurgatory as ap

# Everything SPEC.md names at the top level (the contract: never renamed or dropped).
SPEC_NAMES = {
    "PurgatoryError",
    "PurgatoryClosedError",
    "TimerClosedError",
    "PurgatoryFullError",
    "OperationStateError",
    "Outcome",
    "DelayedOperation",
    "Purgatory",
    "PurgatoryStatistics",
    "Timer",
    "TimerHandle",
    "timeout",
    "simulation",
}

PUBLIC_MODULES = [
    "aiopurgatory",
    "aiopurgatory.simulation",
    "aiopurgatory.events",
    "aiopurgatory.asgi",
    "aiopurgatory.jobs",
]

# Never imported by ``import aiopurgatory`` (STYLE.md: heavy imports only lazily).
HEAVY = ["pyspark", "pandas", "matplotlib", "rich", "uvloop"]


def test_every_spec_name_is_exported() -> None:
    missing = SPEC_NAMES - set(ap.__all__)
    assert not missing
    for name in SPEC_NAMES:
        assert getattr(ap, name) is not None


def test_spec_names_have_the_spec_kinds() -> None:
    for name in ("PurgatoryClosedError", "PurgatoryFullError", "OperationStateError"):
        assert issubclass(getattr(ap, name), ap.PurgatoryError)
    assert issubclass(ap.PurgatoryError, Exception)
    assert issubclass(ap.TimerClosedError, ap.PurgatoryError)
    assert issubclass(ap.TimerClosedError, RuntimeError)
    assert issubclass(ap.Outcome, enum.Enum)
    assert {m.name for m in ap.Outcome} >= {"COMPLETED", "EXPIRED", "CANCELLED", "FAILED"}
    for name in ("DelayedOperation", "Purgatory", "PurgatoryStatistics", "Timer", "TimerHandle"):
        assert inspect.isclass(getattr(ap, name))
    assert callable(ap.timeout)
    assert isinstance(ap.simulation, types.ModuleType)
    assert callable(ap.simulation.run)
    assert ap.simulation is importlib.import_module("aiopurgatory.simulation")


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_public_modules_have_a_resolvable_sorted_unique_all(module_name: str) -> None:
    module = importlib.import_module(module_name)
    names = module.__all__
    assert isinstance(names, list)
    assert len(names) == len(set(names)), "duplicates in __all__"
    for name in names:
        assert isinstance(name, str)
        assert hasattr(module, name), f"{module_name}.__all__ lists {name!r}, which is missing"
    star: dict[str, object] = {}
    exec(f"from {module_name} import *", star)
    assert set(star) - {"__builtins__"} == set(names)


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_all_lists_every_public_object_defined_in_the_package(module_name: str) -> None:
    # Every public (non-underscore) class or function that is the module's own must
    # be in __all__: for the package, whatever it re-exports from its private
    # modules; for a submodule, what it defines. Names imported only for use (other
    # modules' classes, typing, stdlib) and submodules are not its API.
    module = importlib.import_module(module_name)

    def own(value: object) -> bool:
        home = str(getattr(value, "__module__", ""))
        if module_name == "aiopurgatory":
            return home.startswith("aiopurgatory._")
        return home == module_name

    unlisted = [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and own(value)
        and name not in module.__all__
    ]
    assert unlisted == []


def test_top_level_all_resolves_to_the_same_objects_as_their_modules() -> None:
    for name in ap.__all__:
        value = getattr(ap, name)
        home = getattr(value, "__module__", None)
        if home and home.startswith("aiopurgatory.") and not isinstance(value, types.ModuleType):
            assert getattr(importlib.import_module(home), name) is value


def test_public_names_have_docstrings() -> None:
    for name in ap.__all__:
        value = getattr(ap, name)
        if inspect.isclass(value) or inspect.isfunction(value) or inspect.ismodule(value):
            assert inspect.getdoc(value), f"ap.{name} has no docstring"


def test_unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = ap.no_such_name


def test_version_is_a_string() -> None:
    assert isinstance(ap.__version__, str)
    assert ap.__version__


PROBE = """
import json, sys
import {modules}
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & {heavy!r})))
"""


def probe(modules: str) -> list[str]:
    """The heavy top-level packages loaded by importing ``modules`` in a fresh interpreter."""
    code = PROBE.format(modules=modules, heavy=set(HEAVY))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    result: list[str] = json.loads(out.stdout)
    return result


@pytest.fixture(scope="module")
def loaded_by_import() -> list[str]:
    # A fresh interpreter: this test process has long since imported uvloop etc.
    return probe("aiopurgatory, aiopurgatory.simulation, aiopurgatory.events, aiopurgatory.asgi")


def test_import_does_not_pull_heavy_dependencies(loaded_by_import: list[str]) -> None:
    # rich has its own test below (structlog would pull it in if imported eagerly).
    assert [m for m in loaded_by_import if m != "rich"] == []


def test_import_does_not_pull_rich(loaded_by_import: list[str]) -> None:
    assert "rich" not in loaded_by_import


def test_probe_detects_a_heavy_import() -> None:
    # The probe can fail: importing one of the heavy packages shows up in it.
    assert "uvloop" in probe("aiopurgatory, uvloop")
