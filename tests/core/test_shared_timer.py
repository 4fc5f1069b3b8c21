"""The timer ``ap.timeout()`` shares per loop (aiopurgatory._shared_timer): one per loop while
in use, held weakly, and not closed under ``ap.timeout()``.
"""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
import trio

import aiopurgatory as ap
from aiopurgatory import _shared_timer
from tests.support.backends import each_backend

# -- the shared timer of ap.timeout() ------------------------------------------------------


def test_ap_timeout_does_not_keep_event_loops_alive() -> None:
    refs: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def main() -> None:
        refs.append(weakref.ref(asyncio.get_running_loop()))
        async with ap.timeout(1):
            await asyncio.sleep(0)

    for _ in range(5):
        asyncio.run(main())
    gc.collect()
    assert [r() for r in refs] == [None] * 5


async def test_shared_timer_is_one_per_loop_while_in_use() -> None:
    first = ap.shared_timer()
    assert ap.shared_timer() is first
    assert first.loop is asyncio.get_running_loop()


def test_shared_timer_module_state_is_weak() -> None:
    assert isinstance(_shared_timer._shared, weakref.WeakValueDictionary)


# -- 6. the shared timer cannot be closed under ap.timeout() --------------------------


@each_backend
async def test_the_shared_timer_refuses_to_close_and_ap_timeout_keeps_working() -> None:
    shared = ap.shared_timer()
    with pytest.raises(RuntimeError, match=r"shared timer .* cannot be closed"):
        shared.close()
    assert not shared.closed
    assert ap.shared_timer() is shared
    with pytest.raises(TimeoutError):
        async with ap.timeout(0.01):
            await trio.sleep(1) if trio.lowlevel.in_trio_run() else await asyncio.sleep(1)
    own = ap.Timer()
    own.call_later(1.0, print)
    own.close()  # a timer of one's own closes as before
    assert own.closed
