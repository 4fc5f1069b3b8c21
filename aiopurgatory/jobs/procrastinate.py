"""Procrastinate: await its jobs through PostgresTriggers, woken by the commit of their end.

Procrastinate keeps its jobs in PostgreSQL, so the wake-up needs no Redis and
no worker-side code: a trigger on Procrastinate's own table,
``procrastinate_jobs``, raises the job's watermark and NOTIFYs its partition
channel (as :meth:`aiopurgatory.postgres.PostgresTriggers.advance_in` does)
inside the transaction that writes the job's final status. That transaction's
commit is what wakes the waiters: a status change that rolls back wakes nobody,
and a waiter never hears of an end Procrastinate has not stored. Install it
once (a migration, or :func:`install`)::

    await install(app)                      # or run schema_sql() in a migration

Web side, on the same database::

    async with PostgresTriggers(Purgatory("web"), dsn) as triggers:
        jobs = ProcrastinateJobs(triggers, app)   # app opened (app.open_async())
        job_id = await app.configure_task("add").defer_async(a=1, b=2)
        job = await jobs.wait(job_id, timeout=30.0)   # procrastinate's Job, succeeded

Why a database trigger and not a middleware: Procrastinate's task and worker
middleware run in the worker *before* it stores the final status
(``Worker._process_job`` calls the task through them, then, in its
``finally``, ``_persist_job_status``: ``finish_job`` or ``retry_job``, in
another transaction; checked in procrastinate 3.10). A wake-up sent from a
middleware could reach a waiter that then reads ``doing`` (or a status that a
failed write never stores), and no hook runs after the write. The trigger fires for every
path that ends a job (a worker, ``cancel_job_by_id``, the shell, the Django
admin, a manual ``procrastinate_finish_job``), in the writing transaction.

What a waiter gets is read from Procrastinate (``job_manager.list_jobs_async``):
Procrastinate stores no result and no exception, only a status, so a job that
SUCCEEDED answers with Procrastinate's :class:`procrastinate.jobs.Job` (its
``status``, ``attempts``, ``task_kwargs``...); a FAILED one raises
:class:`~aiopurgatory.jobs.JobFailedError` (``end`` FAILED), a CANCELLED or
ABORTED one the same with ``end`` REVOKED. A job Procrastinate retries publishes
nothing until its last attempt ends (a retry sets ``todo``, not an end). A
worker run with ``delete_jobs`` other than ``never`` deletes ended jobs instead
of writing their status: their waits end with their timeout
(:class:`~aiopurgatory.jobs.JobTimeoutError`), as nothing is left to answer
from. Needs the ``procrastinate`` extra.
"""

from __future__ import annotations

from typing import Any, Final, cast

try:
    from procrastinate import App
    from procrastinate.jobs import Status
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ImportError(
        "aiopurgatory.jobs.procrastinate needs procrastinate: "
        "pip install 'aiopurgatory[procrastinate]'"
    ) from exc

from .._namespace import public_dir as _public_dir
from .._transport import Key, Triggers
from ..postgres._wire import DEFAULT_CHANNEL, DEFAULT_PARTITIONS
from ._layout import JobEnd
from ._pg_trigger import trigger_sql
from ._waiter import JobAnswer, JobFailedError, JobWaiter

__all__ = ["ProcrastinateJobs", "install", "schema_sql"]

_ENDS: Final = {
    Status.SUCCEEDED.value: JobEnd.SUCCEEDED,
    Status.FAILED.value: JobEnd.FAILED,
    Status.CANCELLED.value: JobEnd.REVOKED,
    Status.ABORTED.value: JobEnd.REVOKED,
}


def schema_sql(
    *,
    namespace: str = "procrastinate",
    channel: str = DEFAULT_CHANNEL,
    partitions: int = DEFAULT_PARTITIONS,
) -> str:
    """The SQL that makes Procrastinate's job ends wake :class:`ProcrastinateJobs` waiters.

    Run it (once, after Procrastinate's own schema; again after changing an
    argument) in a migration, or through :func:`install`. Idempotent. It
    creates the channel's watermark table if missing
    (:func:`aiopurgatory.postgres.schema_sql`), a function ``"<channel>_crc32"``
    (the partition of a key, as every process computes it: PostgreSQL 15 has
    no CRC-32 of its own) and a trigger ``"<channel>_procrastinate_ends"`` on
    ``procrastinate_jobs``, fired when a job's status becomes ``succeeded``,
    ``failed``, ``cancelled`` or ``aborted``, in that transaction.

    Args:
        namespace: the jobs' key namespace (default ``"procrastinate"``), the waiters'.
        channel: the PostgresTriggers channel (default ``"aiopurgatory"``).
        partitions: the channel's partitions (default 64), the waiters' PostgresTriggers'.

    Returns:
        The SQL, several statements (no ``%`` in it: it goes through drivers
        that format parameters as well).

    Raises:
        TypeError, ValueError: an argument PostgresTriggers would refuse; a
            namespace with ``$`` or NUL.
    """
    return trigger_sql(
        system="procrastinate",
        table="procrastinate_jobs",
        id_column="id",
        status_column="status",
        ends=_ENDS,
        namespace=namespace,
        channel=channel,
        partitions=partitions,
    )


async def install(
    app: App,
    *,
    namespace: str = "procrastinate",
    channel: str = DEFAULT_CHANNEL,
    partitions: int = DEFAULT_PARTITIONS,
) -> None:
    """Run :func:`schema_sql` through ``app``'s connector (open), in one transaction.

    Idempotent; installs running at once (each web process at start) wait for
    each other (the SQL's transaction-level advisory lock of the channel).

    Procrastinate's schema must be applied first (``procrastinate schema
    --apply`` or its migrations): the trigger is on its table.

    Raises:
        TypeError: ``app`` is not a procrastinate ``App``; as :func:`schema_sql`.
        ValueError: as :func:`schema_sql`.
        Exception: the connector's error (the role may not create functions or
            triggers there: run the SQL in a migration as its owner).
    """
    if not isinstance(app, App):
        raise TypeError(f"app must be a procrastinate.App, got {type(app).__name__}")
    sql = schema_sql(namespace=namespace, channel=channel, partitions=partitions)
    # Several statements in one simple query: one implicit transaction.
    await app.connector.execute_query_async(cast("Any", sql))


class ProcrastinateJobs(JobWaiter):
    """Awaits Procrastinate jobs by id and answers with what Procrastinate stored.

    ``await jobs.wait(job_id, timeout=...)`` returns the job as Procrastinate
    stored it (a :class:`procrastinate.jobs.Job`, status ``succeeded``), or
    raises :class:`~aiopurgatory.jobs.JobFailedError` with ``end`` FAILED
    (``failed``) or REVOKED (``cancelled``, ``aborted``); Procrastinate keeps no
    result and no exception. The ``triggers`` must be a ``PostgresTriggers`` on
    Procrastinate's database, with the channel and partitions given to
    :func:`schema_sql`.

    Args:
        triggers: the process's entered transport (a ``PostgresTriggers``).
        app: the procrastinate ``App`` (opened: ``await app.open_async()``).
        namespace: the trigger's key namespace (default ``"procrastinate"``).

    Raises:
        TypeError: ``app`` is not a procrastinate App; as :class:`JobWaiter`.
    """

    system = "procrastinate"

    def __init__(self, triggers: Triggers, app: App, *, namespace: str | None = None) -> None:
        if not isinstance(app, App):
            raise TypeError(f"app must be a procrastinate.App, got {type(app).__name__}")
        super().__init__(triggers, namespace=namespace)
        self._app = app

    def key(self, job_id: int | str) -> Key:
        """The watermark key of ``job_id`` (``job:<namespace>:<id>``)."""
        return super().key(_job_id(job_id))

    async def wait(
        self,
        job_id: int | str,
        *,
        timeout: float,  # noqa: ASYNC109
        progress: float | None = None,
    ) -> Any:
        """Wait for the job ``job_id`` (Procrastinate's int id, or its digits) to end.

        As :meth:`JobWaiter.wait`; Procrastinate jobs publish no progress, so
        a ``progress`` threshold is met only by the end.

        Raises:
            TypeError: ``job_id`` is neither an int nor a str (bool refused).
            ValueError: ``job_id`` is not a job id (negative, not digits).
        """
        return await super().wait(_job_id(job_id), timeout=timeout, progress=progress)

    async def read(self, job_id: str) -> JobAnswer | None:
        """Procrastinate's answer for job ``job_id`` if it ended, else None.

        Raises:
            Exception: Procrastinate's store could not be read (its connector's error).
        """
        found = list(await self._app.job_manager.list_jobs_async(id=int(job_id)))
        job = found[0] if found else None
        end = None if job is None else _ENDS.get(str(job.status))
        if job is None or end is None:
            return None  # running, waiting, retried by hand, or deleted
        if end is JobEnd.SUCCEEDED:
            return JobAnswer(end, value=job)
        detail = f"procrastinate status {job.status}, after {job.attempts} attempt(s)"
        return JobAnswer(end, error=JobFailedError(job_id, end, detail))


def _job_id(job_id: object) -> str:
    if isinstance(job_id, bool) or not isinstance(job_id, int | str):
        raise TypeError(f"job_id must be an int or str, got {type(job_id).__name__}")
    text = str(job_id)
    if not text.isdigit() or not text.isascii():
        raise ValueError(f"job_id must be a Procrastinate job id (digits), got {job_id!r}")
    return text


__dir__ = _public_dir(__name__, __all__)
