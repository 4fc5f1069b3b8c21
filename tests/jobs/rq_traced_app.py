"""An RQ worker class whose work horses trace each job (``rq worker -w ...TracedWorker``).

A span around ``perform_job``, where OpenTelemetry instrumentations of RQ put
their outer span (the work horse's whole run of a job: RQ stores the outcome
and calls ``handle_job_success``/``handle_job_failure`` inside it). Its spans go
to the file named by ``AIOPURGATORY_JOBS_SPANS`` (:mod:`tests.jobs.spans`),
exported as each ends, from the work horse.
"""

from __future__ import annotations

from typing import Any

from tests.jobs.rq_app import ReadyWorker
from tests.jobs.spans import export_to

_provider = export_to()
_tracer = None if _provider is None else _provider.get_tracer("rq-worker")


class TracedWorker(ReadyWorker):
    def perform_job(self, job: Any, *args: Any, **kwargs: Any) -> Any:
        assert _tracer is not None, "AIOPURGATORY_JOBS_SPANS is not set"
        with _tracer.start_as_current_span("rq job", attributes={"job.id": job.id}):
            return super().perform_job(job, *args, **kwargs)
