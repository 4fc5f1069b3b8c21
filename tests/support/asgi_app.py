"""The application tests/asgi/test_asgi_servers.py serves under real servers (uvicorn, gunicorn's
uvicorn workers, hypercorn): Starlette, wrapped in CancelOnDisconnect, with
release_on_shutdown in its lifespan.

``GET /wait?timeout=S`` parks an operation that only its timeout, a hang-up or the
shutdown ends, and answers ``{"outcome": ...}``; ``GET /pending`` answers this
process's ``{"pid": ..., "pending": ...}``. With ``ASGI_TEST_EVENTS`` set to a file,
each process appends JSON lines there (``started``, ``parked``, ``withdrawn``, with
its pid, ``time.monotonic()`` and the purgatory's pending count): the test's clock
and the servers' are the same (CLOCK_MONOTONIC), so it times a hang-up's withdrawal
in whichever worker held it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import aiopurgatory as ap
from aiopurgatory.asgi import CancelOnDisconnect, release_on_shutdown

__all__ = ["EVENTS_ENV", "app"]

EVENTS_ENV = "ASGI_TEST_EVENTS"


class Wait(ap.DelayedOperation):
    """Nothing completes it: its timeout, a cancel or the shutdown ends it."""

    def try_complete(self) -> bool:
        return False


purgatory: ap.Purgatory[Wait] = ap.Purgatory("web")


def record(event: str, **fields: Any) -> None:
    path = os.environ.get(EVENTS_ENV)
    if path is None:
        return
    line = json.dumps({"event": event, "pid": os.getpid(), "t": time.monotonic(), **fields})
    # One write of one short line in append mode: whole, whatever the other workers write.
    with open(path, "a", encoding="utf-8") as file:
        file.write(line + "\n")


async def wait(request: Request) -> Response:
    timeout = float(request.query_params.get("timeout", "30"))
    op = Wait(timeout)
    record("parked", pending=purgatory.pending + 1)
    try:
        outcome = await purgatory.watch(op, ["job"])
    except ap.PurgatoryClosedError:
        return JSONResponse({"error": "shutting down"}, status_code=503)
    except asyncio.CancelledError:
        assert op.outcome is not None
        record("withdrawn", pending=purgatory.pending, outcome=op.outcome.value)
        raise
    return JSONResponse({"outcome": outcome.value, "pid": os.getpid()})


async def pending(request: Request) -> Response:
    return JSONResponse({"pid": os.getpid(), "pending": purgatory.pending})


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    async with release_on_shutdown(purgatory), purgatory:
        record("started")
        yield


app = CancelOnDisconnect(
    Starlette(routes=[Route("/wait", wait), Route("/pending", pending)], lifespan=lifespan)
)
