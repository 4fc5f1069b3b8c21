"""The public purgatory: :class:`Purgatory`, its statistics, and closing.

:class:`Purgatory` is the class users see: construction, the awaitable
``watch()``, the thread-safe triggers, statistics and histograms, closing and
the recorder. What every operation and every trigger goes through (watch lists,
gauges, ``advance``) is its base, :class:`~aiopurgatory._purgatory_core._PurgatoryCore`.
"""

from __future__ import annotations

import concurrent.futures
import enum
import sys
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, Self

from ._duration_counts import _DurationCounts
from ._histograms import Histogram, PurgatoryHistograms
from ._logging import LazyLogger
from ._operation import DelayedOperation, Outcome
from ._purgatory_core import WatermarkOperation, _expire_now, _PurgatoryCore
from ._thresholds import ThresholdIndex
from ._timer import Timer
from ._validation import as_number, hashable_key
from ._watch import watch as _watch

if sys.version_info >= (3, 13):
    from typing import TypeVar
else:  # a TypeVar with a default (PEP 696) is typing's from 3.13 on
    from typing_extensions import TypeVar

__all__ = ["Purgatory", "PurgatoryStatistics", "WatermarkOperation"]

# Defaults to DelayedOperation, so `ap.Purgatory("fetch")` needs no annotation.
OpT = TypeVar("OpT", bound=DelayedOperation, default=DelayedOperation)


class _Default(enum.Enum):
    """The default of ``tick`` and ``wheel_size``: "not given" (the timer's own apply)."""

    NOT_GIVEN = "not given"

    def __repr__(self) -> str:
        return "<not given>"


_NOT_GIVEN: Final = _Default.NOT_GIVEN


@dataclass(frozen=True, slots=True)
class PurgatoryStatistics:
    """A snapshot of a purgatory's gauges and running totals (plain integers)."""

    #: The purgatory's name.
    name: str
    #: Entries in all watch lists (Kafka ``PurgatorySize``); pending operations only.
    watched: int
    #: Kafka's name (``NumDelayedOperations``, the SPEC's field) for :attr:`pending`:
    #: always the same count (every pending operation is in the timer, and only
    #: those). The exporters show it once, as ``pending``.
    delayed: int
    #: Keys with a non-empty watch list.
    keys: int
    #: Operations watched and not finished.
    pending: int
    #: Running total of operations completed.
    completed: int
    #: Running total of operations expired.
    expired: int
    #: Running total of operations cancelled.
    cancelled: int
    #: Running total of operations whose ``try_complete`` raised.
    failed: int
    #: Running total of :meth:`Purgatory.advance` calls that raised a watermark.
    advances: int = 0


class Purgatory(_PurgatoryCore, Generic[OpT]):
    """Delayed operations watched under keys until completed, expired or cancelled.

    Not thread-safe: only the ``*_threadsafe`` methods may be called from other
    threads. May be constructed outside a running loop; binds to the running
    loop on first use.

    Args:
        name: a label for logs and statistics.
        tick: timer tick in seconds, for the purgatory's own timer (default
            0.001, as :class:`Timer`).
        wheel_size: slots per wheel level, for the purgatory's own timer
            (default 20, as :class:`Timer`).
        max_pending: refuse new operations (``PurgatoryFullError``) while this
            many are pending; None for no limit.
        timer: a :class:`Timer` to share with other purgatories; its own tick and
            wheel size apply, so passing ``tick`` or ``wheel_size`` too (whatever
            the value) is a ``TypeError``. The purgatory closes only a timer it
            created.
        logger: a structlog-compatible logger; ``purgatory=name`` is bound to it once.

    Raises:
        TypeError: an argument has the wrong type; ``tick`` or ``wheel_size`` given
            with ``timer``.
        ValueError: ``max_pending < 1``; tick/wheel_size invalid.
    """

    def __init__(
        self,
        name: str = "purgatory",
        *,
        tick: float | Literal[_Default.NOT_GIVEN] = _NOT_GIVEN,
        wheel_size: int | Literal[_Default.NOT_GIVEN] = _NOT_GIVEN,
        max_pending: int | None = None,
        timer: Timer | None = None,
        logger: Any | None = None,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        if max_pending is not None:
            if isinstance(max_pending, bool) or not isinstance(max_pending, int):
                raise TypeError(
                    f"max_pending must be an int or None, got {type(max_pending).__name__}"
                )
            if max_pending < 1:
                raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        if timer is not None:
            if not isinstance(timer, Timer):
                raise TypeError(f"timer must be an aiopurgatory.Timer, got {type(timer).__name__}")
            given = [
                f"{arg}={value!r}"
                for arg, value in (("tick", tick), ("wheel_size", wheel_size))
                if value is not _NOT_GIVEN
            ]
            if given:
                raise TypeError(
                    f"timer= and {' and '.join(given)} cannot be given together: "
                    "the timer's own tick and wheel_size apply"
                )
            self._owns_timer = False
        else:
            # Only what was given: the timer's own defaults apply to the rest.
            options: dict[str, Any] = {}
            if tick is not _NOT_GIVEN:
                options["tick"] = tick
            if wheel_size is not _NOT_GIVEN:
                options["wheel_size"] = wheel_size
            timer = Timer(**options)
            self._owns_timer = True
        self._name = name
        self._timer = timer
        self._max_pending = max_pending
        self._owner: object = None
        self._watchers: dict[Hashable, dict[int, OpT]] = {}
        self._threshold_watchers: dict[Hashable, ThresholdIndex] = {}
        self._watermarks: dict[Hashable, Any] = {}
        self._advances = 0
        self._watch_number = 0
        self._closed = False
        self._pending = 0
        self._watched = 0
        self._completed = 0
        self._expired = 0
        self._cancelled = 0
        self._failed = 0
        self._wait_completed = _DurationCounts()
        self._wait_expired = _DurationCounts()
        self._wait_cancelled = _DurationCounts()
        self._wait_failed = _DurationCounts()
        self._lateness = _DurationCounts()
        self._recorder: Callable[[DelayedOperation], None] | None = None
        self._tracer: Any = None  # aiopurgatory.tracing's hooks while it traces
        if logger is None:
            self._logger: Any = LazyLogger(purgatory=name)
        elif callable(getattr(logger, "bind", None)):
            self._logger = logger.bind(purgatory=name)
        else:
            raise TypeError(
                f"logger must be a structlog-compatible logger (with bind()), "
                f"got {type(logger).__name__}"
            )

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"pending={self._pending}"
        return f"<Purgatory {self._name!r} {state} watched={self._watched}>"

    if TYPE_CHECKING:
        # The generic signatures of the core's methods (documented there).
        def try_complete_else_watch(
            self, op: OpT, keys: Iterable[Hashable] | Mapping[Hashable, float]
        ) -> bool: ...
        def cancel_for_key(self, key: Hashable) -> list[OpT]: ...

    # -- properties ----------------------------------------------------------------

    @property
    def name(self) -> str:
        """The purgatory's name."""
        return self._name

    @property
    def timer(self) -> Timer:
        """The timer that expires this purgatory's operations."""
        return self._timer

    @property
    def max_pending(self) -> int | None:
        """The backpressure limit on pending operations, or None."""
        return self._max_pending

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has been called."""
        return self._closed

    @property
    def watched(self) -> int:
        """Entries in all watch lists (Kafka ``PurgatorySize``); pending operations only."""
        return self._watched

    @property
    def delayed(self) -> int:
        """Kafka's name (``NumDelayedOperations``) for :attr:`pending`: the same count.

        Every pending operation is scheduled once it joins its watch lists, and
        only then, so an alias: one count, one gauge (``pending``) in the exporters.
        """
        return self._pending

    @property
    def pending(self) -> int:
        """Operations watched and not yet finished (what ``max_pending`` limits)."""
        return self._pending

    def statistics(self) -> PurgatoryStatistics:
        """A snapshot of the gauges and running totals."""
        return PurgatoryStatistics(
            name=self._name,
            watched=self._watched,
            delayed=self._pending,
            keys=len(self.keys()),
            pending=self._pending,
            completed=self._completed,
            expired=self._expired,
            cancelled=self._cancelled,
            failed=self._failed,
            advances=self._advances,
        )

    def keys(self) -> list[Hashable]:
        """The keys with at least one pending watcher (of either kind), in no set order.

        For a bridge that re-reads the watermarks of every watched key (see
        :mod:`aiopurgatory.redis`). A new list on each call.
        """
        keys = list(self._watchers)
        watchers = self._watchers
        keys += [key for key in self._threshold_watchers if key not in watchers]
        return keys

    def histograms(self, *, reset: bool = False) -> PurgatoryHistograms:
        """A snapshot of the wait and lateness histograms (always recorded).

        Every operation that finishes is recorded when it finishes, by outcome:
        how long it waited since it was watched, and for an expiry fired by the
        timer, how late it fired. See :class:`PurgatoryHistograms` and
        :class:`Histogram` (percentiles, merging, intervals) and
        ``docs/metrics.md``.

        Args:
            reset: start the histograms afresh after taking the snapshot, so that
                the next one covers only what finishes from now on. Exporters
                (Prometheus) need the running totals: prefer subtracting two
                snapshots (``later - earlier``) where an exporter reads too.

        Safe to call from another thread than the loop's (a metrics scrape),
        without ``reset``: each histogram is copied whole, the histograms of one
        snapshot may be a few operations apart.
        """
        every_counts = (
            self._wait_completed,
            self._wait_expired,
            self._wait_cancelled,
            self._wait_failed,
            self._lateness,
        )
        histograms = []
        for durations in every_counts:
            count, total, largest, counts = durations.counts()
            histograms.append(Histogram(count, total, largest, tuple(counts)))
            if reset:
                durations.reset()
        return PurgatoryHistograms(self._name, *histograms)

    # -- watching --------------------------------------------------------------------

    if TYPE_CHECKING:

        async def watch(
            self, op: OpT, keys: Iterable[Hashable] | Mapping[Hashable, float]
        ) -> Outcome:
            """See :func:`aiopurgatory._watch.watch`."""
            ...

    else:
        # A coroutine function that returns one small object: see _watch.
        watch = _watch

    # -- triggers ----------------------------------------------------------------------

    def check_and_complete_threadsafe(self, key: Hashable) -> concurrent.futures.Future[int]:
        """Run :meth:`check_and_complete` on the purgatory's loop, from any thread.

        On asyncio through ``loop.call_soon_threadsafe``, on trio through the run's
        ``TrioToken.run_sync_soon``.

        Returns:
            A future with the count. A purgatory not yet bound to a loop has nothing
            watched: the future is already done with 0.

        Raises:
            TypeError: ``key`` is unhashable.
            RuntimeError: the bound loop is closed (or the trio run has finished).
        """
        hashable_key(key)
        return self._threadsafe(self.check_and_complete, key)

    def advance_threadsafe(self, key: Hashable, value: float) -> concurrent.futures.Future[int]:
        """Run :meth:`advance` on the purgatory's loop, from any thread.

        As :meth:`check_and_complete_threadsafe`; the arguments are checked here,
        in the calling thread.

        Returns:
            A future with the count (already done with 0 if the purgatory is not
            yet bound to a loop).

        Raises:
            TypeError: ``key`` is unhashable; ``value`` is not an int or a float.
            ValueError: ``value`` is NaN.
            RuntimeError: the bound loop is closed (or the trio run has finished).
        """
        value = as_number(value, "value")
        hashable_key(key)
        return self._threadsafe(self.advance, key, value)

    def _threadsafe(self, method: Callable[..., int], *args: Any) -> concurrent.futures.Future[int]:
        result: concurrent.futures.Future[int] = concurrent.futures.Future()
        if self._owner is None:
            result.set_result(0)
            return result

        def run() -> None:
            if result.set_running_or_notify_cancel():
                try:
                    result.set_result(method(*args))
                except BaseException as exc:
                    result.set_exception(exc)

        # asyncio: loop.call_soon_threadsafe; trio: the run's TrioToken.run_sync_soon.
        self._timer._call_soon_threadsafe(run)
        return result

    # -- closing -------------------------------------------------------------------------

    def close(self, *, expire_pending: bool = False) -> None:
        """Finish every pending operation and refuse new ones. Idempotent.

        Plain, as ``Timer.close()`` and ``loop.close()`` are: it awaits nothing
        (awaiters are woken, and run when the caller next yields). In a coroutine,
        ``await purgatory.aclose()`` or ``async with purgatory:`` says the same.

        Args:
            expire_pending: expire pending operations now (``on_complete`` and
                ``on_expiration`` run, awaiters get ``EXPIRED``) instead of
                cancelling them (the default).
        """
        if self._closed:
            return
        self._closed = True
        pending: dict[int, OpT] = {}
        for ops in list(self._watchers.values()):
            pending.update(ops)
        for watch in list(self._threshold_watchers.values()):
            for op in watch.pending():
                pending[id(op)] = op
        for op in pending.values():
            if expire_pending:
                _expire_now(op)
            else:
                op.cancel()
        if self._owns_timer:
            self._timer.close()
        # Debug level: closing is routine (applications filter it out as they wish).
        self._logger.debug(
            "aiopurgatory.purgatory_closed",
            finished=len(pending),
            how="expired" if expire_pending else "cancelled",
            completed=self._completed,
            expired=self._expired,
            cancelled=self._cancelled,
            failed=self._failed,
            advances=self._advances,
        )

    async def aclose(self, *, expire_pending: bool = False) -> None:
        """:meth:`close`, as a coroutine: anyio's ``AsyncResource`` and
        ``contextlib.aclosing()`` manners."""
        self.close(expire_pending=expire_pending)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- recording (opt-in) -------------------------------------------------------------

    @property
    def recorder(self) -> Callable[[DelayedOperation], None] | None:
        """The callable that :meth:`set_recorder` attached, or None."""
        tracer = self._tracer
        # While traced, the core's recorder slot holds the tracer's hook, which
        # calls this one after ending the span.
        return self._recorder if tracer is None else tracer.recorder

    def set_recorder(self, recorder: Callable[[DelayedOperation], None] | None) -> None:
        """Call ``recorder(op)`` after each operation of this purgatory finishes.

        Off (None) by default, at the cost of one attribute test per finished
        operation. The recorder runs after callbacks and awaiter wake-ups; an
        exception from it is logged (``aiopurgatory.recorder_failed``) and dropped.
        See :mod:`aiopurgatory.events` for the JSON event log built on it.
        """
        if recorder is not None and not callable(recorder):
            raise TypeError(f"recorder must be callable or None, got {type(recorder).__name__}")
        tracer = self._tracer
        if tracer is None:
            self._recorder = recorder
        else:
            tracer.recorder = recorder

    # -- internals -------------------------------------------------------------------------
