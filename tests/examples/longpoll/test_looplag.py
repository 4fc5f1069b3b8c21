"""The long-poll server's loop-lag probe: a blocked loop shows as lag, then ages out."""

from __future__ import annotations

import asyncio
import time

import pytest

from examples.longpoll.looplag import LoopLag, LoopLagCollector


async def test_a_blocked_loop_shows_as_lag_and_leaves_the_window() -> None:
    async with LoopLag(interval=0.02, window=0.5) as lag:
        await asyncio.sleep(0.1)
        assert lag.probes >= 2
        time.sleep(0.3)  # noqa: ASYNC251 - the point: the loop blocked, as by a burst of work
        await asyncio.sleep(0.05)
        # The probe due during the block fired about 0.3 s late (real time: a
        # loaded machine only adds).
        assert lag.peak >= 0.25
        assert lag.recent_max >= 0.25
        assert lag.as_dict()["loop_lag_max_s"] >= 0.25
        families = {f.name: f.samples[0].value for f in LoopLagCollector(lag).collect()}
        assert families["longpoll_loop_lag_max_seconds"] >= 0.25
        await asyncio.sleep(0.8)  # past the window
        assert lag.recent_max < 0.25
        assert lag.peak >= 0.25


async def test_bad_arguments_and_a_second_entry_are_refused() -> None:
    with pytest.raises(ValueError, match="interval"):
        LoopLag(interval=0)
    with pytest.raises(ValueError, match="window"):
        LoopLag(interval=1.0, window=0.5)
    lag = LoopLag()
    async with lag:
        with pytest.raises(RuntimeError, match="already"):
            await lag.__aenter__()
    assert lag._task is None
