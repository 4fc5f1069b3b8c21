"""The job integrations carry the worker's task span to the waits their ends complete.

A real worker traces its tasks with a TracerProvider of its own, exporting to a
file (:mod:`tests.jobs.spans`); this process traces its waits
(:func:`aiopurgatory.tracing.trace_waits`, an in-memory exporter). The wait for a
job, woken by the end the worker published through Redis, has a span whose link
is the worker's span of that job.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from aiopurgatory.jobs import JobWaiter
from aiopurgatory.jobs.celery import CeleryJobs
from aiopurgatory.redis import RedisTriggers
from aiopurgatory.redis.testing import RedisServer
from aiopurgatory.tracing import trace_waits
from tests.jobs import celery_app
from tests.jobs.conftest import WorkerProcess, python
from tests.jobs.spans import ENV, read_spans

CELERY_APP = "tests.jobs.celery_traced_app"
ORDERS = ["first", "last"]  # Celery instrumented before or after publish_jobs


@pytest.fixture
def here() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def linked_to(span: ReadableSpan) -> list[tuple[str, str]]:
    return [
        (format(link.context.trace_id, "032x"), format(link.context.span_id, "016x"))
        for link in span.links
    ]


async def parked(triggers: RedisTriggers, key: Any) -> None:
    """Until the wait on ``key`` is parked and its partition subscribed."""
    subscriber, purgatory = triggers._subscriber, triggers.purgatory
    assert subscriber is not None and purgatory is not None
    async with asyncio.timeout(10):
        while not (purgatory.pending and subscriber.covers([key])):  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def traced_wait(
    triggers: RedisTriggers,
    jobs: JobWaiter,
    job_id: str,
    send: Any,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> tuple[Any, ReadableSpan]:
    """Wait for ``job_id`` (traced), sending it with ``send()`` once the wait is
    parked; the wait's outcome (its result or exception) and its span."""
    purgatory = triggers.purgatory
    assert purgatory is not None
    with trace_waits(purgatory, tracer_provider=provider):
        waiting = asyncio.ensure_future(jobs.wait(job_id, timeout=20.0))
        await parked(triggers, jobs.key(job_id))
        await send()
        try:
            outcome: Any = await waiting
        except Exception as exc:
            outcome = exc
    (wait,) = [s for s in exporter.get_finished_spans() if s.name.startswith("wait ")]
    return outcome, wait


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
        started[order] = (
            WorkerProcess(
                [python(), "-m", "celery", "-A", CELERY_APP, "worker", "-P", "threads", "-c", "2",
                 "-Q", order, "-n", f"{order}@%h", "--without-gossip", "--without-mingle",
                 "--without-heartbeat", "-l", "info"],
                url=jobs_redis.url, log=logs / f"{order}.log", ready=logs / f"{order}.ready",
                env={ENV: str(spans), "AIOPURGATORY_JOBS_INSTRUMENT": order},
            ),  # fmt: skip
            spans,
        )
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
    for span in read_spans(spans, f"run/{CELERY_APP}.{name}", count=1):
        if span["attributes"].get("messaging.message.id") == job_id:
            return span
    raise AssertionError(f"the worker exported no span of task {job_id}")


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
    result, wait = await traced_wait(triggers, jobs, job_id, send, *here)
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
    error, wait = await traced_wait(triggers, jobs, job_id, send, *here)
    assert isinstance(error, ValueError) and str(error) == "failed on purpose"
    task = celery_task_span(celery_workers["first"][1], "fail_after", job_id)
    assert linked_to(wait) == [(task["trace_id"], task["span_id"])]
