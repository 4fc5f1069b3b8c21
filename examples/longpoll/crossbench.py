"""Long polling across processes through Redis or PostgreSQL: delivery latency, 1 against 2
processes.

``python -m examples.longpoll.crossbench`` starts its own ``redis-server``
(loopback, free port, temporary directory, ``appendfsync always``), then for each
scenario starts long-poll servers with ``--redis``, parks ``--parked`` GETs (one
keep-alive connection each, spread over ``--topics`` topics, each re-polling
from the offset its answer gave, waiting 30 s), posts ``--post-rate`` messages a
second for ``--seconds`` (round robin over the topics; each post answers the
GETs parked on its topic), and measures the delivery latency from a post being
sent to each parked GET receiving the message, the CPU seconds of the servers
and of Redis over the posting window, and errors. Scenarios:

* ``across``: two servers (two processes, two ports), the GETs split evenly, every
  POST sent to the first: deliveries to the second server's GETs crossed
  processes (``remote``), those to the first's did not (``local``).
* ``one``: one server process (``--redis``) takes all GETs and POSTs.
* ``two``: one port served by two processes (``--redis --workers 2``).

``--store postgres`` runs the same on a throwaway PostgreSQL (made by ``initdb``,
``synchronous_commit=on``; :mod:`aiopurgatory.postgres.testing`) with
``--postgres``: each POST one transaction, its wake-up committed with it.

Everything is bounded in count and time, loopback only::

    python -m examples.longpoll.crossbench                         # 10,000 GETs, all scenarios
    python -m examples.longpoll.crossbench --parked 1000 --scenarios across

Prints one JSON line per scenario (``--out FILE`` also writes them as a JSON list).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .loadtest import (
    _check_counts,
    _check_in,
    _cpu_seconds,
    _drain,
    _paced,
    _percentile,
    _raise_fd_limit,
    _read_response,
    _run_client,
)

__all__ = ["SCENARIOS", "Bench", "main", "run_scenario"]

_ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ("across", "one", "two")
LONG_WAIT = 30.0


@dataclass(frozen=True)
class Bench:
    """The shape of the load (counts, messages per second, seconds)."""

    parked: int = 10_000
    topics: int = 100
    post_rate: float = 5.0
    seconds: float = 20.0
    loop: str = "auto"
    seed: int = 1
    #: More arguments for every server (e.g. ``("--gc-threshold", "python")``).
    server_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_counts(self, ("parked", "topics"), 15_000)
        _check_in(self, "post_rate", 0, 1000)
        _check_in(self, "seconds", 0, 300)


@dataclass
class ScenarioResult:
    """What one scenario measured (latencies in milliseconds, CPU in seconds)."""

    scenario: str
    server_args: str
    processes: int
    parked: int
    posts: int
    delivered: int
    expected: int
    deliveries_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    latency_max_ms: float
    server_cpu_s: float
    #: Redis's CPU seconds (0 on PostgreSQL: see ``store_cpu_s``).
    redis_cpu_s: float
    #: The load generator's own (this process), which shares the machine's cores.
    client_cpu_s: float
    cpu_us_per_delivery: float
    errors: int
    exit_status: int
    stop_s: float = 0.0  # SIGTERM to exit, the slowest server
    error_kinds: dict[str, int] = field(default_factory=dict)
    log_tail: list[str] = field(default_factory=list)
    by_server: dict[str, Any] = field(default_factory=dict)
    #: Where the feed was kept: ``redis`` or ``postgres``.
    store: str = "redis"
    #: The store's CPU seconds (PostgreSQL: the postmaster and its backends).
    store_cpu_s: float = 0.0


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Redis:
    """A throwaway redis-server for the benchmark."""

    name = "redis"
    option = "--redis"

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit(
                "error: redis-server is not installed (as root: apt-get install -y redis-server)"
            )
        self.dir = Path(tempfile.mkdtemp(prefix="crossbench-redis-"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--save", "", "--appendonly", "yes", "--appendfsync", "always",
             "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit("error: redis-server did not start")
            time.sleep(0.05)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def flush(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(b"FLUSHALL\r\n")
            s.recv(16)

    def cpu(self) -> float:
        return _cpu_seconds(self.proc.pid)

    def close(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class _Postgres:
    """A throwaway PostgreSQL for the benchmark (durable at commit, as the tests run it)."""

    name = "postgres"
    option = "--postgres"

    def __init__(self) -> None:
        from aiopurgatory.postgres.testing import PostgresMissing, PostgresServer

        try:
            self.server = PostgresServer(synchronous_commit="on", max_connections="200")
        except PostgresMissing as exc:
            raise SystemExit(f"error: {exc}") from None
        self.server.start()
        self.url = self.server.dsn

    def flush(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            for table in (
                "longpoll_topics",
                "longpoll_messages",
                "longpoll_idempotency",
                "longpoll_triggers_watermarks",
            ):
                if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() != (None,):
                    conn.execute(f"TRUNCATE {table}")

    def cpu(self) -> float:
        # The backends: the servers' pools and triggers hold theirs for the whole run.
        return sum(_cpu_seconds(pid) for pid in self.server.pids())

    def close(self) -> None:
        self.server.destroy()


_STORES = ("postgres", "redis")


class _Server:
    """One ``python -m examples.longpoll --redis`` or ``--postgres`` (with ``--workers``: its
    workers' pids)."""

    def __init__(self, store: _Redis | _Postgres, bench: Bench, workers: int) -> None:
        profile = os.environ.get("CROSSBENCH_PROFILE")  # a file: cProfile the (single) server
        prefix = ["-m", "cProfile", "-o", profile] if profile and workers == 1 else []
        self.proc = subprocess.Popen(
            [sys.executable, *prefix, "-m", "examples.longpoll", "--port", "0",
             store.option, store.url, "--workers", str(workers), "--loop", bench.loop,
             "--max-parked", str(bench.parked + 100), *bench.server_args],
            cwd=_ROOT,
            stderr=subprocess.PIPE,
            preexec_fn=_raise_fd_limit,
            text=True,
        )  # fmt: skip
        assert self.proc.stderr is not None
        while True:
            line = self.proc.stderr.readline()
            if not line:
                raise SystemExit(f"error: a server exited at start ({self.proc.wait()})")
            first = json.loads(line)
            if first["event"] == "longpoll.listening":
                break
        self.port: int = first["port"]
        self.pids: list[int] = first.get("pids") or [self.proc.pid]
        self.stop_seconds = 0.0
        self.log_tail: list[str] = []
        self.drain = threading.Thread(
            target=_drain, args=(self.proc.stderr, self.log_tail), daemon=True
        )
        self.drain.start()

    def cpu(self) -> float:
        return sum(_cpu_seconds(pid) for pid in self.pids)

    def parked(self) -> int:
        """GETs parked over all its processes (each /healthz reaches one: ask until all did)."""
        seen: dict[int, int] = {}
        for _ in range(200):
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/healthz", timeout=30
            ) as response:
                body = json.loads(response.read())
            seen[body["pid"]] = body["parked"]
            if len(seen) == len(self.pids):
                break
        return sum(seen.values())

    def stop(self) -> int:
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            status = self.proc.wait()
        self.stop_seconds = round(time.monotonic() - started, 2)
        self.close()
        return status

    def close(self) -> None:
        """Its log read to the end (it has exited), the pipe closed."""
        self.drain.join(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


class _Client:
    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.recording = False
        self.stopping = False
        self.latencies: dict[int, list[float]] = {}
        self.errors = 0
        self.error_kinds: dict[str, int] = {}
        self.posts = 0

    def delivered(self) -> int:
        return sum(len(values) for values in self.latencies.values())

    def error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1

    async def poller(self, port: int, n: int, connected: asyncio.Semaphore) -> None:
        topic = f"topic-{n % self.bench.topics}"
        async with connected:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        mine = self.latencies.setdefault(port, [])
        offset = 0
        try:
            while not self.stopping:
                writer.write(
                    f"GET /topics/{topic}?offset={offset}&wait={LONG_WAIT} HTTP/1.1\r\n"
                    "Host: crossbench\r\n\r\n".encode()
                )
                status, body = await _read_response(reader)
                received = time.monotonic()
                if status != 200:
                    self.error(f"GET {status}: {body[:80].decode(errors='replace')}")
                    await asyncio.sleep(0.1)
                    continue
                answer = json.loads(body)
                offset = answer["next_offset"]
                if self.recording and not self.stopping:
                    mine.extend(received - float(m) for m in answer["messages"])
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if not self.stopping:
                self.error(f"GET {type(exc).__name__}")
        finally:
            writer.close()

    async def poster(self, port: int, lane: int, lanes: int, start: float) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        rate = self.bench.post_rate
        try:
            async for i in _paced(lane, lanes, round(self.bench.seconds * rate), rate, start):
                body = f"{time.monotonic():.6f}".encode()
                writer.write(
                    f"POST /topics/topic-{i % self.bench.topics} HTTP/1.1\r\nHost: crossbench\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                status, answer = await _read_response(reader)
                if status != 200:
                    self.error(f"POST {status}: {answer[:80].decode(errors='replace')}")
                self.posts += 1
        finally:
            writer.close()


async def run_scenario(scenario: str, bench: Bench, store: _Redis | _Postgres) -> ScenarioResult:
    """Start the scenario's servers, load them, stop them; what it measured."""
    store.flush()
    if scenario == "across":
        servers = [_Server(store, bench, 1), _Server(store, bench, 1)]
    elif scenario == "one":
        servers = [_Server(store, bench, 1)]
    else:
        servers = [_Server(store, bench, 2)]
    pollers: list[asyncio.Task[None]] = []
    try:
        client = _Client(bench)
        connected = asyncio.Semaphore(256)
        rng = random.Random(bench.seed)
        order = list(range(bench.parked))
        rng.shuffle(order)
        for n in order:
            # A topic's GETs alternate between the servers: each post answers both.
            port = servers[(n // bench.topics) % len(servers)].port
            pollers.append(asyncio.create_task(client.poller(port, n, connected)))
        deadline = time.monotonic() + 180
        while sum(await asyncio.gather(*(asyncio.to_thread(s.parked) for s in servers))) < (
            bench.parked
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {bench.parked} GETs parked in time")
            await asyncio.sleep(0.3)
        await asyncio.sleep(0.5)
        cpu0 = [s.cpu() for s in servers]
        client0 = _own_cpu()
        store_cpu0 = store.cpu()
        client.recording = True
        lanes = 4
        start = asyncio.get_running_loop().time()
        target = servers[0].port
        await asyncio.gather(*(client.poster(target, k, lanes, start) for k in range(lanes)))
        # The last posts' deliveries: every parked GET of a post's topic gets it.
        per_topic = [0] * bench.topics
        for n in range(bench.parked):
            per_topic[n % bench.topics] += 1
        expected = sum(per_topic[i % bench.topics] for i in range(client.posts))
        for _ in range(300):  # at most 30 s
            if client.delivered() >= expected:
                break
            await asyncio.sleep(0.1)
        cpu = sum(s.cpu() - c for s, c in zip(servers, cpu0, strict=True))
        store_cpu = store.cpu() - store_cpu0
        client_cpu = _own_cpu() - client0
        client.stopping = True
        # Stop them in threads: the client's loop must go on reading the answers.
        statuses = await asyncio.gather(*(asyncio.to_thread(s.stop) for s in servers))
        await asyncio.wait(pollers, timeout=30)
    finally:
        for task in pollers:
            task.cancel()
        for s in servers:
            if s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait()
            s.close()
    every = sorted(v for values in client.latencies.values() for v in values)
    by_server: dict[str, Any] = {}
    names = ["local", "remote"] if scenario == "across" else ["all"]
    for name, server in zip(names, servers, strict=False):
        values = sorted(client.latencies.get(server.port, []))
        by_server[name] = {
            "delivered": len(values),
            "latency_p50_ms": round(1000 * _percentile(values, 0.5), 2),
            "latency_p99_ms": round(1000 * _percentile(values, 0.99), 2),
        }
    processes = sum(len(s.pids) for s in servers)
    return ScenarioResult(
        scenario=scenario,
        server_args=" ".join(bench.server_args),
        processes=processes,
        parked=bench.parked,
        posts=client.posts,
        delivered=len(every),
        expected=expected,
        deliveries_per_s=round(len(every) / bench.seconds, 1),
        latency_p50_ms=round(1000 * _percentile(every, 0.5), 2),
        latency_p99_ms=round(1000 * _percentile(every, 0.99), 2),
        latency_max_ms=round(1000 * every[-1], 2) if every else float("nan"),
        server_cpu_s=round(cpu, 2),
        redis_cpu_s=round(store_cpu, 2) if store.name == "redis" else 0.0,
        client_cpu_s=round(client_cpu, 2),
        cpu_us_per_delivery=round(1e6 * (cpu + store_cpu) / len(every), 1) if every else 0.0,
        errors=client.errors,
        exit_status=max(statuses),
        error_kinds=client.error_kinds,
        stop_s=max(s.stop_seconds for s in servers),
        log_tail=[line for s in servers for line in s.log_tail[-5:]] if max(statuses) else [],
        by_server=by_server,
        store=store.name,
        store_cpu_s=round(store_cpu, 2),
    )


async def run_all(
    scenarios: list[str], bench: Bench, store_name: str = "redis"
) -> list[ScenarioResult]:
    store: _Redis | _Postgres = _Redis() if store_name == "redis" else _Postgres()
    try:
        results = []
        for scenario in scenarios:
            result = await run_scenario(scenario, bench, store)
            print(json.dumps(asdict(result)), flush=True)
            results.append(result)
        return results
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit status 1 if a scenario had errors, missed a delivery (30 s after
    the last post) or a server did not exit 0."""
    d = Bench()
    p = argparse.ArgumentParser(prog="python -m examples.longpoll.crossbench", description=__doc__)
    p.add_argument("--parked", type=int, default=d.parked, help="concurrent GETs (%(default)s)")
    p.add_argument("--topics", type=int, default=d.topics, help="GETs spread over (%(default)s)")
    p.add_argument(
        "--post-rate", type=float, default=d.post_rate, help="posts per second (%(default)s)"
    )
    p.add_argument("--seconds", type=float, default=d.seconds, help="posting window (%(default)s)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated (%(default)s)")
    p.add_argument(
        "--loop",
        choices=["auto", "asyncio", "uvloop"],
        default=d.loop,
        help="the servers' (%(default)s)",
    )
    p.add_argument("--seed", type=int, default=d.seed, help="GET order (%(default)s)")
    p.add_argument(
        "--store",
        choices=_STORES,
        default="redis",
        help="where the servers keep the feed: a throwaway redis-server or PostgreSQL "
        "(%(default)s)",
    )
    p.add_argument("--out", type=Path, help="also write the results here (JSON) (%(default)s)")
    p.add_argument(
        "--server-args",
        default="",
        help="more arguments for every server, one string, e.g. '--gc-threshold python' "
        "(%(default)s)",
    )
    args = p.parse_args(argv)
    scenarios = args.scenarios.split(",")
    try:
        bench = Bench(
            parked=args.parked,
            topics=args.topics,
            post_rate=args.post_rate,
            seconds=args.seconds,
            loop=args.loop,
            seed=args.seed,
            server_args=tuple(args.server_args.split()),
        )
        if not scenarios or not set(scenarios) <= set(SCENARIOS):
            raise ValueError(f"scenarios must name some of {SCENARIOS}, got {args.scenarios!r}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = _run_client(run_all(scenarios, bench, args.store))
    if args.out is not None:
        args.out.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    failed = any(r.errors or r.exit_status or r.delivered < r.expected for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
