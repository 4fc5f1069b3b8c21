"""docs/jobs.md: each job system's how-to, as written: its worker as the page starts
it, its web application under ``uvicorn --workers 2``, on a real Redis.

A program is a ```python block preceded by ``<!-- file: NAME.py -->``; each is
written to a temporary directory under its name, and run from there.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import re
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiopurgatory.redis.testing import RedisServer
from tests.jobs.conftest import WorkerProcess

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "jobs.md"
_FILE = re.compile(r"<!-- file: (?P<name>[\w.]+) -->\n```python\n(?P<body>.*?)^```$", re.S | re.M)

# How the page starts each system's worker (its "console" blocks).
WORKERS = {
    "celery": ["-m", "celery", "-A", "celery_tasks", "worker", "-P", "prefork", "-c", "2"],
    "rq": ["-m", "rq.cli", "worker", "-w", "aiopurgatory.jobs.rq.PublishingWorker", "renders"],
    "saq": ["-m", "saq", "saq_tasks.settings"],
    "dramatiq": ["-m", "dramatiq", "dramatiq_tasks", "-p", "1", "-t", "4"],
    "arq": ["-m", "arq", "arq_tasks.WorkerSettings"],
}
# arq pins redis-py below 6: its how-to runs in .venv-arq (tests/jobs/test_arq.py
# runs it there with this module's fixtures), not where arq is not importable.
HERE = [system for system in WORKERS if system != "arq" or importlib.util.find_spec("arq")]
# The job systems queued in PostgreSQL: run by tests/jobs/test_howto_postgres.py.
POSTGRES_SYSTEMS = ("procrastinate",)
# django-tasks' how-to is a Django project: its files under Django's usual names.
DJANGO_PROJECT = ("settings", "tasks", "views", "urls", "asgi", "manage")


def programs() -> dict[str, str]:
    return {m["name"]: m["body"] for m in _FILE.finditer(PAGE.read_text(encoding="utf-8"))}


def test_the_page_has_a_worker_and_a_web_program_per_system() -> None:
    assert set(programs()) == {
        f"{system}_{part}.py"
        for system in (*WORKERS, *POSTGRES_SYSTEMS)
        for part in ("tasks", "web")
    } | {f"{name}.py" for name in DJANGO_PROJECT}
    text = PAGE.read_text(encoding="utf-8")
    assert "celery -A celery_tasks worker -P prefork -c 2" in text
    assert "rq worker -w aiopurgatory.jobs.rq.PublishingWorker" in text
    assert "saq saq_tasks.settings" in text
    assert "dramatiq dramatiq_tasks -p 1 -t 4" in text
    assert "arq arq_tasks.WorkerSettings" in text
    assert "procrastinate --app procrastinate_tasks.app schema --apply" in text
    assert "procrastinate --app procrastinate_tasks.app worker" in text
    assert "uvicorn procrastinate_web:app --workers 2" in text
    assert "python manage.py db_worker" in text
    assert "uvicorn asgi:application --workers 2" in text


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("jobs-howto")
    for name, body in programs().items():
        (directory / name).write_text(body, encoding="utf-8")
    return directory


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def call(port: int, method: str, path: str, timeout: float = 30.0) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


def wait_listening(server: WorkerProcess, port: int, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(f"the server exited:\n{server.tail()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"the server did not listen in {seconds} s:\n{server.tail()}")


@pytest.fixture
def running(
    written: Path, jobs_redis: RedisServer, request: pytest.FixtureRequest
) -> Iterator[tuple[int, WorkerProcess]]:
    """The system's worker and web application, started as the page says: the web
    port and the web server's process."""
    system: str = request.param
    port = free_port()
    env = {"REDIS_URL": jobs_redis.url}
    extra = ["--url", jobs_redis.url] if system == "rq" else []
    worker = WorkerProcess(
        [sys.executable, *WORKERS[system], *extra], url=jobs_redis.url,
        log=written / f"{system}-worker.log", ready=written / f"{system}.ready",
        env=env, cwd=written,
    )  # fmt: skip
    web = WorkerProcess(
        [sys.executable, "-m", "uvicorn", f"{system}_web:app", "--workers", "2",
         "--port", str(port), "--log-level", "warning"],
        url=jobs_redis.url, log=written / f"{system}-web.log",
        ready=written / f"{system}-web.ready", env=env, cwd=written,
    )  # fmt: skip
    try:
        wait_listening(web, port)
        yield port, web
    finally:
        web.stop()
        worker.kill()  # a job may still run (the shutdown check's): no need to wait


@pytest.mark.parametrize("running", HERE, indirect=True)
def test_the_how_to_answers_results_progress_and_failures(
    running: tuple[int, WorkerProcess],
) -> None:
    port, web = running
    status, created = call(port, "POST", "/renders?pages=10")
    assert status == 201
    job = created["job"]
    # Progress: answered when the job gets there (or ended, if the worker was fast).
    status, body = call(port, "GET", f"/renders/{job}?progress=2&timeout=30")
    assert status == 200
    assert body["done"] or body["progress"] >= 2
    status, body = call(port, "GET", f"/renders/{job}?timeout=30")
    assert (status, body) == (200, {"job": job, "done": True, "result": "10 pages rendered"})
    # Ended already: at once, even with no time to wait.
    assert call(port, "GET", f"/renders/{job}?timeout=0")[1]["done"] is True
    # A task that raises: the job system's failure, as the application reports it.
    status, created = call(port, "POST", "/renders?pages=0")
    status, body = call(port, "GET", f"/renders/{created['job']}?timeout=30")
    assert status == 502
    assert "nothing to render: 0 pages" in json.dumps(body)
    # Not ended in time: said so.
    status, created = call(port, "POST", "/renders?pages=40")
    started = time.monotonic()
    assert call(port, "GET", f"/renders/{created['job']}?timeout=0.3")[1]["done"] is False
    assert time.monotonic() - started < 5.0
    status, created = call(port, "POST", "/renders?pages=100")
    sigterm_answers_parked_waits(port, web, created["job"])


def sigterm_answers_parked_waits(port: int, web: WorkerProcess, job: object) -> None:
    """SIGTERM with waits on ``job`` parked: each answered at once (503), the server gone."""
    parked = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(4)]
    for sock in parked:
        sock.sendall(
            f"GET /renders/{job}?timeout=60 HTTP/1.1\r\nHost: t\r\n"
            "Connection: close\r\n\r\n".encode()
        )
    time.sleep(0.5)
    stopping = time.monotonic()
    web.process.send_signal(signal.SIGTERM)
    for sock in parked:
        with sock:
            answer = sock.makefile("rb").read()
        assert answer.split(b" ", 2)[1] == b"503", answer[:200]
    web.process.wait(timeout=10)
    assert time.monotonic() - stopping < 5.0
