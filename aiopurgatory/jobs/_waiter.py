"""The web side: await a background job by id, then answer with the job system's own result.

:class:`JobWaiter` is the generic core every integration subclasses with one
method, :meth:`JobWaiter.read` (the job system's own answer for a job, read
through its own API without blocking the loop). The waiting is written against
:class:`aiopurgatory.Triggers`, so it is the same on Redis, PostgreSQL and the
in-memory transport (which runs it on virtual time in tests):

1. watch the job's key with a threshold: :data:`~._layout.END` for the end, or
   the progress asked for (an ended job meets it too). The transport reads the
   stored watermark after watching, so a job that ended before the wait started
   completes it at once, whatever the timeout;
2. on a progress: return :class:`JobProgress`; on an end: read the job system
   and return its result or raise its failure (:meth:`JobAnswer.unwrap`);
3. on the timeout: look at the job system once more (an end whose trigger was
   lost, a job that ended while Redis was away), then raise
   :class:`JobTimeoutError`.

No polling: while a job runs, a parked wait costs nothing but its operation in
the purgatory; the job system is read once per wait that ends, and once more
per wait that times out.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar

import anyio

from .._errors import PurgatoryError
from .._logging import LazyLogger
from .._operation import Outcome
from .._purgatory_core import WatermarkOperation
from .._transport import Key, Triggers
from ._layout import END, JobEnd, check_job_id, check_namespace, check_progress, decode, job_key

__all__ = [
    "JobAnswer",
    "JobFailedError",
    "JobProgress",
    "JobResultMissingError",
    "JobTimeoutError",
    "JobWaitCancelledError",
    "JobWaiter",
]

_log = LazyLogger()


class JobTimeoutError(PurgatoryError, TimeoutError):
    """The job neither ended (nor reached the progress asked for) within the timeout.

    Attributes:
        job_id: the job's id.
        timeout: the wait's timeout, in seconds.
    """

    def __init__(self, job_id: str, timeout: float) -> None:
        super().__init__(f"job {job_id!r} did not end within {timeout:g} s")
        self.job_id = job_id
        self.timeout = timeout


class JobResultMissingError(PurgatoryError, LookupError):
    """The job ended, but the job system has no outcome for it (anymore).

    Its result expired (Celery's ``result_expires``, RQ's ``result_ttl``...), was
    never stored (``ignore_result``), or the job id is another job's.

    Attributes:
        job_id: the job's id.
        end: how its worker said it ended.
    """

    def __init__(self, job_id: str, end: JobEnd) -> None:
        super().__init__(
            f"job {job_id!r} ended ({end.name.lower()}) but its job system has no "
            "outcome for it: expired, never stored, or the id was reused"
        )
        self.job_id = job_id
        self.end = end


class JobFailedError(PurgatoryError):
    """The job failed, in a job system that stores a description, not an exception.

    Raised for RQ and saq (which store the failure as text); Celery, Dramatiq
    and arq raise their own exceptions.

    Attributes:
        job_id: the job's id.
        end: ``JobEnd.FAILED``, ``REVOKED`` (stopped, aborted) or ``LOST``.
        detail: the job system's description (a traceback, as text), or "".
    """

    def __init__(self, job_id: str, end: JobEnd, detail: str = "") -> None:
        last = detail.strip().splitlines()[-1] if detail.strip() else ""
        super().__init__(f"job {job_id!r} {end.name.lower()}" + (f": {last}" if last else ""))
        self.job_id = job_id
        self.end = end
        self.detail = detail


class JobWaitCancelledError(PurgatoryError):
    """The wait was withdrawn before the job ended: its purgatory was closed (an
    application shutting down, ``release_on_shutdown``) or the key's waits cancelled."""


@dataclass(frozen=True, slots=True)
class JobProgress:
    """What a wait with ``progress=`` returns when the job got there and has not ended.

    Attributes:
        job_id: the job's id.
        progress: the job's progress (at least the threshold asked for).
    """

    job_id: str
    progress: float


@dataclass(frozen=True, slots=True)
class JobAnswer:
    """A job system's answer for an ended job, as :meth:`JobWaiter.read` returns it.

    Attributes:
        end: how the job ended.
        value: its result (SUCCEEDED).
        error: the job system's own exception for a job that did not succeed.
    """

    end: JobEnd
    value: Any = None
    error: BaseException | None = None

    def unwrap(self) -> Any:
        """The result, or the job system's exception raised."""
        if self.error is not None:
            raise self.error
        return self.value


class _JobMark(WatermarkOperation):
    """A wait on one job key's threshold that remembers the watermark it saw."""

    __slots__ = ("mark",)

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.mark: float | None = None

    def try_complete(self) -> bool:
        if not super().try_complete():
            return False
        purgatory: Any = self._purgatory
        self.mark = purgatory.watermark(self._keys[0])
        return self.force_complete()


class JobWaiter(abc.ABC):
    """Awaits jobs of one job system by id (the web side); subclass it with :meth:`read`.

    Each integration is one (``aiopurgatory.jobs.celery.CeleryJobs``...);
    subclass it yourself for another job system whose workers publish through
    :class:`JobPublisher`.

    Args:
        triggers: the process's transport (a ``RedisTriggers`` with a purgatory,
            a ``LocalTriggers`` in tests), entered (``async with``) by the
            application.
        namespace: the jobs' key namespace, the workers' (default: the
            system's name, :attr:`system`).

    Raises:
        TypeError: ``triggers`` is not a Triggers; ``namespace`` not a str.
        ValueError: ``namespace`` is empty.
    """

    #: The job system's name, the default namespace of its keys.
    system: ClassVar[str] = "jobs"

    def __init__(self, triggers: Triggers, *, namespace: str | None = None) -> None:
        if not isinstance(triggers, Triggers):
            raise TypeError(
                "triggers must be an aiopurgatory.Triggers (RedisTriggers, LocalTriggers...), "
                f"got {type(triggers).__name__}"
            )
        if namespace is None:
            namespace = self.system
        namespace = check_namespace(namespace)
        self._triggers = triggers
        self._namespace = namespace

    @property
    def triggers(self) -> Triggers:
        """The transport waits are parked on."""
        return self._triggers

    @property
    def namespace(self) -> str:
        """The jobs' key namespace."""
        return self._namespace

    def key(self, job_id: str) -> Key:
        """The watermark key of ``job_id`` (``job:<namespace>:<job id>``)."""
        return job_key(self._namespace, check_job_id(job_id))

    @abc.abstractmethod
    async def read(self, job_id: str) -> JobAnswer | None:
        """The job system's answer for ``job_id`` if it ended, else None.

        Reads through the job system's own API without blocking the event loop
        (a blocking client's call goes to a thread). Called once when a wait sees
        the job's end, and once when a wait times out; a call that raises is
        made again (at once, then with a backoff up to 1 s) until the wait's
        timeout, logged once (``aiopurgatory.jobs.read_retried``); the failure
        after it is raised to the waiter.
        """

    # The timeout is the parked operation's own expiry (on the purgatory's
    # wheel, never early), which a wrapping asyncio.timeout cannot replace: an
    # expired wait still takes the job system's last look.
    async def wait(
        self,
        job_id: str,
        *,
        timeout: float,  # noqa: ASYNC109
        progress: float | None = None,
    ) -> Any:
        """Wait for ``job_id`` to end (or reach ``progress``); return its result.

        Args:
            job_id: the job system's id of the job.
            timeout: seconds to wait at most (finite, >= 0; 0 answers for a job
                that has ended or got there already, else times out).
            progress: also return when the job's published progress reaches
                this value (from 0 to below 2**52), before it ends.

        Returns:
            The job's result, read from the job system; or, with ``progress``,
            a :class:`JobProgress` if the job got there before ending.

        Raises:
            Exception: the job system's own failure for a job that failed, was
                revoked or lost (Celery's exception or ``TaskRevokedError``,
                Dramatiq's ``ResultFailure``...; :class:`JobFailedError` for
                systems that store text).
            JobTimeoutError: the job did not end (or get there) in time.
            JobResultMissingError: the job ended but its outcome is gone.
            JobWaitCancelledError: the purgatory was closed meanwhile.
            TypeError, ValueError: an unusable argument; nothing is watched.
            asyncio.CancelledError: the waiting task was cancelled (the wait is
                withdrawn).
        """
        key = self.key(job_id)
        threshold = END if progress is None else check_progress(progress)
        op = _JobMark(timeout)
        deadline = anyio.current_time() + op.timeout
        outcome = await self._triggers.watch(op, {key: threshold})
        if outcome is Outcome.COMPLETED:
            mark = op.mark if op.mark is not None else END
            end = decode(mark)
            if end is None:
                return JobProgress(job_id, mark)
            answer = await self._read_retrying(job_id, deadline)
            if answer is None:
                raise JobResultMissingError(job_id, end)
            return answer.unwrap()
        if outcome is Outcome.EXPIRED:
            # The last look: an end whose trigger never came (published while
            # the transport was down and not kept, its watermark expired).
            answer = await self._read_retrying(job_id, deadline)
            if answer is not None:
                return answer.unwrap()
            raise JobTimeoutError(job_id, timeout)
        raise JobWaitCancelledError(f"the wait for job {job_id!r} was withdrawn: {outcome.name}")

    async def _read_retrying(self, job_id: str, deadline: float) -> JobAnswer | None:
        """:meth:`read`, tried again while it fails, until ``deadline`` (anyio time).

        A job system's client whose pooled connection died with a restarted
        Redis fails the first command on it (and replaces it); a wait woken just
        before Redis went away reads while it is away. So a failed read is made
        again at once, then after 50 ms, doubling to 1 s, until the wait's own
        deadline; the failure after it is raised. The first failure is logged.
        """
        delay = 0.0
        attempts = 0
        while True:
            try:
                return await self.read(job_id)
            except Exception as exc:
                attempts += 1
                remaining = deadline - anyio.current_time()
                if attempts > 1 and remaining <= 0:
                    raise
                if attempts == 1:
                    _log.warning(
                        "aiopurgatory.jobs.read_retried",
                        system=self.system,
                        job_id=job_id,
                        error=f"{type(exc).__name__}: {exc}",
                    )
            await anyio.sleep(min(delay, max(remaining, 0.0)))
            delay = min(1.0, max(0.05, 2 * delay))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} namespace={self._namespace!r}>"
