"""anyio cancel scopes around Purgatory.watch() on the asyncio backend.

pytest-asyncio runs these tests (on asyncio and uvloop, the loops anyio's asyncio
backend runs on). The same promises on trio too are in ``test_backends_*.py``,
which run on every backend without anyio's pytest plugin (see ``tests/support/backends.py``
for why and how).
"""

from __future__ import annotations

import asyncio

import anyio
import pytest

import aiopurgatory as ap


class Recording(ap.DelayedOperation):
    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.callbacks: list[str] = []

    def on_complete(self) -> None:
        self.callbacks.append("on_complete")

    def on_expiration(self) -> None:
        self.callbacks.append("on_expiration")


def assert_clean(p: ap.Purgatory[Recording]) -> None:
    stats = p.statistics()
    assert (stats.watched, stats.delayed, stats.keys, stats.pending) == (0, 0, 0, 0)
    assert len(p.timer) == 0


async def test_move_on_after_cancels_the_op() -> None:
    p: ap.Purgatory[Recording] = ap.Purgatory()
    op = Recording(60.0)
    reached = False
    with anyio.move_on_after(0.01) as scope:
        await p.watch(op, ["k", "j"])
        reached = True
    assert scope.cancelled_caught
    assert not reached
    assert op.outcome is ap.Outcome.CANCELLED
    assert op.callbacks == []
    assert_clean(p)
    assert p.statistics().cancelled == 1


@pytest.mark.virtual_time
async def test_move_on_after_on_virtual_time() -> None:
    loop = asyncio.get_running_loop()
    p: ap.Purgatory[Recording] = ap.Purgatory()
    op = Recording(1.0)
    with anyio.move_on_after(0.25):
        await p.watch(op, ["k"])
    assert loop.time() == 0.25
    assert op.outcome is ap.Outcome.CANCELLED
    assert_clean(p)


async def test_cancel_scope_cancel_from_another_task() -> None:
    p: ap.Purgatory[Recording] = ap.Purgatory()
    op = Recording(60.0)
    scope = anyio.CancelScope()

    async def watcher() -> None:
        with scope:
            await p.watch(op, ["k"])

    async with anyio.create_task_group() as tg:
        tg.start_soon(watcher)
        await anyio.sleep(0.005)
        assert op.outcome is None
        assert p.delayed == 1
        scope.cancel()
    assert scope.cancelled_caught
    assert op.outcome is ap.Outcome.CANCELLED
    assert op.callbacks == []
    assert_clean(p)


async def test_cancelled_scope_before_watch_cancels_at_once() -> None:
    # A scope cancelled before watch() starts: the first await is cancelled, and
    # the op (already watched by then) must not be left behind.
    p: ap.Purgatory[Recording] = ap.Purgatory()
    op = Recording(60.0)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await p.watch(op, ["k"])
    assert op.outcome is ap.Outcome.CANCELLED
    assert_clean(p)


async def test_watch_completing_inside_a_scope_is_not_cancelled() -> None:
    p: ap.Purgatory[Recording] = ap.Purgatory()
    op = Recording(0.001)
    with anyio.move_on_after(30) as scope:
        outcome = await p.watch(op, ["k"])
    assert not scope.cancelled_caught
    assert outcome is ap.Outcome.EXPIRED
    assert op.callbacks == ["on_complete", "on_expiration"]
