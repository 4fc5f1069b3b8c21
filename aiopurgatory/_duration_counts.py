"""Always-on duration histograms: O(1) recording with no allocation (compiled core).

A :class:`_DurationCounts` counts durations (seconds) in fixed log-linear buckets, in
the style of HdrHistogram, but with decimal bucket edges so that the usual
dashboard boundaries (1, 2.5 and 5 times a power of ten seconds) are edges:

* durations are rounded to whole nanoseconds;
* bucket 0 holds everything up to 1 us;
* each decade from 1 us to 1e5 s (about 27.8 hours) is split linearly in three
  parts: [1, 2) into 20 buckets 0.05 wide, [2, 5) into 30 buckets 0.1 wide and
  [5, 10) into 20 buckets 0.25 wide (times the decade's power of ten), so no
  bucket is wider than 5% of its lower edge: 70 buckets per decade;
* the last bucket holds everything above 1e5 s.

Buckets are closed above, like Prometheus's ``le``: a duration equal to an edge
is counted in the bucket that ends there. 772 buckets in all (6 KiB of counts).

Recording reads nothing but its argument, touches one bucket and two totals,
and in the compiled core is plain C (no Python object made). Reading
(:meth:`_DurationCounts.counts`) copies the counts; it may run on another thread than
the one recording (a metrics scrape): in the compiled core a record holds the
GIL from start to end, so a copy never sees half of one.
"""

from __future__ import annotations

from array import array
from typing import Final

__all__ = ["BUCKETS", "HISTOGRAMS", "bucket_index", "compiled_in", "upper_bounds"]

# Whether finished operations are counted in the histograms, declared here only
# (the purgatory's core imports it). Compiled with the C macro
# AIOPURGATORY_HISTOGRAMS=0 (setup.py, env AIOPURGATORY_NO_HISTOGRAMS=1), the
# compiled core counts nothing: the purgatory's counting code is left out by the
# C compiler. Only for measuring what the histograms cost; the pure-Python core
# always counts.
HISTOGRAMS = True

# Nanoseconds: the first decade starts at 1 us, the last ends at 1e5 s.
_FIRST: Final = 1_000
_LAST: Final = 100_000_000_000_000
# Powers of ten past 2**31, as named constants: C long longs in the compiled
# core (there, literals this large would be Python ints, compared as objects).
_E10: Final = 10**10
_E11: Final = 10**11
_E12: Final = 10**12
_E13: Final = 10**13
_PER_DECADE: Final = 70
_DECADES: Final = 11
#: Number of buckets: up to 1 us, 11 decades of 70, above 1e5 s.
BUCKETS: Final = 2 + _DECADES * _PER_DECADE
_OVERFLOW: Final = BUCKETS - 1


def compiled_in() -> bool:
    """False only in a compiled core built without histograms (for cost measurements)."""
    return bool(HISTOGRAMS)


def bucket_index(ns: int) -> int:
    """The bucket of a duration of ``ns`` nanoseconds (``ns <= 1000`` is bucket 0)."""
    u = ns - 1  # buckets are closed above: u = ns - 1 is in a half-open [lo, hi)
    if u < _FIRST:
        return 0
    if u >= _LAST:
        return _OVERFLOW
    # The decade [p, 10 p) holding u, by a binary search over the 11 of them.
    if u < 1_000_000_000:
        if u < 1_000_000:
            if u < 10_000:
                p = 1_000
                d = 0
            elif u < 100_000:
                p = 10_000
                d = 1
            else:
                p = 100_000
                d = 2
        elif u < 10_000_000:
            p = 1_000_000
            d = 3
        elif u < 100_000_000:
            p = 10_000_000
            d = 4
        else:
            p = 100_000_000
            d = 5
    elif u < _E12:
        if u < _E10:
            p = 1_000_000_000
            d = 6
        elif u < _E11:
            p = _E10
            d = 7
        else:
            p = _E11
            d = 8
    elif u < _E13:
        p = _E12
        d = 9
    else:
        p = _E13
        d = 10
    q = u * 20 // p  # 20 .. 199: twentieths of the decade's power of ten
    if q < 40:
        j = q - 20
    elif q < 100:
        j = 20 + (q - 40) // 2
    else:
        j = 50 + (q - 100) // 5
    return 1 + d * _PER_DECADE + j


def upper_bounds() -> list[int]:
    """The upper edge of every bucket in nanoseconds (inclusive); -1 for the last (no edge)."""
    bounds = [_FIRST]
    p = _FIRST
    for _ in range(_DECADES):
        step = p // 20
        bounds.extend(q * step for q in range(21, 41))  # [1, 2) by 0.05
        bounds.extend(q * step for q in range(42, 101, 2))  # [2, 5) by 0.1
        bounds.extend(q * step for q in range(105, 201, 5))  # [5, 10) by 0.25
        p *= 10
    bounds.append(-1)
    return bounds


class _DurationCounts:
    """Counts of durations in the buckets above, with their count, sum and maximum."""

    __slots__ = ("_array", "_counts", "_max", "_sum")

    def __init__(self) -> None:
        self._array = array("q", bytes(8 * BUCKETS))
        # The same storage; in the compiled core a typed view of it.
        self._counts = self._array
        self._sum = 0.0
        self._max = 0.0

    def add(self, seconds: float) -> None:
        """Count one duration (seconds; negative counts as 0)."""
        if seconds > 0.0:
            if seconds <= 1e5:
                i = bucket_index(int(seconds * 1e9 + 0.5))
            else:
                i = _OVERFLOW
            self._sum += seconds
            if seconds > self._max:
                self._max = seconds
        else:
            i = 0
        self._counts[i] += 1

    def counts(self) -> tuple[int, float, float, list[int]]:
        """``(count, sum, max, counts per bucket)``, copied."""
        counts = self._array.tolist()
        # The count from the copy itself: consistent with the buckets even if a
        # pure-Python record was interrupted between the bucket and the total.
        return sum(counts), self._sum, self._max, counts

    def reset(self) -> None:
        """Forget everything recorded so far."""
        self._array = array("q", bytes(8 * BUCKETS))
        self._counts = self._array
        self._sum = 0.0
        self._max = 0.0
