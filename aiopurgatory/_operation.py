"""Delayed operations: the life cycle of one waiting request.

An operation is *new* until a purgatory takes it, *pending* while watched, and
*finished* exactly once, as one of :class:`Outcome`. Its stage is read off one
field each: ``_purgatory`` (None while new; set when taken, before its first
check), ``_id_key`` (its identity key, ``id(op)``, given once it joins its
watch lists, i.e. its first check did not finish it; 0 before. It stays, so a
finished op tells whether it was watched: ``_joined``) and ``_outcome`` (None
until finished). The rules:

* Completion (``force_complete``) and expiry (the timer) race; the first wins and
  is the only one to run callbacks. ``on_complete`` runs for both; ``on_expiration``
  follows it only on expiry. Cancellation runs neither.
* Finishing detaches the operation at once: out of the timer and out of every
  watch list of its purgatory (O(number of keys)), then callbacks run, then
  awaiters are woken. Awaiters read the result from the operation itself, so an
  exception recorded after they were woken (``try_complete`` raising after it
  called ``force_complete``) still reaches them.
* A callback that raises is contained: stored on the operation and raised to
  its awaiters, never to the timer, to ``check_and_complete`` or to other
  operations. As asyncio does with a future's exception, it is logged (once, as
  ``aiopurgatory.callback_failed``) only if nobody receives it: not if it was
  raised to the caller of ``watch()``/``try_complete_else_watch()``, nor once
  ``await op``, ``result()`` or ``exception()`` delivered it; otherwise when the
  operation is garbage-collected. A second failure of one operation (only the
  first is kept) and a failure outside any event loop are logged at once.
  Exceptions that are not ``Exception`` subclasses (``KeyboardInterrupt``,
  ``SystemExit``, ``CancelledError``) are not contained: they propagate, and an
  operation interrupted that way mid-callback may be left as it was (for
  instance taken by its purgatory but not yet watched, if it came from
  ``try_complete`` inside ``try_complete_else_watch``); the application is usually stopping anyway.
* An operation is itself the timer entry (no handle object per operation), and
  creates an awaitable future only when someone awaits it.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
from asyncio import Future, InvalidStateError
from collections.abc import Callable, Generator, Hashable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._backends import done_callback_scheduler, new_waiter, running_call_soon_threadsafe
from ._logging import LazyLogger
from ._timer_entry import _TimerEntry
from ._timer_states import IDLE, NO_DEADLINE
from ._validation import as_seconds

# asyncio's Future.set_result, called on its futures without a lookup by name.
_set_result = Future.set_result


def _wake(waiter: Any) -> None:
    """Wake an awaiter (``set_result(None)``), unless it has given up."""
    try:
        if type(waiter) is Future:  # most: asyncio's own (no lookup by name)
            _set_result(waiter, None)
        else:
            waiter.set_result(None)
    except InvalidStateError:  # cancelled: its task gave up waiting
        pass


__all__ = ["DelayedOperation", "Outcome"]


class Outcome(enum.Enum):
    """How a delayed operation finished."""

    #: The condition was met and ``force_complete()`` ran (usually from ``try_complete()``).
    COMPLETED = "completed"
    #: Its timeout passed first.
    EXPIRED = "expired"
    #: Withdrawn by ``cancel()``, ``cancel_for_key()``, ``close()`` or a cancelled ``watch()``.
    CANCELLED = "cancelled"
    #: The op's own ``try_complete()`` raised, so the condition could not be evaluated.
    FAILED = "failed"


# Module-private in the compiled core (C variables): other modules take their own
# from Outcome.
COMPLETED = Outcome.COMPLETED
EXPIRED = Outcome.EXPIRED
CANCELLED = Outcome.CANCELLED
FAILED = Outcome.FAILED

# Where failures of operations that have no purgatory are logged.
_log = LazyLogger()


class _Required:
    """The default of ``DelayedOperation(timeout)``: the argument was not given.

    A default rather than a required parameter, so that both cores name the class
    and the argument when it is missing (the compiled one would otherwise say only
    "takes exactly 1 positional argument").
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "<required>"


_REQUIRED: Any = _Required()


class _Unretrieved:
    """A failure nobody has received yet; logged if it never is.

    Kept beside the exception on the operation (asyncio keeps the same flag on a
    future). Receiving the exception (``await op``, ``watch()``, ``result()``,
    ``exception()``) clears it; if the operation is garbage-collected first, the
    failure is logged then, as ``aiopurgatory.callback_failed``. It holds no
    reference to the operation, so it does not keep it alive.

    The log call is handed to the loop the failure happened on (thread-safe: a
    collection may run in any thread), not made inside the garbage collector:
    formatting a traceback there can re-enter the interpreter in places that do
    not expect it. Only if that loop is no longer running is it logged on the spot.
    """

    __slots__ = ("callback", "exc", "logger", "op", "soon")

    def __init__(
        self, logger: Any, callback: str, op: str, exc: Exception, soon: Callable[..., object]
    ) -> None:
        self.logger = logger
        self.callback = callback
        self.op = op
        self.exc: Exception | None = exc
        self.soon = soon

    def __del__(self) -> None:
        exc = self.exc
        if exc is None:
            return
        self.exc = None
        args = (self.logger, self.callback, self.op, exc)
        try:
            self.soon(_log_failure_quietly, *args)
        except Exception:  # the loop is closed, the trio run has finished
            _log_failure_quietly(*args)


def _log_failure(logger: Any, callback: str, op: str, exc: Exception) -> None:
    logger.error(
        "aiopurgatory.callback_failed",
        callback=callback,
        op=op,
        error=repr(exc),
        exc_info=exc,
    )


def _log_failure_quietly(logger: Any, callback: str, op: str, exc: Exception) -> None:
    # From a loop callback or a finalizer: an application's logging configuration
    # (or interpreter shutdown) must not make it raise there.
    with contextlib.suppress(Exception):
        _log_failure(logger, callback, op, exc)


class _DoneCallback:
    """A done callback of an operation, kept among its waiters.

    Shaped like a waiter (``done()``, ``set_result()``), so that finishing the
    operation schedules it with the waiters, in registration order, at no cost to
    operations that have none.
    """

    __slots__ = ("context", "fn", "op", "schedule")

    def __init__(
        self,
        op: DelayedOperation,
        fn: Callable[[DelayedOperation], object],
        context: contextvars.Context,
        schedule: Callable[..., object],
    ) -> None:
        self.op = op
        self.fn = fn
        self.context = context
        self.schedule = schedule

    def done(self) -> bool:
        return False

    def set_result(self, _result: None) -> None:
        self.schedule(self.fn, self.op, self.context)
        self.op = None  # type: ignore[assignment]  # scheduled: no cycle left behind


class _PurgatoryBase:
    """What an operation needs of the purgatory watching it: its only way back.

    :class:`~aiopurgatory.Purgatory` derives from it; this module never imports
    the purgatory's: data flows from operations to the purgatory, to the timer,
    to its driver.
    """

    __slots__ = ("_logger", "_name", "_recorder")

    _name: str
    _logger: Any
    _recorder: Callable[[DelayedOperation], None] | None

    def _detach(self, op: DelayedOperation, outcome: Outcome) -> None:
        """Count a finishing ``op``'s outcome; take it out of its watch lists and the timer."""
        raise NotImplementedError

    def _record(self, op: DelayedOperation) -> None:
        """Hand a finished ``op`` to the recorder (set: ``_recorder`` is not None)."""
        raise NotImplementedError


class DelayedOperation(_TimerEntry):
    """A request that waits in a :class:`Purgatory` until it can complete or times out.

    Subclass it and override :meth:`try_complete` (and usually :meth:`on_complete`),
    as with Kafka's ``DelayedOperation``. Subclasses must call
    ``super().__init__(timeout)``.

    Args:
        timeout: seconds from being watched until expiry; finite and >= 0.

    Raises:
        TypeError: ``timeout`` is not a number (or is a bool).
        ValueError: ``timeout`` is negative, NaN or infinite.
    """

    __slots__ = (
        "_keys",
        "_outcome",
        "_purgatory",
        "_thresholds",
        "_timeout",
        "_waiters",
    )

    if TYPE_CHECKING:

        def __init__(self, timeout: float) -> None: ...

    def __init__(self, timeout: float = _REQUIRED) -> None:  # type: ignore[no-redef]
        if type(timeout) is not float or timeout - timeout:
            if timeout is _REQUIRED:
                cls = type(self).__name__
                subclass = "" if cls == "DelayedOperation" else f" (of {cls})"
                raise TypeError(
                    f"DelayedOperation.__init__(){subclass} missing 1 required argument: "
                    "'timeout' (seconds from being watched until expiry)"
                )
            timeout = as_seconds(timeout, "timeout")
        if timeout < 0:
            raise ValueError(f"timeout must not be negative, got {timeout!r}")
        self._state = IDLE
        self._bucket = None
        self._id_key = 0  # id(op) once in its watch lists (see the module documentation)
        self._when = NO_DEADLINE
        self._timeout = timeout
        self._purgatory: _PurgatoryBase | None = None
        self._keys: tuple[Hashable, ...] = ()
        # Two fields serve one phase of the operation's life each, so that a
        # compiled operation is 128 bytes with the collector's header (the
        # allocator's size class below asyncio's futures and uvloop's handles:
        # issue 54, docs/benchmarks.md).
        #
        # _thresholds, for a watch with thresholds (``watch(op, {key:
        # threshold})``), else None: the threshold on each of ``_keys`` (same
        # order) until the op joins its watch lists; from then on its entries in
        # the purgatory's threshold index, which hold those thresholds: the first
        # key's (aiopurgatory._thresholds.ThresholdEntry), chained to the next
        # key's through ``next`` (no container per operation: nothing more for
        # the garbage collector to walk). WatermarkOperation.try_complete reads
        # either form.
        self._thresholds: Any = None
        self._outcome: Outcome | None = None
        # _waiters, until the op finishes: who is woken when it does, in the
        # order they came: asyncio futures, trio waiters
        # (aiopurgatory._trio_driver.TrioWaiter) and done callbacks
        # (_DoneCallback). None while nobody waits, the waiter itself for one, a
        # list for more: read and changed only by _add_waiter, _forget_waiters
        # and _finish. Most operations have none or one, and a container per
        # operation would be one more object for the garbage collector to walk
        # (a tuple always: about +540 instructions per awaited operation; a field for
        # the first waiter and one for the rest: about +100 per operation, callgrind).
        #
        # Once it finishes (_finish takes the waiters out first): its failure,
        # else None. The failure and its traceback as recorded, raised again
        # with that traceback each time (as asyncio.Future does), so that
        # repeated awaits do not grow it and keep their frames alive; and, until
        # someone receives it, what logs it if nobody does (_Unretrieved): a
        # tuple (exc, traceback, _Unretrieved | None). See _failure().
        self._waiters: Any = None

    def __repr__(self) -> str:
        state = self._outcome.value if self._outcome is not None else "pending"
        return f"<{type(self).__name__} {state} timeout={self._timeout}>"

    # -- read-only state -----------------------------------------------------------

    @property
    def timeout(self) -> float:
        """Seconds from being watched until expiry."""
        return self._timeout

    @property
    def deadline(self) -> float | None:
        """Loop time (seconds) of expiry once scheduled by a purgatory, else None."""
        when = self._when
        return None if when == NO_DEADLINE else when

    @property
    def keys(self) -> tuple[Hashable, ...]:
        """The keys this operation is (or was) watched under.

        Empty until it joins its watch lists, and for good if its first check
        (in ``try_complete_else_watch``) finished it: it was never watched.
        """
        # ``_keys`` is set before that first check (WatermarkOperation reads it there).
        return self._keys if self._id_key else ()

    @property
    def _joined(self) -> bool:
        """Whether it joined its watch lists (see the module documentation).

        Read off ``_id_key`` rather than kept in a field of its own: one field
        less puts a compiled operation in a smaller allocator size class.
        """
        return self._id_key != 0

    @property
    def is_completed(self) -> bool:
        """True once finished by completion or expiry (Kafka's ``isCompleted``)."""
        outcome = self._outcome
        return outcome is COMPLETED or outcome is EXPIRED

    @property
    def outcome(self) -> Outcome | None:
        """How the operation finished, or None while it has not."""
        return self._outcome

    def _failure(self) -> tuple[Exception, TracebackType | None, Any] | None:
        """The failure recorded (exception, traceback, what logs it unless received),
        else None; None while the op has not finished."""
        return None if self._outcome is None else self._waiters

    # -- asyncio.Future's manners ------------------------------------------------------

    def done(self) -> bool:
        """True once finished in any way (completed, expired, cancelled or failed)."""
        return self._outcome is not None

    def cancelled(self) -> bool:
        """True if finished as ``Outcome.CANCELLED`` (``cancel()``, ``close()``, ...)."""
        return self._outcome is CANCELLED

    def result(self) -> Outcome:
        """The :class:`Outcome`, as ``asyncio.Future.result()`` returns the result.

        A cancelled operation returns ``Outcome.CANCELLED`` (it does not raise
        ``CancelledError``: cancelling an operation is an outcome, not an error).

        Raises:
            asyncio.InvalidStateError: the operation has not finished.
            Exception: the exception a callback of this operation raised.
        """
        if self._outcome is None:
            raise InvalidStateError(f"{self!r} has not finished")
        return self._result()

    def exception(self) -> Exception | None:
        """The exception a callback of this operation raised, else None.

        As ``asyncio.Future.exception()``, except that a cancelled operation
        returns None (cancelling is an outcome, not an error).

        Raises:
            asyncio.InvalidStateError: the operation has not finished.
        """
        if self._outcome is None:
            raise InvalidStateError(f"{self!r} has not finished")
        failure = self._waiters  # finished: the failure, if any
        if failure is None:
            return None
        self._received()
        return failure[0]  # type: ignore[no-any-return]

    def add_done_callback(
        self,
        fn: Callable[[DelayedOperation], object],
        *,
        context: contextvars.Context | None = None,
    ) -> None:
        """Call ``fn(op)`` once the operation finishes, as ``asyncio.Future`` does.

        ``fn`` is scheduled on the running loop (``loop.call_soon``), never called
        inside this call or inside the call that finished the operation; on trio it
        runs soon in the trio run (``TrioToken.run_sync_soon``; an exception from it
        is logged as ``aiopurgatory.done_callback_failed``). If the operation has
        already finished, it is scheduled at once. It runs in ``context`` if given,
        else in a copy of the current context. ``asyncio.wait`` uses this.

        Raises:
            TypeError: ``fn`` is not callable.
            RuntimeError: no running event loop (call it on the operation's loop).
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        schedule = done_callback_scheduler()
        if context is None:
            context = contextvars.copy_context()
        if self._outcome is not None:
            schedule(fn, self, context)
        else:
            self._add_waiter(_DoneCallback(self, fn, context, schedule))

    def remove_done_callback(self, fn: Callable[[DelayedOperation], object]) -> int:
        """Remove every pending ``fn`` added by :meth:`add_done_callback`.

        Returns:
            How many were removed (as ``asyncio.Future.remove_done_callback``).
        """
        return self._forget_waiters(lambda w: type(w) is _DoneCallback and w.fn == fn)

    # -- to override -----------------------------------------------------------------

    def try_complete(self) -> bool:
        """Check the condition; if met, ``return self.force_complete()``. Default: False.

        Called by the purgatory once when the operation is watched (before it
        joins the watch lists), on every ``check_and_complete`` of one of its
        keys, and on every ``advance`` of one of its keys that reaches its
        threshold there (or of any of its keys, for a watch without thresholds).

        Returning a true value without having finished the operation completes
        it, as ``force_complete()`` would: Kafka users write ``return True``.
        """
        return False

    def on_complete(self) -> None:
        """Runs exactly once when the operation completes or expires. Default: no-op."""

    def on_expiration(self) -> None:
        """Runs after :meth:`on_complete`, only when the operation expired. Default: no-op."""

    # -- provided --------------------------------------------------------------------

    def force_complete(self) -> bool:
        """Finish the operation as completed, if nobody finished it first.

        Removes it from the timer and from every watch list, then runs
        :meth:`on_complete`, then wakes awaiters.

        Returns:
            True iff this call finished the operation.
        """
        return self._finish(COMPLETED)

    def cancel(self) -> bool:
        """Withdraw the operation if it has not finished: ``Outcome.CANCELLED``.

        Removes it from the timer and from every watch list; runs no callback;
        awaiters get ``Outcome.CANCELLED``. An operation that was never watched can
        be cancelled too (it can then no longer be watched).

        Returns:
            True iff this call withdrew the operation.
        """
        return self._finish(CANCELLED)

    def __await__(self) -> Generator[Any, None, Outcome]:
        """Wait until the operation finishes; return its :class:`Outcome`.

        Observing only: cancelling the awaiting task does not cancel the operation.

        Raises:
            Exception: the exception a callback of this operation raised.
        """
        if self._outcome is None:
            waiter = new_waiter()  # an asyncio future, or trio's equivalent
            self._add_waiter(waiter)
            try:
                yield from waiter.__await__()
            except BaseException:
                # An observer gave up (wait_for polling, a cancel scope): forget its
                # waiter now rather than when the operation finishes.
                self._forget_waiters(lambda w: w is waiter)
                raise
        return self._result()

    # -- internals ---------------------------------------------------------------------

    def _add_waiter(self, waiter: Any) -> None:
        # Pending only: every caller has checked that the op has not finished.
        waiters = self._waiters
        if waiters is None:
            self._waiters = waiter
        elif type(waiters) is list:
            waiters.append(waiter)
        else:
            self._waiters = [waiters, waiter]

    def _forget_waiters(self, forget: Callable[[Any], bool]) -> int:
        """Forget the waiters ``forget`` says yes to, keeping the others' order; how many.

        None once the op has finished: its waiters are being woken or were (as
        asyncio.Future's callbacks, which are scheduled when it finishes).
        """
        waiters = self._waiters
        if waiters is None or self._outcome is not None:
            return 0
        if type(waiters) is not list:
            waiters = [waiters]
        kept = [waiter for waiter in waiters if not forget(waiter)]
        self._waiters = kept if len(kept) > 1 else kept[0] if kept else None
        return len(waiters) - len(kept)

    def _result(self) -> Outcome:
        failure = self._waiters  # finished: the failure, if any
        if failure is not None:
            self._received()
            raise failure[0].with_traceback(failure[1])
        assert self._outcome is not None
        return self._outcome

    def _finished(self, waiters: Any) -> None:
        """Wake ``waiters`` (what ``_waiters`` held until the op finished) and call
        the recorder."""
        if waiters is not None:
            if type(waiters) is not list:
                _wake(waiters)
            else:
                for waiter in waiters:
                    _wake(waiter)
        purgatory = self._purgatory
        if purgatory is not None and purgatory._recorder is not None:
            purgatory._record(self)

    def _fire(self) -> None:
        # The timer's expiry; the driver has already taken us out of the wheel.
        self._finish(EXPIRED)

    def _finish(
        self, outcome: Outcome, failure: Exception | None = None, raised: bool = False
    ) -> bool:
        """Finish as ``outcome`` unless already finished; True iff this call finished it.

        The one path of every outcome: out of the timer and every watch list (the
        purgatory's ``_detach``), then what the outcome runs: ``on_complete`` for
        COMPLETED and EXPIRED, then ``on_expiration`` for EXPIRED (not after a
        failed ``on_complete``), nothing for CANCELLED, and for FAILED the
        ``failure`` of ``try_complete`` kept (``raised``: the caller raises it on);
        then awaiters and done callbacks are woken and the recorder is called.
        """
        if self._outcome is not None:
            return False
        self._outcome = outcome
        # Taken out before anything runs: from now on the field holds the failure.
        waiters = self._waiters
        self._waiters = None
        purgatory = self._purgatory
        if purgatory is not None:
            purgatory._detach(self, outcome)
        try:
            if outcome is COMPLETED or outcome is EXPIRED:
                try:
                    self.on_complete()
                except Exception as exc:
                    self._callback_failed(exc, "on_complete")
                else:
                    if outcome is EXPIRED:
                        try:
                            self.on_expiration()
                        except Exception as exc:
                            self._callback_failed(exc, "on_expiration")
            elif failure is not None:
                self._callback_failed(failure, "try_complete", raised)
        finally:
            # Most completed operations have no awaiter and no recorder.
            if waiters is not None or (purgatory is not None and purgatory._recorder is not None):
                self._finished(waiters)
        return True

    def _timer_closed(self) -> None:
        self.cancel()

    def _try_complete_failed(self, exc: Exception, raised: bool = False) -> None:
        """``try_complete`` raised: finish as FAILED unless it already finished.

        ``raised``: the caller raises ``exc`` on (``try_complete_else_watch``), so
        someone receives it and it is not logged.
        """
        if not self._finish(FAILED, exc, raised):
            self._callback_failed(exc, "try_complete", raised)

    def _try_complete_raised(self, exc: Exception) -> None:
        """:meth:`_try_complete_failed` for an exception the caller raises on."""
        self._try_complete_failed(exc, True)

    def _received(self) -> None:
        """The failure reached someone: it will not be logged (see _Unretrieved)."""
        failure = self._waiters  # finished: the failure, if any
        if failure is not None and failure[2] is not None:
            failure[2].exc = None
            self._waiters = (failure[0], failure[1], None)

    def _callback_failed(self, exc: Exception, callback: str, raised: bool = False) -> None:
        """Keep the first failure for whoever receives it; log one nobody can.

        ``raised``: the caller raises ``exc`` on (someone receives it).
        """
        if self._waiters is None:  # finished: no failure recorded yet
            unretrieved = None
            if not raised:
                purgatory = self._purgatory
                logger = purgatory._logger if purgatory is not None else _log
                soon = running_call_soon_threadsafe()
                if soon is None:
                    # Outside any event loop nobody can be waiting for it (and no
                    # loop could take the log call later): log it now.
                    _log_failure(logger, callback, repr(self), exc)
                else:
                    unretrieved = _Unretrieved(logger, callback, repr(self), exc, soon)
            self._waiters = (exc, exc.__traceback__, unretrieved)
        elif not raised:
            # A later failure: only the first is kept, so nobody can receive it.
            purgatory = self._purgatory
            logger = purgatory._logger if purgatory is not None else _log
            _log_failure(logger, callback, repr(self), exc)
