"""Real PostgreSQL for the tests: a server per test, started from Debian's binaries.

``postgres_server`` starts PostgreSQL (Debian's ``postgresql`` package, binaries in
``/usr/lib/postgresql/<version>/bin``; :mod:`aiopurgatory.postgres.testing`) on a
free loopback port, in a temporary directory, and removes it at the end. A
machine without the binaries FAILS the test with the install instructions
(``make install`` installs the package where it can); it never skips.

:class:`Worker` runs ``python -m tests.support.postgres_worker`` (a purgatory with
a PostgresTriggers in another process), driven by JSON lines on its stdin and
reporting events as JSON lines on its stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import aiopurgatory as ap
from aiopurgatory.postgres import PostgresTriggers
from aiopurgatory.postgres.testing import PostgresMissing, PostgresServer

__all__ = [
    "PostgresServer",
    "Worker",
    "connected",
    "eventually",
    "parked",
    "postgres_server",
    "postgres_server_factory",
]

ROOT = Path(__file__).resolve().parents[2]

ServerFactory = Callable[..., PostgresServer]


@contextlib.asynccontextmanager
async def connected(dsn: str) -> AsyncIterator[Any]:
    """An asyncpg connection, closed however the block ends (an open one would
    hold uvloop's close forever after a failed test)."""
    import asyncpg

    connection = await asyncpg.connect(dsn)
    try:
        yield connection
    finally:
        await connection.close()


async def eventually(condition: Callable[[], bool], within: float = 10.0) -> None:
    """Poll ``condition`` until it holds; AssertionError after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def parked(
    triggers: PostgresTriggers, key: str, threshold: float, expiry: float = 30
) -> asyncio.Future[ap.Outcome]:
    """An op watched on ``{key: threshold}`` and the future of its outcome, returned
    once its partition is listened to and its catch-up read is done: what is
    committed from then on reaches it through its notification (or a resync)."""
    watching = asyncio.ensure_future(
        triggers.watch(ap.WatermarkOperation(expiry), {key: threshold})
    )
    listener = triggers._listener
    assert listener is not None
    await eventually(lambda: listener.covers([key]) and triggers._reader.idle)
    return watching


@pytest.fixture
def postgres_server_factory() -> Iterator[ServerFactory]:
    """Start PostgreSQL servers (``-c`` settings as keywords); all stopped at the end."""
    servers: list[PostgresServer] = []

    def start(**settings: str) -> PostgresServer:
        try:
            server = PostgresServer(**settings)
        except PostgresMissing as exc:
            pytest.fail(str(exc), pytrace=False)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.destroy()


@pytest.fixture
def postgres_server(postgres_server_factory: ServerFactory) -> PostgresServer:
    """A running PostgreSQL server (127.0.0.1, free port, fsync off), stopped at the end."""
    return postgres_server_factory()


class Worker:
    """``tests.support.postgres_worker`` in a subprocess: commands in, events out (JSON lines)."""

    def __init__(self, dsn: str, channel: str = "aiopurgatory", **options: Any) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        args = [sys.executable, "-m", "tests.support.postgres_worker", dsn, channel]
        args.append(json.dumps(options))
        self.proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.events: list[dict[str, Any]] = []

    async def start(self) -> dict[str, Any]:
        return await self.expect("ready", within=20)

    def send(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        self.proc.stdin.flush()

    async def expect(self, kind: str, *, within: float = 10, **fields: Any) -> dict[str, Any]:
        """Read events until one of ``kind`` with ``fields``; fail after ``within`` seconds."""
        assert self.proc.stdout is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"no {kind} {fields} event within {within} s: {self.events}")
            try:
                line = await asyncio.wait_for(
                    asyncio.to_thread(self.proc.stdout.readline), remaining
                )
            except TimeoutError:
                continue
            if not line:
                await asyncio.to_thread(self.proc.wait, 10)
                assert self.proc.stderr is not None
                raise AssertionError(f"worker exited: {self.proc.stderr.read().decode()}")
            event: dict[str, Any] = json.loads(line)
            self.events.append(event)
            if event["event"] == kind and all(event.get(k) == v for k, v in fields.items()):
                return event

    async def request(self, command: str, **fields: Any) -> dict[str, Any]:
        self.send(cmd=command, **fields)
        return await self.expect(command)

    async def close(self) -> int:
        if self.proc.poll() is None:
            self.send(cmd="exit")
            try:
                await asyncio.wait_for(asyncio.to_thread(self.proc.wait), 15)
            except TimeoutError:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return self.proc.returncode
