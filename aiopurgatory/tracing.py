"""OpenTelemetry spans for waits: which request waited, how long, and what woke it.

:func:`trace_waits` makes every watch on the purgatories given a span, from the
watch until the operation finishes::

    from aiopurgatory.tracing import trace_waits

    with trace_waits(fetches):          # the global TracerProvider, or tracer_provider=
        ...                             # serve: each watch is a span

A span is named ``wait <purgatory name>``, of kind INTERNAL, a child of the span
current where the operation was watched (the request's), and ends when the
operation finishes (after its callbacks). Attributes:

* ``aiopurgatory.outcome``: ``completed``, ``expired``, ``cancelled`` or ``failed``;
* ``aiopurgatory.keys``: the number of keys it was watched under;
* ``aiopurgatory.completed_by``: for a completion by a trigger
  (``check_and_complete`` or ``advance``) of one of its keys, that key as ``str``.

A completed operation's span links to the span that was current where it was
completed: the code that called ``check_and_complete``/``advance`` (or
``force_complete``), or, for a trigger from another process carried by
:class:`aiopurgatory.LocalTriggers`, the span of the code that made the trigger
there (sampled spans only). An expiry adds the event ``aiopurgatory.expired``
with ``aiopurgatory.lateness`` (seconds after the deadline), a cancellation the
event ``aiopurgatory.cancelled``; a failure (``try_complete`` or a callback
raised) is recorded as an exception with the status ERROR. A watch completed
by its own first check is a span with no ``completed_by`` and no link.

A span starts at the wall-clock time of the watch and lasts the time the loop's
clock says it waited, so on virtual time (:mod:`aiopurgatory.simulation`) it
lasts the virtual wait. It works the same on asyncio, uvloop and trio.

Off, it costs nothing but one test per watch and per trigger; on, it never
breaks a wait: a tracer or exporter that raises is logged once
(``aiopurgatory.tracing_failed``) and counted (:attr:`WaitTracing.failures`).
Costs: ``docs/metrics.md``.

Needs the ``otel`` extra: ``pip install 'aiopurgatory[otel]'``.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Final, Self

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ImportError(
        "aiopurgatory.tracing needs opentelemetry-api: pip install 'aiopurgatory[otel]'"
    ) from exc

from . import DelayedOperation, Outcome, Purgatory, __version__
from ._logging import LazyLogger

__all__ = [
    "ATTRIBUTE_COMPLETED_BY",
    "ATTRIBUTE_KEYS",
    "ATTRIBUTE_LATENESS",
    "ATTRIBUTE_OUTCOME",
    "EVENT_CANCELLED",
    "EVENT_EXPIRED",
    "TRACER_NAME",
    "WaitTracing",
    "trace_waits",
]

#: The instrumentation scope of the spans.
TRACER_NAME: Final = "aiopurgatory"
#: How the operation finished: ``completed``, ``expired``, ``cancelled``, ``failed``.
ATTRIBUTE_OUTCOME: Final = "aiopurgatory.outcome"
#: The number of keys the operation was watched under.
ATTRIBUTE_KEYS: Final = "aiopurgatory.keys"
#: The key (as str) whose trigger completed the operation.
ATTRIBUTE_COMPLETED_BY: Final = "aiopurgatory.completed_by"
#: On :data:`EVENT_EXPIRED`: seconds from the deadline to the expiry.
ATTRIBUTE_LATENESS: Final = "aiopurgatory.lateness"
#: The event of an expiry (with :data:`ATTRIBUTE_LATENESS`).
EVENT_EXPIRED: Final = "aiopurgatory.expired"
#: The event of a cancellation.
EVENT_CANCELLED: Final = "aiopurgatory.cancelled"
# The event of a span ended by WaitTracing.close() before its operation finished.
_EVENT_CLOSED: Final = "aiopurgatory.tracing_closed"

_COMPLETED = Outcome.COMPLETED
_EXPIRED = Outcome.EXPIRED
_CANCELLED = Outcome.CANCELLED
_INTERNAL = SpanKind.INTERNAL
_current = otel_context.get_current
_span_in = trace.get_current_span
_NO_TRIGGER: Any = object()  # no check_and_complete/advance is running
_W3C = TraceContextTextMapPropagator()
_log = LazyLogger()


class _Hooks:
    """What the core of one purgatory calls while its waits are traced.

    ``watched(op)`` when an op is taken (before its first check), ``trigger_began``
    and ``trigger_ended`` around the checks of a ``check_and_complete``/``advance``,
    and ``finished(op)`` in the recorder slot (after the op's callbacks and
    wake-ups), which calls the user's recorder (``recorder``) after it.
    """

    __slots__ = ("_key", "_name", "_purgatory", "_spans", "_tracing", "finished", "recorder")

    def __init__(self, tracing: WaitTracing, purgatory: Purgatory[Any]) -> None:
        self._tracing = tracing
        self._purgatory = purgatory
        self._name = f"wait {purgatory.name}"
        # id(op) -> (span, wall clock at the watch in ns, loop time then, parent's span
        # id): a watched op is alive until it finishes, which pops its entry.
        self._spans: dict[int, tuple[Span, int, float, int]] = {}
        self._key: Any = _NO_TRIGGER
        self.recorder = purgatory._recorder  # the user's, called after each span ends
        self.finished = self._finished  # one bound method, for the core's slot

    def watched(self, op: DelayedOperation) -> None:
        try:
            # The context read once (the SDK reads it for each of its own steps
            # when not given it: a third of the cost of a span).
            context = _current()
            start = time.time_ns()
            # Its attributes are set at its end, at once: one pass of the SDK's
            # checks of attributes rather than two (a fifth of its cost).
            span = self._tracing._tracer.start_span(
                self._name, context, _INTERNAL, start_time=start
            )
            if span.is_recording():  # not sampled: nothing more to do for it
                parent = _span_in(context).get_span_context().span_id
                self._spans[id(op)] = (span, start, self._purgatory.timer.time(), parent)
        except Exception as exc:
            self._tracing._failed(exc)

    def trigger_began(self, key: Hashable) -> Any:
        outer = self._key
        self._key = key
        return outer

    def trigger_ended(self, outer: Any) -> None:
        self._key = outer

    def _finished(self, op: DelayedOperation) -> None:
        wait = self._spans.pop(id(op), None)
        if wait is not None:
            try:
                self._end(op, *wait)
            except Exception as exc:
                self._tracing._failed(exc)
        recorder = self.recorder
        if recorder is not None:
            recorder(op)  # its failures are the core's to log (recorder_failed)

    def _end(self, op: DelayedOperation, span: Span, start: int, since: float, parent: int) -> None:
        now = self._purgatory.timer.time()
        end = start + max(0, round((now - since) * 1e9))
        outcome = op._outcome
        assert outcome is not None
        attributes: dict[str, str | int] = {
            ATTRIBUTE_OUTCOME: outcome.value,
            ATTRIBUTE_KEYS: len(op._keys),
        }
        if outcome is _COMPLETED and op._joined:  # else its own first check completed it
            key = self._key
            # Not inside a trigger of a key it does not watch (another op's callback).
            if key is not _NO_TRIGGER and key in op._keys:
                attributes[ATTRIBUTE_COMPLETED_BY] = str(key)
            # Still inside the completing call: its span is current (a remote
            # trigger's, attached around its delivery).
            where = _span_in().get_span_context()
            if where.is_valid and where.span_id != parent:
                span.add_link(where)
        elif outcome is _EXPIRED:
            deadline = op.deadline
            if deadline is not None:
                late = now - deadline
                span.add_event(EVENT_EXPIRED, {ATTRIBUTE_LATENESS: late}, timestamp=end)
        elif outcome is _CANCELLED:
            span.add_event(EVENT_CANCELLED, timestamp=end)
        span.set_attributes(attributes)
        failure = op._failure()  # try_complete's (FAILED) or a callback's
        if failure is not None:
            exc = failure[0]
            span.record_exception(exc, timestamp=end)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        span.end(end_time=end)

    def close(self) -> None:
        """Stop tracing: the core's hooks back as they were, open spans ended now."""
        purgatory = self._purgatory
        purgatory._recorder = self.recorder
        purgatory._tracer = None
        spans, self._spans = self._spans, {}
        for span, _start, _since, _parent in spans.values():
            try:
                span.add_event(_EVENT_CLOSED)
                span.end()
            except Exception as exc:
                self._tracing._failed(exc)


class WaitTracing:
    """The tracing of waits that :func:`trace_waits` started; stop it with :meth:`close`.

    A context manager too: ``with trace_waits(p): ...`` stops it on the way out.
    """

    __slots__ = ("_failures", "_hooks", "_tracer")

    def __init__(self, hooks: list[_Hooks], tracer: trace.Tracer) -> None:
        self._hooks = hooks
        self._tracer = tracer
        self._failures = 0

    @property
    def purgatories(self) -> tuple[Purgatory[Any], ...]:
        """The purgatories whose waits are traced (empty once closed)."""
        return tuple(hooks._purgatory for hooks in self._hooks)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has been called."""
        return not self._hooks

    @property
    def failures(self) -> int:
        """How many times the tracer or exporter raised (each contained; the first logged)."""
        return self._failures

    def close(self) -> None:
        """Stop tracing; idempotent. Spans of operations still pending end now,
        with the event ``aiopurgatory.tracing_closed`` and no outcome.

        Call it on the purgatories' loop (or once it has stopped), as
        :func:`trace_waits`: the spans are kept by code that runs on the loop.
        """
        hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        names = ", ".join(repr(hooks._purgatory.name) for hooks in self._hooks)
        return f"<WaitTracing {names or 'closed'}>"

    def _failed(self, exc: Exception) -> None:
        self._failures += 1
        if self._failures == 1:  # once: a broken exporter would fail every wait
            _log.error("aiopurgatory.tracing_failed", error=repr(exc), exc_info=exc)


def trace_waits(
    *purgatories: Purgatory[Any], tracer_provider: TracerProvider | None = None
) -> WaitTracing:
    """Trace every watch on ``purgatories`` as a span, until the result is closed.

    Call it on the purgatories' loop (or before it runs). Watches made before
    are not traced; :meth:`WaitTracing.close` ends the spans still open.

    Args:
        purgatories: one or more purgatories, none traced already.
        tracer_provider: where the spans go; None for the global one
            (``opentelemetry.trace.set_tracer_provider``).

    Returns:
        A :class:`WaitTracing` (a context manager; ``close()`` stops it).

    Raises:
        TypeError: a purgatory is not an :class:`aiopurgatory.Purgatory`;
            ``tracer_provider`` has no ``get_tracer``.
        ValueError: no purgatory given, one given twice, or one already traced.
    """
    if not purgatories:
        raise ValueError("trace_waits() needs at least one Purgatory")
    seen: set[int] = set()
    for purgatory in purgatories:
        if not isinstance(purgatory, Purgatory):
            raise TypeError(
                f"purgatories must be aiopurgatory.Purgatory, got {type(purgatory).__name__}"
            )
        if id(purgatory) in seen:
            raise ValueError(f"purgatory {purgatory.name!r} is given twice")
        seen.add(id(purgatory))
        if purgatory._tracer is not None:
            raise ValueError(f"purgatory {purgatory.name!r} is already traced: close that first")
    if tracer_provider is not None and not callable(getattr(tracer_provider, "get_tracer", None)):
        raise TypeError(
            "tracer_provider must be an OpenTelemetry TracerProvider or None, "
            f"got {type(tracer_provider).__name__}"
        )
    tracer = trace.get_tracer(TRACER_NAME, __version__, tracer_provider)
    hooks: list[_Hooks] = []
    tracing = WaitTracing(hooks, tracer)
    for purgatory in purgatories:
        hook = _Hooks(tracing, purgatory)
        hooks.append(hook)
        purgatory._recorder = hook.finished
        purgatory._tracer = hook
    return tracing


# -- the trace context of a trigger, across processes ------------------------------------


def _sampled_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span if it is sampled, else None.

    What a transport sends with a trigger: nothing for an unsampled trace.
    """
    where = trace.get_current_span().get_span_context()
    if not (where.is_valid and where.trace_flags.sampled):
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, trace.set_span_in_context(trace.NonRecordingSpan(where)))
    return carrier.get("traceparent")


@contextmanager
def _triggered_from(traceparent: str) -> Iterator[None]:
    """Apply a trigger received with ``traceparent`` inside: its span is current there,
    so what it completes links to it. A malformed one is ignored."""
    remote = _W3C.extract({"traceparent": traceparent})
    if not trace.get_current_span(remote).get_span_context().is_valid:
        yield
        return
    token = otel_context.attach(remote)
    try:
        yield
    finally:
        otel_context.detach(token)
