"""A Hypothesis state machine: the Purgatory against a plain dict/list model.

The machine drives one purgatory on its own virtual-time loop. Rules watch new
operations under random keys with random timeouts, make operations completable
and trigger keys, force-complete, cancel, cancel by key, let time pass and close.
After every step the purgatory must agree with the model: each operation's
outcome and callbacks (exactly once, never early, on its tick), ``watched``,
``delayed``, ``statistics()``, the timer's length, and no finished operation left
on a watch list.

Times are dyadic (multiples of 2**-12 s) and the tick is 2**-10 s, so every sum
and every tick rounding is exact in binary floating point and the model can
predict expiry instants exactly with integer arithmetic. (Decimal ticks and their
float rounding are covered by exact tests in ``test_purgatory.py`` and the timer's
own tests; this machine is about the purgatory's semantics.)
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import aiopurgatory as ap
from aiopurgatory import simulation

KEYS = ("a", "b", "c", "d")
QUANTUM = 2.0**-12  # the model counts time in these
TICK_Q = 4  # tick = 4 quanta = 2**-10 s
WHEEL_SIZE = 4  # small, so that deadlines overflow into several levels

COMPLETED = ap.Outcome.COMPLETED
EXPIRED = ap.Outcome.EXPIRED
CANCELLED = ap.Outcome.CANCELLED


class ModelOp(ap.DelayedOperation):
    """An operation that logs its callbacks with the loop time."""

    def __init__(self, timeout: float, number: int) -> None:
        super().__init__(timeout)
        self.number = number
        self.completable = False
        self.tries = 0
        self.try_log: list[int] | None = None
        self.completed_at: list[float] = []
        self.expired_at: list[float] = []

    def __repr__(self) -> str:
        return f"<ModelOp #{self.number} {self.outcome}>"

    def try_complete(self) -> bool:
        self.tries += 1
        if self.try_log is not None:
            self.try_log.append(self.number)
        if self.completable:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.completed_at.append(asyncio.get_running_loop().time())

    def on_expiration(self) -> None:
        self.expired_at.append(asyncio.get_running_loop().time())


@dataclasses.dataclass
class Expected:
    """What the model knows about one operation."""

    keys: tuple[str, ...]
    deadline_q: int | None  # quanta; None if it never reached the timer
    watched_q: int | None = None  # quanta: when it was watched
    outcome: ap.Outcome | None = None
    finished_at_q: int | None = None

    @property
    def fire_q(self) -> int | None:
        """The instant the op must expire at: its deadline rounded up to the tick.

        Unless it was due when watched (a zero timeout): then at once, on the
        timer's next flush, as ``loop.call_later(0)`` would run (issue 30).
        """
        if self.deadline_q is None:
            return None
        if self.watched_q is not None and self.deadline_q <= self.watched_q:
            return self.deadline_q
        return -(-self.deadline_q // TICK_Q) * TICK_Q


class PurgatoryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = simulation.new_event_loop()
        self.purgatory: ap.Purgatory[ModelOp] = ap.Purgatory(
            "model", tick=TICK_Q * QUANTUM, wheel_size=WHEEL_SIZE
        )
        self.now_q = 0
        self.ops: list[ModelOp] = []
        self.expected: dict[int, Expected] = {}  # by op.number
        self.watch_order: dict[str, list[int]] = {k: [] for k in KEYS}  # pending op numbers
        self.totals = {COMPLETED: 0, EXPIRED: 0, CANCELLED: 0}
        self.closed = False

    # -- driving the loop ------------------------------------------------------------

    def on_loop(self, function: Any, *args: Any) -> Any:
        """Call ``function(*args)`` inside the running virtual loop, return its result."""

        async def call() -> Any:
            return function(*args)

        return self.loop.run_until_complete(call())

    def settle(self) -> None:
        """Run what is ready now (zero-timeout expiries) without moving the clock."""

        async def turns() -> None:
            for _ in range(3):
                await asyncio.sleep(0)

        self.loop.run_until_complete(turns())
        assert self.loop.time() == self.now_q * QUANTUM
        self.apply_expiry()

    def apply_expiry(self) -> None:
        for number, exp in self.expected.items():
            if exp.outcome is None and exp.fire_q is not None and exp.fire_q <= self.now_q:
                self.finish(number, EXPIRED, at_q=exp.fire_q)

    def finish(self, number: int, outcome: ap.Outcome, *, at_q: int | None = None) -> None:
        exp = self.expected[number]
        assert exp.outcome is None
        exp.outcome = outcome
        exp.finished_at_q = self.now_q if at_q is None else at_q
        self.totals[outcome] += 1
        for key in exp.keys:
            if number in self.watch_order[key]:
                self.watch_order[key].remove(number)

    def pending(self) -> list[int]:
        return [n for n, e in self.expected.items() if e.outcome is None]

    def teardown(self) -> None:
        try:
            if not self.closed:
                self.loop.run_until_complete(self.purgatory.aclose())
        finally:
            self.loop.close()

    # -- rules -------------------------------------------------------------------------

    @initialize()
    def bind(self) -> None:
        # Bind the purgatory (and its timer) to the loop at time 0.
        self.on_loop(self.purgatory.check_and_complete, "a")

    @precondition(lambda self: not self.closed)
    @rule(
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4),
        timeout_q=st.one_of(st.just(0), st.integers(0, 6), st.integers(0, 600)),
        mode=st.sampled_from(["pending", "pending", "pending", "first", "second"]),
    )
    def watch(self, keys: list[str], timeout_q: int, mode: str) -> None:
        number = len(self.ops)
        op = ModelOp(timeout_q * QUANTUM, number)
        if mode == "first":
            op.completable = True
        elif mode == "second":
            # Becomes completable right after its one check: it stays watched
            # (no second check) until a trigger or its expiry.
            original = op.try_complete

            def second_time() -> bool:
                result = original()
                if op.tries == 1:
                    op.completable = True
                return result

            op.try_complete = second_time  # type: ignore[method-assign]

        def watch_now() -> tuple[bool, bool]:
            result = self.purgatory.try_complete_else_watch(op, keys)
            # Never synchronous: a zero timeout does not expire inside the call.
            return result, op.outcome is EXPIRED

        result, expired_inside = self.on_loop(watch_now)
        assert not expired_inside
        unique = tuple(dict.fromkeys(keys))
        self.ops.append(op)
        if mode in ("pending", "second"):
            assert result is False
            assert op.tries == 1
            assert op.deadline == (self.now_q + timeout_q) * QUANTUM
            self.expected[number] = Expected(unique, self.now_q + timeout_q, self.now_q)
            for key in unique:
                self.watch_order[key].append(number)
        else:
            assert result is True
            assert op.tries == 1
            assert op.deadline is None
            self.expected[number] = Expected(unique, None)
            self.finish(number, COMPLETED)
        self.settle()

    @precondition(lambda self: bool(self.ops))
    @rule(data=st.data(), key=st.sampled_from(KEYS))
    def trigger(self, data: st.DataObject, key: str) -> None:
        chosen = data.draw(st.lists(st.sampled_from(range(len(self.ops))), max_size=3))
        for number in chosen:
            self.ops[number].completable = True
        order = list(self.watch_order[key])
        log: list[int] = []
        for op in self.ops:
            op.try_log = log
        try:
            count = self.on_loop(self.purgatory.check_and_complete, key)
        finally:
            for op in self.ops:
                op.try_log = None
        assert log == order  # every pending op under the key, in watch order
        completing = [n for n in order if self.ops[n].completable]
        assert count == len(completing)
        for number in completing:
            self.finish(number, COMPLETED)
        self.settle()

    @precondition(lambda self: bool(self.ops))
    @rule(data=st.data())
    def force_complete(self, data: st.DataObject) -> None:
        number = data.draw(st.sampled_from(range(len(self.ops))))
        was_pending = self.expected[number].outcome is None
        assert self.on_loop(self.ops[number].force_complete) is was_pending
        if was_pending:
            self.finish(number, COMPLETED)
        self.settle()

    @precondition(lambda self: bool(self.ops))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        number = data.draw(st.sampled_from(range(len(self.ops))))
        was_pending = self.expected[number].outcome is None
        assert self.on_loop(self.ops[number].cancel) is was_pending
        if was_pending:
            self.finish(number, CANCELLED)
        self.settle()

    @rule(key=st.sampled_from(KEYS))
    def cancel_for_key(self, key: str) -> None:
        order = list(self.watch_order[key])
        cancelled = self.on_loop(self.purgatory.cancel_for_key, key)
        assert [op.number for op in cancelled] == order
        for number in order:
            self.finish(number, CANCELLED)
        self.settle()

    @rule(delta_q=st.one_of(st.integers(1, 8), st.integers(1, 700)))
    def advance(self, delta_q: int) -> None:
        self.advance_by(delta_q)

    def advance_by(self, delta_q: int) -> None:
        self.loop.run_until_complete(asyncio.sleep(delta_q * QUANTUM))
        self.now_q += delta_q
        assert self.loop.time() == self.now_q * QUANTUM
        self.settle()

    @precondition(lambda self: bool(self.pending()))
    @rule(data=st.data(), extra_q=st.integers(-1, TICK_Q))
    def advance_near_a_deadline(self, data: st.DataObject, extra_q: int) -> None:
        # Random steps rarely land between a deadline and its tick: aim there.
        number = data.draw(st.sampled_from(self.pending()))
        deadline_q = self.expected[number].deadline_q
        assert deadline_q is not None
        self.advance_to(deadline_q + extra_q)

    def advance_to(self, target_q: int) -> None:
        if target_q > self.now_q:
            self.advance_by(target_q - self.now_q)

    @precondition(lambda self: not self.closed)
    @rule(expire_pending=st.booleans())
    def close(self, expire_pending: bool) -> None:
        self.loop.run_until_complete(self.purgatory.aclose(expire_pending=expire_pending))
        self.closed = True
        for number in self.pending():
            self.finish(number, EXPIRED if expire_pending else CANCELLED, at_q=self.now_q)

    @precondition(lambda self: self.closed)
    @rule()
    def watch_after_close(self) -> None:
        before = self.purgatory.statistics()
        op = ModelOp(1.0, -1)
        with pytest.raises(ap.PurgatoryClosedError):
            self.on_loop(self.purgatory.try_complete_else_watch, op, ["a"])
        assert op.tries == 0
        assert self.purgatory.statistics() == before

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def operations_match_the_model(self) -> None:
        for op in self.ops:
            exp = self.expected[op.number]
            assert op.outcome is exp.outcome, (op, exp)
            completes = 1 if exp.outcome in (COMPLETED, EXPIRED) else 0
            assert len(op.completed_at) == completes, (op, op.completed_at)
            if exp.outcome is EXPIRED:
                assert exp.finished_at_q is not None
                assert op.expired_at == [exp.finished_at_q * QUANTUM], (op, op.expired_at)
                # Never early (close(expire_pending=True) expires early by request).
                if not self.closed or exp.fire_q == exp.finished_at_q:
                    assert op.deadline is not None
                    assert op.expired_at[0] >= op.deadline
            else:
                assert op.expired_at == []
            if exp.outcome is COMPLETED:
                assert exp.finished_at_q is not None
                assert op.completed_at == [exp.finished_at_q * QUANTUM]

    @invariant()
    def gauges_match_the_model(self) -> None:
        pending = self.pending()
        watched = sum(len(self.expected[n].keys) for n in pending)
        keys = sum(1 for order in self.watch_order.values() if order)
        stats = self.purgatory.statistics()
        assert stats.name == "model"
        assert (stats.watched, stats.delayed, stats.pending, stats.keys) == (
            watched,
            len(pending),
            len(pending),
            keys,
        )
        assert (self.purgatory.watched, self.purgatory.delayed) == (watched, len(pending))
        assert (stats.completed, stats.expired, stats.cancelled, stats.failed) == (
            self.totals[COMPLETED],
            self.totals[EXPIRED],
            self.totals[CANCELLED],
            0,
        )
        assert len(self.purgatory.timer) == len(pending)

    @invariant()
    def finished_ops_are_on_no_watch_list(self) -> None:
        # White-box: the watch lists themselves, key by key, in watch order.
        lists = self.purgatory._watchers
        assert set(lists) == {k for k, order in self.watch_order.items() if order}
        for key, ops in lists.items():
            assert isinstance(key, str)
            assert [op.number for op in ops.values()] == self.watch_order[key]
            assert all(not op.done() for op in ops.values())


PurgatoryMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_purgatory_against_model = PurgatoryMachine.TestCase
