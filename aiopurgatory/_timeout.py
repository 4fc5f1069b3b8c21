"""``Timeout``: ``asyncio.timeout()`` on a :class:`~aiopurgatory.Timer`.

The context manager needs only ``call_at(when, callback)`` from its timer, so it
depends on nothing else of the timer (:mod:`aiopurgatory._timer` makes it, from
``Timer.timeout()``, ``ap.timeout()`` and ``ap.timeout_at()``).

On asyncio the deadline cancels the enclosing task, as ``asyncio.timeout`` does.
On trio the block runs in a cancel scope that the deadline cancels (trio's
deadlines are per scope, not per task); leaving the block then raises the same
``TimeoutError``, as anyio's ``fail_after`` does on every backend.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from ._backends import current_backend, current_time
from ._errors import as_seconds

__all__ = ["Timeout"]


class _Cancellable(Protocol):
    def cancel(self) -> None: ...


class _Scheduler(Protocol):
    def call_at(self, when: float, callback: Callable[[], object], /) -> _Cancellable: ...


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
    ``TimeoutError`` (chained from the ``CancelledError``). On trio the block's
    cancel scope is cancelled instead, and leaving it raises the same
    ``TimeoutError`` (chained from trio's ``Cancelled``).
    """

    __slots__ = ("_cancelling", "_handle", "_scope", "_state", "_task", "_timer", "_when")

    def __init__(self, timer: _Scheduler, when: float | None) -> None:
        self._timer = timer
        self._when = when
        self._handle: _Cancellable | None = None
        self._state = _State.CREATED
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._scope: Any = None  # trio: the cancel scope around the block

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
            # Through the timer also when already due: it refuses a closed timer
            # or one bound to another loop, before anything changes.
            handle = self._timer.call_at(when, self._on_timeout)
            if when <= current_time():
                # Already due (a zero or negative delay): interrupt the block at
                # its first suspension, as asyncio.timeout does, not a tick later.
                handle.cancel()
                if self._scope is not None:
                    self._on_timeout()  # trio: a cancelled scope raises at its next checkpoint
                    return
                assert self._task is not None
                handle = self._task.get_loop().call_soon(self._on_timeout)
            self._handle = handle

    async def __aenter__(self) -> Timeout:
        if self._state is not _State.CREATED:
            raise RuntimeError("Timeout has already been entered")
        scope = None
        if current_backend() == "trio":
            import trio

            scope = trio.CancelScope()
        else:
            task = asyncio.current_task()
            if task is None:
                raise RuntimeError("Timeout should be used inside a task")
            self._task = task
            self._cancelling = task.cancelling()
        self._scope = scope
        self._state = _State.ENTERED
        try:
            self.reschedule(self._when)
        except BaseException:  # a closed timer, one bound elsewhere: not entered
            self._state = _State.CREATED
            self._scope = self._task = None
            raise
        if scope is not None:
            # After scheduling, which may fail; the deadline's callback cannot run
            # before this (never inside the scheduling call).
            scope.__enter__()
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
        scope = self._scope
        if scope is not None:
            self._scope = None
            scope.__exit__(exc_type, exc_val, exc_tb)
            if self._state is _State.EXPIRING:
                self._state = _State.EXPIRED
                # Only if the deadline's Cancelled reached the scope (a block that
                # caught it and left normally gets no TimeoutError, as asyncio.timeout).
                if scope.cancelled_caught:
                    raise TimeoutError from exc_val
            elif self._state is _State.ENTERED:
                self._state = _State.EXITED
            return
        if self._state is _State.EXPIRING:
            self._state = _State.EXPIRED
            task = self._task
            assert task is not None
            if task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc_val
        elif self._state is _State.ENTERED:
            self._state = _State.EXITED

    def _on_timeout(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
        else:
            assert self._task is not None
            self._task.cancel()
        self._state = _State.EXPIRING
        self._handle = None
