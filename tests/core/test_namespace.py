"""Public modules show their public API only, and public errors name their public module."""

from __future__ import annotations

import importlib
import pickle
import traceback
import types

import pytest

import aiopurgatory as ap

# Every public module but aiopurgatory.pytest_plugin, whose dir() pytest's
# plugin manager reads to find its hooks.
PUBLIC_MODULES = [
    "aiopurgatory",
    "aiopurgatory.simulation",
    "aiopurgatory.events",
    "aiopurgatory.metrics",
    "aiopurgatory.metrics.prometheus",
    "aiopurgatory.metrics.otel",
    "aiopurgatory.redis",
    "aiopurgatory.redis.testing",
    "aiopurgatory.asgi",
]
# Submodules listed beside __all__ (reachable as attributes, not star-exported).
SUBMODULES = {
    "aiopurgatory.metrics": {"otel", "prometheus"},
    "aiopurgatory.redis": {"testing"},
}
# The packages that only re-export: their namespace itself holds nothing else.
REEXPORTING = ["aiopurgatory", "aiopurgatory.metrics", "aiopurgatory.redis"]

HELPERS = {"Any", "TYPE_CHECKING", "annotations", "TypeVar", "Callable", "redis"}


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_dir_lists_the_public_api_only(module_name: str) -> None:
    module = importlib.import_module(module_name)
    listed = dir(module)
    assert listed == sorted(listed)
    public = set(module.__all__) | SUBMODULES.get(module_name, set())
    assert {name for name in listed if not _dunder(name)} == {
        name for name in public if not _dunder(name)
    }
    assert not HELPERS & set(listed)
    for name in listed:  # what dir() lists is there (a submodule loads on access)
        assert hasattr(module, name), name
    # Hidden from dir() is not gone: what the module uses stays reachable.
    for name in vars(module):
        assert hasattr(module, name)


@pytest.mark.parametrize("module_name", REEXPORTING)
def test_the_reexporting_packages_namespaces_hold_the_public_api_only(module_name: str) -> None:
    module = importlib.import_module(module_name)
    public = set(module.__all__) | SUBMODULES.get(module_name, set())
    extra = [
        name
        for name, value in vars(module).items()
        # Not: private names; what pytest's assertion rewriting adds to the
        # package of a plugin ("@py_builtins", not an identifier); submodules,
        # which the import system binds in their package once imported.
        if name.isidentifier()
        and not name.startswith("_")
        and name not in public
        and not (isinstance(value, types.ModuleType) and value.__name__.startswith(module_name))
    ]
    assert extra == []


def _public_exceptions() -> list[tuple[str, str]]:
    found = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                found.append((module_name, name))
    return found


PUBLIC_EXCEPTIONS = _public_exceptions()


def test_the_public_exceptions_are_found() -> None:
    # Guards the collection above: an empty list would test nothing.
    names = {name for _, name in PUBLIC_EXCEPTIONS}
    assert {"PurgatoryError", "TimerClosedError", "RedisTriggersError"} <= names
    assert "RedisServerMissing" in names


@pytest.mark.parametrize(("module_name", "name"), PUBLIC_EXCEPTIONS)
def test_public_exceptions_carry_their_public_module(module_name: str, name: str) -> None:
    cls = getattr(importlib.import_module(module_name), name)
    assert cls.__module__ == module_name
    assert cls.__qualname__ == name
    error = cls("a message")
    # A traceback names the public path, and pickle finds the class there.
    assert traceback.format_exception_only(error) == [f"{module_name}.{name}: a message\n"]
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert copy.args == ("a message",)


def test_a_raised_core_error_names_its_public_module() -> None:
    purgatory: ap.Purgatory = ap.Purgatory("closed")
    purgatory.close()
    with pytest.raises(ap.PurgatoryClosedError) as caught:
        purgatory.try_complete_else_watch(ap.DelayedOperation(1.0), ["k"])
    text = "".join(traceback.format_exception(caught.value))
    assert "aiopurgatory.PurgatoryClosedError: " in text
    assert "_errors" not in text.splitlines()[-1]


def test_a_raised_redis_error_names_its_public_module() -> None:
    from aiopurgatory.redis import RedisTriggersClosedError, SyncPublisher

    publisher = SyncPublisher("redis://127.0.0.1:1/0")
    publisher.close()
    with pytest.raises(RedisTriggersClosedError) as caught:
        publisher.advance("k", 1)
    last = traceback.format_exception(caught.value)[-1]
    assert last == "aiopurgatory.redis.RedisTriggersClosedError: SyncPublisher is closed\n"


def test_purgatorys_type_parameter_defaults_to_delayed_operation() -> None:
    # PEP 696, on both cores: `ap.Purgatory("fetch")` is a Purgatory[DelayedOperation]
    # (mypy --strict on the docs' snippets checks the static side, test_docs_typing).
    (parameter,) = ap.Purgatory.__parameters__  # type: ignore[attr-defined]
    assert parameter.__default__ is ap.DelayedOperation
    assert parameter.__bound__ is ap.DelayedOperation
    alias: object = ap.Purgatory[ap.WatermarkOperation]
    assert getattr(alias, "__args__", None) == (ap.WatermarkOperation,)
