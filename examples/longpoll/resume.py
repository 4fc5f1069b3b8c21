"""A hung Redis resumes under parked GETs: one server, its ``/healthz``, the late answers.

``python -m examples.longpoll.resume [--gets 400] [--stop-seconds 8]`` starts a
``redis-server`` of its own and one server on it (``python -m examples.longpoll``,
single process), keeps ``--gets`` GETs parked on 20 topics (each reader asks again
as soon as it is answered, ``wait`` from 1 to 5 s) while a writer posts 20 a second,
SIGSTOPs Redis for ``--stop-seconds`` in the middle of the run, and probes the
server's ``/healthz`` every 0.2 s with a 1 s deadline from a process of its own
(:mod:`examples.longpoll.healthprobe`). It prints one JSON object: the probes slower
than 1 s (:func:`~examples.longpoll.soakcheck.judge_probes`; those within the stop
excused), the late answers beside the server's measured loop lag
(:func:`~examples.longpoll.soakcheck.judge_late`), the server's loop-lag spikes after
the resume, and ``pid``, so that the resume can be profiled (``py-spy record --pid``)
meanwhile. It exits 1 if a probe outside the stop was slower than 1 s or an answer
came past the bound.

The small reproduction of the soak's burst after ``SIGCONT`` (docs/longpoll.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import sys
import tempfile
from typing import Any

from .soakcheck import Window, judge_late, judge_probes, spikes_by_pid
from .soakprocs import Prober, Server

__all__ = ["main", "run"]


async def _request(port: int, method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: r\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    if not raw:
        return 0, None
    head, _, content = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(content) if content else None


async def run(
    gets: int = 400,
    stop_seconds: float = 8.0,
    before: float = 6.0,
    after: float = 20.0,
    server_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run it; the report (``report["passed"]``). ``server_args``: the server's own
    options (``--loop asyncio``, say).

    Raises:
        ValueError: ``gets`` below 1, or a time not above 0.
    """
    if gets < 1 or min(stop_seconds, before, after) <= 0:
        raise ValueError(f"gets must be >= 1 and the times > 0, got {gets}, {stop_seconds}")
    from aiopurgatory.redis.testing import RedisServer

    redis_server = RedisServer(tempfile.mkdtemp(prefix="longpoll-resume-"))
    await asyncio.to_thread(redis_server.start)
    loop = asyncio.get_running_loop()
    server: Server | None = None
    prober: Prober | None = None
    stopping = False
    statuses: dict[int, int] = {}

    async def reader(n: int) -> None:
        rng = random.Random(n)
        offset = 0
        while not stopping:
            wait = round(rng.uniform(1, 5), 3)
            assert server is not None
            path = f"/topics/r{n % 20}?offset={offset}&wait={wait}"
            try:
                status, body = await _request(server.port, "GET", path)
            except OSError:
                status, body = -1, None
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                offset = body["next_offset"]
            else:
                await asyncio.sleep(rng.uniform(0.5, 1.5))

    async def writer() -> None:
        i = 0
        while not stopping:
            assert server is not None
            with contextlib.suppress(OSError):
                await _request(server.port, "POST", f"/topics/r{i % 20}", b"x")
            i += 1
            await asyncio.sleep(0.05)

    try:
        server = await asyncio.to_thread(Server, "a", redis_server.url, *server_args)
        prober = Prober({"a": server.port}, 0.2, 1.0)
        origin = loop.time()
        tasks = [asyncio.create_task(reader(n)) for n in range(gets)]
        tasks.append(asyncio.create_task(writer()))
        await asyncio.sleep(before)
        assert redis_server.process is not None
        stopped = loop.time()
        redis_server.process.send_signal(signal.SIGSTOP)
        await asyncio.sleep(stop_seconds)
        redis_server.process.send_signal(signal.SIGCONT)
        resumed = loop.time()
        await asyncio.sleep(after)
        stopping = True
        await asyncio.wait(tasks, timeout=10)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        if prober is not None:
            await asyncio.to_thread(prober.stop)
        status = None if server is None else await asyncio.to_thread(server.stop)
        await asyncio.to_thread(redis_server.kill)
    assert server is not None
    assert prober is not None
    records, other = server.records()
    answers = [r | {"server": "a"} for r in records if r.get("event") == "longpoll.late_answer"]
    spikes = [r for r in records if r.get("event") == "longpoll.loop_lag"]
    late = judge_late(answers, spikes, 2.5, origin, keep=10)
    windows = [Window(stopped, resumed, "redis SIGSTOP to redis SIGCONT")]
    queues = {
        "a": [(r["at"], r["waiting"]) for r in records if r.get("event") == "longpoll.accept_queue"]
    }
    lags = {"a": list(spikes_by_pid(spikes).values())}
    probes = judge_probes(prober.records, windows, 1.0, origin, keep=20, lags=lags, queues=queues)
    return {
        "gets": gets,
        "stop_seconds": stop_seconds,
        "pid": server.proc.pid,
        "stopped_at": round(stopped - origin, 1),
        "resumed_at": round(resumed - origin, 1),
        "statuses": statuses,
        "healthz": probes,
        "late_answers": late,
        "accept_queue_max": max((n for _, n in queues["a"]), default=0),
        "lag_after_resume": [
            {"at": round(s["asked"] - origin, 2), "lag_s": s["lag_s"]}
            for s in spikes
            if s["ended"] >= resumed
        ][:40],
        "exit_status": status,
        "non_json": other[:20],
        "passed": probes["slow"] == 0 and late["past_bound"] == 0 and status == 0 and not other,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 if every probe and answer was in time, 1 if not, 2 bad arguments."""
    p = argparse.ArgumentParser(prog="python -m examples.longpoll.resume")
    p.add_argument("--gets", type=int, default=400, help="GETs kept parked (%(default)s)")
    p.add_argument("--stop-seconds", type=float, default=8.0, help="(%(default)s)")
    p.add_argument("--after", type=float, default=20.0, help="seconds after SIGCONT (%(default)s)")
    p.add_argument(
        "--server-loop", choices=("auto", "asyncio", "uvloop"), default="auto", help="(%(default)s)"
    )
    args = p.parse_args(argv)
    try:
        report = asyncio.run(
            run(
                args.gets,
                args.stop_seconds,
                after=args.after,
                server_args=("--loop", args.server_loop),
            )
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
