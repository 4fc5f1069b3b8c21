"""``.ci/find-python``: which interpreter ``make test`` takes for each other Python.

pyenv's newest ``X.Y.z`` (read from its versions directory), else ``pythonX.Y`` on
``PATH`` but not a pyenv shim; none: a message saying how to get one, and a failure
(docs/pythons.md), never a silent skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.not_library  # the project's tooling, not the library

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "find-python"


def _interpreter(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def _find(version: str, pyenv_root: Path, path: list[Path]) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYENV_ROOT": str(pyenv_root),
        "PATH": os.pathsep.join([*map(str, path), "/usr/bin", "/bin"]),
    }
    return subprocess.run(
        ["sh", str(SCRIPT), version], capture_output=True, text=True, env=env, timeout=30
    )


def test_pyenvs_newest_patch_release_is_taken(tmp_path: Path) -> None:
    root = tmp_path / "pyenv"
    for patch in ("3.12.1", "3.12.10", "3.12.9", "3.13.0"):
        _interpreter(root / "versions" / patch / "bin" / f"python{patch[:4]}")
    (root / "versions" / "3.12-dev").mkdir()  # not a release: left alone
    found = _find("3.12", root, [])
    assert (found.returncode, found.stdout.strip()) == (
        0,
        str(root / "versions" / "3.12.10" / "bin" / "python3.12"),
    )


def test_path_is_the_fallback_but_not_pyenvs_shims(tmp_path: Path) -> None:
    shim = _interpreter(tmp_path / "pyenv" / "shims" / "python3.13")
    real = _interpreter(tmp_path / "usr" / "bin" / "python3.13")
    found = _find("3.13", tmp_path / "nowhere", [shim.parent, real.parent])
    assert (found.returncode, found.stdout.strip()) == (0, str(real))


def test_a_missing_python_fails_saying_how_to_get_it(tmp_path: Path) -> None:
    shim = _interpreter(tmp_path / "pyenv" / "shims" / "python3.14")
    found = _find("3.14", tmp_path / "pyenv", [shim.parent])
    assert found.returncode == 1
    assert found.stdout == ""
    assert "no CPython 3.14 here" in found.stderr
    assert "pyenv install 3.14" in found.stderr
    assert "PYTHONS=" in found.stderr
