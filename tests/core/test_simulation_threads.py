"""Virtual time stands still while anyio's worker threads run a call.

FastAPI and Starlette run sync dependencies and endpoints through
``anyio.to_thread.run_sync``, on anyio's own worker threads, not through the
loop's executor. Before the virtual-time loop watched those threads, a handler
behind a sync dependency ran at the next timer's instant (t=30 instead of t=0)
because the clock jumped while the thread worked.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from fastapi import Depends, FastAPI

from aiopurgatory import simulation


def now() -> float:
    return asyncio.get_running_loop().time()


def test_anyio_still_keeps_its_workers_where_the_loop_looks() -> None:
    # The loop reads anyio internals (no public API says "a worker is busy"): if
    # an anyio release moves them, this fails first, and says where to look.
    from anyio import lowlevel
    from anyio._backends import _asyncio

    assert hasattr(lowlevel, "_run_vars"), "anyio.lowlevel._run_vars is gone"
    assert hasattr(_asyncio, "_threadpool_workers"), "anyio's _threadpool_workers is gone"
    assert hasattr(_asyncio, "_threadpool_idle_workers"), "anyio's _threadpool_idle_workers is gone"


def test_the_clock_stands_still_while_an_anyio_worker_thread_runs() -> None:
    async def main() -> tuple[float, float]:
        sleeper = asyncio.ensure_future(asyncio.sleep(30))
        await anyio.to_thread.run_sync(time.sleep, 0.05)
        during = now()
        await sleeper
        return during, now()

    during, after = simulation.run(main())
    assert during == 0.0
    assert after == 30.0


def test_many_calls_in_worker_threads_take_no_virtual_time() -> None:
    async def main() -> float:
        timer = asyncio.ensure_future(asyncio.sleep(5))
        async with anyio.create_task_group() as group:
            for _ in range(8):
                group.start_soon(anyio.to_thread.run_sync, time.sleep, 0.01)
        t = now()
        timer.cancel()
        return t

    assert simulation.run(main()) == 0.0


def slow_answer() -> str:
    time.sleep(0.05)
    return "done"


def test_a_timeout_around_a_worker_thread_does_not_expire_while_it_works() -> None:
    async def main() -> tuple[str, float]:
        with anyio.fail_after(1):
            result = await anyio.to_thread.run_sync(slow_answer)
            await anyio.lowlevel.checkpoint()  # an expired deadline would raise here
        return result, now()

    assert simulation.run(main()) == ("done", 0.0)


def test_idle_worker_threads_let_the_clock_jump_again() -> None:
    async def main() -> float:
        await anyio.to_thread.run_sync(time.sleep, 0)
        await asyncio.sleep(3600)  # the worker is idle now: no waiting for it
        return now()

    started = time.monotonic()
    assert simulation.run(main()) == 3600.0
    assert time.monotonic() - started < 60  # jumped; did not sleep an hour


def settings() -> dict[str, float]:
    """A sync dependency: FastAPI runs it in anyio's thread pool."""
    time.sleep(0.02)
    return {"limit": 1.0}


async def now_handler(config: Annotated[dict[str, float], Depends(settings)]) -> dict[str, float]:
    return {"now": now(), "limit": config["limit"]}


@pytest.mark.virtual_time
async def test_a_fastapi_handler_behind_a_sync_dependency_runs_at_the_current_instant() -> None:
    app = FastAPI()
    app.get("/now")(now_handler)
    # Something else waits for t=30 (a parked request's timeout, say).
    other = asyncio.ensure_future(asyncio.sleep(30))
    status, body = await call_asgi(app, "/now")
    other.cancel()
    assert status == 200
    assert body == b'{"now":0.0,"limit":1.0}'


async def call_asgi(app: Any, path: str) -> tuple[int, bytes]:
    """One GET through an ASGI app, in process (no network on a virtual-time loop)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test")],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }
    sent: list[dict[str, Any]] = []
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # no disconnect while the request runs
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], body
