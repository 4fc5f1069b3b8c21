"""A bounded loopback load test of the long-poll server, both waiters in one run.

For each run it starts ``python -m examples.longpoll`` on 127.0.0.1 in a
subprocess, parks ``--parked`` GETs (one keep-alive connection each, spread over
``--topics`` topics, each re-polling from the offset its answer gave), then posts
at ``--post-rate`` messages per second for ``--seconds`` and measures:

* the server's CPU seconds over the posting window (``/proc/<pid>/stat``),
* its resident memory at the end of the window (``VmRSS``) and its peak (``VmHWM``),
* delivery latency: from a post being sent to each parked GET receiving the message,
* early answers: GETs answered without data before their wait passed, as counted
  by the server on its loop's clock (``loop.time() < start + wait``: the
  purgatory's guarantee) and as seen by the client on ``time.monotonic()``
  (with the most such an answer was early, ``early_client_max_ms``).

All GETs first wait 30 s, so that all are parked at once before the posting
starts; then a share of them (``--short-share``) waits 1 to 5 s per poll, so
that timeouts happen too, while the others keep waiting 30 s and are answered by
posts (each post answers the GETs parked on its topic, ``parked / topics`` of
them). Runs alternate between the waiters (purgatory, asyncio, purgatory, ...)
so that both see the same machine; the summary gives each figure's median per
waiter and the ratio purgatory / asyncio. Everything is bounded in count and time, loopback only::

    python -m examples.longpoll.loadtest                       # 10,000 GETs, 3 rounds
    python -m examples.longpoll.loadtest --parked 500 --seconds 3 --rounds 1

Prints one JSON line per run as it ends, then the summary; with ``--json``, one
JSON object at the end instead: ``{"runs": [...], "summary": {...}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

__all__ = ["Load", "RunResult", "build_parser", "main", "run_once", "scrape_metrics"]

T = TypeVar("T")

_ROOT = Path(__file__).resolve().parents[2]
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Load:
    """The shape of the load (seconds, counts)."""

    parked: int = 10_000
    topics: int = 100
    post_rate: float = 5.0
    seconds: float = 20.0
    short_share: float = 0.1
    long_wait: float = 30.0
    loop: str = "auto"
    seed: int = 1

    def __post_init__(self) -> None:
        _check_counts(self, ("parked", "topics"), 15_000)
        _check_in(self, "post_rate", 0, 10_000)
        _check_in(self, "seconds", 0, 600)
        _check_in(self, "short_share", 0, 1, low_included=True)
        _check_in(self, "long_wait", 5, 300)


def _check_counts(load: object, names: tuple[str, ...], most: int) -> None:
    """Each of ``load``'s fields ``names`` is an int in [1, ``most``] (else ValueError)."""
    for name in names:
        value = getattr(load, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise ValueError(f"{name} must be an int in [1, {most}], got {value!r}")


def _check_in(
    load: object, name: str, low: float, high: float, *, low_included: bool = False
) -> None:
    """``load``'s field ``name`` is in (``low``, ``high``] (or [``low``, ``high``]): else
    ValueError."""
    value = getattr(load, name)
    if not (low <= value <= high if low_included else low < value <= high):
        bracket = "[" if low_included else "("
        raise ValueError(f"{name} must be in {bracket}{low}, {high}], got {value!r}")


@dataclass
class RunResult:
    """What one run of one waiter measured."""

    waiter: str
    loop: str
    parked: int
    posts: int
    server_cpu_s: float
    rss_mib: float
    peak_rss_mib: float
    delivered: int
    latency_p50_ms: float
    latency_p99_ms: float
    timeouts: int
    early_server: int
    early_client: int
    early_client_max_ms: float
    exit_status: int
    errors: int = 0
    #: POSTs sent again with their Idempotency-Key after a failed attempt.
    post_retries: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    after_name = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(after_name[11]), int(after_name[12])  # fields 14 and 15
    return (utime + stime) / _CLOCK_TICKS


def _memory_mib(pid: int) -> tuple[float, float]:
    """VmRSS and VmHWM of ``pid``, MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _drain(stream: IO[str], lines: list[str]) -> None:
    for line in stream:
        lines.append(line.rstrip())
        del lines[:-20]


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


class _Client:
    """The load's client side: parked GETs re-polling, posters, the numbers they see."""

    def __init__(self, port: int, load: Load) -> None:
        self.port = port
        self.load = load
        self.recording = False
        self.stopping = False
        self.latencies: list[float] = []
        self.timeouts = 0
        self.early = 0
        self.early_by = 0.0  # the most an early answer came before its wait, seconds
        self.errors = 0
        #: POSTs sent again (same Idempotency-Key) after a failed attempt.
        self.retries = 0
        self.parked_once = 0
        self.posts = 0

    async def poller(self, n: int, rng: random.Random, connected: asyncio.Semaphore) -> None:
        topic = f"topic-{n % self.load.topics}"
        short = rng.random() < self.load.short_share
        async with connected:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        offset = 0
        first = True
        try:
            while not self.stopping:
                # Every GET waits long until the load is on (so that all are parked
                # at once); then the short ones wait 1 to 5 s, and time out often.
                short_now = short and self.recording
                wait = round(rng.uniform(1, 5), 3) if short_now else self.load.long_wait
                # Read the clock before sending: the server's wait starts after this.
                sent = time.monotonic()
                writer.write(
                    f"GET /topics/{topic}?offset={offset}&wait={wait} HTTP/1.1\r\n"
                    "Host: loadtest\r\n\r\n".encode()
                )
                if first:
                    self.parked_once += 1
                    first = False
                status, body = await _read_response(reader)
                received = time.monotonic()
                if status != 200:
                    self.errors += 1
                    break
                answer = json.loads(body)
                offset = answer["next_offset"]
                if not self.recording or self.stopping:
                    continue
                if answer["messages"]:
                    self.latencies.extend(received - float(m) for m in answer["messages"])
                else:
                    self.timeouts += 1
                    if received - sent < wait:
                        self.early += 1
                        self.early_by = max(self.early_by, wait - (received - sent))
        except (asyncio.IncompleteReadError, ConnectionError):
            if not self.stopping:
                self.errors += 1
        finally:
            writer.close()

    async def poster(self, lane: int, lanes: int, start: float) -> None:
        """Post messages ``lane``, ``lane + lanes``, ... of the window, each at its time.

        Each POST carries an ``Idempotency-Key``: one that fails (no reply, a lost
        connection, a 503) is sent again with the same key on a new connection, up to
        ``_POST_ATTEMPTS`` times, and is never stored twice.
        """
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        rate = self.load.post_rate
        try:
            async for i in _paced(lane, lanes, round(self.load.seconds * rate), rate, start):
                topic = f"topic-{i % self.load.topics}"
                body = f"{time.monotonic():.6f}".encode()
                request = (
                    f"POST /topics/{topic} HTTP/1.1\r\nHost: loadtest\r\n"
                    f'Idempotency-Key: "loadtest-{i}"\r\n'
                    f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                for attempt in range(_POST_ATTEMPTS):
                    status = -1
                    try:
                        if connection is None:
                            connection = await asyncio.open_connection("127.0.0.1", self.port)
                        connection[1].write(request)
                        status, _ = await _read_response(connection[0])
                    except (OSError, asyncio.IncompleteReadError):
                        pass
                    if status == 200:
                        break
                    if connection is not None:
                        connection[1].close()
                        connection = None
                    self.retries += 1
                    await asyncio.sleep(0.1 * (attempt + 1))
                else:
                    self.errors += 1
                self.posts += 1
        finally:
            if connection is not None:
                connection[1].close()


def _run_client(main: Coroutine[Any, Any, T]) -> T:
    """Run the load's client side: uvloop if installed, as many open files as allowed."""
    _raise_fd_limit()
    factory = asyncio.new_event_loop
    with contextlib.suppress(ImportError):
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


async def _paced(
    lane: int, lanes: int, total: int, rate: float, start: float
) -> AsyncIterator[int]:
    """Posts ``lane``, ``lane + lanes``, ... of ``total``, each yielded at its time:
    ``start + i / rate`` on the running loop's clock."""
    loop = asyncio.get_running_loop()
    for i in range(lane, total, lanes):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        yield i


#: Attempts of one POST before it counts as an error.
_POST_ATTEMPTS = 5


def scrape_metrics(port: int) -> dict[str, float]:
    """The samples of a server's ``/metrics`` page, by name with labels."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


async def _wait_parked(port: int, waiter: str, count: int, deadline: float) -> None:
    gauge = f'longpoll_parked_requests{{waiter="{waiter}"}}'
    while (await asyncio.to_thread(scrape_metrics, port))[gauge] < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {count} GETs parked in time")
        await asyncio.sleep(0.2)


async def run_once(waiter: str, load: Load) -> RunResult:
    """Start a server with ``waiter``, load it, stop it; what it measured."""
    server = subprocess.Popen(  # noqa: ASYNC220 - started once per run, before the load
        [
            sys.executable,
            "-m",
            "examples.longpoll",
            "--port",
            "0",
            "--waiter",
            waiter,
            "--loop",
            load.loop,
            "--max-parked",
            str(load.parked + 100),
        ],
        cwd=_ROOT,
        stderr=subprocess.PIPE,
        preexec_fn=_raise_fd_limit,
        text=True,
    )
    drain: threading.Thread | None = None
    try:
        assert server.stderr is not None
        first = json.loads(await asyncio.to_thread(server.stderr.readline))
        port, loop_name = first["port"], first["loop"]
        # Keep reading its log so that the pipe never fills; keep the last lines.
        log_tail: list[str] = []
        drain = threading.Thread(target=_drain, args=(server.stderr, log_tail), daemon=True)
        drain.start()
        client = _Client(port, load)
        rng = random.Random(load.seed)
        connected = asyncio.Semaphore(256)
        pollers = [
            asyncio.create_task(client.poller(n, random.Random(rng.random()), connected))
            for n in range(load.parked)
        ]
        await _wait_parked(port, waiter, load.parked, time.monotonic() + 120)
        await asyncio.sleep(0.5)  # let the last connections settle
        cpu_start = _cpu_seconds(server.pid)
        client.recording = True
        lanes = 4
        start = asyncio.get_running_loop().time()
        await asyncio.gather(*(client.poster(lane, lanes, start) for lane in range(lanes)))
        await asyncio.sleep(0.5)  # the last posts' deliveries
        cpu = _cpu_seconds(server.pid) - cpu_start
        rss, peak = _memory_mib(server.pid)
        metrics = await asyncio.to_thread(scrape_metrics, port)
        client.stopping = True
        server.send_signal(signal.SIGTERM)
        await asyncio.wait(pollers, timeout=30)
        for task in pollers:
            task.cancel()
        status = await asyncio.to_thread(server.wait, 30)
        client.latencies.sort()
        return RunResult(
            waiter=waiter,
            loop=loop_name,
            parked=client.parked_once,
            posts=client.posts,
            server_cpu_s=round(cpu, 2),
            rss_mib=round(rss, 1),
            peak_rss_mib=round(peak, 1),
            delivered=len(client.latencies),
            latency_p50_ms=round(1000 * _percentile(client.latencies, 0.5), 2),
            latency_p99_ms=round(1000 * _percentile(client.latencies, 0.99), 2),
            timeouts=client.timeouts,
            early_server=int(
                metrics[f'longpoll_answers_total{{reason="early",waiter="{waiter}"}}']
            ),
            early_client=client.early,
            early_client_max_ms=round(1000 * client.early_by, 3),
            exit_status=status,
            errors=client.errors,
            post_retries=client.retries,
            extra={"log_tail": log_tail[-3:]} if status != 0 or client.errors else {},
        )
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        if drain is not None:
            drain.join(timeout=10)  # it reads the log to its end: the server has exited
        if server.stderr is not None:
            server.stderr.close()


_COMPARED = ("server_cpu_s", "rss_mib", "peak_rss_mib", "latency_p50_ms", "latency_p99_ms")


def summarize(results: list[RunResult]) -> dict[str, Any]:
    """Medians per waiter and the ratios purgatory / asyncio."""
    medians: dict[str, dict[str, float]] = {}
    for waiter in ("purgatory", "asyncio"):
        runs = [r for r in results if r.waiter == waiter]
        if runs:
            medians[waiter] = {
                name: statistics.median(getattr(r, name) for r in runs) for name in _COMPARED
            }
    ratios = {}
    if len(medians) == 2:
        for name in _COMPARED:
            base = medians["asyncio"][name]
            ratios[name] = round(medians["purgatory"][name] / base, 3) if base else float("nan")
    early = {
        waiter: {
            "server": sum(r.early_server for r in results if r.waiter == waiter),
            "client": sum(r.early_client for r in results if r.waiter == waiter),
        }
        for waiter in medians
    }
    return {"medians": medians, "ratios_purgatory_to_asyncio": ratios, "early_answers": early}


async def run_all(
    waiters: list[str], load: Load, rounds: int, *, echo: bool = True
) -> list[RunResult]:
    """``rounds`` runs of each waiter, alternating; with ``echo``, each result printed
    as a JSON line as it comes."""
    results = []
    for _ in range(rounds):
        for waiter in waiters:
            result = await run_once(waiter, load)
            if echo:
                print(json.dumps(asdict(result)), flush=True)
            results.append(result)
    return results


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; its defaults are :class:`Load`'s."""
    d = Load()
    p = argparse.ArgumentParser(
        prog="python -m examples.longpoll.loadtest",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--parked", type=int, default=d.parked, help="concurrent GETs, 1-15000 (%(default)s)"
    )
    p.add_argument(
        "--topics", type=int, default=d.topics, help="topics they spread over (%(default)s)"
    )
    p.add_argument(
        "--post-rate", type=float, default=d.post_rate, help="posts per second (%(default)s)"
    )
    p.add_argument(
        "--seconds", type=float, default=d.seconds, help="the posting window (%(default)s)"
    )
    p.add_argument(
        "--short-share",
        type=float,
        default=d.short_share,
        help="share of GETs that wait 1 to 5 s per poll, 0-1 (%(default)s)",
    )
    p.add_argument("--rounds", type=int, default=3, help="runs per waiter, 1-10 (%(default)s)")
    p.add_argument(
        "--waiters",
        default="purgatory,asyncio",
        help="waiters to run, comma-separated (%(default)s)",
    )
    p.add_argument(
        "--loop",
        choices=["auto", "asyncio", "uvloop"],
        default=d.loop,
        help="the server's event loop (%(default)s)",
    )
    p.add_argument("--seed", type=int, default=d.seed, help="of the GETs' waits (%(default)s)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object at the end (runs and summary) instead of JSON lines",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit status 1 if a run failed or the purgatory waiter answered early.

    Early answers of the asyncio waiter are reported, not failed: ``asyncio.wait_for``
    on uvloop has them (uvloop's timers can fire up to ~1.4 ms before their time).
    """
    args = build_parser().parse_args(argv)
    waiters = args.waiters.split(",")
    try:
        load = Load(
            parked=args.parked,
            topics=args.topics,
            post_rate=args.post_rate,
            seconds=args.seconds,
            short_share=args.short_share,
            loop=args.loop,
            seed=args.seed,
        )
        if not 1 <= args.rounds <= 10:
            raise ValueError(f"rounds must be in [1, 10], got {args.rounds}")
        if not waiters or not set(waiters) <= {"purgatory", "asyncio"}:
            raise ValueError(f"waiters must name purgatory and/or asyncio, got {args.waiters!r}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = _run_client(run_all(waiters, load, args.rounds, echo=not args.json))
    summary = summarize(results)
    if args.json:
        print(json.dumps({"runs": [asdict(r) for r in results], "summary": summary}))
    else:
        print(json.dumps(summary))
    failed = any(r.exit_status != 0 or r.errors for r in results)
    early = summary["early_answers"].get("purgatory", {})
    return 1 if failed or any(early.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
