"""saq: publish jobs' ends from the (async) worker, await them by key from async code.

Worker side, in the module of the worker's settings (``saq module.settings``),
one call, no code in the jobs::

    settings = publish_jobs({"queue": queue, "functions": [...]}, "redis://localhost:6379/0")

Web side::

    jobs = SaqJobs(triggers, queue)
    result = await jobs.wait(job.key, timeout=30.0)

The worker publishes from saq's ``after_process`` hook, which saq runs after it
wrote the job's status (``Worker.process``: ``job.finish`` or ``job.retry``,
then ``after_process`` in its ``finally``; checked in saq 0.22-0.26), and
publishes what saq stored (read back, one round trip: saq catches its own
failure to write, e.g. while Redis is away, and runs the hook anyway): COMPLETE
is SUCCEEDED, FAILED is FAILED, ABORTED (``queue.abort`` of a running job) is
REVOKED; a job saq retries publishes nothing until its last attempt. The worker
is async: it publishes through a publish-only
:class:`~aiopurgatory.redis.RedisTriggers` on its own loop (never blocking it),
entered in saq's ``startup`` and closed (pending triggers delivered) in its
``shutdown``. Needs the ``saq`` extra.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    from saq import Queue
    from saq.job import Status
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ImportError("aiopurgatory.jobs.saq needs saq: pip install 'aiopurgatory[saq]'") from exc

from .._namespace import public_dir as _public_dir
from .._transport import Triggers
from ._async_worker import (
    CONTEXT_KEY,
    lifecycle_hooks,
    progress,
    publish_stored_end,
    triggers_factory,
)
from ._layout import JobEnd, check_namespace
from ._publisher import current_context, within
from ._waiter import JobAnswer, JobFailedError, JobWaiter

__all__ = ["CONTEXT_KEY", "SaqJobs", "publish_jobs", "report_progress"]

# The job's OpenTelemetry context in saq's ctx, from before_process to after_process.
_OTEL_KEY = "aiopurgatory.jobs.otel_context"

_ENDS = {
    Status.COMPLETE: JobEnd.SUCCEEDED,
    Status.FAILED: JobEnd.FAILED,
    Status.ABORTED: JobEnd.REVOKED,
}


def _hooks(settings: dict[str, Any], name: str) -> list[Any]:
    hooks = settings.get(name)
    if hooks is None:
        return []
    return list(hooks) if isinstance(hooks, list | tuple) else [hooks]


def publish_jobs(
    settings: dict[str, Any],
    publisher: str | Callable[[], Triggers],
    *,
    namespace: str = "saq",
    channel: str | None = None,
) -> dict[str, Any]:
    """Have the workers of ``settings`` publish every job's end for :class:`SaqJobs`.

    Adds a ``startup`` hook (entering the worker's publisher), a
    ``before_process`` hook (after the user's: noting the OpenTelemetry context
    the job runs in), an ``after_process`` hook (after the user's: publishing
    the job's end, in that context, so that it carries the span a tracing
    ``before_process`` hook started) and a ``shutdown`` hook (closing the
    publisher, delivering what is pending) to saq's worker settings; the hooks
    already there are kept.

    Args:
        settings: saq's worker settings (``queue``, ``functions``...).
        publisher: a Redis URL (a publish-only ``RedisTriggers`` is made from
            it in each worker), or a callable returning a ``Triggers`` (not yet
            entered: the worker enters and closes it on its loop).
        namespace: the jobs' key namespace (default ``"saq"``), the waiters'.
        channel: the Redis channel, for a URL (default ``"aiopurgatory"``).

    Returns:
        A new settings dict (``settings`` is not changed).

    Raises:
        TypeError: ``settings`` is not a dict; ``publisher`` is unusable.
    """
    if not isinstance(settings, dict):
        raise TypeError(f"settings must be a dict, got {type(settings).__name__}")
    factory = triggers_factory(publisher, channel)
    namespace = check_namespace(namespace)
    startup, shutdown = lifecycle_hooks(factory, namespace)

    async def before_process(ctx: dict[str, Any]) -> None:
        # The last before_process hook: the context the job is processed in,
        # a tracing hook's span current. The end is published in it, since the
        # hook ending that span (an after_process given here) runs before ours.
        ctx[_OTEL_KEY] = current_context()

    async def after_process(ctx: dict[str, Any]) -> None:
        saved = ctx.pop(_OTEL_KEY, None)
        job = ctx.get("job")
        if job is None or job.status not in _ENDS:
            return

        async def stored_end() -> JobEnd | None:
            # The status in hand is what saq meant to write; saq's own failure
            # to write it (Redis away) is caught inside saq and not ours to see.
            # Read what it stored: an end is published only for an end saq has.
            stored = await job.get_queue().job(job.key)
            return None if stored is None else _ENDS.get(stored.status)

        with within(saved):
            await publish_stored_end(ctx, job.key, stored_end)

    return {
        **settings,
        "startup": [startup, *_hooks(settings, "startup")],
        "before_process": [*_hooks(settings, "before_process"), before_process],
        "after_process": [*_hooks(settings, "after_process"), after_process],
        "shutdown": [*_hooks(settings, "shutdown"), shutdown],
    }


def report_progress(ctx: dict[str, Any], value: float) -> bool:
    """Publish the progress (from 0 to below 2**52) of the job whose context is ``ctx``.

    Call it in a job function with the ``ctx`` saq passes it.

    Returns:
        True if published (or kept for delivery); False if it could not be
        (logged): reporting progress never fails the job.

    Raises:
        RuntimeError: ``ctx`` is not a job's context of a worker whose settings
            went through :func:`publish_jobs`.
        TypeError, ValueError: ``value`` is not such a number.
    """
    job = ctx.get("job") if isinstance(ctx, dict) else None
    return progress(ctx, getattr(job, "key", None), value)


class SaqJobs(JobWaiter):
    """Awaits saq jobs by key and answers with saq's own result.

    ``await jobs.wait(job.key, timeout=...)`` returns the job's ``result``, or
    raises :class:`JobFailedError` (saq stores a failure as text: its
    ``detail`` is saq's ``job.error``, a traceback) with ``end`` FAILED or
    REVOKED (aborted). saq is read with ``await queue.job(key)``, on the loop
    (saq's client is asyncio's).

    Args:
        triggers: the process's entered transport (``RedisTriggers``...).
        queue: the saq ``Queue`` (connected).
        namespace: the workers' key namespace (default ``"saq"``).

    Raises:
        TypeError: ``queue`` is not a saq Queue; as :class:`JobWaiter`.
    """

    system = "saq"

    def __init__(self, triggers: Triggers, queue: Queue, *, namespace: str | None = None) -> None:
        if not isinstance(queue, Queue):
            raise TypeError(f"queue must be a saq.Queue, got {type(queue).__name__}")
        super().__init__(triggers, namespace=namespace)
        self._queue = queue

    async def read(self, job_id: str) -> JobAnswer | None:
        """saq's answer for the job of key ``job_id`` if it ended, else None.

        Raises:
            Exception: saq's store could not be read (its client's error).
        """
        job = await self._queue.job(job_id)
        end = None if job is None else _ENDS.get(job.status)
        if job is None or end is None:
            return None  # not ended, or expired (the job's ttl) with its result
        if end is JobEnd.SUCCEEDED:
            return JobAnswer(end, value=job.result)
        return JobAnswer(end, error=JobFailedError(job_id, end, job.error or ""))


__dir__ = _public_dir(__name__, __all__)
