"""``Purgatory.watch``: a parked request is one small object, not a coroutine and a future.

``watch(op, keys)`` returns a :class:`_Watch`, which is two things at once:

* the coroutine ``watch()`` is specified to return: ``send``, ``throw``,
  ``close`` and ``__await__`` (so ``asyncio.iscoroutine``, ``create_task``,
  ``ensure_future``, ``gather`` and trio's ``start_soon`` take it), lazy (nothing
  is watched until it is first awaited or sent to), and "never awaited" warned of;
* on asyncio and uvloop, the future its task waits on: asyncio's ``Task`` accepts
  any object with ``_asyncio_future_blocking``, ``get_loop()``,
  ``add_done_callback()``, ``cancel()`` and ``result()``, and parks on it as it
  would on a :class:`asyncio.Future`.

A native ``async def watch`` costs a parked request its coroutine (with its frame
and the ``keys`` it was given), an :class:`asyncio.Future` and the future's
iterator: four GC-tracked objects and about 400 bytes, where this is one object
of 80 bytes (``bench parked``, issue 54, docs/benchmarks.md). Compiled, it is a C
type (``_watch.pxd``); its logic is the same on both cores.

What the SPEC asks of ``watch`` holds: the op is the awaiting task's, so
cancelling the task cancels the op (here at once, inside ``task.cancel()``,
rather than when the task next runs), and the ``CancelledError`` propagates;
throwing any exception into it, or closing it while parked, cancels the op too.
Another task library's waiter (a trio task, or an asyncio task awaiting a
purgatory bound to a trio guest run) is awaited through that waiter's own
iterator instead.
"""

from __future__ import annotations

import contextvars
import warnings
from types import MethodType as _MethodType
from asyncio import CancelledError, InvalidStateError
from collections.abc import Callable, Coroutine, Generator, Hashable, Iterable, Mapping
from typing import Any, TypeVar

from ._operation import DelayedOperation, Outcome
from ._purgatory_core import _outcome, _park

# Purgatory's own (aiopurgatory._purgatory.OpT) would be an import cycle.
OpT = TypeVar("OpT", bound=DelayedOperation)

__all__ = ["watch"]

_copy_context = contextvars.copy_context

# The states of a _Watch (C ints compiled). Before it is first sent to:
_NEW = 0
# Parked on the asyncio loop, its task's future: just yielded to the task (which
# reads _asyncio_future_blocking as True, then sets it False: _WAITING).
_YIELDED = 1
_WAITING = 2
# The op finished: the task's wake-up is scheduled; its next send returns the outcome.
_WOKEN = 3
# Its task cancelled it (the op is cancelled): result() and send raise CancelledError.
_CANCELLED = 4
# Parked on another library's waiter, whose iterator it forwards to (_callback).
_FORWARDING = 5
# Returned or raised: finished as a coroutine.
_DONE = 6


class _Watch:
    """What ``Purgatory.watch(op, keys)`` returns: a coroutine, and on asyncio its task's future.

    Only asyncio's Task and the purgatory use its future's side; see the module's
    documentation.
    """

    __slots__ = ("_callback", "_context", "_keys", "_op", "_purgatory", "_state")

    _purgatory: Any
    _op: DelayedOperation
    # The keys until it starts; then the message of its task's cancel(), if any.
    _keys: Any
    # The task's wake-up and its context (asyncio), or a list of (callback,
    # context) if more than one was added; when forwarding, the waiter's iterator.
    _callback: Any
    _context: Any
    _state: int

    def __init__(self) -> None:
        raise TypeError("_Watch objects are created by Purgatory.watch()")

    def __repr__(self) -> str:
        return f"<Purgatory.watch of {self._op!r}>"

    def __del__(self) -> None:
        if self._state == _NEW:
            # As Python warns of a coroutine: nothing was watched.
            warnings.warn(
                "coroutine 'Purgatory.watch' was never awaited", RuntimeWarning, stacklevel=1
            )

    # -- the coroutine -------------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, Outcome]:
        return self  # type: ignore[return-value]

    def __next__(self) -> Any:
        return self.send(None)

    def send(self, value: Any) -> Any:
        """Start the watch, or resume it once its task is woken (StopIteration: the outcome)."""
        state = self._state
        if state == _NEW:
            return self._start()
        if state == _WOKEN:
            self._state = _DONE
            raise StopIteration(_outcome(self._op))  # or the op's failure, raised
        if state == _FORWARDING:
            return self._forward(value, None)
        if state == _CANCELLED:
            self._state = _DONE
            raise self._cancelled_error()
        if state == _DONE:
            raise RuntimeError("cannot reuse already awaited coroutine")
        # Parked, not woken: sent to by something other than its task.
        raise RuntimeError("await wasn't used with future")

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        """Raise ``typ`` (an exception, or its class) here; if parked, cancel the op first."""
        if val is None:
            exc = typ() if isinstance(typ, type) else typ
        else:
            exc = val
        if tb is not None:
            exc = exc.with_traceback(tb)
        state = self._state
        if state == _FORWARDING:
            return self._forward(None, exc)
        self._state = _DONE
        if state != _NEW and state != _DONE:
            # The awaiting task gave up: the caller owns the op, withdraw it. The
            # task's wake-up is dropped first: the op's end must not schedule it.
            self._callback = self._context = None
            op = self._op
            op.cancel()
        raise exc

    def close(self) -> None:
        """Finish as a coroutine; if parked, cancel the op (as a closed ``async def`` would)."""
        state = self._state
        self._state = _DONE
        if state == _NEW or state == _DONE:
            return
        inner = self._callback
        self._callback = self._context = None
        op = self._op
        try:
            if state == _FORWARDING:
                inner.close()
        finally:
            op.cancel()

    def _start(self) -> Any:
        op = self._op
        keys = self._keys
        self._keys = None
        self._state = _DONE  # if _park raises, the coroutine has raised
        waiter = _park(self._purgatory, op, keys, self)
        if waiter is None:
            raise StopIteration(_outcome(op))
        if waiter is self:
            self._state = _YIELDED
            return self
        # Another library's waiter: forward to its iterator.
        self._callback = waiter.__await__()
        self._state = _FORWARDING
        return self._forward(None, None)

    def _forward(self, value: Any, exc: BaseException | None) -> Any:
        """Send ``value`` (or throw ``exc``) into the waiter's iterator."""
        inner = self._callback
        try:
            if exc is None:
                return inner.send(value)
            return inner.throw(exc)
        except StopIteration:
            pass
        except BaseException:
            # Cancelled (trio's Cancelled, an anyio cancel scope) or abandoned.
            self._state = _DONE
            self._callback = None
            self._op.cancel()
            raise
        self._state = _DONE
        self._callback = None
        raise StopIteration(_outcome(self._op))

    # -- the future of its asyncio task --------------------------------------------------

    @property
    def _asyncio_future_blocking(self) -> bool | None:
        # None while it is not a future (asyncio.isfuture() is then False, so
        # ensure_future() and gather() wrap it in a task); True just yielded.
        state = self._state
        if state == _YIELDED:
            return True
        if state == _WAITING or state == _WOKEN or state == _CANCELLED:
            return False
        return None

    @_asyncio_future_blocking.setter
    def _asyncio_future_blocking(self, value: bool) -> None:
        if value:
            if self._state == _WAITING:
                self._state = _YIELDED
        elif self._state == _YIELDED:
            self._state = _WAITING

    def get_loop(self) -> Any:
        """The loop of its purgatory (asyncio's Task checks it is its own)."""
        return self._purgatory._owner

    def add_done_callback(
        self, fn: Callable[[Any], object], *, context: contextvars.Context | None = None
    ) -> None:
        """Call ``fn(self)`` soon once the op finishes (or its task cancels it)."""
        if context is None:
            context = _copy_context()
        state = self._state
        if state == _WOKEN or state == _CANCELLED or state == _DONE:
            self.get_loop().call_soon(fn, self, context=context)
            return
        callback = self._callback
        if callback is None:
            self._callback = fn
            self._context = context
        elif type(callback) is list:
            callback.append((fn, context))
        else:
            self._callback = [(callback, self._context), (fn, context)]
            self._context = None

    def remove_done_callback(self, fn: Callable[[Any], object]) -> int:
        """Forget every ``fn`` added and not yet scheduled; how many."""
        callback = self._callback
        if callback is None or self._state == _FORWARDING:
            return 0
        if type(callback) is not list:
            if callback != fn:
                return 0
            self._callback = self._context = None
            return 1
        kept = [pair for pair in callback if pair[0] != fn]
        removed = len(callback) - len(kept)
        if not kept:
            self._callback = None
        elif len(kept) == 1:
            self._callback, self._context = kept[0]
        else:
            self._callback = kept
        return removed

    def done(self) -> bool:
        """True once the op finished (or its task cancelled it)."""
        state = self._state
        return state == _WOKEN or state == _CANCELLED or state == _DONE

    def cancelled(self) -> bool:
        """True once its task cancelled it."""
        return self._state == _CANCELLED

    def cancel(self, msg: Any = None) -> bool:
        """Its task is cancelled: cancel the op and wake the task (which gets CancelledError).

        Returns:
            True iff it was parked and the op pending (False: the task is woken already).
        """
        state = self._state
        if state != _WAITING and state != _YIELDED:
            return False
        op = self._op
        if op._outcome is not None:
            return False
        self._state = _CANCELLED
        self._keys = msg
        op.cancel()  # wakes it: set_result() schedules the task's wake-up
        self._schedule()  # (in case the op's end could not)
        return True

    def result(self) -> None:
        """None once woken; CancelledError if its task cancelled it.

        Raises:
            CancelledError: its task cancelled it.
            asyncio.InvalidStateError: not woken yet.
        """
        state = self._state
        if state == _CANCELLED:
            raise self._cancelled_error()
        if state != _WOKEN and state != _DONE:
            raise InvalidStateError("Result is not ready.")

    def set_result(self, _result: None) -> None:
        """The op finished (it calls this as it would an asyncio future's): wake the task."""
        state = self._state
        if state == _WAITING or state == _YIELDED:
            self._state = _WOKEN
            self._schedule()
        elif state == _CANCELLED:
            self._schedule()

    def _schedule(self) -> None:
        """Schedule the callbacks added (the task's wake-up), once."""
        callback = self._callback
        if callback is None:
            return
        context = self._context
        self._callback = self._context = None
        call_soon = self.get_loop().call_soon
        if type(callback) is list:
            for fn, ctx in callback:
                call_soon(fn, self, context=ctx)
        else:
            call_soon(callback, self, context=context)

    def _cancelled_error(self) -> CancelledError:
        message = self._keys
        return CancelledError() if message is None else CancelledError(message)


# Coroutine's ABC finds the four methods by itself; registered to say so.
Coroutine.register(_Watch)


def _new_watch(purgatory: Any, op: Any, keys: Any) -> _Watch:
    """A new :class:`_Watch` (compiled: no call of ``__init__``)."""
    new = _Watch.__new__(_Watch)
    new._purgatory = purgatory
    new._op = op
    new._keys = keys
    new._callback = None
    new._context = None
    new._state = _NEW
    return new


async def _watch_signature(
    self: Any, op: OpT, keys: Iterable[Hashable] | Mapping[Hashable, float]
) -> Outcome:
    """:meth:`try_complete_else_watch`, then wait until ``op`` finishes.

    ``keys`` is a list (or other iterable but a tuple) of keys, or a Mapping
    of keys to thresholds (see :meth:`advance`). Nothing is watched until the
    coroutine is awaited (or run as a task).

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
    return await _new_watch(self, op, keys)  # what watch() returns, awaited


class _WatchFunction:
    """``Purgatory.watch``: a coroutine function that returns a :class:`_Watch`.

    Function-like (``__code__``, ``__name__``, ``__wrapped__``... of the ``async
    def`` it stands for), so that ``inspect.iscoroutinefunction``, signatures and
    the documentation see the coroutine function the SPEC names; a method
    descriptor, so that ``purgatory.watch`` is bound as a function is.
    """

    def __init__(self, template: Callable[..., Any]) -> None:
        self.__wrapped__ = template
        self.__code__ = template.__code__
        self.__name__ = "watch"
        self.__qualname__ = "Purgatory.watch"
        self.__module__ = template.__module__
        self.__doc__ = template.__doc__
        self.__annotations__ = template.__annotations__
        self.__defaults__ = None
        self.__kwdefaults__ = None

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return _MethodType(self, instance)

    def __call__(self, purgatory: Any, op: Any, keys: Any) -> _Watch:
        if purgatory is None:
            raise TypeError("watch() is a method of a Purgatory")
        return _new_watch(purgatory, op, keys)

    def __repr__(self) -> str:
        return "<function Purgatory.watch>"


#: ``Purgatory.watch`` (a class attribute of :class:`~aiopurgatory.Purgatory`).
watch = _WatchFunction(_watch_signature)
