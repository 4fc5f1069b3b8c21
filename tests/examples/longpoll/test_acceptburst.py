"""uvloop accepts one connection per loop iteration (docs/longpoll.md): pinned, and measured."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from examples.longpoll.acceptburst import main as acceptburst_main
from examples.longpoll.acceptq import accept_queue

uvloop = pytest.importorskip("uvloop")

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads the accept queue (Linux)")


class Made(asyncio.Protocol):
    """Counts connections made."""

    made = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        Made.made += 1


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    Made.made = 0
    sock = socket.create_server(("127.0.0.1", 0), backlog=256)
    yield sock
    sock.close()


def connect(listener: socket.socket, n: int) -> list[socket.socket]:
    """``n`` connections, completed and queued by the kernel (the loop does not run)."""
    port = listener.getsockname()[1]
    return [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]


def waiting(listener: socket.socket) -> int:
    found = accept_queue(listener)
    assert found is not None
    return found[0]


def run_uvloop(main: Callable[[], Any]) -> Any:
    return uvloop.run(main())


def test_uvloops_own_server_accepts_one_connection_per_loop_iteration(
    listener: socket.socket,
) -> None:
    # libuv/libuv#3696: if a uvloop release accepts more per iteration again, this
    # fails, and docs/longpoll.md's account of the accept queue needs redoing.
    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Made, sock=listener)
        clients = connect(listener, 20)
        for _ in range(5):
            await asyncio.sleep(0)  # one loop iteration each
        made, left = Made.made, waiting(listener)
        server.close()
        for client in clients:
            client.close()
        return made, left

    made, left = run_uvloop(main)
    assert made <= 6
    assert left >= 14


def test_asyncios_own_server_accepts_what_is_queued_at_once(listener: socket.socket) -> None:
    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Made, sock=listener)
        clients = connect(listener, 20)
        for _ in range(5):
            await asyncio.sleep(0)
        made, left = Made.made, waiting(listener)
        server.close()
        for client in clients:
            client.close()
        return made, left

    assert asyncio.run(main()) == (20, 0)


def test_the_burst_command_runs_and_prints_every_way(capsys: pytest.CaptureFixture[str]) -> None:
    assert acceptburst_main(["--connections", "20", "--busy-ms", "0.5", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    for way in ("asyncio ", "uvloop "):
        assert way in out
    assert out.count("accepted in") == 2
