"""The arq job and worker settings of ``aiopurgatory bench jobs``.

Its worker runs ``arq aiopurgatory.bench._jobs_arq.WorkerSettings``. arq pins
redis-py below 6: the benchmark runs arq from a venv with it (``make test-arq``'s
``.venv-arq``).
"""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar

from arq.connections import RedisSettings

from ..jobs.arq import publish_jobs

URL = os.environ.get("AIOPURGATORY_BENCH_REDIS", "redis://127.0.0.1:6379/0")
QUEUE = "bench"


async def stamp(ctx: dict[str, Any]) -> float:
    """The time (``time.time()``, seconds) at which the job ended."""
    return time.time()


class _Settings:
    functions: ClassVar[list[Any]] = [stamp]
    redis_settings = RedisSettings.from_dsn(URL)
    queue_name = QUEUE
    # As saq's concurrency; arq's worker looks for queued jobs every poll_delay
    # (0.5 s by default): that delays a job's start, never its end's answer.
    max_jobs = 20
    poll_delay = 0.05


WorkerSettings: Any = _Settings
if os.environ.get("AIOPURGATORY_BENCH_MODE", "triggers") == "triggers":
    WorkerSettings = publish_jobs(_Settings, URL)
