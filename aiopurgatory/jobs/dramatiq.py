"""Dramatiq: publish messages' ends from the worker, await them from async code.

Worker side, where the broker is set up (every worker process imports it), once
Dramatiq's ``Results`` middleware is added, no code in the actors::

    broker.add_middleware(Results(backend=RedisBackend(url=url)))
    aiopurgatory.jobs.dramatiq.publish_jobs(broker, url)

Web side::

    jobs = DramatiqJobs(triggers, backend)
    message = await anyio.to_thread.run_sync(render.send, 3)   # send() blocks
    result = await jobs.wait_message(message, timeout=30.0)

Dramatiq stores results by message, not by id alone (its result key is made of
the queue, the actor and the message id): a wait takes the ``Message`` (the one
``send()`` returned, or ``dramatiq.Message(queue_name=..., actor_name=...,
message_id=..., args=(), kwargs={}, options={})`` rebuilt in another request).

:class:`PublishJobs` is a middleware placed just *before* ``Results`` in the
broker's list: Dramatiq runs the ``after_*`` hooks in reverse order
(``Broker.emit_after``), so each of ours runs after ``Results`` stored what the
hook is about (checked in Dramatiq 1.17-2.2's ``broker.py`` and
``results/middleware.py``): ``after_process_message`` without an
exception: SUCCEEDED; ``after_nack`` of a message that failed for good (its
retries spent, ``Retries`` re-enqueues the same message id meanwhile): FAILED;
``after_skip_message`` (skipped, not failed): REVOKED. Needs the ``dramatiq``
extra.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

try:
    import dramatiq
    from dramatiq.results import ResultBackend, ResultFailure, ResultMissing, Results
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ImportError(
        "aiopurgatory.jobs.dramatiq needs Dramatiq: pip install 'aiopurgatory[dramatiq]'"
    ) from exc

import anyio.to_thread

from .._namespace import public_dir as _public_dir
from .._transport import Triggers
from ._layout import JobEnd
from ._publisher import Advancer, JobPublisher, current_context, within
from ._waiter import JobAnswer, JobWaiter

__all__ = ["DramatiqJobs", "PublishJobs", "publish_jobs", "report_progress"]

# The message each worker thread is processing, for report_progress.
_running = threading.local()


class PublishJobs(dramatiq.Middleware):
    """Dramatiq middleware publishing every message's end after ``Results`` stored it.

    Add it with :func:`publish_jobs` (which places it where its hooks run after
    ``Results``').

    Args:
        publisher: a Redis URL (a ``SyncPublisher`` is made from it in each
            worker process, on first use), a callable returning a publisher, or
            a publisher to use as it is.
        namespace: the messages' key namespace (default ``"dramatiq"``).
        channel: the Redis channel, for a URL (default ``"aiopurgatory"``).
    """

    def __init__(
        self,
        publisher: str | Callable[[], Advancer] | Advancer,
        *,
        namespace: str = "dramatiq",
        channel: str | None = None,
    ) -> None:
        self.jobs = JobPublisher(publisher, namespace=namespace, channel=channel)
        # The OpenTelemetry context a message raised in, by message id, until its
        # ack or nack: a failure is published from after_nack, which Dramatiq
        # runs once the message was processed, after a tracing middleware's
        # after_process_message ended the message's span. Popped by either hook
        # (a retried message is acked), so nothing stays.
        self._failed_in: dict[str, Any] = {}

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        _running.message = message
        _running.jobs = self.jobs

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: Any,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        _running.message = None
        if exception is None:
            self.jobs.ended(message.message_id, JobEnd.SUCCEEDED)
        else:
            saved = current_context()
            if saved is not None:
                self._failed_in[message.message_id] = saved

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        _running.message = None
        if not message.failed:
            self.jobs.ended(message.message_id, JobEnd.REVOKED)

    def after_nack(self, broker: dramatiq.Broker, message: Any) -> None:
        saved = self._failed_in.pop(message.message_id, None)
        if message.failed:
            with within(saved):
                self.jobs.ended(message.message_id, JobEnd.FAILED)

    def after_ack(self, broker: dramatiq.Broker, message: Any) -> None:
        self._failed_in.pop(message.message_id, None)

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: Any) -> None:
        self.jobs.flush(5.0)
        self.jobs.close()


def publish_jobs(
    broker: dramatiq.Broker,
    publisher: str | Callable[[], Advancer] | Advancer,
    *,
    namespace: str = "dramatiq",
    channel: str | None = None,
) -> PublishJobs:
    """Add a :class:`PublishJobs` middleware to ``broker``, its hooks after ``Results``'.

    It goes just before ``Results`` in the broker's middleware list: Dramatiq
    runs ``after_*`` hooks in reverse order, so ``Results`` stores a result or
    a failure before this middleware publishes the end.

    Returns:
        The middleware added.

    Raises:
        TypeError: ``broker`` is not a Dramatiq broker; ``publisher`` is unusable.
        ValueError: ``broker`` has no ``Results`` middleware (Dramatiq stores no
            result without it), or publishes already.
    """
    if not isinstance(broker, dramatiq.Broker):
        raise TypeError(f"broker must be a dramatiq.Broker, got {type(broker).__name__}")
    if not any(isinstance(m, Results) for m in broker.middleware):
        raise ValueError(
            "broker has no Results middleware: add dramatiq.results.Results first "
            "(Dramatiq stores no result without it)"
        )
    if any(isinstance(m, PublishJobs) for m in broker.middleware):
        raise ValueError("broker: publish_jobs() was called for this broker already")
    middleware = PublishJobs(publisher, namespace=namespace, channel=channel)
    # Before, in the list: the after_* hooks run in reverse (Broker.emit_after).
    broker.add_middleware(middleware, before=Results)
    return middleware


def report_progress(value: float) -> bool:
    """Publish the running message's progress (from 0 to below 2**52): call it in an actor.

    Returns:
        True if published (or kept for delivery); False if it could not be
        (logged): reporting progress never fails the message.

    Raises:
        RuntimeError: not in an actor of a broker set up by :func:`publish_jobs`.
        TypeError, ValueError: ``value`` is not such a number.
    """
    message = getattr(_running, "message", None)
    jobs: JobPublisher | None = getattr(_running, "jobs", None)
    if message is None or jobs is None:
        raise RuntimeError("report_progress() is for an actor of a broker given to publish_jobs()")
    return jobs.progress(message.message_id, value)


class DramatiqJobs(JobWaiter):
    """Awaits Dramatiq messages and answers with Dramatiq's own result.

    ``await jobs.wait_message(message, timeout=...)`` returns what
    ``backend.get_result(message)`` would, or raises Dramatiq's
    ``ResultFailure`` for a message that failed. The backend is read in a
    worker thread, never on the loop. ``wait(message_id)`` works for a message
    that a ``wait_message`` of this instance is waiting for; alone, it raises
    TypeError (Dramatiq's result key needs the message's queue and actor).

    Args:
        triggers: the process's entered transport (``RedisTriggers``...).
        backend: the ``Results`` middleware's backend (``RedisBackend``...).
        namespace: the workers' key namespace (default ``"dramatiq"``).
        limiter: caps the threads reading results at once (default anyio's 40).

    Raises:
        TypeError: ``backend`` is not a Dramatiq result backend; as :class:`JobWaiter`.
    """

    system = "dramatiq"

    def __init__(
        self,
        triggers: Triggers,
        backend: ResultBackend,
        *,
        namespace: str | None = None,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> None:
        if not isinstance(backend, ResultBackend):
            raise TypeError(
                f"backend must be a dramatiq ResultBackend, got {type(backend).__name__}"
            )
        super().__init__(triggers, namespace=namespace)
        self._backend = backend
        self._limiter = limiter
        self._messages: dict[str, Any] = {}
        self._waits: Counter[str] = Counter()

    async def wait_message(
        self,
        message: dramatiq.Message[Any],
        *,
        timeout: float,  # noqa: ASYNC109 - the operation's own expiry (see JobWaiter.wait)
        progress: float | None = None,
    ) -> Any:
        """Wait for ``message`` to end (or reach ``progress``); as :meth:`JobWaiter.wait`.

        Raises:
            TypeError: ``message`` is not a ``dramatiq.Message``; and whatever
                :meth:`JobWaiter.wait` raises (Dramatiq's ``ResultFailure``).
        """
        if not isinstance(message, dramatiq.Message):
            raise TypeError(f"message must be a dramatiq.Message, got {type(message).__name__}")
        job_id = message.message_id
        self._messages[job_id] = message
        self._waits[job_id] += 1
        try:
            return await super().wait(job_id, timeout=timeout, progress=progress)
        finally:
            self._waits[job_id] -= 1
            if not self._waits[job_id]:
                del self._waits[job_id], self._messages[job_id]

    async def wait(
        self,
        job_id: str,
        *,
        timeout: float,  # noqa: ASYNC109 - the operation's own expiry (see JobWaiter.wait)
        progress: float | None = None,
    ) -> Any:
        """:meth:`wait_message` for a message this instance waits for already (by its id).

        Raises:
            TypeError: no :meth:`wait_message` of this instance waits for it.
        """
        if job_id not in self._messages:
            raise TypeError(
                "Dramatiq's results are keyed by the message (queue, actor and id): "
                "await wait_message(message) instead"
            )
        return await super().wait(job_id, timeout=timeout, progress=progress)

    async def read(self, job_id: str) -> JobAnswer | None:
        """Dramatiq's answer for message ``job_id`` if stored (read in a thread), else None.

        Raises:
            TypeError: no :meth:`wait_message` of this instance knows the message.
            Exception: the backend could not be read (its client's error).
        """
        message = self._messages.get(job_id)
        if message is None:
            raise TypeError(f"no wait_message() of this instance knows message {job_id!r}")
        return await anyio.to_thread.run_sync(self._read, message, limiter=self._limiter)

    def _read(self, message: Any) -> JobAnswer | None:
        try:
            value = self._backend.get_result(message, block=False)
        except ResultMissing:
            return None  # not ended, not stored (store_results off), or expired
        except ResultFailure as exc:
            return JobAnswer(JobEnd.FAILED, error=exc)
        return JobAnswer(JobEnd.SUCCEEDED, value=value)


__dir__ = _public_dir(__name__, __all__)
