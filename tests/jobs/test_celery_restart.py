"""Celery and aiopurgatory.jobs through a Redis restart: 50 tasks publishing progress.

Redis is the broker, the result backend and the triggers' transport here, and is
killed (SIGKILL) and started again (same port, its append-only file) while the
tasks run and 50 requests wait for them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from celery import Celery

from aiopurgatory.jobs.celery import CeleryJobs
from aiopurgatory.redis import RedisTriggers, SyncPublisher
from aiopurgatory.redis.testing import RedisServer
from tests.jobs import celery_app
from tests.jobs.conftest import WorkerProcess, python

TASKS = "tests.jobs.celery_app"
COUNT = 50
# Seconds Redis is away: tasks end meanwhile, and publish their ends while it is.
OUTAGE = 2.0


@pytest.fixture(scope="module")
def worker(
    jobs_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    logs = tmp_path_factory.mktemp("celery")
    started = WorkerProcess(
        [python(), "-m", "celery", "-A", TASKS, "worker", "-P", "threads", "-c", "10",
         "-Q", "restart", "-n", "restart@%h", "--without-gossip", "--without-mingle",
         "--without-heartbeat", "-l", "info"],
        url=jobs_redis.url, log=logs / "worker.log", ready=logs / "worker.ready",
    )  # fmt: skip
    started.wait_ready()
    yield started
    started.stop()


async def supervise(worker: WorkerProcess) -> None:
    """Start the worker again if it exits, as a supervisor would in production.

    Celery 5.7.0's worker can exit on a broker connection loss: closing the lost
    connection, kombu restores the unacknowledged messages through a channel
    whose connection is already gone (``AttributeError: 'NoneType' object has no
    attribute 'hostname'``, "Unrecoverable error"), then the worker finishes its
    running tasks and exits. The messages it had fetched come back after
    ``visibility_timeout`` (5 s in tests.jobs.celery_app) to the next worker.
    Any other exit fails the test.
    """
    while True:
        await asyncio.sleep(0.2)
        if worker.process.poll() is not None:
            crash = "Unrecoverable error: AttributeError(\"'NoneType' object has no attribute"
            log = worker.tail(100_000)
            assert log.count(crash) == worker.respawns + 1, log[-5000:]
            worker.respawn_if_exited()
            await asyncio.to_thread(worker.wait_ready)


def state_of(client: Celery, task_id: str) -> str:
    return str(client.AsyncResult(task_id).state)


async def test_a_redis_restart_mid_run_fails_no_task_and_answers_every_waiter(
    worker: WorkerProcess, jobs_redis: RedisServer, triggers: RedisTriggers
) -> None:
    client = celery_app.client(jobs_redis.url)
    jobs = CeleryJobs(triggers, client)
    try:
        ids = []
        for _ in range(COUNT):
            result = await asyncio.to_thread(
                celery_app.sender(jobs_redis.url).send_task,
                f"{TASKS}.steps",
                args=(5, 0.1),
                queue="restart",
            )
            ids.append(str(result.id))
        waits = [asyncio.create_task(jobs.wait(task_id, timeout=60.0)) for task_id in ids]
        await asyncio.sleep(1.0)  # a few tasks ended, some run, most are queued
        jobs_redis.kill()
        await asyncio.sleep(OUTAGE)
        jobs_redis.start()
        restarted = time.monotonic()
        supervising = asyncio.create_task(supervise(worker))
        try:
            results = await asyncio.gather(*waits, return_exceptions=True)
        finally:
            if supervising.done():
                supervising.result()  # its failure: another exit than Celery's crash
            supervising.cancel()
        answered_in = time.monotonic() - restarted
        # Every waiter got its task's result: none failed, none timed out.
        assert results == [5] * COUNT, worker.tail()
        # Woken by the triggers (kept through the outage), not by their
        # timeouts' last look: ~4 s of tasks left, well within the 60 s timeout.
        assert answered_in < 30.0
        states = [await asyncio.to_thread(state_of, client, task_id) for task_id in ids]
        assert set(states) == {"SUCCESS"}
        # Progress reported while Redis was away: the SyncPublisher that keeps
        # advances through an outage (flush()) publishes them later; the one
        # before it raised, which report_progress logged (and the task went on).
        failed = worker.tail(100_000).count("aiopurgatory.jobs.publish_failed")
        if hasattr(SyncPublisher, "flush"):
            assert failed == 0
    finally:
        await asyncio.to_thread(client.close)
