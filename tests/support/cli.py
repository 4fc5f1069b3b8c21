"""Running the installed ``aiopurgatory`` console script as a user does (issue 31).

The script next to this interpreter is an entry point that imports
``aiopurgatory``; with this checkout first on ``PYTHONPATH`` it runs this
checkout's code. stdin is closed and stderr a pipe, as in a CI log.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT", "SCRIPT", "SPARK_BANNER", "aiopurgatory", "lines"]

ROOT = Path(__file__).resolve().parents[2]
#: The console script installed next to this interpreter.
SCRIPT = Path(sys.executable).with_name("aiopurgatory")
#: What a starting Spark driver prints on stderr (so: Spark was started).
SPARK_BANNER = "Setting default log level"


def aiopurgatory(
    *args: str,
    timeout: float = 600,
    pythonpath: tuple[str, ...] = (),
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``aiopurgatory ARGS``; ``pythonpath`` goes before this checkout."""
    assert SCRIPT.is_file(), f"no console script at {SCRIPT}: install the project (make install)"
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(
        [*pythonpath, str(ROOT), *filter(None, [environ.get("PYTHONPATH")])]
    )
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environ,
        check=False,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


def lines(text: str) -> list[str]:
    """The non-blank lines of ``text``."""
    return [line for line in text.splitlines() if line.strip()]
