"""The soak's judgement of the tail (:mod:`examples.longpoll.soakcheck`) and its
``/healthz`` prober (:mod:`examples.longpoll.healthprobe`), without a soak."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog
import structlog.testing

from examples.longpoll.acceptq import AcceptQueue, AcceptQueueCollector, accept_queue
from examples.longpoll.healthprobe import probe_once, run
from examples.longpoll.soakcheck import (
    Window,
    excused_windows,
    judge_late,
    judge_probes,
    lag_around,
)

ROOT = Path(__file__).resolve().parents[3]


def _answer(start: float, wait: float, late: float, pid: int = 7) -> dict[str, Any]:
    return {
        "server": "a",
        "pid": pid,
        "start": start,
        "wait": wait,
        "answered": start + wait + late,
        "late_s": late,
        "status": 200,
        "topic": "t1",
    }


def _spike(asked: float, lag: float, pid: int = 7) -> dict[str, Any]:
    return {"asked": asked, "ended": asked + lag, "lag_s": lag, "pid": pid}


def test_the_lag_around_an_answer_is_the_overdue_time_within_its_late_window() -> None:
    spikes = [(10.0, 11.0, 1.0), (11.1, 11.5, 0.4), (20.0, 20.2, 0.2)]
    # due at 10.5, answered at 11.3: 0.5 of the first probe, 0.2 of the second
    assert lag_around(spikes, 10.5, 11.3) == pytest.approx(0.7)
    assert lag_around(spikes, 12.0, 19.0) == 0.0
    assert lag_around(spikes, 5.0, 30.0) == pytest.approx(1.6)
    assert lag_around(spikes, 11.0, 10.0) == 0.0


def test_a_late_answer_passes_with_the_lag_its_process_measured_and_fails_without() -> None:
    answers = [
        _answer(start=100.0, wait=2.0, late=3.5),  # due 102, answered 105.5
        _answer(start=100.0, wait=2.0, late=2.52, pid=10),  # within 2.5 s + 0.05 s unlogged
        _answer(start=100.0, wait=2.0, late=3.5, pid=8),  # another process: no lag there
    ]
    # pid 7's loop was behind from 101.5 to 103.5: 1.5 s of it after the answer was due
    spikes = [_spike(101.5, 2.0), _spike(103.0, 0.3, pid=9)]
    report = judge_late(answers, spikes, bound=2.5, origin=90.0)
    assert report["count"] == 3
    assert report["past_bound"] == 1
    (past,) = report["past"]
    assert past["late_s"] == 3.5
    assert past["lag_s"] == 0.0
    assert past["allowed_s"] == 2.55
    kept = [a for a in report["answers"] if a["late_s"] == 3.5 and a["lag_s"] > 0]
    assert kept == [
        {
            "server": "a",
            "at": 15.5,
            "status": 200,
            "wait": 2.0,
            "late_s": 3.5,
            "lag_s": 1.5,
            "allowed_s": 4.05,
        }
    ]
    assert report["late_max_s"] == 3.5
    assert report["lag_max_s"] == 1.5
    assert report["excess_max_s"] == pytest.approx(0.95)
    assert judge_late(answers, spikes, bound=2.5, origin=90.0, unlogged=0.0)["past_bound"] == 2
    assert judge_late([], [], bound=2.5, origin=0.0)["past_bound"] == 0


def test_the_windows_excused_are_the_soaks_own_stops_only() -> None:
    faults = [
        {"fault": "worker SIGKILL", "t": 10.0},
        {"fault": "redis SIGKILL", "t": 20.0},
        {"fault": "redis restarted", "t": 23.0},
        {"fault": "redis SIGSTOP", "t": 40.0},
        {"fault": "redis SIGCONT", "t": 48.0},
        {"fault": "CLIENT KILL TYPE pubsub", "t": 55.0},
        {"fault": "server b SIGTERM", "t": 80.0},
    ]
    windows = excused_windows(faults, end=999.0, restarts={"c": 11.5})
    assert windows == [
        Window(10.0, 11.5, "worker of c SIGKILLed", "c"),
        Window(20.0, 23.0, "redis SIGKILL to redis restarted"),
        Window(40.0, 48.0, "redis SIGSTOP to redis SIGCONT"),
        Window(80.0, 999.0, "server b SIGTERMed", "b"),
    ]
    # without the supervisor's restart line, c is excused 10 s
    assert excused_windows(faults[:1], end=999.0)[0].end == 20.0
    with pytest.raises(ValueError, match="never ended"):
        excused_windows(faults[3:4], end=999.0)


def test_a_slow_probe_is_reported_unless_a_fault_of_the_soak_excuses_it() -> None:
    windows = [Window(40.0, 48.0, "redis SIGSTOP to redis SIGCONT"), Window(80.0, 999.0, "b", "b")]
    probes = [
        {"server": "a", "sent": 30.0, "took": 0.01, "error": None, "prober_lag_s": 0.0},
        {"server": "a", "sent": 47.5, "took": None, "error": "timeout", "prober_lag_s": 0.0},
        {"server": "a", "sent": 49.0, "took": None, "error": "timeout", "prober_lag_s": 0.02},
        {"server": "c", "sent": 60.0, "took": 1.4, "error": None, "prober_lag_s": 0.0},
        {"server": "b", "sent": 85.0, "took": None, "error": "ConnectionRefusedError"},
        {"server": "a", "sent": 85.0, "took": None, "error": "ConnectionRefusedError"},
    ]
    lags = {"c": [[(59.0, 60.5, 1.5)], [(59.9, 60.2, 0.3)]]}  # c's two processes
    queues = {"c": [(59.0, 900), (60.3, 400), (62.0, 800)], "a": [(49.5, 10)]}
    report = judge_probes(probes, windows, timeout=1.0, origin=10.0, lags=lags, queues=queues)
    assert report["probes"] == 6
    assert report["excused"] == 2  # a in Redis's stop, b after its SIGTERM
    assert report["slow"] == 3
    assert [(p["server"], p["at"], p["took_s"], p["error"]) for p in report["listed"]] == [
        ("a", 39.0, None, "timeout"),  # after SIGCONT: not excused
        ("c", 50.0, 1.4, None),
        ("a", 75.0, None, "ConnectionRefusedError"),
    ]
    assert report["took_max_s"] == 1.4
    by_server = {p["server"]: p for p in report["listed"]}
    # beside the slow probe of c: its worse process's lag in the probe's time, and the
    # most connections waiting to be accepted then
    assert by_server["c"]["server_lag_s"] == 0.5
    assert by_server["c"]["accept_queue"] == 400
    assert report["listed"][0]["accept_queue"] == 10
    assert report["listed"][0]["server_lag_s"] == 0.0


async def _healthz_server(delay: float) -> asyncio.Server:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            await asyncio.sleep(delay)
            body = json.dumps({"pid": 42, "loop_lag_max_s": 0.01}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
        except ConnectionError:
            pass  # the prober gave up on this one
        finally:
            writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


async def test_the_prober_times_each_probe_and_gives_up_at_its_deadline() -> None:
    fast, slow = await _healthz_server(0.0), await _healthz_server(0.6)
    async with fast, slow:
        fast_port = fast.sockets[0].getsockname()[1]
        slow_port = slow.sockets[0].getsockname()[1]
        answered = await probe_once(fast_port, 1.0)
        assert answered["status"] == 200
        assert answered["error"] is None
        assert answered["pid"] == 42
        assert answered["loop_lag_max_s"] == 0.01
        assert 0 <= answered["took"] < 0.5
        late = await probe_once(slow_port, 0.3)
        assert late["error"] == "timeout"
        assert late["took"] is None
        await asyncio.sleep(0.5)  # the slow server's answer, to nobody, is over
    refused = await probe_once(fast_port, 1.0)  # closed now
    assert refused["error"] == "ConnectionRefusedError"
    stop = asyncio.Event()
    stop.set()
    with pytest.raises(ValueError, match="interval"):
        await run({"a": fast_port}, 0, 1.0, stop)
    with pytest.raises(ValueError, match="ports"):
        await run({}, 0.5, 1.0, stop)


async def test_the_prober_process_probes_on_schedule_until_its_stdin_closes() -> None:
    server = await _healthz_server(0.0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "examples.longpoll.healthprobe",
            "--interval=0.1",
            f"x={port}",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,  # where examples/ is importable from
        )
        assert proc.stdout is not None
        assert proc.stdin is not None
        first = await asyncio.wait_for(proc.stdout.readline(), 30)  # once it started
        await asyncio.sleep(1.0)
        proc.stdin.close()
        out, _ = await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 0
    records = [json.loads(line) for line in [first, *out.splitlines()]]
    # ~10 a second: 1 s on a loaded machine gives a few at least
    assert len(records) >= 4
    assert all(r["server"] == "x" and r["status"] == 200 for r in records)
    sent = [r["sent"] for r in records]
    assert all(0.05 < b - a < 0.5 for a, b in itertools.pairwise(sent))


def test_the_accept_queue_is_the_connections_not_yet_accepted() -> None:
    listener = socket.create_server(("127.0.0.1", 0), backlog=7)
    with listener:
        queue = AcceptQueue(listener, log_over=None)
        assert queue.sample() == 0
        clients = [socket.create_connection(listener.getsockname()) for _ in range(3)]
        try:
            assert accept_queue(listener) == (3, 7)
            accepted, _ = listener.accept()
            accepted.close()
            assert queue.sample() == 2
            assert queue.peak == 2
            (family,) = AcceptQueueCollector(queue).collect()
            assert family.samples[0].value == 2
        finally:
            for client in clients:
                client.close()
    assert accept_queue(listener) is None  # closed
    assert AcceptQueue(None).sample() is None
    assert list(AcceptQueueCollector(AcceptQueue(None)).collect()) == []
    with pytest.raises(ValueError, match="interval"):
        AcceptQueue(None, interval=0)
    with pytest.raises(ValueError, match="log_over"):
        AcceptQueue(None, log_over=-1)


async def test_the_accept_queue_is_logged_over_its_threshold_while_entered() -> None:
    listener = socket.create_server(("127.0.0.1", 0), backlog=7)
    clients = [socket.create_connection(listener.getsockname()) for _ in range(3)]
    try:
        queue = AcceptQueue(listener, interval=0.02, log_over=2)
        with structlog.testing.capture_logs() as logs:
            async with queue:
                with pytest.raises(RuntimeError, match="already running"):
                    await queue.__aenter__()
                await asyncio.sleep(0.1)
        lines = [line for line in logs if line["event"] == "longpoll.accept_queue"]
        assert lines, logs
        assert all(line["waiting"] == 3 for line in lines)
        assert lines[0]["at"] > 0
        assert queue.latest == 3
    finally:
        for client in clients:
            client.close()
        listener.close()


def test_the_prober_refuses_bad_arguments() -> None:
    from examples.longpoll import healthprobe

    with pytest.raises(SystemExit):
        healthprobe.main(["a=x"])
    with pytest.raises(SystemExit):
        healthprobe.main(["--interval=0", "a=1"])
