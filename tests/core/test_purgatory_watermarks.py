"""Watermark watches: ``watch(op, {key: threshold})``, ``advance``, ``watermark``.

What a trigger checks (exactly the ops it reaches, in threshold order), what it
never checks (an op whose threshold is above the watermark), what the purgatory
keeps (a watermark only while its key is watched), and the traps around it
(a tuple as keys, ``try_complete`` returning True). Costs are asserted as counts
of ``try_complete`` calls, never as times; times live in ``aiopurgatory bench``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable
from typing import Any

import pytest

import aiopurgatory as ap
from tests.support.backends import each_backend, settle


class Recorded(ap.DelayedOperation):
    """Logs each check into a shared list; completes when ``ready``."""

    def __init__(self, name: str, log: list[str], timeout: float = 60.0) -> None:
        super().__init__(timeout)
        self.name = name
        self.log = log
        self.ready = False

    def try_complete(self) -> bool:
        self.log.append(self.name)
        if self.ready:
            return self.force_complete()
        return False


def watch_all(
    purgatory: ap.Purgatory[Any], log: list[str], specs: list[tuple[str, Any]]
) -> dict[str, Recorded]:
    ops = {}
    for name, keys in specs:
        op = Recorded(name, log)
        assert purgatory.try_complete_else_watch(op, keys) is False
        ops[name] = op
    log.clear()  # forget the first checks
    return ops


@each_backend(virtual=True)
async def test_advance_checks_plain_watchers_then_reached_thresholds_in_order() -> None:
    p: ap.Purgatory[Any] = ap.Purgatory()
    log: list[str] = []
    watch_all(
        p,
        log,
        [
            ("t5", {"k": 5}),
            ("t3a", {"k": 3}),
            ("plain1", ["k"]),
            ("t3b", {"k": 3}),
            ("t9", {"k": 9}),
            ("plain2", ["k", "other"]),
            ("t1.5", {"k": 1.5}),
        ],
    )
    assert p.advance("k", 4) == 0
    # Plain watchers in watch order, then thresholds <= 4 in threshold order
    # (ties in watch order); never t5 or t9.
    assert log == ["plain1", "plain2", "t1.5", "t3a", "t3b"]
    assert p.watermark("k") == 4
    log.clear()
    assert p.advance("k", 5) == 0
    # Reached and not ready: checked again, before the newly reached t5.
    assert log == ["plain1", "plain2", "t1.5", "t3a", "t3b", "t5"]
    assert p.watched == 8


@each_backend(virtual=True)
async def test_a_lower_or_equal_value_changes_and_checks_nothing() -> None:
    p: ap.Purgatory[Any] = ap.Purgatory()
    log: list[str] = []
    ops = watch_all(p, log, [("plain", ["k"]), ("t2", {"k": 2})])
    assert p.advance("k", 3) == 0
    log.clear()
    ops["plain"].ready = ops["t2"].ready = True
    assert p.advance("k", 3) == 0
    assert p.advance("k", 1) == 0
    assert p.advance("k", 2.5) == 0
    assert log == []
    assert p.watermark("k") == 3
    assert p.advance("k", 3.5) == 2
    assert log == ["plain", "t2"]


@each_backend(virtual=True)
async def test_advance_returns_how_many_it_completed_and_they_leave_at_once() -> None:
    p: ap.Purgatory[Any] = ap.Purgatory()
    log: list[str] = []
    ops = watch_all(p, log, [(f"t{i}", {"k": i, "j": 100 + i}) for i in range(10)])
    for op in ops.values():
        op.ready = True
    assert p.advance("k", 4) == 5
    assert log == ["t0", "t1", "t2", "t3", "t4"]
    assert [op.outcome for op in ops.values()][:6] == [ap.Outcome.COMPLETED] * 5 + [None]
    stats = p.statistics()
    assert (stats.watched, stats.pending, stats.delayed, stats.keys) == (10, 5, 5, 2)
    assert stats.advances == 1
    log.clear()
    # The other key's heap still counts the finished ones as gone.
    assert p.advance("j", 104) == 0
    assert log == []
    assert p.advance("j", 106) == 2
    assert log == ["t5", "t6"]


@each_backend(virtual=True)
async def test_check_and_complete_checks_every_watcher_whatever_the_watermark() -> None:
    p: ap.Purgatory[Any] = ap.Purgatory()
    log: list[str] = []
    watch_all(p, log, [("t7", {"k": 7}), ("plain", ["k"]), ("t2", {"k": 2}), ("t2b", {"k": 2})])
    assert p.check_and_complete("k") == 0
    assert log == ["plain", "t2", "t2b", "t7"]
    assert p.watermark("k") is None
    log.clear()
    p.advance("k", 2)
    log.clear()
    assert p.check_and_complete("k") == 0
    assert log == ["plain", "t2", "t2b", "t7"]


@each_backend(virtual=True)
async def test_an_op_watched_below_the_watermark_keeps_threshold_order() -> None:
    p: ap.Purgatory[Any] = ap.Purgatory()
    log: list[str] = []
    watch_all(p, log, [("t5", {"k": 5})])
    p.advance("k", 6)  # t5 reached, not ready
    late = Recorded("t2", log)
    assert p.try_complete_else_watch(late, {"k": 2}) is False
    log.clear()
    p.advance("k", 7)
    assert log == ["t2", "t5"]
    log.clear()
    p.advance("k", 8)
    assert log == ["t2", "t5"]


@each_backend(virtual=True)
async def test_the_watermark_is_kept_only_while_the_key_is_watched() -> None:
    p: ap.Purgatory[Any] = ap.Purgatory()
    assert p.advance("nobody", 10) == 0
    assert p.watermark("nobody") is None
    assert p.statistics().advances == 0
    log: list[str] = []
    ops = watch_all(p, log, [("a", {"k": 50}), ("b", ["k"])])
    p.advance("k", 10)
    assert p.watermark("k") == 10
    ops["a"].cancel()
    assert p.watermark("k") == 10  # b still watches k
    ops["b"].ready = True
    assert p.check_and_complete("k") == 1
    assert p.watermark("k") is None
    assert p.keys() == []
    assert p._watermarks == {}
    assert p._threshold_watchers == {}


@each_backend(virtual=True)
async def test_values_and_thresholds_of_any_number_type() -> None:
    p: ap.Purgatory[Any] = ap.Purgatory()
    log: list[str] = []
    ops = watch_all(p, log, [("big", {"k": 2**60 + 1}), ("f", {"k": 0.5})])
    for op in ops.values():
        op.ready = True
    assert p.advance("k", 1) == 1
    assert p.advance("k", 2**60) == 0
    assert p.advance("k", 2**60 + 1) == 1
    assert log == ["f", "big"]


@each_backend(virtual=True)
async def test_bad_advances_change_nothing() -> None:
    p: ap.Purgatory[Any] = ap.Purgatory()
    log: list[str] = []
    watch_all(p, log, [("t1", {"k": 1})])
    p.advance("k", 0)
    before = p.statistics()
    for value, error, match in [
        ("2", TypeError, "value must be an int or a float, got str"),
        (True, TypeError, "value must be an int or a float, got bool"),
        (None, TypeError, "value"),
        (float("nan"), ValueError, "value must not be NaN"),
    ]:
        with pytest.raises(error, match=match):
            p.advance("k", value)  # type: ignore[arg-type]
        with pytest.raises(error, match=match):
            p.advance_threadsafe("k", value)  # type: ignore[arg-type]
    unhashable: Any = ["un", "hashable"]
    with pytest.raises(TypeError, match="hashable"):
        p.advance(unhashable, 3)
    with pytest.raises(TypeError, match="hashable"):
        p.watermark(unhashable)
    assert p.statistics() == before
    assert p.watermark("k") == 0
    assert log == []


@each_backend
async def test_watermark_operation_completes_on_its_thresholds_alone(backend: str) -> None:
    p: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory()
    partition = ("orders", 0)
    outcomes: list[ap.Outcome] = []

    async def wait(op: ap.WatermarkOperation, keys: Any) -> None:
        outcomes.append(await p.watch(op, keys))

    ops = [ap.WatermarkOperation(30.0) for _ in range(3)]
    import anyio

    async with anyio.create_task_group() as tg:
        for offset, op in zip([3, 1, 2], ops, strict=True):
            tg.start_soon(wait, op, {partition: offset})
        await settle()
        assert p.advance(partition, 2) == 2
        await settle()
        assert [op.outcome for op in ops] == [None, ap.Outcome.COMPLETED, ap.Outcome.COMPLETED]
        assert p.advance(partition, 5) == 1
    assert outcomes == [ap.Outcome.COMPLETED] * 3
    # Already reached when watched: completes at once, no wait.
    late = ap.WatermarkOperation(30.0)
    keep = ap.WatermarkOperation(30.0)
    assert p.try_complete_else_watch(keep, {partition: 100}) is False
    p.advance(partition, 10)
    assert p.try_complete_else_watch(late, {partition: 10}) is True
    assert keep.keys == (partition,)
    assert late.keys == ()  # finished by its first check: never watched
    keep.cancel()


@each_backend(virtual=True)
async def test_watermark_operation_any_key_or_all_keys() -> None:
    p: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory()
    any_op = ap.WatermarkOperation(30.0)
    all_op = ap.WatermarkOperation(30.0, all_keys=True)
    for op in (any_op, all_op):
        assert p.try_complete_else_watch(op, {"a": 5, "b": 5}) is False
    assert p.advance("a", 5) == 1
    assert any_op.outcome is ap.Outcome.COMPLETED
    assert all_op.outcome is None
    assert p.advance("b", 4) == 0
    assert p.advance("b", 5) == 1
    assert all_op.outcome is ap.Outcome.COMPLETED


@each_backend(virtual=True)
async def test_watermark_operation_watched_without_thresholds_fails_loudly() -> None:
    p: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory()
    op = ap.WatermarkOperation(30.0)
    with pytest.raises(TypeError, match=r"watch\(op, \{key: threshold\}\)"):
        await p.watch(op, ["k"])
    assert op.outcome is ap.Outcome.FAILED
    assert p.statistics().pending == 0


@each_backend(virtual=True)
async def test_watermark_operation_expires() -> None:
    from tests.support.backends import now

    p: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory()
    start = now()
    op = ap.WatermarkOperation(2.0)
    assert await p.watch(op, {"k": 1}) is ap.Outcome.EXPIRED
    assert now() - start >= 2.0
    assert p.keys() == []


class Announced(ap.WatermarkOperation):
    """A subclass, as the docs suggest: its own fields, ``on_complete``, ``on_expiration``."""

    def __init__(self, timeout: float, name: str, log: list[str], *, all_keys: bool = False):
        super().__init__(timeout, all_keys=all_keys)
        self.name = name
        self.log = log

    def on_complete(self) -> None:
        self.log.append(f"{self.name} complete")

    def on_expiration(self) -> None:
        self.log.append(f"{self.name} expired")


class AlsoWaitsForFlag(ap.WatermarkOperation):
    """Adds a condition of its own to the thresholds (slots, as users may write)."""

    __slots__ = ("flag",)

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.flag = False

    def try_complete(self) -> bool:
        return self.flag and super().try_complete()


@each_backend(virtual=True)
async def test_watermark_operation_subclasses_keep_their_callbacks_and_conditions() -> None:
    # WatermarkOperation is a compiled class in the compiled core: Python subclasses
    # keep their fields, keyword arguments, callbacks and try_complete overrides.
    p: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory()
    log: list[str] = []
    done = Announced(30.0, "done", log, all_keys=True)
    late = Announced(1.0, "late", log)
    flagged = AlsoWaitsForFlag(30.0)
    assert p.try_complete_else_watch(done, {"a": 1, "b": 1}) is False
    assert p.try_complete_else_watch(flagged, {"a": 1}) is False
    assert p.try_complete_else_watch(late, {"c": 1}) is False
    assert p.advance("a", 1) == 0  # done waits for "b" too; flagged for its flag
    assert (done.outcome, flagged.outcome) == (None, None)
    assert p.advance("b", 1) == 1
    assert done.outcome is ap.Outcome.COMPLETED
    flagged.flag = True
    assert p.advance("a", 2) == 1
    assert flagged.outcome is ap.Outcome.COMPLETED
    assert await late is ap.Outcome.EXPIRED
    assert log == ["done complete", "late complete", "late expired"]
    with pytest.raises(TypeError):
        ap.WatermarkOperation(1.0, True)  # type: ignore[call-arg]  # all_keys is keyword-only
    with pytest.raises(TypeError, match="timeout"):
        ap.WatermarkOperation("soon")  # type: ignore[arg-type]


# -- try_complete returning True, and tuples as keys (issue 30, items 1-2) -------------


class SaysTrue(ap.DelayedOperation):
    """Kafka users' mistake: ``return True`` without ``force_complete()``."""

    def __init__(self) -> None:
        super().__init__(60.0)
        self.ready = False
        self.completions = 0

    def try_complete(self) -> bool:
        return self.ready

    def on_complete(self) -> None:
        self.completions += 1


@each_backend(virtual=True)
async def test_try_complete_returning_true_completes_the_op_on_every_path() -> None:
    p: ap.Purgatory[SaysTrue] = ap.Purgatory()
    first = SaysTrue()
    first.ready = True
    assert p.try_complete_else_watch(first, ["k"]) is True
    assert first.outcome is ap.Outcome.COMPLETED
    by_check, by_advance, by_threshold = SaysTrue(), SaysTrue(), SaysTrue()
    p.try_complete_else_watch(by_check, ["c"])
    p.try_complete_else_watch(by_advance, ["a"])
    p.try_complete_else_watch(by_threshold, {"t": 3})
    for op in (by_check, by_advance, by_threshold):
        op.ready = True
    assert p.check_and_complete("c") == 1
    assert p.advance("a", 1) == 1
    assert p.advance("t", 2) == 0
    assert p.advance("t", 3) == 1
    for op in (first, by_check, by_advance, by_threshold):
        assert op.outcome is ap.Outcome.COMPLETED
        assert op.completions == 1
    assert await by_check is ap.Outcome.COMPLETED
    assert p.statistics().pending == 0


@each_backend(virtual=True)
async def test_a_tuple_as_keys_is_refused_with_how_to_pass_keys() -> None:
    p: ap.Purgatory[Any] = ap.Purgatory()
    op = Recorded("op", [])
    for keys in [("orders", 0), ("orders",), ()]:
        with pytest.raises(TypeError, match=r"tuple.*\[\('orders', 0\)\]"):
            p.try_complete_else_watch(op, keys)
        with pytest.raises(TypeError, match="tuple"):
            await p.watch(op, keys)
    assert op.log == []
    assert p.statistics().pending == 0
    # The composite key, in a list, or with a threshold.
    assert p.try_complete_else_watch(op, [("orders", 0)]) is False
    other = Recorded("other", op.log)
    assert p.try_complete_else_watch(other, {("orders", 0): 5}) is False
    op.log.clear()
    assert p.check_and_complete(("orders", 0)) == 0
    assert op.log == ["op", "other"]
    assert sorted(map(str, p.keys())) == ["('orders', 0)"]


# -- threads --------------------------------------------------------------------------


async def test_advance_threadsafe_runs_on_the_loop() -> None:
    p: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory()
    ops = [ap.WatermarkOperation(30.0) for _ in range(5)]
    for i, op in enumerate(ops):
        p.try_complete_else_watch(op, {"k": i})
    loop_thread = threading.get_ident()
    seen: list[int] = []
    original = p.advance

    def spy(key: Hashable, value: float) -> int:
        seen.append(threading.get_ident())
        return original(key, value)

    p.advance = spy  # type: ignore[method-assign]
    result = await asyncio.to_thread(lambda: p.advance_threadsafe("k", 2).result(timeout=10))
    assert result == 3
    assert seen == [loop_thread]
    assert [op.done() for op in ops] == [True, True, True, False, False]
    p.close()


def test_advance_threadsafe_before_binding_is_done_with_zero() -> None:
    p: ap.Purgatory[Any] = ap.Purgatory()
    assert p.advance_threadsafe("k", 1).result(timeout=0) == 0


# -- what a trigger costs: counted checks, not times -------------------------------------


class Counted(ap.DelayedOperation):
    """Completes once the log's high watermark reaches its required offset; counts checks."""

    checks = 0
    high_watermark = 0  # the source of truth (the partition's), read by every check

    def __init__(self, required: int) -> None:
        super().__init__(3600.0)
        self.required = required

    def try_complete(self) -> bool:
        Counted.checks += 1
        if Counted.high_watermark >= self.required:
            return self.force_complete()
        return False


def checks_per_trigger(pending: int, triggers: int, *, thresholds: bool) -> float:
    """Checks per trigger with ``pending`` ops on one key, the watermark up by one each time."""

    async def main() -> float:
        p: ap.Purgatory[Counted] = ap.Purgatory()
        Counted.high_watermark = 0
        for offset in range(1, pending + 1):
            op = Counted(offset)
            p.try_complete_else_watch(op, {"p0": offset} if thresholds else ["p0"])
        Counted.checks = 0
        for mark in range(1, triggers + 1):
            Counted.high_watermark = mark
            if thresholds:
                assert p.advance("p0", mark) == 1
            else:
                assert p.check_and_complete("p0") == 1
        checks = Counted.checks
        p.close()
        return checks / triggers

    return ap.simulation.run(main())


def test_a_trigger_costs_what_it_completes_not_the_watch_list() -> None:
    # Issue 28's done-when, counted: at 20,000 pending, advance checks >= 100x
    # fewer ops than check_and_complete, and no more than 3x what it checks at
    # 200 pending (here: exactly the one op it completes, at both sizes).
    big = checks_per_trigger(20_000, 50, thresholds=True)
    small = checks_per_trigger(200, 50, thresholds=True)
    scan = checks_per_trigger(20_000, 50, thresholds=False)
    assert big == small == 1.0
    assert scan >= 19_950
    assert scan / big >= 100


def test_finished_threshold_watchers_do_not_accumulate() -> None:
    # Ops that expire or are cancelled under a key whose watermark never reaches
    # them: the heap keeps at most about twice the live entries.
    async def main() -> None:
        p: ap.Purgatory[Any] = ap.Purgatory()
        keep = [ap.WatermarkOperation(3600.0) for _ in range(10)]
        for i, op in enumerate(keep):
            p.try_complete_else_watch(op, {"k": 10**6 + i})
        for round_ in range(50):
            batch = [ap.WatermarkOperation(3600.0) for _ in range(200)]
            for j, op in enumerate(batch):
                # Ascending thresholds (the run) in even rounds, descending (the heap) in odd.
                p.try_complete_else_watch(op, {"k": 10**7 + (j if round_ % 2 else -j)})
            for op in batch:
                op.cancel()
            heap = [*p._threshold_watchers["k"].heap, *p._threshold_watchers["k"].run]
            assert len(heap) <= 2 * 10 + 32 + 1, (round_, len(heap))
        # Ops the watermark reached that said no, then expire or are cancelled
        # with no advance in between: the reached entries stay bounded too.
        for round_ in range(50):
            batch = [ap.WatermarkOperation(3600.0, all_keys=True) for _ in range(200)]
            for j, op in enumerate(batch):
                p.try_complete_else_watch(op, {"k": j, "flag": 10**9})  # both keys: waits
            assert p.advance("k", 10**5 + round_) == 0
            for op in batch:
                op.cancel()
            reached = p._threshold_watchers["k"].reached
            assert len(reached) <= 2 * 10 + 32 + 1, (round_, len(reached))
        assert p.watched == 10
        for op in keep:
            op.cancel()
        assert p._threshold_watchers == {}

    ap.simulation.run(main())


def test_many_watchers_checked_as_the_naive_model_says() -> None:
    # Hundreds of ops per key (enough to compact the run, the heap and the
    # reached entries many times over), mostly ascending thresholds with some
    # out of order and some at or below the watermark, ops that say no, and
    # cancellations: every advance checks exactly the pending ops whose
    # threshold it reached, in threshold order (ties in watch order).
    import random

    rng = random.Random(2028)

    async def main() -> None:
        p: ap.Purgatory[Any] = ap.Purgatory()
        log: list[str] = []
        ops: dict[str, Recorded] = {}
        thresholds: dict[str, tuple[int, int]] = {}  # name -> (threshold, watch order)
        mark = 0
        for step in range(4000):
            roll = rng.random()
            if roll < 0.45:
                name = f"o{step}"
                if rng.random() < 0.8:
                    threshold = mark + 1 + step // 8 + rng.randrange(40)
                else:
                    threshold = rng.randrange(max(1, mark + 30))  # anywhere, even reached
                op = Recorded(name, log, timeout=3600.0)
                op.ready = rng.random() < 0.6
                log.clear()
                if p.try_complete_else_watch(op, {"k": threshold}):
                    continue
                ops[name] = op
                thresholds[name] = (threshold, step)
            elif roll < 0.6 and ops:
                name = rng.choice(sorted(ops))
                ops.pop(name).cancel()
            elif roll < 0.7 and ops:
                ops[rng.choice(sorted(ops))].ready = True
            else:
                value = mark + rng.randrange(1, 12)
                expected = sorted(
                    (n for n in ops if thresholds[n][0] <= value),
                    key=lambda n: thresholds[n],
                )
                log.clear()
                completed = p.advance("k", value)
                mark = value
                assert log == expected, step
                assert completed == sum(ops[n].ready for n in expected)
                for n in expected:
                    if ops[n].ready:
                        del ops[n]
            watch = p._threshold_watchers.get("k")
            if ops:
                assert watch is not None
                assert sorted(map(id, watch.pending())) == sorted(map(id, ops.values()))
                assert watch.count == len(ops)
                stored = len(watch.heap) + len(watch.run) - watch.head + len(watch.reached)
                assert stored <= 3 * len(ops) + 3 * 32 + 1, step
            else:
                assert watch is None
        for op in ops.values():
            op.cancel()
        assert p.pending == 0

    ap.simulation.run(main())


def test_a_finished_ops_entry_never_reaches_a_new_op_at_the_same_address() -> None:
    # A finished op's entry may stay in the index until it is popped. Once the
    # op is freed, a new object can get its id: the entry must not make the
    # watermark reach the new op at the old op's threshold.
    async def main() -> None:
        p: ap.Purgatory[Any] = ap.Purgatory()
        log: list[str] = []
        keep = Recorded("keep", log)  # keeps the key's index alive
        assert p.try_complete_else_watch(keep, {"k": 1000}) is False
        reused = False
        for attempt in range(200):
            old = Recorded(f"old{attempt}", log)
            assert p.try_complete_else_watch(old, {"k": 5}) is False
            old_id = id(old)
            old.cancel()  # its entry (threshold 5) stays in the index
            del old
            await asyncio.sleep(0)  # the timer lets go of it at its next flush
            new = Recorded(f"new{attempt}", log)
            assert p.try_complete_else_watch(new, {"k": 10**6 + attempt}) is False
            reused = reused or id(new) == old_id
        assert reused, "CPython gave no freed op's address to a new op: nothing tested"
        log.clear()
        assert p.advance("k", 10) == 0
        assert log == []  # no op has a threshold at or below 10
        p.close()

    ap.simulation.run(main())
