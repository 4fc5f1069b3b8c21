"""What a replay replays: its parameter sets and its operation.

:class:`ReplayParams` is one scenario of a what-if sweep (:func:`parse_sweep`
makes every combination of lists); :class:`ReplayedProduce` is the produce
request each trace row becomes in the purgatory. The replay itself is in
:mod:`aiopurgatory.pipeline.replay_core`, which re-exports both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .._operation import DelayedOperation

__all__ = ["ReplayParams", "ReplayedProduce", "parse_sweep"]


def _positive_float(value: object, name: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class ReplayParams:
    """One parameter set of a replay (one scenario of a what-if sweep).

    Args:
        timeout: produce timeout in seconds (``request.timeout.ms``), >= 0.
        min_insync: replicas, the leader included, that must have an
            ``acks=all`` write before it completes; >= 1.
        tick: the purgatory timer's tick in seconds, > 0.
        wheel_size: slots per timing-wheel level, >= 2.

    Raises:
        TypeError: a field has the wrong type.
        ValueError: a field is out of range.
    """

    timeout: float = 30.0
    min_insync: int = 2
    tick: float = 0.001
    wheel_size: int = 20

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "timeout", _positive_float(self.timeout, "timeout", allow_zero=True)
        )
        object.__setattr__(self, "tick", _positive_float(self.tick, "tick"))
        for name, low in (("min_insync", 1), ("wheel_size", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < low:
                raise ValueError(f"{name} must be at least {low}, got {value}")

    @property
    def label(self) -> str:
        """The scenario name in the fact table: ``timeout=0.5 min_insync=2 tick=0.001``."""
        label = f"timeout={self.timeout:g} min_insync={self.min_insync} tick={self.tick:g}"
        if self.wheel_size != 20:
            label += f" wheel_size={self.wheel_size}"
        return label


def parse_sweep(
    timeouts: str, min_insyncs: str, ticks: str, wheel_sizes: str = "20"
) -> list[ReplayParams]:
    """Every combination of comma-separated parameter lists, in the order given.

    Args:
        timeouts: e.g. ``"0.5,1,30"`` (seconds).
        min_insyncs: e.g. ``"2,3"``.
        ticks: e.g. ``"0.001"`` (seconds).
        wheel_sizes: e.g. ``"20"``.

    Raises:
        ValueError: an item is not a number or out of range; a list is empty.
    """

    def items(text: str, name: str, convert: type[float] | type[int]) -> list[Any]:
        values = []
        for item in text.split(","):
            item = item.strip()
            try:
                values.append(convert(item))
            except ValueError:
                raise ValueError(f"{name}: {item!r} is not a valid {convert.__name__}") from None
        if not values:
            raise ValueError(f"{name} must list at least one value")
        return values

    sets = [
        ReplayParams(timeout=t, min_insync=m, tick=k, wheel_size=w)
        for t in items(timeouts, "timeout", float)
        for m in items(min_insyncs, "min_insync", int)
        for k in items(ticks, "tick", float)
        for w in items(wheel_sizes, "wheel_size", int)
    ]
    return list(dict.fromkeys(sets))


class ReplayedProduce(DelayedOperation):
    """A replayed produce request: completes once ``required`` replicas have it.

    Args:
        timeout: seconds until expiry once watched.
        op_id: the trace's ``request_id`` (recorded as the event's ``op_id``).
        required: replicas needed, the leader included; the leader's own write
            counts at once.
        order: the request's position in the replay (arrival, then request id);
            ops expiring at the same instant are recorded in this order.
    """

    __slots__ = ("acked", "op_id", "order", "required")

    def __init__(self, timeout: float, op_id: int, required: int, order: int = 0) -> None:
        super().__init__(timeout)
        self.op_id = op_id
        self.required = required
        self.order = order
        self.acked = 1

    def try_complete(self) -> bool:
        """Complete if enough replicas have acknowledged."""
        if self.acked >= self.required:
            return self.force_complete()
        return False
