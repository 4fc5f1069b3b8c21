"""An arq worker whose jobs are traced (``arq tests.jobs.arq_traced_app.WorkerSettings``).

The user's ``on_job_start`` hook starts a span per job and makes it current in
the task arq runs the job in; the user's ``on_job_end`` hook ends it, before arq
stores the result and runs ``after_job_end``, where :func:`publish_jobs`
publishes the end (in the context its own ``on_job_start``, chained after the
user's, kept). Spans go to the file named by ``AIOPURGATORY_JOBS_SPANS``
(:mod:`tests.jobs.spans`).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, ClassVar

from arq.connections import RedisSettings
from opentelemetry import context, trace

from aiopurgatory.jobs.arq import publish_jobs
from tests.jobs.arq_app import ready
from tests.jobs.spans import export_to

URL = os.environ.get("AIOPURGATORY_JOBS_REDIS", "redis://127.0.0.1:1/0")
_tracer = trace.get_tracer("arq-worker", tracer_provider=export_to())


async def start_span(ctx: dict[str, Any]) -> None:
    span = _tracer.start_span("arq job", attributes={"job.id": ctx["job_id"]})
    ctx["traced"] = (span, context.attach(trace.set_span_in_context(span)))


async def end_span(ctx: dict[str, Any]) -> None:
    traced = ctx.pop("traced", None)
    if traced is not None:
        span, token = traced
        context.detach(token)
        span.end()


async def nap(ctx: dict[str, Any], seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "rested"


async def fail_after(ctx: dict[str, Any], seconds: float) -> None:
    await asyncio.sleep(seconds)
    raise ValueError("failed on purpose")


class Settings:
    functions: ClassVar = [nap, fail_after]
    redis_settings = RedisSettings.from_dsn(URL)
    queue_name = "arq:traced"
    on_startup = ready
    on_job_start = start_span
    on_job_end = end_span
    poll_delay = 0.05
    max_jobs = 2
    max_tries = 1


WorkerSettings = publish_jobs(Settings, URL)
