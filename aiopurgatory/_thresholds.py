"""The threshold index: one key's watchers that wait for its watermark to reach a threshold.

Sans-IO, as the wheel is: no loop, no clock, no purgatory. A purgatory keeps one
:class:`ThresholdIndex` per key watched with thresholds
(``watch(op, {key: threshold})``); :meth:`ThresholdIndex.reach` answers "which
pending operations does this watermark reach", :meth:`~ThresholdIndex.pending`
"which are waiting at all", and the operations themselves are opaque here
(anything but None).

The rules:

* An operation's watch is a :class:`ThresholdEntry` (threshold, watch number,
  op). Entries order by threshold, then by number: a purgatory numbers its
  watches in watch order, so ties are checked in watch order. An entry's
  ``next`` is the caller's: a purgatory chains an operation's entries under
  its several keys through it.
* A watermark only grows (the purgatory calls :meth:`~ThresholdIndex.reach`
  only with a value above the last one). An entry once reached stays reached:
  it is checked by every later reach until its op finishes.
* An op finishes outside this module: the purgatory sets ``entry.op = None`` in
  each of its entries (under every key at once) and calls
  :meth:`~ThresholdIndex.remove` with its threshold here. The stale entry is
  let go lazily, and the index is rebuilt when stale entries outnumber the live
  ones: memory stays within about twice the pending operations, at amortised
  O(1) per operation.
"""

from __future__ import annotations

from bisect import insort
from heapq import heapify, heappop, heappush
from typing import Any

__all__ = ["ThresholdEntry", "ThresholdIndex"]


class ThresholdEntry:
    """One operation's watch of one key with a threshold: ordered by threshold, then number.

    ``op`` is the operation until it finishes, then None (see :class:`ThresholdIndex`).
    ``next`` is the caller's (None when made): the index never reads it. Made by
    :meth:`ThresholdIndex.add`.
    """

    __slots__ = ("next", "number", "op", "threshold")

    next: ThresholdEntry | None
    number: int
    op: Any
    threshold: Any

    def __lt__(self, other: ThresholdEntry) -> bool:
        if self.threshold == other.threshold:
            return self.number < other.number
        return self.threshold < other.threshold  # type: ignore[no-any-return]


def _unfinished(entries: list[ThresholdEntry]) -> list[ThresholdEntry]:
    """The entries of ``entries`` whose op has not finished, in their order."""
    return [entry for entry in entries if entry.op is not None]


class ThresholdIndex:
    """The watchers of one key that watch it with a threshold.

    Each pending one has an :class:`ThresholdEntry`: its threshold on this key, its
    watch's number in its purgatory (in watch order, so ties keep it), and the
    op, until the op finishes: then its entries under every key let go of it
    at once (``op`` None), whatever entries stay behind. ``count`` counts the
    pending ops.

    ``mark`` is the highest value :meth:`reach` was given (None before the
    first): an entry is in ``reached`` if its threshold is at most ``mark``,
    else in ``run`` or ``heap``. ``run`` is a list in ascending order, read
    from ``head`` on, that takes every watch whose threshold is at least the
    last one's (the common case: a produce waits for the offset it was just
    given); ``heap`` takes the others. ``reached`` is in threshold order: a
    reach appends what it pops, all above the old mark; a watch at or below
    the mark is inserted in place (rare: its own check said no). Those are
    checked by every later advance until they finish. The slots of ``run``
    before ``head`` hold None, until the run is compacted.

    The entry of a finished op stays until it is popped or read, or until
    the stale entries outnumber the live ones (then they are rebuilt:
    amortised O(1) per op, at most about twice the live entries). ``live``
    counts the pending ops of ``reached``. Everything is changed in place
    but ``reached``.
    """

    __slots__ = ("count", "head", "heap", "live", "mark", "reached", "run")

    def __init__(self) -> None:
        self.count = 0
        self.run: list[Any] = []  # entries, and None before ``head``
        self.head = 0
        self.heap: list[ThresholdEntry] = []
        self.reached: list[ThresholdEntry] = []
        self.live = 0
        self.mark: Any = None

    def add(self, op: Any, threshold: Any, number: int) -> ThresholdEntry:
        """Watch the key for ``op`` until ``threshold``; ``number`` orders ties.

        Returns:
            The op's entry here: the caller sets its ``op`` to None when the op
            finishes (see :meth:`remove`).
        """
        # Set in place, once per watch: cheaper than a call of ``__init__``.
        entry = ThresholdEntry.__new__(ThresholdEntry)
        entry.threshold = threshold
        entry.number = number
        entry.op = op
        entry.next = None
        self.count += 1
        mark = self.mark
        if mark is not None and entry.threshold <= mark:
            insort(self.reached, entry)
            self.live += 1
            return entry
        run = self.run
        if self.head == len(run):
            if run:
                run.clear()
                self.head = 0
            run.append(entry)
        elif entry.threshold >= run[-1].threshold:
            run.append(entry)
        else:
            heappush(self.heap, entry)
        return entry

    def pending(self) -> list[Any]:
        """The pending ops, in threshold order (ties in watch order)."""
        entries = _unfinished(self.heap)
        entries += _unfinished(self.run[self.head :])
        entries += _unfinished(self.reached)
        entries.sort()
        return [entry.op for entry in entries]

    def reach(self, value: Any) -> list[Any]:
        """Reach every entry whose threshold is at most ``value`` (above ``mark``).

        Returns:
            The pending ops reached, in threshold order: those reached before,
            then those reached now.
        """
        reached = self.reached
        checked = []
        if reached:
            # Read them, and let go of the entries of those that finished.
            kept = []
            for entry in reached:
                op = entry.op
                if op is not None:
                    checked.append(op)
                    kept.append(entry)
            if len(kept) != len(reached):
                self.reached = reached = kept
        self.mark = value
        run = self.run
        head = self.head
        heap = self.heap
        end = len(run)
        if not heap:
            # The common case (thresholds watched in ascending order): straight
            # from the run, already in order.
            while head < end:
                entry = run[head]
                if entry.threshold > value:
                    break
                run[head] = None  # let go of it now (not at the next compaction)
                head += 1
                op = entry.op
                if op is not None:
                    reached.append(entry)
                    checked.append(op)
        else:
            while True:
                if head < end and run[head].threshold <= value:
                    if heap and heap[0] < run[head]:
                        entry = heappop(heap)
                    else:
                        entry = run[head]
                        run[head] = None
                        head += 1
                elif heap and heap[0].threshold <= value:
                    entry = heappop(heap)
                else:
                    break
                op = entry.op
                if op is not None:
                    reached.append(entry)
                    checked.append(op)
        if head == end:
            run.clear()
            head = 0
        elif head > 64 and 2 * head > end:
            del run[:head]
            head = 0
        self.head = head
        self.live = len(reached)
        return checked

    def remove(self, threshold: Any) -> None:
        """Count out a finished op (its entries' ``op`` already None), its threshold here."""
        self.count = count = self.count - 1
        mark = self.mark
        if mark is not None and threshold <= mark:
            self.live = live = self.live - 1
            reached = self.reached
            if len(reached) > 2 * live + 32:
                self.reached = _unfinished(reached)
            return
        waiting = count - self.live
        heap = self.heap
        run = self.run
        if not waiting:
            heap.clear()
            run.clear()
            self.head = 0
        elif len(heap) + len(run) - self.head > 2 * waiting + 32:
            heap[:] = _unfinished(heap)
            heapify(heap)
            run[:] = _unfinished(run[self.head :])
            self.head = 0
