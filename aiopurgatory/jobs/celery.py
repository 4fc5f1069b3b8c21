"""Celery: publish tasks' ends from the worker, await them by id from async code.

Worker side, in the module that makes the Celery app (so every worker process
runs it), one call, no code in the tasks::

    app = Celery("proj", broker=..., backend=...)
    aiopurgatory.jobs.celery.publish_jobs(app, "redis://localhost:6379/0")

Web side::

    jobs = CeleryJobs(triggers, app)            # triggers: an entered RedisTriggers
    result = await jobs.wait(task_id, timeout=30.0)

Which of Celery's signals publish what, each sent after Celery's backend stored
the state (checked in ``celery/app/trace.py`` and ``celery/worker/request.py``,
Celery 5.5-5.7):

* ``task_success`` (in the pool's process or thread, after ``mark_as_done``
  stored it): SUCCEEDED. Not ``task_postrun``: OpenTelemetry's Celery
  instrumentation ends the task's span in its own ``task_postrun`` receiver,
  and receivers run in the order they were connected, so whether the span was
  still current there would depend on which of the two was set up first;
  ``task_success`` and ``task_failure`` are sent inside it whatever the order;
* ``task_failure`` (after ``mark_as_failure``: in the pool for an exception of
  the task, in the worker's main process for a hard time limit, a rejected
  message, a lost worker): FAILED, or LOST for ``WorkerLostError``;
* ``task_revoked`` (the main process, after ``mark_as_revoked``): REVOKED.

A retry (``self.retry``, ``autoretry_for``) publishes nothing: the task has
not ended. With ``acks_late`` and ``task_reject_on_worker_lost``, a task whose
worker died is redelivered, not failed: nothing is published until its next
run ends. Needs the ``celery`` extra.

The span current where an end is published travels with it (see
:mod:`aiopurgatory.tracing`): with ``opentelemetry-instrumentation-celery``, the
task's span for SUCCEEDED and for FAILED in the pool; an end published by the
worker's main process (REVOKED, a lost worker, a hard time limit) is outside
any task span and carries none.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

try:
    import celery
    from celery import signals, states
    from celery.exceptions import WorkerLostError
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ImportError(
        "aiopurgatory.jobs.celery needs Celery: pip install 'aiopurgatory[celery]'"
    ) from exc

import anyio.to_thread

from .._namespace import public_dir as _public_dir
from .._transport import Triggers
from ._layout import JobEnd
from ._publisher import Advancer, JobPublisher
from ._waiter import JobAnswer, JobWaiter

__all__ = ["CeleryJobs", "publish_jobs", "report_progress"]

# The publisher of each app that publishes (report_progress finds it from the
# running task's app); weak, so an app dropped in tests takes its hooks along.
_publishers: weakref.WeakKeyDictionary[celery.Celery, JobPublisher] = weakref.WeakKeyDictionary()


def publish_jobs(
    app: celery.Celery,
    publisher: str | Callable[[], Advancer] | Advancer,
    *,
    namespace: str = "celery",
    channel: str | None = None,
) -> JobPublisher:
    """Have ``app``'s workers publish every task's end (and progress) for :class:`CeleryJobs`.

    Connects Celery's signals (see the module documentation) for the tasks of
    ``app``; call it where the app is made, so that every worker process (the
    prefork pool's children too) has it. A worker publishes through its own
    :class:`~aiopurgatory.redis.SyncPublisher` per process (made on first use,
    after the pool forked), flushed and closed at the process's shutdown.

    Args:
        app: the Celery app.
        publisher: a Redis URL, a callable returning a publisher (called once per
            process), or a publisher (``SyncPublisher``) to use as it is.
        namespace: the tasks' key namespace (default ``"celery"``), the waiters'.
        channel: the Redis channel, for a URL (default ``"aiopurgatory"``).

    Returns:
        The :class:`JobPublisher` (for ``report_progress`` or a manual end).

    Raises:
        TypeError: ``app`` is not a Celery app; ``publisher`` is unusable.
        ValueError: ``app`` publishes already.
    """
    if not isinstance(app, celery.Celery):
        raise TypeError(f"app must be a celery.Celery, got {type(app).__name__}")
    if app in _publishers:
        raise ValueError("app: publish_jobs() was called for this app already")
    jobs = JobPublisher(publisher, namespace=namespace, channel=channel)
    _publishers[app] = jobs

    def ours(task: object) -> bool:
        return getattr(task, "app", None) is app

    def on_success(sender: Any = None, **_: Any) -> None:
        # Sent with the task's request still pushed: its id is the one stored.
        request = getattr(sender, "request", None)
        task_id = getattr(request, "id", None)
        if isinstance(task_id, str) and ours(sender):
            jobs.ended(task_id, JobEnd.SUCCEEDED)

    def on_failure(
        sender: Any = None, task_id: Any = None, exception: Any = None, **_: Any
    ) -> None:
        if isinstance(task_id, str) and ours(sender):
            lost = isinstance(exception, WorkerLostError)
            jobs.ended(task_id, JobEnd.LOST if lost else JobEnd.FAILED)

    def on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
        task_id = getattr(request, "id", None)
        if isinstance(task_id, str) and ours(sender):
            jobs.ended(task_id, JobEnd.REVOKED)

    def on_shutdown(**_: Any) -> None:
        jobs.flush(5.0)
        jobs.close()

    # weak=False: the receivers are closures, which nothing else references.
    signals.task_success.connect(on_success, weak=False)
    signals.task_failure.connect(on_failure, weak=False)
    signals.task_revoked.connect(on_revoked, weak=False)
    signals.worker_process_shutdown.connect(on_shutdown, weak=False)
    signals.worker_shutdown.connect(on_shutdown, weak=False)
    return jobs


def report_progress(value: float) -> bool:
    """Publish the running task's progress (from 0 to below 2**52): call it in a task.

    Returns:
        True if published (or kept for delivery); False if it could not be
        (logged): reporting progress never fails the task.

    Raises:
        RuntimeError: not in a task of an app given to :func:`publish_jobs`.
        TypeError, ValueError: ``value`` is not such a number.
    """
    task = celery.current_task
    task_id = None if task is None else task.request.id
    jobs = None if task is None else _publishers.get(task.app)
    if jobs is None or not isinstance(task_id, str):
        raise RuntimeError(
            "report_progress() is for a running task of an app given to publish_jobs()"
        )
    return jobs.progress(task_id, value)


class CeleryJobs(JobWaiter):
    """Awaits Celery tasks by id and answers with Celery's own result or exception.

    ``await jobs.wait(task_id, timeout=...)`` returns what
    ``AsyncResult(task_id).get()`` would: the result, or Celery's exception
    raised (the task's own, ``TaskRevokedError``, ``WorkerLostError``,
    ``TimeLimitExceeded``). The result is read with
    ``AsyncResult.state``/``maybe_throw`` (one read of the result backend) in
    a worker thread, never on the loop: a slow or hung backend holds that
    wait, not the loop.

    Args:
        triggers: the process's entered transport (``RedisTriggers``...).
        app: the Celery app (its result backend is read).
        namespace: the workers' key namespace (default ``"celery"``).
        limiter: caps the threads reading results at once (default anyio's
            process-wide 40).

    Raises:
        TypeError: ``app`` is not a Celery app; as :class:`JobWaiter`.
    """

    system = "celery"

    def __init__(
        self,
        triggers: Triggers,
        app: celery.Celery,
        *,
        namespace: str | None = None,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> None:
        if not isinstance(app, celery.Celery):
            raise TypeError(f"app must be a celery.Celery, got {type(app).__name__}")
        super().__init__(triggers, namespace=namespace)
        self._app = app
        self._limiter = limiter

    @property
    def app(self) -> celery.Celery:
        """The Celery app."""
        return self._app

    async def read(self, job_id: str) -> JobAnswer | None:
        """Celery's answer for task ``job_id`` if it is ready (read in a thread), else None.

        Raises:
            Exception: the result backend could not be read (Celery's or
                redis-py's error, as ``AsyncResult.state`` raises it).
        """
        return await anyio.to_thread.run_sync(self._read, job_id, limiter=self._limiter)

    def _read(self, job_id: str) -> JobAnswer | None:
        result = self._app.AsyncResult(job_id)
        state = result.state  # a backend error propagates: it is no answer
        if state not in states.READY_STATES:
            return None
        try:
            value = result.maybe_throw()  # raises as AsyncResult.get() does
        except Exception as exc:
            if state == states.REVOKED:
                end = JobEnd.REVOKED
            elif isinstance(exc, WorkerLostError):
                end = JobEnd.LOST
            else:
                end = JobEnd.FAILED
            return JobAnswer(end, error=exc)
        return JobAnswer(JobEnd.SUCCEEDED, value=value)


__dir__ = _public_dir(__name__, __all__)
