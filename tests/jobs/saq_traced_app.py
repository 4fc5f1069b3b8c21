"""A saq worker whose jobs are traced (``saq tests.jobs.saq_traced_app.settings``).

A ``before_process`` hook starts a span per job and makes it current in saq's
task processing the job; an ``after_process`` hook ends it. Both are in the
settings given to :func:`publish_jobs`, which adds its hooks after them: its
``after_process`` runs once this one ended the span. Spans go to the file named
by ``AIOPURGATORY_JOBS_SPANS`` (:mod:`tests.jobs.spans`).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from opentelemetry import context, trace
from saq import Queue

from aiopurgatory.jobs.saq import publish_jobs
from tests.jobs.saq_app import ready
from tests.jobs.spans import export_to

URL = os.environ.get("AIOPURGATORY_JOBS_REDIS", "redis://127.0.0.1:1/0")
_tracer = trace.get_tracer("saq-worker", tracer_provider=export_to())


async def start_span(ctx: dict[str, Any]) -> None:
    job = ctx["job"]
    span = _tracer.start_span(f"saq {job.function}", attributes={"job.key": job.key})
    ctx["traced"] = (span, context.attach(trace.set_span_in_context(span)))


async def end_span(ctx: dict[str, Any]) -> None:
    traced = ctx.pop("traced", None)
    if traced is not None:
        span, token = traced
        context.detach(token)
        span.end()


async def nap(ctx: dict[str, Any], *, seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "rested"


async def fail_after(ctx: dict[str, Any], *, seconds: float) -> None:
    await asyncio.sleep(seconds)
    raise ValueError("failed on purpose")


settings = publish_jobs(
    {
        "queue": Queue.from_url(URL, name="traced"),
        "functions": [nap, fail_after],
        "concurrency": 2,
        "startup": ready,
        "before_process": start_span,
        "after_process": end_span,
    },
    URL,
)
