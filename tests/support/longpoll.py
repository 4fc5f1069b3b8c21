"""Drive the long-poll example: its ASGI application in-process, without a network (virtual
time works), or the program in a subprocess (:class:`Program`)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, MutableMapping
from pathlib import Path
from typing import Any

from starlette.applications import Starlette

from examples.longpoll import Feed, Settings, make_waiter
from examples.longpoll.app import create_app

ROOT = Path(__file__).resolve().parents[2]


class Call:
    """One HTTP request to an ASGI app, run as a task; :meth:`disconnect` hangs up."""

    def __init__(
        self,
        app: Starlette,
        method: str,
        path: str,
        query: str = "",
        body: bytes = b"",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        self._body = body
        self._body_sent = False
        self._gone = asyncio.Event()
        self.status: int | None = None
        #: The response's headers (lower-case names).
        self.headers: dict[str, str] = {}
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
            "headers": [
                (b"host", b"test"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
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
            self.headers = {k.decode(): v.decode() for k, v in message.get("headers", [])}
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


class Program:
    """The server in a subprocess; ``port`` from its first log line."""

    def __init__(
        self, *args: str, env: dict[str, str] | None = None, stdout: int | None = None
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "examples.longpoll", "--port", "0", *args],
            cwd=ROOT,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stderr is not None
        #: Lines before ``longpoll.listening`` (``--workers``: each worker's own).
        self.early: list[dict[str, Any]] = []
        while True:
            line = self.proc.stderr.readline()
            try:
                first = json.loads(line)
            except ValueError:
                # Not started (bad arguments, say): reap it here, or its pipe and
                # process would be collected later, failing whichever test runs then.
                self.proc.kill()
                _, rest = self.proc.communicate(timeout=30)
                raise AssertionError(f"the server did not start: {line}{rest}") from None
            if first["event"] == "longpoll.listening":
                break
            self.early.append(first)
        self.first = first
        self.port: int = first["port"]

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def get_json(self, path: str, method: str = "GET", body: bytes | None = None) -> Any:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", body, method=method)
        with urllib.request.urlopen(req, timeout=30) as response:
            return json.loads(response.read())

    def metrics(self) -> dict[str, float]:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as response:
            text = response.read().decode()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def stop_and_read(self) -> str:
        """SIGTERM (unless it exited); the rest of its stderr, as text (for a failure's report)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=30)
        return err

    def stop(self) -> tuple[int, list[dict[str, Any]]]:
        """SIGTERM; the exit status and the log lines after the first."""
        err = self.stop_and_read()
        return self.proc.returncode, [json.loads(line) for line in err.splitlines()]


def wait_until(check: Callable[[], bool], what: str, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
