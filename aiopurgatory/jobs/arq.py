"""arq: publish jobs' ends from the (async) worker, await them by job id from async code.

Worker side, in the module of the worker's settings (``arq module.WorkerSettings``),
one call, no code in the jobs::

    class Settings:
        functions = [...]
        redis_settings = RedisSettings.from_dsn("redis://localhost:6379/0")

    WorkerSettings = publish_jobs(Settings, "redis://localhost:6379/0")

Web side::

    jobs = ArqJobs(triggers, redis)  # redis: arq's pool (create_pool)
    result = await jobs.wait(job.job_id, timeout=30.0)

The worker publishes from arq's ``after_job_end`` hook, which arq runs after it
stored the job's result (``Worker.run_job``: ``finish_job``'s transaction, then
``after_job_end``; checked in arq 0.28). The hook reads that stored result
(``Job(job_id, redis).result_info()``, one GET; a read that fails publishes
nothing and is logged, ``aiopurgatory.jobs.end_unconfirmed``): a success is SUCCEEDED, a
stored ``CancelledError`` (``Job.abort`` of a running job) REVOKED, any other
failure FAILED. An attempt arq will run again (``Retry``, a cancelled job with
``retry_jobs``) stores nothing and publishes nothing. arq ends some jobs
without running its hooks (aborted before they started, over ``max_tries``,
their function unknown, expired): no end is published for those, and a waiter
reads arq's stored outcome when its timeout comes. The worker is async: it
publishes through a publish-only :class:`~aiopurgatory.redis.RedisTriggers` on
its own loop, entered in arq's ``on_startup`` and closed (pending triggers
delivered) in its ``on_shutdown``.

Tracing: arq runs ``on_job_start``, the job, ``on_job_end``, stores the result,
then ``after_job_end``, all in one task. A tracing hook that makes its span
current in ``on_job_start`` usually ends it in ``on_job_end``, before the end is
published: an ``on_job_start`` hook chained after the user's keeps the context
the job runs in, and ``after_job_end`` publishes in it, so the wait the end
completes links to the job's span (:func:`aiopurgatory.tracing.trace_waits`).

arq 0.28 pins redis-py below 6: the ``arq`` extra installs
:mod:`aiopurgatory.redis` with it (one server and Sentinel run on redis-py 5.3
and later; a Redis Cluster needs redis-py 8). Needs the ``arq`` extra.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

try:
    from arq.connections import ArqRedis
    from arq.jobs import Deserializer, Job, JobResult
except ImportError as exc:  # pragma: no cover - the extra is part of the arq venv's install
    raise ImportError("aiopurgatory.jobs.arq needs arq: pip install 'aiopurgatory[arq]'") from exc

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

__all__ = ["CONTEXT_KEY", "ArqJobs", "publish_jobs", "report_progress"]

_Hook = Callable[[dict[str, Any]], Awaitable[Any]]

# The job's OpenTelemetry context in arq's job ctx, from on_job_start to after_job_end.
_OTEL_KEY = "aiopurgatory.jobs.otel_context"


def _end_of(result: JobResult) -> JobEnd:
    """How a job whose result arq stored ended: SUCCEEDED, REVOKED (aborted) or FAILED."""
    if result.success:
        return JobEnd.SUCCEEDED
    if isinstance(result.result, asyncio.CancelledError):
        return JobEnd.REVOKED
    return JobEnd.FAILED


def _chain(first: _Hook | None, second: _Hook | None) -> _Hook | None:
    if first is None or second is None:
        return first or second

    async def both(ctx: dict[str, Any]) -> None:
        await first(ctx)
        await second(ctx)

    return both


def publish_jobs(
    settings: Any,
    publisher: str | Callable[[], Triggers],
    *,
    namespace: str = "arq",
    channel: str | None = None,
) -> Any:
    """Have the workers of ``settings`` publish every job's end for :class:`ArqJobs`.

    Chains an ``on_startup`` hook (before the user's: entering the worker's
    publisher), an ``on_job_start`` hook (after the user's: keeping the
    context the job runs in, a tracing hook's span), an ``after_job_end`` hook
    (after the user's: publishing the job's end in that context) and an
    ``on_shutdown`` hook (after the user's: closing the
    publisher, delivering what is pending) into arq's worker settings; the
    hooks already there still run.

    Args:
        settings: arq's worker settings, a class (``WorkerSettings``) or a dict.
            Only its own attributes are taken, as arq takes them.
        publisher: a Redis URL (a publish-only ``RedisTriggers`` is made from
            it in each worker), or a callable returning a ``Triggers`` (not yet
            entered: the worker enters and closes it on its loop).
        namespace: the jobs' key namespace (default ``"arq"``), the waiters'.
        channel: the Redis channel, for a URL (default ``"aiopurgatory"``).

    Returns:
        New settings of the same kind (``settings`` is not changed).

    Raises:
        TypeError: ``settings`` is neither a class nor a dict; ``publisher`` is
            unusable.
        ValueError: ``namespace`` is empty.
    """
    if isinstance(settings, dict):
        given = dict(settings)
    elif isinstance(settings, type):
        given = {k: v for k, v in vars(settings).items() if not k.startswith("__")}
    else:
        raise TypeError(f"settings must be a class or a dict, got {type(settings).__name__}")
    factory = triggers_factory(publisher, channel)
    namespace = check_namespace(namespace)
    deserializer: Deserializer | None = given.get("job_deserializer")
    startup, shutdown = lifecycle_hooks(factory, namespace)

    async def on_job_start(ctx: dict[str, Any]) -> None:
        # After the user's on_job_start: the context the job runs in, with the
        # span a tracing hook made current (ended in on_job_end, before ours).
        ctx[_OTEL_KEY] = current_context()

    async def after_job_end(ctx: dict[str, Any]) -> None:
        saved = ctx.pop(_OTEL_KEY, None)
        job_id = ctx.get("job_id")
        if not isinstance(job_id, str):
            return

        async def stored_end() -> JobEnd | None:
            # What arq stored a moment ago (finish_job ran): none for an attempt
            # it runs again, or a job whose function keeps no result (keep_result=0).
            result = await Job(job_id, ctx["redis"], _deserializer=deserializer).result_info()
            return None if result is None else _end_of(result)

        with within(saved):
            await publish_stored_end(ctx, job_id, stored_end)

    hooks = {
        "on_startup": _chain(startup, given.get("on_startup")),
        "on_job_start": _chain(given.get("on_job_start"), on_job_start),
        "after_job_end": _chain(given.get("after_job_end"), after_job_end),
        "on_shutdown": _chain(given.get("on_shutdown"), shutdown),
    }
    if isinstance(settings, dict):
        return {**given, **hooks}
    return type(settings.__name__, (), {**given, **hooks, "__module__": settings.__module__})


def report_progress(ctx: dict[str, Any], value: float) -> bool:
    """Publish the progress (from 0 to below 2**52) of the job whose context is ``ctx``.

    Call it in a job function with the ``ctx`` arq passes it.

    Returns:
        True if published (or kept for delivery); False if it could not be
        (logged): reporting progress never fails the job.

    Raises:
        RuntimeError: ``ctx`` is not a job's context of a worker whose settings
            went through :func:`publish_jobs`.
        TypeError, ValueError: ``value`` is not such a number.
    """
    return progress(ctx, ctx.get("job_id") if isinstance(ctx, dict) else None, value)


class ArqJobs(JobWaiter):
    """Awaits arq jobs by id and answers with arq's own result.

    ``await jobs.wait(job_id, timeout=...)`` returns the job's result, or raises
    the exception the job raised (as arq's ``Job.result()`` does). A job aborted
    while it ran (arq stores a ``CancelledError``) raises
    :class:`JobFailedError` with ``end`` REVOKED instead: a ``CancelledError``
    raised out of ``wait`` would read as the waiting task being cancelled. arq
    is read with ``Job(job_id, redis).result_info()``, on the loop (arq's
    client is asyncio's).

    Args:
        triggers: the process's entered transport (``RedisTriggers``...).
        redis: arq's pool (``await arq.create_pool(...)``), or a
            ``redis.asyncio.Redis`` on arq's Redis.
        namespace: the workers' key namespace (default ``"arq"``).
        deserializer: the workers' ``job_deserializer`` (default: arq's, pickle).

    Raises:
        TypeError: ``redis`` is not a ``redis.asyncio.Redis``; ``deserializer``
            not callable; as :class:`JobWaiter`.
    """

    system = "arq"

    def __init__(
        self,
        triggers: Triggers,
        redis: ArqRedis,
        *,
        namespace: str | None = None,
        deserializer: Deserializer | None = None,
    ) -> None:
        from redis.asyncio import Redis

        if not isinstance(redis, Redis):
            raise TypeError(
                f"redis must be arq's pool (a redis.asyncio.Redis), got {type(redis).__name__}"
            )
        if deserializer is not None and not callable(deserializer):
            raise TypeError(f"deserializer must be callable, got {type(deserializer).__name__}")
        super().__init__(triggers, namespace=namespace)
        self._redis = redis
        self._deserializer = deserializer

    async def read(self, job_id: str) -> JobAnswer | None:
        """arq's answer for the job ``job_id`` if it ended, else None.

        Raises:
            Exception: arq's result could not be read (its client's error, or
                arq's ``SerializationError``).
        """
        result = await Job(job_id, self._redis, _deserializer=self._deserializer).result_info()
        if result is None:
            return None  # running, queued, expired (keep_result) or never kept
        end = _end_of(result)
        if end is JobEnd.SUCCEEDED:
            return JobAnswer(end, value=result.result)
        if end is JobEnd.REVOKED:
            detail = "aborted (arq stored asyncio.CancelledError)"
            return JobAnswer(end, error=JobFailedError(job_id, end, detail))
        error = result.result
        if not isinstance(error, BaseException):  # arq's own case: not an exception
            error = JobFailedError(job_id, end, repr(error))
        return JobAnswer(end, error=error)


__dir__ = _public_dir(__name__, __all__)
