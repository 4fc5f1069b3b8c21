"""The threshold index (aiopurgatory._thresholds) on its own: no loop, no purgatory.

Operations are plain objects here: the index treats them as opaque, and a
finished one is what the purgatory makes of it (its entries' ``op`` set to
None, then :meth:`ThresholdIndex.remove` with its threshold).
"""

from __future__ import annotations

from aiopurgatory._thresholds import ThresholdEntry, ThresholdIndex


def _finish(index: ThresholdIndex, entry: ThresholdEntry) -> None:
    threshold = entry.threshold
    entry.op = None
    index.remove(threshold)


def test_entries_order_by_threshold_then_watch_number() -> None:
    index = ThresholdIndex()
    later = index.add("later", 5, 2)
    earlier = index.add("earlier", 5, 1)
    lower = index.add("lower", 3, 3)
    assert sorted([later, earlier, lower]) == [lower, earlier, later]
    assert index.pending() == ["lower", "earlier", "later"]


def test_add_returns_the_entry_holding_the_op() -> None:
    index = ThresholdIndex()
    entry = index.add("op", 7, 1)
    assert (entry.op, entry.threshold, entry.number) == ("op", 7, 1)
    assert index.count == 1


def test_reach_returns_what_the_watermark_reaches_in_threshold_order() -> None:
    index = ThresholdIndex()
    for number, threshold in enumerate([10, 2, 7, 2, 30], start=1):
        index.add(f"op{number}", threshold, number)
    assert index.reach(1) == []
    assert index.reach(7) == ["op2", "op4", "op3"]
    # Reached ones are checked again by every later reach until they finish.
    assert index.reach(10) == ["op2", "op4", "op3", "op1"]
    assert index.mark == 10
    assert index.pending() == ["op2", "op4", "op3", "op1", "op5"]


def test_a_watch_at_or_below_the_mark_is_reached_at_once() -> None:
    index = ThresholdIndex()
    index.add("high", 10, 1)
    assert index.reach(5) == []
    index.add("low", 4, 2)
    index.add("at", 5, 3)
    assert index.live == 2
    assert index.reach(6) == ["low", "at"]


def test_finished_ops_are_never_returned() -> None:
    index = ThresholdIndex()
    entries = [index.add(f"op{n}", n, n) for n in range(1, 6)]
    assert index.reach(2) == ["op1", "op2"]
    _finish(index, entries[0])  # reached
    _finish(index, entries[3])  # waiting
    assert index.count == 3
    assert index.reach(5) == ["op2", "op3", "op5"]
    assert index.pending() == ["op2", "op3", "op5"]


def test_the_last_finished_op_leaves_nothing_waiting() -> None:
    index = ThresholdIndex()
    entries = [index.add(n, n, n) for n in range(1, 50)]
    for entry in entries:
        _finish(index, entry)
    assert index.count == 0
    assert (index.run, index.heap, index.head) == ([], [], 0)
    assert index.pending() == []


def test_stale_entries_are_dropped_once_they_outnumber_the_live_ones() -> None:
    index = ThresholdIndex()
    # Descending thresholds: all but the first go to the heap.
    entries = [index.add(n, 1000 - n, n) for n in range(400)]
    for entry in entries[:300]:
        _finish(index, entry)
    assert index.count == 100
    assert len(index.heap) + len(index.run) - index.head <= 2 * 100 + 32
    reached = index.reach(1000)
    assert reached == sorted(reached, reverse=True)
    assert len(reached) == 100
    for entry in entries[300:350]:
        _finish(index, entry)
    assert len(index.reached) <= 2 * index.live + 32


def test_ascending_watches_are_read_from_the_run_and_compacted() -> None:
    index = ThresholdIndex()
    for n in range(200):
        index.add(n, n, n)
    assert index.heap == []  # ascending: every watch went to the run
    assert len(index.reach(150)) == 151
    # More than half of the run was consumed: it was compacted.
    assert index.head == 0
    assert len(index.run) == 49
