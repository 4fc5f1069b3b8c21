"""The tasks of the Procrastinate tests' real worker
(``python -m procrastinate --app tests.jobs.procrastinate_app.app worker``).

No aiopurgatory code here: the job ends are published by the database trigger
that ``aiopurgatory.jobs.procrastinate.install`` puts on Procrastinate's table.
"""

from __future__ import annotations

import asyncio
import os

import procrastinate
from procrastinate.job_context import JobContext

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=os.environ.get("AIOPURGATORY_JOBS_POSTGRES", "postgresql://127.0.0.1:1/none")
    )
)


@app.task(name="add")
async def add(x: int, y: int) -> int:
    return x + y


@app.task(name="fail")
async def fail(message: str) -> None:
    raise ValueError(message)


@app.task(name="flaky", retry=2)
async def flaky(seconds: float) -> None:
    """Fails on every attempt (three), each after ``seconds``."""
    await asyncio.sleep(seconds)
    raise RuntimeError("flaky")


@app.task(name="sleep")
async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@app.task(name="slow_once", pass_context=True)
async def slow_once(context: JobContext, seconds: float) -> int:
    """Sleeps ``seconds`` on its first attempt only (long enough for its worker to be killed)."""
    assert context.job is not None
    if context.job.attempts == 0:
        await asyncio.sleep(seconds)
    return context.job.attempts
