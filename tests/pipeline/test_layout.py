"""Imports among the pipeline's analysis modules go one way:
cli -> analyze -> tables/report -> schema (no Spark needed)."""

from __future__ import annotations

import ast
from pathlib import Path

import aiopurgatory.pipeline as pipeline

PIPELINE = Path(pipeline.__file__).parent


def _pipeline_imports(module: str) -> set[str]:
    """The pipeline modules that ``module`` imports (at any level of its code)."""
    tree = ast.parse((PIPELINE / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module is None:
                found.update(alias.name for alias in node.names)
            else:
                found.add(node.module.split(".")[0])
    return found


def test_report_and_tables_do_not_import_analyze() -> None:
    assert "analyze" in _pipeline_imports("replay")  # the helper sees relative imports
    assert "tables" in _pipeline_imports("report")
    assert "analyze" not in _pipeline_imports("report")
    assert _pipeline_imports("tables") == set()
    assert "report" in _pipeline_imports("analyze")
    assert "tables" in _pipeline_imports("analyze")
