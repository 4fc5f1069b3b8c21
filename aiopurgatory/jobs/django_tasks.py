"""django-tasks: await database-backend tasks through PostgresTriggers, woken by their end's commit.

Django's task framework (``django.tasks`` in Django 6, the ``django-tasks``
backport before it) ships no backend that runs tasks in a worker; the one that
does, and that stores its results where a web process can read them, is
``django-tasks-db``'s ``DatabaseBackend`` (``manage.py db_worker``, the task
rows in Django's own database). On PostgreSQL its ends are published as
Procrastinate's are (:mod:`aiopurgatory.jobs.procrastinate`): a trigger on its
table, ``django_tasks_database_dbtaskresult``, raises the task's watermark and
NOTIFYs in the transaction that writes ``SUCCESSFUL`` or ``FAILED``. Its commit
wakes the waiters; a rollback wakes nobody. No code runs in the worker.

Install the trigger with a migration of one of your apps::

    from django.db import migrations
    from aiopurgatory.jobs.django_tasks import schema_sql

    class Migration(migrations.Migration):
        dependencies = [("django_tasks_database", "0021_conditional_partial_index_ordering")]
        operations = [migrations.RunSQL(schema_sql())]

Web side (an ASGI process, on the same database)::

    async with PostgresTriggers(Purgatory("web"), dsn) as triggers:
        jobs = DjangoTasksJobs(triggers)
        result = await add.aenqueue(2, 3)
        value = await jobs.wait(result.id, timeout=30.0)   # 5, the stored return value

The answer is read from the backend (``aget_result``): the stored return value,
or :class:`~aiopurgatory.jobs.JobFailedError` (``end`` FAILED) whose ``detail``
is the traceback django-tasks stored (it keeps the exception's class path and
traceback, not the exception). Django's ``task_finished`` signal is sent after
the worker's save, and would be a sound hook too; the trigger is used because it
also catches every other writer of a status and needs nothing in the worker.
Needs the ``django-tasks`` extra.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

try:
    from django_tasks_db.compat import (
        TaskResultDoesNotExist,
        TaskResultStatus,
        task_backends,
    )
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ImportError(
        "aiopurgatory.jobs.django_tasks needs django-tasks-db: "
        "pip install 'aiopurgatory[django-tasks]'"
    ) from exc

from .._namespace import public_dir as _public_dir
from .._transport import Key, Triggers
from ..postgres._wire import DEFAULT_CHANNEL, DEFAULT_PARTITIONS
from ._layout import JobEnd
from ._pg_trigger import trigger_sql
from ._waiter import JobAnswer, JobFailedError, JobWaiter

__all__ = ["TABLE", "DjangoTasksJobs", "schema_sql"]

#: django-tasks-db's table (its app label ``django_tasks_database``, model ``DBTaskResult``).
TABLE: Final = "django_tasks_database_dbtaskresult"

_ENDS: Final = {
    str(TaskResultStatus.SUCCESSFUL.value): JobEnd.SUCCEEDED,
    str(TaskResultStatus.FAILED.value): JobEnd.FAILED,
}


def schema_sql(
    *,
    namespace: str = "django_tasks",
    channel: str = DEFAULT_CHANNEL,
    partitions: int = DEFAULT_PARTITIONS,
) -> str:
    """The SQL that makes django-tasks-db's task ends wake :class:`DjangoTasksJobs` waiters.

    Run it in a migration (``migrations.RunSQL(schema_sql())``) after
    django-tasks-db's own; again after changing an argument. Idempotent, and
    runs of it at once (each web process at start) wait for each other: it
    takes a transaction-level advisory lock of the channel first. It
    creates the channel's watermark table if missing, a function
    ``"<channel>_crc32"`` and a trigger ``"<channel>_django_tasks_ends"`` on
    :data:`TABLE`, fired when a task's status becomes ``SUCCESSFUL`` or
    ``FAILED``, in that transaction.

    Args:
        namespace: the tasks' key namespace (default ``"django_tasks"``), the waiters'.
        channel: the PostgresTriggers channel (default ``"aiopurgatory"``).
        partitions: the channel's partitions (default 64), the waiters' PostgresTriggers'.

    Raises:
        TypeError, ValueError: an argument PostgresTriggers would refuse; a
            namespace with ``$`` or NUL.
    """
    return trigger_sql(
        system="django_tasks",
        table=TABLE,
        id_column="id",
        status_column="status",
        ends=_ENDS,
        namespace=namespace,
        channel=channel,
        partitions=partitions,
    )


class DjangoTasksJobs(JobWaiter):
    """Awaits django-tasks-db tasks by result id and answers with the stored outcome.

    ``await jobs.wait(result.id, timeout=...)`` returns the task's stored
    return value, or raises :class:`~aiopurgatory.jobs.JobFailedError` (``end``
    FAILED, ``detail`` the stored traceback). The ``triggers`` must be a
    ``PostgresTriggers`` on the backend's database, with the channel and
    partitions given to :func:`schema_sql`. Django must be set up (settings,
    ``django.setup()``: an ASGI application is).

    Args:
        triggers: the process's entered transport (a ``PostgresTriggers``).
        backend: the alias of the ``DatabaseBackend`` in ``TASKS`` (default ``"default"``).
        namespace: the trigger's key namespace (default ``"django_tasks"``).

    Raises:
        TypeError: ``backend`` is not a str; as :class:`JobWaiter`.
    """

    system = "django_tasks"

    def __init__(
        self, triggers: Triggers, *, backend: str = "default", namespace: str | None = None
    ) -> None:
        if not isinstance(backend, str):
            raise TypeError(f"backend must be a str, got {type(backend).__name__}")
        super().__init__(triggers, namespace=namespace)
        self._backend = backend

    def key(self, job_id: str | uuid.UUID) -> Key:
        """The watermark key of the task result ``job_id`` (``job:<namespace>:<uuid>``)."""
        return super().key(_result_id(job_id))

    async def wait(
        self,
        job_id: str | uuid.UUID,
        *,
        timeout: float,  # noqa: ASYNC109
        progress: float | None = None,
    ) -> Any:
        """Wait for the task result ``job_id`` (``TaskResult.id``) to end.

        As :meth:`JobWaiter.wait`; the database backend publishes no progress,
        so a ``progress`` threshold is met only by the end.

        Raises:
            TypeError: ``job_id`` is neither a str nor a UUID.
            ValueError: ``job_id`` is not a UUID.
        """
        return await super().wait(_result_id(job_id), timeout=timeout, progress=progress)

    async def read(self, job_id: str) -> JobAnswer | None:
        """The backend's answer for task result ``job_id`` if it ended, else None.

        Raises:
            Exception: the database could not be read (Django's error).
        """
        try:
            result = await task_backends[self._backend].aget_result(job_id)
        except TaskResultDoesNotExist:
            return None  # pruned (prune_db_task_results) or never enqueued here
        end = _ENDS.get(str(result.status))
        if end is None:
            return None  # ready or running
        if end is JobEnd.SUCCEEDED:
            return JobAnswer(end, value=result.return_value)
        errors = result.errors
        detail = errors[-1].traceback if errors else ""
        return JobAnswer(end, error=JobFailedError(job_id, end, detail))


def _result_id(job_id: object) -> str:
    if isinstance(job_id, uuid.UUID):
        return str(job_id)
    if not isinstance(job_id, str):
        raise TypeError(f"job_id must be a str or uuid.UUID, got {type(job_id).__name__}")
    try:
        return str(uuid.UUID(job_id))  # the trigger's form: lower case, dashed
    except ValueError:
        raise ValueError(f"job_id must be a task result's UUID, got {job_id!r}") from None


__dir__ = _public_dir(__name__, __all__)
