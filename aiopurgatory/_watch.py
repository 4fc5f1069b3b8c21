"""``Purgatory.watch``: a parked request is one small future, not a coroutine and a future.

``watch(op, keys)`` returns a :class:`_Watch`, which is two things at once:

* the coroutine ``watch()`` is specified to return: ``send``, ``throw``,
  ``close`` and ``__await__`` (so ``asyncio.iscoroutine``, ``create_task``,
  ``ensure_future``, ``gather`` and trio's ``start_soon`` take it), lazy (nothing
  is watched until it is first awaited or sent to), and "never awaited" warned of;
* on asyncio and uvloop, the future its task waits on: an :class:`asyncio.Future`
  (a subclass with two slots), which the operation sets when it finishes.

A native ``async def watch`` costs a parked request its coroutine (with its frame
and the ``keys`` list it was given), an :class:`asyncio.Future` and the future's
iterator: four GC-tracked objects, where this is one, about 240 bytes less
(``bench parked``, issue 54, docs/benchmarks.md). It is an asyncio future rather
than a smaller object that quacks like one because anyio's cancel scopes spare a
task whose ``_fut_waiter`` is a done ``asyncio.Future`` (the op finished: the task
gets its outcome), and ask nothing of other waiters.

What the SPEC asks of ``watch`` holds, as it did for the ``async def``: the op is
the awaiting task's, so a task cancelled while parked gets ``CancelledError``
(thrown in here when it resumes) and the op is cancelled then; throwing any
exception into it, or closing it while parked, cancels the op too. Another task
library's waiter (a trio task, or an asyncio task awaiting a purgatory bound to a
trio guest run) is awaited through that waiter's own iterator instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Coroutine, Generator, Hashable, Iterable, Mapping
from types import MethodType as _MethodType
from typing import Any, TypeVar

from ._asyncio_driver import Future
from ._operation import DelayedOperation, Outcome
from ._purgatory_core import _outcome, _park

# Purgatory's own (aiopurgatory._purgatory.OpT) would be an import cycle.
OpT = TypeVar("OpT", bound=DelayedOperation)

__all__ = ["watch"]

_future_init = Future.__init__
# asyncio.Future's own attribute, which _Watch hides until it is its task's future.
_blocking: Any = Future.__dict__["_asyncio_future_blocking"]


class _Finished:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<finished>"


# _Watch._pending once it returned or raised without having been a task's future.
_FINISHED: Any = _Finished()


class _Watch(Future):  # type: ignore[type-arg]
    """What ``Purgatory.watch(op, keys)`` returns: a coroutine, and on asyncio its task's future.

    Its stage is read off its two slots: ``_pending`` holds ``(purgatory, keys)``
    until it starts, then None while it is its task's future (an initialised
    asyncio future from then on), or the iterator of another library's waiter it
    forwards to, or ``_FINISHED``; ``_op`` is None once it returned or raised.
    """

    __slots__ = ("_op", "_pending")

    _op: Any
    _pending: Any

    def __init__(self) -> None:  # pragma: no cover - never called by the library
        raise TypeError("_Watch objects are created by Purgatory.watch()")

    def __repr__(self) -> str:
        return f"<Purgatory.watch of {self._op!r}>"

    def __del__(self) -> None:
        if type(self._pending) is tuple:
            # As Python warns of a coroutine: nothing was watched.
            warnings.warn(
                "coroutine 'Purgatory.watch' was never awaited", RuntimeWarning, stacklevel=1
            )

    # -- the coroutine -------------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, Outcome]:
        return self

    def __next__(self) -> Any:
        return self.send(None)

    def send(self, value: Any) -> Any:
        """Start the watch, or resume it once woken (StopIteration carries the outcome)."""
        pending = self._pending
        if pending is None:
            op = self._op
            if op is None:
                raise RuntimeError("cannot reuse already awaited coroutine")
            if not self.done():
                raise RuntimeError("await wasn't used with future")
            self._op = None
            try:
                self.result()  # CancelledError if its task was cancelled
            except BaseException:
                op.cancel()
                raise
            raise StopIteration(_outcome(op))  # or the op's failure, raised
        if type(pending) is tuple:
            return self._start(pending)
        if pending is _FINISHED:
            raise RuntimeError("cannot reuse already awaited coroutine")
        return self._forward(value, None)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        """Raise ``typ`` (an exception, or its class) here; if parked, cancel the op first."""
        exc = (typ() if isinstance(typ, type) else typ) if val is None else val
        if tb is not None:
            exc = exc.with_traceback(tb)
        pending = self._pending
        if pending is not None and type(pending) is not tuple and pending is not _FINISHED:
            return self._forward(None, exc)
        op = self._op
        self._op = None
        if pending is None:
            if op is not None:
                # Cancelled (CancelledError) or abandoned while parked: the caller
                # owns the op, withdraw it.
                op.cancel()
        else:
            self._pending = _FINISHED
        raise exc

    def close(self) -> None:
        """Finish as a coroutine; if parked, cancel the op (as a closed ``async def`` would)."""
        pending = self._pending
        op = self._op
        self._op = None
        if pending is None:
            if op is not None:
                op.cancel()
            return
        self._pending = _FINISHED
        if type(pending) is tuple or pending is _FINISHED:
            return
        try:
            pending.close()
        finally:
            op.cancel()

    def _start(self, pending: tuple[Any, Any]) -> Any:
        purgatory, keys = pending
        op = self._op
        self._pending = _FINISHED  # if _park raises, the coroutine has raised
        waiter = _park(purgatory, op, keys, self)
        if waiter is None:
            self._op = None
            raise StopIteration(_outcome(op))
        if waiter is self:
            # Its task's future, on the loop the purgatory is bound to.
            _future_init(self, loop=purgatory._owner)
            self._pending = None
            _blocking.__set__(self, True)
            return self
        # Another library's waiter: forward to its iterator.
        self._pending = waiter.__await__()
        return self._forward(None, None)

    def _forward(self, value: Any, exc: BaseException | None) -> Any:
        """Send ``value`` (or throw ``exc``) into the waiter's iterator."""
        inner = self._pending
        op = self._op
        try:
            if exc is None:
                return inner.send(value)
            return inner.throw(exc)
        except StopIteration:
            pass
        except BaseException:
            # Cancelled (trio's Cancelled, an anyio cancel scope) or abandoned.
            self._pending = _FINISHED
            self._op = None
            op.cancel()
            raise
        self._pending = _FINISHED
        self._op = None
        raise StopIteration(_outcome(op))

    # -- the future ------------------------------------------------------------------------

    @property
    def _asyncio_future_blocking(self) -> Any:
        # None until it is its task's future: asyncio.isfuture() is then False,
        # so ensure_future() and gather() wrap it in a task, as a coroutine.
        if self._pending is not None:
            return None
        return _blocking.__get__(self)

    @_asyncio_future_blocking.setter
    def _asyncio_future_blocking(self, value: bool) -> None:
        _blocking.__set__(self, value)


# Coroutine's ABC finds the four methods by itself; registered to say so.
Coroutine.register(_Watch)


def _new_watch(purgatory: Any, op: Any, keys: Any) -> _Watch:
    """A new :class:`_Watch`, not started (an asyncio future initialised only when parked)."""
    new: _Watch = Future.__new__(_Watch)
    new._op = op
    new._pending = (purgatory, keys)
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
