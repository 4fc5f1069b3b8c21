"""Virtual time: an asyncio event loop whose clock jumps instead of sleeping.

:func:`run` runs a coroutine on a :class:`VirtualTimeLoop`. Its ``time()`` starts
at ``start`` and stands still while callbacks run; whenever every task is waiting
and a timer is scheduled, the clock jumps straight to that timer's ``when`` instead
of sleeping. ``await asyncio.sleep(3600)`` therefore returns at once with
``loop.time()`` advanced by exactly 3600, and the same program gives the same times
and results on every run.

How: the loop is an :class:`asyncio.SelectorEventLoop` whose selector, asked to
wait for I/O with a positive timeout, polls the real selector once without
blocking (so ``call_soon_threadsafe`` from other threads still works) and, if
nothing is ready, moves the virtual clock forward by that timeout instead of
sleeping. The loop asks for exactly the time until its earliest scheduled
handle, so the clock lands on that handle's ``when``; nothing else of the loop
is looked at. When nothing at all is scheduled it blocks on the real selector,
as a real loop would (only another thread can wake it then). Network I/O is not
supported: the clock would jump past any wait for a socket.

Threads: the clock stands still while a thread the loop waits for is working,
that is, while a future of ``loop.run_in_executor`` (and so of
``asyncio.to_thread``) is pending, and while ``shutdown_default_executor`` joins
the default executor's threads. The loop then blocks on the real selector until
the thread's result wakes it, as a real loop would, instead of jumping to its
next timer: work in a thread takes no virtual time, and a timeout around it (the
executor shutdown's own, on Python 3.13) does not expire while it runs. The same
holds while one of anyio's worker threads runs a call (``anyio.to_thread.run_sync``,
so Starlette's and FastAPI's sync dependencies and endpoints). The loop
cannot see threads it was not asked to wait for (``threading.Thread``, a future
wrapped by hand): the clock may jump while they work. A
thread the loop waits for must not itself wait for virtual time to pass (a
``run_coroutine_threadsafe(asyncio.sleep(1), loop).result()`` in it never returns).

Tools that drive the clock themselves (the trace replay runs events between
loop turns) use :meth:`VirtualTimeLoop.advance_to` and
:meth:`aiopurgatory.Timer.next_due`.

Use :func:`new_event_loop` as a loop factory (``asyncio.Runner``, pytest-asyncio)
to get the same loop elsewhere.

On trio, :func:`run_trio` runs an async function on trio's autojumping
``MockClock``: the same jumps, driven by trio's own deadlines (the timer's driver
sleeps in a cancel scope whose deadline is the next bucket). trio shuffles the
order of tasks woken together; ``seed`` makes that order, and so the whole run,
the same on every run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import selectors
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from typing import Any, TypeAlias, TypeVar, TypeVarTuple, Unpack

from ._validation import as_seconds

__all__ = ["VirtualTimeLoop", "new_event_loop", "run", "run_trio"]

T = TypeVar("T")
_Ts = TypeVarTuple("_Ts")

# What selectors accept as a file object: a file descriptor or anything with fileno().
_FileObject: TypeAlias = Any


class _VirtualSelector(selectors.BaseSelector):
    """Delegates to a real selector, but turns idle waits into clock jumps."""

    def __init__(self) -> None:
        self._real = selectors.DefaultSelector()
        self.loop: VirtualTimeLoop | None = None

    def register(
        self, fileobj: _FileObject, events: int, data: Any = None
    ) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: _FileObject) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: _FileObject, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            return self._real.select(None)
        loop = self.loop
        # Asked before polling: a thread that finishes after the poll wakes the
        # real selector (call_soon_threadsafe writes to the loop's self-pipe).
        waiting_for_threads = loop is not None and loop._waits_for_threads()
        events = self._real.select(0)
        if events or timeout <= 0 or loop is None:
            return events
        if waiting_for_threads:
            # The clock stands still while the thread works: wait for it for real.
            return self._real.select(None)
        loop._jump(timeout)
        return events

    def close(self) -> None:
        self._real.close()

    def get_map(self) -> Mapping[_FileObject, selectors.SelectorKey]:
        return self._real.get_map()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop on a virtual clock (see the module documentation).

    Args:
        start: the loop time to start at, in seconds.
    """

    def __init__(self, start: float = 0.0) -> None:
        selector = _VirtualSelector()
        self._virtual_now = 0.0
        # The futures of run_in_executor not yet done, and how many
        # shutdown_default_executor calls are joining threads: while either is
        # there, the clock does not jump (see the module documentation).
        self._thread_work: set[asyncio.Future[Any]] = set()
        self._joining_executor = 0
        super().__init__(selector)
        try:
            self._virtual_now = as_seconds(start, "start")
        except (TypeError, ValueError):
            # Checked after the base initialisation, so that the half-made loop
            # can be closed cleanly (BaseEventLoop.__del__ expects a whole one).
            self.close()
            raise
        selector.loop = self

    def time(self) -> float:
        """The virtual clock, in seconds."""
        return self._virtual_now

    # asyncio runs a handle once ``when < time() + _clock_resolution``: a real
    # clock's resolution (1 ns) would run handles up to 1 ns before their time,
    # at a virtual instant that then may not move. The virtual clock is exact:
    # one ulp makes "due" mean ``when <= time()``, and anything later makes the
    # loop idle, so the clock jumps to it.
    @property
    def _clock_resolution(self) -> float:
        return math.ulp(self._virtual_now)

    @_clock_resolution.setter
    def _clock_resolution(self, value: float) -> None:
        pass  # BaseEventLoop.__init__ sets the real clock's; not ours

    def run_in_executor(
        self,
        executor: concurrent.futures.Executor | None,
        func: Callable[[Unpack[_Ts]], T],
        *args: *_Ts,
    ) -> asyncio.Future[T]:
        """As :meth:`asyncio.loop.run_in_executor`; the clock stands still until it is done."""
        future = super().run_in_executor(executor, func, *args)
        # Done (result, exception or cancelled) only once the loop has the
        # thread's outcome or stopped waiting for it; the discard then runs as a
        # ready callback, so the loop is never idle in between.
        self._thread_work.add(future)
        future.add_done_callback(self._thread_work.discard)
        return future

    # asyncio's signature, which Runner.close() calls (with a timeout since 3.12).
    async def shutdown_default_executor(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """As :meth:`asyncio.loop.shutdown_default_executor`; the clock stands still meanwhile.

        The join runs in a thread of its own, which the loop waits for: on Python
        3.13, whose wait for it is a timeout on the loop's clock, the virtual clock
        would otherwise jump over ``timeout`` while the thread joins.
        """
        self._joining_executor += 1
        try:
            if sys.version_info >= (3, 12):
                await super().shutdown_default_executor(timeout)
            else:  # 3.11 has no timeout: it waits for the threads for as long as they take
                await super().shutdown_default_executor()
        finally:
            self._joining_executor -= 1

    def _waits_for_threads(self) -> bool:
        return bool(self._thread_work) or self._joining_executor > 0 or _anyio_workers_busy(self)

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (>= 0) right now, without running anything.

        Handles that fall due meanwhile run on the next loop iteration, late.

        Raises:
            TypeError: ``seconds`` is not a number.
            ValueError: ``seconds`` is negative or not finite.
        """
        seconds = as_seconds(seconds, "seconds")
        if seconds < 0:
            raise ValueError(f"seconds must not be negative, got {seconds!r}")
        self._virtual_now += seconds

    def advance_to(self, when: float) -> None:
        """Set the clock to exactly loop time ``when`` (not before now), running nothing.

        Unlike ``advance(when - time())``, which float rounding can leave an ulp
        off, the clock then reads ``when`` exactly. Handles that fall due
        meanwhile run on the next loop iteration, late.

        Raises:
            TypeError: ``when`` is not a number.
            ValueError: ``when`` is before the current time or not finite.
        """
        when = as_seconds(when, "when")
        if when < self._virtual_now:
            raise ValueError(f"when={when!r} is before the current time {self._virtual_now!r}")
        self._virtual_now = when

    def _jump(self, timeout: float) -> None:
        # Called only when the loop would sleep (nothing ready) for ``timeout`` >
        # 0 seconds: the time from now to its earliest handle's ``when``, computed
        # by the loop as ``when - now`` (capped at one day). Land on ``when``
        # exactly, and never past it. ``now + (when - now)`` is exact when the
        # subtraction is (Sterbenz: when <= 2 * now), which ``timeout <= now``
        # shows for a positive clock; a capped timeout only falls short. Otherwise
        # both the subtraction and the sum may have rounded: step back by more than
        # both errors, and the next iteration closes the small, exact rest.
        now = self._virtual_now
        target = now + timeout
        if now < 0 or (now > 0 and timeout > now):
            below = target - (math.ulp(timeout) + 2 * math.ulp(target))
            if below > now:
                target = below
            elif now + timeout / 2 > now:
                target = now + timeout / 2
        if target <= now:
            # The step is below the clock's resolution here (a huge clock): the
            # next representable instant is at or before ``when`` (> now).
            target = math.nextafter(now, math.inf)
        self._virtual_now = target


def _anyio_workers_busy(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether one of anyio's worker threads of ``loop`` is running a call now.

    ``anyio.to_thread.run_sync`` (which Starlette and FastAPI use for sync
    dependencies, endpoints and file I/O) runs calls on worker threads of its
    own, not through ``run_in_executor``. anyio keeps them per loop, in two
    run variables: every worker, and the idle ones; a worker that is neither
    idle nor stopped holds a call whose result has not reached the loop yet (it
    turns idle in the loop's own callback that delivers the result). anyio has
    no public way to ask this, so its internals are read, defensively: on an
    anyio that keeps them otherwise, this says False (the clock may then jump
    while such a thread works, as for a plain ``threading.Thread``), and
    tests/core/test_simulation_threads.py fails and says so.
    """
    backend = sys.modules.get("anyio._backends._asyncio")
    lowlevel = sys.modules.get("anyio.lowlevel")
    if backend is None or lowlevel is None:
        return False  # anyio never ran a worker thread in this process
    run_vars = getattr(lowlevel, "_run_vars", None)
    workers_var = getattr(backend, "_threadpool_workers", None)
    idle_var = getattr(backend, "_threadpool_idle_workers", None)
    if run_vars is None or workers_var is None or idle_var is None:
        return False
    try:
        values = run_vars.get(loop)
    except TypeError:  # pragma: no cover - a mapping not keyed by loop
        return False
    if not values:
        return False
    workers = values.get(workers_var)
    if not workers:
        return False
    idle = values.get(idle_var)
    return len(workers) > (0 if idle is None else len(idle))


def new_event_loop(start: float = 0.0) -> VirtualTimeLoop:
    """A new :class:`VirtualTimeLoop` starting at ``start`` seconds (a loop factory).

    Raises:
        TypeError, ValueError: ``start`` is not a finite number.
    """
    return VirtualTimeLoop(start)


def run(main: Coroutine[Any, Any, T], *, start: float = 0.0) -> T:
    """Run ``main`` to completion on a new :class:`VirtualTimeLoop` and return its result.

    Like :func:`asyncio.run`: the loop is closed afterwards, remaining tasks are
    cancelled, async generators and the default executor are shut down.

    Raises:
        TypeError: ``main`` is not a coroutine, or ``start`` not a number.
        ValueError: ``start`` is not finite.
    """
    if not asyncio.iscoroutine(main):
        raise TypeError(f"main must be a coroutine, got {type(main).__name__}")
    try:
        start = as_seconds(start, "start")
    except (TypeError, ValueError):
        main.close()
        raise
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(start)) as runner:
        return runner.run(main)


def run_trio(
    main: Callable[[Unpack[_Ts]], Awaitable[T]],
    *args: *_Ts,
    start: float = 0.0,
    seed: int | None = 0,
) -> T:
    """Run ``trio.run(main, *args)`` on virtual time and return its result.

    The clock is trio's ``MockClock(autojump_threshold=0)``: ``trio.current_time()``
    starts at ``start`` and, whenever every task is blocked, jumps straight to the
    next deadline (a ``trio.sleep``, a cancel scope's deadline, the next bucket of
    an aiopurgatory timer), so ``await trio.sleep(3600)`` returns at once.

    Args:
        main: an async function (as ``trio.run`` takes it), and its ``args``.
        start: the clock's start, in seconds; not negative (a ``MockClock`` counts
            from zero).
        seed: seeds trio's scheduler, which otherwise shuffles the order in which
            tasks woken at the same moment run: with a seed (default 0), a
            program gives the same times, order and results on every run. None
            leaves trio's scheduling as it is. One seeded run at a time per
            process (the seed is process-wide).

    Raises:
        TypeError: ``main`` is not callable, ``start`` not a number or ``seed``
            not an int or None.
        ValueError: ``start`` is negative or not finite.
        RuntimeError: a seeded run is already in progress in another thread.
        ModuleNotFoundError: trio is not installed (``pip install aiopurgatory[trio]``).
    """
    if not callable(main):
        raise TypeError(f"main must be an async function, got {type(main).__name__}")
    start = as_seconds(start, "start")
    if start < 0:
        raise ValueError(f"start must not be negative on trio's mock clock, got {start!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
    import trio
    import trio.testing

    clock = trio.testing.MockClock(autojump_threshold=0)
    if start:
        clock.jump(start)
    with _seeded_trio_scheduler(seed):
        return trio.run(main, *args, clock=clock)


@contextlib.contextmanager
def _seeded_trio_scheduler(seed: int | None) -> Iterator[None]:
    """Make trio's scheduling order a function of ``seed`` while the block runs.

    trio runs each batch of ready tasks in an order drawn from its module-level
    ``random.Random``, after sorting the batch by spawn order when deterministic
    scheduling is on (the switch trio itself turns on for Hypothesis). Both are
    internals of ``trio._core._run``; they are set for the run and restored after.
    """
    if seed is None:
        yield
        return
    from trio._core import _run as trio_run

    rng = getattr(trio_run, "_r", None)
    if rng is None or not hasattr(trio_run, "_ALLOW_DETERMINISTIC_SCHEDULING"):
        raise RuntimeError(
            "this trio version has no scheduler seed hook; pass seed=None to run unseeded"
        )
    if not _SEEDED.acquire(blocking=False):
        raise RuntimeError(
            "another seeded run_trio is running in another thread: trio's scheduler "
            "seed is process-wide (pass seed=None to run unseeded)"
        )
    try:
        saved_state = rng.getstate()
        saved_flag = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
        rng.seed(seed)
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
        try:
            yield
        finally:
            trio_run._ALLOW_DETERMINISTIC_SCHEDULING = saved_flag  # type: ignore[misc]
            rng.setstate(saved_state)
    finally:
        _SEEDED.release()


# Held by the seeded run_trio in progress (trio's scheduler state is per process).
_SEEDED = threading.Lock()


# dir() shows the public API, not the names the module uses.
from ._namespace import public_dir as _public_dir  # noqa: E402

__dir__ = _public_dir(__name__, __all__)
