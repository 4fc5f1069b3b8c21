"""The counts behind the histograms (aiopurgatory._duration_counts): the bucket layout, the
bucket of a duration, adding and resetting; on both cores (the suite runs on each).
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiopurgatory import _duration_counts
from aiopurgatory._histograms import BOUNDS
from aiopurgatory.metrics.prometheus import HISTOGRAM_EDGES

UPPER = _duration_counts.upper_bounds()


# -- the layout -----------------------------------------------------------------------


def test_layout_covers_1us_to_a_day_at_most_5_percent_wide() -> None:
    assert len(UPPER) == _duration_counts.BUCKETS == len(BOUNDS)
    assert UPPER[0] == 1_000
    assert UPPER[-1] == -1
    assert BOUNDS[-1] == math.inf
    edges = UPPER[:-1]
    assert edges == sorted(set(edges))
    assert edges[-1] >= 86_400 * 10**9  # at least a day
    for lower, upper in itertools.pairwise(edges):
        assert (upper - lower) / lower <= 0.05 + 1e-12
    # The usual dashboard edges are bucket edges: 1, 2.5 and 5 times a power of ten.
    for exponent in range(-6, 5):
        for mantissa in (1, 2.5, 5):
            assert round(mantissa * 10**exponent * 1e9) in edges
    assert all(round(edge * 1e9) in edges for edge in HISTOGRAM_EDGES[:-1])


@given(st.integers(min_value=0, max_value=2 * 10**14))
def test_bucket_index_agrees_with_the_edges(ns: int) -> None:
    i = _duration_counts.bucket_index(ns)
    assert 0 <= i < _duration_counts.BUCKETS
    lower = UPPER[i - 1] if i else -1
    upper = UPPER[i] if UPPER[i] >= 0 else math.inf
    assert lower < ns <= upper  # closed above, like Prometheus's le


def test_edges_fall_in_the_bucket_they_end() -> None:
    for i, upper in enumerate(UPPER[:-1]):
        assert _duration_counts.bucket_index(upper) == i
        assert _duration_counts.bucket_index(upper + 1) == i + 1


def test_duration_counts_add_and_reset() -> None:
    durations = _duration_counts._DurationCounts()
    for value in (0.0, -1.0, 1e-9, 0.25, 0.25, 1e9):
        durations.add(value)
    count, total, largest, counts = durations.counts()
    assert count == 6
    assert total == pytest.approx(0.5 + 1e9 + 1e-9)
    assert largest == 1e9
    assert counts[0] == 3
    assert counts[_duration_counts.bucket_index(250_000_000)] == 2
    assert counts[-1] == 1
    durations.reset()
    assert durations.counts() == (0, 0.0, 0.0, [0] * _duration_counts.BUCKETS)


def test_histograms_are_compiled_in() -> None:
    assert _duration_counts.compiled_in()
