"""How long a server takes to accept a burst of connections while its loop is busy.

``python -m examples.longpoll.acceptburst [--connections 300] [--busy-ms 2] [--rounds 3]``

Each round, in a fresh process per loop: a server listens; a callback keeps the
loop busy for ``--busy-ms`` per iteration (what a long-poll server's reads,
answers and tasks cost it); ``--connections`` clients connect (the kernel
completes their handshakes and queues them); the time until the server has
accepted them all is printed, for asyncio's loop and for uvloop, each with its
own server (``loop.create_server``, as uvicorn serves).

Since libuv 1.45 (libuv/libuv#3696, in every uvloop since 0.18) a libuv server
accepts one connection each time its loop polls the listening socket; asyncio's
selector loop accepts up to the server's backlog. On a loop whose iterations are
not short, uvloop's accept rate is its iteration rate (docs/longpoll.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time

__all__ = ["WAYS", "main", "measure"]

#: The loops compared.
WAYS = ("asyncio", "uvloop")


async def _burst(connections: int, busy_s: float) -> float:
    loop = asyncio.get_running_loop()
    accepted = 0
    done: asyncio.Future[float] = loop.create_future()

    class Count(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            nonlocal accepted
            accepted += 1
            if accepted == connections:
                done.set_result(time.perf_counter())

    backlog = max(connections, 128)  # room for the whole burst in the kernel's queue
    listener = socket.create_server(("127.0.0.1", 0), backlog=backlog)
    port = listener.getsockname()[1]
    serving = await loop.create_server(Count, sock=listener, backlog=backlog)
    busy = True

    def iteration() -> None:  # one loop iteration's worth of other work
        end = time.perf_counter() + busy_s
        while time.perf_counter() < end:
            pass
        if busy:
            loop.call_soon(iteration)

    loop.call_soon(iteration)
    await asyncio.sleep(0.05)
    # Blocking connects from this thread: the loop does not run meanwhile, so every
    # connection is queued in the kernel when the clock starts.
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
    start = time.perf_counter()
    took = await done - start
    busy = False
    for client in clients:
        client.close()
    serving.close()
    listener.close()
    return took


def measure(way: str, connections: int, busy_ms: float) -> float:
    """Seconds to accept ``connections`` queued at once on loop ``way``, in this process."""
    run = _burst(connections, busy_ms / 1000.0)
    if way == "uvloop":
        import uvloop

        return uvloop.run(run)
    return asyncio.run(run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.longpoll.acceptburst", description=__doc__)
    p.add_argument("--connections", type=int, default=300, help="(%(default)s)")
    p.add_argument("--busy-ms", type=float, default=2.0, help="work per iteration (%(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="(%(default)s)")
    p.add_argument("--one", choices=WAYS, help=argparse.SUPPRESS)  # a child's way
    args = p.parse_args(argv)
    if args.connections < 1 or args.rounds < 1 or args.busy_ms < 0:
        p.error("--connections and --rounds must be at least 1, --busy-ms at least 0")
    if args.one is not None:
        print(json.dumps(measure(args.one, args.connections, args.busy_ms)))
        return 0
    took: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):  # alternating, a fresh process per way and round
        for way in WAYS:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "examples.longpoll.acceptburst",
                    "--one",
                    way,
                    "--connections",
                    str(args.connections),
                    "--busy-ms",
                    str(args.busy_ms),
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            took[way].append(float(out))
    print(
        f"{args.connections} connections queued at once, "
        f"{args.busy_ms} ms of work per loop iteration"
    )
    for way, runs in took.items():
        runs_s = ", ".join(f"{t:.3f}" for t in runs)
        print(f"{way:20} accepted in {statistics.median(runs):.3f} s (median; runs {runs_s})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
