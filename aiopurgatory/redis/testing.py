"""A throwaway ``redis-server`` for tests and benchmarks.

:class:`RedisServer` starts the machine's ``redis-server`` (Debian's package:
``apt-get install redis-server``) on a free port of 127.0.0.1 with its data in a
directory of the caller's, append-only file on and by default fsynced at every
write (so a killed and restarted server keeps every acknowledged write), and
ends it by its pid. It is what aiopurgatory's own tests and ``python -m aiopurgatory.redis.bench``
use; nothing here is needed in production.

A missing ``redis-server`` raises :class:`RedisServerMissing`, whose message says
how to install it: tests that need Redis fail with it, they do not skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import quote

__all__ = ["INSTALL_HINT", "RedisServer", "RedisServerMissing", "find_redis_server"]

INSTALL_HINT = (
    "redis-server is not installed: install Debian's package with "
    "`sudo apt-get install -y redis-server` (or run `make install` as root, which does it), "
    "or put a redis-server 7.x on PATH or in AIOPURGATORY_REDIS_SERVER"
)


class RedisServerMissing(RuntimeError):
    """``redis-server`` is not on this machine; the message says how to install it."""


def find_redis_server() -> str:
    """The path of ``redis-server``: ``$AIOPURGATORY_REDIS_SERVER``, else PATH, else /usr/bin.

    Raises:
        RedisServerMissing: none found.
    """
    explicit = os.environ.get("AIOPURGATORY_REDIS_SERVER")
    if explicit:
        if os.access(explicit, os.X_OK):
            return explicit
        raise RedisServerMissing(
            f"AIOPURGATORY_REDIS_SERVER={explicit} is not an executable file. {INSTALL_HINT}"
        )
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None
    )
    if found is None:
        raise RedisServerMissing(INSTALL_HINT)
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """A ``redis-server`` process on 127.0.0.1, data in ``directory``; start, kill, restart.

    Args:
        directory: where the server keeps its append-only file and log.
        port: the TCP port; a free one is picked when None.
        password: ``requirepass`` for the default user, if given.
        appendfsync: the append-only file's fsync policy: ``"always"`` (the
            default: a write acknowledged survives a kill) or ``"everysec"``
            (Redis's own default; what a benchmark of throughput wants).
        tls: ``(certificate, key, CA certificate)`` file paths: serve TLS only
            (``rediss://``; clients are not asked for certificates).
        extra_args: more ``redis-server`` arguments (e.g. ``["--user", "alice", "on", ...]``).

    Raises:
        RedisServerMissing: ``redis-server`` is not installed (from the constructor).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        port: int | None = None,
        password: str | None = None,
        appendfsync: str = "always",
        tls: tuple[str, str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        if appendfsync not in ("always", "everysec", "no"):
            raise ValueError(f"appendfsync must be always, everysec or no, got {appendfsync!r}")
        self.executable = find_redis_server()
        self.directory = Path(directory)
        self.port = port if port is not None else _free_port()
        self.password = password
        self.appendfsync = appendfsync
        self.tls = tls
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``, with the password if one is set.

        With TLS: ``rediss://...?ssl_ca_certs=<CA file>``.
        """
        return self.url_for(None, self.password)

    def url_for(self, username: str | None, password: str | None, db: int = 0) -> str:
        """A URL of this server with the given credentials (percent-encoded)."""
        user = quote(username, safe="") if username else ""
        auth = f"{user}:{quote(password, safe='')}@" if password is not None else ""
        if username and password is None:
            auth = f"{user}@"
        if self.tls is None:
            return f"redis://{auth}127.0.0.1:{self.port}/{db}"
        ca = quote(self.tls[2], safe="/")
        return f"rediss://{auth}127.0.0.1:{self.port}/{db}?ssl_ca_certs={ca}"

    @property
    def log_path(self) -> Path:
        return self.directory / "redis.log"

    def start(self, *, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers (data from the append-only file loaded).

        Raises:
            RuntimeError: it exited or did not answer within ``timeout`` seconds
                (the message has the end of its log).
        """
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("redis-server is already running")
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            self.executable,
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--daemonize", "no",
            "--logfile", str(self.log_path),
        ]  # fmt: skip
        if self.tls is None:
            args += ["--port", str(self.port)]
        else:
            cert, key, ca = self.tls
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", cert]
            args += ["--tls-key-file", key, "--tls-ca-cert-file", ca, "--tls-auth-clients", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        args += self.extra_args
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited at start:\n{self._tail()}")
            if self._answers():
                return
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"redis-server did not answer within {timeout} s:\n{self._tail()}")

    def _answers(self) -> bool:
        # Any reply but -LOADING means it serves commands (NOAUTH included).
        try:
            raw = socket.create_connection(("127.0.0.1", self.port), timeout=0.5)
            try:
                sock = raw
                if self.tls is not None:
                    context = ssl.create_default_context(cafile=self.tls[2])
                    sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
                with sock:
                    sock.sendall(b"PING\r\n")
                    reply = sock.recv(64)
            finally:
                raw.close()  # a no-op once wrapped (the TLS socket took it over)
        except OSError:
            return False
        return bool(reply) and not reply.startswith(b"-LOADING")

    def _tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            text = ""
        if not text and self.process is not None and self.process.stderr is not None:
            try:
                text = self.process.stderr.read().decode(errors="replace")
            except (OSError, ValueError):
                text = ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the server (a crash: no shutdown save) and wait for it to be gone."""
        self._end(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open and nothing answers (a hung Redis,
        or a silent network). :meth:`resume` continues it; ending it resumes it first."""
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError("redis-server is not running")
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the server after :meth:`pause`."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM the server and wait for it to exit."""
        self._end(signal.SIGTERM)

    def _end(self, sig: signal.Signals) -> None:
        # Forgotten only once it is gone: ``running`` stays true until then (a
        # benchmark waiting for the kill polls it from another thread).
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(sig)
            # A paused server acts on SIGTERM only once continued.
            process.send_signal(signal.SIGCONT)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stderr is not None:
            process.stderr.close()
        self.process = None

    def restart(self) -> None:
        """Start again on the same port with the same data directory."""
        self._end(signal.SIGTERM)
        self.start()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()


# dir() shows the public API, not the names the module uses.
from .._namespace import public_dir as _public_dir  # noqa: E402

__dir__ = _public_dir(__name__, __all__)
