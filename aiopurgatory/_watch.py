"""``Purgatory.watch``: a parked request is one small object and asyncio's own future.

``watch(op, keys)`` returns a :class:`_Watch`: the coroutine that ``watch()`` is
specified to return (``send``, ``throw``, ``close``, ``__await__``; so
``asyncio.iscoroutine``, ``create_task``, ``ensure_future``, ``gather`` and
trio's ``start_soon`` take it), lazy (nothing is watched until it is first
awaited or sent to), and "never awaited" warned of. Parked on asyncio or uvloop,
it hands its task the waiter future the core made (an exact
:class:`asyncio.Future`, which asyncio's C task waits on and wakes from on its
fast path), and keeps nothing else: no coroutine frame, no ``keys`` list, no
future iterator (an ``async def watch`` kept all three; ``bench parked``,
issue 54, docs/benchmarks.md). Another library's waiter (a trio task, or an
asyncio task awaiting a purgatory bound to a trio guest run) is awaited through
that waiter's own iterator instead.

Compiled, :class:`_Watch` is a C type whose ``am_send`` (what asyncio's task and
the interpreter's ``await`` call) and ``tp_iternext`` are C functions
(``_watch.pxd``): resuming it returns the outcome without raising
``StopIteration`` at all, and starting it calls the core in C; and
``Purgatory.watch`` is a method descriptor, so that ``purgatory.watch(op, keys)``
makes no bound method. Pure Python, its ``send`` and ``__next__`` do the same
steps.

What the SPEC asks of ``watch`` holds as it did for the ``async def``: the op is
the awaiting task's, so a task cancelled while parked gets ``CancelledError``
(thrown in here when it resumes) and the op is cancelled then; throwing any
exception into it, or closing it while parked, cancels the op too.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Coroutine, Generator, Hashable, Iterable, Mapping
from contextlib import suppress
from types import MethodType as _MethodType
from typing import Any, TypeVar

from ._asyncio_driver import Future
from ._operation import DelayedOperation, Outcome
from ._purgatory_core import _outcome_of, _park

# Purgatory's own (aiopurgatory._purgatory.OpT) would be an import cycle.
OpT = TypeVar("OpT", bound=DelayedOperation)

__all__ = ["watch"]


class _Finished:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<finished>"


# _Watch._state once it returned or raised: also how _step tells its callers
# that what it gives back is the outcome (returned), not something to yield.
_FINISHED: Any = _Finished()


class _Watch:
    """What ``Purgatory.watch(op, keys)`` returns: a coroutine, parked on asyncio's future.

    ``_state`` is ``(purgatory, keys)`` until it starts; then the asyncio future
    its task waits on, or the iterator of another library's waiter it forwards
    to; ``_FINISHED`` once it returned or raised. Two slots: 48 bytes with the
    collector's header, where four would take an allocator size class more.
    """

    __slots__ = ("_op", "_state")

    _op: Any
    _state: Any

    def __init__(self) -> None:  # pragma: no cover - never called by the library
        raise TypeError("_Watch objects are created by Purgatory.watch()")

    def __repr__(self) -> str:
        return f"<Purgatory.watch of {self._op!r}>"

    def __del__(self) -> None:
        if type(self._state) is tuple:
            # As Python warns of a coroutine: nothing was watched.
            warnings.warn(
                "coroutine 'Purgatory.watch' was never awaited", RuntimeWarning, stacklevel=1
            )

    # Compiled, am_send and tp_iternext are C functions that call _step (see
    # _watch.pxd); these are what Python code calls by name.

    def __await__(self) -> Generator[Any, None, Outcome]:
        return self  # type: ignore[return-value]  # an iterator with send/throw/close

    def __next__(self) -> Any:
        return self.send(None)

    def send(self, value: Any) -> Any:
        """Start the watch, or resume it once woken (StopIteration carries the outcome)."""
        got = _step(self, value)
        if self._state is _FINISHED:
            raise StopIteration(got)
        return got

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        """Raise ``typ`` (an exception, or its class) here; if parked, cancel the op first."""
        exc = (typ() if isinstance(typ, type) else typ) if val is None else val
        if tb is not None:
            exc = exc.with_traceback(tb)
        state = self._state
        if type(state) is tuple or state is _FINISHED:
            # Not started (nothing watched) or finished: raised as a coroutine does.
            self._state = _FINISHED
            raise exc
        if type(state) is Future:
            # Cancelled (CancelledError) or abandoned while parked: the caller
            # owns the op, withdraw it.
            self._state = _FINISHED
            self._op.cancel()
            raise exc
        got = _forward(self, None, exc)
        if self._state is _FINISHED:
            raise StopIteration(got)
        return got

    def close(self) -> None:
        """Finish as a coroutine; if parked, cancel the op (as a closed ``async def`` would)."""
        state = self._state
        self._state = _FINISHED
        if type(state) is tuple or state is _FINISHED:
            return
        if type(state) is Future:
            self._op.cancel()
            return
        try:
            state.close()
        finally:
            self._op.cancel()


# Coroutine's ABC finds the four methods by itself; registered to say so.
Coroutine.register(_Watch)


def _new_watch(purgatory: Any, op: Any, keys: Any) -> _Watch:
    """A new :class:`_Watch`, not started."""
    new: _Watch = _Watch.__new__(_Watch)
    new._op = op
    new._state = (purgatory, keys)
    return new


def _step(w: _Watch, value: Any) -> Any:
    """Start or resume ``w``: what to yield, or its outcome once ``w._state`` is ``_FINISHED``."""
    state = w._state
    if type(state) is Future:
        # Woken: its task's future is done, so the op finished (its task takes
        # a cancellation of the future to throw() instead).
        op: DelayedOperation = w._op
        if op._outcome is None:
            raise RuntimeError("await wasn't used with future")
        w._state = _FINISHED
        return _outcome_of(op)  # or the op's failure, raised
    if type(state) is tuple:
        if value is not None:
            raise TypeError("can't send non-None value to a just-started coroutine")
        # The keys are the core's from here on (a parked wait keeps no list), and
        # if _park raises, the coroutine has raised.
        purgatory, keys = state
        w._state = _FINISHED
        waiter = _park(purgatory, w._op, keys)
        if waiter is None:
            return _outcome_of(w._op)  # finished by its first check
        if type(waiter) is Future:
            # Yielded to the task as Future.__await__ would: the task parks on it.
            waiter._asyncio_future_blocking = True
            w._state = waiter
            return waiter
        # Another library's waiter: forward to its iterator.
        w._state = waiter.__await__()
        return _forward(w, None, None)
    if state is _FINISHED:
        raise RuntimeError("cannot reuse already awaited coroutine")
    return _forward(w, value, None)


def _forward(w: _Watch, value: Any, exc: BaseException | None) -> Any:
    """Send ``value`` (or throw ``exc``) into the waiter's iterator ``w._state``."""
    inner = w._state
    try:
        if exc is None:
            return inner.send(value)
        return inner.throw(exc)
    except StopIteration:
        pass
    except BaseException:
        # Cancelled (trio's Cancelled, an anyio cancel scope) or abandoned.
        w._state = _FINISHED
        w._op.cancel()
        raise
    w._state = _FINISHED
    return _outcome_of(w._op)


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
    the documentation see the coroutine function the SPEC names; a descriptor,
    so that ``purgatory.watch`` is bound as a function is.
    """

    __slots__ = ("__dict__",)  # compiled, a C type with an instance dict

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

    def __get__(self, instance: Any, owner: Any) -> Any:
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

# Compiled: _Watch's am_send and tp_iternext become C functions (_watch.pxd).
# The pure-Python core has no _fast_slots: Python's own slots call send().
with suppress(NameError):
    _fast_slots()  # type: ignore[name-defined]  # noqa: F821
