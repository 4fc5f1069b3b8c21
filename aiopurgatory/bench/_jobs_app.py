"""The web application of ``aiopurgatory bench jobs`` (served by ``uvicorn --workers N``).

``GET /wait/{id}`` waits for job ``id`` of the job system named by
``AIOPURGATORY_BENCH_SYSTEM`` (:mod:`._jobs_systems`) and answers with its
result:

* mode ``triggers``: through ``aiopurgatory.jobs`` (parked in the purgatory,
  woken by the worker's trigger, the result read once);
* mode ``poll``: what applications write without it: ask the job system
  (in a thread for a blocking client) every ``AIOPURGATORY_BENCH_POLL`` seconds
  until the job is done, then answer with its result.

A wait not answered within ``AIOPURGATORY_BENCH_TIMEOUT`` seconds (120) gets a
504 (``{"error": "timeout"}``); a wait that raised, a 500 naming the exception's
class (the benchmark counts them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .. import Purgatory
from ..jobs import JobTimeoutError
from ..redis import RedisTriggers
from ._jobs_systems import SYSTEMS

URL = os.environ.get("AIOPURGATORY_BENCH_REDIS", "redis://127.0.0.1:6379/0")
MODE = os.environ.get("AIOPURGATORY_BENCH_MODE", "triggers")
POLL = float(os.environ.get("AIOPURGATORY_BENCH_POLL", "0.25"))
SYSTEM = SYSTEMS[os.environ.get("AIOPURGATORY_BENCH_SYSTEM", "celery")]()
TIMEOUT = float(os.environ.get("AIOPURGATORY_BENCH_TIMEOUT", "120"))


async def wait(request: Request) -> JSONResponse:
    job_id = request.path_params["id"]
    if MODE == "triggers":
        try:
            return JSONResponse({"end": await SYSTEM.wait(job_id, TIMEOUT)})
        except JobTimeoutError:
            return JSONResponse({"error": "timeout"}, status_code=504)
        except Exception as exc:  # answered, not hidden: the benchmark counts each kind
            return JSONResponse({"error": type(exc).__name__}, status_code=500)
    # The load client's requests arrive in one burst: a random phase, or every
    # poll would fall at the same instants (and a burst of job ends just before
    # one would be answered at once, just after one a whole interval late).
    pause = random.uniform(0, POLL)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            done, value = await SYSTEM.poll_once(job_id)
        except Exception:  # Redis away (--restart-redis): a poller asks again
            done, value = False, None
        if done:
            return JSONResponse({"end": value})
        await asyncio.sleep(pause)  # polling is this mode's point: the baseline
        pause = POLL
    return JSONResponse({"error": "timeout"}, status_code=504)


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
