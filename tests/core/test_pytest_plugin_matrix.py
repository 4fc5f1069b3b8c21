from __future__ import annotations

import asyncio

import pytest


async def test_runs_on_each_loop() -> None:
    loop = asyncio.get_running_loop()
    assert loop.is_running()


@pytest.mark.virtual_time
async def test_virtual_marker_gives_virtual_clock() -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.sleep(3600)
    assert loop.time() - t0 == 3600
