"""The broker and actors of the Dramatiq tests' real worker.

The worker runs ``dramatiq tests.jobs.dramatiq_app``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends.redis import RedisBackend

from aiopurgatory.jobs.dramatiq import publish_jobs, report_progress

URL = os.environ.get("AIOPURGATORY_JOBS_REDIS", "redis://127.0.0.1:1/0")


class Ready(dramatiq.Middleware):
    """Says when the worker is up (for the tests' fixture)."""

    def after_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
        ready = os.environ.get("AIOPURGATORY_JOBS_READY")
        if ready:
            Path(ready).write_text(str(os.getpid()))


broker = RedisBroker(url=URL)
backend = RedisBackend(url=URL)
broker.add_middleware(Results(backend=backend))
publish_jobs(broker, URL)  # the opt-in, once Results is there
broker.add_middleware(Ready())
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True, max_retries=0)
def add(x: int, y: int) -> int:
    return x + y


@dramatiq.actor(store_results=True, max_retries=0)
def fail(message: str) -> None:
    raise ValueError(message)


@dramatiq.actor(store_results=True, max_retries=2, min_backoff=10, max_backoff=20)
def fail_retried(message: str) -> None:
    raise ValueError(message)


@dramatiq.actor(store_results=True, max_retries=0)
def steps(count: int, seconds: float) -> int:
    """Reports progress 1..count, one step every ``seconds``; returns ``count``."""
    for step in range(1, count + 1):
        time.sleep(seconds)
        report_progress(step)
    return count


@dramatiq.actor(store_results=True, max_retries=0, queue_name="lone")
def die() -> None:
    """Kills the worker process running it."""
    os.kill(os.getpid(), signal.SIGKILL)
