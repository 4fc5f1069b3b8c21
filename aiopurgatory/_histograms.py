"""Snapshots of a purgatory's histograms: :class:`Histogram`, :class:`PurgatoryHistograms`.

The purgatory records, for every operation that finishes, how long it waited
(from ``try_complete_else_watch`` to the end) in one histogram per outcome, and
for every expiry fired by the timer how late it fired (fired instant minus
deadline). Recording is always on and costs O(1) with no allocation (see
:mod:`aiopurgatory._duration_counts` for the bucket layout). :meth:`Purgatory.histograms()
<aiopurgatory.Purgatory.histograms>` copies them into the immutable snapshots
here, which compute percentiles, merge across purgatories (``+``) and give the
change over an interval (``later - earlier``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from ._duration_counts import BUCKETS, upper_bounds
from ._operation import Outcome

__all__ = ["Histogram", "PurgatoryHistograms"]

_UPPER_NS: Final = upper_bounds()
#: Upper edge (inclusive) of every bucket, in seconds; ``inf`` for the last one.
BOUNDS: Final = tuple(math.inf if ns < 0 else ns / 1e9 for ns in _UPPER_NS)
_EDGE_INDEX: Final = {ns: i for i, ns in enumerate(_UPPER_NS) if ns >= 0}


@dataclass(frozen=True, slots=True)
class Histogram:
    """An immutable snapshot of a distribution of durations, in seconds.

    Durations are counted in fixed log-linear buckets from 1 us to 1e5 s (about
    28 hours) that are at most 5% wide (relative to their lower edge), with
    decimal edges: 1, 2.5 and 5 times any power of ten seconds from 1e-6 on
    are edges. A bucket includes its upper edge (as Prometheus's ``le``). So a
    percentile read from a snapshot is the upper edge of the bucket that holds
    the true value, at most 5% above it (never above :attr:`max`); on virtual
    time, where durations are exact, it is exact to the bucket.

    Snapshots add up (``a + b``: the histogram of both, for merging purgatories
    or processes) and subtract (``later - earlier``: what was recorded in
    between, for per-interval figures without resetting anything).
    """

    #: Number of durations recorded.
    count: int
    #: Their sum, in seconds.
    sum: float
    #: The largest one, in seconds (0.0 when empty). After a subtraction: the
    #: upper edge of the highest non-empty bucket, capped by the later maximum.
    max: float
    #: Count per bucket; bucket ``i`` ends at ``Histogram.BOUNDS[i]`` (inclusive).
    buckets: tuple[int, ...]

    #: The upper edge (seconds, inclusive) of every bucket; the last is ``inf``.
    BOUNDS = BOUNDS

    @classmethod
    def empty(cls) -> Histogram:
        """A histogram with nothing recorded."""
        return cls(0, 0.0, 0.0, (0,) * BUCKETS)

    @property
    def mean(self) -> float:
        """The mean duration in seconds; NaN when empty."""
        return self.sum / self.count if self.count else math.nan

    def quantile(self, q: float) -> float:
        """The ``q``-quantile (0 <= q <= 1) in seconds: the upper edge of its bucket.

        The value of rank ``ceil(q * count)`` (at least 1) lies in the bucket
        whose upper edge is returned, capped at :attr:`max`. NaN when empty.

        Raises:
            TypeError: ``q`` is not a number.
            ValueError: ``q`` is not within [0, 1].
        """
        if isinstance(q, bool) or not isinstance(q, int | float):
            raise TypeError(f"q must be a number, got {type(q).__name__}")
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be within [0, 1], got {q!r}")
        if not self.count:
            return math.nan
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for i, n in enumerate(self.buckets):
            seen += n
            if seen >= rank:
                return min(BOUNDS[i], self.max)
        return self.max  # pragma: no cover - count is the sum of the buckets

    @property
    def p50(self) -> float:
        """The median (see :meth:`quantile`)."""
        return self.quantile(0.5)

    @property
    def p90(self) -> float:
        """The 90th percentile (see :meth:`quantile`)."""
        return self.quantile(0.9)

    @property
    def p99(self) -> float:
        """The 99th percentile (see :meth:`quantile`)."""
        return self.quantile(0.99)

    @property
    def p999(self) -> float:
        """The 99.9th percentile (see :meth:`quantile`)."""
        return self.quantile(0.999)

    def cumulative(self, edges: Sequence[float]) -> list[int]:
        """How many durations were at most each of ``edges`` (seconds), exactly.

        Each edge must be a bucket edge (any 1, 2.5 or 5 times a power of ten
        from 1e-6 to 1e5 s is); ``inf`` counts everything. For Prometheus-style
        ``le`` buckets.

        Raises:
            ValueError: an edge is not a bucket edge.
        """
        totals = []
        running = 0
        upto = 0
        buckets = self.buckets
        for edge in edges:
            if edge == math.inf:
                end = len(buckets)
            else:
                ns = round(edge * 1e9)
                end = _EDGE_INDEX.get(ns, -1) + 1
                if not end or not math.isclose(edge * 1e9, ns, rel_tol=1e-9):
                    raise ValueError(f"edges: {edge!r} is not a bucket edge")
            if end > upto:
                running += sum(buckets[upto:end])
                upto = end
            totals.append(running)
        return totals

    def __add__(self, other: Histogram) -> Histogram:
        if not isinstance(other, Histogram):
            return NotImplemented
        return Histogram(
            self.count + other.count,
            self.sum + other.sum,
            max(self.max, other.max),
            tuple(a + b for a, b in zip(self.buckets, other.buckets, strict=True)),
        )

    def __sub__(self, earlier: Histogram) -> Histogram:
        if not isinstance(earlier, Histogram):
            return NotImplemented
        buckets = tuple(a - b for a, b in zip(self.buckets, earlier.buckets, strict=True))
        if any(n < 0 for n in buckets):
            raise ValueError("the subtracted histogram is not an earlier snapshot of this one")
        top = max((i for i, n in enumerate(buckets) if n), default=-1)
        return Histogram(
            self.count - earlier.count,
            self.sum - earlier.sum if top >= 0 else 0.0,
            min(BOUNDS[top], self.max) if top >= 0 else 0.0,
            buckets,
        )

    def __repr__(self) -> str:
        if not self.count:
            return "Histogram(count=0)"
        return (
            f"Histogram(count={self.count}, mean={self.mean:.6g}, p50={self.p50:.6g}, "
            f"p99={self.p99:.6g}, max={self.max:.6g})"
        )


@dataclass(frozen=True, slots=True)
class PurgatoryHistograms:
    """A snapshot of one purgatory's histograms (from :meth:`Purgatory.histograms`).

    Waits are measured from the ``try_complete_else_watch`` (or ``watch``) call
    to the instant the operation finished, on the loop's clock; an operation
    completed by that first call waited 0. Lateness is the instant an expiry
    fired minus the operation's deadline, for every expiry fired by the timer
    (``close(expire_pending=True)`` expires before the deadline: counted in
    :attr:`expired`, not in :attr:`lateness`).
    """

    #: The purgatory's name (names joined by ``+`` after merging).
    name: str
    #: Waits of operations that completed.
    completed: Histogram
    #: Waits of operations that expired (their timeout plus the lateness).
    expired: Histogram
    #: Waits of operations that were cancelled.
    cancelled: Histogram
    #: Waits of operations whose ``try_complete`` raised.
    failed: Histogram
    #: How late each expiry fired after its deadline.
    lateness: Histogram

    def wait(self, outcome: Outcome | None = None) -> Histogram:
        """The wait histogram of one outcome, or of all of them (None)."""
        if outcome is None:
            return self.completed + self.expired + self.cancelled + self.failed
        if not isinstance(outcome, Outcome):
            raise TypeError(f"outcome must be an Outcome or None, got {type(outcome).__name__}")
        result: Histogram = getattr(self, outcome.value)
        return result

    def __add__(self, other: PurgatoryHistograms) -> PurgatoryHistograms:
        if not isinstance(other, PurgatoryHistograms):
            return NotImplemented
        return PurgatoryHistograms(
            f"{self.name}+{other.name}",
            self.completed + other.completed,
            self.expired + other.expired,
            self.cancelled + other.cancelled,
            self.failed + other.failed,
            self.lateness + other.lateness,
        )

    def __sub__(self, earlier: PurgatoryHistograms) -> PurgatoryHistograms:
        if not isinstance(earlier, PurgatoryHistograms):
            return NotImplemented
        return PurgatoryHistograms(
            self.name,
            self.completed - earlier.completed,
            self.expired - earlier.expired,
            self.cancelled - earlier.cancelled,
            self.failed - earlier.failed,
            self.lateness - earlier.lateness,
        )

    @staticmethod
    def merge(snapshots: Iterable[PurgatoryHistograms], name: str) -> PurgatoryHistograms:
        """The histograms of several purgatories (or processes) as one, named ``name``."""
        empty = Histogram.empty()
        total = PurgatoryHistograms(name, empty, empty, empty, empty, empty)
        for snapshot in snapshots:
            total = total + snapshot
        return PurgatoryHistograms(
            name, total.completed, total.expired, total.cancelled, total.failed, total.lateness
        )
