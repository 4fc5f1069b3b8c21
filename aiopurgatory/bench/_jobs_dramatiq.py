"""The Dramatiq broker and actor of ``aiopurgatory bench jobs`` (``dramatiq`` this module)."""

from __future__ import annotations

import os
import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends.redis import RedisBackend

from ..jobs.dramatiq import publish_jobs

URL = os.environ.get("AIOPURGATORY_BENCH_REDIS", "redis://127.0.0.1:6379/0")

# Dramatiq's constructors are not annotated.
broker = RedisBroker(url=URL)  # type: ignore[no-untyped-call]
backend = RedisBackend(url=URL)  # type: ignore[no-untyped-call]
broker.add_middleware(Results(backend=backend))  # type: ignore[no-untyped-call]
if os.environ.get("AIOPURGATORY_BENCH_MODE", "triggers") == "triggers":
    publish_jobs(broker, URL)
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True, max_retries=0, queue_name="bench")
def stamp() -> float:
    """The time (``time.time()``, seconds) at which the message's actor ended."""
    return time.time()
