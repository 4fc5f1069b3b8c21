"""The jobs core (aiopurgatory.jobs: key layout, JobPublisher, JobWaiter) on virtual time.

The transport is the in-memory one (LocalTriggers on a LocalBus: a web process and
a worker), and the job system a dict: what is tested is the waiting logic, at
exact instants.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio.to_thread
import pytest

import aiopurgatory as ap
from aiopurgatory.jobs import (
    END,
    JobAnswer,
    JobEnd,
    JobFailedError,
    JobProgress,
    JobPublisher,
    JobResultMissingError,
    JobTimeoutError,
    JobWaitCancelledError,
    JobWaiter,
    job_key,
)
from aiopurgatory.jobs._layout import decode

pytestmark = pytest.mark.virtual_time


class MemoryJobs(JobWaiter):
    """A job system whose stored outcomes are a dict (read in a thread, as Celery's are)."""

    system = "memory"

    def __init__(self, triggers: ap.Triggers) -> None:
        super().__init__(triggers)
        self.stored: dict[str, JobAnswer] = {}
        self.reads = 0

    async def read(self, job_id: str) -> JobAnswer | None:
        self.reads += 1
        return await anyio.to_thread.run_sync(self.stored.get, job_id)


@dataclass
class System:
    web: MemoryJobs
    worker: JobPublisher
    bus: ap.LocalBus
    purgatory: ap.Purgatory

    def end(self, job_id: str, answer: JobAnswer) -> None:
        """What a worker does: store the outcome, then publish the end."""
        self.web.stored[job_id] = answer
        assert self.worker.ended(job_id, answer.end)


@pytest.fixture
async def system() -> AsyncIterator[System]:
    bus = ap.LocalBus()
    purgatory = ap.Purgatory("web")
    async with (
        ap.LocalTriggers(purgatory, bus=bus) as web,
        ap.LocalTriggers(None, bus=bus) as worker,
    ):
        yield System(MemoryJobs(web), JobPublisher(worker, namespace="memory"), bus, purgatory)


def now() -> float:
    return asyncio.get_running_loop().time()


async def later(seconds: float, action: object) -> None:
    await asyncio.sleep(seconds)
    assert callable(action)
    action()


async def test_a_parked_wait_answers_at_the_end_with_the_systems_result(system: System) -> None:
    ender = asyncio.create_task(
        later(2.5, lambda: system.end("j1", JobAnswer(JobEnd.SUCCEEDED, 42)))
    )
    assert await system.web.wait("j1", timeout=30) == 42
    assert now() == 2.5
    assert system.web.reads == 1  # read once, when the end came
    await ender


async def test_a_job_that_ended_before_the_wait_answers_at_once_even_with_timeout_0(
    system: System,
) -> None:
    system.end("j1", JobAnswer(JobEnd.SUCCEEDED, "done"))
    await asyncio.sleep(1)
    assert await system.web.wait("j1", timeout=0) == "done"
    assert now() == 1.0


async def test_the_systems_failure_is_raised_as_it_is(system: System) -> None:
    failure = ValueError("boom")
    system.end("j1", JobAnswer(JobEnd.FAILED, error=failure))
    with pytest.raises(ValueError, match="boom") as caught:
        await system.web.wait("j1", timeout=5)
    assert caught.value is failure


async def test_a_progress_threshold_wakes_at_the_progress_that_reaches_it(system: System) -> None:
    async def work() -> None:
        for step in range(1, 6):
            await asyncio.sleep(1)
            system.worker.progress("j1", step)
        system.end("j1", JobAnswer(JobEnd.SUCCEEDED, "five"))

    worker = asyncio.create_task(work())
    assert await system.web.wait("j1", timeout=30, progress=3) == JobProgress("j1", 3.0)
    assert now() == 3.0
    # Past the last progress: only the end meets it, and the end meets any threshold.
    assert await system.web.wait("j1", timeout=30, progress=5.5) == "five"
    assert now() == 5.0
    assert system.web.reads == 1  # a progress answer reads nothing
    await worker


async def test_a_timeout_raises_job_timeout_error_at_its_instant(system: System) -> None:
    system.worker.progress("j1", 1)
    with pytest.raises(JobTimeoutError) as caught:
        await system.web.wait("j1", timeout=7.5, progress=2)
    assert now() == 7.5
    assert (caught.value.job_id, caught.value.timeout) == ("j1", 7.5)
    assert isinstance(caught.value, TimeoutError)
    assert system.web.reads == 1  # the last look


async def test_at_its_timeout_a_wait_finds_an_end_whose_trigger_never_came(system: System) -> None:
    # Stored by the job system, never published (a worker that could not reach Redis).
    system.web.stored["j1"] = JobAnswer(JobEnd.SUCCEEDED, "late")
    assert await system.web.wait("j1", timeout=4) == "late"
    assert now() == 4.0


async def test_an_end_published_during_an_outage_arrives_when_it_ends(system: System) -> None:
    system.bus.pause()
    waiter = asyncio.create_task(system.web.wait("j1", timeout=60))
    await asyncio.sleep(1)
    system.end("j1", JobAnswer(JobEnd.SUCCEEDED, 7))
    await asyncio.sleep(9)
    system.bus.resume()
    assert await waiter == 7
    assert now() == 10.0


async def test_an_end_without_a_stored_outcome_is_result_missing(system: System) -> None:
    assert system.worker.ended("j1", JobEnd.REVOKED)
    with pytest.raises(JobResultMissingError) as caught:
        await system.web.wait("j1", timeout=5)
    assert caught.value.end is JobEnd.REVOKED
    assert isinstance(caught.value, LookupError)


async def test_a_closed_purgatory_withdraws_the_wait(system: System) -> None:
    waiter = asyncio.create_task(system.web.wait("j1", timeout=60))
    await asyncio.sleep(1)
    system.purgatory.close()
    with pytest.raises(JobWaitCancelledError):
        await waiter
    assert now() == 1.0


async def test_cancelling_the_waiting_task_withdraws_its_operation(system: System) -> None:
    waiter = asyncio.create_task(system.web.wait("j1", timeout=60))
    await asyncio.sleep(1)
    assert system.purgatory.watched == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert system.purgatory.watched == 0


async def test_unusable_arguments_are_refused_before_anything_is_watched(system: System) -> None:
    web = system.web
    with pytest.raises(TypeError, match="job_id"):
        await web.wait(b"j1", timeout=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="job_id"):
        await web.wait("", timeout=1)
    with pytest.raises(ValueError, match="progress"):
        await web.wait("j1", timeout=1, progress=-1)
    with pytest.raises(ValueError, match="progress"):
        await web.wait("j1", timeout=1, progress=END)
    with pytest.raises(TypeError, match="progress"):
        await web.wait("j1", timeout=1, progress=True)
    with pytest.raises(ValueError, match="timeout"):
        await web.wait("j1", timeout=float("nan"))
    assert system.purgatory.watched == 0
    with pytest.raises(TypeError, match="triggers"):
        MemoryJobs(system.purgatory)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="namespace"):
        JobPublisher(system.web.triggers, namespace="")
    with pytest.raises(TypeError, match="publisher"):
        JobPublisher(42, namespace="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="end"):
        system.worker.ended("j1", "succeeded")  # type: ignore[arg-type]


async def test_a_publish_that_fails_is_logged_and_never_raised(
    system: System, caplog: pytest.LogCaptureFixture
) -> None:
    closed = ap.LocalTriggers(None, bus=system.bus)  # never started: refuses triggers
    jobs = JobPublisher(closed, namespace="memory")
    with caplog.at_level(logging.WARNING, logger="aiopurgatory"):
        assert jobs.progress("j1", 1) is False
        assert jobs.ended("j1", JobEnd.SUCCEEDED) is False
    assert [r.getMessage().split()[0] for r in caplog.records] == [
        "aiopurgatory.jobs.publish_failed"
    ] * 2


async def test_the_key_layout() -> None:
    assert job_key("celery", "abc") == "job:celery:abc"
    assert END == 2.0**52
    assert decode(0) is None
    assert decode(END - 1) is None
    assert [decode(END + end.value) for end in JobEnd] == list(JobEnd)
    # Every end is above every progress, and exact as a double.
    assert all(END + end.value > END - 1 for end in JobEnd)
    assert len({END + end.value for end in JobEnd}) == len(JobEnd)


async def test_a_failed_error_shows_the_last_line_of_the_detail() -> None:
    error = JobFailedError("j1", JobEnd.FAILED, "Traceback...\n  ...\nValueError: boom\n")
    assert str(error) == "job 'j1' failed: ValueError: boom"
    assert str(JobFailedError("j1", JobEnd.LOST)) == "job 'j1' lost"


class FlakyJobs(MemoryJobs):
    """Its first read fails, as a client's pooled connection that died with Redis does."""

    async def read(self, job_id: str) -> JobAnswer | None:
        self.reads += 1
        if self.reads == 1:
            raise ConnectionError("Connection closed by server.")
        return self.stored.get(job_id)


async def test_a_read_that_fails_is_tried_again_until_the_waits_timeout(
    system: System, caplog: pytest.LogCaptureFixture
) -> None:
    flaky = FlakyJobs(system.web.triggers)
    flaky.stored["j1"] = JobAnswer(JobEnd.SUCCEEDED, "kept")
    assert system.worker.ended("j1", JobEnd.SUCCEEDED)
    with caplog.at_level(logging.WARNING, logger="aiopurgatory"):
        assert await flaky.wait("j1", timeout=5) == "kept"
    assert flaky.reads == 2
    assert "aiopurgatory.jobs.read_retried" in caplog.text

    class Down(MemoryJobs):
        async def read(self, job_id: str) -> JobAnswer | None:
            self.reads += 1
            raise ConnectionError("Redis is down")

    # Tried again with a backoff until the wait's own timeout, then raised.
    down = Down(system.web.triggers)
    started = now()
    with pytest.raises(ConnectionError, match="down"):
        await down.wait("j1", timeout=5)
    assert now() - started == 5.0
    assert 5 <= down.reads <= 15
