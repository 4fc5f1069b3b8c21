"""RQ: publish jobs' ends from the worker, await them by id from async code.

Worker side: run the worker class, no code in the jobs::

    rq worker -w aiopurgatory.jobs.rq.PublishingWorker --url redis://localhost:6379/0

Web side::

    jobs = RQJobs(triggers, redis.Redis.from_url(url))   # a sync client: read in threads
    result = await jobs.wait(job.id, timeout=30.0)

Why a worker class and not RQ's job callbacks (``on_success``/``on_failure``/
``on_stopped``): RQ runs those *before* it stores the job's result and status
(``Worker._finalize_success`` calls the callback, then ``handle_job_success``;
checked in RQ 2.x-3.0's ``worker/base.py``), so a waiter woken by them could
read a job that has not finished yet. :class:`PublishingWorker` publishes after
``handle_job_success``/``handle_job_failure`` have written RQ's own state:

* finished: SUCCEEDED (a job with repeats left publishes at its last run);
* failed after its last retry: FAILED, or LOST when the work horse died
  (RQ's "Work-horse terminated unexpectedly");
* stopped (``send_stop_job_command``): REVOKED.

A retried job publishes nothing until its last attempt. The worker publishes
through a :class:`~aiopurgatory.redis.SyncPublisher` on its own Redis
connection (or :attr:`PublishingMixin.jobs_redis_url`'s). Needs the ``rq`` extra.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

try:
    import redis
    import rq
    from rq.exceptions import NoSuchJobError
    from rq.job import Job, JobStatus
    from rq.worker import SimpleWorker, Worker
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ImportError("aiopurgatory.jobs.rq needs RQ: pip install 'aiopurgatory[rq]'") from exc

import anyio.to_thread

from .._namespace import public_dir as _public_dir
from .._transport import Triggers
from ._layout import JobEnd
from ._publisher import Advancer, JobPublisher
from ._waiter import JobAnswer, JobFailedError, JobWaiter

__all__ = [
    "PublishingMixin",
    "PublishingSimpleWorker",
    "PublishingWorker",
    "RQJobs",
    "report_progress",
]

# What RQ writes as the failure of a job whose work horse died (worker_classes.py).
_HORSE_DIED = "Work-horse terminated unexpectedly"

# The publisher of the worker running in this process (its work horses inherit
# it through the fork), for report_progress.
_current: JobPublisher | None = None


class PublishingMixin:
    """Publishes every job's end after RQ stored it; mix into an RQ worker class.

    Class attributes, for a subclass to change:

    Attributes:
        jobs_namespace: the jobs' key namespace (default ``"rq"``), the waiters'.
        jobs_channel: the Redis channel (default ``"aiopurgatory"``).
        jobs_redis_url: publish through this Redis instead of the worker's own.
    """

    jobs_namespace: ClassVar[str] = "rq"
    jobs_channel: ClassVar[str | None] = None
    jobs_redis_url: ClassVar[str | None] = None

    connection: redis.Redis
    _stopped_job_id: str | None

    @property
    def jobs(self) -> JobPublisher:
        """This worker's :class:`JobPublisher` (made on first use)."""
        global _current
        jobs: JobPublisher | None = self.__dict__.get("_aiopurgatory_jobs")
        if jobs is None:
            jobs = JobPublisher(self._make_publisher, namespace=self.jobs_namespace)
            self.__dict__["_aiopurgatory_jobs"] = jobs
            _current = jobs
        return jobs

    def _make_publisher(self) -> Advancer:
        from ..redis import SyncPublisher

        url = self.jobs_redis_url
        # The worker's client after a fork is safe: redis-py's pool replaces its
        # connections in a process that did not make them.
        return SyncPublisher(self.connection if url is None else url, channel=self.jobs_channel)

    def register_birth(self, *args: Any, **kwargs: Any) -> Any:
        _ = self.jobs  # report_progress in the jobs finds it
        return super().register_birth(*args, **kwargs)  # type: ignore[misc]

    def handle_job_success(self, job: Job, *args: Any, **kwargs: Any) -> Any:
        outcome = super().handle_job_success(job, *args, **kwargs)  # type: ignore[misc]
        if job.get_status(refresh=False) == JobStatus.FINISHED:
            self._publish_end(job.id, JobEnd.SUCCEEDED)
        return outcome

    def handle_job_failure(self, job: Job, *args: Any, **kwargs: Any) -> Any:
        exc_string = kwargs.get("exc_string", args[2] if len(args) > 2 else "")
        outcome = super().handle_job_failure(job, *args, **kwargs)  # type: ignore[misc]
        status = job.get_status(refresh=False)
        if status == JobStatus.STOPPED:
            self._publish_end(job.id, JobEnd.REVOKED)
        elif status == JobStatus.FAILED:
            lost = isinstance(exc_string, str) and exc_string.startswith(_HORSE_DIED)
            self._publish_end(job.id, JobEnd.LOST if lost else JobEnd.FAILED)
        return outcome  # retried (queued, scheduled): not ended

    def _publish_end(self, job_id: str, end: JobEnd) -> None:
        jobs = self.jobs
        jobs.ended(job_id, end)
        if os.getpid() != getattr(self, "pid", os.getpid()):
            # A work horse leaves with os._exit() right after: deliver what the
            # publisher kept (through a Redis outage) before that.
            jobs.flush(5.0)


class PublishingWorker(PublishingMixin, Worker):
    """RQ's ``Worker`` (a work horse forked per job) that publishes jobs' ends."""


class PublishingSimpleWorker(PublishingMixin, SimpleWorker):
    """RQ's ``SimpleWorker`` (jobs in the worker's process) that publishes jobs' ends."""


def report_progress(value: float) -> bool:
    """Publish the running job's progress (from 0 to below 2**52): call it in a job.

    Returns:
        True if published (or kept for delivery); False if it could not be
        (logged): reporting progress never fails the job.

    Raises:
        RuntimeError: not in a job run by a :class:`PublishingMixin` worker.
        TypeError, ValueError: ``value`` is not such a number.
    """
    job = rq.get_current_job()
    if job is None or _current is None:
        raise RuntimeError("report_progress() is for a job run by an RQ PublishingWorker")
    return _current.progress(job.id, value)


class RQJobs(JobWaiter):
    """Awaits RQ jobs by id and answers with RQ's own result.

    ``await jobs.wait(job_id, timeout=...)`` returns the job's return value
    (``Job.return_value()``), or raises :class:`JobFailedError` (RQ stores a
    failure as text: its ``detail`` is RQ's ``exc_string``) with ``end``
    FAILED, LOST (the work horse died) or REVOKED (stopped or canceled). RQ is
    read with ``Job.fetch`` and ``latest_result`` on ``connection``, in a
    worker thread, never on the loop.

    Args:
        triggers: the process's entered transport (``RedisTriggers``...).
        connection: a sync ``redis.Redis`` client of RQ's Redis.
        namespace: the workers' key namespace (default ``"rq"``).
        serializer: RQ's serializer, if the queue uses another than its default.
        limiter: caps the threads reading results at once (default anyio's 40).

    Raises:
        TypeError: ``connection`` is not a ``redis.Redis``; as :class:`JobWaiter`.
    """

    system = "rq"

    def __init__(
        self,
        triggers: Triggers,
        connection: redis.Redis,
        *,
        namespace: str | None = None,
        serializer: Any = None,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> None:
        if not isinstance(connection, redis.Redis):
            raise TypeError(
                f"connection must be a redis.Redis (sync) client, got {type(connection).__name__}"
            )
        super().__init__(triggers, namespace=namespace)
        self._connection = connection
        self._serializer = serializer
        self._limiter = limiter

    async def read(self, job_id: str) -> JobAnswer | None:
        """RQ's answer for job ``job_id`` if it ended (read in a thread), else None.

        Raises:
            redis.RedisError: RQ's Redis could not be read.
        """
        return await anyio.to_thread.run_sync(self._read, job_id, limiter=self._limiter)

    def _read(self, job_id: str) -> JobAnswer | None:
        try:
            job = Job.fetch(job_id, connection=self._connection, serializer=self._serializer)
        except NoSuchJobError:
            return None  # never enqueued, or expired with its result
        status = job.get_status(refresh=False)
        if status in (JobStatus.STOPPED, JobStatus.CANCELED):
            return JobAnswer(JobEnd.REVOKED, error=JobFailedError(job_id, JobEnd.REVOKED, status))
        if status not in (JobStatus.FINISHED, JobStatus.FAILED):
            return None
        result = job.latest_result()
        if result is None:
            return None  # its result expired (result_ttl) or was never kept
        if result.type == result.Type.SUCCESSFUL:
            return JobAnswer(JobEnd.SUCCEEDED, value=result.return_value)
        detail = result.exc_string or ""
        end = JobEnd.LOST if detail.startswith(_HORSE_DIED) else JobEnd.FAILED
        return JobAnswer(end, error=JobFailedError(job_id, end, detail))


__dir__ = _public_dir(__name__, __all__)
