"""The driver of the running async library, and what the core asks of it.

The core is the same on every backend; what differs is gathered in a *driver*
(:mod:`aiopurgatory._asyncio_driver`, :mod:`aiopurgatory._trio_driver`): the
clock, the wake-ups, the waiters that ``watch()`` and ``await op`` park on, the
cancel scope of a ``Timeout`` and the way in from other threads. This module
only dispatches: it asks :mod:`aiopurgatory._detect` which library is running
and hands the question to that library's driver class. It holds no backend
code; the trio driver is imported only once a trio run asks for something.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from ._asyncio_driver import AsyncioDriver
from ._detect import current_backend

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "DeadlineScope",
    "Driver",
    "current_owner",
    "current_time",
    "deadline_scope",
    "done_callback_scheduler",
    "new_driver",
    "new_waiter",
    "running_call_soon_threadsafe",
]


class Cancellable(Protocol):
    def cancel(self) -> object: ...


class DeadlineScope(Protocol):
    """The backend's part of a :class:`~aiopurgatory.Timeout`: the block it may interrupt.

    Made by ``Driver.deadline_scope()`` in the task that enters the block; see
    :mod:`aiopurgatory._asyncio_driver` for the meaning of each member.
    """

    def time(self) -> float: ...
    def enter(self) -> None: ...
    def cancel(self) -> None: ...
    def run_due(self, callback: Callable[[], None], /) -> Cancellable | None: ...
    def exit(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool: ...


class Driver(Protocol):
    """What a :class:`~aiopurgatory.Timer` and a purgatory need of a backend.

    See :mod:`aiopurgatory._asyncio_driver` for the meaning of each member. The
    static methods work on the running loop (or trio run) without a driver.
    """

    def __init__(self, on_wake: Callable[[], None], on_flush: Callable[[], None]) -> None: ...

    @property
    def backend(self) -> str:
        """``"asyncio"`` or ``"trio"``."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The asyncio loop, or None on trio."""

    @property
    def owner(self) -> object:
        """What the timer is bound to: the asyncio loop, or the trio run's token."""

    @property
    def time(self) -> Callable[[], float]:
        """The backend's clock, in seconds."""

    def arm(self, when: float) -> None: ...
    def disarm(self) -> None: ...
    def request_flush(self) -> None: ...
    def close(self) -> None: ...
    def report(self, exc: BaseException, entry: object) -> None: ...
    def is_current(self) -> bool: ...
    def call_soon_threadsafe(self, fn: Callable[[], object], /) -> object: ...
    def waiter(self) -> Any: ...

    @property
    def running_here(self) -> tuple[int, Callable[[], bool]] | None:
        """``(thread, is_running)``: on the loop if in ``thread`` and ``is_running()``."""

    @staticmethod
    def running_owner() -> object: ...
    @staticmethod
    def running_time() -> float: ...
    @staticmethod
    def new_waiter() -> Any: ...
    @staticmethod
    def deadline_scope() -> DeadlineScope: ...
    @staticmethod
    def running_call_soon_threadsafe() -> Callable[..., object]: ...
    @staticmethod
    def done_callback_scheduler() -> Callable[[Callable[[Any], object], Any, Any], object]: ...


def _driver_type() -> type[Driver]:
    """The driver class of the running backend.

    Raises:
        RuntimeError: neither an asyncio loop nor a trio run is active.
    """
    backend = current_backend()
    if backend == "asyncio":
        return AsyncioDriver
    if backend == "trio":
        from ._trio_driver import TrioDriver

        return TrioDriver
    raise RuntimeError("no running event loop (asyncio, uvloop or trio)")


def new_driver(on_wake: Callable[[], None], on_flush: Callable[[], None]) -> Driver:
    """A driver for the running backend (see :mod:`aiopurgatory._asyncio_driver`).

    Raises:
        RuntimeError: neither an asyncio loop nor a trio run is active.
    """
    return _driver_type()(on_wake, on_flush)


def current_owner() -> object:
    """The running asyncio loop, or the running trio run's ``TrioToken``.

    Raises:
        RuntimeError: no running event loop.
    """
    return _driver_type().running_owner()


def current_time() -> float:
    """The running backend's clock: ``loop.time()`` or ``trio.current_time()``.

    Raises:
        RuntimeError: no running event loop.
    """
    return _driver_type().running_time()


def new_waiter() -> Any:
    """Something to park the current task on until ``set_result(None)``.

    An asyncio future on asyncio; on trio, an equivalent with ``done()``,
    ``set_result()`` and ``await``. The one source of waiters: ``watch()`` and
    ``await op`` both come here.

    Raises:
        RuntimeError: no running event loop.
    """
    return _driver_type().new_waiter()


def deadline_scope() -> DeadlineScope:
    """The running backend's cancel scope for a ``Timeout`` block, in the current task.

    Raises:
        RuntimeError: no running event loop, or (asyncio) not inside a task.
    """
    return _driver_type().deadline_scope()


def done_callback_scheduler() -> Callable[[Callable[[Any], object], Any, Any], object]:
    """``schedule(fn, op, context)``: run ``fn(op)`` in ``context`` soon, on the running loop.

    On asyncio ``loop.call_soon`` (an exception goes to the loop's exception
    handler); on trio ``TrioToken.run_sync_soon`` (an exception is logged). Never
    inside the calling code.

    Raises:
        RuntimeError: no running event loop.
    """
    return _driver_type().done_callback_scheduler()


def running_call_soon_threadsafe() -> Callable[..., object] | None:
    """``fn(*args)`` soon on the running loop, callable from any thread; None outside one.

    ``loop.call_soon_threadsafe`` on asyncio, ``TrioToken.run_sync_soon`` on trio;
    either raises ``RuntimeError`` once the loop is closed or the run has finished.
    """
    try:
        return _driver_type().running_call_soon_threadsafe()
    except RuntimeError:
        return None
