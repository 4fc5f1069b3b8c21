"""Fixtures of the job systems' tests: one Redis (or PostgreSQL) and real workers per module.

A worker is started once per module (seconds each) and shares the module's
Redis; each test uses its own job ids, so tests do not see each other's jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from aiopurgatory import Purgatory, Triggers
from aiopurgatory.jobs import END
from aiopurgatory.redis import RedisTriggers
from aiopurgatory.redis.testing import RedisServer, RedisServerMissing
from tests.jobs.traced import tracer_here

if TYPE_CHECKING:
    # Imported where used: .venv-arq (tests/jobs/test_arq.py) has no postgres extra.
    from aiopurgatory.postgres import PostgresTriggers
    from aiopurgatory.postgres.testing import PostgresServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def here() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """A TracerProvider of the test's own, exporting to memory (the tracing tests' waits)."""
    provider, exporter = tracer_here()
    yield provider, exporter
    provider.shutdown()


@pytest.fixture(scope="module")
def jobs_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server for the module's job system (broker, results, triggers)."""
    try:
        server = RedisServer(tmp_path_factory.mktemp("redis"))
    except RedisServerMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def jobs_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL for the module's job system queued in it (its jobs and the triggers)."""
    from aiopurgatory.postgres.testing import PostgresMissing, PostgresServer

    try:
        server = PostgresServer()
    except PostgresMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    server.start()
    yield server
    server.destroy()


class WorkerProcess:
    """A job system's worker, started as its users start it, ended by its pid."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        url: str,
        log: Path,
        ready: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path = ROOT,
    ) -> None:
        self.args = list(args)
        self.log = log
        self.ready = ready
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(cwd), str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "AIOPURGATORY_JOBS_REDIS": url,
            "AIOPURGATORY_JOBS_READY": str(ready),
            **(env or {}),
        }
        self._env = env
        self._cwd = cwd
        self.respawns = 0
        ready.unlink(missing_ok=True)
        self._log_file = log.open("ab")
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.args,
            cwd=self._cwd,
            env=self._env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its pool's children are ended with it
        )

    def respawn_if_exited(self) -> bool:
        """Start the worker again if it exited, as a supervisor (systemd's
        ``Restart=``) would; True if it did."""
        if self.process.poll() is None:
            return False
        self._kill_group()
        self.ready.unlink(missing_ok=True)
        self.process = self._spawn()
        self.respawns += 1
        return True

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self.process.poll() is not None:
                pytest.fail(f"the worker exited at start:\n{self.tail()}", pytrace=False)
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"the worker was not ready in {timeout} s:\n{self.tail()}")
            time.sleep(0.05)

    def tail(self, lines: int = 40) -> str:
        if not self._log_file.closed:
            self._log_file.flush()
        text = self.log.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (a warm shutdown) the worker's process group; SIGKILL if it lingers."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._kill_group()
        self._log_file.close()

    def kill(self) -> None:
        """SIGKILL the worker and every process of its group (again: nothing more)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._kill_group()
        self._log_file.close()

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # the group is gone already
            os.killpg(self.process.pid, signal.SIGKILL)


def python() -> str:
    return sys.executable


@pytest_asyncio.fixture
async def triggers(jobs_redis: RedisServer) -> AsyncIterator[RedisTriggers]:
    """The web process's side: a purgatory and its RedisTriggers on the module's Redis."""
    async with RedisTriggers(Purgatory("jobs"), jobs_redis.url) as started:
        yield started


@pytest_asyncio.fixture
async def postgres_triggers(jobs_postgres: PostgresServer) -> AsyncIterator[PostgresTriggers]:
    """The web process's side for the PostgreSQL-queued systems: a PostgresTriggers."""
    from aiopurgatory.postgres import PostgresTriggers

    async with PostgresTriggers(Purgatory("web"), jobs_postgres.dsn) as started:
        yield started


async def published_end(triggers: Triggers, key: str | bytes | int) -> float:
    """Wait (up to 10 s) until ``key``'s stored watermark says the job ended; that mark."""
    for _ in range(200):
        mark = await triggers.fetch_watermark(key)
        if mark is not None and mark >= END:
            return mark
        await asyncio.sleep(0.05)
    raise AssertionError(f"no end was published for {key!r}")
