"""aiopurgatory: Kafka-style delayed operations for asyncio.

A *purgatory* holds delayed operations (requests that cannot finish yet) until a
trigger on one of their watch keys completes them or their timeout expires.
Expiry runs on a hierarchical timing wheel driven by one ``loop.call_at`` handle.

Everything public is importable from here::

    import aiopurgatory as ap
"""

from typing import TYPE_CHECKING

from ._compiled import COMPILED
from ._errors import (
    OperationStateError,
    PurgatoryClosedError,
    PurgatoryError,
    PurgatoryFullError,
    TimerClosedError,
    TriggersClosedError,
)
from ._histograms import Histogram, PurgatoryHistograms
from ._local import LocalBus, LocalTriggers, LocalTriggersStatistics
from ._namespace import public_dir as _public_dir
from ._operation import DelayedOperation, Outcome
from ._purgatory import Purgatory, PurgatoryStatistics, WatermarkOperation
from ._shared_timer import shared_timer, timeout, timeout_at
from ._timeout import Timeout
from ._timer import Timer
from ._timer_handle import TimerHandle
from ._transport import Triggers, TriggersStatistics

if TYPE_CHECKING:
    from . import simulation as simulation
del TYPE_CHECKING  # the namespace holds the public API only

__version__ = "0.1.0"

__all__ = [
    "COMPILED",
    "DelayedOperation",
    "Histogram",
    "LocalBus",
    "LocalTriggers",
    "LocalTriggersStatistics",
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
    "Triggers",
    "TriggersClosedError",
    "TriggersStatistics",
    "WatermarkOperation",
    "__version__",
    "shared_timer",
    "simulation",
    "timeout",
    "timeout_at",
]


def __getattr__(name: str) -> object:
    # Submodules that are public but not needed by every user load on first access.
    if name == "simulation":
        import importlib

        return importlib.import_module(f"{__name__}.simulation")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__dir__ = _public_dir(__name__, __all__)
