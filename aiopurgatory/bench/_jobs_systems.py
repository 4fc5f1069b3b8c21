"""The job systems of ``aiopurgatory bench jobs``: how each is run, fed and awaited.

Each :class:`_System` says how its worker is started (the same in both modes,
but for the opt-in, which its worker module reads from the environment), how the
benchmark sends a job with a given id, and, in the web application, how a
request waits for it: ``wait`` through ``aiopurgatory.jobs`` (mode
``triggers``), ``poll_once`` through the system's own client (mode ``poll``:
is it done, and with what).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio.to_thread

from ..jobs import JobWaiter

# Threads reading results at once; anyio's default (40) would queue a burst.
LIMITER = anyio.CapacityLimiter(64)

_Client = TypeVar("_Client")


def _on_a_loop(
    opening: Awaitable[_Client],
    send: Callable[[_Client, str], Awaitable[object]],
    close: Callable[[_Client], Awaitable[object]],
) -> tuple[Callable[[str], object], Callable[[], None]]:
    """An async client's ``(send(job_id), close())`` for the benchmark's (sync) process.

    The client is opened, used and closed on an event loop of its own, one
    ``run_until_complete`` a call.
    """
    loop = asyncio.new_event_loop()
    client = loop.run_until_complete(opening)

    def send_one(job_id: str) -> None:
        loop.run_until_complete(send(client, job_id))

    def close_all() -> None:
        loop.run_until_complete(close(client))
        loop.close()

    return send_one, close_all


class _System:
    """One job system, as the benchmark drives it (see the module documentation)."""

    name = ""
    waiter: JobWaiter

    def worker_argv(self, url: str) -> list[str]:
        raise NotImplementedError

    def sender(self, url: str) -> tuple[Callable[[str], object], Callable[[], None]]:
        """``(send(job_id), close())`` for the benchmark's (sync) process."""
        raise NotImplementedError

    async def start(self, url: str, triggers: Any | None) -> None:
        """Set up the web process's side (``triggers`` in mode ``triggers``)."""
        raise NotImplementedError

    async def wait(self, job_id: str, seconds: float) -> Any:
        return await self.waiter.wait(job_id, timeout=seconds)

    async def poll_once(self, job_id: str) -> tuple[bool, Any]:
        raise NotImplementedError

    async def stop(self) -> None:
        return None


class _Celery(_System):
    name = "celery"

    def worker_argv(self, url: str) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", "aiopurgatory.bench._jobs_celery",
                "worker", "-P", "threads", "-c", "8", "--without-gossip",
                "--without-mingle", "--without-heartbeat", "-l", "warning"]  # fmt: skip

    def sender(self, url: str) -> tuple[Callable[[str], object], Callable[[], None]]:
        from celery import Celery

        client = Celery("bench-client", broker=url, backend=url)
        return lambda job_id: client.send_task("bench.stamp", task_id=job_id), client.close

    async def start(self, url: str, triggers: Any | None) -> None:
        from ..jobs.celery import CeleryJobs
        from ._jobs_celery import app

        self.app = app
        if triggers is not None:
            self.waiter = CeleryJobs(triggers, app, limiter=LIMITER)

    async def poll_once(self, job_id: str) -> tuple[bool, Any]:
        def read() -> tuple[bool, Any]:
            result = self.app.AsyncResult(job_id)
            return (True, result.result) if result.ready() else (False, None)

        return await anyio.to_thread.run_sync(read, limiter=LIMITER)


class _RQ(_System):
    name = "rq"

    def worker_argv(self, url: str) -> list[str]:
        # SimpleWorker (no fork per job) in both modes, so that they compare alike.
        return [sys.executable, "-m", "aiopurgatory.bench._jobs_rq_worker", url]

    def sender(self, url: str) -> tuple[Callable[[str], object], Callable[[], None]]:
        import redis
        from rq import Queue

        from ._jobs_rq import stamp

        client = redis.Redis.from_url(url)
        queue = Queue("bench", connection=client)
        return lambda job_id: queue.enqueue(stamp, job_id=job_id), client.close

    async def start(self, url: str, triggers: Any | None) -> None:
        import redis

        from ..jobs.rq import RQJobs

        self.client = redis.Redis.from_url(url, max_connections=128)
        if triggers is not None:
            self.waiter = RQJobs(triggers, self.client, limiter=LIMITER)

    async def poll_once(self, job_id: str) -> tuple[bool, Any]:
        from rq.exceptions import NoSuchJobError
        from rq.job import Job, JobStatus

        def read() -> tuple[bool, Any]:
            try:
                job = Job.fetch(job_id, connection=self.client)
            except NoSuchJobError:
                return False, None
            if job.get_status(refresh=False) != JobStatus.FINISHED:
                return False, None
            return True, job.return_value()

        return await anyio.to_thread.run_sync(read, limiter=LIMITER)

    async def stop(self) -> None:
        self.client.close()


class _Saq(_System):
    name = "saq"

    def worker_argv(self, url: str) -> list[str]:
        return [sys.executable, "-m", "saq", "aiopurgatory.bench._jobs_saq.settings"]

    def sender(self, url: str) -> tuple[Callable[[str], object], Callable[[], None]]:
        from saq import Queue

        async def connect() -> Queue:
            queue = Queue.from_url(url, name="bench")
            await queue.connect()
            return queue

        return _on_a_loop(
            connect(),
            lambda queue, job_id: queue.enqueue("stamp", key=job_id),
            lambda queue: queue.disconnect(),
        )

    async def start(self, url: str, triggers: Any | None) -> None:
        from saq import Queue

        from ..jobs.saq import SaqJobs

        self.queue = Queue.from_url(url, name="bench")
        await self.queue.connect()
        if triggers is not None:
            self.waiter = SaqJobs(triggers, self.queue)

    async def poll_once(self, job_id: str) -> tuple[bool, Any]:
        job = await self.queue.job(job_id)
        if job is None or job.status != "complete":
            return False, None
        return True, job.result

    async def stop(self) -> None:
        await self.queue.disconnect()


class _Dramatiq(_System):
    name = "dramatiq"

    def worker_argv(self, url: str) -> list[str]:
        return [sys.executable, "-m", "dramatiq", "aiopurgatory.bench._jobs_dramatiq",
                "-p", "1", "-t", "8", "-Q", "bench"]  # fmt: skip

    @staticmethod
    def message(job_id: str) -> Any:
        import dramatiq

        return dramatiq.Message(
            queue_name="bench", actor_name="stamp", args=(), kwargs={}, options={},
            message_id=job_id,
        )  # fmt: skip

    def sender(self, url: str) -> tuple[Callable[[str], object], Callable[[], None]]:
        from dramatiq.brokers.redis import RedisBroker

        broker = RedisBroker(url=url)  # type: ignore[no-untyped-call]
        return lambda job_id: broker.enqueue(self.message(job_id)), broker.close

    async def start(self, url: str, triggers: Any | None) -> None:
        from ..jobs.dramatiq import DramatiqJobs
        from ._jobs_dramatiq import backend

        self.backend = backend
        if triggers is not None:
            self.waiter = DramatiqJobs(triggers, backend, limiter=LIMITER)

    async def wait(self, job_id: str, seconds: float) -> Any:
        waiter: Any = self.waiter
        return await waiter.wait_message(self.message(job_id), timeout=seconds)

    async def poll_once(self, job_id: str) -> tuple[bool, Any]:
        from dramatiq.results import ResultMissing

        def read() -> tuple[bool, Any]:
            try:
                backend: Any = self.backend
                return True, backend.get_result(self.message(job_id), block=False)
            except ResultMissing:
                return False, None

        return await anyio.to_thread.run_sync(read, limiter=LIMITER)


class _Arq(_System):
    name = "arq"

    def worker_argv(self, url: str) -> list[str]:
        return [sys.executable, "-m", "arq", "aiopurgatory.bench._jobs_arq.WorkerSettings"]

    def sender(self, url: str) -> tuple[Callable[[str], object], Callable[[], None]]:
        from arq import create_pool
        from arq.connections import RedisSettings

        from ._jobs_arq import QUEUE

        return _on_a_loop(
            create_pool(RedisSettings.from_dsn(url), default_queue_name=QUEUE),
            lambda pool, job_id: pool.enqueue_job("stamp", _job_id=job_id),
            lambda pool: pool.aclose(),
        )

    async def start(self, url: str, triggers: Any | None) -> None:
        from arq import create_pool
        from arq.connections import RedisSettings

        from ..jobs.arq import ArqJobs
        from ._jobs_arq import QUEUE

        self.pool = await create_pool(RedisSettings.from_dsn(url), default_queue_name=QUEUE)
        if triggers is not None:
            self.waiter = ArqJobs(triggers, self.pool)

    async def poll_once(self, job_id: str) -> tuple[bool, Any]:
        # One round of arq's own polling (Job.result(poll_delay=...)): its
        # transaction reading the stored result and the job's place in the
        # queue. Job.result itself cannot be used: it gives up on a job not yet
        # queued, and the requests are parked before their jobs are sent.
        from arq.jobs import deserialize_result, result_key_prefix

        from ._jobs_arq import QUEUE

        async with self.pool.pipeline(transaction=True) as pipe:
            pipe.get(result_key_prefix + job_id)
            pipe.zscore(QUEUE, job_id)
            stored, _ = await pipe.execute()
        if not stored:
            return False, None
        return True, deserialize_result(stored).result

    async def stop(self) -> None:
        await self.pool.aclose()


SYSTEMS: dict[str, type[_System]] = {cls.name: cls for cls in (_Celery, _RQ, _Saq, _Dramatiq, _Arq)}
