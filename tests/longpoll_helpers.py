"""Drive the long-poll ASGI application in-process, without a network (virtual time works)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

from starlette.applications import Starlette

from examples.longpoll import Feed, Settings, make_waiter
from examples.longpoll.app import create_app


class Call:
    """One HTTP request to an ASGI app, run as a task; :meth:`disconnect` hangs up."""

    def __init__(
        self, app: Starlette, method: str, path: str, query: str = "", body: bytes = b""
    ) -> None:
        self._body = body
        self._body_sent = False
        self._gone = asyncio.Event()
        self.status: int | None = None
        self.content = bytearray()
        self.complete = False
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(b"host", b"test"), (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 80),
        }
        self.task = asyncio.create_task(app(scope, self._receive, self._send))

    async def _receive(self) -> dict[str, Any]:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: MutableMapping[str, Any]) -> None:
        if self._gone.is_set():
            return  # as uvicorn: nothing reaches a client that hung up
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.content += message.get("body", b"")
            self.complete = not message.get("more_body", False)

    def disconnect(self) -> None:
        """The client hangs up."""
        self._gone.set()

    async def result(self) -> tuple[int, Any]:
        """Wait for the response: its status and its JSON body."""
        await self.task
        assert self.complete
        assert self.status is not None
        return self.status, json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode()


async def request(
    app: Starlette, method: str, path: str, query: str = "", body: bytes = b""
) -> tuple[int, Any]:
    """One request, awaited."""
    return await Call(app, method, path, query, body).result()


@contextlib.asynccontextmanager
async def running(waiter: str, settings: Settings | None = None) -> AsyncIterator[Starlette]:
    """The application with its lifespan entered (the waiter's ``async with``)."""
    app = create_app(settings, make_waiter(waiter))
    async with app.router.lifespan_context(app):
        yield app


def feed_of(app: Starlette) -> Feed:
    feed: Feed = app.state.feed
    return feed


async def settle() -> None:
    """Let every ready callback run (virtual time does not move: nothing sleeps)."""
    for _ in range(20):
        await asyncio.sleep(0)
