"""Hypothesis stateful test: the timing wheel against a heap model.

The model is the obvious correct timer: a heap of (tick, sequence, entry) plus a
set of removed entries, popped up to the clock on every advance. The wheel must
agree with it on every step: each kept entry comes out exactly once, never before
its tick and at the first advance whose ``now`` reaches it (in driver terms: at
most one tick late, since the driver advances to the rounded-down clock); removed
entries never come out; ``len(wheel)`` is the number of pending entries.
"""

from __future__ import annotations

import heapq
from itertools import count

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from aiopurgatory._wheel import Entry, TimingWheel


class Item(Entry):
    __slots__ = ("serial",)

    def __init__(self, tick: int, serial: int) -> None:
        super().__init__()
        self._tick = tick
        self.serial = serial

    def __repr__(self) -> str:
        return f"Item(tick={self._tick}, serial={self.serial})"


# Deadlines relative to the clock: mostly near, sometimes several levels away
# (wheel sizes are small, so 10**6 ticks is 7+ levels up for size 6).
offsets = st.one_of(
    st.integers(-3, 25),
    st.integers(26, 2_000),
    st.integers(2_000, 10**7),
)
steps = st.one_of(st.integers(0, 5), st.integers(5, 300), st.integers(300, 3 * 10**6))


class WheelMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.wheel = TimingWheel(2)
        self.now = 0
        self.heap: list[tuple[int, int, Item]] = []
        self.pending: dict[int, Item] = {}  # serial -> entry, in the wheel
        self.gone: dict[int, Item] = {}  # serial -> removed or fired entry
        self.serials = count()

    @initialize(wheel_size=st.integers(2, 8), start=st.integers(-(10**6), 10**6))
    def start(self, wheel_size: int, start: int) -> None:
        self.wheel = TimingWheel(wheel_size, start)
        self.now = start

    @rule(offset=offsets)
    def add(self, offset: int) -> None:
        serial = next(self.serials)
        item = Item(self.now + offset, serial)
        inserted = self.wheel.add(item)
        assert inserted == (offset > 0), "only entries after the clock go in"
        if inserted:
            heapq.heappush(self.heap, (self.now + offset, serial, item))
            self.pending[serial] = item

    @precondition(lambda self: self.pending)
    @rule(pick=st.integers(0, 10**9))
    def remove_pending(self, pick: int) -> None:
        serials = sorted(self.pending)
        serial = serials[pick % len(serials)]
        item = self.pending.pop(serial)
        TimingWheel.remove(item)
        self.gone[serial] = item

    @precondition(lambda self: self.gone)
    @rule(pick=st.integers(0, 10**9))
    def remove_gone_is_a_no_op(self, pick: int) -> None:
        serials = sorted(self.gone)
        TimingWheel.remove(self.gone[serials[pick % len(serials)]])

    @rule(step=steps)
    def advance(self, step: int) -> None:
        previous = self.now
        self.now += step
        out = self.wheel.advance(self.now)
        expected: list[Item] = []
        while self.heap and self.heap[0][0] <= self.now:
            _, serial, item = heapq.heappop(self.heap)
            if serial in self.pending:
                expected.append(self.pending.pop(serial))
                self.gone[serial] = item
        assert sorted(id(e) for e in out) == sorted(id(e) for e in expected)
        ticks = [e._tick for e in out]
        assert ticks == sorted(ticks), "entries come out in tick order"
        for entry in out:
            assert entry._tick is not None
            assert previous < entry._tick <= self.now, "at the first advance reaching it"
            assert entry._bucket is None

    @rule(back=st.integers(1, 1_000))
    def advance_backwards_is_a_no_op(self, back: int) -> None:
        assert self.wheel.advance(self.now - back) == []
        assert self.wheel.current == self.now

    @invariant()
    def sizes_agree(self) -> None:
        assert len(self.wheel) == len(self.pending)

    @invariant()
    def next_expiration_bounds_the_earliest_pending_entry(self) -> None:
        expiration = self.wheel.next_expiration()
        if not self.pending:
            assert expiration is None
            return
        earliest = min(e._tick or 0 for e in self.pending.values())
        assert expiration is not None
        assert expiration <= earliest  # a bucket never expires after its entries

    @invariant()
    def clock_follows_the_driver(self) -> None:
        assert self.wheel.current == self.now


WheelMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestWheelAgainstHeap = WheelMachine.TestCase
