"""Tests of ``aiopurgatory.simulation``: an asyncio loop on a virtual clock.

These are plain (synchronous) tests that call :func:`simulation.run` themselves,
so each one controls ``start`` and sees the loop from creation to close.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import inspect
import random
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Coroutine
from math import ceil, inf, nan, ulp
from typing import Any

import pytest

import aiopurgatory as ap
from aiopurgatory import simulation


def now() -> float:
    return asyncio.get_running_loop().time()


# -- the clock ---------------------------------------------------------------------


def test_sleep_advances_the_clock_exactly_and_at_once() -> None:
    async def main() -> tuple[float, float, bool]:
        t0 = now()
        await asyncio.sleep(3600)
        loop = asyncio.get_running_loop()
        return t0, now(), isinstance(loop, simulation.VirtualTimeLoop)

    assert simulation.run(main()) == (0.0, 3600.0, True)


def test_start_sets_the_initial_clock() -> None:
    async def main() -> list[float]:
        times = [now()]
        await asyncio.sleep(10)
        times.append(now())
        await asyncio.sleep(0.25)
        times.append(now())
        return times

    assert simulation.run(main(), start=1000.5) == [1000.5, 1010.5, 1010.75]
    assert simulation.run(main(), start=-50) == [-50.0, -40.0, -39.75]


def test_sleeps_beyond_asyncios_one_day_select_cap() -> None:
    async def main() -> float:
        await asyncio.sleep(10 * 86_400)
        return now()

    assert simulation.run(main()) == 864_000.0


def test_the_clock_stands_still_while_callbacks_run() -> None:
    async def main() -> tuple[float, float]:
        t0 = now()
        time.sleep(0.01)  # noqa: ASYNC251 - real time passes; virtual time must not
        sum(range(10_000))
        await asyncio.sleep(0)
        return t0, now()

    assert simulation.run(main(), start=5) == (5.0, 5.0)


def test_timeouts_fire_at_their_exact_virtual_time() -> None:
    async def main() -> list[float]:
        times = []
        try:
            await asyncio.wait_for(asyncio.sleep(100), timeout=2.5)
        except TimeoutError:
            times.append(now())
        async with asyncio.timeout(1.25):
            await asyncio.sleep(1)
        times.append(now())
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[float] = loop.create_future()
        loop.call_at(7.0, lambda: fut.set_result(now()))
        times.append(await fut)
        return times

    assert simulation.run(main()) == [2.5, 3.5, 7.0]


def test_gather_of_many_sleepers_wakes_each_at_its_time() -> None:
    delays = [(i * 7919 % 1000) / 8 for i in range(2_000)]  # exact binary fractions

    async def sleeper(d: float) -> float:
        start = now()
        await asyncio.sleep(d)
        return now() - start

    async def main() -> tuple[list[float], float]:
        slept = await asyncio.gather(*(sleeper(d) for d in delays))
        return slept, now()

    slept, end = simulation.run(main())
    assert slept == delays
    assert end == max(delays)


def test_advance_moves_the_clock_without_running_anything() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, simulation.VirtualTimeLoop)
        ran: list[float] = []
        loop.call_at(5, lambda: ran.append(now()))
        loop.advance(10)
        assert ran == []  # advance() runs nothing by itself
        await asyncio.sleep(0)  # the handle, now due, is queued behind this task's step
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="seconds"):
            loop.advance(-1)
        with pytest.raises(ValueError, match="seconds"):
            loop.advance(nan)
        with pytest.raises(TypeError, match="seconds"):
            loop.advance("1")  # type: ignore[arg-type]
        return [*ran, now()]

    assert simulation.run(main()) == [10.0, 10.0]


def test_advance_to_sets_the_clock_exactly() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, simulation.VirtualTimeLoop)
        ran: list[float] = []
        loop.call_at(0.002, lambda: ran.append(now()))
        # 0.0014 + (0.0035 - 0.0014) is 0.0035000000000000005 in floats: advance()
        # by the difference would miss; advance_to() lands on the instant.
        loop.advance_to(0.0014)
        loop.advance_to(0.0035)
        assert now() == 0.0035
        assert ran == []  # nothing runs inside advance_to()
        loop.advance_to(0.0035)  # not moving is allowed
        with pytest.raises(ValueError, match="when"):
            loop.advance_to(0.001)
        with pytest.raises(ValueError, match="when"):
            loop.advance_to(inf)
        with pytest.raises(TypeError, match="when"):
            loop.advance_to("1")  # type: ignore[arg-type]
        assert now() == 0.0035  # refused calls changed nothing
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return ran

    assert simulation.run(main()) == [0.0035]


def _overshooting_pairs(count: int) -> list[tuple[float, float]]:
    """(now, when) pairs where ``now + (when - now)`` lands past ``when`` in floats."""
    rng = random.Random(7)
    pairs: list[tuple[float, float]] = []
    while len(pairs) < count:
        start = rng.uniform(-2.0, 2.0) * 10 ** rng.randint(-4, 3)
        when = abs(start) * rng.uniform(2.0, 50.0) * rng.choice([1, -1 if start < 0 else 1])
        if when > start and start + (when - start) > when:
            pairs.append((start, when))
    return pairs


@pytest.mark.parametrize(("start", "when"), _overshooting_pairs(25))
def test_a_handle_runs_at_exactly_its_when_where_float_steps_overshoot(
    start: float, when: float
) -> None:
    # The clock jumps by the loop's select timeout (when - now, in floats); for
    # these pairs adding it back lands an ulp past ``when``. The handle must still
    # run with the clock at exactly ``when``.
    async def main() -> float:
        loop = asyncio.get_running_loop()
        ran: list[float] = []
        loop.call_at(when, lambda: ran.append(now()))
        while not ran:
            await asyncio.sleep(0)
            await asyncio.sleep(when - now())
        return ran[0]

    assert simulation.run(main(), start=start) == when


@pytest.mark.parametrize("start", [0.0, 0.0014, -3.7, 1e9 + 0.1])
def test_handles_run_at_exactly_their_when_from_any_clock(start: float) -> None:
    rng = random.Random(7)
    whens = sorted(
        {
            start + rng.choice([1e-9, 1e-6, 0.0021, 0.37, 5.0, 3e5]) * rng.random()
            for _ in range(300)
        }
    )

    async def main() -> list[tuple[float, float]]:
        loop = asyncio.get_running_loop()
        seen: list[tuple[float, float]] = []
        for when in whens:
            loop.call_at(when, lambda w: seen.append((w, now())), when)
        await asyncio.sleep(whens[-1] - start + 1)
        return seen

    seen = simulation.run(main(), start=start)
    assert [w for w, _ in seen] == whens
    assert all(ran_at == when for when, ran_at in seen)


# -- determinism ---------------------------------------------------------------------


async def busy_program(seed: int) -> list[tuple[str, int, float]]:
    """Tasks, sleeps, timeouts, Timer callbacks and events interleaved; returns a trace."""
    rng = random.Random(seed)
    trace: list[tuple[str, int, float]] = []
    timer = ap.Timer(tick=0.001)
    event = asyncio.Event()

    async def worker(i: int) -> None:
        for _ in range(5):
            await asyncio.sleep(rng.expovariate(10))
            trace.append(("woke", i, now()))
        try:
            async with asyncio.timeout(rng.uniform(0, 0.3)):
                await event.wait()
            trace.append(("event", i, now()))
        except TimeoutError:
            trace.append(("timeout", i, now()))

    def ring(i: int) -> None:
        trace.append(("timer", i, now()))

    for i in range(50):
        timer.call_later(rng.uniform(0, 1), ring, i)
    asyncio.get_running_loop().call_later(0.6, event.set)
    await asyncio.gather(*(worker(i) for i in range(30)))
    await asyncio.sleep(1)
    return trace


def test_same_program_gives_the_same_trace() -> None:
    first = simulation.run(busy_program(42))
    second = simulation.run(busy_program(42))
    assert first == second
    kinds = {kind for kind, _, _ in first}
    assert kinds == {"woke", "event", "timeout", "timer"}  # the trace is not trivial
    assert len(first) == 30 * 6 + 50
    times = [t for _, _, t in first]
    assert times == sorted(times)  # the clock never goes back


# -- threads -----------------------------------------------------------------------------


def test_call_soon_threadsafe_from_a_real_thread_wakes_the_loop() -> None:
    async def main() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()

        def later() -> None:
            time.sleep(0.05)
            loop.call_soon_threadsafe(fut.set_result, 42)

        thread = threading.Thread(target=later)
        thread.start()
        try:
            # Nothing is scheduled: the loop blocks on its selector until the
            # thread writes to the self-pipe.
            result = await asyncio.wait_for(fut, timeout=None)
        finally:
            thread.join()
        return result, now()

    assert simulation.run(main(), start=3) == (42, 3.0)


def test_run_in_executor_works() -> None:
    def blocking(x: int) -> int:
        time.sleep(0.02)
        return x * 2

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        futures = [loop.run_in_executor(None, blocking, i) for i in range(4)]
        return list(await asyncio.gather(*futures))

    assert simulation.run(main()) == [0, 2, 4, 6]


def test_to_thread_works() -> None:
    async def main() -> str:
        return await asyncio.to_thread(str.upper, "virtual")

    assert simulation.run(main()) == "VIRTUAL"


# A thread the loop waits for takes no virtual time: the clock stands still until
# its result is in, whatever timers are pending (issue 42: on 3.13 the executor's
# shutdown waits on the loop's clock, and the clock jumped over it).


def test_the_clock_stands_still_while_an_executor_thread_works() -> None:
    async def main() -> tuple[str, float, bool]:
        loop = asyncio.get_running_loop()
        thread = loop.run_in_executor(None, time.sleep, 0.1)
        timer = asyncio.ensure_future(asyncio.sleep(5))
        done, _ = await asyncio.wait({thread, timer}, return_when=asyncio.FIRST_COMPLETED)
        first = "thread" if done == {thread} else "timer" if done == {timer} else "both"
        at = now()
        await timer
        return first, at, now() == 5.0

    assert simulation.run(main()) == ("thread", 0.0, True)


def test_a_timeout_around_to_thread_does_not_expire_while_the_thread_works() -> None:
    def work() -> str:
        time.sleep(0.1)
        return "done"

    async def main() -> tuple[str, float]:
        async with asyncio.timeout(1):
            result = await asyncio.to_thread(work)
        return result, now()

    assert simulation.run(main(), start=7) == ("done", 7.0)


def test_a_custom_executor_counts_too_and_an_abandoned_future_stops_holding_the_clock() -> None:
    release = threading.Event()

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            with pytest.raises(TimeoutError):
                # The timer is already due when the thread starts: it fires, the
                # wait cancels the future, and the loop no longer waits for it.
                await asyncio.wait_for(loop.run_in_executor(pool, release.wait), 0)
            cancelled_at = now()
            await asyncio.sleep(60)  # the thread still works, but nothing waits for it
            slept_to = now()
            release.set()
        return cancelled_at, slept_to

    assert simulation.run(main()) == (0.0, 60.0)


def _leave_the_default_executor_working() -> Coroutine[Any, Any, float]:
    async def main() -> float:
        # Not awaited: the default executor's shutdown, at the end of the run,
        # joins a thread still at work for 0.2 s.
        asyncio.get_running_loop().run_in_executor(None, time.sleep, 0.2)
        await asyncio.sleep(1)
        return now()

    return main()


def test_the_default_executor_shutdown_waits_for_its_threads_without_a_warning() -> None:
    # On 3.13, Runner.close() waits for the join with asyncio.timeout(300) on the
    # loop's clock: a virtual clock that jumped made it warn "did not finish
    # joining its threads within 300 seconds" (an error here) and abandon them.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner = asyncio.Runner(loop_factory=simulation.new_event_loop)
        with runner:
            assert runner.run(_leave_the_default_executor_working()) == 1.0
            loop = runner.get_loop()
    assert loop.is_closed()
    assert loop.time() == 1.0  # the shutdown took no virtual time


def test_run_shuts_the_default_executor_down_under_w_error_in_a_fresh_interpreter() -> None:
    # As a user runs it: -W error, simulation.run, a thread still at work at the end.
    code = textwrap.dedent(
        """
        import asyncio, time
        from aiopurgatory import simulation

        async def main():
            asyncio.get_running_loop().run_in_executor(None, time.sleep, 0.2)
            await asyncio.to_thread(time.sleep, 0.05)
            await asyncio.sleep(1)
            return asyncio.get_running_loop().time()

        print(simulation.run(main()))
        """
    )
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "1.0", "")


# -- lifecycle and errors ---------------------------------------------------------------------


def test_exception_in_main_propagates() -> None:
    async def main() -> None:
        await asyncio.sleep(1)
        raise KeyError("from main")

    with pytest.raises(KeyError, match="from main"):
        simulation.run(main())


def test_leftover_tasks_are_cancelled_and_the_loop_closed() -> None:
    seen: list[str] = []
    loops: list[asyncio.AbstractEventLoop] = []

    async def forever() -> None:
        try:
            await asyncio.sleep(inf)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> None:
        loops.append(asyncio.get_running_loop())
        asyncio.get_running_loop().create_task(forever())
        await asyncio.sleep(1)

    simulation.run(main())
    assert seen == ["cancelled"]
    assert loops[0].is_closed()


def test_each_run_gets_a_fresh_loop() -> None:
    async def main() -> asyncio.AbstractEventLoop:
        await asyncio.sleep(5)
        return asyncio.get_running_loop()

    a = simulation.run(main())
    b = simulation.run(main())
    assert a is not b


@pytest.mark.parametrize("main", [None, 42, "coro", print, asyncio.sleep])
def test_main_must_be_a_coroutine(main: Any) -> None:
    with pytest.raises(TypeError, match="main"):
        simulation.run(main)


@pytest.mark.parametrize(
    ("start", "error"),
    [(nan, ValueError), (inf, ValueError), (-inf, ValueError), ("0", TypeError), (True, TypeError)],
)
def test_bad_start_is_rejected_and_main_is_closed(start: Any, error: type[Exception]) -> None:
    async def main() -> None:
        raise AssertionError("must not run")  # pragma: no cover

    coro = main()
    with pytest.raises(error, match="start"):
        simulation.run(coro, start=start)
    # Closed, so no "coroutine was never awaited" warning (an error in this suite).
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED


@pytest.mark.parametrize(("start", "error"), [(nan, ValueError), ("0", TypeError)])
def test_new_event_loop_rejects_bad_start_cleanly(start: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="start") as info:
        simulation.new_event_loop(start)
    del info  # the traceback holds the half-built loop
    gc.collect()


def test_new_event_loop_is_a_loop_factory() -> None:
    async def main() -> float:
        await asyncio.sleep(1.5)
        return now()

    with asyncio.Runner(loop_factory=lambda: simulation.new_event_loop(100)) as runner:
        assert runner.run(main()) == 101.5


# -- scale: an hour of simulated time with 10**5 Timer timers --------------------------------


def hour_of_timers(tick: float) -> Coroutine[Any, Any, tuple[int, int, int, float]]:
    """10**5 timers spread over an hour, a third cancelled; returns counts and end time."""

    async def main() -> tuple[int, int, int, float]:
        loop = asyncio.get_running_loop()
        timer = ap.Timer(tick=tick)
        rng = random.Random(1)
        fired = 0
        early = 0
        exact = 0

        def fire(when: float) -> None:
            nonlocal fired, early, exact
            fired += 1
            t = loop.time()
            early += t < when
            e = ceil(when / tick)
            if e * tick < when:
                e += 1
            exact += t == e * tick

        delays = [rng.uniform(0, 3600) for _ in range(10**5)]
        handles = [timer.call_later(d, fire, d) for d in delays]
        for h in handles[::3]:
            h.cancel()
        await asyncio.sleep(3601)
        assert len(timer) == 0
        assert fired == exact  # every one at its tick exactly
        return fired, early, len(handles[::3]), now()

    return main()


def test_an_hour_with_100k_timers_on_a_binary_tick() -> None:
    # A tick of 2**-10 s makes every tick boundary an exact float.
    fired, early, cancelled, end = simulation.run(hour_of_timers(2**-10))
    assert cancelled == 33_334
    assert fired == 10**5 - cancelled
    assert early == 0
    assert end == 3601


@pytest.mark.timeout(60)
def test_an_hour_with_100k_timers_on_the_default_tick() -> None:
    # 1 ms ticks are not exact floats; the bounded runner turns a hang into a failure.
    from tests.support.timer import run_virtual_bounded

    fired, early, cancelled, end = run_virtual_bounded(lambda: hour_of_timers(0.001), 30.0)
    assert fired == 10**5 - cancelled
    assert early == 0
    assert end == 3601


@pytest.mark.parametrize(
    ("start", "when"),
    [
        (-1.0, 1e-09),  # a negative clock: the subtraction's own rounding dominates
        (-548.798761388153, 0.07758376499599652),
        (-1e10, 0.1),
        (0.1, 1e6 + 0.3),
    ],
)
def test_a_handle_runs_at_exactly_its_when_from_a_negative_or_small_clock(
    start: float, when: float
) -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[float] = loop.create_future()
        loop.call_at(when, lambda: future.set_result(now()))
        return await future

    assert simulation.run(main(), start=start) == when


@pytest.mark.timeout(30)
def test_a_huge_clock_still_moves_forward() -> None:
    # At 2**71 s one ulp is about six days: a day's select timeout rounds away.
    async def main() -> float:
        await asyncio.sleep(1e6)
        return now()

    start = 2.0**71
    end = simulation.run(main(), start=start)
    assert start < end <= start + 1e6 + ulp(start)
