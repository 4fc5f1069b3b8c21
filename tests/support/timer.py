"""What the timer's tests share: the tick, a recording callback, the next loop iteration,
the driver's armed instant, failures as logged, and a virtual-time run with a wall-clock
watchdog (see ``tests/core/test_timer.py``'s documentation).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from math import ceil, inf
from typing import Any, TypeVar, cast

import pytest
import trio
import trio.testing

import aiopurgatory as ap
from aiopurgatory import simulation
from aiopurgatory._asyncio_driver import AsyncioDriver
from aiopurgatory._trio_driver import TrioDriver
from tests.support.backends import now, run_on, settle

TICK = 0.001
T = TypeVar("T")


def due_time(when: float, tick: float = TICK) -> float:
    """The time a callback due at ``when`` runs at on virtual time.

    The first tick boundary at or after ``when``: rounded up, never early.
    """
    e = ceil(when / tick)
    if e * tick < when:
        e += 1
    return e * tick


class Recorder:
    """Callbacks that append (name, the backend's time) when they run."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, float]] = []

    def __call__(self, name: Any) -> None:
        self.calls.append((name, now()))

    @property
    def names(self) -> list[Any]:
        return [n for n, _ in self.calls]


async def next_iteration() -> None:
    """Let what this step scheduled for the next loop iteration run; time stands still.

    asyncio: exactly one loop iteration (the timer's flush, a ``call_soon`` made in
    this one, has run after it). trio runs the tasks woken together in a shuffled
    (seeded) order, so the timer's driver task and this one may run either way
    round on the next batch: wait until every other task is blocked instead
    (:func:`settle`); trio's clock, a mock clock's too, does not move meanwhile.
    """
    if trio.lowlevel.in_trio_run():
        await settle()
    else:
        await asyncio.sleep(0)


def advance(seconds: float) -> None:
    """Move the virtual clock forward now, running nothing (handles due meanwhile run late).

    ``VirtualTimeLoop.advance`` on asyncio, ``MockClock.jump`` on trio.
    """
    if trio.lowlevel.in_trio_run():
        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, trio.testing.MockClock)
        clock.jump(seconds)
    else:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, simulation.VirtualTimeLoop)
        loop.advance(seconds)


def armed_handle(timer: ap.Timer) -> asyncio.TimerHandle | None:
    """The asyncio driver's armed ``loop.call_at`` handle (white box, see the module docstring)."""
    driver = cast("AsyncioDriver | None", timer._driver)
    return None if driver is None else driver._handle


def armed_at(timer: ap.Timer) -> float | None:
    """The instant the timer's driver will wake it at; None if nothing is armed (white box).

    asyncio: the ``when`` of the driver's one ``loop.call_at`` handle (None exactly
    when there is no handle). trio: the deadline of the cancel scope the driver
    task sleeps in, its only deadline; while the task is not asleep (spawned or
    woken, about to run), the instant it will sleep until next.
    """
    driver = timer._driver
    if driver is None:
        return None
    if isinstance(driver, AsyncioDriver):
        handle = driver._handle
        return None if handle is None else handle.when()
    assert isinstance(driver, TrioDriver)
    bed = driver._bed
    scope = bed.scope
    when = scope.deadline if bed.task is not None and scope is not None else driver._armed
    return None if when == inf else when


def collect_exceptions(into: list[dict[str, Any]]) -> None:
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: into.append(ctx))


@contextlib.contextmanager
def logged_failures() -> Iterator[list[logging.LogRecord]]:
    """The ``aiopurgatory.timer_callback_failed`` records logged meanwhile (trio's report)."""
    records: list[logging.LogRecord] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            fields = getattr(record, "aiopurgatory", {})
            if fields.get("event") == "aiopurgatory.timer_callback_failed":
                records.append(record)

    handler = Capture(level=logging.ERROR)
    logger = logging.getLogger("aiopurgatory")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def logged_exception(record: logging.LogRecord) -> BaseException:
    assert record.exc_info is not None
    exc = record.exc_info[1]
    assert exc is not None
    return exc


def run_virtual_bounded(
    main: Callable[[], Awaitable[T]], limit: float, backend: str = "asyncio-virtual"
) -> T:
    """Run ``main()`` on virtual time in a thread; fail if it is not done in ``limit`` s.

    ``backend`` is ``"asyncio-virtual"`` or ``"trio-virtual"``. A livelock on
    virtual time does not advance the clock, so a timeout inside the run would
    never fire: the watchdog has to be the wall clock. On a hang the run is
    stopped from this thread (the asyncio loop stopped, trio's main task cancelled).
    """
    result: list[T] = []
    errors: list[BaseException] = []
    stop: list[Callable[[], object]] = []

    async def bounded() -> T:
        if trio.lowlevel.in_trio_run():
            token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as scope:
                stop.append(lambda: token.run_sync_soon(scope.cancel))
                return await main()
            raise RuntimeError("stopped by the watchdog")
        loop = asyncio.get_running_loop()
        stop.append(lambda: loop.call_soon_threadsafe(loop.stop))
        return await main()

    def target() -> None:
        try:
            result.append(run_on(backend, bounded))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit)
    hung = thread.is_alive()
    if hung:
        for fn in stop:
            fn()
        thread.join(10)
    if hung:
        pytest.fail(f"the virtual-time run made no progress within {limit} s (livelock)")
    if errors:
        raise errors[0]
    return result[0]
