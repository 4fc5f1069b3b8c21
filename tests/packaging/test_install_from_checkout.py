"""Building (so installing) from a source checkout leaves the checkout unchanged.

``pip install ./checkout[redis]`` builds the wheel inside the checkout: setuptools
wrote its ``build/`` tree and ``aiopurgatory.egg-info`` there (134 files in a
user's report). setup.py sends them to a temporary directory of the build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tracked_copy(target: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / os.fsdecode(name)
        if source.is_file():
            destination = target / os.fsdecode(name)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)


def _files(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*") if path.is_file()}


@pytest.mark.packaging
def test_building_a_wheel_from_a_checkout_writes_nothing_into_it(tmp_path: Path) -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an unpacked sdist): nothing to copy from git")
    checkout = tmp_path / "checkout"
    _tracked_copy(checkout)
    before = _files(checkout)
    out = tmp_path / "wheels"
    # Without a C compiler (CC=false) the build is pure Python, in seconds; what
    # lands in the checkout does not depend on it but for Cython's C files, which
    # follow setuptools' build directory (setup.py's build_ext).
    env = {**os.environ, "CC": "false", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("AIOPURGATORY_NO_EXTENSIONS", None)
    result = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), "."],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (wheel,) = out.glob("aiopurgatory-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert "aiopurgatory/_local.py" in archive.namelist()
    assert _files(checkout) - before == set()
