"""A real ``redis-server`` for tests: started on a free loopback port in a temporary
directory, ended by its pid. Missing ``redis-server`` fails the test (never skips).

Durable like the tests of issue 29 need it: AOF on, ``appendfsync always``, no RDB
snapshots, so a server killed with SIGKILL and started again in the same directory
holds every write it acknowledged.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

__all__ = ["RedisServer", "free_port", "redis_server_binary"]


def redis_server_binary() -> str:
    """The path of ``redis-server``; fails the test with how to install it when missing."""
    path = shutil.which("redis-server")
    if path is None:
        pytest.fail(
            "redis-server is not installed: `make install` installs Debian's package "
            "(as root: apt-get install -y redis-server)",
            pytrace=False,
        )
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """One ``redis-server`` process; :meth:`kill` and :meth:`start` again keep its data."""

    def __init__(self, directory: Path, *, password: str | None = None) -> None:
        self.binary = redis_server_binary()
        self.directory = directory
        self.password = password
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 15.0) -> None:
        """Start it (same port, same directory) and wait until it answers PING."""
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--daemonize",
            "no",
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"redis-server exited with {self.proc.returncode}: "
                    + (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                )
            if time.monotonic() > deadline:
                raise AssertionError("redis-server did not answer PING in time")
            time.sleep(0.02)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                if self.password:
                    sock.sendall(f"AUTH {self.password}\r\n".encode())
                    if not sock.recv(64).startswith(b"+OK"):
                        return False
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL (no shutdown save: what survives is what the AOF fsynced)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=15)

    def stop(self) -> None:
        self.kill()
        self.proc = None
