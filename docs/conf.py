"""Sphinx configuration of the aiopurgatory documentation (``make docs``).

Why Sphinx rather than mkdocs-material: the docstrings are Google style and the
API reference is generated from them, which Sphinx's autodoc + napoleon do
natively from the installed (editable) package; MyST lets the narrative pages
stay Markdown, readable on GitHub as they are. ``-W`` turns every warning into an
error, so a broken cross-reference or docstring fails the build.
"""

from __future__ import annotations

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

# -- HTML ------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"aiopurgatory {release}"
html_static_path = ["_static"]
html_show_sourcelink = False
