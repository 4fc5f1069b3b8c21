"""Hypothesis stateful test: one key's threshold index against a sorted-list model.

The model is the obvious index: every watch as (threshold, number, op) with a
"finished" flag. ``reach(v)`` (the purgatory calls it only with ``v`` above the
last one) must return exactly the unfinished watches with a threshold at most
``v``, in (threshold, number) order; ``pending()`` every unfinished watch in
that order; ``count`` how many are unfinished. Finishing an op is what the
purgatory does: its entry's ``op`` set to None, then ``remove(threshold)``.
Thresholds are drawn from a small range (many ties) as ints or floats, and
numbers increase as a purgatory gives them, so a watch at or below the mark
(its own check said no) and out-of-order watches (the heap) both occur. After
every step the index holds at most a bounded multiple of the live entries.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from aiopurgatory._thresholds import ThresholdEntry, ThresholdIndex

thresholds = st.one_of(st.integers(-5, 40), st.integers(-10, 80).map(lambda n: n / 2))


@dataclasses.dataclass
class Watch:
    threshold: float
    number: int
    op: str
    entry: ThresholdEntry
    finished: bool = False


class ThresholdMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.index = ThresholdIndex()
        self.watches: list[Watch] = []
        self.number = 0
        self.mark: float | None = None

    def _unfinished(self, limit: float | None = None) -> list[str]:
        live = [
            w for w in self.watches if not w.finished and (limit is None or w.threshold <= limit)
        ]
        live.sort(key=lambda w: (w.threshold, w.number))
        return [w.op for w in live]

    @rule(threshold=thresholds)
    def add(self, threshold: float) -> None:
        self.number += 1
        op = f"op{self.number}"
        entry = self.index.add(op, threshold, self.number)
        assert entry.op == op
        self.watches.append(Watch(threshold, self.number, op, entry))

    @rule(threshold=thresholds, n=st.integers(2, 40))
    def add_many_ascending(self, threshold: float, n: int) -> None:
        for i in range(n):
            self.add(threshold + i)

    @rule(value=thresholds)
    def reach(self, value: float) -> None:
        if self.mark is not None and not value > self.mark:
            return  # the purgatory never calls it so: the watermark only grows
        self.mark = value
        assert self.index.reach(value) == self._unfinished(value)
        assert self.index.mark == value

    @precondition(lambda self: any(not w.finished for w in self.watches))
    @rule(pick=st.integers(0, 10**9), burst=st.integers(1, 30))
    def finish(self, pick: int, burst: int) -> None:
        live = [w for w in self.watches if not w.finished]
        start = pick % len(live)
        for watch in live[start : start + burst]:
            watch.finished = True
            watch.entry.op = None
            self.index.remove(watch.threshold)

    @invariant()
    def pending_in_threshold_order(self) -> None:
        assert self.index.pending() == self._unfinished()

    @invariant()
    def counts_agree(self) -> None:
        live = [w for w in self.watches if not w.finished]
        assert self.index.count == len(live)
        if self.mark is not None:
            reached = [w for w in live if w.threshold <= self.mark]
            assert self.index.live == len(reached)

    @invariant()
    def memory_is_bounded_by_the_live_entries(self) -> None:
        index = self.index
        held = len(index.heap) + len(index.run) - index.head + len(index.reached)
        assert held <= 3 * index.count + 64, (held, index.count)
        assert all(entry is None for entry in index.run[: index.head])


ThresholdMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestThresholdIndexAgainstSortedList = ThresholdMachine.TestCase
