"""An operation's stage, one field each: taken (_purgatory), joined (_joined), finished."""

from __future__ import annotations

import pytest

import aiopurgatory as ap


class Ready(ap.DelayedOperation):
    def try_complete(self) -> bool:
        return self.force_complete()


@pytest.mark.parametrize("finish", ["force_complete", "cancel"])
async def test_a_watched_op_joined_and_stays_joined_when_finished(finish: str) -> None:
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("stages")
    op = ap.DelayedOperation(10.0)
    assert (op._purgatory, op._joined, op.outcome) == (None, False, None)
    assert purgatory.try_complete_else_watch(op, ["k"]) is False
    assert (op._purgatory, op._joined, op.outcome) == (purgatory, True, None)
    assert op.keys == ("k",)
    assert purgatory.delayed == purgatory.pending == 1
    assert getattr(op, finish)() is True
    assert op._joined
    assert op.keys == ("k",)
    assert purgatory.delayed == purgatory.pending == 0
    assert purgatory.keys() == []
    purgatory.close()


async def test_an_op_finished_by_its_first_check_never_joined() -> None:
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("stages")
    op = Ready(10.0)
    assert purgatory.try_complete_else_watch(op, ["k"]) is True
    assert (op._purgatory, op._joined, op.outcome) == (purgatory, False, ap.Outcome.COMPLETED)
    assert op.keys == ()
    assert purgatory.statistics().completed == 1
    assert purgatory.delayed == purgatory.pending == 0
    purgatory.close()


async def test_every_outcome_finishes_once_through_one_path() -> None:
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("stages")
    calls: list[str] = []

    class Op(ap.DelayedOperation):
        def on_complete(self) -> None:
            calls.append("on_complete")

        def on_expiration(self) -> None:
            calls.append("on_expiration")

    completed, cancelled = Op(10.0), Op(10.0)
    for op in (completed, cancelled):
        purgatory.try_complete_else_watch(op, ["k"])
    assert completed.force_complete()
    assert not completed.force_complete()
    assert not completed.cancel()
    assert cancelled.cancel()
    assert not cancelled.force_complete()
    assert calls == ["on_complete"]
    stats = purgatory.statistics()
    assert (stats.completed, stats.cancelled, stats.pending, stats.watched) == (1, 1, 0, 0)
    purgatory.close()
