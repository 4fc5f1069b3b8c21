"""The saq job and worker settings of ``aiopurgatory bench jobs``.

Its worker runs ``saq aiopurgatory.bench._jobs_saq.settings``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from saq import Queue

from ..jobs.saq import publish_jobs

URL = os.environ.get("AIOPURGATORY_BENCH_REDIS", "redis://127.0.0.1:6379/0")


async def stamp(ctx: dict[str, Any]) -> float:
    """The time (``time.time()``, seconds) at which the job ended."""
    return time.time()


settings: dict[str, Any] = {
    "queue": Queue.from_url(URL, name="bench"),
    "functions": [stamp],
    "concurrency": 20,
}
if os.environ.get("AIOPURGATORY_BENCH_MODE", "triggers") == "triggers":
    settings = publish_jobs(settings, URL)
