"""What ``Purgatory.watch()`` returns: one small object, parked on asyncio's own future.

``aiopurgatory._watch._Watch`` replaces a native ``async def`` (issue 54): these
tests hold it to what a coroutine does for asyncio's machinery (``create_task``,
``ensure_future``, ``gather``, ``wait_for``, ``send``/``throw``/``close`` by hand,
reuse) and to the SPEC's cancellation rule, and count what a parked request
keeps alive. SPEC behaviour on every backend is in test_purgatory.py.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
from typing import Any

import pytest

import aiopurgatory as ap

COMPLETED = ap.Outcome.COMPLETED
CANCELLED = ap.Outcome.CANCELLED


class Op(ap.DelayedOperation):
    __slots__ = ("ready",)

    def __init__(self, timeout: float = 5.0, ready: bool = False) -> None:
        super().__init__(timeout)
        self.ready = ready

    def try_complete(self) -> bool:
        return self.ready and self.force_complete()


@pytest.mark.virtual_time
async def test_a_task_of_watch_itself_and_gather_and_ensure_future() -> None:
    # Not a future until it is its task's: ensure_future() and gather() wrap it
    # in a task, as they do a coroutine, instead of waiting on it unstarted.
    p: ap.Purgatory[Op] = ap.Purgatory()
    ops = [Op() for _ in range(3)]
    watches = [p.watch(op, ["k"]) for op in ops]
    assert all(asyncio.iscoroutine(w) and not asyncio.isfuture(w) for w in watches)
    task = asyncio.create_task(watches[0])
    gathered = asyncio.gather(watches[1], asyncio.ensure_future(watches[2]))
    await asyncio.sleep(0)
    assert p.watched == 3
    for op in ops:
        op.ready = True
    assert p.check_and_complete("k") == 3
    assert await task is COMPLETED
    assert list(await gathered) == [COMPLETED, COMPLETED]


@pytest.mark.virtual_time
async def test_cancelling_the_task_cancels_the_op_when_it_resumes() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op()

    async def waiting() -> ap.Outcome:
        return await p.watch(op, ["k"])

    task = asyncio.create_task(waiting())
    await asyncio.sleep(0)
    assert task.cancel("stop")
    with pytest.raises(asyncio.CancelledError, match="stop"):
        await task
    assert op.outcome is CANCELLED
    assert p.watched == 0
    assert p.delayed == 0


@pytest.mark.virtual_time
async def test_wait_for_timeout_cancels_the_op() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(p.watch(op, ["k"]), 1.0)
    assert op.outcome is CANCELLED
    assert p.watched == 0


def test_sent_to_and_thrown_into_by_hand() -> None:
    # Driven without a task, as a coroutine is: send(None) starts it (yielding
    # its future), send() again once the op finished returns the outcome.
    async def main() -> None:
        p: ap.Purgatory[Op] = ap.Purgatory()
        op = Op()
        w: Any = p.watch(op, ["k"])
        future = w.send(None)
        # The exact asyncio future the op wakes: the task's C fast path.
        assert type(future) is asyncio.Future
        assert future._asyncio_future_blocking
        assert not asyncio.isfuture(w)
        with pytest.raises(RuntimeError, match="await wasn't used with future"):
            w.send(None)  # not woken
        op.ready = True
        assert p.check_and_complete("k") == 1
        with pytest.raises(StopIteration) as stop:
            w.send(None)
        assert stop.value.value is COMPLETED
        with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
            w.send(None)

        # Thrown into while parked: the op is withdrawn, the exception raised.
        op = Op()
        w = p.watch(op, ["k"])
        w.send(None)
        with pytest.raises(KeyError):
            w.throw(KeyError("x"))
        assert op.outcome is CANCELLED
        assert p.watched == 0

        # Closed while parked, as an abandoned coroutine is: the op is withdrawn.
        op = Op()
        w = p.watch(op, ["k"])
        w.send(None)
        w.close()
        assert op.outcome is CANCELLED
        assert p.watched == 0

        # Thrown into or closed before it started: nothing was watched, no warning.
        op = Op()
        w = p.watch(op, ["k"])
        with pytest.raises(ValueError):
            w.throw(ValueError)
        w = p.watch(op, ["k"])
        w.close()
        assert op.outcome is None
        assert p.watched == 0

    asyncio.run(main())


def test_finished_at_once_returns_without_parking() -> None:
    async def main() -> None:
        p: ap.Purgatory[Op] = ap.Purgatory()
        w: Any = p.watch(Op(ready=True), ["k"])
        with pytest.raises(StopIteration) as stop:
            w.send(None)
        assert stop.value.value is COMPLETED
        # Bad arguments raise when awaited (nothing watched), as before.
        with pytest.raises(TypeError, match="op must be a DelayedOperation"):
            await p.watch(object(), ["k"])  # type: ignore[arg-type]

    asyncio.run(main())


def test_a_coroutine_function_to_inspect_and_bound_like_a_method() -> None:
    assert inspect.iscoroutinefunction(ap.Purgatory.watch)
    assert list(inspect.signature(ap.Purgatory.watch).parameters) == ["self", "op", "keys"]
    p: ap.Purgatory[Op] = ap.Purgatory()
    assert p.watch.__self__ is p  # type: ignore[attr-defined]
    assert "try_complete_else_watch" in (ap.Purgatory.watch.__doc__ or "")
    with pytest.raises(TypeError, match="method of a Purgatory"):
        ap.Purgatory.watch(None, Op(), ["k"])  # type: ignore[arg-type, unused-coroutine]


@pytest.mark.virtual_time
async def test_a_parked_request_keeps_two_objects_of_its_own() -> None:
    # Besides its task (Task, Context, wake-up method, the task's coroutine) and
    # its op, a parked wait keeps two GC-tracked objects: its _Watch and the
    # future its task waits on (issue 54: an async def kept its coroutine, the
    # keys list, a Future and its iterator).
    p: ap.Purgatory[Op] = ap.Purgatory()
    count = 2000

    async def waiting(op: Op, key: int) -> ap.Outcome:
        return await p.watch(op, [key])

    gc.collect()
    before = len(gc.get_objects())
    tasks = [asyncio.create_task(waiting(Op(), i % 10)) for i in range(count)]
    await asyncio.sleep(0)
    gc.collect()  # the keys' tuples of ints are untracked by a collection
    per_wait = (len(gc.get_objects()) - before) / count
    # Task, its Context, its wake-up method, its weakref in asyncio's set of
    # tasks, its coroutine; the op; the _Watch and the Future. (An async def
    # watch(): 10.)
    assert 7.9 < per_wait < 8.2, per_wait
    assert p.watched == count
    p.close()
    assert await asyncio.gather(*tasks) == [CANCELLED] * count


def test_next_and_send_by_hand_return_the_outcome_as_stop_iteration() -> None:
    # next() is tp_iternext (a C function when compiled), send() the Python
    # method: both start the watch and give the outcome as StopIteration's value.
    async def main() -> None:
        p: ap.Purgatory[Op] = ap.Purgatory()
        op = Op()
        w: Any = p.watch(op, ["k"])
        future = next(w)
        assert type(future) is asyncio.Future
        assert p.watched == 1
        op.ready = True
        assert p.check_and_complete("k") == 1
        assert future.done()
        with pytest.raises(StopIteration) as stop:
            next(w)
        assert stop.value.value is COMPLETED
        with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
            next(w)
        # A just-started coroutine takes None only; nothing is watched.
        w = p.watch(Op(), ["k"])
        with pytest.raises(TypeError, match="non-None value"):
            w.send(1)
        assert p.watched == 0
        w.close()  # unstarted, as a coroutine stays after that: no "never awaited"

    asyncio.run(main())


@pytest.mark.virtual_time
async def test_an_op_that_fails_raises_its_failure_through_the_watch() -> None:
    class Failing(Op):
        __slots__ = ()

        def on_complete(self) -> None:
            raise KeyError("on_complete")

    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Failing()

    async def waiting() -> ap.Outcome:
        return await p.watch(op, ["k"])

    task = asyncio.create_task(waiting())
    await asyncio.sleep(0)
    op.ready = True
    p.check_and_complete("k")
    with pytest.raises(KeyError, match="on_complete"):
        await task
    assert p.watched == 0


@pytest.mark.virtual_time
async def test_the_keys_list_is_released_once_parked() -> None:
    import weakref

    class Keys(list):  # type: ignore[type-arg]  # a list that can be weakly referenced
        pass

    p: ap.Purgatory[Op] = ap.Purgatory()
    keys = Keys(["k"])
    ref = weakref.ref(keys)
    task = asyncio.create_task(p.watch(Op(), keys))
    del keys
    await asyncio.sleep(0)
    assert p.watched == 1
    assert ref() is None  # the core holds the keys, not the parked watch
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert p.watched == 0
