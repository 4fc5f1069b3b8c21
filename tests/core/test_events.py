"""The op event log's ``error`` field (schema 2): what the recorder writes for an op's answer."""

from __future__ import annotations

import enum
import io
import json
from typing import Any

import pytest
import structlog

import aiopurgatory as ap
from aiopurgatory import simulation
from aiopurgatory.events import SCHEMA_VERSION, EventRecorder, error_of
from tests.support.purgatory import Op


class Code(enum.Enum):
    NONE = 0
    NOT_ENOUGH_REPLICAS = 19


class Answered(ap.DelayedOperation):
    """Completes at once with the answer it was given."""

    def __init__(self, error: object) -> None:
        super().__init__(1.0)
        self.error = error

    def try_complete(self) -> bool:
        return self.force_complete()


class Broken(ap.DelayedOperation):
    def try_complete(self) -> bool:
        raise ZeroDivisionError("cannot tell")


def _events(sink: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in sink.getvalue().splitlines()]


@pytest.mark.virtual_time
async def test_events_carry_the_answer_error() -> None:
    sink = io.StringIO()
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("p")
    with EventRecorder(sink) as recorder:
        recorder.attach(purgatory)
        for error in (None, "NOT_ENOUGH_REPLICAS", Code.NOT_ENOUGH_REPLICAS, 19):
            assert await purgatory.watch(Answered(error), ["k"]) is ap.Outcome.COMPLETED
        assert await purgatory.watch(ap.DelayedOperation(0.01), ["k"]) is ap.Outcome.EXPIRED
        with pytest.raises(ZeroDivisionError):
            await purgatory.watch(Broken(1.0), ["k"])
    events = _events(sink)
    assert SCHEMA_VERSION == 2
    assert [e["schema"] for e in events] == [2] * 6
    assert [(e["outcome"], e["error"]) for e in events] == [
        ("completed", None),
        ("completed", "NOT_ENOUGH_REPLICAS"),
        ("completed", "NOT_ENOUGH_REPLICAS"),  # an enum member by its name
        ("completed", "19"),
        ("expired", None),  # an op without an error attribute: no error
        ("failed", "ZeroDivisionError"),  # try_complete raised: the exception's class
    ]
    # Every field in every line, error right after outcome.
    keys = list(events[0])
    assert keys[keys.index("outcome") + 1] == "error"


def test_error_of_a_pending_op_is_none() -> None:
    assert error_of(ap.DelayedOperation(1.0)) is None
    assert error_of(Answered(Code.NONE)) == "NONE"  # the op decides what "no error" is


# -- the event recorder ------------------------------------------------------------------------


def test_a_second_recorder_is_refused_and_closing_one_leaves_others_alone() -> None:
    async def main() -> tuple[int, int]:
        purgatory: ap.Purgatory[Op] = ap.Purgatory("p")
        other: ap.Purgatory[Op] = ap.Purgatory("q")
        first = EventRecorder(structlog.testing.CapturingLogger())
        second = EventRecorder(structlog.testing.CapturingLogger())
        first.attach(purgatory)
        with pytest.raises(ValueError, match="already has a recorder"):
            second.attach(purgatory)
        second.attach(other)
        first.close()
        await other.watch(Op(0.001), ["k"])
        await purgatory.watch(Op(0.001), ["k"])
        return first.events, second.events

    assert simulation.run(main()) == (0, 1)
