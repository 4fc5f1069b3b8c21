"""RQ, saq and Dramatiq through a Redis restart: 20 jobs reporting progress, 20 waiters.

Redis is each system's broker and result store and the triggers' transport here;
it is killed (SIGKILL) one second into the run and started again two seconds
later (same port, its append-only file). What each system does with that is its
own (RQ's worker quits, Dramatiq retries its post-processing, saq's upkeep
fails and goes on); what is checked is the library's part: no job fails because
of it, every waiter whose job ended gets its result, woken by the triggers
(well before its timeout), and the others time out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiopurgatory import Purgatory
from aiopurgatory.jobs import (
    JobAnswer,
    JobEnd,
    JobFailedError,
    JobResultMissingError,
    JobTimeoutError,
    JobWaiter,
)
from aiopurgatory.redis import RedisTriggers
from aiopurgatory.redis.testing import RedisServer
from tests.jobs.conftest import WorkerProcess, python

COUNT = 20
OUTAGE = 2.0
TIMEOUT = 15.0  # each waiter's


async def through_a_restart(
    redis: RedisServer,
    worker: WorkerProcess,
    send: Callable[[], Awaitable[str]],
    waiter: Callable[[RedisTriggers], JobWaiter],
    ended_at: Callable[[str], Awaitable[float | None]] | None = None,
) -> None:
    """Send, park, restart Redis; check the library's part whatever the system did.

    ``ended_at``: when the system says a job ended (seconds since the epoch), for a
    system that may end a job late on its own (saq reruns a job its sweep finds
    stuck through the outage when the job's timeout has passed): a job that ended
    in the last second before its waiter's timeout may be answered by the
    timeout's read instead of its trigger.
    """
    async with RedisTriggers(Purgatory("web"), redis.url) as triggers:
        jobs = waiter(triggers)
        ids = [await send() for _ in range(COUNT)]
        started = time.monotonic()
        started_wall = time.time()

        async def wait(job_id: str) -> tuple[object, float]:
            try:
                result: object = await jobs.wait(job_id, timeout=TIMEOUT)
            except Exception as exc:
                result = exc
            return result, time.monotonic() - started

        waits = [asyncio.create_task(wait(job_id)) for job_id in ids]
        await asyncio.sleep(1.0)
        redis.kill()
        await asyncio.sleep(OUTAGE)
        redis.start()
        outcomes = await asyncio.gather(*waits)
        answers = [await jobs.read(job_id) for job_id in ids]
    log = worker.tail(100_000)
    ended = 0
    ends = [await ended_at(job_id) if ended_at else None for job_id in ids]
    for (result, seconds), answer, end in zip(outcomes, answers, ends, strict=True):
        if answer is None:
            # The job system has not run it (a timeout), or ran it and lost its
            # result (Dramatiq's Results could not store it while Redis was away:
            # the end says so).
            assert isinstance(result, JobTimeoutError | JobResultMissingError), (
                result,
                log[-3000:],
            )
            continue
        ended += 1
        # The waiter of a job that ended got the job system's answer: its
        # result, or the failure the system recorded (saq's sweep aborts jobs
        # it found stuck through the outage: the system's doing, not ours).
        if answer.end is JobEnd.SUCCEEDED:
            assert (answer.value, result) == (5, 5), (result, log[-3000:])
            # Woken by the trigger (kept through the outage), not by the timeout: a
            # wait that timed out reads the job system at its timeout, after TIMEOUT
            # seconds (a loaded machine may end the jobs themselves late).
            if end is None or end - started_wall < TIMEOUT - 1.0:
                assert seconds < TIMEOUT, (seconds, end and end - started_wall)
        else:
            assert isinstance(result, JobFailedError), (result, log[-3000:])
            assert result.end is answer.end
            assert "aiopurgatory" not in result.detail  # no job fails because of us
    kinds = [type(result).__name__ for result, _ in outcomes]
    print(f"{ended} of {COUNT} ended:", {kind: kinds.count(kind) for kind in set(kinds)})
    assert ended >= 1  # some ended before Redis went away, at least
    assert "aiopurgatory.jobs.publish_failed" not in log


def start(args: list[str], redis: RedisServer, tmp_path: Path, **env: str) -> WorkerProcess:
    process = WorkerProcess(
        args, url=redis.url, log=tmp_path / "worker.log", ready=tmp_path / "ready", env=env
    )
    process.wait_ready()
    return process


async def test_rq(jobs_redis: RedisServer, tmp_path: Path) -> None:
    import redis
    from rq import Queue

    from aiopurgatory.jobs.rq import RQJobs
    from tests.jobs import rq_app

    worker = start(
        [python(), "-m", "rq.cli", "worker", "-w", "tests.jobs.rq_app.ReadyWorker",
         "--url", jobs_redis.url, "restart"],
        jobs_redis, tmp_path,
    )  # fmt: skip
    client = redis.Redis.from_url(jobs_redis.url)
    queue = Queue("restart", connection=client)

    async def send() -> str:
        job = await asyncio.to_thread(queue.enqueue, rq_app.steps, 5, 0.1)
        return str(job.id)

    try:
        await through_a_restart(jobs_redis, worker, send, lambda t: RQJobs(t, client))
    finally:
        worker.kill()
        client.close()


async def test_saq(jobs_redis: RedisServer, tmp_path: Path) -> None:
    from saq import Queue

    from aiopurgatory.jobs.saq import SaqJobs

    worker = start(
        [python(), "-m", "saq", "tests.jobs.saq_app.settings"],
        jobs_redis, tmp_path, AIOPURGATORY_JOBS_QUEUE="restart",
    )  # fmt: skip
    queue = Queue.from_url(jobs_redis.url, name="restart")
    await queue.connect()

    async def send() -> str:
        job = await queue.enqueue("steps", count=5, seconds=0.1)
        assert job is not None
        return str(job.key)

    async def ended_at(key: str) -> float | None:
        job = await queue.job(key)  # completed: milliseconds since the epoch, 0 if not
        return job.completed / 1000 if job is not None and job.completed else None

    try:
        await through_a_restart(jobs_redis, worker, send, lambda t: SaqJobs(t, queue), ended_at)
    finally:
        worker.kill()
        await queue.disconnect()


async def test_dramatiq(jobs_redis: RedisServer, tmp_path: Path) -> None:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.results.backends.redis import RedisBackend

    from aiopurgatory.jobs.dramatiq import DramatiqJobs

    worker = start(
        [python(), "-m", "dramatiq", "tests.jobs.dramatiq_app", "-p", "1", "-t", "8",
         "-Q", "default"],
        jobs_redis, tmp_path,
    )  # fmt: skip
    broker = RedisBroker(url=jobs_redis.url)  # type: ignore[no-untyped-call]
    backend = RedisBackend(url=jobs_redis.url)  # type: ignore[no-untyped-call]

    async def send() -> str:
        message: dramatiq.Message[Any] = dramatiq.Message(
            queue_name="default", actor_name="steps", args=(5, 0.1), kwargs={}, options={}
        )
        await asyncio.to_thread(broker.enqueue, message)
        return message.message_id

    class ByIdJobs(DramatiqJobs):
        """Waits by message id: every message here is the actor ``steps`` of ``default``."""

        async def wait(
            self,
            job_id: str,
            *,
            timeout: float,  # noqa: ASYNC109 - JobWaiter.wait's own
            progress: float | None = None,
        ) -> Any:
            return await self.wait_message(message(job_id), timeout=timeout, progress=progress)

        async def read(self, job_id: str) -> JobAnswer | None:
            self._messages.setdefault(job_id, message(job_id))
            return await super().read(job_id)

    def message(job_id: str) -> dramatiq.Message[Any]:
        return dramatiq.Message(
            queue_name="default", actor_name="steps", args=(), kwargs={}, options={},
            message_id=job_id,
        )  # fmt: skip

    try:
        await through_a_restart(jobs_redis, worker, send, lambda t: ByIdJobs(t, backend))
    finally:
        worker.kill()
        broker.close()
