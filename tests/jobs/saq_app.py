"""The jobs and settings of the saq tests' real worker (``saq tests.jobs.saq_app.settings``)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from saq import Queue

from aiopurgatory.jobs.saq import publish_jobs, report_progress

URL = os.environ.get("AIOPURGATORY_JOBS_REDIS", "redis://127.0.0.1:1/0")


async def add(ctx: dict[str, Any], *, x: int, y: int) -> int:
    return x + y


async def fail(ctx: dict[str, Any], *, message: str) -> None:
    raise ValueError(message)


async def steps(ctx: dict[str, Any], *, count: int, seconds: float) -> int:
    """Reports progress 1..count, one step every ``seconds``; returns ``count``."""
    for step in range(1, count + 1):
        await asyncio.sleep(seconds)
        report_progress(ctx, step)
    return count


async def die(ctx: dict[str, Any]) -> None:
    """Kills the worker process running it."""
    os.kill(os.getpid(), signal.SIGKILL)


async def ready(ctx: dict[str, Any]) -> None:
    path = os.environ.get("AIOPURGATORY_JOBS_READY")
    if path:
        # saq runs its upkeep after the startup hooks, and its first sweep at once:
        # a job dequeued while that sweep reads the active list, its status not yet
        # "active", is aborted as "swept" (saq's race). Say "ready" after it.
        asyncio.get_running_loop().call_later(1.0, _ready, path)


def _ready(path: str) -> None:
    Path(path).write_text(str(os.getpid()))


settings = publish_jobs(
    {
        "queue": Queue.from_url(URL, name=os.environ.get("AIOPURGATORY_JOBS_QUEUE", "jobs")),
        "functions": [add, fail, steps, die],
        "concurrency": 4,
        "startup": ready,
    },
    URL,
)
