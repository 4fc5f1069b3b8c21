"""A job worker's spans, written to a file the test reads (one JSON object a line).

A worker process calls :func:`export_to` with the path in
``AIOPURGATORY_JOBS_SPANS``: a TracerProvider of its own (the SDK's default
sampler: every root span sampled) whose spans are appended to that file as they
end, from any process of the worker (a prefork child too: one ``write`` per span
on a file opened for appending). The test finds them with :func:`find_span`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

ENV = "AIOPURGATORY_JOBS_SPANS"


class FileExporter(SpanExporter):
    """Appends each ended span's name, ids, links and attributes as a JSON line."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            context = span.get_span_context()
            assert context is not None  # an SDK span's, always
            lines.append(
                json.dumps(
                    {
                        "name": span.name,
                        "trace_id": format(context.trace_id, "032x"),
                        "span_id": format(context.span_id, "016x"),
                        "pid": os.getpid(),
                        "attributes": {k: str(v) for k, v in (span.attributes or {}).items()},
                    }
                )
                + "\n"
            )
        with self.path.open("a") as out:
            out.write("".join(lines))
        return SpanExportResult.SUCCESS


def export_to(path: str | None = None) -> TracerProvider | None:
    """This process's TracerProvider exporting to ``path`` (default: the variable's), or None."""
    where = path if path is not None else os.environ.get(ENV)
    if not where:
        return None
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(Path(where))))
    return provider


def find_span(path: Path, name: str, attribute: str, value: str, within: float = 10.0) -> Any:
    """The span ``name`` in ``path`` whose ``attribute`` is ``value``, once exported
    (up to ``within`` s: a span is written when it ends, after what it published);
    None if it never is."""
    deadline = time.monotonic() + within
    while True:
        if path.exists():
            for span in map(json.loads, path.read_text().splitlines()):
                if span["name"] == name and span["attributes"].get(attribute) == value:
                    return span
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)
