"""LocalTriggers: the in-memory transport of the Triggers protocol, on virtual time.

Instances sharing a LocalBus stand for processes: what one triggers reaches the
others on a later loop iteration (or after the bus's latency), the bus stores the
highest watermark per key, and a watch catches up with it whatever its timeout.
Exact times, so every test runs on the virtual-time loop.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import aiopurgatory as ap


def op(timeout: float = 10.0) -> ap.WatermarkOperation:
    return ap.WatermarkOperation(timeout)


@pytest.mark.virtual_time
async def test_it_is_a_triggers_and_its_statistics_are_triggers_statistics() -> None:
    purgatory: ap.Purgatory = ap.Purgatory()
    triggers: ap.Triggers = ap.LocalTriggers(purgatory)  # mypy checks the protocol
    assert isinstance(triggers, ap.Triggers)
    async with triggers:
        assert isinstance(triggers.statistics(), ap.TriggersStatistics)


@pytest.mark.virtual_time
async def test_an_advance_in_one_process_completes_a_wait_in_another_on_the_next_iteration() -> (
    None
):
    bus = ap.LocalBus()
    here: ap.Purgatory = ap.Purgatory("here")
    there: ap.Purgatory = ap.Purgatory("there")
    async with ap.LocalTriggers(here, bus=bus) as a, ap.LocalTriggers(there, bus=bus) as b:
        wait = asyncio.ensure_future(b.watch(op(), {"k": 5}))
        await asyncio.sleep(1)
        assert a.advance("k", 4) == 0
        assert a.advance("k", 5) == 0  # nothing watches k here
        assert not wait.done()  # delivered on a later iteration, never inside the call
        assert await wait is ap.Outcome.COMPLETED
        assert asyncio.get_running_loop().time() == 1  # no time passed for the delivery
        assert b.statistics().received == 2
        assert b.statistics().completed == 1
        await a.flush()
        assert a.statistics().pending == 0


@pytest.mark.virtual_time
async def test_a_trigger_applies_to_the_own_purgatory_at_once_and_is_not_echoed() -> None:
    bus = ap.LocalBus()
    purgatory: ap.Purgatory = ap.Purgatory()
    async with ap.LocalTriggers(purgatory, bus=bus) as triggers:
        parked = op()
        assert purgatory.try_complete_else_watch(parked, {"k": 1}) is False
        assert triggers.advance("k", 1) == 1
        assert parked.outcome is ap.Outcome.COMPLETED
        await asyncio.sleep(0)
        assert triggers.statistics().received == 0


@pytest.mark.virtual_time
@pytest.mark.parametrize("wait_for", [0.0, 0.001, 5.0])
async def test_a_watch_that_stored_state_already_meets_completes_whatever_its_timeout(
    wait_for: float,
) -> None:
    bus = ap.LocalBus()
    async with ap.LocalTriggers(None, bus=bus) as publisher:
        publisher.advance("job-1", 100)
    purgatory: ap.Purgatory = ap.Purgatory()
    async with ap.LocalTriggers(purgatory, bus=bus) as triggers:
        start = asyncio.get_running_loop().time()
        assert await triggers.watch(op(wait_for), {"job-1": 100}) is ap.Outcome.COMPLETED
        assert asyncio.get_running_loop().time() == start
        # Below the threshold the stored value is applied and the wait goes on to expire.
        started = asyncio.get_running_loop().time()
        assert await triggers.watch(op(wait_for), {"job-1": 101}) is ap.Outcome.EXPIRED
        assert asyncio.get_running_loop().time() - started >= wait_for


@pytest.mark.virtual_time
async def test_the_bus_keeps_the_highest_watermark_and_fetch_reads_it() -> None:
    bus = ap.LocalBus()
    async with ap.LocalTriggers(None, bus=bus) as a, ap.LocalTriggers(None, bus=bus) as b:
        a.advance("k", 7)
        b.advance("k", 3)
        assert await a.fetch_watermark("k") == 7
        assert await b.fetch_watermark("other") is None
        assert bus.watermark("k") == 7


@pytest.mark.virtual_time
async def test_check_and_complete_reaches_the_other_instances() -> None:
    bus = ap.LocalBus()
    there: ap.Purgatory = ap.Purgatory()
    ready = False

    class Ready(ap.DelayedOperation):
        def try_complete(self) -> bool:
            return ready and self.force_complete()

    async with ap.LocalTriggers(None, bus=bus) as a, ap.LocalTriggers(there, bus=bus) as b:
        wait = asyncio.ensure_future(b.watch(Ready(10), ["k"]))
        await asyncio.sleep(0)
        ready = True
        assert a.check_and_complete("k") == 0
        assert await wait is ap.Outcome.COMPLETED


@pytest.mark.virtual_time
async def test_latency_delays_delivery_on_the_receivers_clock() -> None:
    bus = ap.LocalBus(latency=0.25)
    there: ap.Purgatory = ap.Purgatory()
    async with ap.LocalTriggers(None, bus=bus) as a, ap.LocalTriggers(there, bus=bus) as b:
        wait = asyncio.ensure_future(b.watch(op(), {"k": 1}))
        await asyncio.sleep(0)
        a.advance("k", 1)
        await a.flush()
        assert wait.done()
        assert asyncio.get_running_loop().time() == 0.25
        assert await wait is ap.Outcome.COMPLETED


@pytest.mark.virtual_time
async def test_a_pause_keeps_triggers_and_the_resume_delivers_them_and_resyncs() -> None:
    bus = ap.LocalBus()
    there: ap.Purgatory = ap.Purgatory()
    async with ap.LocalTriggers(None, bus=bus) as a, ap.LocalTriggers(there, bus=bus) as b:
        early = asyncio.ensure_future(b.watch(op(60), {"k": 1}))
        await asyncio.sleep(0)
        bus.pause()
        assert not a.statistics().connected
        a.advance("k", 1)
        assert bus.watermark("k") is None  # not stored while the server is away
        assert a.statistics().pending == 1
        short = asyncio.ensure_future(b.watch(op(2), {"k": 1}))
        await asyncio.sleep(5)
        assert short.done()
        assert short.result() is ap.Outcome.EXPIRED
        assert not early.done()
        flushing = asyncio.ensure_future(a.flush())
        await asyncio.sleep(1)
        assert not flushing.done()
        bus.resume()
        await flushing
        assert await early is ap.Outcome.COMPLETED
        assert bus.watermark("k") == 1
        assert b.statistics().resyncs == 1


@pytest.mark.virtual_time
async def test_a_watch_parked_while_paused_catches_up_on_resume() -> None:
    bus = ap.LocalBus()
    async with ap.LocalTriggers(None, bus=bus) as a:
        a.advance("k", 3)
    there: ap.Purgatory = ap.Purgatory()
    async with ap.LocalTriggers(there, bus=bus) as b:
        bus.pause()
        wait = asyncio.ensure_future(b.watch(op(60), {"k": 3}))
        fetch = asyncio.ensure_future(b.fetch_watermark("k"))
        await asyncio.sleep(10)
        assert not wait.done()
        assert not fetch.done()
        bus.resume()
        assert await wait is ap.Outcome.COMPLETED
        assert await fetch == 3
        assert asyncio.get_running_loop().time() == 10


@pytest.mark.virtual_time
async def test_closing_while_paused_drops_and_counts_what_was_kept() -> None:
    bus = ap.LocalBus()
    a = ap.LocalTriggers(None, bus=bus)
    async with a:
        bus.pause()
        a.advance("k", 1)
        a.check_and_complete("k")
    assert a.statistics().dropped == 2
    bus.resume()
    assert bus.watermark("k") is None


@pytest.mark.virtual_time
async def test_cancelling_the_waiting_task_cancels_the_operation() -> None:
    purgatory: ap.Purgatory = ap.Purgatory()
    async with ap.LocalTriggers(purgatory) as triggers:
        parked = op(60)
        wait = asyncio.ensure_future(triggers.watch(parked, {"k": 1}))
        await asyncio.sleep(1)
        wait.cancel()
        with pytest.raises(asyncio.CancelledError):
            await wait
        assert parked.outcome is ap.Outcome.CANCELLED
        assert purgatory.watched == 0


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda t: t.advance(("a", 1), 1), TypeError),
        (lambda t: t.advance(True, 1), TypeError),
        (lambda t: t.advance("k", True), TypeError),
        (lambda t: t.advance("k", float("nan")), ValueError),
        (lambda t: t.advance("k", 2**60), ValueError),
        (lambda t: t.check_and_complete(1.5), TypeError),
    ],
)
@pytest.mark.virtual_time
async def test_what_cannot_cross_between_processes_is_refused_and_changes_nothing(
    call: Any, error: type[Exception]
) -> None:
    bus = ap.LocalBus()
    async with ap.LocalTriggers(ap.Purgatory(), bus=bus) as triggers:
        with pytest.raises(error):
            call(triggers)
        assert triggers.statistics().triggers == 0
        assert bus.watermark("k") is None


@pytest.mark.virtual_time
async def test_a_watch_refuses_a_key_that_cannot_cross_before_watching() -> None:
    purgatory: ap.Purgatory = ap.Purgatory()
    async with ap.LocalTriggers(purgatory) as triggers:
        with pytest.raises(TypeError, match="str, bytes or int"):
            await triggers.watch(op(), {("a", 1): 1})
        assert purgatory.watched == 0


@pytest.mark.virtual_time
async def test_use_before_start_or_after_close_raises_triggers_closed_error() -> None:
    triggers = ap.LocalTriggers(ap.Purgatory())
    with pytest.raises(ap.TriggersClosedError, match="not started"):
        triggers.advance("k", 1)
    async with triggers:
        pass
    with pytest.raises(ap.TriggersClosedError, match="closed"):
        triggers.check_and_complete("k")
    with pytest.raises(ap.TriggersClosedError):
        await triggers.watch(op(), {"k": 1})
    await triggers.aclose()  # idempotent
    publisher = ap.LocalTriggers(None)
    async with publisher:
        with pytest.raises(ap.TriggersClosedError, match="publisher"):
            await publisher.watch(op(), {"k": 1})


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="purgatory"):
        ap.LocalTriggers("p")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bus"):
        ap.LocalTriggers(None, bus=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="latency"):
        ap.LocalBus(latency=-1)


@pytest.mark.realtime
def test_instances_on_loops_of_their_own_threads_share_a_bus() -> None:
    # Instances may stand for processes running their own loops, in threads.
    bus = ap.LocalBus()
    parked = threading.Event()
    done = threading.Event()
    outcome: list[ap.Outcome] = []

    async def waiter() -> None:
        async with ap.LocalTriggers(ap.Purgatory(), bus=bus) as triggers:
            wait = asyncio.ensure_future(triggers.watch(op(30), {"k": 1}))
            await asyncio.sleep(0)
            parked.set()
            outcome.append(await wait)
        done.set()

    thread = threading.Thread(target=asyncio.run, args=(waiter(),))
    thread.start()
    assert parked.wait(10)

    async def publisher() -> None:
        async with ap.LocalTriggers(None, bus=bus) as triggers:
            triggers.advance("k", 1)
            await triggers.flush()

    asyncio.run(publisher())
    assert done.wait(10)
    thread.join(10)
    assert outcome == [ap.Outcome.COMPLETED]
