"""``--workers N``: N server processes on one port, each with its own purgatory.

The supervisor (the process started by the user) binds the port with
``SO_REUSEPORT`` without listening on it (so ``--port 0`` names one port for all,
and the port stays taken while workers restart), then starts N workers,
``python -m examples.longpoll --port P --reuse-port ...``, which each listen on it
with ``SO_REUSEPORT``: the kernel spreads new connections over the listening
sockets, and a socket that only holds the port gets none. The Redis URL or the
PostgreSQL DSN goes to the workers in the environment (``LONGPOLL_REDIS``,
``LONGPOLL_POSTGRES``), never on their command line.

The supervisor forwards the workers' JSON log lines to its stderr with a
``worker`` field, logs ``longpoll.listening`` once every worker listens, restarts a
worker that exits on its own (with a growing pause, at most 5 s), and on
SIGTERM/SIGINT passes SIGTERM to every worker (each answers its parked GETs and
exits 0) and exits 0 if they all did.

Workers die with their supervisor: a supervisor killed with no chance to pass a
signal on (``kill -9``, the OOM killer, a container runtime) leaves no worker
serving. Each worker is told its supervisor's pid (``--supervisor``) and asks the
kernel for SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)`` on Linux;
elsewhere a thread checks its parent every second, as gunicorn's workers do), so it
answers its parked GETs and exits as on any SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Set
from pathlib import Path
from types import FrameType
from typing import IO, Any

__all__ = ["die_with_supervisor", "supervise"]

_ROOT = Path(__file__).resolve().parents[2]
_WRITE = threading.Lock()


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


def emit(event: str, level: str = "info", **fields: Any) -> None:
    """One JSON log line on stderr, shaped like the workers' structlog lines."""
    line = json.dumps({**fields, "event": event, "level": level, "timestamp": _now()})
    with _WRITE:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _worker_argv(args: argparse.Namespace, port: int) -> list[str]:
    """The command line of a worker: every option as given to the supervisor, except
    the port (the one held), ``--workers``, ``--redis`` and ``--postgres`` (passed in the
    environment)."""
    from .__main__ import build_parser

    argv = [sys.executable, "-m", "examples.longpoll", "--port", str(port), "--reuse-port"]
    argv += ["--supervisor", str(os.getpid())]
    for action in build_parser()._actions:
        if not action.option_strings or action.dest in _NOT_PASSED:
            continue
        value = getattr(args, action.dest)
        if action.dest == "gc_threshold":
            value = "python" if value is None else ",".join(map(str, value))
        if isinstance(action, argparse._StoreTrueAction):
            if value:
                argv.append(action.option_strings[-1])
        elif value is not None:
            argv += [action.option_strings[-1], str(value)]
    return argv


_NOT_PASSED = frozenset(
    ("help", "port", "workers", "redis", "postgres", "reuse_port", "supervisor")
)

#: From <linux/prctl.h>: the signal the calling process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def die_with_supervisor(pid: int, *, interval: float = 1.0) -> bool:
    """In a worker: get SIGTERM when the supervisor, process ``pid``, dies.

    Linux: ``prctl(PR_SET_PDEATHSIG, SIGTERM)``, from the kernel at the parent's
    death. Elsewhere: a daemon thread compares the parent's pid with ``pid`` every
    ``interval`` seconds. Returns False if the supervisor is already gone (died
    before this was armed: the worker should exit at once).

    Raises:
        OSError: prctl refused.
    """
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    else:

        def watch() -> None:
            while os.getppid() == pid:
                time.sleep(interval)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()
    # Armed after the fork: a supervisor that died in between left us to init.
    return os.getppid() == pid


class _Worker:
    def __init__(self, index: int, argv: list[str], env: dict[str, str]) -> None:
        self.index = index
        self.argv = argv
        self.env = env
        self.listening = threading.Event()
        self.proc: subprocess.Popen[str] | None = None
        self.reader: threading.Thread | None = None
        self.starts = 0

    def start(self) -> None:
        self.listening.clear()
        self.starts += 1
        self.proc = subprocess.Popen(
            self.argv,
            cwd=_ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        self.reader = threading.Thread(target=self._forward, args=(self.proc.stderr,), daemon=True)
        self.reader.start()

    def _forward(self, stream: IO[str]) -> None:
        for raw in stream:
            line = raw.rstrip("\n")
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict):
                if record.get("event") == "longpoll.listening" and not self.listening.is_set():
                    self.listening.set()
                    record["event"] = "longpoll.worker_listening"
                record["worker"] = self.index
            else:
                # A line the worker wrote without its logger (Python's own, at a
                # crash): passed on as JSON, so that the supervisor's log stays JSON lines.
                record = {
                    "line": line,
                    "event": "longpoll.worker_output",
                    "level": "error",
                    "timestamp": _now(),
                    "worker": self.index,
                }
            line = json.dumps(record)
            with _WRITE:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()


def supervise(
    args: argparse.Namespace, redis_url: str | None, postgres_dsn: str | None = None
) -> int:
    """Run ``args.workers`` workers on one port until SIGTERM/SIGINT; the exit status."""

    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    holder = socket.socket(family)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        holder.bind((args.host, args.port))
    except OSError as exc:
        print(f"error: cannot bind {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 1
    port = holder.getsockname()[1]
    env = dict(os.environ)
    if redis_url is not None:
        env["LONGPOLL_REDIS"] = redis_url
    if postgres_dsn is not None:
        env["LONGPOLL_POSTGRES"] = postgres_dsn
    argv = _worker_argv(args, port)
    workers = [_Worker(i, argv, env) for i in range(args.workers)]
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stopping.is_set():
            return
        stopping.set()
        emit("longpoll.stopping", signal=signal.Signals(signum).name, workers=len(workers))
        for w in workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
                signalled.add(w.proc.pid)

    signalled: set[int] = set()
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for w in workers:
            w.start()
        deadline = time.monotonic() + 60
        for w in workers:
            assert w.proc is not None
            while not w.listening.wait(0.05):
                if w.proc.poll() is not None or time.monotonic() > deadline or stopping.is_set():
                    emit(
                        "longpoll.worker_failed",
                        level="error",
                        worker=w.index,
                        status=w.proc.poll(),
                    )
                    _stop_all(workers)
                    return 1
        emit(
            "longpoll.listening",
            host=args.host,
            port=port,
            url=f"http://{args.host}:{port}/",
            workers=len(workers),
            pids=[w.proc.pid for w in workers if w.proc is not None],
            waiter="purgatory",
            **_store_fields(redis_url, postgres_dsn),
        )
        pause = {w.index: 0.5 for w in workers}
        while not stopping.is_set():
            for w in workers:
                assert w.proc is not None
                status = w.proc.poll()
                if status is None or stopping.is_set():
                    continue
                emit("longpoll.worker_exited", level="error", worker=w.index, status=status)
                stopping.wait(pause[w.index])
                pause[w.index] = min(5.0, pause[w.index] * 2)
                if not stopping.is_set():
                    w.start()
                    emit("longpoll.worker_restarted", worker=w.index, pid=w.proc.pid)
            stopping.wait(0.2)
        statuses = _stop_all(workers, signalled=signalled)
        emit("longpoll.stopped", workers=statuses)
        return 0 if all(s == 0 for s in statuses) else 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        holder.close()


def _store_fields(redis_url: str | None, postgres_dsn: str | None) -> dict[str, Any]:
    """Where the workers keep the feed, for the ``longpoll.listening`` line (no password)."""
    if postgres_dsn is not None:
        from .pgfeed import describe_dsn

        return {"postgres": describe_dsn(postgres_dsn)}
    if redis_url is None:
        return {"redis": None}
    from aiopurgatory.redis import describe_url

    return {"redis": describe_url(redis_url)}


def _stop_all(
    workers: list[_Worker], timeout: float = 60.0, *, signalled: Set[int] = frozenset()
) -> list[int | None]:
    """SIGTERM to the workers still running (except the pids ``signalled`` already); their
    exit statuses (killed past ``timeout``)."""
    for w in workers:
        if w.proc is not None and w.proc.poll() is None and w.proc.pid not in signalled:
            w.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    statuses: list[int | None] = []
    for w in workers:
        if w.proc is None:
            statuses.append(None)
            continue
        try:
            statuses.append(w.proc.wait(max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            w.proc.kill()
            statuses.append(w.proc.wait())
        if w.reader is not None:
            with contextlib.suppress(RuntimeError):
                w.reader.join(timeout=5)
    return statuses
