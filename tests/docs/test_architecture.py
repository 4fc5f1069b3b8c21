"""docs/architecture.md stays true: the modules it names exist, it names every module of
the package, and the internal interfaces it lists are the code's.

Reads the checkout's files only (the sources parsed, never imported): no extra needed,
and the same on either core.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "aiopurgatory"
PAGE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")

_FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
# The page without its diagrams, for its inline code (``name``).
PROSE = _FENCE.sub("", PAGE)
INLINE = re.findall(r"`([^`\n]+)`", PROSE)
# The first diagram: the core's modules and their imports.
CORE_DIAGRAM = _FENCE.findall(PAGE)[0]
# The part of the page about the core (the Redis layer's section is
# tests/redis/test_layout.py's).
CORE_PART = PROSE.split("## The Redis layer")[0]


def _members(path: Path, cls: str) -> set[str]:
    """The ``__slots__`` and the methods a class of ``path`` defines itself."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            names = {
                item.name
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            for item in node.body:
                if (
                    isinstance(item, ast.Assign)
                    and isinstance(item.targets[0], ast.Name)
                    and item.targets[0].id == "__slots__"
                ):
                    names |= set(ast.literal_eval(item.value))
            return names
    raise AssertionError(f"no class {cls} in {path}")


def test_the_page_is_read() -> None:
    # Guards the parsing: empty lists would check nothing.
    assert "_purgatory.py" in INLINE
    assert "_purgatory_core" in CORE_DIAGRAM
    assert "## The timer's interface for purgatories" in CORE_PART


def test_every_module_of_the_package_is_named() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert "_timer.py" in modules
    unnamed = [name for name in modules if name not in INLINE]
    assert not unnamed, f"docs/architecture.md says nothing of {unnamed}: add each to a table"


def test_every_module_named_exists() -> None:
    # A path is the checkout's or the package's; a module's name is the package's,
    # its Redis layer's, or setup.py.
    places = (ROOT, PACKAGE, PACKAGE / "redis")
    missing = []
    for token in INLINE:
        is_path = "/" in token and token.endswith((".py", "/"))
        if (is_path or re.fullmatch(r"_?[a-z_]+\.py", token)) and not any(
            (place / token).exists() for place in places
        ):
            missing.append(token)
    for name in set(re.findall(r"(?<![\w.])_[a-z_]+[a-z]", CORE_DIAGRAM)):
        if not (PACKAGE / f"{name}.py").exists():
            missing.append(f"{name} (diagram)")
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_the_compiled_modules_listed_are_those_with_a_pxd() -> None:
    sentence = re.search(r"The compiled core is every module with a `\.pxd`.*?\. Each", PROSE, re.S)
    assert sentence is not None
    listed = set(re.findall(r"`(_[a-z_]+)`", sentence.group(0)))
    assert listed == {p.stem for p in PACKAGE.glob("_*.pxd")}


def test_what_an_operation_reaches_of_its_purgatory_is_purgatory_base() -> None:
    # The drift this page once had: a member listed that _PurgatoryBase never had.
    found = re.search(r"through `_PurgatoryBase` \(([^)]*)\)", PROSE)
    assert found is not None
    listed = set(re.findall(r"`(\w+)`", found.group(1)))
    assert listed == _members(PACKAGE / "_operation.py", "_PurgatoryBase")


def test_the_timers_interface_table_names_the_timers_methods() -> None:
    section = CORE_PART.split("## The timer's interface for purgatories")[1].split("\n## ")[0]
    methods = set(re.findall(r"^\| `(\w+)", section, re.MULTILINE))
    assert {"_schedule", "_unschedule", "closed"} <= methods
    timer = _members(PACKAGE / "_timer.py", "Timer") | _members(
        PACKAGE / "_timer_entry.py", "_EntrySet"
    )
    assert methods <= timer, f"not methods of Timer: {methods - timer}"
