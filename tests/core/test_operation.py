"""DelayedOperation on its own: construction, state, force_complete/cancel, awaiting.

Everything that needs a purgatory (watch lists, expiry, triggers) is in
``test_purgatory.py``; here an operation is finished by hand.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

import pytest
from structlog.testing import capture_logs

import aiopurgatory as ap
from aiopurgatory import simulation


class Recording(ap.DelayedOperation):
    """Counts its callbacks; ``fail_in`` names a callback that raises."""

    def __init__(self, timeout: float = 1.0, *, fail_in: str | None = None) -> None:
        super().__init__(timeout)
        self.fail_in = fail_in
        self.completions = 0
        self.expirations = 0
        self.nested_force_complete: bool | None = None

    def on_complete(self) -> None:
        self.completions += 1
        # Re-entering force_complete from our own callback must not finish us twice.
        self.nested_force_complete = self.force_complete()
        if self.fail_in == "on_complete":
            raise ValueError("on_complete failed")

    def on_expiration(self) -> None:
        self.expirations += 1


def failures(logs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [e for e in logs if e["event"] == "aiopurgatory.callback_failed"]


# -- construction ----------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [0, 0.0, 1, 2.5, Fraction(1, 3), 10**6])
def test_timeout_accepts_finite_non_negative_numbers(timeout: float) -> None:
    op = ap.DelayedOperation(timeout)
    assert op.timeout == float(timeout)
    assert isinstance(op.timeout, float)


@pytest.mark.parametrize(
    ("timeout", "error"),
    [
        (-0.001, ValueError),
        (-1, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (-math.inf, ValueError),
        (10**400, ValueError),
        (True, TypeError),
        (False, TypeError),
        ("1", TypeError),
        (None, TypeError),
        (1j, TypeError),
    ],
)
def test_timeout_rejects_bad_values_naming_the_argument(timeout: Any, error: type) -> None:
    with pytest.raises(error, match="timeout"):
        ap.DelayedOperation(timeout)


def test_timeout_is_read_only() -> None:
    op = ap.DelayedOperation(1.0)
    with pytest.raises(AttributeError):
        op.timeout = 2.0  # type: ignore[misc]
    assert op.timeout == 1.0


def test_new_operation_state() -> None:
    op = ap.DelayedOperation(1.0)
    assert op.outcome is None
    assert not op.done()
    assert not op.is_completed
    assert op.deadline is None
    assert op.try_complete() is False  # the default condition is never met
    assert op.outcome is None
    assert "pending" in repr(op)


def test_outcome_members() -> None:
    assert [o.name for o in ap.Outcome] == ["COMPLETED", "EXPIRED", "CANCELLED", "FAILED"]


def test_error_hierarchy() -> None:
    for error in (ap.PurgatoryClosedError, ap.PurgatoryFullError, ap.OperationStateError):
        assert issubclass(error, ap.PurgatoryError)
    assert issubclass(ap.PurgatoryError, Exception)


# -- force_complete and cancel without a purgatory -------------------------------------


def test_force_complete_first_caller_wins() -> None:
    op = Recording()
    assert op.force_complete() is True
    assert op.outcome is ap.Outcome.COMPLETED
    assert op.is_completed
    assert op.done()
    assert op.completions == 1
    assert op.nested_force_complete is False
    assert op.expirations == 0
    assert op.force_complete() is False
    assert op.cancel() is False
    assert op.completions == 1
    assert op.outcome is ap.Outcome.COMPLETED
    assert "completed" in repr(op)


def test_cancel_first_caller_wins_and_runs_no_callback() -> None:
    op = Recording()
    assert op.cancel() is True
    assert op.outcome is ap.Outcome.CANCELLED
    assert op.done()
    assert not op.is_completed
    assert op.cancel() is False
    assert op.force_complete() is False
    assert op.completions == 0
    assert op.expirations == 0
    assert op.outcome is ap.Outcome.CANCELLED


def test_on_complete_raising_in_force_complete_is_contained() -> None:
    op = Recording(fail_in="on_complete")
    with capture_logs() as logs:
        assert op.force_complete() is True
    assert op.outcome is ap.Outcome.COMPLETED
    assert op.completions == 1
    [entry] = failures(logs)
    assert entry["callback"] == "on_complete"
    assert entry["log_level"] == "error"
    assert isinstance(entry["exc_info"], ValueError)
    assert op.force_complete() is False


# -- awaiting --------------------------------------------------------------------------


async def test_await_finished_operation_returns_its_outcome() -> None:
    done = Recording()
    done.force_complete()
    assert await done is ap.Outcome.COMPLETED
    cancelled = Recording()
    cancelled.cancel()
    assert await cancelled is ap.Outcome.CANCELLED


async def test_await_wakes_every_observer() -> None:
    op = Recording()
    observers = [asyncio.create_task(_observe(op)) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(t.done() for t in observers)
    assert op.force_complete()
    assert await asyncio.gather(*observers) == [ap.Outcome.COMPLETED] * 3


async def _observe(op: ap.DelayedOperation) -> ap.Outcome:
    return await op


async def test_cancelling_an_observer_does_not_cancel_the_operation() -> None:
    op = Recording()
    first = asyncio.create_task(_observe(op))
    second = asyncio.create_task(_observe(op))
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert op.outcome is None
    assert not second.done()
    assert op.cancel()
    assert await second is ap.Outcome.CANCELLED


async def test_observers_and_done_callbacks_come_and_go_in_any_order() -> None:
    # One waiter is kept as itself, more in a list: every way between the two.
    op = Recording()
    calls: list[ap.DelayedOperation] = []
    op.add_done_callback(calls.append)  # the only waiter
    assert op.remove_done_callback(calls.append) == 1
    assert op.remove_done_callback(calls.append) == 0
    gives_up = asyncio.create_task(_observe(op))  # the only waiter again
    await asyncio.sleep(0)
    gives_up.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gives_up
    stays = [asyncio.create_task(_observe(op)) for _ in range(2)]
    await asyncio.sleep(0)
    op.add_done_callback(calls.append)
    op.add_done_callback(print)
    assert op.remove_done_callback(print) == 1  # two observers and a callback left
    first_gives_up = asyncio.create_task(_observe(op))
    await asyncio.sleep(0)
    first_gives_up.cancel()
    await asyncio.sleep(0)
    assert op.force_complete()
    assert await asyncio.gather(*stays) == [ap.Outcome.COMPLETED] * 2
    await asyncio.sleep(0)
    assert calls == [op]
    assert first_gives_up.cancelled()


async def test_await_raises_the_callback_exception() -> None:
    op = Recording(fail_in="on_complete")
    observer = asyncio.create_task(_observe(op))
    await asyncio.sleep(0)
    with capture_logs():
        op.force_complete()
    with pytest.raises(ValueError, match="on_complete failed"):
        await observer
    with pytest.raises(ValueError, match="on_complete failed"):
        await op
    assert op.outcome is ap.Outcome.COMPLETED


# -- a stored failure raised again does not grow ------------------------------------------------


def test_raising_a_stored_failure_again_does_not_grow_its_traceback() -> None:
    class Failing(ap.DelayedOperation):
        def on_complete(self) -> None:
            raise RuntimeError("boom")

    async def main() -> list[int]:
        op = Failing(1.0)
        purgatory: ap.Purgatory[Failing] = ap.Purgatory()
        purgatory.try_complete_else_watch(op, ["k"])
        op.force_complete()
        depths = []
        for _ in range(5):
            try:
                await op
            except RuntimeError as exc:
                tb, depth = exc.__traceback__, 0
                while tb is not None:
                    depth, tb = depth + 1, tb.tb_next
                depths.append(depth)
        return depths

    depths = simulation.run(main())
    assert len(set(depths)) == 1  # the same depth every time
