"""The soak's processes (:mod:`examples.longpoll.soak`): the servers, the ``/healthz``
prober, and a one-off Redis command."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["Prober", "Server", "redis_cli"]

_ROOT = Path(__file__).resolve().parents[2]


class Server:
    """``python -m examples.longpoll`` in a subprocess; every stderr line kept."""

    def __init__(self, name: str, redis_url: str, *args: str) -> None:
        self.name = name
        env = dict(os.environ, LONGPOLL_REDIS=redis_url)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "examples.longpoll", "--port", "0", *args],
            cwd=_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._listening = threading.Event()
        self.first: dict[str, Any] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._listening.wait(60):
            self.proc.kill()
            raise RuntimeError(f"server {name} did not start: {self.lines[-5:]}")
        self.port: int = self.first["port"]
        #: Loop-clock time it was sent SIGTERM (its parked GETs are answered then).
        self.terminated_at: float | None = None

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.rstrip("\n")
            self.lines.append(line)
            if not self._listening.is_set():
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if isinstance(record, dict) and record.get("event") == "longpoll.listening":
                        self.first = record
                        self._listening.set()

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            status = self.proc.wait()
        self._reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return status

    def records(self) -> tuple[list[dict[str, Any]], list[str]]:
        """Its stderr lines as JSON objects, and the lines that are not.

        A worker's own line that the supervisor passed on wrapped as JSON
        (``longpoll.worker_output``) counts as not JSON: a worker logs everything,
        its refusal to start while Redis is away and what uvicorn logs included, as
        JSON lines of its own.
        """
        records, other = [], []
        for line in self.lines:
            try:
                record = json.loads(line)
            except ValueError:
                other.append(line)
                continue
            if not isinstance(record, dict):
                other.append(line)
            elif record.get("event") == "longpoll.worker_output":
                other.append(str(record.get("line")))
            else:
                records.append(record)
        return records, other


def redis_cli(port: int, *command: str) -> str:
    import redis

    client = redis.Redis(port=port, socket_timeout=5, socket_connect_timeout=5)
    try:
        return str(client.execute_command(*command))  # type: ignore[no-untyped-call]
    finally:
        client.close()


class Prober:
    """``python -m examples.longpoll.healthprobe`` in a subprocess; its lines kept as records.

    Args:
        ports: server name to port.
        interval, timeout: the probes' schedule and deadline (seconds).
    """

    def __init__(self, ports: dict[str, int], interval: float, timeout: float) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "examples.longpoll.healthprobe",
                f"--interval={interval}",
                f"--timeout={timeout}",
                *(f"{name}={port}" for name, port in ports.items()),
            ],
            cwd=_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.records: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.records.append(json.loads(line))

    def stop(self, timeout: float = 10) -> int:
        """Close its standard input (it stops probing) and wait; its exit status.

        Raises:
            subprocess.TimeoutExpired: it did not stop within ``timeout`` (it is killed).
        """
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()
        try:
            status = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        self._reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return status
