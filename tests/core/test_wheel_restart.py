"""A timer's wheel is made once, with the timer, and started at its loop's clock on bind."""

from __future__ import annotations

import asyncio

import pytest

import aiopurgatory as ap
from aiopurgatory._wheel import Entry, TimingWheel


class Item(Entry):
    __slots__ = ()

    def __init__(self, tick: int) -> None:
        super().__init__()
        self._tick = tick


def test_restart_starts_an_empty_wheels_clock_anywhere() -> None:
    wheel = TimingWheel(4)
    wheel.restart(-1_000)
    assert wheel.current == -1_000
    item = Item(-990)
    assert wheel.add(item)
    assert wheel.advance(-991) == []
    assert wheel.advance(-990) == [item]


def test_only_an_empty_wheel_restarts() -> None:
    wheel = TimingWheel(4)
    wheel.add(Item(5))
    with pytest.raises(ValueError, match="empty"):
        wheel.restart(100)
    assert wheel.current == 0


def test_a_timer_keeps_the_wheel_it_was_made_with() -> None:
    timer = ap.Timer(tick=0.01, wheel_size=7)
    wheel = timer._wheel
    assert timer.wheel_size == 7

    async def main() -> float:
        loop = asyncio.get_running_loop()
        fired = loop.create_future()
        timer.call_later(0.02, fired.set_result, None)
        await fired
        return loop.time()

    asyncio.run(main())
    assert timer._wheel is wheel  # started at the loop's clock, not replaced
    assert wheel.wheel_size == 7
    assert wheel.current > 0


@pytest.mark.parametrize(("size", "error"), [(True, TypeError), (2.0, TypeError), (1, ValueError)])
def test_the_timer_refuses_a_wheel_size_as_the_wheel_does(size: object, error: type) -> None:
    with pytest.raises(error, match="wheel_size"):
        ap.Timer(wheel_size=size)  # type: ignore[arg-type]
    with pytest.raises(error, match="wheel_size"):
        TimingWheel(size)  # type: ignore[arg-type]
