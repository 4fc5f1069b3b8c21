"""``Timeout``: ``asyncio.timeout()`` on a :class:`~aiopurgatory.Timer`.

The context manager needs only ``call_at(when, callback)`` from its timer, so it
depends on nothing else of the timer (:mod:`aiopurgatory._timer` makes it, from
``Timer.timeout()``, ``ap.timeout()`` and ``ap.timeout_at()``). What the deadline
interrupts is the backend's business: the running driver's *deadline scope*
(``deadline_scope()``, see :mod:`aiopurgatory._asyncio_driver`) opens it and
cancels it. On asyncio that is the enclosing task, as with ``asyncio.timeout``;
on trio a cancel scope around the block. Either way leaving the block after the
deadline raises ``TimeoutError``, as anyio's ``fail_after`` does on every backend.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from ._backends import Cancellable, DeadlineScope, deadline_scope
from ._validation import as_seconds

__all__ = ["Timeout"]


class _Scheduler(Protocol):
    def call_at(self, when: float, callback: Callable[[], object], /) -> Cancellable: ...


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

    __slots__ = ("_handle", "_scope", "_state", "_timer", "_when")

    def __init__(self, timer: _Scheduler, when: float | None) -> None:
        self._timer = timer
        self._when = when
        self._handle: Cancellable | None = None
        self._state = _State.CREATED
        # The backend's scope around the block (its driver's), while entered.
        self._scope: DeadlineScope | None = None

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
            scope = self._scope
            assert scope is not None
            # Through the timer also when already due: it refuses a closed timer
            # or one bound to another loop, before anything changes.
            handle = self._timer.call_at(when, self._on_timeout)
            if when <= scope.time():
                # Already due (a zero or negative delay): interrupt the block at
                # its first suspension, as asyncio.timeout does, not a tick later.
                handle.cancel()
                self._handle = scope.run_due(self._on_timeout)
            else:
                self._handle = handle

    async def __aenter__(self) -> Timeout:
        if self._state is not _State.CREATED:
            raise RuntimeError("Timeout has already been entered")
        scope = self._scope = deadline_scope()
        self._state = _State.ENTERED
        try:
            self.reschedule(self._when)
        except BaseException:  # a closed timer, one bound elsewhere: not entered
            self._state = _State.CREATED
            self._scope = None
            raise
        # After scheduling, which may fail; the deadline's callback cannot run
        # before this (never inside the scheduling call).
        scope.enter()
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
        assert scope is not None
        self._scope = None
        timed_out = scope.exit(exc_type, exc_val, exc_tb)
        if self._state is _State.EXPIRING:
            self._state = _State.EXPIRED
            # Only if the deadline's cancellation ended the block (a block that
            # caught it and left normally gets no TimeoutError, as asyncio.timeout).
            if timed_out:
                raise TimeoutError from exc_val
        elif self._state is _State.ENTERED:
            self._state = _State.EXITED

    def _on_timeout(self) -> None:
        scope = self._scope
        if scope is None:  # pragma: no cover - the handle is cancelled on the way out
            return
        self._state = _State.EXPIRING
        self._handle = None
        scope.cancel()
