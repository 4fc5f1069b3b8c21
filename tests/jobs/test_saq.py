"""aiopurgatory.jobs.saq with a real saq worker (async, publishing on its own loop)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from saq import Queue

from aiopurgatory.jobs import END, JobEnd, JobFailedError, JobProgress, JobTimeoutError
from aiopurgatory.jobs.saq import SaqJobs
from aiopurgatory.redis import RedisTriggers
from aiopurgatory.redis.testing import RedisServer
from tests.jobs.conftest import WorkerProcess, published_end, python

SETTINGS = "tests.jobs.saq_app.settings"


def start_worker(
    url: str, logs: pytest.TempPathFactory, name: str, queue: str = "jobs"
) -> WorkerProcess:
    where = logs.mktemp(name)
    process = WorkerProcess(
        [python(), "-m", "saq", SETTINGS],
        url=url, log=where / "worker.log", ready=where / "worker.ready",
        env={"AIOPURGATORY_JOBS_QUEUE": queue},
    )  # fmt: skip
    process.wait_ready()
    return process


@pytest.fixture(scope="module")
def worker(
    jobs_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    process = start_worker(jobs_redis.url, tmp_path_factory, "saq")
    yield process
    process.stop()


@pytest_asyncio.fixture
async def queue(jobs_redis: RedisServer) -> AsyncIterator[Queue]:
    queue = Queue.from_url(jobs_redis.url, name="jobs")
    await queue.connect()
    yield queue
    await queue.disconnect()


@pytest.fixture
def jobs(triggers: RedisTriggers, queue: Queue) -> SaqJobs:
    return SaqJobs(triggers, queue)


async def enqueue(queue: Queue, function: str, **kwargs: object) -> str:
    job = await queue.enqueue(function, **kwargs)
    assert job is not None
    return str(job.key)


async def test_the_result_is_saqs_result(
    worker: WorkerProcess, queue: Queue, jobs: SaqJobs
) -> None:
    key = await enqueue(queue, "add", x=2, y=3)
    assert await jobs.wait(key, timeout=20.0) == 5


async def test_a_failure_raises_job_failed_error_with_saqs_traceback(
    worker: WorkerProcess, queue: Queue, jobs: SaqJobs
) -> None:
    key = await enqueue(queue, "fail", message="boom")
    with pytest.raises(JobFailedError, match="ValueError: boom") as caught:
        await jobs.wait(key, timeout=20.0)
    assert caught.value.end is JobEnd.FAILED


async def test_a_retried_job_ends_once_after_its_last_attempt(
    worker: WorkerProcess, queue: Queue, jobs: SaqJobs
) -> None:
    key = await enqueue(queue, "fail", message="again", retries=3)
    with pytest.raises(JobFailedError, match="again"):
        await jobs.wait(key, timeout=20.0)
    job = await queue.job(key)
    assert job is not None
    assert job.attempts == 3


async def test_a_progress_threshold_returns_before_the_end(
    worker: WorkerProcess, queue: Queue, jobs: SaqJobs
) -> None:
    key = await enqueue(queue, "steps", count=10, seconds=0.2)
    reached = await jobs.wait(key, timeout=20.0, progress=2)
    assert isinstance(reached, JobProgress)
    assert 2 <= reached.progress < 10
    assert await jobs.wait(key, timeout=20.0, progress=10.5) == 10


async def test_a_job_that_does_not_end_in_time_is_a_timeout(
    worker: WorkerProcess, queue: Queue, jobs: SaqJobs
) -> None:
    key = await enqueue(queue, "steps", count=3, seconds=0.3)
    started = time.monotonic()
    with pytest.raises(JobTimeoutError):
        await jobs.wait(key, timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 3.0
    assert await jobs.wait(key, timeout=20.0) == 3


async def test_a_job_that_ended_before_the_wait_answers_at_once(
    worker: WorkerProcess, queue: Queue, jobs: SaqJobs
) -> None:
    key = await enqueue(queue, "add", x=20, y=22)
    assert await published_end(jobs.triggers, jobs.key(key)) == END + JobEnd.SUCCEEDED.value
    assert await jobs.wait(key, timeout=0) == 42


# saq's abort calls redis-py's deprecated setex (redis-py 8 warns).
@pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")
async def test_an_aborted_job_is_revoked(
    worker: WorkerProcess, queue: Queue, jobs: SaqJobs
) -> None:
    key = await enqueue(queue, "steps", count=200, seconds=0.05)
    assert isinstance(await jobs.wait(key, timeout=20.0, progress=1), JobProgress)
    job = await queue.job(key)
    assert job is not None
    await queue.abort(job, "enough")
    with pytest.raises(JobFailedError, match="enough") as caught:
        await jobs.wait(key, timeout=20.0)
    assert caught.value.end is JobEnd.REVOKED


async def test_a_killed_worker_leaves_the_waiter_to_its_timeout(
    jobs_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory, jobs: SaqJobs
) -> None:
    # A worker of its own on a queue of its own: it dies with the job.
    lone = Queue.from_url(jobs_redis.url, name="lone")
    await lone.connect()
    process = start_worker(jobs_redis.url, tmp_path_factory, "saq-killed", queue="lone")
    try:
        key = await enqueue(lone, "die")
        with pytest.raises(JobTimeoutError):
            await jobs.wait(key, timeout=1.5)
        assert process.process.wait(timeout=5) != 0
        job = await lone.job(key)
        assert job is not None
        assert job.status == "active"  # saq has not noticed yet: nothing to publish
    finally:
        process.kill()
        await lone.disconnect()
