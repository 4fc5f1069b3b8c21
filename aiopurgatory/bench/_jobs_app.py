"""The web application of ``aiopurgatory bench jobs`` (served by ``uvicorn --workers N``).

``GET /wait/{id}`` waits for job ``id`` of the job system named by
``AIOPURGATORY_BENCH_SYSTEM`` (:mod:`._jobs_systems`) and answers with its
result:

* mode ``triggers``: through ``aiopurgatory.jobs`` (parked in the purgatory,
  woken by the worker's trigger, the result read once);
* mode ``poll``: what applications write without it: ask the job system
  (in a thread for a blocking client) every ``AIOPURGATORY_BENCH_POLL`` seconds
  until the job is done, then answer with its result.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .. import Purgatory
from ..redis import RedisTriggers
from ._jobs_systems import SYSTEMS

URL = os.environ.get("AIOPURGATORY_BENCH_REDIS", "redis://127.0.0.1:6379/0")
MODE = os.environ.get("AIOPURGATORY_BENCH_MODE", "triggers")
POLL = float(os.environ.get("AIOPURGATORY_BENCH_POLL", "0.25"))
SYSTEM = SYSTEMS[os.environ.get("AIOPURGATORY_BENCH_SYSTEM", "celery")]()
TIMEOUT = 120.0


async def wait(request: Request) -> JSONResponse:
    job_id = request.path_params["id"]
    if MODE == "triggers":
        return JSONResponse({"end": await SYSTEM.wait(job_id, TIMEOUT)})
    # The load client's requests arrive in one burst: a random phase, or every
    # poll would fall at the same instants (and a burst of job ends just before
    # one would be answered at once, just after one a whole interval late).
    pause = random.uniform(0, POLL)
    while True:
        done, value = await SYSTEM.poll_once(job_id)
        if done:
            return JSONResponse({"end": value})
        await asyncio.sleep(pause)  # polling is this mode's point: the baseline
        pause = POLL


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    if MODE != "triggers":
        await SYSTEM.start(URL, None)
        yield
        await SYSTEM.stop()
        return
    purgatory = Purgatory("bench-jobs")
    async with purgatory, RedisTriggers(purgatory, URL) as triggers:
        await SYSTEM.start(URL, triggers)
        yield
        await SYSTEM.stop()


app = Starlette(routes=[Route("/wait/{id}", wait)], lifespan=lifespan)
