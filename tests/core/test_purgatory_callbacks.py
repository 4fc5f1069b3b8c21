"""The purgatory's callbacks: expiry and its callbacks, exactly once under races, failures
contained, re-entrancy (SPEC.md, DelayedOperation and Purgatory).

Backend-neutral, as ``tests/core/test_purgatory.py`` (see there).
"""

from __future__ import annotations

import anyio
import anyio.abc
import anyio.to_thread
import pytest
from structlog.testing import capture_logs

import aiopurgatory as ap
from tests.support.backends import each_backend, now, settle
from tests.support.purgatory import (
    CANCELLED,
    COMPLETED,
    EXPIRED,
    FAILED,
    Boom,
    Op,
    assert_clean,
    collect_garbage,
    failures,
    loop_errors,
    observe,
    outcome,
    start,
)

# =====================================================================================
# Expiry and callbacks
# =====================================================================================


@each_backend(virtual=True)
async def test_zero_timeout_expires_on_a_later_iteration_never_synchronously() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(0)
    assert p.try_complete_else_watch(op, ["k"]) is False
    assert outcome(op) is None
    assert op.callbacks() == []
    assert (p.watched, p.delayed) == (1, 1)
    assert op.deadline == 0
    await settle()
    assert op.outcome is EXPIRED
    assert op.expired_at == [0.0]
    assert now() == 0.0
    assert_clean(p)


@each_backend(virtual=True)
async def test_zero_timeout_watch_returns_expired() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    assert await p.watch(Op(0), ["k"]) is EXPIRED
    assert now() == 0


@each_backend(virtual=True)
async def test_zero_timeout_can_still_be_triggered_before_it_expires() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(0)
    p.try_complete_else_watch(op, ["k"])
    op.completable = True
    assert p.check_and_complete("k") == 1
    await settle()
    assert op.outcome is COMPLETED
    assert op.callbacks() == ["on_complete"]


@each_backend(virtual=True)
async def test_callbacks_per_outcome() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    completed, expired, cancelled = Op(0.1), Op(0.1), Op(0.1)
    for op in (completed, expired, cancelled):
        p.try_complete_else_watch(op, ["k"])
    assert completed.force_complete() is True
    assert cancelled.cancel() is True
    await anyio.sleep(1)
    assert completed.callbacks() == ["on_complete"]
    assert expired.callbacks() == ["on_complete", "on_expiration"]
    assert cancelled.callbacks() == []
    assert [completed.is_completed, expired.is_completed, cancelled.is_completed] == [
        True,
        True,
        False,
    ]
    assert all(op.done() for op in (completed, expired, cancelled))
    for op in (completed, expired, cancelled):
        assert op.force_complete() is False
        assert op.cancel() is False
    assert expired.callbacks() == ["on_complete", "on_expiration"]
    stats = p.statistics()
    assert (stats.completed, stats.expired, stats.cancelled, stats.failed) == (1, 1, 1, 0)


@each_backend(virtual=True)
async def test_deadline_stays_after_finish() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(0.5)
    p.try_complete_else_watch(op, ["k"])
    op.force_complete()
    assert op.deadline == 0.5


# =====================================================================================
# Exactly once under races
# =====================================================================================


def _record_force_complete(results: dict[str, bool], op: Op) -> None:
    results[op.name] = op.force_complete()


@each_backend(virtual=True)
async def test_complete_and_expire_in_the_same_tick() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    ops = [Op(0.05, name=str(i)) for i in range(10)]
    results: dict[str, bool] = {}
    for op in ops:
        # A callback at the same instant as the purgatory's bucket, from a timer of
        # its own per op (as a loop.call_at per op would be, on any backend): on
        # asyncio call_at handles of one loop iteration, on trio driver tasks woken
        # in one batch (in a shuffled order). Either may win (here each does, for
        # some of the ops).
        ap.Timer().call_at(0.05, _record_force_complete, results, op)
        p.try_complete_else_watch(op, ["k"])
    await anyio.sleep(0.1)
    for op in ops:
        if op.outcome is COMPLETED:
            assert results[op.name] is True
            assert op.callbacks() == ["on_complete"]
        else:
            assert op.outcome is EXPIRED
            assert results[op.name] is False
            assert op.callbacks() == ["on_complete", "on_expiration"]
    stats = p.statistics()
    assert stats.completed + stats.expired == 10
    assert_clean(p)


@each_backend(virtual=True)
async def test_expiry_callback_finishing_other_ops_of_the_same_tick() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    a, b, c, d = (Op(0.05, name=n) for n in "abcd")
    for op in (a, b, c, d):
        p.try_complete_else_watch(op, ["k"])
    # Whichever of a/b expires first finishes the other (complete or cancel).
    a.after_expire = lambda: b.force_complete()
    b.after_expire = lambda: a.force_complete()
    c.after_complete = lambda: d.cancel()
    d.after_complete = lambda: c.cancel()
    with loop_errors() as errors:
        await anyio.sleep(0.1)
    assert {a.outcome, b.outcome} == {EXPIRED, COMPLETED}
    assert {c.outcome, d.outcome} == {EXPIRED, CANCELLED}
    for op in (a, b, c, d):
        assert op.calls.count("on_complete") == (0 if op.outcome is CANCELLED else 1)
        assert op.calls.count("on_expiration") == (1 if op.outcome is EXPIRED else 0)
    assert_clean(p)
    assert errors == []


@each_backend(virtual=True)
async def test_cancel_inside_on_complete_of_another_op() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    a, b = Op(1.0, completable=True, name="a"), Op(1.0, completable=True, name="b")
    a.completable = b.completable = False
    p.try_complete_else_watch(a, ["k"])
    p.try_complete_else_watch(b, ["k"])
    a.completable = b.completable = True
    a.after_complete = lambda: b.cancel()
    assert p.check_and_complete("k") == 1
    assert a.outcome is COMPLETED
    assert b.outcome is CANCELLED
    assert b.callbacks() == []
    assert_clean(p)


# =====================================================================================
# Containment of callback failures
# =====================================================================================


@each_backend(virtual=True)
async def test_try_complete_raising_while_watching() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0, name="x")
    failing_try = 1  # the only check
    op.on_try = lambda: _raise_if(op.tries == failing_try)
    with capture_logs() as logs:
        with pytest.raises(Boom):
            p.try_complete_else_watch(op, ["a", "b"])
        assert op.outcome is FAILED
        assert op.done()
        assert not op.is_completed
        assert op.callbacks() == []
        assert op.tries == failing_try
        assert_clean(p)
        assert p.statistics().failed == 1
        with pytest.raises(Boom):
            await op
        assert op.force_complete() is False
        assert op.cancel() is False
    # Raised to the caller: received, so not also logged (issue 30).
    assert failures(logs) == []


def _raise_if(condition: bool) -> None:
    if condition:
        raise Boom("try_complete")


@each_backend(virtual=True)
async def test_try_complete_raising_inside_watch_propagates() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0, raise_in=frozenset({"try_complete"}))
    with capture_logs() as logs:
        with pytest.raises(Boom):
            await p.watch(op, ["k"])
        assert op.outcome is FAILED
        del op
        await collect_garbage()
    assert failures(logs) == []  # raised to the caller of watch(): not also logged
    assert_clean(p)


@each_backend(virtual=True)
async def test_try_complete_raising_after_force_complete_keeps_completed() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0, completable=True, raise_in=frozenset({"try_complete"}))
    with capture_logs() as logs:
        with pytest.raises(Boom):
            p.try_complete_else_watch(op, ["k"])
        assert op.outcome is COMPLETED
        assert op.is_completed
        assert op.callbacks() == ["on_complete"]
        stats = p.statistics()
        assert (stats.completed, stats.failed) == (1, 0)
        with pytest.raises(Boom):
            await op
        del op
        await collect_garbage()
    assert failures(logs) == []  # raised to the caller
    assert_clean(p)


@each_backend(virtual=True)
async def test_try_complete_raising_in_check_and_complete_is_contained() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    before, bad, late_bad, after = (Op(1.0, name=n) for n in ("before", "bad", "late", "after"))
    for op in (before, bad, late_bad, after):
        p.try_complete_else_watch(op, ["k", op.name])
    with loop_errors() as errors, capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            watcher = start(tg, observe, bad)
            await settle()
            before.completable = after.completable = late_bad.completable = True
            bad.raise_in = late_bad.raise_in = frozenset({"try_complete"})
            # before, late_bad (completed, then raised), after
            assert p.check_and_complete("k") == 3
            assert bad.outcome is FAILED
            assert bad.callbacks() == []
            assert late_bad.outcome is COMPLETED
            assert late_bad.callbacks() == ["on_complete"]
            assert before.outcome is COMPLETED
            assert after.outcome is COMPLETED
            with pytest.raises(Boom):
                await watcher.result()
        assert_clean(p)
        stats = p.statistics()
        assert (stats.completed, stats.failed) == (3, 1)
        # bad's failure reached its watcher; late_bad's reached nobody: logged
        # once late_bad is gone.
        late_repr = repr(late_bad)
        assert failures(logs) == []
        # (bad's traceback holds the trigger's frame, which on the pure-Python
        # core holds the operations it checked: let go of it too.)
        del late_bad, op, bad, watcher
        await collect_garbage()
    assert [e["op"] for e in failures(logs)] == [late_repr]
    assert errors == []


@each_backend(virtual=True)
async def test_on_complete_raising_during_expiry_skips_on_expiration() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    bad = Op(0.1, raise_in=frozenset({"on_complete"}), name="bad")
    same_tick, later = Op(0.1, name="same"), Op(0.3, name="later")
    for op in (bad, same_tick, later):
        p.try_complete_else_watch(op, ["k"])
    with loop_errors() as errors, capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            watcher = start(tg, observe, bad)
            await anyio.sleep(0.2)
            assert bad.outcome is EXPIRED
            assert bad.callbacks() == ["on_complete"]
            assert same_tick.callbacks() == ["on_complete", "on_expiration"]
            with pytest.raises(Boom):
                await watcher.result()
            assert await later is EXPIRED  # the timer keeps working
        del bad
        await collect_garbage()
    assert failures(logs) == []  # its watcher received it
    assert p.statistics().expired == 3
    assert errors == []
    assert_clean(p)


@each_backend(virtual=True)
async def test_on_expiration_raising_keeps_expired() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(0.1, raise_in=frozenset({"on_expiration"}))
    with loop_errors() as errors:
        with capture_logs() as logs:
            with pytest.raises(Boom):
                await p.watch(op, ["k"])
            assert op.outcome is EXPIRED
            assert op.callbacks() == ["on_complete", "on_expiration"]
            del op
            await collect_garbage()
        assert failures(logs) == []  # watch() raised it
    assert errors == []
    assert await p.watch(Op(0.1), ["k"]) is EXPIRED
    assert_clean(p)


@each_backend(virtual=True)
async def test_on_complete_raising_in_trigger_keeps_completed() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    op = Op(1.0, raise_in=frozenset({"on_complete"}))
    other = Op(1.0)
    p.try_complete_else_watch(op, ["k"])
    p.try_complete_else_watch(other, ["k"])
    op.completable = other.completable = True
    with capture_logs() as logs:
        assert p.check_and_complete("k") == 2
        assert op.outcome is COMPLETED
        assert other.outcome is COMPLETED
        assert op.force_complete() is False
        assert failures(logs) == []  # not yet: someone may still ask op for it
        op_repr = repr(op)
        del op
        await collect_garbage()
    # Nobody received it: logged once the operation is gone.
    [entry] = failures(logs)
    assert entry["callback"] == "on_complete"
    assert entry["op"] == op_repr
    assert isinstance(entry["exc_info"], Boom)


# =====================================================================================
# Re-entrancy
# =====================================================================================


@each_backend(virtual=True)
async def test_callbacks_watch_complete_and_cancel_on_the_key_being_checked() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    a, b, c, d = (Op(1.0, completable=False, name=n) for n in "abcd")
    for op in (a, b, c, d):
        p.try_complete_else_watch(op, ["k"])
    e = Op(1.0, name="e")
    inner: list[int] = []

    def a_done() -> None:
        assert p.try_complete_else_watch(e, ["k"]) is False  # joins the list being checked
        assert c.force_complete() is True
        assert d.cancel() is True
        inner.append(p.check_and_complete("k"))  # nested trigger on the same key

    a.after_complete = a_done
    a.completable = b.completable = c.completable = d.completable = True
    assert p.check_and_complete("k") == 1  # a; b was completed by the nested call
    assert inner == [1]  # b (c, d already gone; e not completable)
    assert [op.outcome for op in (a, b, c, d, e)] == [
        COMPLETED,
        COMPLETED,
        COMPLETED,
        CANCELLED,
        None,
    ]
    for op in (a, b, c):
        assert op.callbacks() == ["on_complete"]
    assert d.callbacks() == []
    assert e.tries == 2  # one check on watch, one from the nested trigger
    assert (p.watched, p.delayed, p.pending) == (1, 1, 1)
    e.completable = True
    assert p.check_and_complete("k") == 1
    assert_clean(p)


@each_backend(virtual=True)
async def test_callback_making_a_later_op_completable_is_seen_by_the_same_trigger() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    a, b = Op(1.0, name="a"), Op(1.0, name="b")
    p.try_complete_else_watch(a, ["k"])
    p.try_complete_else_watch(b, ["k"])
    a.after_complete = lambda: setattr(b, "completable", True)
    a.completable = True
    assert p.check_and_complete("k") == 2
    assert_clean(p)


@each_backend(virtual=True)
async def test_op_watched_during_a_trigger_is_not_checked_by_it() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    a = Op(1.0, name="a")
    p.try_complete_else_watch(a, ["k"])
    late = Op(1.0, name="late")
    a.after_complete = lambda: p.try_complete_else_watch(late, ["k"])
    a.completable = True
    assert p.check_and_complete("k") == 1
    assert late.tries == 1
    assert outcome(late) is None
    assert p.watched == 1


@each_backend(virtual=True)
async def test_callbacks_touching_other_ops_during_close() -> None:
    p: ap.Purgatory[Op] = ap.Purgatory()
    ops = [Op(1.0, name=str(i)) for i in range(6)]
    for op in ops:
        p.try_complete_else_watch(op, ["k", op.name])
    ops[0].after_expire = lambda: ops[1].force_complete()
    ops[2].after_complete = lambda: ops[3].cancel()
    # Watching from a callback during close fails (closed): contained and logged.
    ops[4].after_complete = lambda: p.try_complete_else_watch(Op(1.0), ["k"])
    with capture_logs() as logs:
        p.close(expire_pending=True)
        assert all(op.done() for op in ops)
        for op in ops:
            assert op.calls.count("on_complete") == (0 if op.outcome is CANCELLED else 1)
        ops.clear()
        del op
        await collect_garbage()
    assert failures(logs)
    assert all(e["error"].startswith("PurgatoryClosedError") for e in failures(logs))
    assert_clean(p)
