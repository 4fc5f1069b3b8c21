"""aiopurgatory.jobs.arq carries the worker's job span to the wait the job's end completes.

In arq's venv (``make test-arq``: arq pins redis-py below 6). The worker's own
hooks trace each job (:mod:`tests.jobs.arq_traced_app`: a span current from
``on_job_start`` to ``on_job_end``, which ends it before the end is published);
the wait here, woken through a real Redis, links to that span.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "arq",
    reason="arq is not installed (it pins redis<6): its tests run in `make test-arq`'s .venv-arq",
)

from arq import create_pool
from arq.connections import RedisSettings
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from aiopurgatory.jobs.arq import ArqJobs
from aiopurgatory.redis import RedisTriggers
from aiopurgatory.redis.testing import RedisServer
from tests.jobs.conftest import WorkerProcess, python
from tests.jobs.spans import ENV
from tests.jobs.traced import linked_to, traced_wait, worker_span

QUEUE = "arq:traced"


@pytest.fixture(scope="module")
def arq_worker(
    jobs_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, Path]]:
    logs = tmp_path_factory.mktemp("arq-traced")
    spans = logs / "arq.spans"
    worker = WorkerProcess(
        [python(), "-m", "arq", "tests.jobs.arq_traced_app.WorkerSettings"],
        url=jobs_redis.url, log=logs / "arq.log", ready=logs / "arq.ready", env={ENV: str(spans)},
    )  # fmt: skip
    worker.wait_ready()
    yield worker, spans
    worker.stop()


@pytest.mark.parametrize("function", ["nap", "fail_after"])
async def test_an_arq_job_links_the_wait_to_the_workers_span(
    arq_worker: tuple[WorkerProcess, Path],
    jobs_redis: RedisServer,
    triggers: RedisTriggers,
    here: tuple[TracerProvider, InMemorySpanExporter],
    function: str,
) -> None:
    pool = await create_pool(RedisSettings.from_dsn(jobs_redis.url), default_queue_name=QUEUE)
    try:
        jobs = ArqJobs(triggers, pool)
        job_id = str(uuid.uuid4())

        async def send() -> None:
            assert await pool.enqueue_job(function, 0.05, _job_id=job_id) is not None

        outcome, wait = await traced_wait(
            triggers, jobs.key(job_id), lambda: jobs.wait(job_id, timeout=20.0), send, here
        )
    finally:
        await pool.aclose()
    if function == "nap":
        assert outcome == "rested"
    else:
        assert isinstance(outcome, ValueError)  # arq's stored exception, raised again
        assert str(outcome) == "failed on purpose"
    span = worker_span(arq_worker[1], "arq job", "job.id", job_id)
    assert linked_to(wait) == [(span["trace_id"], span["span_id"])]
