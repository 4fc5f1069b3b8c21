"""The sdist and wheel of this checkout, for the packaging tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def checkout_dist(
    out: Path, *, sdist_only: bool = False, env: dict[str, str] | None = None
) -> Path:
    """The directory holding this checkout's distribution: the one `make test` built
    with ``python -m build`` (``AIOPURGATORY_TEST_DIST``, so that the core is
    compiled once per Python), else one built now into ``out``."""
    given = os.environ.get("AIOPURGATORY_TEST_DIST")
    if given:
        return Path(given)
    command = [sys.executable, "-m", "build", *(["--sdist"] if sdist_only else [])]
    subprocess.run(
        [*command, "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=900,
        env=env,
    )
    return out


def uv() -> str:
    """The uv binary of this environment (the test extra's ``uv`` package)."""
    from uv import find_uv_bin

    return find_uv_bin()


def venv_with(home: Path, target: Path, *, editable: bool = False, env: dict[str, str]) -> str:
    """A new virtual environment at ``home`` for this Python, with ``target`` (a
    wheel, an sdist or, ``editable``, a source tree) installed by uv; its python.

    uv rather than pip for the packaging tests' time: no pip to bootstrap into each
    venv, and the build environment an sdist needs (setuptools, Cython) comes from
    uv's cache instead of being installed again (a venv and an install took 15 to 25
    CPU seconds with pip here, 4 with uv). Both hand the build to the project's PEP
    517 backend, so the package is built by the same setup.py either way. uv's
    cached builds of this package are refreshed: an sdist is built again, under
    ``env``, every time (a wheel built earlier, with a compiler, is never reused).
    """
    subprocess.run(
        [uv(), "venv", "--quiet", "--python", sys.executable, str(home)],
        check=True,
        capture_output=True,
        timeout=120,
        env=env,
    )
    python = str(home / "bin" / "python")
    subprocess.run(
        [uv(), "pip", "install", "--quiet", "--python", python,
         "--refresh-package", "aiopurgatory", *(["-e"] if editable else []), str(target)],
        check=True,
        capture_output=True,
        timeout=900,
        env=env,
    )  # fmt: skip
    return python
