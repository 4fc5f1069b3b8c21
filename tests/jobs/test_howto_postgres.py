"""docs/jobs.md's PostgreSQL job systems' how-tos, as written: Procrastinate's
schema applied (django-tasks' project migrated) and the worker started as the
page says, the web application under ``uvicorn --workers 2``, on the tests' own
PostgreSQL (one for the module).

The programs (``<!-- file: NAME.py -->``) and the HTTP helpers are
tests/jobs/test_howto.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiopurgatory.postgres.testing import PostgresServer
from tests.jobs.conftest import WorkerProcess
from tests.jobs.test_howto import call, free_port, sigterm_answers_parked_waits, wait_listening
from tests.jobs.test_howto import written as written  # the fixture, for pytest
from tests.jobs.test_procrastinate import newest_worker

pytestmark = [pytest.mark.timeout(120), pytest.mark.realtime]

# How the page runs Procrastinate (its "console" block), after `procrastinate`.
PROCRASTINATE = ["-m", "procrastinate", "--app", "procrastinate_tasks.app"]


def run(written: Path, args: list[str], env: dict[str, str]) -> None:
    """A command of the page's, run to its end in the programs' directory."""
    done = subprocess.run(
        [sys.executable, *args], cwd=written, env={**os.environ, **env},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def start_web(written: Path, app: str, dsn: str, env: dict[str, str]) -> tuple[int, WorkerProcess]:
    """``uvicorn APP --workers 2`` on a free port: the port and the server's process."""
    port = free_port()
    name = app.partition(":")[0]
    web = WorkerProcess(
        [sys.executable, "-m", "uvicorn", app, "--workers", "2",
         "--port", str(port), "--log-level", "warning"],
        url=dsn, log=written / f"{name}-web.log", ready=written / f"{name}-web.ready",
        env=env, cwd=written,
    )  # fmt: skip
    return port, web


@pytest.fixture(scope="module")
def procrastinate_running(
    written: Path,
    jobs_postgres: PostgresServer,
) -> Iterator[tuple[int, WorkerProcess]]:
    """Procrastinate's schema, worker and the page's web application: the web
    port and the web server's process."""
    dsn = jobs_postgres.dsn
    env = {"DATABASE_URL": dsn}
    run(written, [*PROCRASTINATE, "schema", "--apply"], env)
    before = newest_worker(dsn)
    worker = WorkerProcess(
        [sys.executable, *PROCRASTINATE, "worker"], url=dsn,
        log=written / "procrastinate-worker.log", ready=written / "procrastinate.ready",
        env=env, cwd=written,
    )  # fmt: skip
    port, web = start_web(written, "procrastinate_web:app", dsn, env)
    try:
        deadline = time.monotonic() + 30
        while newest_worker(dsn) <= before:  # it registered itself: it listens for jobs
            if worker.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the worker did not start:\n{worker.tail()}", pytrace=False)
            time.sleep(0.05)
        wait_listening(web, port)
        yield port, web
    finally:
        web.stop()
        worker.stop()


def not_ended_in_time(port: int) -> None:
    """A job that has not ended when its wait's timeout passes: said so, on time."""
    status, created = call(port, "POST", "/renders?pages=40")
    started = time.monotonic()
    status, body = call(port, "GET", f"/renders/{created['job']}?timeout=0.3")
    assert (status, body) == (200, {"job": created["job"], "done": False})
    assert time.monotonic() - started < 5.0


def test_procrastinate_answers_done_failed_and_not_yet(
    procrastinate_running: tuple[int, WorkerProcess],
) -> None:
    port, web = procrastinate_running
    status, created = call(port, "POST", "/renders?pages=4")
    assert status == 201
    job = created["job"]
    status, body = call(port, "GET", f"/renders/{job}?timeout=30")
    assert (status, body) == (200, {"job": job, "done": True, "attempts": 1})
    # Ended already: at once, even with no time to wait.
    assert call(port, "GET", f"/renders/{job}?timeout=0")[1]["done"] is True
    # A task that raises: Procrastinate stores the status only ("failed").
    status, created = call(port, "POST", "/renders?pages=0")
    assert status == 201
    status, body = call(port, "GET", f"/renders/{created['job']}?timeout=30")
    assert status == 502
    assert "failed" in body["detail"]
    not_ended_in_time(port)
    # The lifespan's release_on_shutdown: parked waits answered 503 at SIGTERM.
    status, created = call(port, "POST", "/renders?pages=100")
    sigterm_answers_parked_waits(port, web, created["job"])


@pytest.fixture(scope="module")
def django_running(written: Path, jobs_postgres: PostgresServer) -> Iterator[int]:
    """django-tasks' project migrated, ``db_worker`` and the ASGI application: the
    web port. The same database as Procrastinate's (tables of their own; the
    triggers' keys are in namespaces of their own)."""
    dsn = jobs_postgres.dsn
    env = {"DATABASE_URL": dsn}
    run(written, ["manage.py", "migrate"], env)
    worker = WorkerProcess(
        [sys.executable, "manage.py", "db_worker"], url=dsn,
        log=written / "django-worker.log", ready=written / "django.ready",
        env=env, cwd=written,
    )  # fmt: skip
    port, web = start_web(written, "asgi:application", dsn, env)
    try:
        wait_listening(web, port)
        yield port
    finally:
        web.stop()
        worker.stop()


def test_django_tasks_answers_done_failed_and_not_yet(django_running: int) -> None:
    port = django_running
    status, created = call(port, "POST", "/renders?pages=4")
    assert status == 201
    job = created["job"]
    status, body = call(port, "GET", f"/renders/{job}?timeout=30")
    assert (status, body) == (200, {"job": job, "done": True, "result": "4 pages rendered"})
    assert call(port, "GET", f"/renders/{job}?timeout=0")[1]["done"] is True
    # A task that raises: the stored traceback, as the view reports it.
    status, created = call(port, "POST", "/renders?pages=0")
    assert status == 201
    status, body = call(port, "GET", f"/renders/{created['job']}?timeout=30")
    assert status == 502
    assert "nothing to render: 0 pages" in body["error"]
    not_ended_in_time(port)
    # Bad input: refused, naming the argument.
    status, body = call(port, "GET", f"/renders/{job}?timeout=nan")
    assert (status, "timeout" in body["error"]) == (400, True)
