"""The Celery app of ``aiopurgatory bench jobs`` (its worker runs ``celery -A`` this module).

One task, ``stamp``: it returns the wall-clock time at which it ended, which the
benchmark compares with the time the waiting HTTP request was answered.
"""

from __future__ import annotations

import os
import time

from celery import Celery

from ..jobs.celery import publish_jobs

URL = os.environ.get("AIOPURGATORY_BENCH_REDIS", "redis://127.0.0.1:6379/0")

app = Celery("aiopurgatory-bench-jobs", broker=URL, backend=URL)
app.conf.update(worker_prefetch_multiplier=4, broker_connection_retry_on_startup=True)
if os.environ.get("AIOPURGATORY_BENCH_MODE", "triggers") == "triggers":
    publish_jobs(app, URL)


@app.task(name="bench.stamp")  # type: ignore[untyped-decorator]  # Celery has no types
def stamp() -> float:
    """The time (``time.time()``, seconds) at which the task ended."""
    return time.time()
