"""A Dramatiq broker whose worker traces each message (``dramatiq tests.jobs.dramatiq_traced_app``).

A middleware starts a span in ``before_process_message`` and ends it in
``after_process_message``/``after_skip_message``, as Dramatiq's tracing
middlewares do, added to the broker before :func:`publish_jobs` (Dramatiq runs
the ``after_*`` hooks in reverse order: this one's end comes after the
publisher's). Its spans go to the file named by ``AIOPURGATORY_JOBS_SPANS``
(:mod:`tests.jobs.spans`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends.redis import RedisBackend
from opentelemetry import context, trace

from aiopurgatory.jobs.dramatiq import publish_jobs
from tests.jobs.spans import export_to

URL = os.environ.get("AIOPURGATORY_JOBS_REDIS", "redis://127.0.0.1:1/0")


class Tracing(dramatiq.Middleware):
    """A span per message processed, current in the worker thread while it is."""

    def __init__(self) -> None:
        provider = export_to()
        self.tracer = trace.get_tracer("dramatiq-worker", tracer_provider=provider)
        self.open: dict[str, tuple[trace.Span, object]] = {}

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        span = self.tracer.start_span(
            f"dramatiq {message.actor_name}", attributes={"message.id": message.message_id}
        )
        token = context.attach(trace.set_span_in_context(span))
        self.open[message.message_id] = (span, token)

    def after_process_message(
        self, broker: dramatiq.Broker, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        self._end(message)

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        self._end(message)

    def _end(self, message: Any) -> None:
        opened = self.open.pop(message.message_id, None)
        if opened is not None:
            span, token = opened
            context.detach(token)  # type: ignore[arg-type]
            span.end()


class Ready(dramatiq.Middleware):
    def after_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
        ready = os.environ.get("AIOPURGATORY_JOBS_READY")
        if ready:
            Path(ready).write_text(str(os.getpid()))


broker = RedisBroker(url=URL)
backend = RedisBackend(url=URL)
broker.add_middleware(Tracing())
broker.add_middleware(Results(backend=backend))
publish_jobs(broker, URL)
broker.add_middleware(Ready())
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True, max_retries=0, queue_name="traced")
def nap(seconds: float) -> str:
    time.sleep(seconds)
    return "rested"


@dramatiq.actor(store_results=True, max_retries=0, queue_name="traced")
def fail_after(seconds: float) -> None:
    time.sleep(seconds)
    raise ValueError("failed on purpose")
