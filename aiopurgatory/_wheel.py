"""A sans-IO hierarchical timing wheel in integer ticks.

This module knows nothing about event loops, clocks or seconds. Callers convert
their deadlines to integer *ticks* (rounding up, so nothing is ever early), feed
entries in with :meth:`TimingWheel.add`, take them out with
:meth:`TimingWheel.remove`, and ask :meth:`TimingWheel.advance` which entries are
due at a given tick.

The rules, after Kafka's ``TimingWheel``:

* Level 0 has buckets one tick wide; level ``n`` has buckets ``wheel_size**n``
  ticks wide, so it spans ``wheel_size**(n+1)`` ticks. A level is created the
  first time a deadline does not fit in the levels below (lazily, so a wheel that
  only ever sees short deadlines never has more than one level).
* An entry with deadline ``e`` goes to the lowest level ``n`` where
  ``e < current_n + span_n``, in bucket ``(e // width_n) % wheel_size``.
  ``e <= current_0`` means the entry is already due: it is not inserted and
  ``add`` returns False.
* Only *buckets* go into the priority queue (a heap), never entries. Unlike
  Kafka, a bucket is keyed by the earliest tick added to it since it was queued
  (``first``), not by its nominal expiration: a bucket ``[400, 800)`` holding one
  entry at 733 is due at 733, not at 400. Sparse timers then cost one wake-up
  each instead of one per level they cascade through, which is what makes hours
  of virtual time cheap. An add below a bucket's ``first`` pushes the bucket again
  with the smaller key (the old heap item goes stale); that happens at most once
  per distinct tick of the bucket, so the heap stays bounded by ticks, not
  entries: remove is O(1), add is O(1) except that heap push (O(log queued)).
* When a bucket is due (``first <= now``), the clock moves to its ``first``
  (each level rounding down to its own width) and every entry in it is re-added:
  those now due are returned, the rest cascade to a finer level. Buckets are
  processed in key order, so no unprocessed bucket has a key below the clock,
  and a bucket's key is below the end of its slot: no level's clock ever passes
  a slot that still holds entries, so slots never wrap onto them. Entries come
  out ordered by tick (not ordered within a tick). After removals ``first`` may
  be below every remaining entry: the bucket is then processed early and simply
  cascades, never late.
* Buckets are dicts keyed by ``id(entry)``: O(1) insert and delete, insertion
  order kept, and no reliance on the entry's own ``__hash__``/``__eq__`` (a
  delayed operation subclass may well define ``__eq__``). The key is computed
  once per entry and kept in ``entry._id_key``, so that other indexes of the same
  entry (a purgatory's watch lists) can share the one int object. We measured a dict per
  bucket against an intrusive doubly linked list of slotted nodes: the dict is
  faster in CPython for both add and remove, and needs no sentinel.
* A bucket emptied by removals stays in the heap until it reaches the top; then
  :meth:`next_expiration` drops it (lazy deletion, amortised O(1)). The driver
  that owns the clock disarms itself when nothing is pending, so an emptied
  bucket never causes an idle wake-up.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Any, Final

__all__ = ["Bucket", "Entry", "TimingWheel"]

# Ticks are C long longs in the compiled build: timers refuse deadlines past
# 2**62 ticks either way, and a level's span (and so its end) saturates here,
# as no tick can reach it.
_TICK_MAX: Final = 2**63 - 1
# A bucket's ``first`` while it is not queued: above every tick, so that an add
# to it always queues it, with one comparison.
_NOT_QUEUED: Final = _TICK_MAX


class Entry:
    """Base of anything stored in a wheel.

    ``_tick`` is the deadline in ticks, set by the caller before :meth:`TimingWheel.add`
    (an int always; what it means outside the wheel is the caller's business: a
    timer keeps its entries' states apart, see :mod:`aiopurgatory._timer_entry`).
    ``_bucket`` is the dict holding the entry while it sits in a bucket, else None.
    ``_id_key`` (its identity key) is ``id(entry)`` once the entry has been given one (0 before; no
    object has id 0): its key in a bucket.
    """

    __slots__ = ("_bucket", "_id_key", "_tick")

    def __init__(self) -> None:
        self._tick = 0
        self._bucket: dict[int, Entry] | None = None
        self._id_key = 0

    def __reduce_ex__(self, protocol: object) -> Any:
        # A copy would share the original's identity key and bucket, and an
        # operation's copy its purgatory's watch lists: refused, in both builds
        # (the compiled one could not copy a subclass's own slots anyway).
        raise TypeError(f"{type(self).__name__} objects cannot be pickled or copied")


class Bucket:
    """One slot of one level: its entries and its heap key."""

    __slots__ = ("entries", "first")

    def __init__(self) -> None:
        self.entries: dict[int, Entry] = {}
        # The heap key: the earliest tick added since queued; _NOT_QUEUED while not queued.
        self.first: int = _NOT_QUEUED


class _Level:
    __slots__ = ("buckets", "current", "end", "span", "width")

    def __init__(self, width: int, wheel_size: int, current: int) -> None:
        self.width = width
        # Saturated (see _TICK_MAX): a level spanning more than any tick is the last.
        self.span = width * wheel_size if width <= _TICK_MAX // wheel_size else _TICK_MAX
        self.current = current - current % width
        # Deadlines below ``end`` fit this level (kept with ``current``: add() is hot).
        self.end = _end(self.current, self.span)
        self.buckets = [Bucket() for _ in range(wheel_size)]


def _end(current: int, span: int) -> int:
    """``current + span``, saturated at _TICK_MAX (no overflow in the compiled build).

    A saturated span ends at _TICK_MAX too: its level takes every later tick
    (its slots may then alias, which costs a cascade, never a wrong result:
    a bucket runs at the earliest tick added to it).
    """
    if span == _TICK_MAX or (current > 0 and span > _TICK_MAX - current):
        return _TICK_MAX
    return current + span


class TimingWheel:
    """Hierarchical timing wheel over integer ticks (sans-IO).

    Args:
        wheel_size: buckets per level, at least 2.
        start: the tick the wheel's clock starts at.
    """

    __slots__ = ("_levels", "_pushes", "_queue", "current", "wheel_size")

    def __init__(self, wheel_size: int = 20, start: int = 0) -> None:
        # The one check of a wheel size (a Timer's wheel_size comes here as given).
        if isinstance(wheel_size, bool) or not isinstance(wheel_size, int):
            raise TypeError(f"wheel_size must be an int, got {type(wheel_size).__name__}")
        if wheel_size < 2:
            raise ValueError(f"wheel_size must be at least 2, got {wheel_size}")
        wheel_size = int(wheel_size)
        self.wheel_size = wheel_size
        #: Level 0's clock: entries with a deadline at or before it are due.
        self.current = start
        self._levels: list[_Level] = [_Level(1, wheel_size, start)]
        # Heap of (first, sequence, bucket); an item whose key is no longer its
        # bucket's ``first`` is stale. The push count keeps the order of equal keys
        # deterministic and spares comparing Bucket objects.
        self._queue: list[tuple[int, int, Bucket]] = []
        self._pushes = 0

    def restart(self, start: int) -> None:
        """Start an empty wheel's clock at ``start`` (a timer makes its wheel before
        it knows its loop's clock).

        Raises:
            ValueError: the wheel holds entries.
        """
        if len(self):
            raise ValueError("only an empty wheel can be restarted")
        self.current = start
        self._levels = [_Level(1, self.wheel_size, start)]
        self._queue = []

    @property
    def levels(self) -> int:
        """Number of levels created so far."""
        return len(self._levels)

    def level_of(self, entry: Entry) -> int | None:
        """The level holding ``entry``, or None if it is not in the wheel (for tests)."""
        bucket = entry._bucket
        if bucket is None:
            return None
        for n, level in enumerate(self._levels):
            if any(b.entries is bucket for b in level.buckets):
                return n
        return None  # pragma: no cover - an entry always knows a live bucket

    def add(self, entry: Entry) -> bool:
        """Insert ``entry`` (whose ``_tick`` is set) unless it is already due.

        Returns:
            True if the entry was inserted, False if its tick is at or before the
            wheel's clock (the caller runs it now). O(1) amortised: the level loop
            runs once per level, and levels grow logarithmically with the deadline.

        Raises:
            ValueError: the tick is ``2**63 - 1`` or more (timers give ticks
                within ``2**62 + 1`` either way).
        """
        e = entry._tick
        if e <= self.current:
            return False
        if e >= _TICK_MAX:
            raise ValueError(f"tick {e} is beyond what the wheel counts (below 2**63 - 1)")
        for level in self._levels:
            if e < level.end:
                break
        else:
            level = self._grow(e)
        bucket = level.buckets[e // level.width % self.wheel_size]
        key = entry._id_key
        if not key:
            entry._id_key = key = id(entry)
        entries = bucket.entries
        entries[key] = entry
        entry._bucket = entries
        if e >= bucket.first:  # queued (by an earlier tick): nothing to push
            return True
        bucket.first = e
        self._pushes = seq = self._pushes + 1
        heappush(self._queue, (e, seq, bucket))
        return True

    def _grow(self, e: int) -> _Level:
        # Create overflow levels until one spans ``e``. Each new level's slots are
        # as wide as the span of the level below; its clock is that level's clock
        # rounded down to the new width.
        levels = self._levels
        level = levels[-1]
        while e >= level.end:
            level = _Level(level.span, self.wheel_size, level.current)
            levels.append(level)
        return level

    @staticmethod
    def remove(entry: Entry) -> None:
        """Take ``entry`` out of its bucket, if it is in one. O(1)."""
        bucket = entry._bucket
        if bucket is not None:
            del bucket[entry._id_key]
            entry._bucket = None

    def next_expiration(self) -> int | None:
        """The tick by which :meth:`advance` must be called next, or None if empty.

        It is the smallest ``first`` of the non-empty buckets: at or before the
        earliest entry's tick (exactly it, unless that entry was removed).
        Empty buckets and stale items at the top of the heap are dropped on the
        way (lazy deletion).
        """
        queue = self._queue
        while queue:
            key, _, bucket = queue[0]
            if bucket.first == key and bucket.entries:
                return key
            heappop(queue)
            if bucket.first == key:
                bucket.first = _NOT_QUEUED
                # Emptied by removals: let go of the dict's table (dicts never
                # shrink on deletion) now that the bucket is out of the queue.
                bucket.entries = {}
        return None

    def advance(self, now: int) -> list[Entry]:
        """Move the clock to tick ``now`` and return every entry due by then.

        Entries come out in tick order and are no longer in the wheel; their
        ``_tick`` is left as it was. Entries of the same tick come out in no
        promised order (one that cascaded from a higher level follows one added
        straight to level 0). A ``now`` behind the clock is a no-op.
        """
        due: list[Entry] = []
        queue = self._queue
        while queue and queue[0][0] <= now:
            key, _, bucket = heappop(queue)
            if bucket.first != key:
                continue  # a stale heap item: the bucket was re-keyed or processed
            bucket.first = _NOT_QUEUED
            entries = bucket.entries
            bucket.entries = {}
            if not entries:
                continue
            self._set_clock(key)
            for entry in entries.values():
                entry._bucket = None
                if not self.add(entry):
                    due.append(entry)
        self._set_clock(now)
        return due

    def clear(self) -> list[Entry]:
        """Take every entry out of the wheel and return them (in no promised order)."""
        out: list[Entry] = []
        for level in self._levels:
            for bucket in level.buckets:
                for entry in bucket.entries.values():
                    entry._bucket = None
                    out.append(entry)
                bucket.entries = {}
                bucket.first = _NOT_QUEUED
        self._queue.clear()
        return out

    def __len__(self) -> int:
        """Number of entries in the wheel (O(levels * wheel_size); for tests and stats)."""
        return sum(len(b.entries) for level in self._levels for b in level.buckets)

    def _set_clock(self, tick: int) -> None:
        # Safe only when no non-empty bucket has a key below ``tick``: advance()
        # processes those first, in key order.
        if tick <= self.current:
            return
        self.current = tick
        for level in self._levels:
            if tick >= _end(level.current, level.width):
                level.current = current = tick - tick % level.width
                level.end = _end(current, level.span)
            else:
                break
