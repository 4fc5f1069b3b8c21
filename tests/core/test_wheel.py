"""Unit tests of the sans-IO timing wheel (``aiopurgatory._wheel``), in integer ticks.

The wheel never sees seconds: its users convert a deadline to a tick by rounding
*up* (so nothing is early) and the clock to a tick by rounding *down*. Tests that
translate Kafka's ``TimingWheelTest`` (which works in milliseconds) do that
conversion explicitly with :func:`deadline_tick` and :func:`clock_tick`.

Kafka's ``TimerTest`` cases go through :class:`aiopurgatory.Timer` on the
virtual-time loop, where fire times can be asserted exactly.
"""

from __future__ import annotations

import asyncio
import random
from fractions import Fraction
from math import ceil, floor

import pytest

import aiopurgatory as ap
from aiopurgatory._wheel import Entry, TimingWheel


class Item(Entry):
    """A wheel entry with a name, so failures print something readable."""

    __slots__ = ("name",)

    def __init__(self, tick: int, name: object = None) -> None:
        super().__init__()
        self._tick = tick
        self.name = name

    @property
    def tick(self) -> int:
        assert self._tick is not None
        return self._tick

    def __repr__(self) -> str:
        return f"Item({self._tick}, {self.name!r})"


def ticks_of(entries: list[Entry]) -> list[int]:
    return [e._tick for e in entries]


# -- construction ------------------------------------------------------------------


def test_new_wheel_has_one_level_and_nothing_pending() -> None:
    wheel = TimingWheel(20, start=7)
    assert wheel.levels == 1
    assert wheel.current == 7
    assert len(wheel) == 0
    assert wheel.next_expiration() is None
    assert wheel.advance(10**9) == []


@pytest.mark.parametrize("size", [True, 2.0, "20", None])
def test_wheel_size_must_be_an_int(size: object) -> None:
    with pytest.raises(TypeError, match="wheel_size"):
        TimingWheel(size)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [1, 0, -3])
def test_wheel_size_must_be_at_least_two(size: int) -> None:
    with pytest.raises(ValueError, match="wheel_size"):
        TimingWheel(size)


# -- placement -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tick", "level"),
    [
        (1, 0),
        (19, 0),  # last tick of level 0's span [0, 20)
        (20, 1),
        (399, 1),  # level 1: 20-tick buckets, span 400
        (400, 2),
        (7_999, 2),  # level 2: 400-tick buckets, span 8000
        (8_000, 3),
        (159_999, 3),
        (160_000, 4),
    ],
)
def test_level_of_from_clock_zero(tick: int, level: int) -> None:
    wheel = TimingWheel(20)
    item = Item(tick)
    assert wheel.add(item)
    assert wheel.level_of(item) == level
    # Levels are created lazily, exactly as many as the deadline needs.
    assert wheel.levels == level + 1


def test_level_of_with_a_clock_not_on_a_bucket_boundary() -> None:
    # wheel_size 5, clock at 105: level 0 covers (105, 110), level 1 (5-tick buckets,
    # clock 105) covers [110, 130), level 2 (25-tick buckets, clock 100) [130, 225).
    wheel = TimingWheel(5, start=105)
    expected = {106: 0, 109: 0, 110: 1, 129: 1, 130: 2, 224: 2, 225: 3}
    items = {t: Item(t) for t in expected}
    for item in items.values():
        assert wheel.add(item)
    assert {t: wheel.level_of(i) for t, i in items.items()} == expected


def test_entry_at_or_before_the_clock_is_due_and_not_inserted() -> None:
    wheel = TimingWheel(20, start=100)
    for tick in (100, 99, -5):
        item = Item(tick)
        assert not wheel.add(item)
        assert wheel.level_of(item) is None
    assert len(wheel) == 0
    assert wheel.next_expiration() is None


def test_overflow_levels_are_created_only_when_needed() -> None:
    wheel = TimingWheel(4)
    wheel.add(Item(3))
    assert wheel.levels == 1
    wheel.add(Item(15))  # span of level 1 is 16
    assert wheel.levels == 2
    wheel.add(Item(16))
    assert wheel.levels == 3
    wheel.add(Item(4**6))  # skips straight to level 6, creating 3..6 on the way
    assert wheel.levels == 7
    wheel.add(Item(17))  # levels never shrink, nor grow for a short deadline
    assert wheel.levels == 7


def test_next_expiration_is_the_earliest_tick_added_to_a_bucket() -> None:
    # Kafka wakes up at a bucket's slot start; this wheel asks to be advanced at
    # the earliest tick added to a bucket, whatever its level.
    wheel = TimingWheel(10)
    wheel.add(Item(1234))  # level 3: 1000-tick buckets
    assert wheel.next_expiration() == 1234
    wheel.add(Item(345))  # level 2: 100-tick buckets
    assert wheel.next_expiration() == 345
    wheel.add(Item(27))  # level 1: 10-tick buckets
    assert wheel.next_expiration() == 27
    wheel.add(Item(4))  # level 0: exact
    assert wheel.next_expiration() == 4
    wheel.add(Item(1201))  # an earlier tick in a queued bucket lowers its key
    wheel.add(Item(1299))  # a later one does not
    assert sorted(key for key, _, _ in wheel._queue if key > 1000) == [1201, 1234]


# -- cascade ------------------------------------------------------------------------


def test_cascade_moves_the_rest_of_a_bucket_down_when_its_first_tick_is_due() -> None:
    wheel = TimingWheel(10)
    item, later = Item(1234), Item(1299)
    wheel.add(item)
    wheel.add(later)
    assert wheel.level_of(item) == wheel.level_of(later) == 3  # the bucket [1000, 2000)
    for now in (1000, 1200, 1233):  # nothing is touched before the bucket's first tick
        assert wheel.advance(now) == []
        assert wheel.level_of(item) == wheel.level_of(later) == 3
        assert wheel.next_expiration() == 1234
    assert wheel.advance(1234) == [item]
    # Clock 1234: level 0 covers [1234, 1244), level 1 (10-tick slots) [1230, 1330).
    assert wheel.level_of(later) == 1
    assert wheel.next_expiration() == 1299
    assert wheel.advance(1298) == []
    assert len(wheel) == 1
    assert wheel.advance(1299) == [later]
    assert wheel.level_of(later) is None
    assert len(wheel) == 0
    assert wheel.next_expiration() is None


def test_one_big_advance_cascades_through_every_level() -> None:
    wheel = TimingWheel(10)
    item = Item(98_765)
    neighbour = Item(98_766)
    wheel.add(item)
    wheel.add(neighbour)
    assert wheel.level_of(item) == wheel.level_of(neighbour) == 4
    assert wheel.advance(98_764) == []
    assert wheel.level_of(item) == 4  # no cascading work before the bucket's first tick
    assert wheel.advance(98_765) == [item]
    assert wheel.level_of(neighbour) == 0  # cascaded from level 4 in that one advance
    assert wheel.advance(10**6) == [neighbour]


def test_level_clocks_round_down_to_their_own_width() -> None:
    wheel = TimingWheel(10)
    wheel.add(Item(54_321))  # creates levels 0..4
    wheel.advance(12_345)
    currents = [level.current for level in wheel._levels]
    assert currents == [12_345, 12_340, 12_300, 12_000, 10_000]
    # A level created later starts from the clock rounded down to its width.
    wheel.add(Item(912_345))
    assert wheel._levels[5].current == 0


@pytest.mark.parametrize("wheel_size", [2, 3, 20, 64])
def test_deadlines_days_away_cascade_and_fire_on_time(wheel_size: int) -> None:
    # 1 ms ticks: deadlines up to three days away, checked hour by hour.
    day = 86_400_000
    rng = random.Random(wheel_size)
    deadlines = sorted({rng.randrange(1, 3 * day) for _ in range(200)} | {3 * day, day, 1})
    wheel = TimingWheel(wheel_size)
    items = [Item(t) for t in deadlines]
    rng.shuffle(items)
    for item in items:
        assert wheel.add(item)
    fired: list[tuple[int, int]] = []  # (tick, the clock it came out at)
    hour = 3_600_000
    for now in range(hour, 3 * day + hour, hour):
        fired.extend((e.tick, now) for e in wheel.advance(now))  # type: ignore[attr-defined]
    assert [t for t, _ in fired] == deadlines
    for tick, now in fired:
        assert now - hour < tick <= now  # at the first advance that reached it
    assert len(wheel) == 0


def test_three_days_at_one_ms_with_the_default_wheel() -> None:
    three_days = 3 * 86_400_000
    wheel = TimingWheel(20)
    item = Item(three_days)
    wheel.add(item)
    assert wheel.level_of(item) == 6  # 20**6 = 64e6 <= 259.2e6 < 20**7
    assert wheel.next_expiration() == three_days
    assert wheel.advance(three_days - 1) == []
    assert wheel.level_of(item) == 6  # untouched until its tick
    assert wheel.next_expiration() == three_days
    assert wheel.advance(three_days) == [item]
    off_grid = Item(2 * three_days + 1)
    wheel.add(off_grid)
    assert wheel.advance(2 * three_days) == []
    assert wheel.level_of(off_grid) == 6  # still waiting where it was put, untouched
    assert wheel.advance(2 * three_days + 1) == [off_grid]


# -- remove, next_expiration, advance, clear ------------------------------------------


def test_remove_takes_the_entry_out_and_is_idempotent() -> None:
    wheel = TimingWheel(20)
    keep, drop = Item(5, "keep"), Item(5, "drop")
    wheel.add(keep)
    wheel.add(drop)
    TimingWheel.remove(drop)  # needs no wheel: the entry knows its bucket
    assert wheel.level_of(drop) is None
    assert len(wheel) == 1
    wheel.remove(drop)
    wheel.remove(Item(9))  # never added
    assert len(wheel) == 1
    assert wheel.advance(100) == [keep]


def test_remove_from_each_level() -> None:
    wheel = TimingWheel(5)
    items = [Item(5**n + 1) for n in range(8)]
    for item in items:
        wheel.add(item)
    assert [wheel.level_of(i) for i in items] == list(range(8))
    for item in items[::2]:
        wheel.remove(item)
    assert wheel.advance(10**7) == items[1::2]


def test_next_expiration_skips_buckets_emptied_by_removal() -> None:
    wheel = TimingWheel(20)
    a, b, c = Item(3), Item(7), Item(450)
    for item in (a, b, c):
        wheel.add(item)
    assert wheel.next_expiration() == 3
    wheel.remove(a)
    assert wheel.next_expiration() == 7
    wheel.remove(b)
    assert wheel.next_expiration() == 450  # c's level-2 bucket, keyed by c's tick
    wheel.remove(c)
    assert wheel.next_expiration() is None
    # The heap is drained of the emptied buckets, not just skipped over.
    assert wheel._queue == []


def test_a_bucket_emptied_and_refilled_is_queued_once() -> None:
    wheel = TimingWheel(20)
    first = Item(5)
    wheel.add(first)
    wheel.remove(first)
    second = Item(5)
    wheel.add(second)
    assert wheel.next_expiration() == 5
    assert wheel.advance(5) == [second]
    assert wheel.next_expiration() is None


def test_advance_returns_due_entries_in_tick_order() -> None:
    rng = random.Random(7)
    ticks = [rng.randrange(1, 50_000) for _ in range(2_000)]
    wheel = TimingWheel(8)
    for t in ticks:
        wheel.add(Item(t))
    out: list[int] = []
    now = 0
    while now < 50_000:
        now += rng.randrange(1, 3_000)
        batch = ticks_of(wheel.advance(now))
        assert all(t <= now for t in batch)
        out.extend(batch)
    assert out == sorted(ticks)


def test_equal_ticks_come_out_together_whatever_their_level() -> None:
    # No order is promised among entries of one tick; they must all come out at
    # the same advance, including one that cascades down from a higher level.
    wheel = TimingWheel(20)
    early = Item(25, "added at clock 0: level 1")
    wheel.add(early)
    wheel.advance(10)
    late = Item(25, "added at clock 10: level 0")
    wheel.add(late)
    assert wheel.level_of(early) == 1
    assert wheel.level_of(late) == 0
    assert wheel.advance(24) == []
    out = wheel.advance(25)
    assert sorted(id(e) for e in out) == sorted([id(early), id(late)])


def test_advance_behind_the_clock_is_a_no_op() -> None:
    wheel = TimingWheel(20)
    item = Item(50)
    wheel.add(item)
    wheel.advance(30)
    assert wheel.current == 30
    assert wheel.advance(10) == []
    assert wheel.current == 30
    assert wheel.advance(50) == [item]


def test_clear_returns_everything_and_leaves_a_usable_wheel() -> None:
    wheel = TimingWheel(4)
    items = [Item(t) for t in (1, 3, 9, 70, 1_000, 50_000)]
    for item in items:
        wheel.add(item)
    out = wheel.clear()
    assert sorted(ticks_of(out)) == [1, 3, 9, 70, 1_000, 50_000]
    assert len(wheel) == 0
    assert all(wheel.level_of(i) is None for i in items)
    assert wheel.next_expiration() is None
    assert wheel.advance(10**6) == []
    again = Item(10**6 + 5)
    assert wheel.add(again)
    assert wheel.advance(10**6 + 5) == [again]


def test_entries_are_keyed_by_identity_not_equality() -> None:
    class Equal(Item):
        __slots__ = ()

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Equal)

        def __hash__(self) -> int:
            return 0

    wheel = TimingWheel(20)
    a, b = Equal(5, "a"), Equal(5, "b")
    wheel.add(a)
    wheel.add(b)
    assert len(wheel) == 2
    wheel.remove(a)
    out = wheel.advance(5)
    assert len(out) == 1
    assert out[0] is b


# -- Kafka's TimingWheelTest, translated -----------------------------------------------
#
# Kafka's wheel works in milliseconds with ``tickMs`` 10, ``wheelSize`` 5 and
# ``startMs`` 1000. Ours works in integer ticks, so one Kafka tick of 10 ms is one of
# our ticks and the clock starts at tick 100. Deadlines convert by rounding *up*
# (never early), clock readings by rounding *down*. Kafka instead buckets a deadline
# by rounding it down, so it treats 1005 ms as due at 1000 ms (5 ms early); we keep
# it until the clock reaches 1010 ms.

KAFKA_TICK_MS = 10


def deadline_tick(ms: int) -> int:
    return ceil(Fraction(ms, KAFKA_TICK_MS))


def clock_tick(ms: int) -> int:
    return floor(Fraction(ms, KAFKA_TICK_MS))


def kafka_wheel() -> TimingWheel:
    return TimingWheel(5, start=clock_tick(1000))


def test_kafka_add_accepts_a_future_deadline() -> None:
    wheel = kafka_wheel()
    assert wheel.add(Item(deadline_tick(1020)))
    assert len(wheel) == 1


def test_kafka_add_rejects_a_past_deadline() -> None:
    wheel = kafka_wheel()
    assert not wheel.add(Item(deadline_tick(999)))
    assert not wheel.add(Item(deadline_tick(1000)))


def test_kafka_sub_tick_deadline_is_kept_until_its_tick_not_run_early() -> None:
    # Kafka rejects 1005 ms as already due (runs it at 1000 ms). We round it up.
    wheel = kafka_wheel()
    item = Item(deadline_tick(1005))
    assert item.tick == 101
    assert wheel.add(item)
    assert wheel.advance(clock_tick(1005)) == []
    assert wheel.advance(clock_tick(1009)) == []
    assert wheel.advance(clock_tick(1010)) == [item]


def test_kafka_removed_entries_never_come_out() -> None:
    # Kafka rejects adding a cancelled task; our wheel has no cancelled state (the
    # driver never re-adds a cancelled handle), so the equivalent is removal.
    wheel = kafka_wheel()
    item = Item(deadline_tick(1020))
    wheel.add(item)
    wheel.remove(item)
    assert wheel.advance(clock_tick(5000)) == []


def test_kafka_advance_within_a_tick_keeps_the_clock() -> None:
    wheel = kafka_wheel()
    wheel.advance(clock_tick(1005))
    assert wheel.current == clock_tick(1000)
    wheel.advance(clock_tick(1010))
    assert wheel.current == clock_tick(1010)


def test_kafka_overflow_wheel_is_created_lazily_with_its_own_clock() -> None:
    wheel = kafka_wheel()
    wheel.add(Item(deadline_tick(1040)))  # 104 < 100 + 5: still level 0
    assert wheel.levels == 1
    far = Item(deadline_tick(1060))
    wheel.add(far)
    assert wheel.levels == 2
    assert wheel.level_of(far) == 1
    wheel.advance(clock_tick(1060))
    overflow = wheel._levels[1]
    assert overflow.current * KAFKA_TICK_MS == 1050


# -- Kafka's TimerTest, through ap.Timer on virtual time ------------------------------


async def _run_timer_tasks(timer: ap.Timer, delays_ms: list[int]) -> list[tuple[int, float, float]]:
    """Schedule one callback per delay; return (index, when, fired_at) per firing."""
    loop = asyncio.get_running_loop()
    fired: list[tuple[int, float, float]] = []
    done = loop.create_future()
    remaining = len(delays_ms)

    def fire(i: int, when: float) -> None:
        nonlocal remaining
        fired.append((i, when, loop.time()))
        remaining -= 1
        if remaining == 0:
            done.set_result(None)

    start = loop.time()
    for i, d in enumerate(delays_ms):
        when = start + d / 1000
        handle = timer.call_at(when, fire, i, when)
        assert handle.when() == when
    await asyncio.wait_for(done, 60)
    await asyncio.sleep(1)  # anything firing twice would show up now
    return fired


def _tick_time(when: float, tick: float) -> float:
    """Loop time of the first tick boundary at or after ``when`` (the exact fire time)."""
    e = ceil(when / tick)
    if e * tick < when:
        e += 1
    return e * tick


@pytest.mark.virtual_time
async def test_kafka_timer_already_expired_tasks_still_run() -> None:
    timer = ap.Timer(tick=0.001, wheel_size=3)
    await asyncio.sleep(1)  # so that negative delays are still positive loop times
    now = asyncio.get_running_loop().time()
    fired = await _run_timer_tasks(timer, [-5, -4, -3, -2, -1])
    assert sorted(i for i, _, _ in fired) == [0, 1, 2, 3, 4]
    # Due already: they run on the next loop iteration, with the clock standing still.
    assert all(at == now for _, _, at in fired)
    assert len(timer) == 0


@pytest.mark.virtual_time
async def test_kafka_timer_task_expiration_on_a_deep_wheel() -> None:
    delays = [*range(5), *range(10, 100), *range(10, 100), *range(100, 500)]
    assert len(delays) == 585
    timer = ap.Timer(tick=0.001, wheel_size=3)
    fired = await _run_timer_tasks(timer, delays)
    assert sorted(i for i, _, _ in fired) == list(range(585))  # each exactly once
    for _, when, at in fired:
        assert at == _tick_time(when, 0.001)  # exact: never early, never late
    assert [at for _, _, at in fired] == sorted(at for _, _, at in fired)
    assert len(timer) == 0
    assert timer._wheel.levels > 4  # the deadlines overflowed several levels


@pytest.mark.parametrize("wheel_size", [2, 3, 20, 1000])
@pytest.mark.parametrize("start", [-(2**62), -1, 0, 2**61])
def test_ticks_at_the_ends_of_the_range_timers_use(wheel_size: int, start: int) -> None:
    # Timers give the wheel ticks within +-(2**62 + 1). The compiled wheel
    # counts them in C long longs: levels whose span would pass 2**63 - 1
    # saturate instead of overflowing, and entries still come out in order,
    # never early.
    wheel = TimingWheel(wheel_size, start)
    far = Item(2**62 + 1)
    near = Item(start + 1)
    mid = Item(start + (2**62 - start) // 2 + 1)
    for item in (far, mid, near):
        assert wheel.add(item)
    assert wheel.advance(start) == []
    assert wheel.advance(start + 1) == [near]
    assert wheel.advance(mid.tick - 1) == []
    assert wheel.advance(mid.tick) == [mid]
    assert wheel.advance(2**62) == []
    assert wheel.next_expiration() == 2**62 + 1
    assert wheel.advance(2**62 + 1) == [far]
    assert len(wheel) == 0
    for level in wheel._levels:
        assert level.end <= 2**63 - 1  # saturated (the compiled build stores a C long long)
    with pytest.raises(ValueError, match="beyond what the wheel counts"):
        wheel.add(Item(2**63 - 1))
    assert len(wheel) == 0
