"""The purgatory's core: watch lists, triggers and the bookkeeping of every operation.

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

import contextlib
import sys
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from ._backends import current_owner, new_waiter
from ._detect import in_trio_task
from ._duration_counts import _DurationCounts
from ._errors import OperationStateError, PurgatoryClosedError, PurgatoryFullError
from ._operation import DelayedOperation, Outcome, _PurgatoryBase
from ._thresholds import ThresholdIndex
from ._timer import Timer
from ._timer_states import IDLE, NO_DEADLINE
from ._validation import as_number, hashable_key, keys_of, thresholds_of, unhashable_key

__all__ = ["WatermarkOperation"]

COMPLETED = Outcome.COMPLETED
EXPIRED = Outcome.EXPIRED
CANCELLED = Outcome.CANCELLED
_modules = sys.modules

# Whether finished operations are counted in the histograms: the one switch,
# declared in aiopurgatory._duration_counts. The compiled core cimports it from
# there as a C constant (this module's .pxd), so that the C compiler drops the
# counting code from a build without histograms; the compiled module has no
# Python attribute of that name to import, hence the ImportError suppressed.
with contextlib.suppress(ImportError):
    from ._duration_counts import HISTOGRAMS


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


class _PurgatoryCore(_PurgatoryBase):
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
        "_expired",
        "_failed",
        "_lateness",
        "_max_pending",
        "_owner",
        "_pending",
        "_threshold_watchers",
        "_timer",
        "_tracer",
        "_wait_cancelled",
        "_wait_completed",
        "_wait_expired",
        "_wait_failed",
        "_watch_number",
        "_watched",
        "_watchers",
        "_watermarks",
    )

    _timer: Timer
    # The asyncio loop, or the trio run's token, this purgatory is bound to.
    _owner: object
    # Plain watchers: key -> {id(op): op}, in watch order.
    _watchers: dict[Hashable, dict[int, Any]]
    # Watchers with a threshold: key -> ThresholdIndex.
    _threshold_watchers: dict[Hashable, ThresholdIndex]
    # The watermark of each key advanced while it has watchers (of either kind).
    _watermarks: dict[Hashable, Any]
    # The number of the last watch with thresholds (see ThresholdIndex).
    _watch_number: int
    _advances: int
    _max_pending: int | None
    _closed: bool
    _pending: int
    _watched: int
    _completed: int
    _expired: int
    _cancelled: int
    _failed: int
    # Always-on histograms: the wait of finished operations by outcome, and how
    # late each expiry fired (aiopurgatory._duration_counts; snapshots: histograms()).
    _wait_completed: _DurationCounts
    _wait_expired: _DurationCounts
    _wait_cancelled: _DurationCounts
    _wait_failed: _DurationCounts
    _lateness: _DurationCounts
    # The hooks of aiopurgatory.tracing while it traces this purgatory's waits, else
    # None: one test per watch and per trigger that reaches watchers. The end of a
    # traced wait comes through the recorder slot (_PurgatoryBase._recorder), which
    # finishing operations test already.
    _tracer: Any

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
        if self._owner is None:
            self._bind()
        elif not timer._is_current():
            raise RuntimeError(f"purgatory {self._name!r} is bound to another event loop")
        deadline = timer._deadline(op._timeout, "timeout")

        op._purgatory = self
        # Set before the first check, so that try_complete() can read them; the
        # op joins its watch lists (op._joined) only if that check says no.
        op._keys = keys
        op._thresholds = thresholds
        if self._tracer is not None:
            # In the watcher's context (its span is the parent), before the first
            # check: a watch that check completes is a (short) span too.
            self._tracer.watched(op)
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

        # One int object, id(op), keys the op in every plain watch list and in the
        # wheel; given here, it also tells that the op joined them (op._joined).
        op._id_key = oid = id(op)
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
        return False

    def _watch_thresholds(
        self, op: DelayedOperation, keys: tuple[Hashable, ...], thresholds: tuple[float, ...]
    ) -> None:
        self._watch_number += 1
        number = self._watch_number
        everything = self._threshold_watchers
        # The op's entries, one per key, chained in the order of its keys.
        last = None
        for i in range(len(keys)):
            key = keys[i]
            watch = everything.get(key)
            if watch is None:
                everything[key] = watch = ThresholdIndex()
            entry = watch.add(op, thresholds[i], number)
            if last is None:
                op._thresholds = entry  # joined: the entries hold the thresholds now
            else:
                last.next = entry
            last = entry

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
        watch = self._threshold_watchers.get(key) if self._threshold_watchers else None
        if watch is None:
            if not ops:
                return 0
            checked = list(ops.values())
        else:
            checked = list(ops.values()) if ops else []
            checked += watch.pending()
        if self._tracer is not None:
            return self._check_traced(checked, key)
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
        watch = self._threshold_watchers.get(key) if self._threshold_watchers else None
        if ops is None and watch is None:
            return 0
        watermarks = self._watermarks
        mark = watermarks.get(key)
        if mark is not None and not value > mark:
            return 0
        watermarks[key] = value
        self._advances += 1
        if watch is None:
            checked = list(ops.values())  # type: ignore[union-attr]
        elif ops is None:
            checked = watch.reach(value)
        else:
            checked = list(ops.values())
            checked += watch.reach(value)
        if self._tracer is not None:
            return self._check_traced(checked, key)
        return _check_ops(checked)

    def _check_traced(self, checked: list[Any], key: Hashable) -> int:
        """:func:`_check_ops` inside a trigger of ``key`` that the tracer is told of
        (what it completes was completed by ``key``)."""
        tracer = self._tracer
        outer = tracer.trigger_began(key)
        try:
            return _check_ops(checked)
        finally:
            tracer.trigger_ended(outer)

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
        watch = self._threshold_watchers.get(key) if self._threshold_watchers else None
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

    def _unwatch_thresholds(self, op: DelayedOperation) -> None:
        """Take a finishing ``op`` out of the threshold index of each of its keys."""
        entry = op._thresholds  # the first key's entry; the chain follows the keys' order
        op._thresholds = None
        everything = self._threshold_watchers
        for key in op._keys:
            # The entry lets go of the op: stale, it is skipped wherever it stays.
            entry.op = None
            watch = everything[key]
            watch.remove(entry.threshold)
            entry = entry.next
            if not watch.count:
                del everything[key]
                if self._watermarks:
                    self._forget(key)
        if not everything:
            self._threshold_watchers = {}

    def _forget(self, key: Hashable) -> None:
        """Drop ``key``'s watermark if nothing watches the key any more."""
        if key not in self._watchers and key not in self._threshold_watchers:
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
        self._owner = owner

    def _detach(self, op: DelayedOperation, outcome: Outcome) -> None:
        """Count a finishing ``op``'s outcome; take it out of its watch lists and the timer."""
        # How long it waited, for the histograms: one clock read per finished
        # operation that was scheduled (the watch began at deadline - timeout);
        # one finished by its first check, never scheduled, waited no time.
        wait = 0.0
        late = -1.0  # how late the timer fired it: read for an expiry only
        if HISTOGRAMS:
            when = op._when
            if when != NO_DEADLINE:
                # C doubles in the compiled core (no float object per step).
                now = self._timer._time()
                due = when
                timeout = op._timeout
                late = now - due
                wait = late + timeout
        # One branch on the outcome: its counter, and its histograms.
        if outcome is COMPLETED:
            self._completed += 1
            waits = self._wait_completed
        elif outcome is EXPIRED:
            self._expired += 1
            waits = self._wait_expired
            # Not before its deadline: close(expire_pending=True) expires early.
            if HISTOGRAMS and late >= 0.0:
                self._lateness.add(late)
        elif outcome is CANCELLED:
            self._cancelled += 1
            waits = self._wait_cancelled
        else:
            self._failed += 1
            waits = self._wait_failed
        if HISTOGRAMS:
            waits.add(wait)
        oid = op._id_key
        if oid:  # joined (op._joined): not finished by its first check
            keys = op._keys
            if op._thresholds is None:
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
                self._unwatch_thresholds(op)
            self._watched -= len(keys)
            self._pending -= 1
        if op._state != IDLE:  # still in the timer: not an expiry
            self._timer._unschedule(op)


def _park(
    core: _PurgatoryCore, op: Any, keys: Iterable[Hashable] | Mapping[Hashable, float]
) -> Any:
    """For :meth:`Purgatory.watch`: :meth:`~_PurgatoryCore.try_complete_else_watch`, then a waiter.

    A function, not a method: the compiled core calls it, and :func:`_outcome_of`,
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


def _outcome_of(op: DelayedOperation) -> Outcome:
    """For :meth:`Purgatory.watch`: the finished ``op``'s outcome, or its failure raised."""
    return op._result()


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
        # A tuple until the op joined its watch lists, then its entries, which
        # hold the same thresholds chained in the keys' order (DelayedOperation).
        entry = None if type(thresholds) is tuple else thresholds
        if self._all_keys:
            for i in range(len(keys)):
                if entry is None:
                    threshold = thresholds[i]
                else:
                    threshold = entry.threshold
                    entry = entry.next
                mark = marks.get(keys[i])
                if mark is None or mark < threshold:
                    return False
            return True
        if marks:
            for i in range(len(keys)):
                if entry is None:
                    threshold = thresholds[i]
                else:
                    threshold = entry.threshold
                    entry = entry.next
                mark = marks.get(keys[i])
                if mark is not None and mark >= threshold:
                    return True
        return False
