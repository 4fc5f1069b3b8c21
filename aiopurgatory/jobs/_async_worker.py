"""The worker side the async job systems' integrations share (arq, saq).

Both systems run jobs on the worker's event loop and call hooks with a context
dict (``ctx``). The worker's publisher lives on that loop: a startup hook makes
its transport (from a Redis URL or the user's factory), enters it and keeps a
:class:`JobPublisher` in ``ctx[CONTEXT_KEY]``; a job-end hook reads what the
job system stored and publishes that end (:func:`publish_stored_end`); a
shutdown hook closes the transport, delivering what is pending. Each system's
module says when its hooks run and how its stored outcome reads as a
:class:`JobEnd`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .._logging import LazyLogger
from .._transport import Triggers
from ._layout import JobEnd
from ._publisher import JobPublisher

__all__ = [
    "CONTEXT_KEY",
    "Hook",
    "lifecycle_hooks",
    "progress",
    "publish_stored_end",
    "triggers_factory",
]

_log = LazyLogger()

#: Where the worker's context holds the :class:`JobPublisher`.
CONTEXT_KEY = "aiopurgatory_jobs"
# Where it holds the entered transport, for the shutdown hook to close.
_TRIGGERS_KEY = CONTEXT_KEY + "_triggers"

Hook = Callable[[dict[str, Any]], Awaitable[None]]


def triggers_factory(
    publisher: str | Callable[[], Triggers], channel: str | None
) -> Callable[[], Triggers]:
    """What makes each worker's transport: ``publisher`` itself, or one for its URL.

    Args:
        publisher: a Redis URL (a publish-only ``RedisTriggers`` on ``channel``)
            or a callable returning a ``Triggers`` not yet entered.
        channel: the Redis channel, for a URL (None: ``"aiopurgatory"``).

    Raises:
        TypeError: ``publisher`` is neither a string nor callable.
    """
    if isinstance(publisher, str):
        url = publisher

        def factory() -> Triggers:
            from ..redis import RedisTriggers  # lazy: redis-py only in the worker

            return RedisTriggers(None, url, channel=channel)

        return factory
    if callable(publisher):
        return publisher
    raise TypeError(f"publisher must be a Redis URL or a callable, got {type(publisher).__name__}")


def lifecycle_hooks(factory: Callable[[], Triggers], namespace: str) -> tuple[Hook, Hook]:
    """The worker's ``(startup, shutdown)`` hooks: enter the publisher, then close it.

    ``startup`` makes a transport with ``factory``, enters it on the worker's
    loop and keeps a :class:`JobPublisher` on ``namespace`` in
    ``ctx[CONTEXT_KEY]``; ``shutdown`` forgets it and closes the transport
    (pending triggers delivered). Their errors are the transport's.
    """

    async def startup(ctx: dict[str, Any]) -> None:
        triggers = factory()
        await triggers.__aenter__()
        ctx[CONTEXT_KEY] = JobPublisher(triggers, namespace=namespace)
        ctx[_TRIGGERS_KEY] = triggers

    async def shutdown(ctx: dict[str, Any]) -> None:
        triggers: Triggers | None = ctx.pop(_TRIGGERS_KEY, None)
        ctx.pop(CONTEXT_KEY, None)
        if triggers is not None:
            await triggers.aclose()

    return startup, shutdown


async def publish_stored_end(
    ctx: dict[str, Any], job_id: str, stored_end: Callable[[], Awaitable[JobEnd | None]]
) -> None:
    """Publish the end ``stored_end()`` reads from the job system for ``job_id``.

    Nothing is published when the worker has no publisher (its settings did not
    go through ``publish_jobs``), when the job system stored no end (None), or
    when reading it fails: that is logged (``aiopurgatory.jobs.end_unconfirmed``)
    and not raised, since the job has ended and the hook must not fail it; its
    waiters find the job system's answer at their timeout (their last look).
    """
    jobs = ctx.get(CONTEXT_KEY)
    if not isinstance(jobs, JobPublisher):
        return
    try:
        end = await stored_end()
    except Exception as exc:
        _log.warning(
            "aiopurgatory.jobs.end_unconfirmed",
            namespace=jobs.namespace,
            job_id=job_id,
            error=f"{type(exc).__name__}: {exc}",
        )
        return
    if end is not None:
        jobs.ended(job_id, end)


def progress(ctx: object, job_id: object, value: float) -> bool:
    """Publish ``value`` as the progress of the job ``job_id`` whose context is ``ctx``.

    Returns:
        As :meth:`JobPublisher.progress`: False (logged) if it could not be.

    Raises:
        RuntimeError: ``ctx`` holds no publisher, or ``job_id`` is not a string
            (not a job's context of a worker set up by ``publish_jobs``).
        TypeError, ValueError: ``value`` is not a progress (0 to below 2**52).
    """
    jobs = ctx.get(CONTEXT_KEY) if isinstance(ctx, dict) else None
    if not isinstance(jobs, JobPublisher) or not isinstance(job_id, str):
        raise RuntimeError(
            "report_progress(ctx, ...) is for a job of a worker set up by publish_jobs()"
        )
    return jobs.progress(job_id, value)
