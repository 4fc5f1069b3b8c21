"""aiopurgatory.jobs.procrastinate with Procrastinate's real worker, on the tests' own PostgreSQL.

The worker is Procrastinate's CLI (``python -m procrastinate ... worker``) with no
aiopurgatory code: the job ends reach the waiters through the trigger that
``install`` puts on ``procrastinate_jobs``, in the transaction that stores them.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import procrastinate
import psycopg
import pytest
import pytest_asyncio
from procrastinate.jobs import Job, Status

from aiopurgatory import Purgatory
from aiopurgatory.jobs import END, JobEnd, JobFailedError, JobTimeoutError
from aiopurgatory.jobs.procrastinate import ProcrastinateJobs, install, schema_sql
from aiopurgatory.postgres import PostgresTriggers
from aiopurgatory.postgres._wire import partition_of, stored_key
from aiopurgatory.postgres.testing import PostgresServer
from tests.jobs.conftest import WorkerProcess, python

pytestmark = pytest.mark.realtime

APP = "tests.jobs.procrastinate_app.app"


@pytest.fixture(scope="module")
def server(jobs_postgres: PostgresServer) -> PostgresServer:
    """The module's PostgreSQL, with Procrastinate's schema and the trigger installed."""

    async def prepare() -> None:
        dsn = jobs_postgres.dsn
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            await install(app)
            await install(app)  # idempotent

    asyncio.run(prepare())
    return jobs_postgres


def newest_worker(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT coalesce(max(id), 0) FROM procrastinate_workers").fetchone()
    assert row is not None
    return int(row[0])


def start_worker(dsn: str, where: Path, queue: str) -> WorkerProcess:
    """Procrastinate's worker on ``queue``, returned once it registered itself."""
    before = newest_worker(dsn)
    process = WorkerProcess(
        [python(), "-m", "procrastinate", "--app", APP, "worker", "--queues", queue,
         "--concurrency", "4", "--fetch-job-polling-interval", "0.5"],
        url=dsn, log=where / "worker.log", ready=where / "worker.ready",
        env={"AIOPURGATORY_JOBS_POSTGRES": dsn},
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while newest_worker(dsn) <= before:
        if process.process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the worker did not start:\n{process.tail()}", pytrace=False)
        time.sleep(0.05)
    return process


@pytest.fixture(scope="module")
def worker(
    server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    process = start_worker(server.dsn, tmp_path_factory.mktemp("procrastinate"), "default")
    yield process
    process.stop()


@pytest_asyncio.fixture
async def app(server: PostgresServer) -> AsyncIterator[procrastinate.App]:
    """The web process's App (defers by task name: the tasks are the worker's)."""
    opened = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=server.dsn))
    async with opened.open_async():
        yield opened


@pytest.fixture
def triggers(server: PostgresServer, postgres_triggers: PostgresTriggers) -> PostgresTriggers:
    return postgres_triggers


@pytest.fixture
def jobs(triggers: PostgresTriggers, app: procrastinate.App) -> ProcrastinateJobs:
    return ProcrastinateJobs(triggers, app)


async def defer(app: procrastinate.App, task: str, queue: str = "default", **kwargs: Any) -> int:
    return await app.configure_task(task, queue=queue).defer_async(**kwargs)


async def test_a_succeeded_job_answers_with_the_job_procrastinate_stored(
    worker: WorkerProcess, app: procrastinate.App, jobs: ProcrastinateJobs
) -> None:
    job_id = await defer(app, "add", x=2, y=3)
    job = await jobs.wait(job_id, timeout=20.0)
    assert isinstance(job, Job)
    assert (job.id, job.status, job.task_name) == (job_id, "succeeded", "add")
    assert await jobs.triggers.fetch_watermark(jobs.key(job_id)) == END + JobEnd.SUCCEEDED.value


async def test_a_failed_job_raises_job_failed_error_after_its_last_retry(
    worker: WorkerProcess, app: procrastinate.App, jobs: ProcrastinateJobs
) -> None:
    job_id = await defer(app, "fail", message="boom")
    with pytest.raises(JobFailedError, match="failed") as caught:
        await jobs.wait(str(job_id), timeout=20.0)
    assert caught.value.end is JobEnd.FAILED
    # Retried twice: each retry set 'todo' (no end); only the third failure ends it.
    flaky = await defer(app, "flaky", seconds=0.2)
    with pytest.raises(JobFailedError) as caught:
        await jobs.wait(flaky, timeout=30.0)
    assert "after 3 attempt" in caught.value.detail
    statuses = await app.job_manager.list_jobs_async(id=flaky)
    assert [job.status for job in statuses] == ["failed"]


async def test_a_wait_parked_before_the_end_and_one_started_after_both_answer(
    worker: WorkerProcess, app: procrastinate.App, jobs: ProcrastinateJobs
) -> None:
    job_id = await defer(app, "sleep", seconds=1.0)
    parked = asyncio.ensure_future(jobs.wait(job_id, timeout=20.0))
    await asyncio.sleep(0.3)
    assert not parked.done()
    # Woken by the commit: well before the wait's own timeout (and its last look).
    assert (await asyncio.wait_for(parked, 10)).status == "succeeded"
    # Ended before this wait: it answers at once, even with a timeout of 0.
    started = time.monotonic()
    assert (await jobs.wait(job_id, timeout=0)).status == "succeeded"
    assert time.monotonic() - started < 2.0


async def test_a_job_that_does_not_end_in_time_raises_job_timeout_error_on_time(
    worker: WorkerProcess, app: procrastinate.App, jobs: ProcrastinateJobs
) -> None:
    job_id = await defer(app, "sleep", seconds=3.0)
    started = time.monotonic()
    with pytest.raises(JobTimeoutError):
        await jobs.wait(job_id, timeout=0.5)
    assert 0.5 <= time.monotonic() - started < 3.0
    assert (await jobs.wait(job_id, timeout=20.0)).status == "succeeded"


async def test_a_cancelled_job_raises_job_failed_error_revoked(
    app: procrastinate.App, jobs: ProcrastinateJobs
) -> None:
    job_id = await defer(app, "add", queue="nobody", x=1, y=1)  # no worker on that queue
    parked = asyncio.ensure_future(jobs.wait(job_id, timeout=20.0))
    await asyncio.sleep(0.3)
    assert await app.job_manager.cancel_job_by_id_async(job_id)
    with pytest.raises(JobFailedError, match="cancelled") as caught:
        await parked
    assert caught.value.end is JobEnd.REVOKED


async def test_a_status_change_that_rolls_back_wakes_nobody_and_its_commit_does(
    server: PostgresServer, app: procrastinate.App, jobs: ProcrastinateJobs
) -> None:
    job_id = await defer(app, "add", queue="nobody", x=1, y=1)
    parked = asyncio.ensure_future(jobs.wait(job_id, timeout=20.0))
    await asyncio.sleep(0.3)
    finish = "SELECT procrastinate_finish_job_v1(%s, 'succeeded', false)"
    async with await psycopg.AsyncConnection.connect(server.dsn) as conn:
        async with conn.transaction(force_rollback=True):
            await conn.execute(finish, (job_id,))
        await asyncio.sleep(1.0)
        assert not parked.done()
        assert await jobs.triggers.fetch_watermark(jobs.key(job_id)) is None
        async with conn.transaction():
            await conn.execute(finish, (job_id,))
    job = await asyncio.wait_for(parked, 10)
    assert job.status == "succeeded"


async def test_a_worker_killed_mid_job_times_the_wait_out_and_procrastinates_retry_ends_it(
    server: PostgresServer,
    app: procrastinate.App,
    jobs: ProcrastinateJobs,
    tmp_path: Path,
) -> None:
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    killed = start_worker(server.dsn, tmp_path / "first", "kill")
    try:
        job_id = await defer(app, "slow_once", queue="kill", seconds=60.0)
        for _ in range(200):
            if await app.job_manager.get_job_status_async(job_id) == Status.DOING:
                break
            await asyncio.sleep(0.05)
        killed.kill()
        started = time.monotonic()
        with pytest.raises(JobTimeoutError):
            await jobs.wait(job_id, timeout=1.0)
        assert 1.0 <= time.monotonic() - started < 4.0
        # Procrastinate's own way back: its stalled jobs (their worker's heartbeat
        # is old) retried; a wait parked meanwhile ends with the retry's end.
        parked = asyncio.ensure_future(jobs.wait(job_id, timeout=30.0))
        await asyncio.sleep(1.0)
        stalled = list(
            await app.job_manager.get_stalled_jobs(queue="kill", seconds_since_heartbeat=0.5)
        )
        assert [job.id for job in stalled] == [job_id]
        await app.job_manager.retry_job(stalled[0])
        second = start_worker(server.dsn, tmp_path / "second", "kill")
        try:
            job = await asyncio.wait_for(parked, 30)
            assert (job.status, job.attempts) == ("succeeded", 2)
        finally:
            second.stop()
    finally:
        killed.kill()


async def test_the_triggers_partition_is_the_one_every_process_computes(
    server: PostgresServer,
) -> None:
    keys = ["job:procrastinate:1", "job:procrastinate:123456789", "job:é:7", ""]
    async with await psycopg.AsyncConnection.connect(server.dsn) as conn:
        for key in keys:
            cursor = await conn.execute('SELECT "aiopurgatory_crc32"(%s)', (stored_key(key),))
            row = await cursor.fetchone()
            assert row is not None
            assert row[0] == zlib.crc32(stored_key(key))
            assert row[0] % 64 == partition_of(key, 64)


async def test_installs_running_at_once_wait_for_each_other(server: PostgresServer) -> None:
    """As the web how-to's ``uvicorn --workers 2`` does at start: without the lock,
    about a third failed with "tuple concurrently updated"."""

    async def installs(rounds: int) -> None:
        opened = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=server.dsn))
        async with opened.open_async():
            for _ in range(rounds):
                await install(opened)

    await asyncio.gather(*(installs(10) for _ in range(3)))


def test_bad_arguments_are_refused_with_the_argument_named() -> None:
    with pytest.raises(ValueError, match="namespace"):
        schema_sql(namespace="a$b")
    with pytest.raises(ValueError, match="channel"):
        schema_sql(channel="no-dash")
    with pytest.raises(ValueError, match="partitions"):
        schema_sql(partitions=0)
    assert "%" not in schema_sql()


async def test_the_waiter_refuses_what_is_not_a_job_id(
    app: procrastinate.App, triggers: PostgresTriggers
) -> None:
    with pytest.raises(TypeError, match="app"):
        ProcrastinateJobs(triggers, object())  # type: ignore[arg-type]
    jobs = ProcrastinateJobs(triggers, app)
    with pytest.raises(TypeError, match="job_id"):
        await jobs.wait(True, timeout=1)
    with pytest.raises(ValueError, match="job_id"):
        await jobs.wait("-1", timeout=1)
    assert jobs.key(12) == jobs.key("12") == "job:procrastinate:12"


async def test_another_channel_and_partition_count_reach_their_own_waiters(
    server: PostgresServer, worker: WorkerProcess, app: procrastinate.App
) -> None:
    await install(app, channel="others", partitions=7, namespace="elsewhere")
    async with PostgresTriggers(
        Purgatory("other"), server.dsn, channel="others", partitions=7
    ) as triggers:
        jobs = ProcrastinateJobs(triggers, app, namespace="elsewhere")
        job_id = await defer(app, "add", x=1, y=2)
        job = await asyncio.wait_for(jobs.wait(job_id, timeout=20.0), 10)
        assert job.status == "succeeded"
        assert await triggers.fetch_watermark(jobs.key(job_id)) == END
        assert jobs.key(job_id) == f"job:elsewhere:{job_id}"
