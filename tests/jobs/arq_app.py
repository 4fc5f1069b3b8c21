"""The jobs and settings of the arq tests' real worker.

Started as ``arq tests.jobs.arq_app.WorkerSettings``.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any, ClassVar

from arq import Retry
from arq.connections import RedisSettings

from aiopurgatory.jobs.arq import publish_jobs, report_progress

URL = os.environ.get("AIOPURGATORY_JOBS_REDIS", "redis://127.0.0.1:1/0")


async def add(ctx: dict[str, Any], x: int, y: int) -> int:
    return x + y


async def fail(ctx: dict[str, Any], message: str) -> None:
    raise ValueError(message)


async def flaky(ctx: dict[str, Any], tries: int) -> int:
    """Asks arq to run it again until its ``tries``-th attempt; returns that attempt."""
    if ctx["job_try"] < tries:
        raise Retry(defer=0.05)
    return int(ctx["job_try"])


async def steps(ctx: dict[str, Any], count: int, seconds: float) -> int:
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
        Path(path).write_text(str(os.getpid()))  # noqa: ASYNC240 - once, at start


#: The list the user's own after_job_end hook appends each job id to.
ENDED = "aiopurgatory-test:arq:ended"


async def user_after_job_end(ctx: dict[str, Any]) -> None:
    """The user's own hook, which publish_jobs keeps (it runs first)."""
    await ctx["redis"].rpush(ENDED, ctx["job_id"])


class Settings:
    functions: ClassVar = [add, fail, flaky, steps, die]
    redis_settings = RedisSettings.from_dsn(URL)
    queue_name = os.environ.get("AIOPURGATORY_JOBS_QUEUE", "arq:queue")
    on_startup = ready
    after_job_end = user_after_job_end
    allow_abort_jobs = True
    poll_delay = 0.05
    max_jobs = 8
    max_tries = 3


WorkerSettings = publish_jobs(Settings, URL)
