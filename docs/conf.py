"""Sphinx configuration of the aiopurgatory documentation (``make docs``).

Why Sphinx rather than mkdocs-material: the docstrings are Google style and the
API reference is generated from them, which Sphinx's autodoc + napoleon do
natively from the installed (editable) package; MyST lets the narrative pages
stay Markdown, readable on GitHub as they are. ``-W`` turns every warning into an
error, so a broken cross-reference or docstring fails the build.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

import aiopurgatory

project = "aiopurgatory"
author = "aiopurgatory developers"
copyright = "aiopurgatory developers"
release = aiopurgatory.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# _static/bench/ holds benchmark results (data and plots), not pages.
exclude_patterns = ["_build", "_static", "**/README.md"]

# -- MyST ----------------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]
# Lets pages link to sections of each other: [text](timer.md#never-early).
myst_heading_anchors = 3

# -- autodoc + napoleon (Google-style docstrings) -------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = False
autodoc_default_options = {"members": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True


# -- signatures of the compiled core's classes ---------------------------------------
# The compiled core's classes (Timer, DelayedOperation, WatermarkOperation) are C
# types: Python cannot inspect their __init__, and the signature Cython embeds in
# their docstrings misplaces keyword-only markers (Cython 3.3 renders
# ``(self, *, tick=..., wheel_size=...)`` as ``(tick=..., *, wheel_size=...)``).
# The reference takes their signature from the .py source instead (the same file
# the C type is compiled from): the first ``__init__`` of the class, so that a
# stub for type checkers (``if TYPE_CHECKING: def __init__(...)``) wins.

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: set for classes defined in Python code


def source_signature(cls: type) -> str | None:
    """``cls.__init__``'s parameters as written in its module's .py file, without self."""
    module = sys.modules.get(cls.__module__)
    if module is None or not getattr(module, "__file__", None):
        return None
    path = Path(module.__file__).with_name(cls.__module__.rpartition(".")[2] + ".py")
    if not path.exists():
        return None
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            init = _first_init(node.body)
            if init is None:
                return None
            args = init.args
            if args.posonlyargs:
                args.posonlyargs = args.posonlyargs[1:]
            else:
                args.args = args.args[1:]
            return f"({ast.unparse(args)})"
    return None


def _first_init(body: list[ast.stmt]) -> ast.FunctionDef | None:
    """The first ``def __init__`` of a class body in source order, looking into ``if``s."""
    for statement in body:
        if isinstance(statement, ast.FunctionDef) and statement.name == "__init__":
            return statement
        if isinstance(statement, ast.If):
            found = _first_init(statement.body)
            if found is not None:
                return found
    return None


def _compiled_class(what: str, obj: Any) -> bool:
    return (
        what == "class"
        and isinstance(obj, type)
        and obj.__module__.startswith("aiopurgatory.")
        and not obj.__flags__ & _HEAPTYPE
    )


def _class_signature(
    app: Any, what: str, name: str, obj: Any, options: Any, signature: str, annotation: str
) -> tuple[str, str] | None:
    if _compiled_class(what, obj):
        found = source_signature(obj)
        if found is not None:
            return found, ""
    return None


def _drop_embedded_signatures(
    app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    # Cython may embed more than one signature line; autodoc takes the first only.
    if _compiled_class(what, obj):
        embedded = re.compile(rf"^{re.escape(obj.__name__)}\(.*\)( -> .+)?$")
        while lines and (embedded.match(lines[0]) or not lines[0].strip()):
            del lines[0]


def setup(app: Any) -> dict[str, Any]:
    app.connect("autodoc-process-signature", _class_signature)
    app.connect("autodoc-process-docstring", _drop_embedded_signatures)
    return {"parallel_read_safe": True}


# -- HTML ------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"aiopurgatory {release}"
html_static_path = ["_static"]
html_show_sourcelink = False
