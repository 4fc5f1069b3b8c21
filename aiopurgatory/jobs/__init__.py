"""Await the background jobs of Celery, RQ, Dramatiq, saq, arq, Procrastinate, django-tasks.

Two halves, one module per job system (each needs its extra:
``pip install 'aiopurgatory[celery]'``...):

* **the worker side**, opt-in, no code in the task: the integration publishes a
  job's end (succeeded, failed, revoked, lost) after the job system has stored
  it, through a :class:`JobPublisher` (a ``SyncPublisher`` in sync workers, a
  ``Triggers`` in async ones); a task may also report its progress;
* **the web side**: a :class:`JobWaiter` per system awaits a job by id with a
  timeout and an optional progress threshold, and returns the job system's own
  result, raises its own failure, or raises :class:`JobTimeoutError`.

* Celery: ``celery.publish_jobs(app, url)`` in the worker,
  ``celery.CeleryJobs(triggers, app)`` in the web process;
* RQ: ``rq worker -w aiopurgatory.jobs.rq.PublishingWorker``, ``rq.RQJobs(triggers, redis)``;
* Dramatiq: ``dramatiq.publish_jobs(broker, url)`` (once ``Results`` is added),
  ``dramatiq.DramatiqJobs(triggers, backend).wait_message(message, ...)``;
* saq: ``saq.publish_jobs(settings, url)``, ``saq.SaqJobs(triggers, queue)``;
* arq: ``arq.publish_jobs(WorkerSettings, url)``, ``arq.ArqJobs(triggers, pool)``
  (its extra is not in ``all``: arq pins redis-py below 6);
* Procrastinate and django-tasks (database backend), queued in PostgreSQL: no
  worker code, a trigger on the job table publishes in the transaction that
  stores the end (``procrastinate.install(app)``, ``django_tasks.schema_sql()``
  in a migration); ``procrastinate.ProcrastinateJobs(triggers, app)``,
  ``django_tasks.DjangoTasksJobs(triggers)`` on a ``PostgresTriggers``.

The key layout (one watermark per job: its progress, then its end above every
progress) is :mod:`aiopurgatory.jobs._layout`'s; see the documentation page
"Background jobs".
"""

from .._namespace import public_dir as _public_dir
from ._layout import END, JobEnd, job_key
from ._publisher import Advancer, JobPublisher
from ._waiter import (
    JobAnswer,
    JobFailedError,
    JobProgress,
    JobResultMissingError,
    JobTimeoutError,
    JobWaitCancelledError,
    JobWaiter,
)

__all__ = [
    "END",
    "Advancer",
    "JobAnswer",
    "JobEnd",
    "JobFailedError",
    "JobProgress",
    "JobPublisher",
    "JobResultMissingError",
    "JobTimeoutError",
    "JobWaitCancelledError",
    "JobWaiter",
    "job_key",
]

for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type) and _value.__module__.startswith(__name__ + "."):
        _value.__module__ = __name__
del _name, _value

__dir__ = _public_dir(__name__, __all__)
