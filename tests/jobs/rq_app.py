"""The jobs and the worker class of the RQ tests' real worker (``rq worker -w ...``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from aiopurgatory.jobs.rq import PublishingWorker, report_progress


class ReadyWorker(PublishingWorker):
    """The library's worker class, which also says when it is ready (for the fixture)."""

    def register_birth(self, *args: Any, **kwargs: Any) -> Any:
        born = super().register_birth(*args, **kwargs)
        ready = os.environ.get("AIOPURGATORY_JOBS_READY")
        if ready:
            Path(ready).write_text(str(os.getpid()))
        return born


def add(x: int, y: int) -> int:
    return x + y


def fail(message: str) -> None:
    raise ValueError(message)


def steps(count: int, seconds: float) -> int:
    """Reports progress 1..count, one step every ``seconds``; returns ``count``."""
    for step in range(1, count + 1):
        time.sleep(seconds)
        report_progress(step)
    return count


def die() -> None:
    """Kills its own process (the work horse): the worker sees it die."""
    os.kill(os.getpid(), signal.SIGKILL)
