"""The RQ job of ``aiopurgatory bench jobs`` (its worker runs ``rq worker`` on queue ``bench``)."""

from __future__ import annotations

import time


def stamp() -> float:
    """The time (``time.time()``, seconds) at which the job ended."""
    return time.time()
