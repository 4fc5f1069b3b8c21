"""The trace context a trigger carries: the W3C ``traceparent`` of a sampled current span.

Looked up without importing anything: OpenTelemetry's API is used only if
someone imported it already (the application, or redis-py 8 itself, whose
observability module imports it when it is installed), and a context that
nothing was ever attached to (no span, no baggage: the common case in a
process that does not trace) is told by one call and a truth test, before any
span is looked at. What is found is formatted as the W3C propagator would
(``00-<trace id>-<span id>-<flags>``), without the propagator's machinery,
and kept for the next trigger made in the same span.
"""

from __future__ import annotations

import sys

__all__ = ["traceparent"]

_modules = sys.modules
# The last span context seen and its traceparent (a tuple, replaced whole: read
# and written by any thread). A request's triggers share one span: its text is
# made once (formatting it costs twice as much as finding the span).
_last: tuple[object, str | None] = (None, None)


def traceparent() -> str | None:
    """The ``traceparent`` of the current span if it is sampled, else None."""
    context = _modules.get("opentelemetry.context")
    if context is None or not context.get_current():
        return None
    trace = _modules.get("opentelemetry.trace")
    if trace is None:
        return None
    global _last
    where = trace.get_current_span().get_span_context()
    last = _last
    if where is last[0]:
        return last[1]
    flags = where.trace_flags
    text = None
    if where.is_valid and flags.sampled:
        text = f"00-{where.trace_id:032x}-{where.span_id:016x}-{int(flags):02x}"
    _last = (where, text)
    return text
