"""Probe servers' ``/healthz`` on a schedule, in a process of its own; one JSON line a probe.

``python -m examples.longpoll.healthprobe a=PORT b=PORT ... [--interval 0.5] [--timeout 1]``
asks ``GET /healthz`` of every server every ``interval`` seconds, each probe on a new
connection and given ``timeout`` seconds, whether or not the one before it has
answered, until its standard input closes. Each probe is a line on standard output:
``server``, ``sent`` (``time.monotonic()`` when it began to connect), ``took``
(seconds, None if it did not answer in time or failed), ``status``, ``error`` (None,
``timeout``, or the exception's name), ``connect_s`` (seconds to connect, when it
did: the kernel's handshake, before the server accepted), the server's ``pid``,
``loop_lag_max_s`` and ``accept_queue`` as its ``/healthz`` gave them, and
``prober_lag_s``: this process's own loop lag then (the largest of its last 2 s),
so that a slow probe is not blamed on a server when the prober itself was behind.

It runs apart from the soak's client, whose loop carries a thousand readers and
would measure its own lag, not the servers'.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from .looplag import LoopLag

__all__ = ["main", "probe_once", "run"]


async def probe_once(port: int, deadline: float) -> dict[str, Any]:
    """One ``GET /healthz`` on 127.0.0.1:``port`` within ``deadline`` seconds.

    Returns ``sent``, ``took``, ``status``, ``error``, ``pid``, ``loop_lag_max_s``;
    never raises for the server's failure (it is the record's ``error``).
    """
    loop = asyncio.get_running_loop()
    sent = loop.time()
    record: dict[str, Any] = {"sent": round(sent, 4), "took": None, "status": None, "error": None}
    try:
        async with asyncio.timeout(deadline):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            # Connected once the kernel completed the handshake, before the server
            # accepted: a slow connect is a full listen queue, a slow answer the server.
            record["connect_s"] = round(loop.time() - sent, 4)
            try:
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
                await writer.drain()
                raw = await reader.read()
            finally:
                writer.close()
    except TimeoutError:
        record["error"] = "timeout"
        return record
    except (OSError, asyncio.IncompleteReadError) as exc:
        record["error"] = type(exc).__name__
        return record
    record["took"] = round(loop.time() - sent, 4)
    head, _, body = raw.partition(b"\r\n\r\n")
    try:
        record["status"] = int(head.split(b" ", 2)[1])
        fields = json.loads(body)
    except (IndexError, ValueError):
        record["error"] = "bad answer"
        return record
    record["pid"] = fields.get("pid")
    record["loop_lag_max_s"] = fields.get("loop_lag_max_s")
    record["accept_queue"] = fields.get("accept_queue")
    return record


async def run(ports: dict[str, int], interval: float, deadline: float, stop: asyncio.Event) -> None:
    """Probe every ``interval`` seconds, each given ``deadline`` seconds, until ``stop``
    is set; print each probe's line as it ends.

    Raises:
        ValueError: ``interval`` or ``deadline`` not above 0, no server.
    """
    if not interval > 0 or not deadline > 0:
        raise ValueError(f"interval and deadline must be > 0, got {interval!r}, {deadline!r}")
    if not ports:
        raise ValueError("ports: no server to probe")
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[None]] = set()

    async with LoopLag(interval=0.05, window=2.0) as lag:

        async def one(name: str, port: int) -> None:
            record = await probe_once(port, deadline)
            record["server"] = name
            record["prober_lag_s"] = round(lag.recent_max, 4)
            print(json.dumps(record), flush=True)

        next_at = loop.time()
        while not stop.is_set():
            for name, port in ports.items():
                task = asyncio.create_task(one(name, port))
                pending.add(task)
                task.add_done_callback(pending.discard)
            next_at += interval
            # A late tick does not make up for lost ones: the schedule stays steady.
            next_at = max(next_at, loop.time())
            try:
                async with asyncio.timeout(next_at - loop.time()):
                    await stop.wait()
            except TimeoutError:
                pass
        if pending:
            await asyncio.wait(pending, timeout=deadline + 1)


def _port(text: str) -> tuple[str, int]:
    name, sep, port = text.partition("=")
    if not sep or not name or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=PORT, got {text!r}")
    return name, int(port)


async def _until_stdin_closes(ports: dict[str, int], interval: float, deadline: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def wait_for_eof() -> None:
        sys.stdin.read()
        loop.call_soon_threadsafe(stop.set)

    watcher = loop.run_in_executor(None, wait_for_eof)
    await run(ports, interval, deadline, stop)
    await watcher


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 once standard input closed, 2 for bad arguments."""
    p = argparse.ArgumentParser(prog="python -m examples.longpoll.healthprobe")
    p.add_argument("servers", nargs="+", type=_port, help="NAME=PORT")
    p.add_argument("--interval", type=float, default=0.5, help="seconds (%(default)s)")
    p.add_argument("--timeout", type=float, default=1.0, help="seconds (%(default)s)")
    args = p.parse_args(argv)
    if not args.interval > 0 or not args.timeout > 0:
        p.error("--interval and --timeout must be > 0")
    asyncio.run(_until_stdin_closes(dict(args.servers), args.interval, args.timeout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
