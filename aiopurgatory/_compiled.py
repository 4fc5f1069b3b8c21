"""Which implementation of the core is in use: compiled (C extensions) or pure Python.

The core modules are plain Python; an install with a C compiler also builds each
one into a C extension from the same source (see ``setup.py``), which Python
imports in place of the ``.py`` file. This module, imported first by the
package, decides which of the two the process uses:

* ``AIOPURGATORY_NO_EXTENSIONS`` set (to anything but ``0``): pure Python, even
  where the extensions are installed (a finder on ``sys.meta_path`` loads those
  modules from their ``.py`` files);
* otherwise the extensions, if all of them are installed, else pure Python (the
  compiled modules use each other's C types, so it is all or nothing). Only
  where some extension is present is the import of the core steered; a pure
  install imports as Python always does.

:data:`aiopurgatory.COMPILED` tells which one was chosen.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["COMPILED", "CORE_MODULES"]

#: The modules that have a compiled form (setup.py builds the same list).
CORE_MODULES = (
    "_validation",
    "_ticks",
    "_wheel",
    "_timer_entry",
    "_timer_handle",
    "_timer",
    "_operation",
    "_thresholds",
    "_purgatory_core",
    "_watch",
    "_purgatory",
    "_duration_counts",
)

_PACKAGE = __name__.rpartition(".")[0]
_HERE = Path(__file__).resolve().parent


class _PurePythonFinder(importlib.abc.MetaPathFinder):
    """Loads the core modules from their ``.py`` files, ignoring extensions beside them."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != _PACKAGE or name not in CORE_MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, _HERE / f"{name}.py")


def _extension_present(name: str) -> bool:
    return any(
        (_HERE / f"{name}{suffix}").is_file() for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


def _extensions_installed() -> bool:
    return all(_extension_present(name) for name in CORE_MODULES)


def _choose() -> bool:
    present = [_extension_present(name) for name in CORE_MODULES]
    forced = os.environ.get("AIOPURGATORY_NO_EXTENSIONS", "") not in ("", "0")
    if all(present) and not forced:
        return True
    if any(present):
        # Asked for pure Python, or only some extensions are there: load the
        # sources. (A pure-Python install, perhaps sourceless or zipped, has no
        # extension at all and imports as usual.)
        sys.meta_path.insert(0, _PurePythonFinder())
    return False


#: True when the compiled core (C extensions) is in use, False for pure Python.
COMPILED: bool = _choose()
