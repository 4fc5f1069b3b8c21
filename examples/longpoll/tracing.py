"""``--otel console|otlp``: a span per HTTP request, and per wait (:mod:`aiopurgatory.tracing`).

:func:`console_tracing` sets up an OpenTelemetry SDK whose spans go to standard
output, one JSON object per line (the SDK's ``ReadableSpan.to_json``);
:func:`otlp_tracing` one whose spans go to an OTLP/HTTP endpoint (a collector),
taken from the SDK's standard environment variables. Both export through a
batch processor flushed at exit. :class:`TraceRequests` makes each HTTP request
a SERVER span named after its route (``GET /topics/{name}``), continuing a W3C
``traceparent`` the client sent. With :func:`aiopurgatory.tracing.trace_waits` on
the feed's purgatory, a parked GET's span has a child ``wait longpoll`` whose
link points to the span of the POST that woke it.

Needs ``opentelemetry-sdk`` (not an extra of the library: the application
chooses its SDK and exporter), and for ``otlp``
``opentelemetry-exporter-otlp-proto-http`` (the ``longpoll`` extra has both).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - the test extra has it
    raise ImportError(
        "--otel needs opentelemetry-sdk: pip install 'aiopurgatory[otel]' opentelemetry-sdk"
    ) from exc

__all__ = [
    "EXPORTERS",
    "TraceRequests",
    "console_tracing",
    "otlp_tracing",
    "require",
    "route_of",
    "tracer_provider",
]

#: The ``--otel`` choices.
EXPORTERS = ("console", "otlp")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_W3C = TraceContextTextMapPropagator()


def _one_line(span: ReadableSpan) -> str:
    text: str = span.to_json(indent=None)
    return text + "\n"


def console_tracing() -> TracerProvider:
    """A TracerProvider writing each span to standard output as one JSON line.

    Call ``shutdown()`` on it at exit: the batch processor then writes what it holds.
    """
    provider = TracerProvider(resource=Resource.create({"service.name": "longpoll"}))
    exporter = ConsoleSpanExporter(out=sys.stdout, formatter=_one_line)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def otlp_tracing() -> TracerProvider:
    """A TracerProvider sending spans to an OTLP/HTTP endpoint (protobuf over HTTP).

    The SDK's exporter reads the endpoint from ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
    (used as it is) or ``OTEL_EXPORTER_OTLP_ENDPOINT`` (``/v1/traces`` appended),
    else ``http://localhost:4318/v1/traces``; its headers, timeout (10 s by default)
    and compression from the other ``OTEL_EXPORTER_OTLP_*`` variables. A collector
    that is down costs the spans, never a request: the batch processor exports on
    its own thread and logs the failure. Call ``shutdown()`` at exit: it sends what
    the processor holds (waiting up to the exporter's timeout for an endpoint that
    does not answer).

    Raises:
        ImportError: ``opentelemetry-exporter-otlp-proto-http`` is not installed.
    """
    exporter_class = _otlp_exporter_class()
    provider = TracerProvider(resource=Resource.create({"service.name": "longpoll"}))
    provider.add_span_processor(BatchSpanProcessor(exporter_class()))
    return provider


def _otlp_exporter_class() -> type[SpanExporter]:
    # Imported here: ``console`` needs only the SDK.
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ImportError(
            "--otel otlp needs opentelemetry-exporter-otlp-proto-http: "
            "pip install opentelemetry-exporter-otlp-proto-http"
        ) from exc
    return OTLPSpanExporter


def require(exporter: str) -> None:
    """Check that ``--otel exporter`` can run, before the server starts.

    Raises:
        ValueError: ``exporter`` is not one of :data:`EXPORTERS`.
        ImportError: the exporter's package is not installed.
    """
    if exporter not in EXPORTERS:
        raise ValueError(f"otel must be one of {', '.join(EXPORTERS)}, got {exporter!r}")
    if exporter == "otlp":
        _otlp_exporter_class()


def tracer_provider(exporter: str) -> TracerProvider:
    """The TracerProvider of ``--otel exporter`` (see :func:`require` for what it raises)."""
    require(exporter)
    return console_tracing() if exporter == "console" else otlp_tracing()


def route_of(path: str) -> str:
    """The route template of ``path``: ``/topics/{name}`` for a topic, else the path."""
    return "/topics/{name}" if path.startswith("/topics/") else path


class TraceRequests:
    """ASGI middleware: each HTTP request is a SERVER span ``<method> <route>``.

    The span continues the request's ``traceparent`` header if it has one, is
    current while the application handles the request, and carries the method,
    the path and the response's status.
    """

    def __init__(self, app: ASGIApp, tracer: trace.Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
        }
        method, path = scope["method"], scope["path"]
        with self.tracer.start_as_current_span(
            f"{method} {route_of(path)}",
            context=_W3C.extract(headers),
            kind=trace.SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path},
        ) as span:

            async def sending(message: Message) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", message["status"])
                await send(message)

            await self.app(scope, receive, sending)
