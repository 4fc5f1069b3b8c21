"""Seconds to ticks and back (aiopurgatory._ticks): never early, and exact where it can be."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import aiopurgatory as ap
from aiopurgatory import simulation
from aiopurgatory._ticks import MAX_TICKS, ceil_tick, floor_tick

TICKS = st.sampled_from([0.001, 0.004, 0.01, 2.0**-12, 0.3, 1.0])
INSTANTS = st.floats(-1e9, 1e9, allow_nan=False)


@given(tick=TICKS, when=INSTANTS)
def test_a_deadline_rounds_up_to_the_least_tick_reaching_it(tick: float, when: float) -> None:
    limit = MAX_TICKS * tick
    e = ceil_tick(when, tick, limit)
    assert e * tick >= when
    assert (e - 1) * tick < when


@given(tick=TICKS, now=INSTANTS)
def test_the_clock_rounds_down_to_the_largest_tick_it_has_reached(tick: float, now: float) -> None:
    limit = MAX_TICKS * tick
    n = floor_tick(now, tick, limit)
    assert n * tick <= now
    assert (n + 1) * tick > now


@given(tick=TICKS, when=INSTANTS, later=st.floats(0, 1e6))
def test_a_clock_that_reached_a_deadlines_tick_is_past_the_deadline(
    tick: float, when: float, later: float
) -> None:
    limit = MAX_TICKS * tick
    e = ceil_tick(when, tick, limit)
    now = e * tick + later  # the driver is armed at e * tick, and may wake later
    assert floor_tick(now, tick, limit) >= e
    assert now >= when


def test_the_division_landing_one_off_is_corrected() -> None:
    # 2001 * 0.001 / 0.001 is 2000.9999999999998 in floats.
    assert floor_tick(2001 * 0.001, 0.001, MAX_TICKS * 0.001) == 2001
    assert ceil_tick(2001 * 0.001, 0.001, MAX_TICKS * 0.001) == 2001


@pytest.mark.parametrize("far", [math.inf, 1e300])
def test_instants_beyond_the_limit_are_clamped(far: float) -> None:
    limit = MAX_TICKS * 0.001
    assert floor_tick(far, 0.001, limit) == floor_tick(limit, 0.001, limit)
    assert floor_tick(-far, 0.001, limit) == floor_tick(-limit, 0.001, limit)
    assert ceil_tick(-far, 0.001, limit) == ceil_tick(-limit, 0.001, limit)


# -- extreme instants: ticks stay in range (they are C integers in the compiled core) ------


def test_a_when_in_the_far_past_is_simply_due() -> None:
    async def main() -> tuple[list[str], int]:
        timer = ap.Timer()
        ran: list[str] = []
        timer.call_at(-1e300, ran.append, "far past")
        timer.call_at(-(2.0**70), ran.append, "past")
        await asyncio.sleep(0.01)
        return ran, len(timer)

    assert simulation.run(main()) == (["far past", "past"], 0)


@pytest.mark.parametrize("start", [1e300, -1e300, 2.0**62 * 0.001, -(2.0**63)])
def test_a_clock_beyond_the_tick_range_neither_hangs_nor_crashes(start: float) -> None:
    async def main() -> list[object]:
        timer = ap.Timer()
        results: list[object] = []
        try:
            timer.call_later(1.0, results.append, "fired")
        except ValueError as exc:  # the deadline is beyond what the wheel counts
            results.append("too far" if "too far" in str(exc) else exc)
        await asyncio.sleep(2.0)
        results.append(len(timer))
        return results

    results = simulation.run(main(), start=start)
    if start > 0:
        assert results == ["too far", 0]
    else:
        # start + 1.0 is start itself at these magnitudes: due at once.
        assert results == ["fired", 0]
