"""aiopurgatory: Kafka-style delayed operations for asyncio.

A *purgatory* holds delayed operations (requests that cannot finish yet) until a
trigger on one of their watch keys completes them or their timeout expires.
Expiry runs on a hierarchical timing wheel driven by one ``loop.call_at`` handle.

Everything public is importable from here::

    import aiopurgatory as ap
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._compiled import COMPILED
from ._errors import (
    OperationStateError,
    PurgatoryClosedError,
    PurgatoryError,
    PurgatoryFullError,
    TimerClosedError,
)
from ._latency import Histogram, PurgatoryHistograms
from ._operation import DelayedOperation, Outcome
from ._purgatory import Purgatory, PurgatoryStatistics, WatermarkOperation
from ._timeout import Timeout
from ._timer import Timer, TimerHandle, shared_timer, timeout, timeout_at

if TYPE_CHECKING:
    from . import simulation as simulation

__version__ = "0.1.0"

__all__ = [
    "COMPILED",
    "DelayedOperation",
    "Histogram",
    "OperationStateError",
    "Outcome",
    "Purgatory",
    "PurgatoryClosedError",
    "PurgatoryError",
    "PurgatoryFullError",
    "PurgatoryHistograms",
    "PurgatoryStatistics",
    "Timeout",
    "Timer",
    "TimerClosedError",
    "TimerHandle",
    "WatermarkOperation",
    "__version__",
    "shared_timer",
    "simulation",
    "timeout",
    "timeout_at",
]


def __getattr__(name: str) -> Any:
    # Submodules that are public but not needed by every user load on first access.
    if name == "simulation":
        import importlib

        return importlib.import_module(f"{__name__}.simulation")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
