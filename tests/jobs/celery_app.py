"""The Celery app the tests' real workers run (``celery -A tests.jobs.celery_app worker``).

Its broker, result backend and publisher are the Redis of
``AIOPURGATORY_JOBS_REDIS`` (the test module's). The test process sends tasks by
name from a client app of its own (:func:`client`).
"""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path
from typing import Any

from celery import Celery, signals

from aiopurgatory.jobs.celery import publish_jobs, report_progress

URL = os.environ.get("AIOPURGATORY_JOBS_REDIS", "redis://127.0.0.1:1/0")


def configure(app: Celery, url: str) -> Celery:
    app.conf.update(
        broker_url=url,
        result_backend=url,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        task_track_started=True,
        # a Redis restarted under the worker: it reconnects and goes on
        broker_connection_max_retries=None,
        result_backend_always_retry=True,
        result_backend_max_retries=30,
        # A message a worker had fetched when Redis went away is redelivered
        # after visibility_timeout (an hour by default): 5 s here, looked for
        # every second, so that the Redis restart test's tasks all run.
        broker_transport_options={
            "visibility_timeout": 5,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        },
    )
    return app


app = configure(Celery("tests.jobs.celery_app"), URL)
publish_jobs(app, URL)


def client(url: str) -> Celery:
    """A client app of the tests' Redis, to read results (CeleryJobs) and control workers."""
    return configure(Celery("tests-client"), url)


@functools.cache
def sender(url: str) -> Celery:
    """An app that sends tasks by name, with no result backend: Celery's Redis backend
    subscribes the sending process to each task's result channel (for a later
    ``get()``) and unsubscribes when the ``AsyncResult`` is collected, which
    fails if that is after Redis went away (an error in ``__del__``)."""
    app = configure(Celery("tests-sender"), url)
    app.conf.result_backend = None
    return app


@signals.worker_ready.connect
def _ready(**_: Any) -> None:
    ready = os.environ.get("AIOPURGATORY_JOBS_READY")
    if ready:
        Path(ready).write_text(str(os.getpid()))


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task
def fail(message: str) -> None:
    raise ValueError(message)


@app.task
def steps(count: int, seconds: float) -> int:
    """Reports progress 1..count, one step every ``seconds``; returns ``count``."""
    for step in range(1, count + 1):
        time.sleep(seconds)
        report_progress(step)
    return count


@app.task
def die() -> None:
    """Kills its own process (a prefork child): the worker loses the task."""
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(acks_late=True, reject_on_worker_lost=True)
def die_once(marker: str) -> str:
    """Dies the first time (``marker`` does not exist yet), succeeds when redelivered."""
    path = Path(marker)
    if not path.exists():
        path.write_text("died")
        os.kill(os.getpid(), signal.SIGKILL)
    return "second run"


@app.task(autoretry_for=(RuntimeError,), max_retries=3, default_retry_delay=0.1)
def flaky(marker: str, failures: int) -> int:
    """Fails ``failures`` times (counted in ``marker``), then returns the attempt number."""
    path = Path(marker)
    attempt = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(attempt))
    if attempt <= failures:
        raise RuntimeError(f"attempt {attempt} failed")
    return attempt
