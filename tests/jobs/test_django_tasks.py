"""aiopurgatory.jobs.django_tasks with django-tasks-db's real worker, on the tests' own PostgreSQL.

The project is ``tests.jobs.django_tasks_site``: its migration installs the
trigger, ``db_worker`` runs the tasks with no aiopurgatory code in it, and this
process is the web side (Django set up once for the module, as an ASGI process is).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from aiopurgatory.jobs import END, JobEnd, JobFailedError, JobTimeoutError
from aiopurgatory.postgres import PostgresTriggers
from aiopurgatory.postgres.testing import PostgresServer
from tests.jobs.conftest import WorkerProcess, python

pytestmark = pytest.mark.realtime

SETTINGS = "tests.jobs.django_tasks_site.settings"


@pytest.fixture(scope="module")
def server(jobs_postgres: PostgresServer) -> Iterator[PostgresServer]:
    """The module's PostgreSQL, migrated (django-tasks-db's tables, then the trigger)."""
    import django
    from django.conf import settings

    if settings.configured:  # another module of this process set Django up
        pytest.fail("Django is set up already in this process", pytrace=False)
    saved = dict(os.environ)
    os.environ["AIOPURGATORY_JOBS_POSTGRES"] = jobs_postgres.dsn
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    try:
        django.setup()  # reads the settings, and the DSN in them, now
    finally:
        # Not left to the subprocesses of later tests (Celery's worker would
        # take DJANGO_SETTINGS_MODULE for a Django project of its own).
        os.environ.clear()
        os.environ.update(saved)
    from django.core.management import call_command
    from django.db import connections

    call_command("migrate", verbosity=0)
    connections.close_all()
    yield jobs_postgres
    connections.close_all()


def start_worker(dsn: str, where: Path, queue: str) -> WorkerProcess:
    """django-tasks-db's worker on ``queue`` (it polls the table: no readiness to await)."""
    return WorkerProcess(
        [python(), "-m", "django", "db_worker", "--settings", SETTINGS, "--queue-name", queue,
         "--interval", "0.1", "--no-startup-delay"],
        url=dsn, log=where / "worker.log", ready=where / "worker.ready",
        env={"AIOPURGATORY_JOBS_POSTGRES": dsn},
    )  # fmt: skip


@pytest.fixture(scope="module")
def worker(
    server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    process = start_worker(server.dsn, tmp_path_factory.mktemp("django_tasks"), "default")
    yield process
    process.stop()


@pytest.fixture
def triggers(server: PostgresServer, postgres_triggers: PostgresTriggers) -> PostgresTriggers:
    return postgres_triggers


@pytest.fixture
def jobs(triggers: PostgresTriggers) -> Any:
    from aiopurgatory.jobs.django_tasks import DjangoTasksJobs

    return DjangoTasksJobs(triggers)


async def enqueue(name: str, *args: Any, queue: str = "default") -> str:
    from tests.jobs.django_tasks_site import tasks

    task = getattr(tasks, name).using(queue_name=queue)
    result = await task.aenqueue(*args)
    return str(result.id)


async def status(result_id: str) -> str:
    from django_tasks import default_task_backend

    result = await default_task_backend.aget_result(result_id)
    return str(result.status)


async def test_a_successful_task_answers_with_its_stored_return_value(
    worker: WorkerProcess, jobs: Any
) -> None:
    result_id = await enqueue("add", 2, 3)
    assert await jobs.wait(result_id, timeout=20.0) == 5
    mark = await jobs.triggers.fetch_watermark(jobs.key(result_id))
    assert mark == END + JobEnd.SUCCEEDED.value
    # The id as a UUID, or spelled in capitals, is the same task.
    assert await jobs.wait(uuid.UUID(result_id), timeout=0) == 5
    assert await jobs.wait(result_id.upper(), timeout=0) == 5


async def test_a_failed_task_raises_job_failed_error_with_the_stored_traceback(
    worker: WorkerProcess, jobs: Any
) -> None:
    result_id = await enqueue("fail", "boom")
    with pytest.raises(JobFailedError, match="ValueError: boom") as caught:
        await jobs.wait(result_id, timeout=20.0)
    assert caught.value.end is JobEnd.FAILED
    assert "Traceback" in caught.value.detail


async def test_a_wait_parked_before_the_end_and_one_started_after_both_answer(
    worker: WorkerProcess, jobs: Any
) -> None:
    result_id = await enqueue("sleep", 1.0)
    parked = asyncio.ensure_future(jobs.wait(result_id, timeout=20.0))
    await asyncio.sleep(0.3)
    assert not parked.done()
    # Woken by the commit: well before the wait's own timeout (and its last look).
    assert await asyncio.wait_for(parked, 10) == 1.0
    started = time.monotonic()
    assert await jobs.wait(result_id, timeout=0) == 1.0
    assert time.monotonic() - started < 2.0


async def test_a_task_that_does_not_end_in_time_raises_job_timeout_error_on_time(
    worker: WorkerProcess, jobs: Any
) -> None:
    result_id = await enqueue("sleep", 3.0)
    started = time.monotonic()
    with pytest.raises(JobTimeoutError):
        await jobs.wait(result_id, timeout=0.5)
    assert 0.5 <= time.monotonic() - started < 3.0
    assert await jobs.wait(result_id, timeout=20.0) == 3.0


async def test_a_status_change_that_rolls_back_wakes_nobody_and_its_commit_does(
    server: PostgresServer, jobs: Any
) -> None:
    result_id = await enqueue("add", 1, 1, queue="nobody")  # no worker on that queue
    parked = asyncio.ensure_future(jobs.wait(result_id, timeout=20.0))
    await asyncio.sleep(0.3)
    finish = (
        "UPDATE django_tasks_database_dbtaskresult SET status = 'SUCCESSFUL', "
        "return_value = '2', finished_at = now() WHERE id = %s"
    )
    async with await psycopg.AsyncConnection.connect(server.dsn) as conn:
        async with conn.transaction(force_rollback=True):
            await conn.execute(finish, (result_id,))
        await asyncio.sleep(1.0)
        assert not parked.done()
        assert await jobs.triggers.fetch_watermark(jobs.key(result_id)) is None
        async with conn.transaction():
            await conn.execute(finish, (result_id,))
    assert await asyncio.wait_for(parked, 10) == 2


async def test_a_worker_killed_mid_task_ends_the_wait_by_its_timeout(
    server: PostgresServer, jobs: Any, tmp_path: Path
) -> None:
    killed = start_worker(server.dsn, tmp_path, "kill")
    try:
        result_id = await enqueue("sleep", 60.0, queue="kill")
        for _ in range(400):
            if await status(result_id) == "RUNNING":
                break
            await asyncio.sleep(0.05)
        assert await status(result_id) == "RUNNING"
        killed.kill()
        # django-tasks-db leaves a killed worker's task RUNNING (it has no
        # recovery of its own): the wait ends by its timeout, on time.
        started = time.monotonic()
        with pytest.raises(JobTimeoutError):
            await jobs.wait(result_id, timeout=1.0)
        assert 1.0 <= time.monotonic() - started < 4.0
    finally:
        killed.kill()


async def test_bad_arguments_are_refused_with_the_argument_named(
    triggers: PostgresTriggers,
) -> None:
    from aiopurgatory.jobs.django_tasks import DjangoTasksJobs, schema_sql

    with pytest.raises(TypeError, match="backend"):
        DjangoTasksJobs(triggers, backend=1)  # type: ignore[arg-type]
    jobs = DjangoTasksJobs(triggers)
    with pytest.raises(ValueError, match="job_id"):
        jobs.key("not-a-uuid")
    with pytest.raises(TypeError, match="job_id"):
        jobs.key(7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="namespace"):
        schema_sql(namespace="a$b")
    assert "%" not in schema_sql()
