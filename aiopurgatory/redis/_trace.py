"""The trace context a trigger carries: the W3C ``traceparent`` of a sampled current span.

Looked up without importing anything: OpenTelemetry's API is used only if
someone imported it already (the application, or redis-py 8 itself, whose
observability module imports it when it is installed), and a context that
nothing was ever attached to (no span, no baggage: the common case in a
process that does not trace) is told by one call and a truth test, before any
span is looked at. What is found is formatted as the W3C propagator would
(``00-<trace id>-<span id>-<flags>``), without the propagator's machinery.
"""

from __future__ import annotations

import sys

__all__ = ["traceparent"]

_modules = sys.modules


def traceparent() -> str | None:
    """The ``traceparent`` of the current span if it is sampled, else None."""
    context = _modules.get("opentelemetry.context")
    if context is None or not context.get_current():
        return None
    trace = _modules.get("opentelemetry.trace")
    if trace is None:
        return None
    where = trace.get_current_span().get_span_context()
    flags = where.trace_flags
    if not (where.is_valid and flags.sampled):
        return None
    return f"00-{where.trace_id:032x}-{where.span_id:016x}-{flags:02x}"
