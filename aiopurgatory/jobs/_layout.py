"""How a job's progress and end are written as one watermark (sans-IO: no Redis, no loop).

Every job has one key, ``job:<namespace>:<job id>``, whose watermark is:

* its **progress** while it runs: any number from 0 up to (not including)
  :data:`END`, raised by the job itself (``report_progress``); a retried job
  keeps the highest progress of its attempts, since a watermark only rises;
* its **end** once the job system has stored the outcome: ``END + k`` for the
  kind ``k`` of :class:`JobEnd` (succeeded 0, failed 1, revoked 2, lost 3).

One key, because a waiter then watches one threshold: ``END`` to wait for the
end, a progress value to wait for progress *or* the end (an end is above every
progress, so a job that ended also meets any progress threshold). Watermarks are
stored by the transport and read when a wait starts, so a wait that starts after
the job ended completes at once, and one that was parked before is woken by the
advance. The end kind is what the worker saw; the answer a waiter returns is
read from the job system itself (its result, its failure), which stays the one
source of truth.
"""

from __future__ import annotations

import enum
import math
from typing import Final

from .._transport import Key

__all__ = [
    "END",
    "JobEnd",
    "check_job_id",
    "check_namespace",
    "check_progress",
    "decode",
    "job_key",
]

#: The watermark of an ended job is ``END + JobEnd.<kind>.value``. 2**52: every
#: value up to it and the four ends above it are exact doubles (Redis's Lua and
#: the stored watermarks compare doubles), and no progress count comes near it.
END: Final = float(2**52)


class JobEnd(enum.Enum):
    """How a job ended, as its worker published it (the offset above :data:`END`).

    Attributes:
        SUCCEEDED: the job returned; its result is stored.
        FAILED: the job raised (after its last retry); its failure is stored.
        REVOKED: the job was revoked, stopped or aborted before or while running.
        LOST: the worker running it died and the job system recorded that it will
            not run again (Celery's ``WorkerLostError``, RQ's killed work horse).
    """

    SUCCEEDED = 0
    FAILED = 1
    REVOKED = 2
    LOST = 3


def job_key(namespace: str, job_id: str) -> Key:
    """The watermark key of ``job_id`` in ``namespace`` (``job:<namespace>:<job id>``)."""
    return f"job:{namespace}:{job_id}"


def check_job_id(job_id: object) -> str:
    """``job_id`` if it is a non-empty str, else TypeError/ValueError naming the argument."""
    if not isinstance(job_id, str):
        raise TypeError(f"job_id must be a str, got {type(job_id).__name__}")
    if not job_id:
        raise ValueError("job_id must not be empty")
    return job_id


def check_namespace(namespace: object) -> str:
    """``namespace`` if it is a non-empty str, else TypeError/ValueError naming the argument."""
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be a str, got {type(namespace).__name__}")
    if not namespace:
        raise ValueError("namespace must not be empty")
    return namespace


def check_progress(value: object, argument: str = "progress") -> float:
    """``value`` as a float if it is a number from 0 to below :data:`END`, else an error.

    Raises:
        TypeError: not an int or float (bool is refused).
        ValueError: NaN, infinite, negative, or :data:`END` or above.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{argument} must be an int or float, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or not 0 <= number < END:
        raise ValueError(f"{argument} must be from 0 to below 2**52, got {value!r}")
    return number


def decode(mark: float) -> JobEnd | None:
    """The end a watermark says, or None while it is a progress."""
    if mark < END:
        return None
    offset = round(mark - END)
    for end in JobEnd:
        if end.value == offset:
            return end
    return JobEnd.LOST  # above every known end: a newer library's; ended anyway
