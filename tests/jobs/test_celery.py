"""aiopurgatory.jobs.celery with real Celery workers (prefork and threads pools) on a real Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import TaskRevokedError, WorkerLostError

from aiopurgatory.jobs import END, JobEnd, JobProgress, JobResultMissingError, JobTimeoutError
from aiopurgatory.jobs.celery import CeleryJobs
from aiopurgatory.redis import RedisTriggers
from aiopurgatory.redis.testing import RedisServer
from tests.jobs import celery_app
from tests.jobs.conftest import WorkerProcess, published_end, python

TASKS = "tests.jobs.celery_app"
POOLS = ["prefork", "threads"]


@pytest.fixture(scope="module")
def workers(
    jobs_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, WorkerProcess]]:
    """A prefork worker (2 processes) on queue "prefork", a threads worker (4) on "threads"."""
    logs = tmp_path_factory.mktemp("celery")
    started = {}
    for pool, concurrency in (("prefork", 2), ("threads", 4)):
        started[pool] = WorkerProcess(
            [python(), "-m", "celery", "-A", TASKS, "worker", "-P", pool, "-c", str(concurrency),
             "-Q", pool, "-n", f"{pool}@%h", "--without-gossip", "--without-mingle",
             "--without-heartbeat", "-l", "info"],
            url=jobs_redis.url, log=logs / f"{pool}.log", ready=logs / f"{pool}.ready",
        )  # fmt: skip
    for worker in started.values():
        worker.wait_ready()
    yield started
    for worker in started.values():
        worker.stop()


@pytest.fixture(scope="module")
def client(jobs_redis: RedisServer) -> Iterator[Celery]:
    app = celery_app.client(jobs_redis.url)
    yield app
    app.close()


@pytest.fixture
def jobs(triggers: RedisTriggers, client: Celery) -> CeleryJobs:
    return CeleryJobs(triggers, client)


async def send(client: Celery, name: str, *args: Any, queue: str, **options: Any) -> str:
    """Send a task by name (Celery's send is blocking: in a thread); its id."""
    sending = celery_app.sender(client.conf.broker_url)
    result = await asyncio.to_thread(
        sending.send_task, f"{TASKS}.{name}", args=args, queue=queue, **options
    )
    return str(result.id)


@pytest.mark.parametrize("pool", POOLS)
async def test_the_result_is_celerys_result(
    workers: dict[str, WorkerProcess], client: Celery, jobs: CeleryJobs, pool: str
) -> None:
    task_id = await send(client, "add", 2, 3, queue=pool)
    assert await jobs.wait(task_id, timeout=20.0) == 5


@pytest.mark.parametrize("pool", POOLS)
async def test_a_failure_is_raised_as_celery_raises_it(
    workers: dict[str, WorkerProcess], client: Celery, jobs: CeleryJobs, pool: str
) -> None:
    task_id = await send(client, "fail", "boom", queue=pool)
    with pytest.raises(ValueError, match="boom"):
        await jobs.wait(task_id, timeout=20.0)


async def test_a_progress_threshold_returns_before_the_end(
    workers: dict[str, WorkerProcess], client: Celery, jobs: CeleryJobs
) -> None:
    task_id = await send(client, "steps", 10, 0.2, queue="threads")
    reached = await jobs.wait(task_id, timeout=20.0, progress=2)
    assert isinstance(reached, JobProgress)
    assert reached.job_id == task_id
    assert 2 <= reached.progress < 10
    # An end meets every progress threshold: past the last step, the result.
    assert await jobs.wait(task_id, timeout=20.0, progress=10.5) == 10
    assert await jobs.wait(task_id, timeout=0) == 10


async def test_a_task_that_does_not_end_in_time_is_a_timeout(
    workers: dict[str, WorkerProcess], client: Celery, jobs: CeleryJobs
) -> None:
    task_id = await send(client, "steps", 3, 0.3, queue="threads")
    started = time.monotonic()
    with pytest.raises(JobTimeoutError) as caught:
        await jobs.wait(task_id, timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 3.0
    assert caught.value.job_id == task_id
    assert isinstance(caught.value, TimeoutError)
    assert await jobs.wait(task_id, timeout=20.0) == 3  # it did end, later


async def test_a_task_that_ended_before_the_wait_answers_at_once(
    workers: dict[str, WorkerProcess], client: Celery, jobs: CeleryJobs
) -> None:
    task_id = await send(client, "add", 20, 22, queue="prefork")
    assert await published_end(jobs.triggers, jobs.key(task_id)) == END + JobEnd.SUCCEEDED.value
    # The end is a stored watermark: read when the wait starts, even with no time to wait.
    assert await jobs.wait(task_id, timeout=0) == 42


async def test_a_task_revoked_while_running_raises_task_revoked_error(
    workers: dict[str, WorkerProcess], client: Celery, jobs: CeleryJobs
) -> None:
    task_id = await send(client, "steps", 100, 0.05, queue="prefork")
    assert isinstance(await jobs.wait(task_id, timeout=20.0, progress=1), JobProgress)
    await asyncio.to_thread(client.control.revoke, task_id, terminate=True)
    with pytest.raises(TaskRevokedError):
        await jobs.wait(task_id, timeout=20.0)


async def test_a_task_revoked_before_it_runs_raises_task_revoked_error(
    workers: dict[str, WorkerProcess], client: Celery, jobs: CeleryJobs
) -> None:
    task_id = str(uuid.uuid4())
    waiter = asyncio.create_task(jobs.wait(task_id, timeout=20.0))
    # Each of the two workers says it has the revoke before the task is sent.
    replies = await asyncio.to_thread(
        lambda: client.control.revoke(task_id, reply=True, timeout=10.0, limit=2)
    )
    assert len(replies) == 2
    await send(client, "add", 1, 1, queue="threads", task_id=task_id)
    with pytest.raises(TaskRevokedError):
        await waiter


async def test_a_killed_pool_process_ends_the_wait_with_worker_lost_error(
    workers: dict[str, WorkerProcess], client: Celery, jobs: CeleryJobs
) -> None:
    task_id = await send(client, "die", queue="prefork")
    with pytest.raises(WorkerLostError):
        await jobs.wait(task_id, timeout=20.0)


async def test_with_acks_late_a_lost_task_is_redelivered_and_its_rerun_answers(
    workers: dict[str, WorkerProcess], client: Celery, jobs: CeleryJobs, tmp_path: Path
) -> None:
    task_id = await send(client, "die_once", str(tmp_path / "marker"), queue="prefork")
    assert await jobs.wait(task_id, timeout=20.0) == "second run"
    assert (tmp_path / "marker").exists()


async def test_a_retried_task_answers_once_its_last_attempt_ends(
    workers: dict[str, WorkerProcess], client: Celery, jobs: CeleryJobs, tmp_path: Path
) -> None:
    task_id = await send(client, "flaky", str(tmp_path / "attempts"), 2, queue="threads")
    assert await jobs.wait(task_id, timeout=20.0) == 3  # not woken by the failed attempts


async def test_an_expired_result_is_result_missing(
    workers: dict[str, WorkerProcess], client: Celery, jobs: CeleryJobs
) -> None:
    task_id = await send(client, "add", 1, 2, queue="threads")
    assert await jobs.wait(task_id, timeout=20.0) == 3
    await asyncio.to_thread(client.AsyncResult(task_id).forget)  # as result_expires does
    with pytest.raises(JobResultMissingError) as caught:
        await jobs.wait(task_id, timeout=20.0)
    assert caught.value.end is JobEnd.SUCCEEDED


async def test_a_whole_worker_killed_mid_task_leaves_the_wait_to_its_timeout(
    jobs_redis: RedisServer, client: Celery, jobs: CeleryJobs, tmp_path: Path
) -> None:
    # A worker of its own, on a queue of its own, SIGKILLed with its pool: nothing
    # is left to record the task's end.
    lone = WorkerProcess(
        [python(), "-m", "celery", "-A", TASKS, "worker", "-P", "threads", "-c", "1",
         "-Q", "lone", "-n", "lone@%h", "--without-gossip", "--without-mingle",
         "--without-heartbeat"],
        url=jobs_redis.url, log=tmp_path / "lone.log", ready=tmp_path / "lone.ready",
    )  # fmt: skip
    try:
        lone.wait_ready()
        task_id = await send(client, "steps", 100, 0.05, queue="lone")
        assert isinstance(await jobs.wait(task_id, timeout=20.0, progress=1), JobProgress)
        lone.kill()
        with pytest.raises(JobTimeoutError):
            await jobs.wait(task_id, timeout=1.0)
        state = await asyncio.to_thread(lambda: client.AsyncResult(task_id).state)
        assert state == "STARTED"  # what Celery knows: it started, nothing since
    finally:
        lone.kill()
