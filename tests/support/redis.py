"""Real Redis for the tests: a ``redis-server`` per test, and a worker process.

``redis_server`` starts Debian's ``redis-server`` on a free port in the test's
temporary directory and kills it at the end. A machine without redis-server
FAILS the test with the install instructions (``make install`` installs it where
it can); it never skips.

:class:`Worker` runs ``python -m tests.support.redis_worker`` (a purgatory with a
RedisTriggers in another process), driven by JSON lines on its stdin and
reporting events as JSON lines on its stdout.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from aiopurgatory.redis.testing import RedisServer, RedisServerMissing

ROOT = Path(__file__).resolve().parents[2]

ServerFactory = Callable[..., RedisServer]


@pytest.fixture
def redis_server_factory(tmp_path: Path) -> Iterator[ServerFactory]:
    """Start redis-servers (``password=``, ``extra_args=``); all are killed at the end."""
    servers: list[RedisServer] = []

    def start(**options: Any) -> RedisServer:
        try:
            server = RedisServer(tmp_path / f"redis-{len(servers)}", **options)
        except RedisServerMissing as exc:
            pytest.fail(str(exc), pytrace=False)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.kill()


@pytest.fixture
def redis_server(redis_server_factory: ServerFactory) -> RedisServer:
    """A running redis-server (127.0.0.1, free port, AOF fsynced always), killed at the end."""
    return redis_server_factory()


@pytest_asyncio.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """A plain redis-py client of ``redis_server``, to look at what the library did."""
    client = aioredis.from_url(redis_server.url)
    yield client
    await client.aclose()


def encode_key(key: str | bytes | int) -> list[Any]:
    """A key as JSON for the worker: ``["s", str]``, ``["i", int]`` or ``["b", hex]``."""
    if isinstance(key, str):
        return ["s", key]
    if isinstance(key, bytes):
        return ["b", key.hex()]
    return ["i", key]


def decode_key(item: list[Any]) -> str | bytes | int:
    kind, value = item
    if kind == "b":
        return bytes.fromhex(value)
    return value  # type: ignore[no-any-return]


class Worker:
    """``tests.support.redis_worker`` in a subprocess: commands in, events out (JSON lines)."""

    def __init__(self, url: str, channel: str, *, loop: str = "asyncio", **options: Any) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        args = [sys.executable, "-m", "tests.support.redis_worker", url, channel, loop]
        if options:
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

    async def _readline(self, within: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), within)
        if not line:
            await asyncio.to_thread(self.proc.wait, 10)
            raise AssertionError(f"worker exited: {self.stderr()}")
        event: dict[str, Any] = json.loads(line)
        self.events.append(event)
        return event

    async def expect(self, kind: str, *, within: float = 10, **fields: Any) -> dict[str, Any]:
        """Read events until one of ``kind`` with ``fields``; fail after ``within`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"no {kind} {fields} event within {within} s: {self.events}")
            event = await self._readline(remaining)
            if event["event"] == kind and all(event.get(k) == v for k, v in fields.items()):
                return event

    async def request(self, command: str, **fields: Any) -> dict[str, Any]:
        self.send(cmd=command, **fields)
        return await self.expect(command)

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace")

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


async def write_on_a_closed_uvloop_transport(wrap: Callable[[], Any]) -> BaseException:
    """The error uvloop raises for a write on a connection that has closed, through ``wrap``."""
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.transport.close()
        await asyncio.sleep(0.01)  # the loop closes the handle
        try:
            with wrap():
                writer.writelines([b"PING\r\n"])
        except BaseException as exc:
            return exc
        raise AssertionError("the write on a closed transport did not raise")
    finally:
        server.close()
        await server.wait_closed()
        await asyncio.sleep(0.01)  # the server's side of the connection closes too
