"""A Celery app whose workers trace their tasks (``opentelemetry-instrumentation-celery``).

``celery -A tests.jobs.celery_traced_app worker``, with ``AIOPURGATORY_JOBS_SPANS``
naming the file its spans go to (:mod:`tests.jobs.spans`) and
``AIOPURGATORY_JOBS_INSTRUMENT`` saying when Celery is instrumented: ``"first"``
(before :func:`publish_jobs` connects its signals) or ``"last"`` (after). Celery
calls signal receivers in the order they were connected, so the two orders are
the two cases a publisher must handle.
"""

from __future__ import annotations

import os
import time

from celery import Celery
from opentelemetry.instrumentation.celery import CeleryInstrumentor

from aiopurgatory.jobs.celery import publish_jobs

# (celery_app's worker_ready receiver says when this worker is ready too)
from tests.jobs.celery_app import URL, configure
from tests.jobs.spans import export_to

app = configure(Celery("tests.jobs.celery_traced_app"), URL)


def instrument() -> None:
    CeleryInstrumentor().instrument(tracer_provider=export_to())


if os.environ.get("AIOPURGATORY_JOBS_INSTRUMENT") == "first":
    instrument()
publish_jobs(app, URL)
if os.environ.get("AIOPURGATORY_JOBS_INSTRUMENT") == "last":
    instrument()


@app.task
def nap(seconds: float) -> str:
    time.sleep(seconds)
    return "rested"


@app.task
def fail_after(seconds: float) -> None:
    time.sleep(seconds)
    raise ValueError("failed on purpose")
