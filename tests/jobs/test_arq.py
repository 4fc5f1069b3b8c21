"""aiopurgatory.jobs.arq with a real arq worker (async, publishing on its own loop).

arq 0.28 pins redis-py below 6, the main venv has redis-py 8: these tests run in
the venv made for them (``make test-arq``: ``.venv-arq``, ``.[arq,...]``), and
are skipped, saying so, where arq is not importable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest

pytest.importorskip(
    "arq",
    reason="arq is not installed (it pins redis<6): its tests run in `make test-arq`'s .venv-arq",
)

import pytest_asyncio
from arq import create_pool
from arq.connections import ArqRedis, RedisSettings
from arq.jobs import Job, JobStatus

from aiopurgatory import LocalTriggers, Purgatory
from aiopurgatory.jobs import (
    END,
    JobEnd,
    JobFailedError,
    JobProgress,
    JobTimeoutError,
)
from aiopurgatory.jobs.arq import ArqJobs, publish_jobs, report_progress
from aiopurgatory.redis import RedisTriggers
from aiopurgatory.redis.testing import RedisServer
from tests.jobs import arq_app, test_howto
from tests.jobs.conftest import WorkerProcess, published_end, python
from tests.jobs.test_restart import start, through_a_restart

# The how-to's fixtures (its programs written out; its worker and web servers).
written = test_howto.written
running = test_howto.running

SETTINGS = "tests.jobs.arq_app.WorkerSettings"
QUEUE = "arq:queue"


def start_worker(
    url: str, logs: pytest.TempPathFactory, name: str, queue: str = QUEUE
) -> WorkerProcess:
    where = logs.mktemp(name)
    process = WorkerProcess(
        [python(), "-m", "arq", SETTINGS],
        url=url, log=where / "worker.log", ready=where / "worker.ready",
        env={"AIOPURGATORY_JOBS_QUEUE": queue},
    )  # fmt: skip
    process.wait_ready()
    return process


@pytest.fixture(scope="module")
def worker(
    jobs_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    process = start_worker(jobs_redis.url, tmp_path_factory, "arq")
    yield process
    process.stop()


async def pool_of(url: str, queue: str = QUEUE) -> ArqRedis:
    return await create_pool(RedisSettings.from_dsn(url), default_queue_name=queue)


@pytest_asyncio.fixture
async def pool(jobs_redis: RedisServer) -> AsyncIterator[ArqRedis]:
    pool = await pool_of(jobs_redis.url)
    yield pool
    await pool.aclose()


@pytest.fixture
def jobs(triggers: RedisTriggers, pool: ArqRedis) -> ArqJobs:
    return ArqJobs(triggers, pool)


async def enqueue(pool: ArqRedis, function: str, *args: object) -> str:
    job = await pool.enqueue_job(function, *args)
    assert job is not None
    return str(job.job_id)


async def test_the_result_is_arqs_result(
    worker: WorkerProcess, pool: ArqRedis, jobs: ArqJobs
) -> None:
    job_id = await enqueue(pool, "add", 2, 3)
    assert await jobs.wait(job_id, timeout=20.0) == 5
    assert await Job(job_id, pool).result(timeout=1) == 5  # arq's own answer agrees


async def test_a_failure_raises_the_jobs_own_exception(
    worker: WorkerProcess, pool: ArqRedis, jobs: ArqJobs
) -> None:
    job_id = await enqueue(pool, "fail", "boom")
    with pytest.raises(ValueError, match="boom"):
        await jobs.wait(job_id, timeout=20.0)
    assert await published_end(jobs.triggers, jobs.key(job_id)) == END + JobEnd.FAILED.value


async def test_a_retried_job_ends_once_after_its_last_attempt(
    worker: WorkerProcess, pool: ArqRedis, jobs: ArqJobs
) -> None:
    job_id = await enqueue(pool, "flaky", 3)
    # Parked at the threshold of any progress: the attempts arq runs again publish
    # nothing (no progress, no end), so the first wake-up is the end.
    assert await jobs.wait(job_id, timeout=20.0, progress=0) == 3


async def test_a_progress_threshold_returns_before_the_end(
    worker: WorkerProcess, pool: ArqRedis, jobs: ArqJobs
) -> None:
    job_id = await enqueue(pool, "steps", 10, 0.2)
    reached = await jobs.wait(job_id, timeout=20.0, progress=2)
    assert isinstance(reached, JobProgress)
    assert 2 <= reached.progress < 10
    assert await jobs.wait(job_id, timeout=20.0, progress=10.5) == 10


async def test_a_job_that_does_not_end_in_time_is_a_timeout(
    worker: WorkerProcess, pool: ArqRedis, jobs: ArqJobs
) -> None:
    job_id = await enqueue(pool, "steps", 3, 0.3)
    started = time.monotonic()
    with pytest.raises(JobTimeoutError):
        await jobs.wait(job_id, timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 3.0
    assert await jobs.wait(job_id, timeout=20.0) == 3


async def test_a_job_that_ended_before_the_wait_answers_at_once(
    worker: WorkerProcess, pool: ArqRedis, jobs: ArqJobs
) -> None:
    job_id = await enqueue(pool, "add", 20, 22)
    assert await published_end(jobs.triggers, jobs.key(job_id)) == END + JobEnd.SUCCEEDED.value
    assert await jobs.wait(job_id, timeout=0) == 42


async def test_the_users_own_hooks_still_run(
    worker: WorkerProcess, pool: ArqRedis, jobs: ArqJobs
) -> None:
    job_id = await enqueue(pool, "add", 1, 1)
    assert await jobs.wait(job_id, timeout=20.0) == 2
    # (redis-py types LRANGE as sync or async: its async client's is async)
    ended = await cast("Awaitable[list[bytes]]", pool.lrange(arq_app.ENDED, 0, -1))
    assert job_id.encode() in ended


async def test_an_aborted_job_is_revoked(
    worker: WorkerProcess, pool: ArqRedis, jobs: ArqJobs
) -> None:
    job_id = await enqueue(pool, "steps", 200, 0.05)
    assert isinstance(await jobs.wait(job_id, timeout=20.0, progress=1), JobProgress)
    waiting = asyncio.create_task(jobs.wait(job_id, timeout=20.0))
    assert await Job(job_id, pool).abort(timeout=10.0, poll_delay=0.05) is True
    with pytest.raises(JobFailedError, match="revoked") as caught:
        await waiting
    assert caught.value.end is JobEnd.REVOKED


async def test_a_job_aborted_before_it_ran_is_found_at_the_waits_timeout(
    worker: WorkerProcess, pool: ArqRedis, jobs: ArqJobs
) -> None:
    # arq ends it without its hooks (finish_failed_job): nothing is published, and
    # the wait's last look at its timeout reads arq's stored CancelledError.
    job = await pool.enqueue_job("add", 1, 2, _defer_by=30)
    assert job is not None
    assert await job.abort(timeout=10.0, poll_delay=0.05) is True
    started = time.monotonic()
    with pytest.raises(JobFailedError) as caught:
        await jobs.wait(job.job_id, timeout=0.5)
    assert caught.value.end is JobEnd.REVOKED
    assert time.monotonic() - started >= 0.5
    assert await jobs.triggers.fetch_watermark(jobs.key(job.job_id)) is None


async def test_a_killed_worker_leaves_the_waiter_to_its_timeout(
    jobs_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory, jobs: ArqJobs
) -> None:
    # A worker of its own on a queue of its own: it dies with the job.
    lone = await pool_of(jobs_redis.url, "lone")
    process = start_worker(jobs_redis.url, tmp_path_factory, "arq-killed", queue="lone")
    try:
        job_id = await enqueue(lone, "die")
        with pytest.raises(JobTimeoutError):
            await jobs.wait(job_id, timeout=1.5)
        assert process.process.wait(timeout=5) != 0
        # arq runs it again once its in-progress mark expires (job_timeout + 10 s).
        assert await Job(job_id, lone, _queue_name="lone").status() is JobStatus.in_progress
    finally:
        process.kill()
        await lone.aclose()


async def test_through_a_redis_restart(jobs_redis: RedisServer, tmp_path: Path) -> None:
    worker = start(
        [python(), "-m", "arq", SETTINGS], jobs_redis, tmp_path, AIOPURGATORY_JOBS_QUEUE="restart"
    )
    pool = await pool_of(jobs_redis.url, "restart")

    async def send() -> str:
        return await enqueue(pool, "steps", 5, 0.1)

    try:
        await through_a_restart(jobs_redis, worker, send, lambda t: ArqJobs(t, pool))
    finally:
        worker.kill()
        await pool.aclose()


def wrong(value: object) -> Any:
    """A value of the wrong type, passed on purpose (the type checker is told so)."""
    return value


async def test_bad_arguments_are_refused_by_name(jobs_redis: RedisServer) -> None:
    class Settings:
        functions: ClassVar = [arq_app.add]

    with pytest.raises(TypeError, match="settings must be a class or a dict"):
        publish_jobs([Settings], jobs_redis.url)
    with pytest.raises(TypeError, match="publisher must be"):
        publish_jobs(Settings, wrong(42))
    with pytest.raises(ValueError, match="namespace"):
        publish_jobs(Settings, jobs_redis.url, namespace="")
    made = publish_jobs(Settings, jobs_redis.url)
    assert made is not Settings
    assert made.functions == [arq_app.add]
    assert not hasattr(Settings, "after_job_end")  # the given settings are not changed
    assert publish_jobs({"functions": []}, jobs_redis.url)["after_job_end"] is not None
    with pytest.raises(RuntimeError, match="publish_jobs"):
        report_progress({"job_id": "x"}, 1)
    async with LocalTriggers(Purgatory("arq")) as triggers:
        with pytest.raises(TypeError, match="redis must be arq's pool"):
            ArqJobs(triggers, wrong(jobs_redis.url))
        pool = await pool_of(jobs_redis.url)
        try:
            with pytest.raises(TypeError, match="deserializer must be callable"):
                ArqJobs(triggers, pool, deserializer=wrong(1))
        finally:
            await pool.aclose()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("running", ["arq"], indirect=True)
def test_the_how_to_as_written(running: tuple[int, WorkerProcess]) -> None:
    # docs/jobs.md's arq programs, its worker and `uvicorn --workers 2` (test_howto's
    # test, which the main venv cannot run for arq).
    test_howto.test_the_how_to_answers_results_progress_and_failures(running)
