"""The long-poll server's loop-lag probe: a blocked loop shows as lag, then ages out."""

from __future__ import annotations

import asyncio
import gc
import os
import time

import pytest
from structlog.testing import capture_logs

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


async def test_a_collection_longer_than_log_over_is_logged_as_a_gc_pause() -> None:
    with capture_logs() as logs:
        async with LoopLag(interval=0.02, log_over=0.0):
            await asyncio.sleep(0.05)
            gc.collect()  # a full collection: longer than 0 s
            await asyncio.sleep(0.05)  # the next probe logs it
    pauses = [r for r in logs if r["event"] == "longpoll.gc_pause"]
    assert any(r["generation"] == 2 for r in pauses), logs
    assert all(r["seconds"] > 0 and r["pid"] == os.getpid() for r in pauses)
    with capture_logs() as quiet:
        async with LoopLag(interval=0.02):  # log_over None: no callback, nothing logged
            gc.collect()
            await asyncio.sleep(0.05)
    assert not [r for r in quiet if r["event"] == "longpoll.gc_pause"]
