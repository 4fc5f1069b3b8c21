"""The driver of the running async library, and what the core asks of it.

The core is the same on every backend; what differs is gathered in a *driver*
(:mod:`aiopurgatory._asyncio_driver`, :mod:`aiopurgatory._trio_driver`): the
clock, the wake-ups, the waiters that ``watch()`` and ``await op`` park on, the
cancel scope of a ``Timeout`` and the way in from other threads. The contract is
declared here, member by member: :class:`Driver` (one per timer, made when the
timer binds), :class:`RunningLoop` (static questions about the running loop, no
timer needed) and :class:`DeadlineScope` (a ``Timeout``'s block); a driver class
is both (:class:`DriverClass`). This module otherwise only dispatches: it asks
:mod:`aiopurgatory._detect` which library is running and hands the question to
that library's driver class. It holds no backend code; the trio driver is
imported only once a trio run asks for something.
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
    "DriverClass",
    "RunningLoop",
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

    Made by :meth:`RunningLoop.deadline_scope` in the task that enters the block,
    and used by that ``Timeout`` only, on the loop's thread.
    """

    def time(self) -> float:
        """The clock the deadline is on (the loop's), in seconds."""

    def enter(self) -> None:
        """The block starts (``Timeout.__aenter__``), in the task that runs it."""

    def cancel(self) -> None:
        """Interrupt the block: called from a timer callback at the deadline."""

    def run_due(self, callback: Callable[[], None], /) -> Cancellable | None:
        """Run ``callback`` (the deadline's, already due when set) as soon as the
        block can be interrupted; what is returned cancels that."""

    def exit(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool:
        """The block ends (``Timeout.__aexit__``): True iff it ended because of
        :meth:`cancel` (the ``Timeout`` then raises ``TimeoutError``)."""


class Driver(Protocol):
    """One timer's link to its event loop: the clock and the wake-ups (one per Timer).

    A :class:`~aiopurgatory.Timer` makes its driver when it binds, on first use,
    in a task of the running loop (``new_driver``), and is its only caller (a
    purgatory asks through its timer). Everything below is called on the loop's
    thread, by the loop's own code (a task or a callback), unless it says
    otherwise; nothing here is thread-safe but :meth:`call_soon_threadsafe`. A
    driver may assume the loop it was made on runs until the timer is closed or
    the loop is; it holds no entries and knows nothing of the wheel.
    """

    def __init__(self, on_wake: Callable[[], None], on_flush: Callable[[], None]) -> None:
        """Bind to the running loop; ``on_wake`` is the timer's wake-up (from
        :meth:`arm`), ``on_flush`` its per-iteration flush (from :meth:`request_flush`).

        Raises:
            RuntimeError: no running loop of this backend.
        """

    @property
    def backend(self) -> str:
        """``"asyncio"`` (uvloop included) or ``"trio"``: ``Timer.backend``, and how
        ``watch()`` tells a trio task in guest mode from its asyncio host."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The asyncio loop (``Timer.loop``), or None on trio."""

    @property
    def owner(self) -> object:
        """What the timer is bound to, for identity checks only: the asyncio loop,
        or the trio run's token. It never changes."""

    @property
    def time(self) -> Callable[[], float]:
        """The loop's clock in seconds (``loop.time`` or ``trio.current_time``),
        read by the timer once per schedule and per wake-up; the same clock
        :meth:`arm` counts in. Taken once, at bind: it must stay valid."""

    @property
    def running_here(self) -> tuple[int, Callable[[], bool]] | None:
        """``(thread, is_running)``: the calling code runs on this loop if it runs
        in ``thread`` while ``is_running()`` holds; None where :meth:`is_current`
        must be asked. Read once, at bind: the timer tests it itself (once per
        watched operation), without a call into the driver."""

    def arm(self, when: float) -> None:
        """Call ``on_wake()`` once, at loop time ``when`` or after (never before,
        except by the loop's own rounding: the timer re-arms when woken early).
        Replaces the wake-up armed before; the timer arms only for an instant
        earlier than the armed one, or after a wake-up."""

    def disarm(self) -> None:
        """Drop the armed wake-up (the timer has nothing pending). Idempotent."""

    def request_flush(self) -> None:
        """Call ``on_flush()`` on a later loop iteration, never inside the calling
        one. The timer asks at most once until that call (it counts on it to move
        new entries into the wheel).

        Raises:
            RuntimeError: the loop is closed (the timer has changed nothing yet).
        """

    def close(self) -> None:
        """Drop the wake-up and the flush for good (``Timer.close()``). Idempotent."""

    def report(self, exc: BaseException, entry: object) -> None:
        """Hand an exception a timer callback raised to the loop (its exception
        handler, or trio's crash of the run); called from inside ``on_wake()`` or
        ``on_flush()``, and the timer runs the rest of its batch after it."""

    def is_current(self) -> bool:
        """Whether the calling code runs on this loop (the slow test, when
        :attr:`running_here` is None or says no). Called from any thread; must
        not raise."""

    def call_soon_threadsafe(self, fn: Callable[[], object], /) -> object:
        """Run ``fn()`` soon on the loop. The one member called from any thread
        (``*_threadsafe`` triggers of a purgatory).

        Raises:
            RuntimeError: the loop is closed or the trio run has finished.
        """

    def waiter(self) -> Any:
        """A new waiter on this loop, as :meth:`RunningLoop.new_waiter` (one per
        watched operation: no lookup of the running loop)."""


class RunningLoop(Protocol):
    """Questions about the running loop that need no timer (static methods of a
    driver class, which ``_driver_type()`` picks by the running library).

    Called in code running on the loop (a task or a callback), on its thread; each
    raises ``RuntimeError`` outside a running loop of its backend (the functions
    of this module below ask the right class, so they hold for any backend).
    """

    @staticmethod
    def running_owner() -> object:
        """The running asyncio loop, or the trio run's token (a timer's ``owner``)."""

    @staticmethod
    def running_time() -> float:
        """The running loop's clock, in seconds (``Timeout`` deadlines)."""

    @staticmethod
    def new_waiter() -> Any:
        """Something the current task can park on: ``await`` it; ``set_result(None)``
        wakes it, ``done()`` tells whether it was. ``await op`` and ``watch()``."""

    @staticmethod
    def deadline_scope() -> DeadlineScope:
        """The current task's :class:`DeadlineScope`, for a ``Timeout`` it enters
        (asyncio: the task, cancelled then uncancelled; trio: a cancel scope)."""

    @staticmethod
    def running_call_soon_threadsafe() -> Callable[..., object]:
        """``fn(*args)`` soon on the running loop, callable from any thread later:
        how a failure nobody received is logged when its operation is collected."""

    @staticmethod
    def done_callback_scheduler() -> Callable[[Callable[[Any], object], Any, Any], object]:
        """``schedule(fn, op, context)``: ``fn(op)`` in ``context``, soon on the
        running loop, never inside the caller (an operation's done callbacks)."""


class DriverClass(RunningLoop, Protocol):
    """A backend's driver class: makes a :class:`Driver` per timer, and answers
    :class:`RunningLoop`'s questions."""

    def __call__(self, on_wake: Callable[[], None], on_flush: Callable[[], None]) -> Driver: ...


def _driver_type() -> DriverClass:
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
