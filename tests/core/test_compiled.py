"""The compiled core and the pure-Python core: which one runs, and that users see no difference.

``make test`` runs the library's tests on each Python twice: once on the compiled
core and once with ``AIOPURGATORY_NO_EXTENSIONS=1`` (``AIOPURGATORY_EXPECT`` tells
these tests which one that run must be on). The packaging test, in the compiled
pass of each Python, builds an sdist and a wheel with ``python -m build`` and
installs them into fresh virtual environments of that Python.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.machinery
import os
import pickle
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile
from pathlib import Path
from unittest import mock

import pytest

import aiopurgatory as ap
from aiopurgatory import (
    _compiled,
    _duration_counts,
    _operation,
    _purgatory,
    _purgatory_core,
    _thresholds,
    _ticks,
    _timer,
    _timer_entry,
    _timer_handle,
    _validation,
    _watch,
    _wheel,
    simulation,
)
from tests.support.dist import checkout_dist, venv_with

ROOT = Path(__file__).resolve().parents[2]
TRIO_BENCH_FILES = ("__init__.py", "timer.py", "purgatory.py", "py.typed")
CORE = (
    _validation,
    _ticks,
    _wheel,
    _timer_entry,
    _timer_handle,
    _timer,
    _operation,
    _thresholds,
    _purgatory_core,
    _watch,
    _purgatory,
    _duration_counts,
)


def _is_extension(module: object) -> bool:
    path = str(module.__file__)  # type: ignore[attr-defined]
    return path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def test_the_expected_implementation_is_active() -> None:
    expected = os.environ.get("AIOPURGATORY_EXPECT")
    assert [_is_extension(module) for module in CORE] == [ap.COMPILED] * len(CORE)
    if expected is not None:  # set by `make test` for each of its two runs
        assert expected in ("compiled", "python")
        assert ap.COMPILED is (expected == "compiled")
    assert set(_compiled.CORE_MODULES) == {module.__name__.rpartition(".")[2] for module in CORE}
    # setup.py compiles the modules that have a .pxd file: the same set.
    pxds = {path.stem for path in (ROOT / "aiopurgatory").glob("_*.pxd")}
    assert pxds == set(_compiled.CORE_MODULES)


def _python(code: str, **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "AIOPURGATORY_NO_EXTENSIONS"}
    environment.update(env)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=True,
    )
    return result.stdout.strip()


def test_aiopurgatory_no_extensions_forces_pure_python() -> None:
    code = """
        import aiopurgatory as ap
        from aiopurgatory import _timer
        print(ap.COMPILED, _timer.__file__.endswith(".py"))
    """
    assert _python(code, AIOPURGATORY_NO_EXTENSIONS="1") == "False True"
    installed = _compiled._extensions_installed()
    assert _python(code) == f"{installed} {not installed}"
    assert _python(code, AIOPURGATORY_NO_EXTENSIONS="0") == f"{installed} {not installed}"


# -- users' subclasses behave the same on both ----------------------------------------


class Slotted(ap.DelayedOperation):
    __slots__ = ("events", "ready")

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.ready = False
        self.events: list[str] = []

    def try_complete(self) -> bool:
        return self.ready and self.force_complete()

    def on_complete(self) -> None:
        self.events.append("complete")

    def on_expiration(self) -> None:
        self.events.append("expired")


class WithDict(Slotted):
    # No __slots__: instances get a __dict__ (and take arbitrary attributes).
    pass


@pytest.mark.parametrize("cls", [Slotted, WithDict])
def test_user_subclasses_complete_and_expire(cls: type[Slotted]) -> None:
    async def main() -> list[object]:
        purgatory: ap.Purgatory[Slotted] = ap.Purgatory("subclasses")
        fast, slow = cls(1.0), cls(2.0)
        if cls is WithDict:
            fast.note = "free attribute"  # type: ignore[attr-defined]
        else:
            with pytest.raises(AttributeError):
                fast.note = "no such slot"  # type: ignore[attr-defined]
        assert not purgatory.try_complete_else_watch(fast, ["k"])
        assert not purgatory.try_complete_else_watch(slow, ["k"])
        fast.ready = True
        assert purgatory.check_and_complete("k") == 1
        outcome = await slow
        return [
            fast.outcome,
            fast.events,
            outcome,
            slow.events,
            asyncio.get_running_loop().time(),
            purgatory.statistics().completed,
            purgatory.statistics().expired,
            purgatory.watched,
        ]

    assert simulation.run(main()) == [
        ap.Outcome.COMPLETED,
        ["complete"],
        ap.Outcome.EXPIRED,
        ["complete", "expired"],
        2.0,
        1,
        1,
        0,
    ]


def test_a_subclass_can_override_the_provided_methods_too() -> None:
    calls: list[str] = []

    class Audited(ap.DelayedOperation):
        def force_complete(self) -> bool:
            calls.append("force_complete")
            return super().force_complete()

        def cancel(self) -> bool:
            calls.append("cancel")
            return super().cancel()

    async def main() -> None:
        purgatory: ap.Purgatory[Audited] = ap.Purgatory()
        first, second = Audited(1.0), Audited(1.0)
        purgatory.try_complete_else_watch(first, ["k"])
        purgatory.try_complete_else_watch(second, ["k"])
        assert first.force_complete()
        assert purgatory.cancel_for_key("k") == [second]

    simulation.run(main())
    assert calls == ["force_complete", "cancel"]


def test_an_overridden_force_complete_completes_ops_that_return_true() -> None:
    # try_complete() returning True without finishing the op: the purgatory
    # completes it through force_complete(), the subclass's own if it has one
    # (the compiled core calls the provided one directly only when it is not
    # overridden), on a watch's first check and on a trigger.
    calls: list[str] = []

    class SaysTrue(ap.DelayedOperation):
        ready = False

        def try_complete(self) -> bool:
            return self.ready

    class Audited(SaysTrue):
        def force_complete(self) -> bool:
            calls.append("force_complete")
            return super().force_complete()

    async def main() -> list[ap.Outcome | None]:
        purgatory: ap.Purgatory[SaysTrue] = ap.Purgatory()
        at_once = Audited(1.0)
        at_once.ready = True
        assert purgatory.try_complete_else_watch(at_once, ["k"])
        plain, audited, reached = SaysTrue(1.0), Audited(1.0), Audited(1.0)
        purgatory.try_complete_else_watch(plain, ["k"])
        purgatory.try_complete_else_watch(audited, ["k"])
        purgatory.try_complete_else_watch(reached, {"k": 5})
        for op in (plain, audited, reached):
            op.ready = True
        assert purgatory.check_and_complete("k") == 3
        return [op.outcome for op in (at_once, plain, audited, reached)]

    assert simulation.run(main()) == [ap.Outcome.COMPLETED] * 4
    assert calls == ["force_complete"] * 3


def test_a_force_complete_patched_on_one_operation_completes_it_on_triggers() -> None:
    # An operation whose class has a __dict__ can carry an override of its own
    # (mock.patch.object(op, ...)): triggers call it too, not only its first check.
    class Open(ap.DelayedOperation):  # no __slots__: instances have a __dict__
        ready = False

        def try_complete(self) -> bool:
            return self.ready

    async def main() -> list[int]:
        purgatory: ap.Purgatory[Open] = ap.Purgatory()
        plain, threshold = Open(1.0), Open(1.0)
        purgatory.try_complete_else_watch(plain, ["k"])
        purgatory.try_complete_else_watch(threshold, {"k": 5})
        with (
            mock.patch.object(plain, "force_complete", wraps=plain.force_complete) as a,
            mock.patch.object(threshold, "force_complete", wraps=threshold.force_complete) as b,
        ):
            plain.ready = threshold.ready = True
            assert purgatory.advance("k", 10) == 2
        assert plain.outcome is threshold.outcome is ap.Outcome.COMPLETED
        return [a.call_count, b.call_count]

    assert simulation.run(main()) == [1, 1]


def test_core_classes_are_the_same_kind_of_object_for_users() -> None:
    op = ap.DelayedOperation(1.0)
    assert isinstance(op, ap.DelayedOperation)
    assert ap.DelayedOperation.__module__ == "aiopurgatory._operation"
    with pytest.raises(TypeError, match="created by Timer"):
        ap.TimerHandle()
    assert issubclass(ap.Purgatory, _purgatory_core._PurgatoryCore)
    assert ap.Purgatory[Slotted] is not None  # still generic


# -- packaging: a wheel with the extensions, an sdist that installs without a compiler --


@pytest.mark.packaging
@pytest.mark.timeout(900)  # minutes on a loaded 2-core machine: builds, venvs, installs
@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("AIOPURGATORY_NO_EXTENSIONS", "") not in ("", "0"),
    reason="packaging is checked once per Python, in the compiled run",
)
def test_wheel_is_compiled_and_sdist_installs_without_a_compiler(tmp_path: Path) -> None:
    # `make test` builds them once per Python with this very command, takes the
    # wheel's compiled modules for the checkout's tests (no second compilation of
    # the core) and says where (AIOPURGATORY_TEST_DIST); alone, the test builds.
    dist = checkout_dist(tmp_path / "dist")
    (sdist,) = dist.glob("aiopurgatory-*.tar.gz")
    (wheel,) = dist.glob("aiopurgatory-*.whl")
    # A platform wheel for this Python, holding every compiled module built for it.
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert f"-{tag}-{tag}-" in wheel.name, wheel.name
    # Both ship the trio baselines of `aiopurgatory bench`, a package of their own.
    trio_bench = {f"aiopurgatory_trio_bench/{name}" for name in TRIO_BENCH_FILES}
    with zipfile.ZipFile(wheel) as zf:
        assert trio_bench <= set(zf.namelist())
        suffix = sysconfig.get_config_var("EXT_SUFFIX")  # .cpython-313-x86_64-linux-gnu.so
        built = {
            name.removeprefix("aiopurgatory/").removesuffix(suffix)
            for name in zf.namelist()
            if name.startswith("aiopurgatory/") and name.endswith(suffix)
        }
        assert built == set(_compiled.CORE_MODULES)
        # The examples run from a checkout (tests/examples/test_examples_install.py): a wheel
        # installs no top-level ``examples`` and no extra promises them.
        assert not [name for name in zf.namelist() if name.startswith(("examples/", "tests/"))]
        (metadata,) = [name for name in zf.namelist() if name.endswith(".dist-info/METADATA")]
        assert "Provides-Extra: examples" not in zf.read(metadata).decode()
    with tarfile.open(sdist) as tf:
        assert trio_bench <= {name.split("/", 1)[1] for name in tf.getnames() if "/" in name}
    # The installed package, not this checkout (which a PYTHONPATH may point at).
    clean_env = {
        k: v for k, v in os.environ.items() if k not in {"AIOPURGATORY_NO_EXTENSIONS", "PYTHONPATH"}
    }
    check = (
        "import asyncio, sys, aiopurgatory as ap\n"
        "async def main():\n"
        "    p = ap.Purgatory('x')\n"
        "    return await p.watch(ap.DelayedOperation(0.01), ['k'])\n"
        f"print(sys.version_info[:2] == {sys.version_info[:2]}, ap.COMPILED,"
        " asyncio.run(main()).name)\n"
    )
    results = {}
    for name, target, env in (
        ("wheel", wheel, {}),
        ("sdist", sdist, {"CC": "false", "CXX": "false"}),  # no working C compiler
    ):
        python = venv_with(tmp_path / f"venv-{name}", target, env={**clean_env, **env})
        out = subprocess.run(
            [python, "-c", check],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env=clean_env,
        )
        results[name] = out.stdout.strip()
    assert results == {"wheel": "True True EXPIRED", "sdist": "True False EXPIRED"}


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy, pickle.dumps])
def test_operations_and_handles_refuse_to_be_copied(how: object) -> None:
    # A copy would share the original's identity key and watch lists; the
    # compiled build could not copy a subclass's own slots either.
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        how(Slotted(1.0))  # type: ignore[operator]

    async def main() -> None:
        handle = ap.Timer().call_later(1.0, print)
        with pytest.raises(TypeError, match="cannot be pickled or copied"):
            how(handle)  # type: ignore[operator]
        handle.cancel()

    simulation.run(main())
