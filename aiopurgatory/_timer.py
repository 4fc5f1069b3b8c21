"""The asyncio driver of the timing wheel: :class:`Timer`, :class:`TimerHandle`, timeouts.

The wheel (:mod:`aiopurgatory._wheel`) is sans-IO; this module owns the clock.
It converts loop-time seconds to integer ticks and keeps exactly one
``loop.call_at`` handle armed for the earliest non-empty bucket:

* A new bucket earlier than the armed one re-arms the handle; any other insert
  touches no loop state, which is what makes ``call_later`` + ``cancel`` cheap.
* When the last pending entry goes away the handle is cancelled: an idle timer
  costs nothing, there is no thread and no polling.
* Deadlines round *up* to ticks (``ceil(when / tick)``, then corrected for float
  rounding), and the clock rounds *down* (``floor(loop.time() / tick)``). A bucket
  runs only once the rounded-down clock has reached it, so nothing ever runs
  before its ``when``. This matters on uvloop, which rounds ``call_at`` to whole
  milliseconds and wakes up to ~1.4 ms early: the driver simply finds nothing due
  yet and re-arms.
* Entries already due when scheduled (a zero or negative delay) run from a
  ``call_soon`` on a later loop iteration, never inside the scheduling call.
* Callbacks run one after the other inside the driver's handle. An exception in
  one goes to the loop's exception handler and the rest still run.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import weakref
from collections.abc import Callable, Sequence
from math import ceil, floor, inf
from types import TracebackType
from typing import Any, Final, TypeVarTuple, Unpack

import structlog

from ._errors import PurgatoryClosedError, as_seconds
from ._wheel import Entry, TimingWheel

__all__ = ["Timeout", "Timer", "TimerHandle", "timeout", "timeout_at"]

_Ts = TypeVarTuple("_Ts")

# Timer lag (how late the driver wakes up) is logged at debug level when above
# this, at most once per _LAG_LOG_INTERVAL seconds of loop time.
_LAG_LOG_THRESHOLD: Final = 0.05
_LAG_LOG_INTERVAL: Final = 10.0


class _TimerEntry(Entry):
    """Something the driver can schedule: knows its deadline and how to fire."""

    __slots__ = ("_when",)

    def __init__(self) -> None:
        super().__init__()
        self._when: float = 0.0

    def _fire(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _timer_closed(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class TimerHandle(_TimerEntry):
    """A callback scheduled on a :class:`Timer`; returned by ``call_later``/``call_at``."""

    __slots__ = ("_args", "_callback", "_cancelled", "_context", "_timer")

    def __init__(
        self,
        timer: Timer,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        context: contextvars.Context | None,
    ) -> None:
        self._tick = None
        self._bucket = None
        self._when = 0.0
        self._timer = timer
        self._callback: Callable[..., object] | None = callback
        self._args: tuple[Any, ...] | None = args
        self._context = context
        self._cancelled = False

    def __repr__(self) -> str:
        state = "cancelled" if self._cancelled else "pending" if self._tick is not None else "done"
        return f"<TimerHandle {state} when={self._when!r} callback={self._callback!r}>"

    def when(self) -> float:
        """The loop time (seconds) the callback is due at."""
        return self._when

    def cancelled(self) -> bool:
        """True once :meth:`cancel` has been called (as in asyncio)."""
        return self._cancelled

    def cancel(self) -> None:
        """Cancel the callback if it has not run yet. Idempotent, O(1)."""
        if self._cancelled:
            return
        self._cancelled = True
        if self._tick is not None:
            self._timer._unschedule(self)
        self._callback = self._args = self._context = None

    def _fire(self) -> None:
        callback = self._callback
        args = self._args
        context = self._context
        self._callback = self._args = self._context = None
        if context is None:
            callback(*args)  # type: ignore[misc]
        else:
            context.run(callback, *args)  # type: ignore[arg-type, misc]

    def _timer_closed(self) -> None:
        self._cancelled = True
        self._callback = self._args = self._context = None


class Timer:
    """Many cheap timers on one event loop, driven by a hierarchical timing wheel.

    A drop-in for ``loop.call_later``/``loop.call_at`` where there are very many
    timers, most of which are cancelled before they fire. Add and cancel are O(1);
    at most one ``loop.call_at`` handle is armed; nothing is armed when no timer is
    pending. Callbacks never run before their due time (on uvloop too) and, with an
    idle loop, run within one tick after it.

    The timer binds to the running loop the first time it is used, and belongs to
    that loop from then on. It is not thread-safe.

    Args:
        tick: width of the finest wheel slot, in seconds (default 1 ms, as Kafka).
        wheel_size: slots per wheel level (default 20, as Kafka); level ``n`` has
            slots ``tick * wheel_size**n`` seconds wide and is created on demand.

    Raises:
        TypeError: ``tick`` is not a number or ``wheel_size`` not an int.
        ValueError: ``tick`` is not positive and finite, or ``wheel_size < 2``.
    """

    __slots__ = (
        "__weakref__",
        "_armed",
        "_closed",
        "_count",
        "_handle",
        "_last_lag_log",
        "_logger",
        "_loop",
        "_ready",
        "_ready_handle",
        "_tick",
        "_wheel",
        "_wheel_size",
    )

    def __init__(self, *, tick: float = 0.001, wheel_size: int = 20) -> None:
        tick = as_seconds(tick, "tick")
        if tick <= 0:
            raise ValueError(f"tick must be positive, got {tick!r}")
        if isinstance(wheel_size, bool) or not isinstance(wheel_size, int):
            raise TypeError(f"wheel_size must be an int, got {type(wheel_size).__name__}")
        if wheel_size < 2:
            raise ValueError(f"wheel_size must be at least 2, got {wheel_size}")
        self._tick = tick
        self._wheel_size = wheel_size
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wheel = TimingWheel(wheel_size)
        self._handle: asyncio.TimerHandle | None = None
        # Tick the loop handle is armed for; inf when unarmed, -inf while the
        # driver is running callbacks (so inserts do not arm; it re-arms after).
        self._armed: float = inf
        self._count = 0
        self._ready: list[_TimerEntry] = []
        self._ready_handle: asyncio.Handle | None = None
        self._closed = False
        # A lazy proxy: follows structlog's configuration at log time (rare events only).
        self._logger: Any = structlog.get_logger("aiopurgatory", timer=id(self))
        self._last_lag_log = -inf

    @property
    def tick(self) -> float:
        """Width of the finest wheel slot, in seconds."""
        return self._tick

    @property
    def wheel_size(self) -> int:
        """Slots per wheel level."""
        return self._wheel_size

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop this timer is bound to, or None before first use."""
        return self._loop

    def __len__(self) -> int:
        """Number of pending entries: scheduled, not yet fired, not cancelled."""
        return self._count

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"pending={self._count}"
        return f"<Timer tick={self._tick} wheel_size={self._wheel_size} {state}>"

    # -- scheduling --------------------------------------------------------------

    def call_later(
        self,
        delay: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> TimerHandle:
        """Run ``callback(*args)`` ``delay`` seconds from now (``loop.call_later`` semantics).

        A zero or negative delay means due now: the callback runs on a later loop
        iteration, never inside this call. The callback runs in ``context`` if
        given, else in a copy of the current context (as asyncio does).

        Raises:
            TypeError: ``delay`` is not a number (or is a bool); ``callback`` is not callable.
            ValueError: ``delay`` is NaN or infinite.
            PurgatoryClosedError: the timer is closed.
            RuntimeError: first use outside a running event loop.
        """
        if type(delay) is not float or delay - delay:
            delay = as_seconds(delay, "delay")
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        loop = self._loop
        if loop is None or self._closed:
            loop = self._bind()
        handle = TimerHandle(
            self, callback, args, contextvars.copy_context() if context is None else context
        )
        self._schedule(handle, loop.time() + delay)
        return handle

    def call_at(
        self,
        when: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> TimerHandle:
        """Run ``callback(*args)`` at loop time ``when`` (``loop.call_at`` semantics).

        A ``when`` in the past means due now (run on a later loop iteration).

        Raises:
            TypeError: ``when`` is not a number (or is a bool); ``callback`` is not callable.
            ValueError: ``when`` is NaN or infinite.
            PurgatoryClosedError: the timer is closed.
            RuntimeError: first use outside a running event loop.
        """
        if type(when) is not float or when - when:
            when = as_seconds(when, "when")
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        if self._loop is None or self._closed:
            self._bind()
        handle = TimerHandle(
            self, callback, args, contextvars.copy_context() if context is None else context
        )
        self._schedule(handle, when)
        return handle

    def timeout(self, delay: float | None) -> Timeout:
        """An async context manager like ``asyncio.timeout(delay)``, driven by this timer.

        At the deadline it cancels the enclosing task; leaving the block then raises
        ``TimeoutError``. ``None`` means no deadline (see :meth:`Timeout.reschedule`);
        zero or negative means already due.

        Raises:
            TypeError, ValueError: ``delay`` is not None and not a finite number.
            RuntimeError: called outside a running event loop.
        """
        if delay is None:
            return Timeout(self, None)
        delay = as_seconds(delay, "delay")
        return Timeout(self, asyncio.get_running_loop().time() + delay)

    def timeout_at(self, when: float | None) -> Timeout:
        """Like :meth:`timeout` with an absolute loop time (``asyncio.timeout_at``)."""
        return Timeout(self, None if when is None else as_seconds(when, "when"))

    def close(self) -> None:
        """Cancel everything pending and refuse new work. Idempotent.

        Pending :class:`TimerHandle` objects become cancelled; delayed operations
        scheduled on this timer are cancelled (``Outcome.CANCELLED``).
        """
        if self._closed:
            return
        self._closed = True
        self._disarm()
        if self._ready_handle is not None:
            self._ready_handle.cancel()
            self._ready_handle = None
        entries: list[_TimerEntry] = [*self._ready, *self._wheel.clear()]  # type: ignore[list-item]
        self._ready = []
        for entry in entries:
            if entry._tick is not None:
                entry._tick = None
                entry._bucket = None
                self._count -= 1
                entry._timer_closed()

    # -- internals shared with delayed operations -----------------------------------

    def _bind(self) -> asyncio.AbstractEventLoop:
        if self._closed:
            raise PurgatoryClosedError("the timer is closed")
        loop = self._loop
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError("a Timer binds to a running event loop on first use") from None
            self._loop = loop
            self._wheel = TimingWheel(self._wheel_size, self._floor_tick(loop.time()))
        return loop

    def _floor_tick(self, now: float) -> int:
        tick = self._tick
        n = floor(now / tick)
        if n * tick > now:
            n -= 1
        return n

    def _schedule(self, entry: _TimerEntry, when: float) -> None:
        """Put ``entry`` in the wheel for loop time ``when`` (validated, loop bound)."""
        tick = self._tick
        e = ceil(when / tick)
        if e * tick < when:  # float rounding: never early
            e += 1
        entry._when = when
        entry._tick = e
        wheel = self._wheel
        if not self._count:
            # The wheel's clock only moves when buckets fire; after an idle spell
            # bring it up to now so that new entries land on the right level.
            wheel.advance(self._floor_tick(self._loop.time()))  # type: ignore[union-attr]
        self._count += 1
        if wheel.add(entry):
            first = wheel._queue[0][0]
            if first < self._armed:
                self._arm(first)
        else:
            self._ready.append(entry)
            if self._ready_handle is None:
                self._ready_handle = self._loop.call_soon(self._run_ready)  # type: ignore[union-attr]

    def _unschedule(self, entry: _TimerEntry) -> None:
        """Withdraw a pending ``entry`` (``entry._tick`` is not None)."""
        entry._tick = None
        bucket = entry._bucket
        if bucket is not None:
            del bucket[id(entry)]
            entry._bucket = None
        self._count -= 1
        if not self._count:
            self._disarm()

    def _arm(self, expiration: int) -> None:
        handle = self._handle
        if handle is not None:
            handle.cancel()
        self._armed = expiration
        self._handle = self._loop.call_at(expiration * self._tick, self._on_timer)  # type: ignore[union-attr]

    def _disarm(self) -> None:
        handle = self._handle
        if handle is not None:
            handle.cancel()
            self._handle = None
            self._armed = inf

    def _on_timer(self) -> None:
        loop: asyncio.AbstractEventLoop = self._loop  # type: ignore[assignment]
        armed = self._armed
        self._handle = None
        self._armed = -inf
        try:
            now = loop.time()
            due = self._wheel.advance(self._floor_tick(now))
            if due:
                lag = now - armed * self._tick
                if lag > _LAG_LOG_THRESHOLD and now - self._last_lag_log >= _LAG_LOG_INTERVAL:
                    self._last_lag_log = now
                    self._logger.debug("aiopurgatory.timer_lag", lag=lag, due=len(due))
                self._run(due)
        finally:
            self._armed = inf
            if self._count and not self._closed:
                expiration = self._wheel.next_expiration()
                if expiration is not None:
                    self._arm(expiration)

    def _run_ready(self) -> None:
        self._ready_handle = None
        ready = self._ready
        self._ready = []
        self._run(ready)

    def _run(self, due: Sequence[Entry]) -> None:
        i = 0
        try:
            for i, entry in enumerate(due):  # noqa: B007 - i is read on the way out
                if entry._tick is None:
                    continue  # cancelled after it became due
                entry._tick = None
                self._count -= 1
                try:
                    entry._fire()  # type: ignore[attr-defined]
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self._loop.call_exception_handler(  # type: ignore[union-attr]
                        {
                            "message": f"Exception in timer callback {entry!r}",
                            "exception": exc,
                            "timer_handle": entry,
                        }
                    )
        except BaseException:
            # Do not lose the rest of the batch: run it on a later iteration.
            rest = [e for e in due[i + 1 :] if e._tick is not None]
            if rest:
                self._ready.extend(rest)  # type: ignore[arg-type]
                if self._ready_handle is None and not self._closed:
                    self._ready_handle = self._loop.call_soon(self._run_ready)  # type: ignore[union-attr]
            raise
        finally:
            if not self._count:
                self._disarm()


class _State(enum.Enum):
    CREATED = "created"
    ENTERED = "entered"
    EXPIRING = "expiring"
    EXPIRED = "expired"
    EXITED = "exited"


class Timeout:
    """Async context manager returned by :meth:`Timer.timeout` and :func:`timeout`.

    Behaves like :class:`asyncio.Timeout`: when the deadline passes inside the
    block, the enclosing task is cancelled and leaving the block raises
    ``TimeoutError`` (chained from the ``CancelledError``).
    """

    __slots__ = ("_cancelling", "_handle", "_state", "_task", "_timer", "_when")

    def __init__(self, timer: Timer, when: float | None) -> None:
        self._timer = timer
        self._when = when
        self._handle: TimerHandle | None = None
        self._state = _State.CREATED
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0

    def __repr__(self) -> str:
        return f"<Timeout [{self._state.value}] when={self._when}>"

    def when(self) -> float | None:
        """The deadline in loop time (seconds), or None."""
        return self._when

    def expired(self) -> bool:
        """True if the deadline passed and the task was cancelled by this timeout."""
        return self._state in (_State.EXPIRING, _State.EXPIRED)

    def reschedule(self, when: float | None) -> None:
        """Move the deadline to loop time ``when`` (None: no deadline).

        Raises:
            RuntimeError: the block has not been entered, or has been left.
            TypeError, ValueError: ``when`` is not None and not a finite number.
        """
        if self._state is not _State.ENTERED:
            raise RuntimeError(f"cannot reschedule a timeout that is {self._state.value}")
        if when is not None:
            when = as_seconds(when, "when")
        self._when = when
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if when is not None:
            self._handle = self._timer.call_at(when, self._on_timeout)

    async def __aenter__(self) -> Timeout:
        if self._state is not _State.CREATED:
            raise RuntimeError("Timeout has already been entered")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Timeout should be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._state = _State.ENTERED
        self.reschedule(self._when)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._state is _State.EXPIRING:
            self._state = _State.EXPIRED
            task = self._task
            assert task is not None
            if task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc_val
        elif self._state is _State.ENTERED:
            self._state = _State.EXITED

    def _on_timeout(self) -> None:
        assert self._task is not None
        self._task.cancel()
        self._state = _State.EXPIRING
        self._handle = None


_shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Timer] = weakref.WeakKeyDictionary()


def shared_timer() -> Timer:
    """The running loop's shared :class:`Timer` (default settings), created on demand.

    Raises:
        RuntimeError: no running event loop.
    """
    loop = asyncio.get_running_loop()
    timer = _shared.get(loop)
    if timer is None:
        timer = _shared[loop] = Timer()
    return timer


def timeout(delay: float | None) -> Timeout:
    """``asyncio.timeout(delay)`` on the running loop's shared :class:`Timer`.

    Raises:
        TypeError, ValueError: ``delay`` is not None and not a finite number.
        RuntimeError: no running event loop.
    """
    return shared_timer().timeout(delay)


def timeout_at(when: float | None) -> Timeout:
    """``asyncio.timeout_at(when)`` on the running loop's shared :class:`Timer`."""
    return shared_timer().timeout_at(when)
