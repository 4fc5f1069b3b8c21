"""aiopurgatory.jobs.dramatiq with a real Dramatiq worker (its Results middleware on Redis)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.results import ResultFailure, Results

from aiopurgatory.jobs import END, JobEnd, JobProgress, JobTimeoutError
from aiopurgatory.jobs.dramatiq import DramatiqJobs, PublishJobs, publish_jobs
from aiopurgatory.redis import RedisTriggers
from aiopurgatory.redis.testing import RedisServer
from tests.jobs.conftest import WorkerProcess, published_end, python


def start_worker(
    url: str, logs: pytest.TempPathFactory, name: str, queue: str = "default"
) -> WorkerProcess:
    where = logs.mktemp(name)
    process = WorkerProcess(
        [python(), "-m", "dramatiq", "tests.jobs.dramatiq_app", "-p", "1", "-t", "4",
         "-Q", queue],
        url=url, log=where / "worker.log", ready=where / "worker.ready",
    )  # fmt: skip
    process.wait_ready()
    return process


@pytest.fixture(scope="module")
def app(jobs_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The test app's module, importing it with the module's Redis (as the worker does)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIOPURGATORY_JOBS_REDIS", jobs_redis.url)
        import tests.jobs.dramatiq_app as module

        assert jobs_redis.url == module.URL, "imported already with another Redis"
        process = start_worker(jobs_redis.url, tmp_path_factory, "dramatiq")
        yield module
        process.stop()
        module.broker.close()


@pytest.fixture
def jobs(triggers: RedisTriggers, app: Any) -> DramatiqJobs:
    return DramatiqJobs(triggers, app.backend)


async def send(actor: Any, *args: Any) -> dramatiq.Message[Any]:
    """Send a message (Dramatiq's send is blocking: in a thread)."""
    message: dramatiq.Message[Any] = await asyncio.to_thread(actor.send, *args)
    return message


async def test_the_result_is_dramatiqs_result(app: Any, jobs: DramatiqJobs) -> None:
    message = await send(app.add, 2, 3)
    assert await jobs.wait_message(message, timeout=20.0) == 5


async def test_a_failure_raises_dramatiqs_result_failure(app: Any, jobs: DramatiqJobs) -> None:
    message = await send(app.fail, "boom")
    with pytest.raises(ResultFailure, match="boom"):
        await jobs.wait_message(message, timeout=20.0)


async def test_a_retried_message_ends_once_after_its_last_attempt(
    app: Any, jobs: DramatiqJobs
) -> None:
    message = await send(app.fail_retried, "again")
    with pytest.raises(ResultFailure, match="again"):
        await jobs.wait_message(message, timeout=20.0)


async def test_a_progress_threshold_returns_before_the_end(app: Any, jobs: DramatiqJobs) -> None:
    message = await send(app.steps, 10, 0.2)
    reached = await jobs.wait_message(message, timeout=20.0, progress=2)
    assert isinstance(reached, JobProgress)
    assert 2 <= reached.progress < 10
    assert await jobs.wait_message(message, timeout=20.0, progress=10.5) == 10


async def test_a_message_that_does_not_end_in_time_is_a_timeout(
    app: Any, jobs: DramatiqJobs
) -> None:
    message = await send(app.steps, 3, 0.3)
    started = time.monotonic()
    with pytest.raises(JobTimeoutError):
        await jobs.wait_message(message, timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 3.0
    assert await jobs.wait_message(message, timeout=20.0) == 3


async def test_a_message_that_ended_before_the_wait_answers_at_once(
    app: Any, jobs: DramatiqJobs
) -> None:
    message = await send(app.add, 20, 22)
    key = jobs.key(message.message_id)
    assert await published_end(jobs.triggers, key) == END + JobEnd.SUCCEEDED.value
    assert await jobs.wait_message(message, timeout=0) == 42


async def test_a_wait_by_id_alone_is_refused_before_watching(app: Any, jobs: DramatiqJobs) -> None:
    with pytest.raises(TypeError, match="wait_message"):
        await jobs.wait("some-id", timeout=1.0)


async def test_a_killed_worker_leaves_the_waiter_to_its_timeout(
    app: Any, jobs: DramatiqJobs, jobs_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    process = start_worker(jobs_redis.url, tmp_path_factory, "dramatiq-killed", queue="lone")
    try:
        message = await send(app.die)
        with pytest.raises(JobTimeoutError):
            await jobs.wait_message(message, timeout=1.5)
    finally:
        process.kill()


async def test_the_middleware_publishes_after_results_stored(app: Any) -> None:
    # Dramatiq runs after_* hooks in reverse order: ours must come before Results.
    kinds = [type(m) for m in app.broker.middleware]
    assert kinds.index(PublishJobs) == kinds.index(Results) - 1
    with pytest.raises(ValueError, match="already"):
        publish_jobs(app.broker, "redis://127.0.0.1:1/0")
    with pytest.raises(ValueError, match="Results"):
        publish_jobs(StubBroker(), "redis://127.0.0.1:1/0")
