"""The purgatory on every backend: asyncio, uvloop and trio (real time), and virtual time.

The promises of shared/SPEC.md that depend on the event loop (awaiting, cancelling
the awaiter, expiry, threads, close) checked the same way on each backend, most
of them on the real loops; ``test_purgatory.py`` covers the purgatory in depth,
also on every backend (mostly on virtual time). A purgatory or timer bound to
one backend and used from another is tested here only. See ``tests/support/backends.py``
for how these run.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable

import anyio
import anyio.to_thread
import pytest

import aiopurgatory as ap
from tests.support.backends import each_backend, now, run_on, settle


class Flag(ap.DelayedOperation):
    """Completes once ``ready`` holds; records its callbacks with the clock."""

    def __init__(self, timeout: float, ready: dict[str, bool] | None = None) -> None:
        super().__init__(timeout)
        self.ready = ready if ready is not None else {"ok": False}
        self.calls: list[tuple[str, float]] = []

    def try_complete(self) -> bool:
        return self.ready["ok"] and self.force_complete()

    def on_complete(self) -> None:
        self.calls.append(("on_complete", now()))

    def on_expiration(self) -> None:
        self.calls.append(("on_expiration", now()))


def assert_clean(p: ap.Purgatory[Flag]) -> None:
    stats = p.statistics()
    assert (stats.watched, stats.delayed, stats.keys, stats.pending) == (0, 0, 0, 0)
    assert len(p.timer) == 0


@each_backend(virtual=True)
async def test_watch_expires_at_the_timeout_exactly() -> None:
    p: ap.Purgatory[Flag] = ap.Purgatory()
    op = Flag(1.5)
    start = now()
    assert await p.watch(op, ["k", "j"]) is ap.Outcome.EXPIRED
    assert op.calls == [("on_complete", start + 1.5), ("on_expiration", start + 1.5)]
    assert op.deadline == start + 1.5
    assert now() == start + 1.5
    assert_clean(p)
    assert p.statistics().expired == 1


@each_backend(virtual=True)
async def test_a_trigger_from_another_task_completes_the_watch() -> None:
    p: ap.Purgatory[Flag] = ap.Purgatory()
    ready = {"ok": False}
    op = Flag(10.0, ready)
    counts: list[int] = []
    start = now()

    async def trigger() -> None:
        await anyio.sleep(0.25)
        ready["ok"] = True
        counts.append(p.check_and_complete("k"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(trigger)
        assert await p.watch(op, ["k"]) is ap.Outcome.COMPLETED
    assert counts == [1]
    assert op.calls == [("on_complete", start + 0.25)]
    assert_clean(p)


@each_backend
async def test_an_op_completable_at_once_completes_inside_watch() -> None:
    p: ap.Purgatory[Flag] = ap.Purgatory()
    op = Flag(10.0, {"ok": True})
    assert await p.watch(op, ["k"]) is ap.Outcome.COMPLETED
    assert p.try_complete_else_watch(Flag(1.0, {"ok": True}), ["k"]) is True
    assert_clean(p)


@each_backend(virtual=True)
async def test_a_cancel_scope_around_watch_withdraws_the_op() -> None:
    p: ap.Purgatory[Flag] = ap.Purgatory()
    op = Flag(60.0)
    reached = False
    start = now()
    with anyio.move_on_after(0.25) as scope:
        await p.watch(op, ["k", "j"])
        reached = True
    assert scope.cancelled_caught
    assert not reached
    assert now() == start + 0.25
    assert op.outcome is ap.Outcome.CANCELLED
    assert op.calls == []
    assert_clean(p)
    assert p.statistics().cancelled == 1


@each_backend
async def test_cancelling_the_awaiting_task_withdraws_the_op() -> None:
    p: ap.Purgatory[Flag] = ap.Purgatory()
    op = Flag(60.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(p.watch, op, ["k"])
        await settle()
        assert p.pending == 1
        tg.cancel_scope.cancel()
    assert op.outcome is ap.Outcome.CANCELLED
    assert_clean(p)


@each_backend(virtual=True)
async def test_awaiting_an_op_only_observes_it() -> None:
    p: ap.Purgatory[Flag] = ap.Purgatory()
    op = Flag(2.0)
    assert p.try_complete_else_watch(op, ["k"]) is False
    with anyio.move_on_after(0.5):
        await op
    assert op.outcome is None  # the observer gave up; the op goes on
    assert op._waiters is None  # and its waiter is forgotten at once
    start = now()
    assert await op is ap.Outcome.EXPIRED
    assert now() == start + 1.5
    assert await op is ap.Outcome.EXPIRED  # finished: returns at once


@each_backend
async def test_someone_else_cancelling_the_op_returns_cancelled() -> None:
    p: ap.Purgatory[Flag] = ap.Purgatory()
    ops = [Flag(60.0) for _ in range(3)]
    results: list[ap.Outcome] = []

    async def wait(op: Flag) -> None:
        results.append(await p.watch(op, ["shared"]))

    async with anyio.create_task_group() as tg:
        for op in ops:
            tg.start_soon(wait, op)
        await settle()
        assert p.pending == 3
        ops[0].cancel()
        # In watch order: the order the tasks ran in, which trio shuffles.
        assert sorted(p.cancel_for_key("shared"), key=ops.index) == ops[1:]
    assert results == [ap.Outcome.CANCELLED] * 3
    assert_clean(p)


@each_backend
async def test_check_and_complete_threadsafe_from_a_worker_thread() -> None:
    p: ap.Purgatory[Flag] = ap.Purgatory()
    ready = {"ok": False}
    ops = [Flag(60.0, ready) for _ in range(4)]
    outcomes: list[ap.Outcome] = []
    threads: list[str] = []

    async def wait(op: Flag) -> None:
        outcomes.append(await p.watch(op, ["k"]))

    def from_thread() -> int:
        threads.append(threading.current_thread().name)
        ready["ok"] = True
        return p.check_and_complete_threadsafe("k").result(timeout=10)

    async with anyio.create_task_group() as tg:
        for op in ops:
            tg.start_soon(wait, op)
        await settle()
        assert await anyio.to_thread.run_sync(from_thread) == 4
    assert threads[0] != threading.current_thread().name
    assert outcomes == [ap.Outcome.COMPLETED] * 4
    assert_clean(p)


@each_backend
async def test_close_releases_every_awaiter() -> None:
    p: ap.Purgatory[Flag] = ap.Purgatory()
    results: list[ap.Outcome] = []
    ops = [Flag(60.0) for _ in range(3)]

    async def wait(op: Flag) -> None:
        results.append(await p.watch(op, [id(op)]))

    async with anyio.create_task_group() as tg:
        for op in ops:
            tg.start_soon(wait, op)
        await settle()
        p.close()
    assert results == [ap.Outcome.CANCELLED] * 3
    with pytest.raises(ap.PurgatoryClosedError):
        await p.watch(Flag(1.0), ["k"])
    p.close()  # idempotent


@each_backend
async def test_max_pending_refuses_with_purgatory_full_error() -> None:
    p: ap.Purgatory[Flag] = ap.Purgatory(max_pending=2)
    first, second = Flag(60.0), Flag(60.0)
    p.try_complete_else_watch(first, ["a"])
    p.try_complete_else_watch(second, ["b"])
    third = Flag(60.0)
    with pytest.raises(ap.PurgatoryFullError):
        await p.watch(third, ["c"])
    assert third.outcome is None  # refused: no state changed
    first.cancel()
    assert p.try_complete_else_watch(third, ["c"]) is False
    p.close()
    assert_clean(p)


@each_backend(virtual=True)
async def test_a_failing_callback_reaches_only_its_awaiter() -> None:
    class Boom(Flag):
        def on_complete(self) -> None:
            raise ValueError("on_complete failed")

    p: ap.Purgatory[Flag] = ap.Purgatory()
    ready = {"ok": False}
    bad, good = Boom(5.0, ready), Flag(5.0, ready)
    results: dict[str, object] = {}

    async def wait(name: str, op: Flag) -> None:
        try:
            results[name] = await p.watch(op, ["k"])
        except ValueError as exc:
            results[name] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, "bad", bad)
        tg.start_soon(wait, "good", good)
        await anyio.sleep(1)
        ready["ok"] = True
        assert p.check_and_complete("k") == 2
    assert isinstance(results["bad"], ValueError)
    assert results["good"] is ap.Outcome.COMPLETED
    assert bad.outcome is ap.Outcome.COMPLETED
    assert_clean(p)


# -- one backend or loop only ----------------------------------------------------------


def test_a_purgatory_bound_to_one_backend_refuses_another() -> None:
    p: ap.Purgatory[Flag] = ap.Purgatory()

    async def use() -> None:
        await p.watch(Flag(0.01), ["k"])

    run_on("trio", use)
    for backend in ("asyncio", "uvloop", "trio"):  # trio: another run
        with pytest.raises(RuntimeError, match="bound to another event loop"):
            run_on(backend, use)
        with pytest.raises(RuntimeError, match="bound to another event loop"):
            run_on(backend, _try_watch(p))
    q: ap.Purgatory[Flag] = ap.Purgatory()

    async def use_q() -> None:
        await q.watch(Flag(0.01), ["k"])

    run_on("asyncio", use_q)
    with pytest.raises(RuntimeError, match="bound to another event loop"):
        run_on("trio", use_q)


@pytest.mark.parametrize("backend", ["asyncio", "uvloop"])
def test_a_purgatory_refuses_the_next_loop_of_its_thread(backend: str) -> None:
    # uvloop does not track its thread: the purgatory's timer tests the thread it
    # was bound in and is_running(); the loop it was bound to has stopped since.
    p: ap.Purgatory[Flag] = ap.Purgatory()

    async def use() -> None:
        await p.watch(Flag(0.01), ["k"])

    run_on(backend, use)
    with pytest.raises(RuntimeError, match="bound to another event loop"):
        run_on(backend, _try_watch(p))
    assert p.pending == 0


@pytest.mark.parametrize("backend", ["asyncio", "uvloop"])
def test_a_purgatory_refuses_a_loop_of_another_thread_while_its_own_runs(backend: str) -> None:
    p: ap.Purgatory[Flag] = ap.Purgatory()
    bound = threading.Event()
    release = threading.Event()

    async def hold() -> None:
        p.try_complete_else_watch(Flag(10), ["bind"])  # bound to this thread's loop
        bound.set()
        await anyio.to_thread.run_sync(release.wait)
        p.close()

    thread = threading.Thread(target=run_on, args=(backend, hold))
    thread.start()
    try:
        assert bound.wait(10)
        # Its loop runs, in the other thread: this thread's loop is not it.
        with pytest.raises(RuntimeError, match="bound to another event loop"):
            run_on(backend, _try_watch(p))
        assert p.pending == 1
    finally:
        release.set()
        thread.join(10)
    assert p.pending == 0


def _try_watch(p: ap.Purgatory[Flag]) -> Callable[[], Awaitable[None]]:
    async def attempt() -> None:
        p.try_complete_else_watch(Flag(0.01), ["k"])

    return attempt


def test_a_purgatory_with_a_timer_of_another_run_refuses() -> None:
    timer = ap.Timer()

    async def bind() -> None:
        timer.call_later(0.001, lambda: None)
        await anyio.sleep(0.01)

    run_on("asyncio", bind)
    p: ap.Purgatory[Flag] = ap.Purgatory(timer=timer)

    async def use() -> None:
        await p.watch(Flag(0.01), ["k"])

    with pytest.raises(RuntimeError, match="timer of purgatory 'purgatory' is bound to another"):
        run_on("trio", use)
    assert p.pending == 0
