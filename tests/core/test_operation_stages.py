"""An operation's stage, one field each: taken (_purgatory), joined (_joined), finished.

And its threshold entries, one form: the first key's entry (or None), chained
to the next key's, in the field that held the thresholds tuple until the op
joined; its waiters kept in order and forgotten at once, in the field that
holds its failure once it finished.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import aiopurgatory as ap


def waiters(op: ap.DelayedOperation) -> tuple[Any, ...]:
    """The op's waiters, in the order they came."""
    waiters = op._waiters
    if waiters is None:
        return ()
    return tuple(waiters) if type(waiters) is list else (waiters,)


def entries(op: ap.DelayedOperation) -> list[Any]:
    """The op's entries in the threshold index, in the order of its keys (none
    unless joined with thresholds: ``_thresholds`` holds the tuple until then)."""
    entry = op._thresholds
    if entry is None or type(entry) is tuple:
        return []
    chain = []
    while entry is not None:
        chain.append(entry)
        entry = entry.next
    return chain


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


async def test_waiters_keep_their_order_and_one_that_gives_up_leaves_at_once() -> None:
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("stages")
    op = ap.DelayedOperation(10.0)
    assert waiters(op) == ()
    woken: list[str] = []

    async def wait(name: str) -> None:
        assert await op is ap.Outcome.COMPLETED
        woken.append(name)

    first = asyncio.create_task(wait("first"))
    watcher = asyncio.create_task(purgatory.watch(op, ["k"]))
    quitter = asyncio.create_task(wait("quitter"))
    last = asyncio.create_task(wait("last"))
    await asyncio.sleep(0)  # each task awaits
    op.add_done_callback(lambda _op: woken.append("callback"))
    assert len(waiters(op)) == 5  # three awaiters, watch()'s waiter, the callback
    quitter.cancel()
    await asyncio.sleep(0)
    assert len(waiters(op)) == 4  # the one that gave up is gone at once
    assert op.force_complete()
    assert waiters(op) == ()
    assert await watcher is ap.Outcome.COMPLETED
    await asyncio.gather(first, last)
    assert woken == ["first", "last", "callback"]  # woken in the order they came
    assert quitter.cancelled()
    purgatory.close()


@pytest.mark.parametrize("keys", [1, 3])
async def test_threshold_entries_are_a_chain_in_key_order_while_joined(keys: int) -> None:
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("stages")
    plain, op = ap.DelayedOperation(10.0), ap.DelayedOperation(10.0)
    purgatory.try_complete_else_watch(plain, ["k"])
    assert entries(plain) == []  # watched without thresholds
    assert entries(op) == []
    purgatory.try_complete_else_watch(op, {f"k{i}": 10 * i for i in range(keys)})
    assert type(op._thresholds) is not tuple  # the tuple's place, taken by the chain
    assert [entry.threshold for entry in entries(op)] == [10 * i for i in range(keys)]
    assert all(entry.op is op for entry in entries(op))
    kept = entries(op)
    assert op.force_complete()
    assert entries(op) == []  # out of the index: it lets go of its entries
    assert all(entry.op is None for entry in kept)  # and they of it
    assert purgatory.keys() == ["k"]
    purgatory.close()
