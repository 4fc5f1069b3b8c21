"""tests/core mirrors the package: each test module is named after the module it tests and
stays under 700 lines, as the package's modules do (tests/packaging/test_module_size.py).

A test module is ``test_<module>.py`` or ``test_<module>_<aspect>.py``, where ``<module>``
is a module of ``aiopurgatory/`` without its leading underscore (``test_timer_arming.py``
tests ``_timer.py``'s arming). A name after the history of a change (``test_first_hour``,
``test_core_edge_cases``) says nothing of where a failing test's code is: its tests
belong in the files of the modules they test.

Reads the checkout's files only: no import, no extra needed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE_TESTS = ROOT / "tests" / "core"
LIMIT = 700

#: Test modules of the package as a whole rather than of one module, and why.
WHOLE_PACKAGE = {
    # the public surface: SPEC.md's names, __init__.py's re-exports, every public
    # module's __all__, and what `import aiopurgatory` loads
    "test_public_api.py",
}


def _package_modules() -> set[str]:
    return {
        path.stem.lstrip("_")
        for path in (ROOT / "aiopurgatory").glob("*.py")
        if path.name != "__init__.py"
    }


MODULES = _package_modules()
TEST_MODULES = sorted(path.name for path in CORE_TESTS.glob("test_*.py"))


def module_tested_by(filename: str) -> str | None:
    """The package module ``filename`` is named after (the longest that fits), or None."""
    stem = filename.removeprefix("test_").removesuffix(".py")
    fits = [m for m in MODULES if stem == m or stem.startswith(m + "_")]
    return max(fits, key=len) if fits else None


def test_the_files_are_found() -> None:
    # Guards the collection: an empty list would test nothing.
    assert {"timer", "purgatory", "wheel", "operation"} <= MODULES
    assert "test_purgatory.py" in TEST_MODULES
    assert len(TEST_MODULES) > 20


def test_a_name_is_matched_to_its_module() -> None:
    assert module_tested_by("test_timer_arming.py") == "timer"
    assert module_tested_by("test_timer_entry.py") == "timer_entry"
    assert module_tested_by("test_purgatory_watermarks.py") == "purgatory"
    assert module_tested_by("test_first_hour.py") is None
    assert module_tested_by("test_core_edge_cases.py") is None


@pytest.mark.parametrize("name", TEST_MODULES)
def test_a_core_test_module_is_named_after_a_module_of_the_package(name: str) -> None:
    if name in WHOLE_PACKAGE:
        return
    assert module_tested_by(name) is not None, (
        f"tests/core/{name} is named after no module of aiopurgatory/: name it "
        "test_<module>.py or test_<module>_<aspect>.py after the module its tests test"
    )


@pytest.mark.parametrize("name", TEST_MODULES)
def test_a_core_test_module_stays_under_700_lines(name: str) -> None:
    lines = (CORE_TESTS / name).read_text(encoding="utf-8").count("\n")
    assert lines < LIMIT, f"tests/core/{name} has {lines} lines: split it by aspect"
