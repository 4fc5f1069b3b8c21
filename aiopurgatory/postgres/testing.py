"""A throwaway PostgreSQL server for tests and benchmarks.

:class:`PostgresServer` starts the machine's PostgreSQL (Debian's ``postgresql``
package: binaries in ``/usr/lib/postgresql/<version>/bin``) on a free loopback
port, its data and socket directories in a new temporary directory, with
durability off (``fsync=off``: a test server, not a store), and removes it all at
:meth:`PostgresServer.destroy`. The cluster is made by ``initdb`` once per process
and copied for each server (a copy takes milliseconds, ``initdb`` about a
second). ``initdb`` and the server refuse to run as root: as root they run as the
``postgres`` user (which the package creates), in directories that user owns.
It is what aiopurgatory's own tests and ``python -m aiopurgatory.postgres.bench``
use; nothing here is needed in production.

A missing installation raises :class:`PostgresMissing`, whose message says how to
install it: tests that need PostgreSQL fail with it, they do not skip.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from .._namespace import public_dir as _public_dir

__all__ = ["INSTALL_HINT", "PostgresMissing", "PostgresServer", "find_bindir"]

INSTALL_HINT = (
    "PostgreSQL's server binaries (initdb, postgres) are missing: install Debian's "
    "package with 'sudo apt-get install -y postgresql' (`make install` does it where "
    "it can); the PostgreSQL tests need a real server"
)


class PostgresMissing(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def find_bindir() -> Path:
    """The directory of ``initdb`` and ``postgres`` (the newest Debian version, or PATH).

    Raises:
        PostgresMissing: none found.
    """
    override = os.environ.get("AIOPURGATORY_PG_BINDIR")
    candidates = [override] if override else []
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True
    )
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).parent))
    for candidate in candidates:
        path = Path(candidate)
        if (path / "initdb").is_file() and (path / "postgres").is_file():
            return path
    raise PostgresMissing(INSTALL_HINT)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_as() -> dict[str, Any]:
    """Popen arguments that drop root to the ``postgres`` user (nothing otherwise)."""
    if os.geteuid() != 0:
        return {}
    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresMissing(
            "running as root, and there is no 'postgres' user to run PostgreSQL as "
            "(Debian's postgresql package creates it)"
        ) from None
    return {"user": entry.pw_uid, "group": entry.pw_gid}


def _chown(path: Path) -> None:
    run_as = _run_as()
    if run_as:
        os.chown(path, run_as["user"], run_as["group"])


_template: Path | None = None


def _cluster_template(bindir: Path) -> Path:
    """A fresh cluster made by initdb, once per process (copied for each server)."""
    global _template
    if _template is not None and _template.exists():
        return _template
    base = Path(tempfile.mkdtemp(prefix="aiopurgatory-pg-template-"))
    # About 40 MB a process: removed when the process exits (a test run's
    # workers and subprocesses each make one).
    atexit.register(shutil.rmtree, base, True)
    _chown(base)
    data = base / "data"
    subprocess.run(
        [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        ],
        check=True,
        capture_output=True,
        **_run_as(),
    )
    _template = data
    return data


class PostgresServer:
    """One PostgreSQL server on 127.0.0.1 and a free port (see the module documentation).

    Args:
        settings: server settings (``-c name=value``) beside the defaults.

    Raises:
        PostgresMissing: no server binaries (or, as root, no ``postgres`` user).
    """

    def __init__(self, **settings: str) -> None:
        self.bindir = find_bindir()
        template = _cluster_template(self.bindir)
        self.base = Path(tempfile.mkdtemp(prefix="aiopurgatory-pg-"))
        _chown(self.base)
        self.data = self.base / "data"
        subprocess.run(["cp", "-a", str(template), str(self.data)], check=True)
        self.sockets = self.base / "sockets"
        self.sockets.mkdir()
        _chown(self.sockets)
        self.port = _free_port()
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.sockets),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "16MB",
            "max_connections": "60",
            "log_min_messages": "fatal",
            **settings,
        }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        """The server's ``postgresql://`` DSN (user postgres, no password, trust auth)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self, within: float = 30.0) -> None:
        """Start the server and wait until it accepts connections.

        Raises:
            RuntimeError: it exited or did not accept within ``within`` seconds.
        """
        args = [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port)]
        for name, value in self.settings.items():
            args += ["-c", f"{name}={value}"]
        log = open(self.base / "server.log", "ab")  # noqa: SIM115 - the server's, closed on stop
        self.proc = subprocess.Popen(args, stdout=log, stderr=log, **_run_as())
        log.close()
        deadline = time.monotonic() + within
        import psycopg

        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited at start: {self.log()[-2000:]}")
            try:
                psycopg.connect(self.dsn, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"postgres did not start: {self.log()[-2000:]}") from None
                time.sleep(0.05)

    def log(self) -> str:
        """The server's log so far."""
        path = self.base / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def pids(self) -> list[int]:
        """The postmaster's pid and its children's (the backends)."""
        assert self.proc is not None
        main = self.proc.pid
        found = [main]
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == main:
                found.append(int(stat.split("/")[2]))
        return found

    def pause(self) -> None:
        """SIGSTOP the server and every backend: it accepts nothing and answers nothing."""
        for pid in self.pids():
            os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT what :meth:`pause` stopped."""
        for pid in self.pids():
            os.kill(pid, signal.SIGCONT)

    def stop(self) -> None:
        """Fast shutdown (SIGINT: every session ended), waited for."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        """:meth:`stop`, then :meth:`start` on the same port and data."""
        self.stop()
        self.start()

    def destroy(self) -> None:
        """Stop the server and remove its directory. Idempotent."""
        if self.proc is not None:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()


__dir__ = _public_dir(__name__, __all__)
