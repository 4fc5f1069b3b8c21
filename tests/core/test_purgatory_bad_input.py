"""Bad input to a purgatory: a clear TypeError/ValueError naming the argument, and no state change.

Backend-neutral, as ``tests/core/test_purgatory.py`` (see there).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import aiopurgatory as ap
from aiopurgatory import simulation
from tests.support.backends import REAL, VIRTUAL, each_backend, run_on
from tests.support.purgatory import (
    Op,
    assert_clean,
    outcome,
)

# =====================================================================================
# Bad input: clear errors, no state change
# =====================================================================================


class Forgetful(ap.DelayedOperation):
    def __init__(self) -> None:  # forgot super().__init__
        self.something = 1


@each_backend(virtual=True)
@pytest.mark.parametrize(
    ("keys", "error", "match"),
    [
        ([], ValueError, "keys"),
        ((), TypeError, "tuple"),
        (("orders", 0), TypeError, r"\[\('orders', 0\)\]"),
        ({}, ValueError, "keys"),
        ({"k": "1"}, TypeError, "threshold of key 'k'"),
        ({"k": True}, TypeError, "threshold of key 'k'"),
        ({"k": None}, TypeError, "threshold of key 'k'"),
        ({"k": float("nan")}, ValueError, "threshold of key 'k'"),
        (iter([]), ValueError, "keys"),
        ("abc", TypeError, "keys"),
        (b"abc", TypeError, "keys"),
        (bytearray(b"abc"), TypeError, "keys"),
        (5, TypeError, "keys"),
        (None, TypeError, "keys"),
        ([["unhashable"]], TypeError, "keys"),
        (["ok", {"un": "hashable"}], TypeError, "keys"),
    ],
)
async def test_bad_keys_change_nothing(keys: Any, error: type, match: str) -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    p.try_complete_else_watch(Op(1.0), ["existing", "ok"])
    before = p.statistics()
    op = Op(1.0)
    with pytest.raises(error, match=match):
        p.try_complete_else_watch(op, keys)
    with pytest.raises(error, match=match):
        await p.watch(op, keys)
    assert p.statistics() == before
    assert op.tries == 0
    assert outcome(op) is None
    assert p.try_complete_else_watch(op, ["k"]) is False  # the op is still usable


@each_backend(virtual=True)
async def test_bad_ops_change_nothing() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    other: ap.Purgatory[Op] = ap.Purgatory("other")
    watched, foreign, finished = Op(1.0), Op(1.0), Op(1.0)
    p.try_complete_else_watch(watched, ["k"])
    other.try_complete_else_watch(foreign, ["k"])
    finished.cancel()
    before, other_before = p.statistics(), other.statistics()
    for op in (watched, foreign, finished):
        with pytest.raises(ap.OperationStateError):
            p.try_complete_else_watch(op, ["k", "new"])
        with pytest.raises(ap.OperationStateError):
            await p.watch(op, ["k"])
    with pytest.raises(TypeError, match="op"):
        p.try_complete_else_watch(object(), ["k"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="__init__"):
        p.try_complete_else_watch(Forgetful(), ["k"])  # type: ignore[arg-type]
    assert p.statistics() == before
    assert other.statistics() == other_before
    assert outcome(watched) is None
    assert outcome(foreign) is None
    # A finished op owned by this purgatory cannot come back either.
    watched.force_complete()
    with pytest.raises(ap.OperationStateError):
        p.try_complete_else_watch(watched, ["k"])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"name": 3}, TypeError, "name"),
        ({"max_pending": 0}, ValueError, "max_pending"),
        ({"max_pending": True}, TypeError, "max_pending"),
        ({"max_pending": 1.5}, TypeError, "max_pending"),
        ({"timer": "timer"}, TypeError, "timer"),
        ({"tick": 0}, ValueError, "tick"),
        ({"tick": -1.0}, ValueError, "tick"),
        ({"tick": float("nan")}, ValueError, "tick"),
        ({"tick": True}, TypeError, "tick"),
        ({"wheel_size": 1}, ValueError, "wheel_size"),
        ({"wheel_size": 2.0}, TypeError, "wheel_size"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ap.Purgatory(**kwargs)


@each_backend(virtual=True)
async def test_unhashable_trigger_key_raises_type_error() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    p.try_complete_else_watch(Op(1.0), ["k"])
    before = p.statistics()
    with pytest.raises(TypeError):
        p.check_and_complete(["k"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        p.cancel_for_key(["k"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        p.check_and_complete_threadsafe(["k"])  # type: ignore[arg-type]
    assert p.statistics() == before


@each_backend(virtual=True)
async def test_unhashable_trigger_key_message_names_the_argument() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    before = p.statistics()
    with pytest.raises(TypeError, match="key must be hashable"):
        p.check_and_complete(["k"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be hashable"):
        p.cancel_for_key(["k"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be hashable"):
        p.check_and_complete_threadsafe(["k"])  # type: ignore[arg-type]
    assert p.statistics() == before


@each_backend(virtual=True)
async def test_unhashable_tuple_key_message_names_the_argument() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    before = p.statistics()
    with pytest.raises(TypeError, match="keys: unhashable key"):
        p.try_complete_else_watch(Op(1.0), [(1, [2])])
    assert p.statistics() == before


@pytest.mark.parametrize("backend", [*REAL, *VIRTUAL])
def test_first_use_outside_a_loop_raises_and_changes_nothing(backend: str) -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0)
    before = p.statistics()
    with pytest.raises(RuntimeError, match="running event loop"):
        p.try_complete_else_watch(op, ["k"])
    assert p.statistics() == before
    assert op.tries == 0
    assert outcome(op) is None

    async def use() -> bool:
        return p.try_complete_else_watch(op, ["k"])

    assert run_on(backend, use) is False  # still usable from a loop


def test_watch_on_a_different_loop_raises_runtime_error() -> None:
    # Two asyncio loops, the first still open; trio's counterpart below.
    p: ap.Purgatory[Op] = ap.Purgatory()
    first = Op(1.0)

    async def bind() -> None:
        p.try_complete_else_watch(first, ["k"])

    async def watch_elsewhere() -> None:
        with pytest.raises(RuntimeError, match="another event loop"):
            await p.watch(Op(1.0), ["k"])

    with asyncio.Runner(loop_factory=simulation.new_event_loop) as runner:
        runner.run(bind())
        before = p.statistics()
        with asyncio.Runner(loop_factory=simulation.new_event_loop) as other:
            other.run(watch_elsewhere())
        assert p.statistics() == before
        first.cancel()


def test_watch_in_another_trio_run_raises_runtime_error() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    first = Op(1.0)

    async def bind() -> None:
        p.try_complete_else_watch(first, ["k"])

    async def watch_elsewhere() -> None:
        with pytest.raises(RuntimeError, match="another event loop"):
            await p.watch(Op(1.0), ["k"])

    simulation.run_trio(bind)
    before = p.statistics()
    simulation.run_trio(watch_elsewhere)  # a later run is another run
    assert p.statistics() == before
    first.cancel()
    assert_clean(p)


@pytest.mark.parametrize("backend", VIRTUAL)
def test_timer_bound_to_another_loop_raises_runtime_error(backend: str) -> None:
    # On trio: a timer bound to one trio run, used by a purgatory in a later run.
    timer = ap.Timer()

    async def bind_timer() -> None:
        timer.call_later(0, lambda: None)

    async def use() -> None:
        p: ap.Purgatory[Op] = ap.Purgatory(timer=timer)
        with pytest.raises(RuntimeError):
            p.try_complete_else_watch(Op(1.0), ["k"])
        assert_clean(p)

    run_on(backend, bind_timer)
    run_on(backend, use)


def test_purgatory_on_another_loop_refuses_without_changing_state() -> None:
    purgatory: ap.Purgatory[Op] = ap.Purgatory()

    async def first() -> None:
        purgatory.try_complete_else_watch(Op(0.001), ["k"])
        await asyncio.sleep(0.01)

    asyncio.run(first())
    before = purgatory.statistics()
    op = Op(1.0)

    async def second() -> None:
        with pytest.raises(RuntimeError, match="another event loop"):
            purgatory.try_complete_else_watch(op, ["k"])

    asyncio.run(second())
    assert purgatory.statistics() == before
    assert op.outcome is None
    assert op.deadline is None


# -- clear errors naming the argument ----------------------------------------------------


def test_argument_errors_name_the_argument_and_change_nothing() -> None:
    async def main() -> None:
        purgatory: ap.Purgatory[Op] = ap.Purgatory()
        consumed: list[int] = []

        def keys() -> Iterator[object]:
            consumed.append(1)
            yield "ok"
            yield ["unhashable"]

        with pytest.raises(TypeError, match="keys"):
            purgatory.try_complete_else_watch(Op(1.0), keys())
        with pytest.raises(TypeError, match="op"):
            purgatory.try_complete_else_watch(object(), keys())  # type: ignore[arg-type]
        assert consumed == [1]  # a rejected op does not consume the caller's keys
        assert purgatory.pending == 0

    simulation.run(main())
    with pytest.raises(TypeError, match="logger"):
        ap.Purgatory(logger=object())
    timer = ap.Timer()
    with pytest.raises(TypeError, match="tick"):
        ap.Purgatory(timer=timer, tick="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wheel_size"):
        ap.Purgatory(timer=timer, wheel_size=20.0)  # type: ignore[arg-type]

    class MyInt(int):
        pass

    assert ap.Timer(wheel_size=MyInt(20)).wheel_size == 20
