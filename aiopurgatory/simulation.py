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
nothing is ready, moves the virtual clock to the earliest scheduled handle.
When nothing at all is scheduled it blocks on the real selector, as a real loop
would (only another thread can wake it then). Network I/O is not supported: the
clock would jump past any wait for a socket.

Use :func:`new_event_loop` as a loop factory (``asyncio.Runner``, pytest-asyncio)
to get the same loop elsewhere.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Coroutine, Mapping
from typing import Any, TypeAlias, TypeVar

from ._errors import as_seconds

__all__ = ["VirtualTimeLoop", "new_event_loop", "run"]

T = TypeVar("T")

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
        events = self._real.select(0)
        if not events and timeout > 0 and self.loop is not None:
            self.loop._jump()
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

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (>= 0) right now, without running anything.

        Raises:
            ValueError: ``seconds`` is negative or not finite.
        """
        seconds = as_seconds(seconds, "seconds")
        if seconds < 0:
            raise ValueError(f"seconds must not be negative, got {seconds!r}")
        self._virtual_now += seconds

    def _jump(self) -> None:
        # Called only when the loop would sleep: nothing is ready. The head of the
        # heap is not cancelled (BaseEventLoop._run_once pops cancelled heads
        # before computing the select timeout). Jump to its exact ``when``, which
        # also crosses asyncio's one-day cap on a single select timeout.
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        if scheduled:
            when = scheduled[0].when()
            if when > self._virtual_now:
                self._virtual_now = when


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
