"""Regression tests for edge cases found by a review of the core.

Each test states the failure it guards against and asserts behaviour; all but
the bulk zero-timeout one fail on the code as it was before the fixes.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
import weakref
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import pytest
import structlog

import aiopurgatory as ap
from aiopurgatory import _shared_timer, simulation
from aiopurgatory.events import EventRecorder


class Op(ap.DelayedOperation):
    __slots__ = ()


# -- deadlines the wheel cannot count ----------------------------------------------------


def test_a_delay_beyond_the_wheel_is_refused_and_others_still_fire() -> None:
    # Used to raise OverflowError inside the driver and lose every other timer
    # scheduled in the same loop iteration.
    async def main() -> tuple[list[str], int]:
        timer = ap.Timer()
        fired: list[str] = []
        timer.call_later(0.01, fired.append, "a")
        with pytest.raises(ValueError, match="delay"):
            timer.call_later(sys.float_info.max, fired.append, "never")
        with pytest.raises(ValueError, match="when"):
            timer.call_at(1e306, fired.append, "never")
        timer.call_later(0.02, fired.append, "b")
        await asyncio.sleep(1)
        return fired, len(timer)

    assert simulation.run(main()) == (["a", "b"], 0)


def test_a_timeout_beyond_the_wheel_is_refused_before_any_state_changes() -> None:
    async def main() -> None:
        purgatory: ap.Purgatory[Op] = ap.Purgatory()
        before = purgatory.statistics()
        huge = Op(1e306)
        with pytest.raises(ValueError, match="timeout"):
            purgatory.try_complete_else_watch(huge, ["k"])
        assert purgatory.statistics() == before
        assert huge.outcome is None
        assert huge.deadline is None
        short = Op(0.5)
        assert not purgatory.try_complete_else_watch(short, ["k"])
        await asyncio.sleep(1)
        assert short.outcome is ap.Outcome.EXPIRED

    simulation.run(main())


# -- many entries already due in one iteration -------------------------------------------


def test_many_due_entries_in_one_iteration_cost_linear_time() -> None:
    # Due entries used to stay staged and be rescanned by every compaction:
    # quadratic (32k calls took minutes). Timed generously, as a guard only.
    async def main(n: int) -> tuple[float, int]:
        timer = ap.Timer()
        fired: list[int] = []
        started = time.process_time()
        for i in range(n):
            timer.call_later(0, fired.append, i)
        elapsed = time.process_time() - started
        await asyncio.sleep(0.01)
        assert fired == list(range(n))  # all run, in scheduling order
        return elapsed, len(timer)

    elapsed, pending = simulation.run(main(40_000))
    assert pending == 0
    assert elapsed < 20  # was minutes


def test_zero_timeout_ops_watched_in_bulk_all_expire() -> None:
    async def main() -> list[ap.Outcome | None]:
        purgatory: ap.Purgatory[Op] = ap.Purgatory()
        ops = [Op(0) for _ in range(10_000)]
        for op in ops:
            purgatory.try_complete_else_watch(op, ["k"])
        await asyncio.sleep(0.01)
        return [op.outcome for op in ops]

    assert set(simulation.run(main())) == {ap.Outcome.EXPIRED}


# -- the shared timer of ap.timeout() ------------------------------------------------------


def test_ap_timeout_does_not_keep_event_loops_alive() -> None:
    refs: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def main() -> None:
        refs.append(weakref.ref(asyncio.get_running_loop()))
        async with ap.timeout(1):
            await asyncio.sleep(0)

    for _ in range(5):
        asyncio.run(main())
    gc.collect()
    assert [r() for r in refs] == [None] * 5


async def test_shared_timer_is_one_per_loop_while_in_use() -> None:
    first = ap.shared_timer()
    assert ap.shared_timer() is first
    assert first.loop is asyncio.get_running_loop()


# -- logging must not lose timers ------------------------------------------------------------


@pytest.fixture
def raising_logging() -> Iterator[None]:
    def explode(logger: Any, name: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
        raise KeyError("a broken processor")

    structlog.configure(processors=[explode])
    yield
    structlog.reset_defaults()


@pytest.mark.usefixtures("raising_logging")
def test_a_raising_lag_log_does_not_lose_the_batch() -> None:
    async def main() -> tuple[list[str], int]:
        loop = asyncio.get_running_loop()
        timer = ap.Timer()
        fired: list[str] = []
        timer.call_later(0.001, fired.append, "a")
        timer.call_later(0.001, fired.append, "b")
        await asyncio.sleep(0)  # the entries reach the wheel
        loop.advance(1.0)  # type: ignore[attr-defined]  # the driver wakes up 1 s late
        await asyncio.sleep(0.01)
        return fired, len(timer)

    assert simulation.run(main()) == (["a", "b"], 0)


# -- used from another loop: refused before anything changes -------------------------------


def test_timer_on_a_closed_loop_refuses_without_changing_state() -> None:
    timer = ap.Timer()

    async def first() -> None:
        timer.call_later(0.001, lambda: None)
        await asyncio.sleep(0.01)

    asyncio.run(first())

    async def second() -> None:
        with pytest.raises(RuntimeError):
            timer.call_later(0.001, lambda: None)
        assert len(timer) == 0

    asyncio.run(second())


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


# -- a timer closed by try_complete itself ------------------------------------------------------


def test_op_whose_try_complete_closes_the_timer_ends_cancelled() -> None:
    timer = ap.Timer()

    class Closing(ap.DelayedOperation):
        calls = 0

        def try_complete(self) -> bool:
            Closing.calls += 1
            if Closing.calls == 1:  # the one check, before joining the watch lists
                timer.close()
            return False

    async def main() -> tuple[ap.Outcome | None, int, int]:
        purgatory: ap.Purgatory[Closing] = ap.Purgatory(timer=timer)
        op = Closing(1.0)
        assert not purgatory.try_complete_else_watch(op, ["k"])
        await asyncio.sleep(2)
        return op.outcome, purgatory.pending, len(timer)

    assert simulation.run(main()) == (ap.Outcome.CANCELLED, 0, 0)
    assert Closing.calls == 1


# -- a clock patched on the loop instance --------------------------------------------------------


def test_a_loop_clock_patched_on_the_instance_is_used() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        loop.time = lambda: 1000.0  # type: ignore[method-assign]
        timer = ap.Timer()
        handle = timer.call_later(1.0, lambda: None)
        when = handle.when()
        handle.cancel()
        return when, loop.time()

    when, now = asyncio.run(main())
    assert when == now + 1.0


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


def test_shared_timer_module_state_is_weak() -> None:
    assert isinstance(_shared_timer._shared, weakref.WeakValueDictionary)


# -- extreme instants: ticks stay in range (they are C integers in the compiled core) ------


def test_a_when_in_the_far_past_is_simply_due() -> None:
    async def main() -> tuple[list[str], int]:
        timer = ap.Timer()
        ran: list[str] = []
        timer.call_at(-1e300, ran.append, "far past")
        timer.call_at(-(2.0**70), ran.append, "past")
        await asyncio.sleep(0.01)
        return ran, len(timer)

    assert simulation.run(main()) == (["far past", "past"], 0)


@pytest.mark.parametrize("start", [1e300, -1e300, 2.0**62 * 0.001, -(2.0**63)])
def test_a_clock_beyond_the_tick_range_neither_hangs_nor_crashes(start: float) -> None:
    async def main() -> list[object]:
        timer = ap.Timer()
        results: list[object] = []
        try:
            timer.call_later(1.0, results.append, "fired")
        except ValueError as exc:  # the deadline is beyond what the wheel counts
            results.append("too far" if "too far" in str(exc) else exc)
        await asyncio.sleep(2.0)
        results.append(len(timer))
        return results

    results = simulation.run(main(), start=start)
    if start > 0:
        assert results == ["too far", 0]
    else:
        # start + 1.0 is start itself at these magnitudes: due at once.
        assert results == ["fired", 0]


def test_watch_called_unbound_with_none_is_a_type_error() -> None:
    # watch() hands the purgatory to a C function of the compiled core, which must
    # not take None on (it would crash the process, not raise).
    async def main() -> None:
        op = Op(1.0)
        with pytest.raises(TypeError, match="method of a Purgatory"):
            await ap.Purgatory.watch(None, op, ["k"])  # type: ignore[arg-type]
        assert op.outcome is None  # nothing changed: the op can still be watched
        purgatory: ap.Purgatory[Op] = ap.Purgatory()
        assert purgatory.try_complete_else_watch(op, ["k"]) is False
        purgatory.close()

    simulation.run(main())
