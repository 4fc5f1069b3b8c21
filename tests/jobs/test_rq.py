"""aiopurgatory.jobs.rq with a real RQ worker (PublishingWorker, a work horse per job)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from rq import Queue, Retry
from rq.command import send_stop_job_command
from rq.job import Job

from aiopurgatory.jobs import (
    END,
    JobEnd,
    JobFailedError,
    JobProgress,
    JobResultMissingError,
    JobTimeoutError,
)
from aiopurgatory.jobs.rq import RQJobs
from aiopurgatory.redis import RedisTriggers
from aiopurgatory.redis.testing import RedisServer
from tests.jobs import rq_app
from tests.jobs.conftest import WorkerProcess, published_end, python


@pytest.fixture(scope="module")
def worker(
    jobs_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """Two RQ workers (one job at a time each) on queue "jobs"."""
    logs = tmp_path_factory.mktemp("rq")
    started = []
    for n in range(2):
        args = [
            python(), "-m", "rq.cli", "worker", "-w", "tests.jobs.rq_app.ReadyWorker",
            "--url", jobs_redis.url, "--name", f"w{n}", "jobs",
        ]  # fmt: skip
        log, ready = logs / f"w{n}.log", logs / f"w{n}.ready"
        started.append(WorkerProcess(args, url=jobs_redis.url, log=log, ready=ready))
    for process in started:
        process.wait_ready()
    yield started[0]
    for process in started:
        process.stop()


@pytest.fixture(scope="module")
def connection(jobs_redis: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(jobs_redis.url)
    yield client
    client.close()


@pytest.fixture
def jobs(triggers: RedisTriggers, connection: redis.Redis) -> RQJobs:
    return RQJobs(triggers, connection)


async def enqueue(
    connection: redis.Redis, function: Callable[..., Any], *args: Any, **options: Any
) -> str:
    """Enqueue (RQ's client is blocking: in a thread); the job's id."""
    queue = Queue("jobs", connection=connection)
    job = await asyncio.to_thread(queue.enqueue, function, *args, **options)
    return str(job.id)


async def test_the_result_is_rqs_return_value(
    worker: WorkerProcess, connection: redis.Redis, jobs: RQJobs
) -> None:
    job_id = await enqueue(connection, rq_app.add, 2, 3)
    assert await jobs.wait(job_id, timeout=20.0) == 5


async def test_a_failure_raises_job_failed_error_with_rqs_traceback(
    worker: WorkerProcess, connection: redis.Redis, jobs: RQJobs
) -> None:
    job_id = await enqueue(connection, rq_app.fail, "boom")
    with pytest.raises(JobFailedError, match="ValueError: boom") as caught:
        await jobs.wait(job_id, timeout=20.0)
    assert caught.value.end is JobEnd.FAILED
    assert "Traceback" in caught.value.detail


async def test_a_retried_job_ends_once_after_its_last_attempt(
    worker: WorkerProcess, connection: redis.Redis, jobs: RQJobs
) -> None:
    job_id = await enqueue(connection, rq_app.fail, "again", retry=Retry(max=2))
    with pytest.raises(JobFailedError, match="again"):
        await jobs.wait(job_id, timeout=20.0)
    job = await asyncio.to_thread(Job.fetch, job_id, connection=connection)
    assert job.retries_left == 0  # every attempt ran before the end was published


async def test_a_progress_threshold_returns_before_the_end(
    worker: WorkerProcess, connection: redis.Redis, jobs: RQJobs
) -> None:
    job_id = await enqueue(connection, rq_app.steps, 10, 0.2)
    reached = await jobs.wait(job_id, timeout=20.0, progress=2)
    assert isinstance(reached, JobProgress)
    assert 2 <= reached.progress < 10
    assert await jobs.wait(job_id, timeout=20.0, progress=10.5) == 10


async def test_a_job_that_does_not_end_in_time_is_a_timeout(
    worker: WorkerProcess, connection: redis.Redis, jobs: RQJobs
) -> None:
    job_id = await enqueue(connection, rq_app.steps, 3, 0.3)
    started = time.monotonic()
    with pytest.raises(JobTimeoutError):
        await jobs.wait(job_id, timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 3.0
    assert await jobs.wait(job_id, timeout=20.0) == 3


async def test_a_job_that_ended_before_the_wait_answers_at_once(
    worker: WorkerProcess, connection: redis.Redis, jobs: RQJobs
) -> None:
    job_id = await enqueue(connection, rq_app.add, 20, 22)
    assert await published_end(jobs.triggers, jobs.key(job_id)) == END + JobEnd.SUCCEEDED.value
    # The end is a stored watermark: read when the wait starts, even with no time to wait.
    assert await jobs.wait(job_id, timeout=0) == 42


async def test_a_stopped_job_is_revoked(
    worker: WorkerProcess, connection: redis.Redis, jobs: RQJobs
) -> None:
    job_id = await enqueue(connection, rq_app.steps, 100, 0.05)
    assert isinstance(await jobs.wait(job_id, timeout=20.0, progress=1), JobProgress)
    await asyncio.to_thread(send_stop_job_command, connection, job_id)
    with pytest.raises(JobFailedError) as caught:
        await jobs.wait(job_id, timeout=20.0)
    assert caught.value.end is JobEnd.REVOKED


async def test_a_killed_work_horse_ends_the_wait_as_lost(
    worker: WorkerProcess, connection: redis.Redis, jobs: RQJobs
) -> None:
    job_id = await enqueue(connection, rq_app.die)
    with pytest.raises(JobFailedError, match="Work-horse terminated unexpectedly") as caught:
        await jobs.wait(job_id, timeout=20.0)
    assert caught.value.end is JobEnd.LOST


async def test_an_expired_result_is_result_missing(
    worker: WorkerProcess, connection: redis.Redis, jobs: RQJobs
) -> None:
    job_id = await enqueue(connection, rq_app.add, 1, 2)
    assert await jobs.wait(job_id, timeout=20.0) == 3
    job = await asyncio.to_thread(Job.fetch, job_id, connection=connection)
    await asyncio.to_thread(job.delete)  # as its result_ttl does
    with pytest.raises(JobResultMissingError):
        await jobs.wait(job_id, timeout=20.0)
