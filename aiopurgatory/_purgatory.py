"""The purgatory: delayed operations watched under keys, completed by triggers or expiry.

Kafka's ``DelayedOperationPurgatory`` on one event loop, with three differences
that matter to users:

* A finished operation leaves every watch list at once (Kafka leaves completed
  operations in other keys' lists until a periodic purge), so ``watched`` counts
  only pending operations and nothing is retained per finished operation.
* No locks and no sharding: everything happens on the loop; other threads go
  through :meth:`Purgatory.check_and_complete_threadsafe`.
* Expiry uses a :class:`~aiopurgatory.Timer` (one ``loop.call_at`` handle per
  wheel), which several purgatories may share.

Watch lists are ``dict[key, dict[id(op), op]]``: insertion-ordered (triggers
check operations in watch order), O(1) removal, and independent of the
operations' own ``__eq__``/``__hash__``. Empty lists are dropped at once.
"""

from __future__ import annotations

import concurrent.futures
import enum
import sys
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, Self

from ._backends import current_owner, new_waiter
from ._detect import in_trio_task
from ._errors import OperationStateError, PurgatoryClosedError, PurgatoryFullError
from ._histogram import _Recorder
from ._latency import Histogram, PurgatoryHistograms
from ._logging import LazyLogger
from ._operation import DelayedOperation, Outcome, _Owner
from ._thresholds import ThresholdIndex
from ._timer import Timer
from ._validation import as_number, hashable_key, keys_of, thresholds_of, unhashable_key

if sys.version_info >= (3, 13):
    from typing import TypeVar
else:  # a TypeVar with a default (PEP 696) is typing's from 3.13 on
    from typing_extensions import TypeVar

__all__ = ["Purgatory", "PurgatoryStatistics", "WatermarkOperation"]

# Defaults to DelayedOperation, so `ap.Purgatory("fetch")` needs no annotation.
OpT = TypeVar("OpT", bound=DelayedOperation, default=DelayedOperation)

COMPLETED = Outcome.COMPLETED
EXPIRED = Outcome.EXPIRED
CANCELLED = Outcome.CANCELLED
_modules = sys.modules

# Whether finished operations are recorded in the histograms: always, except in
# a compiled core built to measure their cost (see aiopurgatory._histogram).
HISTOGRAMS = True


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
    #: Operations pending in the timer (Kafka ``NumDelayedOperations``).
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


def _check_ops(ops: list[Any]) -> int:
    """Call ``try_complete()`` on each pending op of ``ops``; how many completed.

    Ops finished before their turn (by a callback of an earlier one) are skipped.
    A true value returned without finishing the op completes it (Kafka users
    write ``return True``); a raising ``try_complete`` fails only its own op.
    """
    completed = 0
    for op in ops:
        finished = op._outcome  # not op.done(): a C field, not a call (compiled)
        if finished is not None:
            continue  # finished by a callback of an earlier op
        try:
            if op.try_complete() and op._outcome is None:
                op.force_complete()  # an override, also one set on the op, is called
        except Exception as exc:
            op._try_complete_failed(exc)
        if op._outcome is COMPLETED:
            completed += 1
    return completed


class _PurgatoryCore(_Owner):
    """The purgatory's bookkeeping: what every operation goes through (compiled).

    Watch lists, gauges and counters, and the calls made per operation or per
    trigger. :class:`Purgatory` adds construction, the awaitable API, closing and
    the generic type; it is the class users see.
    """

    __slots__ = (
        "__weakref__",
        "_advances",
        "_cancelled",
        "_closed",
        "_completed",
        "_delayed",
        "_expired",
        "_failed",
        "_lateness",
        "_loop",
        "_max_pending",
        "_pending",
        "_seq",
        "_thresholds",
        "_timer",
        "_wait_cancelled",
        "_wait_completed",
        "_wait_expired",
        "_wait_failed",
        "_watched",
        "_watchers",
        "_watermarks",
    )

    _timer: Timer
    # The asyncio loop, or the trio run's token, this purgatory is bound to.
    _loop: object
    # Plain watchers: key -> {id(op): op}, in watch order.
    _watchers: dict[Hashable, dict[int, Any]]
    # Watchers with a threshold: key -> ThresholdIndex.
    _thresholds: dict[Hashable, ThresholdIndex]
    # The watermark of each key advanced while it has watchers (of either kind).
    _watermarks: dict[Hashable, Any]
    # The number of the last watch with thresholds (see ThresholdIndex).
    _seq: int
    _advances: int
    _max_pending: int | None
    _closed: bool
    _pending: int
    _watched: int
    _delayed: int
    _completed: int
    _expired: int
    _cancelled: int
    _failed: int
    # Always-on histograms: the wait of finished operations by outcome, and how
    # late each expiry fired (aiopurgatory._histogram; snapshots: histograms()).
    _wait_completed: _Recorder
    _wait_expired: _Recorder
    _wait_cancelled: _Recorder
    _wait_failed: _Recorder
    _lateness: _Recorder

    # -- watching --------------------------------------------------------------------

    def try_complete_else_watch(
        self, op: Any, keys: Iterable[Hashable] | Mapping[Hashable, float]
    ) -> bool:
        """Complete ``op`` now if its condition holds, else watch it under ``keys``.

        Kafka's ``tryCompleteElseWatch``: ``op.try_complete()``, once; if that did
        not finish it, add it to the watch list of every key and schedule its
        expiry ``op.timeout`` seconds from now. (Kafka before 2.7 checked a second
        time after watching, against a trigger from another thread in between; on
        an event loop nothing runs in between, and triggers from other threads
        (:meth:`check_and_complete_threadsafe`) are run on the loop.)

        Args:
            op: a new :class:`DelayedOperation`.
            keys: a list (or set, or other iterable but a tuple) of at least one
                hashable key, duplicates ignored; or a Mapping of keys to
                thresholds (int or float): then :meth:`advance` of a key checks
                ``op`` only once the key's watermark reaches its threshold there.
                A tuple is refused: pass ``[("orders", 0)]`` for one composite key.

        Returns:
            True iff this call completed the operation.

        Raises:
            TypeError: ``op`` is not a DelayedOperation; ``keys`` is a tuple, a
                str/bytes, not iterable, or holds an unhashable key; a threshold
                is not an int or a float.
            ValueError: ``keys`` is empty; a threshold is NaN.
            OperationStateError: ``op`` was already watched (here or elsewhere) or is finished.
            PurgatoryFullError: ``max_pending`` operations are pending.
            PurgatoryClosedError: the purgatory is closed.
            TimerClosedError: its timer is closed (a shared one, closed by its owner).
            RuntimeError: first use outside a running event loop.
            Exception: whatever ``op.try_complete()`` raised (the op is then finished).
        """
        return self._watch_any(op, keys)

    def _watch_any(self, op: Any, keys: Iterable[Hashable] | Mapping[Hashable, float]) -> bool:
        """:meth:`try_complete_else_watch` (checks the arguments' types)."""
        if not isinstance(op, DelayedOperation):
            raise TypeError(f"op must be a DelayedOperation, got {type(op).__name__}")
        if type(keys) is list:
            return self._watch(op, keys_of(keys), None)
        if type(keys) is dict:
            if len(keys) == 1:  # the common case, without _thresholds_of's tuples
                for key, threshold in keys.items():
                    cls = type(threshold)
                    if cls is int or (cls is float and threshold == threshold):
                        return self._watch(op, (key,), (threshold,))
            watched, thresholds = thresholds_of(keys)
            return self._watch(op, watched, thresholds)
        if isinstance(keys, Mapping):
            watched, thresholds = thresholds_of(keys)
            return self._watch(op, watched, thresholds)
        return self._watch(op, keys_of(keys), None)

    def _watch(
        self,
        op: DelayedOperation,
        keys: tuple[Hashable, ...],
        thresholds: tuple[float, ...] | None,
    ) -> bool:
        """:meth:`try_complete_else_watch` for an operation and keys of the right types."""
        try:
            owner = op._purgatory
            outcome = op._outcome
            initialised = op._timeout is not None
        except AttributeError:  # pure Python: the slots were never set
            initialised = False
        if not initialised:  # compiled: the slots exist and hold None
            raise TypeError(
                f"{type(op).__name__}.__init__ must call DelayedOperation.__init__(timeout)"
            )
        if self._closed:
            raise PurgatoryClosedError(f"purgatory {self._name!r} is closed")
        if outcome is not None:
            raise OperationStateError(f"{op!r} is already finished")
        if owner is not None:
            where = "this purgatory" if owner is self else f"purgatory {owner._name!r}"
            raise OperationStateError(f"{op!r} is already watched by {where}")
        if self._max_pending is not None and self._pending >= self._max_pending:
            raise PurgatoryFullError(
                f"purgatory {self._name!r} has max_pending={self._max_pending} pending operations"
            )
        timer = self._timer
        loop = self._loop
        if loop is None:
            self._bind()
        elif not timer._is_current():
            raise RuntimeError(f"purgatory {self._name!r} is bound to another event loop")
        deadline = timer._deadline(op._timeout, "timeout")

        op._purgatory = self
        # Set before the first check, so that try_complete() can read them; the
        # op joins its watch lists (op._key set) only if that check says no.
        op._keys = keys
        op._thresholds = thresholds
        # The one check, before any bookkeeping: most requests that can complete
        # at once never touch a watch list or the timer. Nothing can trigger the
        # op between this check and its joining the watch lists (one loop, and
        # other threads' triggers are run on it), so there is no second check.
        try:
            if op.try_complete() and op._outcome is None:
                op.force_complete()  # "return True" without force_complete()
        except Exception as exc:
            op._try_complete_raised(exc)  # raised to the caller: not logged
            raise
        outcome = op._outcome
        if outcome is not None:
            return outcome is COMPLETED

        # One int object for the op's key in every plain watch list and in the wheel.
        op._key = oid = id(op)
        if thresholds is None:
            watchers = self._watchers
            for key in keys:
                ops = watchers.get(key)
                if ops is None:
                    watchers[key] = {oid: op}
                else:
                    ops[oid] = op
        else:
            self._watch_thresholds(op, keys, thresholds)
        self._watched += len(keys)
        self._pending += 1

        if timer._closed:  # closed by a callback of try_complete meanwhile
            op.cancel()
            return False

        timer._schedule(op, deadline)
        self._delayed += 1
        return False

    def _watch_thresholds(
        self, op: DelayedOperation, keys: tuple[Hashable, ...], thresholds: tuple[float, ...]
    ) -> None:
        self._seq += 1
        number = self._seq
        everything = self._thresholds
        n = len(keys)
        if n == 1:  # the common case: the op keeps its one entry
            key = keys[0]
            watch = everything.get(key)
            if watch is None:
                everything[key] = watch = ThresholdIndex()
            op._entries = watch.add(op, thresholds[0], number)
            return
        entries = []
        for i in range(n):
            key = keys[i]
            watch = everything.get(key)
            if watch is None:
                everything[key] = watch = ThresholdIndex()
            entries.append(watch.add(op, thresholds[i], number))
        op._entries = tuple(entries)

    def check_and_complete(self, key: Hashable) -> int:
        """Call ``try_complete()`` on every pending operation watched under ``key``.

        Operations watched without thresholds are checked in watch order, then
        those watched with a threshold on ``key``, in threshold order (ties in
        watch order), whatever the key's watermark. Callbacks may watch,
        complete or cancel other operations meanwhile (also under ``key``):
        operations that finish before their turn are skipped, operations watched
        meanwhile are not checked by this call (their own watch just checked
        them). A failing ``try_complete`` finishes only its own operation
        (``Outcome.FAILED``).

        Returns:
            How many operations this call completed; 0 for an unknown key.

        Raises:
            TypeError: ``key`` is unhashable.
        """
        ops = self._plain_watchers(key)
        watch = self._thresholds.get(key) if self._thresholds else None
        if watch is None:
            if not ops:
                return 0
            return _check_ops(list(ops.values()))
        checked = list(ops.values()) if ops else []
        checked += watch.pending()
        return _check_ops(checked)

    def advance(self, key: Hashable, value: float) -> int:
        """Raise ``key``'s watermark to ``value`` and check the operations it reaches.

        The watermark only grows: a ``value`` at or below it changes nothing and
        checks nothing. Otherwise this calls ``try_complete()`` on the key's
        watchers without thresholds (in watch order), then on its watchers
        whose threshold on ``key`` is at most the new watermark (in threshold
        order, ties in watch order), and never on one whose threshold is above
        it. An operation checked and not ready stays watched and is checked by
        every later advance of the key. Cost: O(log n) per operation reached,
        plus one check per operation reached and not yet finished.

        The purgatory keeps a key's watermark only while the key has watchers:
        advancing a key nobody watches keeps nothing (the source of truth, a
        log's end or a group's size, is the caller's), so memory is bounded by
        the watched keys.

        Args:
            key: a hashable key.
            value: the new watermark, an int or a float.

        Returns:
            How many operations this call completed.

        Raises:
            TypeError: ``key`` is unhashable; ``value`` is not an int or a float.
            ValueError: ``value`` is NaN.
        """
        if (type(value) is not int and type(value) is not float) or value != value:
            value = as_number(value, "value")
        ops = self._plain_watchers(key)
        watch = self._thresholds.get(key) if self._thresholds else None
        if ops is None and watch is None:
            return 0
        watermarks = self._watermarks
        mark = watermarks.get(key)
        if mark is not None and not value > mark:
            return 0
        watermarks[key] = value
        self._advances += 1
        if watch is None:
            return _check_ops(list(ops.values()))  # type: ignore[union-attr]
        if ops is None:
            return _check_ops(watch.reach(value))
        checked = list(ops.values())
        checked += watch.reach(value)
        return _check_ops(checked)

    def watermark(self, key: Hashable) -> Any:
        """The watermark of ``key``: the highest value advanced while it is watched.

        None for a key never advanced, or whose last watcher finished since (the
        purgatory keeps watermarks of watched keys only).

        Raises:
            TypeError: ``key`` is unhashable.
        """
        hashable_key(key)
        return self._watermarks.get(key)

    def cancel_for_key(self, key: Hashable) -> list[Any]:
        """Cancel every pending operation watched under ``key`` and return them.

        Each is cancelled as by ``op.cancel()``: out of the timer and of every
        watch list, no callbacks, ``Outcome.CANCELLED``.

        Returns:
            The cancelled operations, in the order :meth:`check_and_complete`
            checks them; ``[]`` for an unknown key.

        Raises:
            TypeError: ``key`` is unhashable.
        """
        ops = self._plain_watchers(key)
        watch = self._thresholds.get(key) if self._thresholds else None
        candidates = list(ops.values()) if ops else []
        if watch is not None:
            candidates += watch.pending()
        return [op for op in candidates if op.cancel()]

    # -- internals -------------------------------------------------------------------------

    def _plain_watchers(self, key: Hashable) -> dict[int, Any] | None:
        """``key``'s watchers without thresholds, or None: the one lookup that refuses
        an unhashable ``key`` (the threshold index is then looked up safely)."""
        try:
            return self._watchers.get(key)
        except TypeError as exc:
            raise unhashable_key(key, exc) from None

    def _record(self, op: DelayedOperation) -> None:
        recorder = self._recorder
        assert recorder is not None
        try:
            recorder(op)
        except Exception as exc:
            self._logger.error("aiopurgatory.recorder_failed", error=repr(exc), exc_info=exc)

    def _unwatch_thresholds(
        self, entries: Any, keys: tuple[Hashable, ...], thresholds: tuple[float, ...]
    ) -> None:
        # Every entry of the op lets go of it: its one, or a tuple of them.
        if type(entries) is tuple:
            for entry in entries:
                entry.op = None
        else:
            entries.op = None
        everything = self._thresholds
        for i in range(len(keys)):
            key = keys[i]
            watch = everything[key]
            watch.remove(thresholds[i])
            if not watch.count:
                del everything[key]
                if self._watermarks:
                    self._forget(key)
        if not everything:
            self._thresholds = {}

    def _forget(self, key: Hashable) -> None:
        """Drop ``key``'s watermark if nothing watches the key any more."""
        if key not in self._watchers and key not in self._thresholds:
            watermarks = self._watermarks
            if watermarks.pop(key, None) is not None and not watermarks:
                self._watermarks = {}

    def _bind(self) -> None:
        """Bind to the running loop or trio run (and the timer too, if it is not yet)."""
        try:
            owner = current_owner()
        except RuntimeError:
            raise RuntimeError(
                f"purgatory {self._name!r} is bound to a running event loop "
                "(asyncio, uvloop or trio) on first use"
            ) from None
        # TimerClosedError if the timer is closed; else the owner it is bound to.
        if self._timer._bind() is not owner:
            raise RuntimeError(f"the timer of purgatory {self._name!r} is bound to another loop")
        self._loop = owner

    def _detach(self, op: DelayedOperation, outcome: Outcome) -> None:
        """Count a finishing ``op``'s outcome; take it out of its watch lists and the timer."""
        if outcome is COMPLETED:
            self._completed += 1
        elif outcome is EXPIRED:
            self._expired += 1
        elif outcome is CANCELLED:
            self._cancelled += 1
        else:
            self._failed += 1
        if HISTOGRAMS:
            # One clock read per finished operation that was scheduled; one
            # finished before it was scheduled (completed by its first check)
            # waited no time. The watch began at deadline - timeout.
            when = op._when
            if when is None:
                wait = 0.0
            else:
                # C doubles in the compiled core (no float object per step).
                now = self._timer._time()
                due = when
                timeout = op._timeout
                late = now - due
                wait = late + timeout
                if outcome is EXPIRED and late >= 0.0:
                    self._lateness.record(late)
            if outcome is COMPLETED:
                self._wait_completed.record(wait)
            elif outcome is EXPIRED:
                self._wait_expired.record(wait)
            elif outcome is CANCELLED:
                self._wait_cancelled.record(wait)
            else:
                self._wait_failed.record(wait)
        oid = op._key
        if oid:  # it joined its watch lists (it was not finished by its first check)
            keys = op._keys
            thresholds = op._thresholds
            if thresholds is None:
                watchers = self._watchers
                for key in keys:
                    ops = watchers[key]
                    del ops[oid]
                    if not ops:
                        del watchers[key]
                        if self._watermarks:
                            self._forget(key)
                if not watchers:
                    # A dict never shrinks its table on deletion: after a burst of many
                    # distinct keys, start afresh rather than keep the peak's table.
                    self._watchers = {}
            else:
                self._unwatch_thresholds(op._entries, keys, thresholds)
            self._watched -= len(keys)
            self._pending -= 1
        if op._when is not None:
            self._delayed -= 1
            if op._tick is not None:
                self._timer._unschedule(op)


def _park(
    core: _PurgatoryCore, op: Any, keys: Iterable[Hashable] | Mapping[Hashable, float]
) -> Any:
    """For :meth:`Purgatory.watch`: :meth:`~_PurgatoryCore.try_complete_else_watch`, then a waiter.

    A function, not a method: the compiled core calls it, and :func:`_outcome`,
    without looking either up by name on the purgatory or the operation.

    Returns:
        None if ``op`` finished at once; else a new waiter (an asyncio future, or
        trio's equivalent) of the loop the purgatory is bound to, which ``op`` sets
        when it finishes.
    """
    if core is None:  # Purgatory.watch(None, ...): a C function must not take it on
        raise TypeError("watch() is a method of a Purgatory")
    core._watch_any(op, keys)  # RuntimeError on another loop or trio run
    parked: DelayedOperation = op
    if parked._outcome is not None:
        return None
    # Watched, so the timer's driver is the running loop's, and its waiter is
    # what the awaiting task can wait on; except in trio's guest mode, where
    # trio tasks and the asyncio host's share the thread (and the driver).
    driver = core._timer._driver
    # trio never imported: no trio task (and no Python call to ask _detect).
    if _modules.get("trio") is not None and in_trio_task() is not (
        driver.backend == "trio"  # type: ignore[union-attr]
    ):
        waiter = new_waiter()  # the awaiting task's library
    else:
        waiter = driver.waiter()  # type: ignore[union-attr]
    parked._add_waiter(waiter)
    return waiter


def _expire_now(op: DelayedOperation) -> None:
    """For :meth:`Purgatory.close`: expire the pending ``op``, as its timer would."""
    op._fire()


def _outcome(op: DelayedOperation) -> Outcome:
    """For :meth:`Purgatory.watch`: the finished ``op``'s outcome, or its failure raised."""
    return op._result()


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
        self._loop: object = None
        self._watchers: dict[Hashable, dict[int, OpT]] = {}
        self._thresholds: dict[Hashable, ThresholdIndex] = {}
        self._watermarks: dict[Hashable, Any] = {}
        self._advances = 0
        self._seq = 0
        self._closed = False
        self._pending = 0
        self._watched = 0
        self._delayed = 0
        self._completed = 0
        self._expired = 0
        self._cancelled = 0
        self._failed = 0
        self._wait_completed = _Recorder()
        self._wait_expired = _Recorder()
        self._wait_cancelled = _Recorder()
        self._wait_failed = _Recorder()
        self._lateness = _Recorder()
        self._recorder: Callable[[DelayedOperation], None] | None = None
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
        """Operations pending in the timer (Kafka ``NumDelayedOperations``)."""
        return self._delayed

    @property
    def pending(self) -> int:
        """Operations watched and not yet finished (what ``max_pending`` limits)."""
        return self._pending

    def statistics(self) -> PurgatoryStatistics:
        """A snapshot of the gauges and running totals."""
        return PurgatoryStatistics(
            name=self._name,
            watched=self._watched,
            delayed=self._delayed,
            keys=self._key_count(),
            pending=self._pending,
            completed=self._completed,
            expired=self._expired,
            cancelled=self._cancelled,
            failed=self._failed,
            advances=self._advances,
        )

    def _key_count(self) -> int:
        thresholds = self._thresholds
        if not thresholds:
            return len(self._watchers)
        watchers = self._watchers
        return len(watchers) + sum(1 for key in thresholds if key not in watchers)

    def keys(self) -> list[Hashable]:
        """The keys with at least one pending watcher (of either kind), in no set order.

        For a bridge that re-reads the watermarks of every watched key (see
        :mod:`aiopurgatory.redis`). A new list on each call.
        """
        keys = list(self._watchers)
        watchers = self._watchers
        keys += [key for key in self._thresholds if key not in watchers]
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
        recorders = (
            self._wait_completed,
            self._wait_expired,
            self._wait_cancelled,
            self._wait_failed,
            self._lateness,
        )
        histograms = []
        for recorder in recorders:
            count, total, largest, counts = recorder.counts()
            histograms.append(Histogram(count, total, largest, tuple(counts)))
            if reset:
                recorder.reset()
        return PurgatoryHistograms(self._name, *histograms)

    # -- watching --------------------------------------------------------------------

    async def watch(self, op: OpT, keys: Iterable[Hashable] | Mapping[Hashable, float]) -> Outcome:
        """:meth:`try_complete_else_watch`, then wait until ``op`` finishes.

        ``keys`` is a list (or other iterable but a tuple) of keys, or a Mapping
        of keys to thresholds (see :meth:`advance`).

        The caller owns the operation: if the awaiting task is cancelled (asyncio
        task cancellation, a trio or anyio cancel scope, on any backend) the
        operation is cancelled and the cancellation propagates. Raises everything that
        :meth:`try_complete_else_watch` raises, and also what is listed below.

        Returns:
            ``Outcome.COMPLETED`` or ``Outcome.EXPIRED``; ``Outcome.CANCELLED`` if
            someone else cancelled it (``op.cancel()``, ``cancel_for_key``, ``close``).

        Raises:
            RuntimeError: awaited on another loop than the one the purgatory is bound to.
            Exception: whatever a callback of ``op`` raised (the op is finished).
        """
        waiter = _park(self, op, keys)
        if waiter is not None:
            try:
                await waiter
            except BaseException:
                # Cancelled (asyncio's CancelledError, trio's Cancelled, an anyio
                # cancel scope) or abandoned: the caller owns the op, withdraw it.
                op.cancel()
                raise
        return _outcome(op)

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
        if self._loop is None:
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
        for watch in list(self._thresholds.values()):
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
        return self._recorder

    def set_recorder(self, recorder: Callable[[DelayedOperation], None] | None) -> None:
        """Call ``recorder(op)`` after each operation of this purgatory finishes.

        Off (None) by default, at the cost of one attribute test per finished
        operation. The recorder runs after callbacks and awaiter wake-ups; an
        exception from it is logged (``aiopurgatory.recorder_failed``) and dropped.
        See :mod:`aiopurgatory.events` for the JSON event log built on it.
        """
        if recorder is not None and not callable(recorder):
            raise TypeError(f"recorder must be callable or None, got {type(recorder).__name__}")
        self._recorder = recorder

    # -- internals -------------------------------------------------------------------------


class WatermarkOperation(DelayedOperation):
    """An operation that waits for watermarks alone: no ``try_complete`` to write.

    Watch it with thresholds and trigger with :meth:`Purgatory.advance`::

        outcome = await purgatory.watch(WatermarkOperation(5.0), {("orders", 0): offset})
        ...
        purgatory.advance(("orders", 0), high_watermark)   # elsewhere

    It completes once the watermark of one of its keys reaches its threshold
    there (with ``all_keys=True``: once every key's has), and expires after
    ``timeout`` seconds otherwise. Its first check, when watched, reads the
    purgatory's watermarks, which are kept only while a key is watched: check
    your source of truth before watching, or advance after. Subclass it for
    ``on_complete``/``on_expiration``.

    Args:
        timeout: seconds from being watched until expiry; finite and >= 0.
        all_keys: wait for every key's threshold instead of any one's.

    Raises:
        TypeError: ``timeout`` is not a number. Watched without thresholds (a
            list of keys), its first check raises TypeError: the watch fails.
    """

    __slots__ = ("_all_keys",)

    def __init__(self, timeout: float, *, all_keys: bool = False) -> None:
        super().__init__(timeout)
        self._all_keys = bool(all_keys)

    def try_complete(self) -> bool:
        """True once the thresholds are reached (the purgatory then completes it)."""
        thresholds = self._thresholds
        if thresholds is None:
            raise TypeError(
                f"{type(self).__name__} waits for thresholds: watch it with a Mapping "
                "of keys to thresholds, e.g. purgatory.watch(op, {key: threshold})"
            )
        purgatory: Any = self._purgatory
        if purgatory is None:  # pragma: no cover - thresholds are set when watched
            return False
        marks = purgatory._watermarks
        keys = self._keys
        if self._all_keys:
            for i in range(len(keys)):
                mark = marks.get(keys[i])
                if mark is None or mark < thresholds[i]:
                    return False
            return True
        if marks:
            for i in range(len(keys)):
                mark = marks.get(keys[i])
                if mark is not None and mark >= thresholds[i]:
                    return True
        return False
