"""``aiopurgatory bench jobs``: from a background job's end to the waiting request's answer.

Usage::

    aiopurgatory bench jobs [--systems celery,rq,saq,dramatiq,arq] [--waits 1000]
        [--web-workers 2] [--rate 250] [--poll 0.25] [--modes triggers,poll]
        [--count-seconds 5] [--restart-redis OUTAGE] [--kill-worker] [--timeout 120]
        [--json PATH]

For each job system and mode, on a Redis of its own (``redis-server``, started
here): the system's worker (:mod:`._jobs_systems` says how: Celery's threads
pool, RQ's ``SimpleWorker``, saq's worker, Dramatiq's with 8 threads, arq's
worker),
``uvicorn --workers N`` serving ``GET /wait/{id}``
(:mod:`._jobs_app`), and a load client in a process of its own
(:mod:`._jobs_client`, raw sockets, so its CPU is apart from the servers').
The client parks ``--waits`` requests, one per task id, *before* the tasks
exist; the commands Redis processes per second are counted over
``--count-seconds`` while they all wait; then the tasks are sent, ``--rate``
per second, and each returns the time it ended (``time.time()``). The latency
of a request is the time its answer had arrived at the client minus its task's
end: the result stored, the end published, the request woken, the result read
back through the job system, the answer sent. Modes: ``triggers``
(``aiopurgatory.jobs``) and ``poll`` (asking the job system every ``--poll``
seconds, what applications write without it). Needs the systems' extras,
uvicorn and starlette, and ``redis-server``; arq, which pins redis-py below 6,
runs from a venv of its own (``make test-arq``'s ``.venv-arq``), one system
per run there.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "run"]

MODES = ("triggers", "poll")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(process: subprocess.Popen[bytes], port: int, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the web server exited ({process.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the web server did not listen within {seconds} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _commands(client: Any) -> int:
    return int(client.info("stats")["total_commands_processed"])


def _send(send: Any, task_id: str, patience: float = 60.0) -> int:
    """Send one task, as a producer that retries does (Redis may be away); the retries."""
    deadline = time.monotonic() + patience
    retries = 0
    while True:
        try:
            send(task_id)
            return retries
        except Exception:
            if time.monotonic() > deadline:
                raise
            retries += 1
            time.sleep(0.1)


def _round(
    port: int,
    ids: list[str],
    send: Any,
    rate: float,
    redis_client: Any,
    count_s: float,
    fault: Any = None,
) -> dict[str, Any]:
    """Park a request per id, count Redis's commands, send the tasks; the measurements.

    ``fault``, if given, is called (in a thread of its own) once half the tasks
    are sent: the faults of ``--restart-redis`` and ``--kill-worker``.
    """
    client = subprocess.Popen(
        [sys.executable, "-m", "aiopurgatory.bench._jobs_client", str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert client.stdin is not None
    assert client.stdout is not None
    client.stdin.write(("\n".join(ids) + "\n\n").encode())
    client.stdin.flush()
    if client.stdout.readline().strip() != b"parked":
        raise RuntimeError("the load client failed")
    time.sleep(min(2.0, count_s))  # every request reached a server and is parked
    before, started = _commands(redis_client), time.monotonic()
    time.sleep(count_s)
    waiting_rate = (_commands(redis_client) - before) / (time.monotonic() - started)
    interval = 1.0 / rate
    next_at = time.monotonic()
    retries = 0
    faulter = None
    for sent, task_id in enumerate(ids):
        if fault is not None and sent == len(ids) // 2:
            faulter = threading.Thread(target=fault, name="bench-fault")
            faulter.start()
        retries += _send(send, task_id)
        next_at += interval
        pause = next_at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    if faulter is not None:
        faulter.join()
    answers = json.loads(client.stdout.readline())
    client.wait(timeout=30)
    latencies = []
    errors: dict[str, int] = {}
    results: dict[str, bool] = {}
    for task_id in ids:
        answered_at, body = answers[task_id]
        answer = json.loads(body) if body.startswith("{") else {"error": "unreadable answer"}
        results[task_id] = "end" in answer
        if "end" in answer:
            latencies.append(answered_at - float(answer["end"]))
        else:
            errors[str(answer.get("error"))] = errors.get(str(answer.get("error")), 0) + 1
    latencies.sort()
    measured: dict[str, Any] = {
        "waits": len(ids),
        "answered": len(answers),
        "redis_commands_per_s_while_waiting": round(waiting_rate, 1),
    }
    if latencies:
        measured.update(
            p50_ms=round(1000 * statistics.median(latencies), 2),
            p99_ms=round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 2),
            max_ms=round(1000 * latencies[-1], 2),
        )
    if fault is not None:
        measured.update(answered_with_result=len(latencies), errors=errors, send_retries=retries)
        measured["_results"] = results
    return measured


class _Supervisor:
    """The job system's worker process, started again when it exits once :meth:`watch`
    is called (as systemd or Kubernetes would: RQ's worker quits on a Redis outage)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Any) -> None:
        self._argv, self._env, self._log = argv, env, log
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.restarts = 0
        self.process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self._argv,
            env=self._env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def watch(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bench-supervisor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(0.5):
            if self.process.poll() is not None:
                self.restarts += 1
                self.process = self._start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        _stop(self.process)


def _after_the_faults(
    driver: Any, url: str, ids: list[str], answered: dict[str, bool]
) -> dict[str, Any]:
    """Which jobs the system finished (asked through its own API), and which of those
    waiters did not get their result: the figure that must be 0."""
    import asyncio

    # The systems' app modules (Celery's, Dramatiq's) read their Redis from the
    # environment when imported; here they are only read through, as in mode poll.
    os.environ.update(AIOPURGATORY_BENCH_REDIS=url, AIOPURGATORY_BENCH_MODE="poll")

    async def ask() -> list[bool]:
        await driver.start(url, None)
        try:
            return [(await driver.poll_once(task_id))[0] for task_id in ids]
        finally:
            await driver.stop()

    finished = asyncio.run(ask())
    return {
        "jobs_finished": sum(finished),
        "finished_but_not_answered": sum(
            1 for task_id, done in zip(ids, finished, strict=True) if done and not answered[task_id]
        ),
    }


def _tracebacks(log: Path) -> dict[str, int]:
    """Tracebacks in the worker's and web servers' output, and those through the library."""
    text = log.read_text(errors="replace")
    blocks = text.split("Traceback (most recent call last):")[1:]
    return {
        "tracebacks": len(blocks),
        "tracebacks_through_aiopurgatory": sum(
            1 for block in blocks if "aiopurgatory/jobs" in block or "aiopurgatory/redis" in block
        ),
    }


def run(
    system: str,
    mode: str,
    *,
    waits: int,
    web_workers: int,
    rate: float,
    poll: float,
    count_s: float = 5.0,
    outage: float | None = None,
    kill_worker: bool = False,
    timeout: float = 120.0,
) -> dict[str, Any]:
    """One system's and mode's run, on a Redis and servers of its own; its measurements.

    ``outage``: Redis is killed (SIGKILL) once half the jobs are sent and started
    again (same port, its append-only file) that many seconds later; the result
    then says which jobs the system finished and whether their waiters got them.
    ``kill_worker``: the worker's processes are killed (SIGKILL) once half the
    jobs are sent, mid-job at this rate. A worker that exits is then started
    again (``worker_restarts``).
    ``timeout``: each request's wait, in seconds.
    """
    import redis

    from ..redis.testing import RedisServer
    from ._jobs_systems import SYSTEMS

    driver = SYSTEMS[system]()

    with tempfile.TemporaryDirectory(prefix="aiopurgatory-bench-jobs-") as tmp:
        server = RedisServer(Path(tmp) / "redis", appendfsync="everysec")
        server.start()
        env = {
            **os.environ,
            "AIOPURGATORY_BENCH_REDIS": server.url,
            "AIOPURGATORY_BENCH_MODE": mode,
            "AIOPURGATORY_BENCH_POLL": str(poll),
            "AIOPURGATORY_BENCH_SYSTEM": system,
            "AIOPURGATORY_BENCH_TIMEOUT": str(timeout),
        }
        log = (Path(tmp) / "servers.log").open("wb")
        port = _free_port()
        supervisor = _Supervisor(driver.worker_argv(server.url), env, log)
        web = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "aiopurgatory.bench._jobs_app:app",
             "--workers", str(web_workers), "--port", str(port), "--log-level", "warning",
             "--no-access-log", "--backlog", "4096"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        send, close_sender = driver.sender(server.url)
        redis_client = redis.Redis.from_url(server.url)
        try:
            _wait_listening(web, port)

            # Warm-up (not measured): worker, servers' threads and connections.
            warm = [str(uuid.uuid4()) for _ in range(20)]
            _round(port, warm, send, 100.0, redis_client, min(count_s, 0.5))
            ids = [str(uuid.uuid4()) for _ in range(waits)]

            faulty = outage is not None or kill_worker

            def fault() -> None:
                supervisor.watch()  # a worker that quits or is killed is started again
                if kill_worker:
                    os.killpg(supervisor.process.pid, signal.SIGKILL)
                if outage is None:
                    return
                server.kill()
                time.sleep(outage)
                server.start()

            result = _round(port, ids, send, rate, redis_client, count_s, fault if faulty else None)
            if faulty:
                result.update(_after_the_faults(driver, server.url, ids, result.pop("_results")))
                result["worker_restarts"] = supervisor.restarts
        finally:
            _stop(web)
            supervisor.stop()
            close_sender()
            redis_client.close()
            server.kill()
            log.close()
            if outage is not None or kill_worker:
                result.update(_tracebacks(Path(tmp) / "servers.log"))
    return {
        "system": system,
        "mode": mode,
        "web_workers": web_workers,
        "rate": rate,
        "poll_s": poll,
        **result,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``aiopurgatory bench jobs``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="aiopurgatory bench jobs",
        description="From a background job's end to the waiting HTTP request's answer: "
        "aiopurgatory.jobs against polling, per job system.",
    )
    parser.add_argument("--waits", type=int, default=1000, help="requests waiting (1000)")
    parser.add_argument("--web-workers", type=int, default=2, help="uvicorn --workers (2)")
    parser.add_argument("--rate", type=float, default=250.0, help="tasks sent per second (250)")
    parser.add_argument("--poll", type=float, default=0.25, help="poll mode's interval (0.25 s)")
    parser.add_argument("--modes", default=",".join(MODES), help="triggers,poll")
    parser.add_argument(
        "--systems", default="celery", help="of celery,rq,saq,dramatiq,arq (celery)"
    )
    parser.add_argument(
        "--count-seconds",
        type=float,
        default=5.0,
        help="seconds Redis's commands are counted while the requests wait (5)",
    )
    parser.add_argument(
        "--restart-redis",
        type=float,
        metavar="OUTAGE",
        help="kill Redis once half the jobs are sent, start it again OUTAGE s later, "
        "and report which finished jobs' waiters did not get their result",
    )
    parser.add_argument(
        "--kill-worker",
        action="store_true",
        help="SIGKILL the job system's worker once half the jobs are sent (mid-job), start "
        "it again, and report which finished jobs' waiters did not get their result",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="each request's wait (120 s)")
    parser.add_argument("--json", type=Path, help="write the results there too")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: a comma-separated list of {', '.join(MODES)}")
    if args.waits < 1 or args.web_workers < 1 or min(args.rate, args.poll, args.count_seconds) <= 0:
        parser.error("--waits and --web-workers must be >= 1; --rate, --poll, --count-seconds > 0")
    if args.timeout <= 0 or (args.restart_redis is not None and args.restart_redis < 0):
        parser.error("--timeout must be > 0 and --restart-redis >= 0")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    from ._jobs_systems import SYSTEMS

    systems = [s for s in args.systems.split(",") if s]
    if not systems or set(systems) - set(SYSTEMS):
        parser.error(f"--systems: a comma-separated list of {', '.join(SYSTEMS)}")
    results = []
    for system, mode in ((system, mode) for system in systems for mode in modes):
        result = run(
            system,
            mode,
            waits=args.waits,
            web_workers=args.web_workers,
            rate=args.rate,
            poll=args.poll,
            count_s=args.count_seconds,
            outage=args.restart_redis,
            kill_worker=args.kill_worker,
            timeout=args.timeout,
        )
        results.append(result)
        print(json.dumps(result), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
