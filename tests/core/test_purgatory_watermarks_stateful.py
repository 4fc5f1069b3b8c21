"""A Hypothesis state machine: watermark watches against a plain list model.

Operations are watched with plain keys or with a threshold on each key; rules
advance keys (on the loop and from another thread), check keys, make
operations completable, cancel, cancel by key and let virtual time pass. The
model is the naive purgatory: on ``advance(key, v)`` above the key's watermark,
check the key's plain watchers in watch order, then every watcher whose
threshold on the key is at most ``v``, in threshold order (ties in watch order);
nothing else. After every step the purgatory must have checked exactly those
operations in exactly that order (so never one above its threshold), completed
the same ones, and agree on outcomes, watermarks and gauges. Runs on whichever
core the suite runs on (``make test`` runs it on both).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import aiopurgatory as ap
from aiopurgatory import simulation

KEYS = ("a", "b", "c")
QUANTUM = 2.0**-12  # dyadic times: exact in binary floating point
TICK_Q = 4
WHEEL_SIZE = 4

COMPLETED = ap.Outcome.COMPLETED
EXPIRED = ap.Outcome.EXPIRED
CANCELLED = ap.Outcome.CANCELLED


class ModelOp(ap.DelayedOperation):
    def __init__(self, timeout: float, number: int, machine: WatermarkMachine) -> None:
        super().__init__(timeout)
        self.number = number
        self.machine = machine
        self.completable = False

    def __repr__(self) -> str:
        return f"<ModelOp #{self.number} {self.outcome}>"

    def try_complete(self) -> bool:
        self.machine.log.append(self.number)
        return self.completable  # True without force_complete(): the purgatory completes it


@dataclasses.dataclass
class Expected:
    keys: tuple[str, ...]
    thresholds: dict[str, int] | None
    deadline_q: int
    watched_q: int
    outcome: ap.Outcome | None = None

    @property
    def fire_q(self) -> int:
        if self.deadline_q <= self.watched_q:
            # Due when the timer first sees it (a zero timeout): at once, as
            # loop.call_later(0) would be, not at the next tick (issue 30).
            return self.deadline_q
        return -(-self.deadline_q // TICK_Q) * TICK_Q


class WatermarkMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = simulation.new_event_loop()
        self.purgatory: ap.Purgatory[ModelOp] = ap.Purgatory(
            "model", tick=TICK_Q * QUANTUM, wheel_size=WHEEL_SIZE
        )
        self.now_q = 0
        self.ops: list[ModelOp] = []
        self.expected: list[Expected] = []
        self.marks: dict[str, int] = {}
        self.log: list[int] = []
        self.advances = 0

    # -- helpers ---------------------------------------------------------------------

    def on_loop(self, function: Any, *args: Any) -> Any:
        async def call() -> Any:
            return function(*args)

        return self.loop.run_until_complete(call())

    def pending(self) -> list[int]:
        return [n for n, e in enumerate(self.expected) if e.outcome is None]

    def watchers(self, key: str) -> tuple[list[int], list[int]]:
        """Pending plain watchers of ``key`` (watch order), threshold ones (threshold order)."""
        plain = [n for n in self.pending() if self.expected[n].thresholds is None]
        plain = [n for n in plain if key in self.expected[n].keys]
        with_threshold = [
            n
            for n in self.pending()
            if self.expected[n].thresholds is not None and key in self.expected[n].keys
        ]
        with_threshold.sort(key=lambda n: (self.expected[n].thresholds[key], n))  # type: ignore[index]
        return plain, with_threshold

    def finish(self, number: int, outcome: ap.Outcome) -> None:
        assert self.expected[number].outcome is None
        self.expected[number].outcome = outcome
        self.forget_unwatched()

    def forget_unwatched(self) -> None:
        for key in list(self.marks):
            plain, with_threshold = self.watchers(key)
            if not plain and not with_threshold:
                del self.marks[key]

    def settle(self) -> None:
        async def turns() -> None:
            for _ in range(3):
                await asyncio.sleep(0)

        self.loop.run_until_complete(turns())
        for number in self.pending():
            if self.expected[number].fire_q <= self.now_q:
                self.finish(number, EXPIRED)

    def teardown(self) -> None:
        try:
            self.purgatory.close()
        finally:
            self.loop.close()

    def expect_advance(self, key: str, value: int) -> list[int]:
        """What ``advance(key, value)`` must check, and the model's new watermark."""
        plain, with_threshold = self.watchers(key)
        if not plain and not with_threshold:
            return []
        mark = self.marks.get(key)
        if mark is not None and value <= mark:
            return []
        self.marks[key] = value
        self.advances += 1
        reached = [n for n in with_threshold if self.expected[n].thresholds[key] <= value]  # type: ignore[index]
        return plain + reached

    def check(self, expected: list[int], count: int) -> None:
        assert self.log == expected
        completing = [n for n in expected if self.ops[n].completable]
        assert count == len(completing)
        for number in completing:
            self.finish(number, COMPLETED)
        self.log.clear()
        self.settle()

    # -- rules ---------------------------------------------------------------------------

    @initialize()
    def bind(self) -> None:
        self.on_loop(self.purgatory.check_and_complete, "a")

    @rule(
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True),
        thresholds=st.one_of(st.none(), st.lists(st.integers(0, 12), min_size=3, max_size=3)),
        timeout_q=st.integers(0, 400),
        completable=st.booleans(),
    )
    def watch(
        self, keys: list[str], thresholds: list[int] | None, timeout_q: int, completable: bool
    ) -> None:
        number = len(self.ops)
        op = ModelOp(timeout_q * QUANTUM, number, self)
        op.completable = completable and number % 3 == 0
        spec: Any = keys if thresholds is None else dict(zip(keys, thresholds, strict=False))
        result = self.on_loop(self.purgatory.try_complete_else_watch, op, spec)
        assert self.log == [number]
        self.log.clear()
        self.ops.append(op)
        self.expected.append(
            Expected(
                tuple(keys),
                None if thresholds is None else spec,
                self.now_q + timeout_q,
                self.now_q,
            )
        )
        assert result is op.completable
        if result:
            self.expected[number].outcome = COMPLETED
        self.settle()

    @precondition(lambda self: bool(self.ops))
    @rule(data=st.data())
    def make_completable(self, data: st.DataObject) -> None:
        for number in data.draw(st.lists(st.sampled_from(range(len(self.ops))), max_size=3)):
            self.ops[number].completable = True

    @rule(key=st.sampled_from(KEYS), value=st.integers(0, 14))
    def advance(self, key: str, value: int) -> None:
        expected = self.expect_advance(key, value)
        count = self.on_loop(self.purgatory.advance, key, value)
        self.check(expected, count)

    @rule(key=st.sampled_from(KEYS), value=st.integers(0, 14))
    def advance_from_a_thread(self, key: str, value: int) -> None:
        expected = self.expect_advance(key, value)
        futures: list[Any] = []
        thread = threading.Thread(
            target=lambda: futures.append(self.purgatory.advance_threadsafe(key, value))
        )
        thread.start()
        thread.join()
        assert self.log == []  # nothing runs until the loop does
        count = self.loop.run_until_complete(asyncio.wrap_future(futures[0], loop=self.loop))
        self.check(expected, count)

    @rule(key=st.sampled_from(KEYS))
    def check_and_complete(self, key: str) -> None:
        plain, with_threshold = self.watchers(key)
        count = self.on_loop(self.purgatory.check_and_complete, key)
        self.check(plain + with_threshold, count)

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
        plain, with_threshold = self.watchers(key)
        cancelled = self.on_loop(self.purgatory.cancel_for_key, key)
        assert [op.number for op in cancelled] == plain + with_threshold
        for number in plain + with_threshold:
            self.finish(number, CANCELLED)
        self.settle()

    @rule(delta_q=st.integers(1, 200))
    def time_passes(self, delta_q: int) -> None:
        self.loop.run_until_complete(asyncio.sleep(delta_q * QUANTUM))
        self.now_q += delta_q
        assert self.loop.time() == self.now_q * QUANTUM
        self.settle()

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def outcomes_match(self) -> None:
        for op, exp in zip(self.ops, self.expected, strict=True):
            assert op.outcome is exp.outcome, (op, exp)

    @invariant()
    def watermarks_match(self) -> None:
        for key in KEYS:
            assert self.purgatory.watermark(key) == self.marks.get(key), key

    @invariant()
    def gauges_match(self) -> None:
        pending = self.pending()
        stats = self.purgatory.statistics()
        watched_keys = {k for n in pending for k in self.expected[n].keys}
        assert stats.pending == stats.delayed == len(pending)
        assert stats.watched == sum(len(self.expected[n].keys) for n in pending)
        assert stats.keys == len(watched_keys)
        assert set(self.purgatory.keys()) == watched_keys
        assert stats.advances == self.advances
        totals = {o: sum(1 for e in self.expected if e.outcome is o) for o in ap.Outcome}
        assert (stats.completed, stats.expired, stats.cancelled) == (
            totals[COMPLETED],
            totals[EXPIRED],
            totals[CANCELLED],
        )


WatermarkMachine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_watermarks_against_model = WatermarkMachine.TestCase
