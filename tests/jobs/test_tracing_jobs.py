"""The job integrations carry the worker's task span to the waits their ends complete.

A real worker traces its tasks with a TracerProvider of its own, exporting to a
file (:mod:`tests.jobs.spans`); this process traces its waits
(:func:`aiopurgatory.tracing.trace_waits`, an in-memory exporter). The wait for a
job, woken by the end the worker published through Redis, has a span whose link
is the worker's span of that job.

(arq's own: tests/jobs/test_tracing_arq.py, in arq's venv.)
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from dramatiq.results import ResultFailure
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rq import Queue
from saq import Job as SaqJob
from saq import Queue as SaqQueue

from aiopurgatory.jobs import JobEnd, JobFailedError
from aiopurgatory.jobs.celery import CeleryJobs
from aiopurgatory.jobs.dramatiq import DramatiqJobs
from aiopurgatory.jobs.rq import RQJobs
from aiopurgatory.jobs.saq import SaqJobs
from aiopurgatory.redis import RedisTriggers
from aiopurgatory.redis.testing import RedisServer
from tests.jobs import celery_app, rq_app
from tests.jobs.conftest import WorkerProcess, python
from tests.jobs.spans import ENV
from tests.jobs.traced import linked_to, traced_wait, worker_span

CELERY_APP = "tests.jobs.celery_traced_app"
ORDERS = ["first", "last"]  # Celery instrumented before or after publish_jobs


# -- Celery (opentelemetry-instrumentation-celery in the worker) --------------------


@pytest.fixture(scope="module")
def celery_workers(
    jobs_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, tuple[WorkerProcess, Path]]]:
    """A threads-pool worker per order of instrumentation, each on its queue and span file."""
    logs = tmp_path_factory.mktemp("celery-traced")
    started = {}
    for order in ORDERS:
        spans = logs / f"{order}.spans"
        worker = WorkerProcess(
            [python(), "-m", "celery", "-A", CELERY_APP, "worker", "-P", "threads", "-c", "2",
             "-Q", order, "-n", f"{order}@%h", "--without-gossip", "--without-mingle",
             "--without-heartbeat", "-l", "info"],
            url=jobs_redis.url, log=logs / f"{order}.log", ready=logs / f"{order}.ready",
            env={ENV: str(spans), "AIOPURGATORY_JOBS_INSTRUMENT": order},
        )  # fmt: skip
        started[order] = (worker, spans)
    for worker, _ in started.values():
        worker.wait_ready()
    yield started
    for worker, _ in started.values():
        worker.stop()


@pytest.fixture(scope="module")
def celery_client(jobs_redis: RedisServer) -> Iterator[Celery]:
    app = celery_app.client(jobs_redis.url)
    yield app
    app.close()


def celery_send(client: Celery, name: str, job_id: str, queue: str, *args: Any) -> Any:
    sending = celery_app.sender(client.conf.broker_url)

    async def send() -> None:
        await asyncio.to_thread(
            sending.send_task, f"{CELERY_APP}.{name}", args=args, queue=queue, task_id=job_id
        )

    return send


def celery_task_span(spans: Path, name: str, job_id: str) -> dict[str, Any]:
    return worker_span(spans, f"run/{CELERY_APP}.{name}", "messaging.message.id", job_id)


@pytest.mark.parametrize("order", ORDERS)
async def test_a_celery_task_that_succeeded_links_the_wait_to_the_tasks_span(
    celery_workers: dict[str, tuple[WorkerProcess, Path]],
    celery_client: Celery,
    triggers: RedisTriggers,
    here: tuple[TracerProvider, InMemorySpanExporter],
    order: str,
) -> None:
    job_id = str(uuid.uuid4())
    jobs = CeleryJobs(triggers, celery_client)
    send = celery_send(celery_client, "nap", job_id, order, 0.05)
    result, wait = await traced_wait(
        triggers, jobs.key(job_id), lambda: jobs.wait(job_id, timeout=20.0), send, here
    )
    assert result == "rested"
    task = celery_task_span(celery_workers[order][1], "nap", job_id)
    assert linked_to(wait) == [(task["trace_id"], task["span_id"])]


async def test_a_celery_task_that_failed_links_the_wait_to_the_tasks_span(
    celery_workers: dict[str, tuple[WorkerProcess, Path]],
    celery_client: Celery,
    triggers: RedisTriggers,
    here: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    job_id = str(uuid.uuid4())
    jobs = CeleryJobs(triggers, celery_client)
    send = celery_send(celery_client, "fail_after", job_id, "first", 0.05)
    error, wait = await traced_wait(
        triggers, jobs.key(job_id), lambda: jobs.wait(job_id, timeout=20.0), send, here
    )
    assert isinstance(error, ValueError)
    assert str(error) == "failed on purpose"
    task = celery_task_span(celery_workers["first"][1], "fail_after", job_id)
    assert linked_to(wait) == [(task["trace_id"], task["span_id"])]


# -- RQ (a span around the work horse's perform_job) --------------------------------


@pytest.fixture(scope="module")
def rq_worker(
    jobs_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, Path]]:
    logs = tmp_path_factory.mktemp("rq-traced")
    spans = logs / "rq.spans"
    worker = WorkerProcess(
        [python(), "-m", "rq.cli", "worker", "-w", "tests.jobs.rq_traced_app.TracedWorker",
         "--url", jobs_redis.url, "--name", "traced", "traced"],
        url=jobs_redis.url, log=logs / "rq.log", ready=logs / "rq.ready", env={ENV: str(spans)},
    )  # fmt: skip
    worker.wait_ready()
    yield worker, spans
    worker.stop()


@pytest.mark.parametrize(("function", "args"), [(rq_app.add, (2, 3)), (rq_app.fail, ("boom",))])
async def test_an_rq_job_links_the_wait_to_the_work_horses_span(
    rq_worker: tuple[WorkerProcess, Path],
    jobs_redis: RedisServer,
    triggers: RedisTriggers,
    here: tuple[TracerProvider, InMemorySpanExporter],
    function: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    connection = redis.Redis.from_url(jobs_redis.url)
    try:
        jobs = RQJobs(triggers, connection)
        job_id = str(uuid.uuid4())
        queue = Queue("traced", connection=connection)

        async def send() -> None:
            await asyncio.to_thread(queue.enqueue, function, *args, job_id=job_id)

        outcome, wait = await traced_wait(
            triggers, jobs.key(job_id), lambda: jobs.wait(job_id, timeout=20.0), send, here
        )
    finally:
        connection.close()
    if function is rq_app.add:
        assert outcome == 5
    else:
        assert isinstance(outcome, JobFailedError)
        assert outcome.end is JobEnd.FAILED
    job = worker_span(rq_worker[1], "rq job", "job.id", job_id)
    assert linked_to(wait) == [(job["trace_id"], job["span_id"])]


# -- Dramatiq (a tracing middleware added before publish_jobs) ----------------------


@pytest.fixture(scope="module")
def dramatiq_app(
    jobs_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Path]]:
    """The traced app's module, imported with the module's Redis, and its worker."""
    logs = tmp_path_factory.mktemp("dramatiq-traced")
    spans = logs / "dramatiq.spans"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIOPURGATORY_JOBS_REDIS", jobs_redis.url)
        import tests.jobs.dramatiq_traced_app as module

        assert jobs_redis.url == module.URL, "imported already with another Redis"
        worker = WorkerProcess(
            [python(), "-m", "dramatiq", "tests.jobs.dramatiq_traced_app", "-p", "1", "-t", "2",
             "-Q", "traced"],
            url=jobs_redis.url, log=logs / "dramatiq.log", ready=logs / "dramatiq.ready",
            env={ENV: str(spans)},
        )  # fmt: skip
        worker.wait_ready()
        yield module, spans
        worker.stop()
        module.broker.close()


@pytest.mark.parametrize("actor", ["nap", "fail_after"])
async def test_a_dramatiq_message_links_the_wait_to_the_workers_span(
    dramatiq_app: tuple[Any, Path],
    triggers: RedisTriggers,
    here: tuple[TracerProvider, InMemorySpanExporter],
    actor: str,
) -> None:
    # A failure is published from after_nack, which Dramatiq runs after the
    # tracing middleware ended the span: PublishJobs keeps the context it
    # failed in until then.
    module, spans = dramatiq_app
    jobs = DramatiqJobs(triggers, module.backend)
    message = getattr(module, actor).message(0.05)

    async def send() -> None:
        await asyncio.to_thread(module.broker.enqueue, message)

    outcome, wait = await traced_wait(
        triggers,
        jobs.key(message.message_id),
        lambda: jobs.wait_message(message, timeout=20.0),
        send,
        here,
    )
    if actor == "nap":
        assert outcome == "rested"
    else:
        assert isinstance(outcome, ResultFailure)
        assert "failed on purpose" in str(outcome)
    span = worker_span(spans, f"dramatiq {actor}", "message.id", message.message_id)
    assert linked_to(wait) == [(span["trace_id"], span["span_id"])]


# -- saq (a span from before_process to after_process, hooks given to publish_jobs) --


@pytest.fixture(scope="module")
def saq_worker(
    jobs_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, Path]]:
    logs = tmp_path_factory.mktemp("saq-traced")
    spans = logs / "saq.spans"
    worker = WorkerProcess(
        [python(), "-m", "saq", "tests.jobs.saq_traced_app.settings"],
        url=jobs_redis.url, log=logs / "saq.log", ready=logs / "saq.ready", env={ENV: str(spans)},
    )  # fmt: skip
    worker.wait_ready()
    yield worker, spans
    worker.stop()


@pytest.mark.parametrize("function", ["nap", "fail_after"])
async def test_a_saq_job_links_the_wait_to_the_workers_span(
    saq_worker: tuple[WorkerProcess, Path],
    jobs_redis: RedisServer,
    triggers: RedisTriggers,
    here: tuple[TracerProvider, InMemorySpanExporter],
    function: str,
) -> None:
    # publish_jobs' after_process runs after the one that ended the span: it
    # publishes in the context its own before_process (the last) saw.
    queue = SaqQueue.from_url(jobs_redis.url, name="traced")
    await queue.connect()
    try:
        jobs = SaqJobs(triggers, queue)
        job = SaqJob(function, kwargs={"seconds": 0.05}, key=str(uuid.uuid4()), retries=1)

        async def send() -> None:
            assert await queue.enqueue(job) is not None

        outcome, wait = await traced_wait(
            triggers, jobs.key(job.key), lambda: jobs.wait(job.key, timeout=20.0), send, here
        )
    finally:
        await queue.disconnect()
    if function == "nap":
        assert outcome == "rested"
    else:
        assert isinstance(outcome, JobFailedError)
        assert outcome.end is JobEnd.FAILED
    span = worker_span(saq_worker[1], f"saq {function}", "job.key", job.key)
    assert linked_to(wait) == [(span["trace_id"], span["span_id"])]


def test_the_publishers_context_helpers_import_nothing_of_opentelemetry() -> None:
    # A worker that does not trace: no context to keep, nothing imported for it.
    code = (
        "import sys\n"
        "from aiopurgatory.jobs._publisher import current_context, within\n"
        "assert current_context() is None\n"
        "with within(None):\n"
        "    pass\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'imported'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.stdout == "ok\n", out.stderr
