"""The public timer: :class:`Timer`, :class:`TimerHandle`, and ``ap.timeout()``.

A :class:`Timer` keeps its entries in a sans-IO timing wheel in integer ticks
(:mod:`aiopurgatory._wheel`) and decides in loop-time seconds when it next has
work to do; a *driver* (:mod:`aiopurgatory._asyncio_driver` on asyncio and
uvloop, :mod:`aiopurgatory._trio_driver` on trio, picked by
:mod:`aiopurgatory._backends` at first use) gives it the loop's clock and its
wake-ups. Data flows one way: delayed operations and handles are
entries of the timer, the timer files them in the wheel, and the driver wakes
the timer up from the loop. The rules:

* New entries are *staged* and reach the wheel on the next loop iteration, from
  one driver flush per iteration that has new entries. Timers cancelled within
  the iteration that made them (most request timeouts) never touch the wheel, so
  ``call_later`` + ``cancel`` is an allocation, an append and a flag. The stage is
  compacted into the wheel when it grows large within one iteration.
* When an earlier bucket appears the driver is re-armed; when the last pending
  entry goes away it is disarmed: an idle timer costs nothing, there is no
  thread and no polling.
* Deadlines round *up* to ticks (``ceil(when / tick)``, then corrected for float
  rounding), and the clock rounds *down* (``floor(loop.time() / tick)``). A bucket
  runs only once the rounded-down clock has reached it, so nothing ever runs
  before its ``when``. This matters on uvloop, which rounds ``call_at`` to whole
  milliseconds and wakes up to ~1.4 ms early: the timer simply finds nothing due
  yet and re-arms.
* Entries already due when scheduled (a zero or negative delay) run from that
  flush on a later loop iteration, never inside the scheduling call.
* Callbacks run one after the other inside the driver's wake-up. An exception in
  one goes to the driver (the loop's exception handler) and the rest still run.

A purgatory uses its timer through a small interface of named methods and
nothing else of it (``_bind``, ``_is_current``, ``_deadline``, ``_schedule``,
``_unschedule``, ``_call_soon_threadsafe``, ``_time``, ``closed``):
docs/architecture.md lists the invariant each keeps. Seconds become ticks in
:mod:`aiopurgatory._ticks`; the loop's shared timer is in
:mod:`aiopurgatory._shared_timer`.
"""

from __future__ import annotations

import _thread
import contextlib
import contextvars
from collections.abc import Callable
from math import inf
from time import monotonic as _monotonic
from typing import TYPE_CHECKING, Any, Final, TypeVarTuple, Unpack

from ._backends import current_time, new_driver
from ._errors import TimerClosedError
from ._logging import LazyLogger
from ._ticks import MAX_TICKS, ceil_tick, floor_tick
from ._timeout import Timeout
from ._timer_entry import _EntrySet, _TimerEntry
from ._timer_handle import TimerHandle
from ._timer_states import DUE, IDLE, STAGED, UNARMED, WAITING
from ._validation import as_seconds
from ._wheel import TimingWheel

if TYPE_CHECKING:
    import asyncio

__all__ = ["Timer"]

_Ts = TypeVarTuple("_Ts")

_copy_context = contextvars.copy_context

# Timer lag (how late the driver wakes up) is logged at debug level when above
# this, at most once per _LAG_LOG_INTERVAL seconds of loop time.
_LAG_LOG_THRESHOLD: Final = 0.05
_LAG_LOG_INTERVAL: Final = 10.0

# After two early wake-ups at the same clock reading (uvloop), the next one is
# asked for no sooner than this.
_EARLY_WAKE_RETRY: Final = 0.001
# A stage this full within one loop iteration is compacted into the wheel.
_STAGE_LIMIT: Final = 4096


class Timer(_EntrySet):
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
        "_closed",
        "_due_now",
        "_early_wake",
        "_flush_requested",
        "_last_lag_log",
        "_logger",
        "_max_when",
        "_running_in",
        "_running_is",
        "_shared",
        "_tick_width",
        "_time",
        "_wheel",
    )

    def __init__(self, *, tick: float = 0.001, wheel_size: int = 20) -> None:
        tick = as_seconds(tick, "tick")
        if tick <= 0:
            raise ValueError(f"tick must be positive, got {tick!r}")
        # The wheel checks wheel_size; its clock starts once the timer is bound.
        self._wheel = TimingWheel(wheel_size)
        # The pending entries, the stage and the armed wake-up (see _EntrySet);
        # the driver is set on first use (_bind), with its clock.
        _EntrySet.__init__(self)
        self._tick_width = tick
        self._time: Callable[[], float] = _monotonic
        # The driver's running_here, for _is_current without a call into it:
        # the thread, and the loop's is_running (None if the driver has none).
        self._running_in = 0
        self._running_is: Callable[[], bool] | None = None
        # Deadlines past this many ticks are refused: the tick would not fit a
        # float division (2**62 ms is about 146 million years).
        self._max_when = MAX_TICKS * tick
        # Entries found due when staged, in scheduling order: they run from the
        # next _drive (see _compact).
        self._due_now: list[_TimerEntry] = []
        self._flush_requested = False
        self._closed = False
        # The loop's shared timer (shared_timer()): not closed by users.
        self._shared = False
        self._logger = LazyLogger(timer=id(self))
        self._last_lag_log = -inf
        self._early_wake = -inf  # loop time of the last early wake-up

    @property
    def tick(self) -> float:
        """Width of the finest wheel slot, in seconds."""
        return self._tick_width

    @property
    def wheel_size(self) -> int:
        """Slots per wheel level."""
        return self._wheel.wheel_size

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has been called."""
        return self._closed

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The asyncio loop this timer is bound to; None before first use or on trio."""
        driver = self._driver
        return None if driver is None else driver.loop

    @property
    def backend(self) -> str | None:
        """``"asyncio"`` (uvloop included) or ``"trio"`` once bound; None before first use."""
        driver = self._driver
        return None if driver is None else driver.backend

    def __len__(self) -> int:
        """Number of pending entries: scheduled, not yet fired, not cancelled."""
        return self._count

    def __bool__(self) -> bool:
        """Always True: an idle timer is still a timer (``len()`` counts pending entries)."""
        return True

    def time(self) -> float:
        """The timer's clock: its loop's ``time()`` (trio: ``trio.current_time()``), in seconds.

        Deadlines of ``call_at`` and ``Timeout`` are on this clock. A timer not yet
        used binds to the running loop here, as on first scheduling.

        Raises:
            TimerClosedError: the timer is closed and was never bound.
            RuntimeError: first use outside a running event loop.
        """
        if self._driver is None:
            self._bind()
        return self._time()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"pending={self._count}"
        return f"<Timer tick={self._tick_width} wheel_size={self._wheel.wheel_size} {state}>"

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
            ValueError: ``delay`` is NaN or infinite, or beyond what the wheel
                counts (``2**62`` ticks: about 146 million years at 1 ms).
            TimerClosedError: the timer is closed (a ``RuntimeError``).
            RuntimeError: first use outside a running event loop.
        """
        if type(delay) is not float or delay - delay:
            delay = as_seconds(delay, "delay")
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        if self._driver is None or self._closed:
            self._bind()
        when = self._time() + delay
        if when > self._max_when:
            raise self._too_far("delay", delay)
        return self._new_handle(when, callback, args, context)

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
            ValueError: ``when`` is NaN or infinite, or beyond ``2**62`` ticks.
            TimerClosedError: the timer is closed (a ``RuntimeError``).
            RuntimeError: first use outside a running event loop.
        """
        if type(when) is not float or when - when:
            when = as_seconds(when, "when")
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        if self._driver is None or self._closed:
            self._bind()
        if when > self._max_when:
            raise self._too_far("when", when)
        return self._new_handle(when, callback, args, context)

    def _new_handle(
        self,
        when: float,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        context: contextvars.Context | None,
    ) -> TimerHandle:
        """The handle of ``callback(*args)`` at ``when`` (checked), scheduled."""
        # __new__ plus stores: markedly cheaper than a call of __init__.
        handle = TimerHandle.__new__(TimerHandle)
        handle._timer = self
        handle._callback = callback
        handle._args = args
        handle._context = _copy_context() if context is None else context
        handle._cancelled = False
        handle._bucket = None
        handle._id_key = 0
        self._schedule(handle, when)
        return handle

    def timeout(self, delay: float | None) -> Timeout:
        """An async context manager like ``asyncio.timeout(delay)``, driven by this timer.

        At the deadline it cancels the enclosing task (on trio: a cancel scope
        around the block); leaving the block then raises ``TimeoutError``.
        ``None`` means no deadline (see :meth:`Timeout.reschedule`);
        zero or negative means already due.

        Raises:
            TypeError, ValueError: ``delay`` is not None and not a finite number.
            RuntimeError: called outside a running event loop.
        """
        if delay is None:
            return Timeout(self, None)
        delay = as_seconds(delay, "delay")
        return Timeout(self, current_time() + delay)

    def timeout_at(self, when: float | None) -> Timeout:
        """Like :meth:`timeout` with an absolute loop time (``asyncio.timeout_at``)."""
        return Timeout(self, None if when is None else as_seconds(when, "when"))

    def close(self) -> None:
        """Cancel everything pending and refuse new work. Idempotent.

        Pending :class:`TimerHandle` objects become cancelled; delayed operations
        scheduled on this timer are cancelled (``Outcome.CANCELLED``).

        Raises:
            RuntimeError: this is the loop's shared timer (:func:`shared_timer`):
                every ``ap.timeout()`` on the loop uses it, so closing it would
                cancel deadlines of code that does not own it (their tasks would
                then never time out). It goes away with its loop; close your
                purgatories instead, or use a ``Timer()`` of your own.
        """
        if self._shared:
            raise RuntimeError(
                "the loop's shared timer (ap.shared_timer(), behind ap.timeout()) cannot be "
                "closed: other code's timeouts use it, and it goes away with its loop; "
                "close your purgatories instead, or give them a Timer() of your own to close"
            )
        if self._closed:
            return
        self._closed = True
        self._armed = UNARMED
        self._flush_requested = False
        if self._driver is not None:
            self._driver.close()
        entries: list[_TimerEntry] = [
            *self._due_now,
            *self._staged,
            *self._wheel.clear(),  # type: ignore[list-item]
        ]
        self._staged = []
        self._due_now = []
        # Out of the stage and the wheel at once: each is now due, to be told.
        for entry in entries:
            if entry._state != IDLE:
                entry._state = DUE
        self._tell_closed(entries)

    def _tell_closed(self, entries: list[_TimerEntry]) -> None:
        """Take the pending ones of ``entries`` out and tell each that the timer closed."""
        for entry in entries:
            if entry._state != IDLE:
                self._unschedule(entry)
                entry._timer_closed()

    def next_due(self) -> float | None:
        """The loop time (seconds) at which this timer next has work to do; None if idle.

        Nothing pending on this timer runs before this instant: it is the start
        of the earliest tick holding a pending entry (so at or after that entry's
        ``when``, by less than a tick), or now for an entry already due. After
        cancellations it may be earlier than the earliest remaining entry (the
        wheel forgets a bucket's earliest tick only when it processes it), never
        later. For tools that drive a loop's clock themselves (the trace replay);
        O(1) amortised, plus the entries scheduled in the current loop iteration.
        """
        if not self._count:
            return None
        tick = self._tick_width
        best = self._wheel.next_expiration()
        if self._due_now:
            best = self._wheel.current
        staged = self._staged
        if staged:
            now = self._time()
            for entry in staged:
                if entry._state == STAGED:
                    when = entry._when
                    # Already reached by the clock: it runs at the next flush,
                    # now, not at its tick (see _compact).
                    e = (
                        floor_tick(now, self._tick_width, self._max_when)
                        if when <= now
                        else ceil_tick(when, self._tick_width, self._max_when)
                    )
                    if best is None or e < best:
                        best = e
        return None if best is None else best * tick

    # -- the purgatory's interface (see the module documentation) ---------------------

    def _bind(self) -> object:
        """Bind to the running loop or trio run on first use; return the owner bound to.

        The owner is the asyncio loop or the trio run's token, also when the timer
        was bound before (the caller compares it with the running one).

        Raises:
            TimerClosedError: the timer is closed.
            RuntimeError: not bound yet, and no running event loop.
        """
        if self._closed:
            raise TimerClosedError("the timer is closed")
        driver = self._driver
        if driver is None:
            try:
                driver = new_driver(self._on_wake, self._on_flush)
            except RuntimeError:
                raise RuntimeError(
                    "a Timer binds to a running event loop (asyncio, uvloop or trio) on first use"
                ) from None
            self._driver = driver
            self._time = driver.time
            here = driver.running_here
            if here is not None:
                self._running_in, self._running_is = here
            self._wheel.restart(floor_tick(driver.time(), self._tick_width, self._max_when))
        return driver.owner

    def _is_current(self) -> bool:
        """True if called on the loop or trio run the timer is bound to (for a bound timer)."""
        # Once per watched operation: the driver's own test is a Python call.
        # _thread.get_ident is a C function in the compiled core (cthread.pxd).
        is_running = self._running_is
        if is_running is not None and self._running_in == _thread.get_ident() and is_running():
            return True
        return self._driver.is_current()  # type: ignore[union-attr]

    def _deadline(self, delay: float, name: str) -> float:
        """The loop time ``delay`` seconds from now, for an entry about to be scheduled.

        For a bound timer. ``delay`` is a valid number of seconds; ``name`` names
        it in the error.

        Raises:
            TimerClosedError: the timer is closed.
            ValueError: the instant is beyond what the wheel counts.
        """
        if self._closed:
            raise TimerClosedError("the timer is closed")
        when = self._time() + delay
        if when > self._max_when:
            raise self._too_far(name, delay)
        return when

    def _call_soon_threadsafe(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` on the bound loop or trio run, from any thread.

        Raises:
            RuntimeError: the loop is closed or the trio run has finished.
        """
        self._driver.call_soon_threadsafe(fn)  # type: ignore[union-attr]

    # -- internals (_schedule and _unschedule below are the interface's too) -----------

    def _too_far(self, name: str, value: float) -> ValueError:
        return ValueError(
            f"{name}={value!r} is too far in the future: with tick={self._tick_width} s this "
            f"timer counts up to {self._max_when:.3g} s of loop time"
        )

    def _schedule(self, entry: _TimerEntry, when: float) -> None:
        """Schedule ``entry`` for loop time ``when`` (validated; the timer is bound).

        The entry is only *staged*: the wheel gets it on the next loop iteration
        (:meth:`_drive`, from one driver flush per iteration), or earlier if the
        stage fills up. Most timers of a server (request timeouts, the timeouts of
        operations that complete quickly) are cancelled within the iteration that
        made them: those never touch the wheel, and cancelling them is a flag.
        Nothing can be due before the next iteration anyway, so this costs no
        accuracy; an entry already due (``when`` in the past) runs from that same
        flush, never inside this call.
        """
        if not self._flush_requested:
            # First, so that a closed loop refuses before anything has changed.
            self._request_flush()
        entry._when = when
        entry._state = STAGED
        self._count += 1
        staged = self._staged
        staged.append(entry)
        if len(staged) >= _STAGE_LIMIT:
            self._compact(self._time())

    def _request_flush(self) -> None:
        """Have the driver call :meth:`_on_flush` on a later loop iteration (once)."""
        self._driver.request_flush()  # type: ignore[union-attr]
        self._flush_requested = True

    def _arm(self, expiration: int, not_before: float = -inf) -> None:
        self._armed = expiration
        when = expiration * self._tick_width
        self._driver.arm(when if when >= not_before else not_before)  # type: ignore[union-attr]

    def _on_wake(self) -> None:
        armed = self._armed
        self._armed = UNARMED
        self._drive(armed)

    def _on_flush(self) -> None:
        self._flush_requested = False
        self._drive(UNARMED)

    def _insert(self, entry: _TimerEntry) -> None:
        """Give a staged entry its tick and put it in the wheel, or in _due_now if due."""
        entry._tick = ceil_tick(entry._when, self._tick_width, self._max_when)
        if self._wheel.add(entry):
            entry._state = WAITING
        else:
            entry._state = DUE
            self._due_now.append(entry)

    def _compact(self, now: float) -> None:
        # Move the live staged entries into the wheel: from _drive once per loop
        # iteration, and from _schedule when the stage fills up within one (so
        # that memory stays bounded). Entries already due wait in _due_now for
        # _drive to run (never rescanned here: no quadratic cost). Due means
        # when <= now, the clock's own reading, as asyncio's call_later(0): a zero
        # delay runs on the next loop iteration, not at the next tick (which may be
        # hundreds of iterations later); comparing with the tick alone (the wheel's
        # clock is rounded down) would keep it until the tick turns over.
        due_now = self._due_now
        for entry in self._staged:
            if entry._state == STAGED:
                if entry._when <= now:
                    entry._state = DUE
                    due_now.append(entry)
                else:
                    self._insert(entry)
        self._staged = []

    def _drive(self, armed: int) -> None:
        """Run everything due, bring staged entries into the wheel, re-arm.

        Called from the driver's wake-up (``armed`` is the tick it was armed for)
        and from its per-iteration flush (``armed`` is ``UNARMED``).
        """
        now = self._time()
        wheel = self._wheel
        # The wheel's clock only moves here; moving it to now before inserting
        # means new entries land on the right level (no needless cascading).
        due: list[_TimerEntry] = wheel.advance(  # type: ignore[assignment]
            floor_tick(now, self._tick_width, self._max_when)
        )
        for entry in due:
            entry._state = DUE
        # Woken before the armed instant, the timer re-arms for it. asyncio wakes
        # handles up to its clock resolution (~1 ns) early and then honours the
        # re-armed instant. uvloop's clock moves in whole milliseconds (and rounds
        # call_at likewise): if a second early wake-up finds the clock where the
        # first one left it, re-arming for the same instant would only spin until
        # the millisecond ticks over, so ask for no sooner than a millisecond on.
        not_before = -inf
        woken = armed != UNARMED
        if woken and now < armed * self._tick_width:
            if now == self._early_wake:
                not_before = now + _EARLY_WAKE_RETRY
            self._early_wake = now
        lag = now - armed * self._tick_width if woken and due else 0.0
        # Staged entries into the wheel; those already due join the ones set
        # aside by earlier compactions, after the wheel's (scheduling order).
        if self._staged:
            self._compact(now)
        if self._due_now:
            due.extend(self._due_now)
            self._due_now = []
        try:
            if due:
                self._run(due)
        finally:
            if lag > _LAG_LOG_THRESHOLD and now - self._last_lag_log >= _LAG_LOG_INTERVAL:
                self._last_lag_log = now
                # An application's logging configuration must not stop timers.
                with contextlib.suppress(Exception):
                    self._logger.debug("aiopurgatory.timer_lag", lag=lag, due=len(due))
            if self._count and not self._closed:
                expiration = wheel.next_expiration()
                if expiration is not None and expiration < self._armed:
                    self._arm(expiration, not_before)

    def _run(self, due: list[_TimerEntry]) -> None:
        i = 0
        try:
            for i, entry in enumerate(due):  # noqa: B007 - i is read on the way out
                if entry._state == IDLE:
                    continue  # withdrawn after it became due
                self._unschedule(entry)
                if self._closed:  # a callback of this batch closed the timer
                    entry._timer_closed()
                    continue
                try:
                    entry._fire()
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self._driver.report(exc, entry)  # type: ignore[union-attr]
        except BaseException:
            # Do not lose the rest of the batch: stage it again, so that it runs
            # from the next iteration's flush (it is due: it runs at once).
            rest = [e for e in due[i + 1 :] if e._state != IDLE]
            if rest and not self._closed:
                for entry in rest:
                    entry._state = STAGED
                self._staged.extend(rest)
                if not self._flush_requested:
                    self._request_flush()
            raise
