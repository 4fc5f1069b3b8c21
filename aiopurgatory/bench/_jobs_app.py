"""The web application of ``aiopurgatory bench jobs`` (served by ``uvicorn --workers N``).

``GET /wait/{id}`` waits for Celery task ``id`` and answers with its result:

* mode ``triggers``: ``CeleryJobs.wait`` (parked in the purgatory, woken by the
  worker's trigger, the result read once, in a thread);
* mode ``poll``: what applications write without it: read ``AsyncResult.state``
  (in a thread: Celery's client blocks) every ``AIOPURGATORY_BENCH_POLL``
  seconds until the task is ready, then its result.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .. import Purgatory
from ..jobs.celery import CeleryJobs
from ..redis import RedisTriggers
from ._jobs_tasks import URL
from ._jobs_tasks import app as celery_app

MODE = os.environ.get("AIOPURGATORY_BENCH_MODE", "triggers")
POLL = float(os.environ.get("AIOPURGATORY_BENCH_POLL", "0.25"))
TIMEOUT = 120.0
# Threads reading results at once; anyio's default (40) would queue a burst.
LIMITER = anyio.CapacityLimiter(64)


def _result(task_id: str) -> Any:
    result = celery_app.AsyncResult(task_id)
    return result.result if result.state == "SUCCESS" else None


def _ready(task_id: str) -> bool:
    return bool(celery_app.AsyncResult(task_id).ready())


async def wait(request: Request) -> JSONResponse:
    task_id = request.path_params["id"]
    if MODE == "triggers":
        jobs: CeleryJobs = request.app.state.jobs
        return JSONResponse({"end": await jobs.wait(task_id, timeout=TIMEOUT)})
    # Polling is the point of this mode (the baseline): no event to wait for.
    while not await anyio.to_thread.run_sync(_ready, task_id, limiter=LIMITER):  # noqa: ASYNC110
        await asyncio.sleep(POLL)
    return JSONResponse({"end": await anyio.to_thread.run_sync(_result, task_id, limiter=LIMITER)})


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    if MODE != "triggers":
        yield
        return
    purgatory = Purgatory("bench-jobs")
    async with purgatory, RedisTriggers(purgatory, URL) as triggers:
        app.state.jobs = CeleryJobs(triggers, celery_app, limiter=LIMITER)
        yield


app = Starlette(routes=[Route("/wait/{id}", wait)], lifespan=lifespan)
