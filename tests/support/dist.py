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
