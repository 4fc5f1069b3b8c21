"""When a Timer arms its driver: nothing armed when idle, never early at tick boundaries
(virtual and real time, on asyncio, uvloop and trio), and ``next_due()``.

On every backend as ``tests/core/test_timer.py`` (see there); the driver's armed instant is
read with ``tests/support/timer.py``'s ``armed_at`` and ``armed_handle``.
"""

from __future__ import annotations

import asyncio
import random
import time
from math import inf

import anyio
import pytest
import trio
import trio.testing

import aiopurgatory as ap
from aiopurgatory import simulation
from tests.support.backends import VIRTUAL, each_backend, now, run_on, settle
from tests.support.purgatory import Op
from tests.support.timer import (
    TICK,
    Recorder,
    armed_at,
    armed_handle,
    next_iteration,
    run_virtual_bounded,
)

# -- nothing armed when idle ------------------------------------------------------------------


@each_backend(virtual=True)
async def test_nothing_armed_after_the_last_cancel_or_fire() -> None:
    timer = ap.Timer()
    rec = Recorder()
    assert armed_at(timer) is None
    h = timer.call_later(5, rec, "x")
    await next_iteration()  # new entries reach the wheel on the next iteration
    assert armed_at(timer) is not None
    h.cancel()
    assert armed_at(timer) is None  # disarmed at once, not at the old deadline

    timer.call_later(5, rec, "cancelled while new").cancel()
    await next_iteration()
    assert armed_at(timer) is None  # never armed at all

    timer.call_later(0.01, rec, "y")
    timer.call_later(30, rec, "z")
    await anyio.sleep(1)
    assert armed_at(timer) is not None  # armed for z
    await anyio.sleep(30)
    assert rec.names == ["y", "z"]
    assert armed_at(timer) is None

    timer.call_later(0, rec, "due now")
    await next_iteration()
    assert rec.names[-1] == "due now"
    assert armed_at(timer) is None  # a due-now entry never needs arming


@pytest.mark.virtual_time
async def test_an_earlier_entry_re_arms_the_handle() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    rec = Recorder()
    timer.call_later(60, rec, "late")
    await asyncio.sleep(0)
    armed = armed_handle(timer)
    assert armed is not None
    assert armed.when() <= 60
    timer.call_later(0.015, rec, "early")
    await asyncio.sleep(0)
    rearmed = armed_handle(timer)
    assert rearmed is not None
    assert rearmed is not armed
    assert rearmed.when() == 0.015
    timer.call_later(0.5, rec, "between")  # a later bucket: no re-arm
    await asyncio.sleep(0)
    assert armed_handle(timer) is rearmed
    await asyncio.sleep(0.6)
    assert rec.calls == [("early", 0.015), ("between", 0.5)]
    assert loop.time() == 0.6


def test_trio_an_earlier_entry_moves_the_one_deadline() -> None:
    # The trio counterpart of the above: the driver task sleeps in one cancel scope
    # whose deadline is the earliest bucket, and that is the run's only deadline
    # (this task, running, has none): an earlier entry moves it, a later one does not.
    def next_deadline() -> float:
        return trio.current_time() + trio.lowlevel.current_statistics().seconds_to_next_deadline

    async def main() -> None:
        timer = ap.Timer()
        rec = Recorder()
        timer.call_later(60, rec, "late")
        await settle()
        armed = armed_at(timer)
        assert armed is not None
        assert armed <= 60
        assert next_deadline() == armed
        timer.call_later(0.015, rec, "early")
        await settle()
        assert armed_at(timer) == 0.015
        assert next_deadline() == 0.015
        timer.call_later(0.5, rec, "between")  # a later bucket: the deadline stays
        await settle()
        assert armed_at(timer) == 0.015
        assert next_deadline() == 0.015
        await trio.sleep(0.6)
        assert rec.calls == [("early", 0.015), ("between", 0.5)]
        assert trio.current_time() == 0.6
        assert armed_at(timer) == armed  # back to "late"'s bucket, nothing else left
        assert next_deadline() == armed
        timer.close()
        await settle()
        assert trio.lowlevel.current_statistics().seconds_to_next_deadline == inf

    run_on("trio-virtual", main)


# -- float rounding at tick boundaries (core bug) -----------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("backend", VIRTUAL)
def test_deadlines_on_float_unfriendly_tick_boundaries_fire(backend: str) -> None:
    # 2001 * 0.001 / 0.001 is just below 2001: a driver that decides "due" by that
    # division finds nothing due at the armed instant and re-arms for the same
    # instant forever (a livelock on virtual time; a busy spin on real loops).
    bad = [e for e in range(1_990, 2_100) if (e * TICK) / TICK < e]
    assert bad  # the float effect this test is about exists

    async def main() -> list[tuple[float, float]]:
        timer = ap.Timer()
        fired: list[tuple[float, float]] = []
        for e in bad:
            timer.call_at(e * TICK, lambda w: fired.append((w, now())), e * TICK)
        await anyio.sleep(3)
        return fired

    fired = run_virtual_bounded(main, 10.0, backend)
    assert fired == [(w, w) for w in sorted(e * TICK for e in bad)]


@pytest.mark.parametrize("backend", VIRTUAL)
def test_bounded_runner_reports_results(backend: str) -> None:
    async def main() -> float:
        await anyio.sleep(5)
        return now()

    assert run_virtual_bounded(main, 10.0, backend) == 5.0


# -- real time, on asyncio, uvloop and trio ------------------------------------------------------


# uvloop rounds call_at to whole milliseconds: with a 1 ms tick the driver arms for
# whole milliseconds and uvloop is never early, so the ticks that are not whole
# milliseconds are the ones that make it wake the driver early (by up to a tick),
# and check that the driver re-checks the clock and re-arms instead of trusting it.
# trio is never early by its own clock (a scope is cancelled once the clock has
# reached its deadline); the same wheels check the driver's re-arming there.
REALTIME_WHEELS = [(0.001, 20), (0.0007, 20), (0.0015, 3)]


@pytest.mark.realtime
@pytest.mark.parametrize(("tick", "wheel_size"), REALTIME_WHEELS)
@each_backend
async def test_never_early_on_real_loops(tick: float, wheel_size: int) -> None:
    timer = ap.Timer(tick=tick, wheel_size=wheel_size)
    rng = random.Random(11)
    n = 2_000
    fired: dict[int, tuple[float, float]] = {}  # i -> (when, fired at)
    duplicates: list[int] = []
    done = anyio.Event()
    expected: set[int] = set()

    def fire(i: int, when: float) -> None:
        if i in fired:
            duplicates.append(i)
        fired[i] = (when, now())
        if len(fired) == len(expected):
            done.set()

    handles = []
    for i in range(n):
        when = now() + rng.uniform(-0.005, 0.1)
        handles.append(timer.call_at(when, fire, i, when))
    for i in range(0, n, 3):  # a third are cancelled before they fire
        handles[i].cancel()
    expected = {i for i in range(n) if i % 3}
    assert len(timer) == len(expected)
    with anyio.fail_after(30):
        await done.wait()
    await anyio.sleep(0.05)
    assert set(fired) == expected
    assert duplicates == []
    early = [(when, at) for when, at in fired.values() if at < when]
    assert early == []
    lateness = [at - when for when, at in fired.values()]
    assert max(lateness) < 2.0  # generous: a shared 2-core CI machine
    assert len(timer) == 0
    assert armed_at(timer) is None


@pytest.mark.realtime
@pytest.mark.parametrize("tick", [0.001, 0.0007])
@each_backend
async def test_timers_spread_over_time_never_fire_early(tick: float) -> None:
    # Scheduled a few at a time while the loop is running, so the driver re-arms
    # often, with the clock between ticks: the case uvloop's early wake-ups hit.
    timer = ap.Timer(tick=tick)
    rng = random.Random(5)
    early: list[float] = []
    count = 0
    all_fired = anyio.Event()

    def fire(when: float) -> None:
        nonlocal count
        count += 1
        if count == 1_000:
            all_fired.set()
        t = now()
        if t < when:
            early.append(when - t)

    for _ in range(40):
        for _ in range(25):
            when = now() + rng.uniform(0, 0.03)
            timer.call_at(when, fire, when)
        await anyio.sleep(rng.uniform(0, 0.003))
    with anyio.fail_after(30):
        await all_fired.wait()
    assert count == 1_000
    assert early == []


# -- next_due(): when the timer next has work to do --------------------------------------


@each_backend(virtual=True)
async def test_next_due_is_the_start_of_the_earliest_tick_with_work() -> None:
    timer = ap.Timer(tick=0.5)  # binary: exact products
    rec = Recorder()
    assert timer.next_due() is None  # nothing pending (not even bound yet)
    timer.call_later(1.2, rec, "late")  # tick ceil(2.4) = 3 -> 1.5 s
    assert timer.next_due() == 1.5  # staged entries count
    await next_iteration()  # into the wheel
    assert timer.next_due() == 1.5
    early = timer.call_later(0.7, rec, "early")  # tick 2 -> 1.0 s
    assert timer.next_due() == 1.0
    await next_iteration()
    assert timer.next_due() == 1.0
    early.cancel()
    assert timer.next_due() == 1.5  # an emptied bucket is dropped
    await anyio.sleep(2)
    assert rec.calls == [("late", 1.5)]
    assert timer.next_due() is None


@each_backend(virtual=True)
async def test_next_due_of_an_entry_already_due_is_not_in_the_future() -> None:
    timer = ap.Timer()
    await anyio.sleep(10)
    timer.call_later(-5, lambda: None)
    due = timer.next_due()
    assert due is not None
    assert due <= now()
    await next_iteration()
    assert timer.next_due() is None  # it ran


@pytest.mark.parametrize("seed", range(5))
@each_backend(virtual=True)
async def test_next_due_bounds_the_earliest_pending_callback(seed: int) -> None:
    # Without cancellations: the earliest when <= next_due < it + tick, and the
    # earliest callback runs at next_due exactly on virtual time.
    rng = random.Random(seed)
    timer = ap.Timer()
    rec = Recorder()
    whens = [now() + rng.expovariate(1 / rng.choice([0.005, 0.3, 40.0])) for _ in range(200)]
    for when in whens:
        timer.call_at(when, rec, when)
    for step in range(2):
        due = timer.next_due()
        assert due is not None
        earliest = min(whens)
        assert earliest <= due < earliest + timer.tick
        if step == 0:
            await next_iteration()  # the same in the wheel as on the stage
    while (due := timer.next_due()) is not None:
        pending_before = len(timer)
        # asyncio: sleep(due - now), as before; trio sleeps until exactly ``due``
        # (trio.sleep would add the delay back to the clock, maybe an ulp off).
        await anyio.sleep_until(due)
        await next_iteration()
        assert len(timer) < pending_before
        assert rec.calls[-1][1] == due  # ran at the instant next_due() named
    assert sorted(rec.names) == sorted(whens)


# -- many entries already due in one iteration -------------------------------------------


def test_many_due_entries_in_one_iteration_cost_linear_time() -> None:
    # Due entries used to stay staged and be rescanned by every compaction:
    # quadratic (32k calls took minutes). Timed generously, as a guard only.
    async def main(n: int) -> tuple[float, int]:
        timer = ap.Timer()
        fired: list[int] = []
        started = time.process_time()
        for i in range(n):
            timer.call_later(0, fired.append, i)
        elapsed = time.process_time() - started
        await asyncio.sleep(0.01)
        assert fired == list(range(n))  # all run, in scheduling order
        return elapsed, len(timer)

    elapsed, pending = simulation.run(main(40_000))
    assert pending == 0
    assert elapsed < 20  # was minutes


def test_zero_timeout_ops_watched_in_bulk_all_expire() -> None:
    async def main() -> list[ap.Outcome | None]:
        purgatory: ap.Purgatory[Op] = ap.Purgatory()
        ops = [Op(0) for _ in range(10_000)]
        for op in ops:
            purgatory.try_complete_else_watch(op, ["k"])
        await asyncio.sleep(0.01)
        return [op.outcome for op in ops]

    assert set(simulation.run(main())) == {ap.Outcome.EXPIRED}


# -- 5. zero and negative delays are due now ------------------------------------------


async def test_a_zero_timeout_expires_within_a_few_loop_iterations() -> None:
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("first-hour")
    op = ap.DelayedOperation(0)
    purgatory.try_complete_else_watch(op, ["k"])
    assert not op.done()  # never synchronously
    iterations = 0
    while not op.done():
        await asyncio.sleep(0)
        iterations += 1
    assert op.outcome is ap.Outcome.EXPIRED
    assert iterations <= 2  # was ~200 (a whole 1 ms tick) on asyncio


@pytest.mark.parametrize("delay", [0.0, -1.0])
async def test_zero_or_negative_call_later_runs_with_loop_call_later_zero(delay: float) -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    order: list[str] = []
    timer.call_later(delay, order.append, "timer first")
    loop.call_later(0, order.append, "loop")
    timer.call_later(delay, order.append, "timer second")
    assert order == []
    for _ in range(3):
        await asyncio.sleep(0)
    # The timer's own entries in scheduling order; the first one no later than a
    # loop.call_later(0) scheduled after it (it used to run a tick later).
    assert order.index("timer first") < order.index("loop")
    assert order.index("timer first") < order.index("timer second")


async def test_positive_delays_are_never_early() -> None:
    loop = asyncio.get_running_loop()
    timer = ap.Timer()
    fired: list[tuple[float, float]] = []

    def fire(when: float) -> None:
        fired.append((when, loop.time()))

    for i in range(200):
        delay = (i % 20) * 0.0001  # 0 to 1.9 ms, within a tick and across one
        when = loop.time() + delay
        timer.call_at(when, fire, when)
        if i % 7 == 0:
            await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    assert len(timer) == 0
    assert len(fired) == 200
    assert all(now >= when for when, now in fired)


@each_backend(virtual=True)
async def test_a_zero_timeout_expires_at_the_instant_it_was_watched() -> None:
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("first-hour")
    await anyio.sleep(0.0004)  # between two ticks of the wheel
    start = now()
    assert await purgatory.watch(ap.DelayedOperation(0), ["k"]) is ap.Outcome.EXPIRED
    assert now() == start  # was the next tick, 0.6 ms later


def test_next_due_is_no_later_than_a_zero_delay_entry() -> None:
    # Tools that drive the clock themselves (the trace replay) rely on it.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.0004)  # between two ticks
        timer = ap.Timer()
        ran: list[float] = []
        timer.call_later(0, lambda: ran.append(loop.time()))
        due = timer.next_due()
        assert due is not None
        assert due <= loop.time()
        await asyncio.sleep(0)
        assert ran == [0.0004]
        timer.call_later(0.0003, lambda: None)  # not yet due: its tick, never before
        assert timer.next_due() == 0.001

    simulation.run(main())
