"""The compiled core's declarations cannot drift from the Python classes they compile.

Every core class is written twice: its ``.py`` says which attributes it has
(``__slots__``), its ``.pxd`` declares them again for Cython (``cdef public ...``).
A slot added to one and not the other compiles (or imports) and fails only later,
in odd ways; this test reads both files and names the difference.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import aiopurgatory

PACKAGE = Path(aiopurgatory.__file__).parent
# cthread.pxd declares a C function for the others to cimport: no module, no class.
PXD_FILES = sorted(path for path in PACKAGE.glob("*.pxd") if path.stem != "cthread")
# Compiled modules that declare functions only (no class, so no slots to match).
FUNCTIONS_ONLY = {"_validation", "_ticks", "_purgatory"}

_CLASS = re.compile(r"^cdef class (\w+)\s*(?:\([^)]*\))?\s*:\s*$")
# ``cdef [public|readonly] <type...> <name>``: an attribute (a method has parentheses);
# a type may be a memoryview (``long long[::1]``) or a pointer.
_ATTRIBUTE = re.compile(
    r"^\s+cdef\s+(?:(?:public|readonly)\s+)?[\w.\[\]:,*]+(?:\s+[\w.\[\]:,*]+)*\s+(\w+)\s*$"
)


def pxd_attributes(text: str) -> dict[str, set[str]]:
    """The attributes each ``cdef class`` of a ``.pxd`` declares (forward declarations: none)."""
    classes: dict[str, set[str]] = {}
    current: set[str] | None = None
    for line in text.splitlines():
        code = line.split("#", 1)[0].rstrip()
        if not code:
            continue
        match = _CLASS.match(code)
        if match:
            current = classes.setdefault(match.group(1), set())
            continue
        if not code.startswith((" ", "\t")):
            current = None  # left the class body (a forward declaration has none)
            continue
        if current is not None and "(" not in code:
            attribute = _ATTRIBUTE.match(code)
            if attribute:
                current.add(attribute.group(1))
    return classes


def py_slots(text: str) -> dict[str, set[str] | None]:
    """``__slots__`` of each top-level class of a module (None: the class has none)."""
    slots: dict[str, set[str] | None] = {}
    for node in ast.parse(text).body:
        if not isinstance(node, ast.ClassDef):
            continue
        found: set[str] | None = None
        for statement in node.body:
            if isinstance(statement, ast.Assign):
                targets, value_node = statement.targets, statement.value
            elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
                targets, value_node = [statement.target], statement.value
            else:
                continue
            if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in targets):
                value = ast.literal_eval(value_node)
                found = {value} if isinstance(value, str) else set(value)
        slots[node.name] = found
    return slots


def differences(pxd_text: str, py_text: str) -> list[str]:
    """One message per class whose ``.pxd`` attributes and ``__slots__`` differ."""
    problems = []
    slots = py_slots(py_text)
    for name, declared in sorted(pxd_attributes(pxd_text).items()):
        if name not in slots:
            problems.append(f"{name}: cdef class in the .pxd, no such class in the .py")
            continue
        in_py = slots[name]
        if in_py is None:
            problems.append(
                f"{name}: the .pxd declares {sorted(declared)}, the .py has no __slots__"
            )
            continue
        only_pxd, only_py = sorted(declared - in_py), sorted(in_py - declared)
        if only_pxd or only_py:
            problems.append(
                f"{name}: declared only in the .pxd: {only_pxd}; only in __slots__: {only_py}"
            )
    return problems


@pytest.mark.parametrize("pxd", PXD_FILES, ids=[path.stem for path in PXD_FILES])
def test_pxd_attributes_match_slots(pxd: Path) -> None:
    py = pxd.with_suffix(".py")
    if pxd.stem in FUNCTIONS_ONLY:
        assert not pxd_attributes(pxd.read_text()), f"{pxd.name} now declares a class"
    else:
        assert pxd_attributes(pxd.read_text()), f"{pxd.name}: no cdef class found"
    assert differences(pxd.read_text(), py.read_text()) == []


def test_every_core_module_is_covered() -> None:
    assert {path.stem for path in PXD_FILES} == {
        "_wheel",
        "_timer_entry",
        "_timer_handle",
        "_timer",
        "_operation",
        "_thresholds",
        "_purgatory",
        "_duration_counts",
        "_validation",
        "_ticks",
        "_purgatory_core",
        "_watch",
    }


def test_the_parsers_read_what_the_core_declares() -> None:
    timer = (PACKAGE / "_timer.pxd").read_text()
    assert {"_closed", "_due_now", "__weakref__"} <= pxd_attributes(timer)["Timer"]
    entries = (PACKAGE / "_timer_entry.pxd").read_text()
    assert {"_count", "_driver", "_staged", "_armed"} == pxd_attributes(entries)["_EntrySet"]
    assert {"_state", "_when"} == pxd_attributes(entries)["_TimerEntry"]
    # cpdef methods and module-level declarations are not attributes.
    assert "_schedule" not in pxd_attributes(timer)["Timer"]
    assert "_STAGE_LIMIT" not in set().union(*pxd_attributes(timer).values())
    assert py_slots((PACKAGE / "_timer.py").read_text())["Timer"] == pxd_attributes(timer)["Timer"]


def test_a_drift_is_named() -> None:
    pxd = (
        "cdef class Forward\n\n"
        "cdef class A(Base):\n"
        "    cdef public object _x\n"
        "    cdef public Py_ssize_t _y  # a comment\n"
        "    cpdef _method(self, object a)\n\n"
        "cdef class B:\n"
        "    cdef object __weakref__\n"
    )
    py = "class A(Base):\n    __slots__ = ('_x', '_z')\n\nclass B:\n    pass\n"
    assert differences(pxd, py) == [
        "A: declared only in the .pxd: ['_y']; only in __slots__: ['_z']",
        "B: the .pxd declares ['__weakref__'], the .py has no __slots__",
    ]
    assert (
        differences(pxd, py.replace("'_z'", "'_y'").replace("pass", "__slots__ = '__weakref__'"))
        == []
    )
