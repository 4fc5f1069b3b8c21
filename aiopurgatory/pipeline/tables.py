"""The data types of an analysis, shared by :mod:`.analyze` (which computes them)
and :mod:`.report` (which shows them), so that imports go one way:
``cli -> analyze -> tables/report -> schema``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["BINS_PER_DECADE", "MALFORMED_DETAIL_LIMIT", "AnalysisResult", "Quality"]

#: At most this many malformed lines are located (file and line) and reported.
MALFORMED_DETAIL_LIMIT = 1000
#: Histogram bins per decade of seconds (log scale); zero goes to its own bin.
BINS_PER_DECADE = 10


@dataclass
class Quality:
    """Line counts of an event log read (``quality.json``)."""

    #: Non-blank lines read.
    lines: int = 0
    #: Valid op events (rows of the fact table).
    events: int = 0
    #: Valid JSON with another ``event`` name (e.g. other structlog events): skipped.
    other: int = 0
    #: Lines that are not valid op events.
    malformed: int = 0
    #: Op events of schema 1 (among ``events``): written before events carried the
    #: answer's ``error``, so an error answer there reads as no error.
    schema1: int = 0
    #: Up to :data:`MALFORMED_DETAIL_LIMIT` of them: file, line, reason, text.
    examples: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class AnalysisResult:
    """What :func:`.analyze.analyze_facts` wrote and computed (small tables as pandas)."""

    out: Path
    summary: Any
    hot_keys: Any
    answers: Any
    quality: Quality | None
    report: Path | None
    seconds: dict[str, float]
