"""A soak of the long-poll example across processes, with faults, checked against a ledger.

``python -m examples.longpoll.soak [--duration 180]`` starts a ``redis-server`` of its
own (Debian's package; free port, temporary directory, ``appendfsync always``), three
servers on it (``a`` and ``b`` single processes, ``c`` with ``--workers 2``), and a
client on 127.0.0.1:

* **readers** long-poll the topics (``GET ...?offset=N&wait=W``, W from 1 to 5 s) from
  the offset their last answer gave, each GET on a server picked at random; a share of
  them (``--hangup-share``) hang up before their answer; after a 503 or a lost
  connection a reader pauses 0.5 to 1.5 s;
* **writers** post unique messages to random topics, each with an ``Idempotency-Key``,
  and retry a POST that failed (a 503, a lost connection, no reply) with the same key
  and body, on any server, until it is acknowledged.

Meanwhile the faults, spread over the run: a worker of ``c`` SIGKILLed (its supervisor
restarts it), Redis SIGKILLed and restarted, Redis SIGSTOPped for ``--stop-seconds``,
``CLIENT KILL TYPE pubsub`` twice, a tight pub/sub output-buffer limit for a while,
and SIGTERM of server ``b`` (which answers its parked GETs and exits 0).

Then it checks the ledger, and exits 1 if any check fails:

* every acknowledged POST is in its topic exactly once, at the offset it was
  acknowledged with, and nothing else is (no duplicate, nothing unacknowledged);
* each writer's messages are in the order it posted them;
* every message a reader was given is the one stored at that offset;
* no GET was answered early: by the servers' own count (``early`` in their
  ``longpoll.stopped`` lines, judged on their loop's clock as timers are) and by the
  client's clock (an answer without messages before its wait counted from when the
  client asked, before connecting; server ``b``'s shutdown answers aside). Empty
  answers before the wait counted from the request's last byte instead are only
  reported (``empty_before_wait_from_written``, ``before_wait_from_written_max_s``):
  a few, by milliseconds to tens of milliseconds, which the servers' own clocks do
  not count early; their cause is not known (see ``docs/longpoll.md``);
* every parked GET was answered within its wait + ``--late-bound`` seconds (2.5, the
  documented bound) + the loop lag its own process logged around the answer, by
  that process's clock from its arrival in the application
  (:func:`~examples.longpoll.soakcheck.judge_late`: each answer over 1 s late is
  logged, ``longpoll.late_answer``, and listed with its lag); and no GET later than
  its wait plus ``--client-late-bound`` seconds (5) by the client's clock from its
  request written, which adds the time the request waits to be accepted and read
  and the answer to be read, on a machine that may be loaded;
* ``/healthz`` answered every probe within 1 s (a prober process,
  :mod:`~examples.longpoll.healthprobe`, asks each server every 0.5 s), but for
  probes during the soak's own stops: Redis killed or stopped, the killed worker
  of ``c`` until restarted, ``b`` after its SIGTERM
  (:func:`~examples.longpoll.soakcheck.judge_probes`);
* every line each server wrote to stderr is a JSON object; every server exited 0.

It prints one JSON object: the counts, the checks and the faults with their times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from .loadtest import _check_counts, _check_in, scrape_metrics
from .soakcheck import excused_windows, judge_late, judge_probes, spikes_by_pid
from .soakprocs import Prober, Server, redis_cli

__all__ = ["Soak", "build_parser", "main", "run"]


@dataclass(frozen=True)
class Soak:
    """The shape of a soak (seconds, counts)."""

    duration: float = 180.0
    readers: int = 400
    topics: int = 20
    writers: int = 8
    post_rate: float = 40.0
    hangup_share: float = 0.3
    stop_seconds: float = 8.0
    late_bound: float = 2.5
    client_late_bound: float = 5.0
    probe_interval: float = 0.5
    probe_timeout: float = 1.0
    server_loop: str = "asyncio"  # the server's own default
    seed: int = 1

    def __post_init__(self) -> None:
        if not 20 <= self.duration <= 3600:
            raise ValueError(f"duration must be in [20, 3600] seconds, got {self.duration!r}")
        _check_counts(self, ("readers", "topics", "writers"), 5000)
        _check_in(self, "post_rate", 0, 1000)
        _check_in(self, "hangup_share", 0, 1, low_included=True)
        _check_in(self, "stop_seconds", 0, 60)
        if self.server_loop not in ("auto", "asyncio", "uvloop"):
            raise ValueError(
                f"server_loop must be auto, asyncio or uvloop, got {self.server_loop!r}"
            )
        _check_in(self, "late_bound", 0, 60)
        _check_in(self, "client_late_bound", 0, 60)
        _check_in(self, "probe_interval", 0, 60)
        _check_in(self, "probe_timeout", 0, 60)


async def _http(
    port: int,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    within: float = 30.0,
    sent: list[float] | None = None,
) -> tuple[int, dict[str, str], Any]:
    """One request on a new connection (``Connection: close``): status, headers, JSON body.

    ``sent``: the loop time once the request was written is appended to it. It is
    not a lower bound of the server's start (this process may be preempted between
    the send and the reading of its clock, while the server reads the request), so
    the early check counts from when the client asked; this one is reported only.

    Raises:
        OSError, asyncio.IncompleteReadError, TimeoutError: no answer.
    """
    async with asyncio.timeout(within):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            head = f"{method} {path} HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n"
            for name, value in (headers or {}).items():
                head += f"{name}: {value}\r\n"
            head += f"Content-Length: {len(body)}\r\n\r\n"
            writer.write(head.encode() + body)
            await writer.drain()
            if sent is not None:
                sent.append(asyncio.get_running_loop().time())
            raw = await reader.read()
        finally:
            writer.close()
    text, _, content = raw.partition(b"\r\n\r\n")
    if not text:
        raise asyncio.IncompleteReadError(raw, None)
    lines = text.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    found = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        found[name.strip().lower()] = value.strip()
    return status, found, json.loads(content) if content else None


@dataclass
class _Ledger:
    """What the client was told, and what it saw."""

    # topic -> offset -> text, as acknowledged to the writers
    acked: dict[str, dict[int, str]] = field(default_factory=lambda: defaultdict(dict))
    # topic -> offset -> text, as given to the readers
    read: dict[str, dict[int, str]] = field(default_factory=lambda: defaultdict(dict))
    counts: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    late: list[dict[str, Any]] = field(default_factory=list)
    early: list[dict[str, Any]] = field(default_factory=list)
    max_late: float = 0.0
    before_wait_max: float = 0.0
    before_wait: list[dict[str, Any]] = field(default_factory=list)

    def problem(self, text: str) -> None:
        if len(self.problems) < 50:
            self.problems.append(text)
        self.counts["problems"] += 1


class _Client:
    def __init__(self, soak: Soak, servers: dict[str, Server], ledger: _Ledger) -> None:
        self.soak = soak
        self.servers = servers
        self.ledger = ledger
        self.stopping = False
        self.posting = True
        self.loop = asyncio.get_running_loop()
        self.started = self.loop.time()

    def live(self, rng: random.Random) -> Server:
        choices = [s for s in self.servers.values() if s.terminated_at is None]
        return rng.choice(choices)

    async def reader(self, n: int) -> None:
        rng = random.Random(self.soak.seed * 1_000_003 + n)
        topic = f"t{n % self.soak.topics}"
        offset = 0
        ledger = self.ledger
        while not self.stopping:
            server = self.live(rng)
            wait = round(rng.uniform(1, 5), 3)
            path = f"/topics/{topic}?offset={offset}&wait={wait}"
            if rng.random() < self.soak.hangup_share:
                ledger.counts["gets_hung_up"] += 1
                with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError):
                    await _http(server.port, "GET", path, within=rng.uniform(0.05, wait * 0.8))
                continue
            asked = self.loop.time()
            sent_at: list[float] = []
            try:
                status, _, body = await _http(
                    server.port, "GET", path, within=wait + 60, sent=sent_at
                )
            except (OSError, asyncio.IncompleteReadError):
                ledger.counts["gets_lost_connection"] += 1  # a killed worker, a stopped server
                await asyncio.sleep(rng.uniform(0.5, 1.5))
                continue
            except TimeoutError:
                ledger.problem(f"GET {path} on {server.name}: no answer in {wait + 60} s")
                continue
            received = self.loop.time()
            sent = sent_at[0]
            late = received - sent - wait
            shutdown = server.terminated_at is not None and received >= server.terminated_at
            if late > ledger.max_late:
                ledger.max_late = late
            if late > self.soak.client_late_bound:
                ledger.late.append(
                    {
                        "server": server.name,
                        "status": status,
                        "late": round(late, 3),
                        "at": round(received - self.started, 1),
                    }
                )
            ledger.counts[f"gets_{status}"] += 1
            if status != 200:
                if status != 503:
                    ledger.problem(f"GET {path} on {server.name}: {status} {body}")
                # As a client should: back off, or every reader's retries make a storm.
                await asyncio.sleep(rng.uniform(0.5, 1.5))
                continue
            if body["offset"] != offset:
                ledger.problem(f"GET {path}: answered from offset {body['offset']}")
            messages = body["messages"]
            if not messages and received - asked < wait:
                if shutdown:
                    ledger.counts["gets_answered_by_shutdown"] += 1
                else:
                    ledger.early.append(
                        {
                            "server": server.name,
                            "early": round(wait - received + asked, 3),
                            "at": round(received - self.started, 1),
                        }
                    )
            elif not messages and received - sent < wait and not shutdown:
                # Before its wait counted from the request's last byte, not from when it
                # was asked: reported, not failed (see the docstring).
                ledger.counts["empty_before_wait_from_written"] += 1
                ledger.before_wait_max = max(ledger.before_wait_max, wait - received + sent)
                if len(ledger.before_wait) < 10:
                    ledger.before_wait.append(
                        {
                            "server": server.name,
                            "by": round(wait - received + sent, 4),
                            "wait": wait,
                            "at": round(received - self.started, 1),
                        }
                    )
            seen = ledger.read[topic]
            for i, text in enumerate(messages, start=body["offset"]):
                if seen.setdefault(i, text) != text:
                    ledger.problem(f"{topic}@{i}: read {text!r}, earlier {seen[i]!r}")
            ledger.counts["messages_read"] += len(messages)
            offset = body["next_offset"]

    async def writer(self, lane: int) -> None:
        rng = random.Random(self.soak.seed * 7_000_003 + lane)
        ledger = self.ledger
        interval = self.soak.writers / self.soak.post_rate
        seq = 0
        next_at = self.loop.time()
        while self.posting:
            next_at += interval
            topic = f"t{rng.randrange(self.soak.topics)}"
            text = f"w{lane}-{seq}"
            key = f"soak-{lane}-{seq}"
            seq += 1
            attempts = 0
            while True:
                attempts += 1
                server = self.live(rng)
                try:
                    status, headers, body = await _http(
                        server.port,
                        "POST",
                        f"/topics/{topic}",
                        text.encode(),
                        {"Idempotency-Key": f'"{key}"'},
                        within=10,
                    )
                except (OSError, asyncio.IncompleteReadError, TimeoutError):
                    status, headers, body = -1, {}, None
                if status == 200:
                    break
                ledger.counts[f"posts_failed_{status}"] += 1
                if status not in (-1, 503):
                    ledger.problem(f"POST {topic} {text} on {server.name}: {status} {body}")
                await asyncio.sleep(min(2.0, 0.1 * attempts))
            if attempts > 1:
                ledger.counts["posts_retried"] += 1
            if headers.get("idempotent-replayed") == "true":
                ledger.counts["posts_replayed"] += 1  # stored by an attempt whose reply failed
            acked = ledger.acked[topic]
            if body["offset"] in acked:
                ledger.problem(f"{topic}@{body['offset']} acknowledged twice")
            acked[body["offset"]] = text
            ledger.counts["posts_acked"] += 1
            delay = next_at - self.loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                next_at = self.loop.time()


async def _faults(
    soak: Soak,
    redis_server: Any,
    servers: dict[str, Server],
    done: list[dict[str, Any]],
    start: float,
) -> None:
    """The faults, spread over the run; each appended to ``done`` with its time (``at``:
    seconds from ``start``; ``t``: the monotonic clock's, to compare with the servers')."""
    loop = asyncio.get_running_loop()
    d = soak.duration
    port = redis_server.port

    def note(what: str, **fields: Any) -> None:
        now = loop.time()
        done.append({"at": round(now - start, 1), "t": now, "fault": what, **fields})

    async def at(fraction: float) -> None:
        await asyncio.sleep(max(0.0, start + fraction * d - loop.time()))

    await at(0.08)
    victim = servers["c"].first["pids"][0]
    os.kill(victim, signal.SIGKILL)
    note("worker SIGKILL", pid=victim)

    await at(0.18)
    await asyncio.to_thread(redis_server.kill)
    note("redis SIGKILL")
    await asyncio.sleep(3)
    await asyncio.to_thread(redis_server.start)
    note("redis restarted")

    await at(0.36)
    redis_server.process.send_signal(signal.SIGSTOP)
    note("redis SIGSTOP", seconds=soak.stop_seconds)
    await asyncio.sleep(soak.stop_seconds)
    redis_server.process.send_signal(signal.SIGCONT)
    note("redis SIGCONT")

    await at(0.52)
    for _ in range(2):
        killed = await asyncio.to_thread(redis_cli, port, "CLIENT", "KILL", "TYPE", "pubsub")
        note("CLIENT KILL TYPE pubsub", killed=killed)
        await asyncio.sleep(1)

    await at(0.62)
    limit = "pubsub 2kb 1kb 1"
    await asyncio.to_thread(redis_cli, port, "CONFIG", "SET", "client-output-buffer-limit", limit)
    note("output buffer limit", limit=limit)
    await asyncio.sleep(max(3.0, 0.08 * d))
    default = "pubsub 32mb 8mb 60"
    await asyncio.to_thread(redis_cli, port, "CONFIG", "SET", "client-output-buffer-limit", default)
    note("output buffer limit", limit=default)

    await at(0.8)
    b = servers["b"]
    b.terminated_at = loop.time()
    b.proc.send_signal(signal.SIGTERM)
    note("server b SIGTERM")


async def _read_back(port: int, topic: str) -> list[str]:
    messages: list[str] = []
    offset = 0
    while True:
        status, _, body = await _http(port, "GET", f"/topics/{topic}?offset={offset}&wait=0")
        if status != 200:
            raise RuntimeError(f"read back {topic}@{offset}: {status} {body}")
        if not body["messages"]:
            return messages
        messages += body["messages"]
        offset = body["next_offset"]


def _check(
    soak: Soak, ledger: _Ledger, logs: dict[str, list[str]], stored: dict[str, list[str]]
) -> dict[str, bool]:
    lost = duplicated = misplaced = unacked = disordered = misread = 0
    for topic in (f"t{i}" for i in range(soak.topics)):
        log = stored.get(topic, [])
        acked = ledger.acked.get(topic, {})
        for offset, text in acked.items():
            if offset >= len(log) or log[offset] != text:
                misplaced += 1
                if text not in log:
                    lost += 1
        counts = Counter(log)
        duplicated += sum(n - 1 for n in counts.values() if n > 1)
        unacked += len(set(log) - set(acked.values()))
        last: dict[str, int] = {}
        for text in log:
            lane, _, seq = text.partition("-")
            if int(seq) < last.get(lane, -1):
                disordered += 1
            last[lane] = int(seq)
        for offset, text in ledger.read.get(topic, {}).items():
            if offset >= len(log) or log[offset] != text:
                misread += 1
    ledger.counts.update(
        lost=lost,
        duplicated=duplicated,
        misplaced=misplaced,
        unacknowledged_stored=unacked,
        out_of_order=disordered,
        misread=misread,
        early_client=len(ledger.early),
        late=len(ledger.late),
    )
    non_json = sum(len(lines) for lines in logs.values())
    ledger.counts["non_json_log_lines"] = non_json
    return {
        "acknowledged POSTs read back once, in order": not (
            lost or duplicated or misplaced or unacked or disordered
        ),
        "readers were given what is stored": misread == 0,
        "0 answered early (client)": not ledger.early,
        f"none later than wait + {soak.client_late_bound:g} s (client)": not ledger.late,
        "only JSON lines in the server logs": non_json == 0,
        "no other problem": not ledger.problems,
    }


def _write_log(directory: str, name: str, lines: list[str]) -> None:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{name}.log"), "w") as log:
        log.writelines(line + "\n" for line in lines)


async def run(soak: Soak, keep_logs: str | None = None) -> dict[str, Any]:
    """Run the soak; its report (``report["passed"]``: every check held).

    ``keep_logs``: a directory to write each server's log to (``NAME.log``, its
    stderr lines as they came), to read beside the report afterwards.
    """
    from aiopurgatory.redis.testing import RedisServer

    directory = tempfile.mkdtemp(prefix="longpoll-soak-")
    redis_server = RedisServer(directory)
    await asyncio.to_thread(redis_server.start)
    servers: dict[str, Server] = {}
    ledger = _Ledger()
    faults: list[dict[str, Any]] = []
    statuses: dict[str, int] = {}
    prober: Prober | None = None
    load: list[float] = []
    try:
        url = redis_server.url
        loop = ("--loop", soak.server_loop)
        for name, args in (("a", loop), ("b", loop), ("c", (*loop, "--workers", "2"))):
            servers[name] = await asyncio.to_thread(Server, name, url, *args)
        prober = Prober(
            {name: s.port for name, s in servers.items()}, soak.probe_interval, soak.probe_timeout
        )
        client = _Client(soak, servers, ledger)
        loads = asyncio.create_task(_sample_load(load))
        readers = [asyncio.create_task(client.reader(n)) for n in range(soak.readers)]
        writers = [asyncio.create_task(client.writer(lane)) for lane in range(soak.writers)]
        await _faults(soak, redis_server, servers, faults, client.started)
        await asyncio.sleep(max(0.0, soak.duration - (faults[-1]["at"] if faults else 0)))
        client.posting = False
        await asyncio.gather(*writers)
        await asyncio.sleep(6)  # the readers' last polls: the last posts' deliveries
        client.stopping = True
        await asyncio.wait(readers, timeout=70)
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        stored = {
            topic: await _read_back(servers["a"].port, topic)
            for topic in (f"t{i}" for i in range(soak.topics))
        }
        server_a = await asyncio.to_thread(scrape_metrics, servers["a"].port)
        loads.cancel()
    finally:
        if prober is not None:
            await asyncio.to_thread(prober.stop)
        for name, server in servers.items():
            statuses[name] = await asyncio.to_thread(server.stop)
        await asyncio.to_thread(redis_server.kill)
    logs: dict[str, list[str]] = {}
    early_server = 0
    lateness: dict[str, float] = {}
    late_answers: list[dict[str, Any]] = []
    spikes: list[dict[str, Any]] = []
    restarts: dict[str, float] = {}
    lags: dict[str, list[list[tuple[float, float, float]]]] = {}
    queues: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for name, server in servers.items():
        if keep_logs is not None:
            _write_log(keep_logs, name, server.lines)
        records, other = server.records()
        logs[name] = other
        for r in records:
            event = r.get("event")
            if event == "longpoll.late_answer":
                late_answers.append(r | {"server": f"{name}{r.get('worker', '')}"})
            elif event == "longpoll.loop_lag":
                spikes.append(r | {"server": name})
            elif event == "longpoll.accept_queue":
                queues[name].append((r["at"], r["waiting"]))
            elif event == "longpoll.worker_restarted":
                restarts[name] = _monotonic(r["timestamp"])
        early_server += sum(
            r["answers"].get("early", 0)
            for r in records
            if r.get("event") == "longpoll.stopped" and "answers" in r
        )
        for r in records:
            if r.get("event") == "longpoll.redis_summary":
                where = name if "worker" not in r else f"{name}{r['worker']}"
                lateness[where] = max(lateness.get(where, 0.0), r["lateness_max"])
    ledger.counts["early_server"] = early_server
    checks = _check(soak, ledger, logs, stored)
    checks["0 answered early (servers)"] = early_server == 0
    origin = client.started
    tail = judge_late(late_answers, spikes, soak.late_bound, origin)
    windows = excused_windows(faults, end=origin + 1e6, restarts=restarts)
    for name in servers:
        lags[name] = list(spikes_by_pid(s for s in spikes if s["server"] == name).values())
    probes = judge_probes(
        prober.records, windows, soak.probe_timeout, origin, lags=lags, queues=queues
    )
    checks[f"every parked GET within wait + {soak.late_bound:g} s + its loop lag (servers)"] = (
        len(lateness) >= 4 and tail["past_bound"] == 0
    )
    checks[f"/healthz within {soak.probe_timeout:g} s but in the soak's faults"] = (
        probes["probes"] > 0 and probes["slow"] == 0
    )
    checks["every server exited 0"] = all(status == 0 for status in statuses.values())
    return {
        "soak": vars(soak) | {"command": "python -m examples.longpoll.soak"},
        "counts": dict(sorted(ledger.counts.items())),
        "max_late_s": round(ledger.max_late, 3),
        "server_lateness_max_s": lateness,
        "before_wait_from_written_max_s": round(ledger.before_wait_max, 3),
        "before_wait_from_written": ledger.before_wait,
        # what server a measured itself, from a request's arrival in the application
        "server_a": {
            name: server_a.get(metric)
            for name, metric in (
                ("max_late_s", "longpoll_parked_lateness_max_seconds"),
                ("unavailable_parked", 'longpoll_unavailable_total{request="parked"}'),
                ("unavailable_get", 'longpoll_unavailable_total{request="get"}'),
                ("unavailable_post", 'longpoll_unavailable_total{request="post"}'),
                ("redis_retries", "longpoll_redis_retries_total"),
                ("replayed_posts", "longpoll_replayed_posts_total"),
            )
        },
        "late_answers": tail,
        "healthz": probes,
        "excused": [
            {
                "server": w.server or "all",
                "from": round(w.start - origin, 1),
                "to": None if w.end > origin + 1e5 else round(w.end - origin, 1),
                "why": w.why,
            }
            for w in windows
        ],
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "load_average_1min_during": [min(load, default=0.0), max(load, default=0.0)],
        "faults": [{k: v for k, v in f.items() if k != "t"} for f in faults],
        "exit_statuses": statuses,
        "checks": checks,
        "passed": all(checks.values()),
        "problems": ledger.problems,
        "late": ledger.late[:10],
        "early": ledger.early[:10],
        "non_json": {name: lines[:80] for name, lines in logs.items() if lines},
    }


async def _sample_load(into: list[float]) -> None:
    while True:
        into.append(round(os.getloadavg()[0], 1))
        await asyncio.sleep(5)


def _monotonic(timestamp: str) -> float:
    """An ISO UTC timestamp of a log line on the monotonic clock (to ~1 ms)."""
    wall = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    return wall - time.time() + time.monotonic()


def build_parser() -> argparse.ArgumentParser:
    """The soak's options (defaults are :class:`Soak`'s)."""
    d = Soak()
    p = argparse.ArgumentParser(
        prog="python -m examples.longpoll.soak",
        description="Servers across processes on a real Redis, with faults; checks the ledger.",
    )
    p.add_argument("--duration", type=float, default=d.duration, help="seconds (%(default)s)")
    p.add_argument("--readers", type=int, default=d.readers, help="(%(default)s)")
    p.add_argument("--topics", type=int, default=d.topics, help="(%(default)s)")
    p.add_argument("--writers", type=int, default=d.writers, help="(%(default)s)")
    p.add_argument(
        "--post-rate", type=float, default=d.post_rate, help="POSTs per second (%(default)s)"
    )
    p.add_argument(
        "--hangup-share",
        type=float,
        default=d.hangup_share,
        help="share of GETs whose client hangs up before the answer (%(default)s)",
    )
    p.add_argument(
        "--stop-seconds",
        type=float,
        default=d.stop_seconds,
        help="how long Redis stays SIGSTOPped (%(default)s)",
    )
    p.add_argument(
        "--late-bound",
        type=float,
        default=d.late_bound,
        help="a parked GET answered later than its wait plus this plus the loop lag its "
        "process logged around it, by its own clock from its arrival, fails the soak "
        "(%(default)s)",
    )
    p.add_argument(
        "--client-late-bound",
        type=float,
        default=d.client_late_bound,
        help="a GET answered later than its wait plus this, by the client's clock from "
        "its request written, fails the soak (%(default)s)",
    )
    p.add_argument(
        "--server-loop",
        choices=("auto", "asyncio", "uvloop"),
        default=d.server_loop,
        help="the servers' --loop (%(default)s)",
    )
    p.add_argument("--seed", type=int, default=d.seed, help="(%(default)s)")
    p.add_argument(
        "--keep-logs",
        metavar="DIR",
        help="write each server's log to DIR/NAME.log (default: not kept)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 if every check held, 1 if one did not, 2 for bad arguments."""
    args = build_parser().parse_args(argv)
    try:
        soak = Soak(
            duration=args.duration,
            readers=args.readers,
            topics=args.topics,
            writers=args.writers,
            post_rate=args.post_rate,
            hangup_share=args.hangup_share,
            stop_seconds=args.stop_seconds,
            late_bound=args.late_bound,
            client_late_bound=args.client_late_bound,
            server_loop=args.server_loop,
            seed=args.seed,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = asyncio.run(run(soak, args.keep_logs))
    print(json.dumps(report, indent=1))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
