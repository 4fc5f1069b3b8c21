"""Which async library is running, and the driver and waiters that go with it.

The core is the same on every backend; what differs is gathered in a *driver*
(:mod:`aiopurgatory._asyncio_driver`, :mod:`aiopurgatory._trio_driver`): the
clock, the wake-ups, the waiters that ``watch()`` and ``await op`` park on, and
the way in from other threads. The backend is detected at first use, with the
answer sniffio gives: a running trio task means trio (also in trio's guest mode
on an asyncio host loop), else a running asyncio loop (uvloop included) means
asyncio, else an active ``trio.run`` in this thread (a ``run_sync_soon``
callback) means trio. trio is only looked at if the program imported it, so
asking costs asyncio programs a dictionary lookup and one C call.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any, Protocol

from ._asyncio_driver import AsyncioDriver

__all__ = [
    "Driver",
    "current_backend",
    "current_owner",
    "current_time",
    "new_driver",
    "new_waiter",
]

_get_running_loop = asyncio._get_running_loop  # C; None outside a running loop


class Driver(Protocol):
    """What a :class:`~aiopurgatory.Timer` and a purgatory need of a backend.

    See :mod:`aiopurgatory._asyncio_driver` for the meaning of each member.
    """

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
    def new_waiter(self) -> Any: ...
    def call_soon_threadsafe(self, fn: Callable[[], object], /) -> object: ...


def _trio_running() -> bool:
    """True inside ``trio.run`` (a task, or a callback such as ``run_sync_soon``)."""
    trio = sys.modules.get("trio")
    return trio is not None and bool(trio.lowlevel.in_trio_run())


def current_backend() -> str | None:
    """``"asyncio"`` or ``"trio"`` for the running async library, or None.

    A trio task comes first: in trio's guest mode it runs inside an asyncio
    host loop's callbacks, where ``asyncio._get_running_loop()`` is the host's.
    """
    trio = sys.modules.get("trio")
    if trio is not None and trio.lowlevel.in_trio_task():
        return "trio"
    if _get_running_loop() is not None:
        return "asyncio"
    if _trio_running():
        return "trio"
    return None


def current_owner() -> object:
    """The running asyncio loop, or the running trio run's ``TrioToken``.

    Raises:
        RuntimeError: no running event loop.
    """
    backend = current_backend()
    if backend == "asyncio":
        return _get_running_loop()
    if backend == "trio":
        return sys.modules["trio"].lowlevel.current_trio_token()
    raise RuntimeError(_NO_LOOP)


def new_driver(on_wake: Callable[[], None], on_flush: Callable[[], None]) -> Driver:
    """A driver for the running backend (see :mod:`aiopurgatory._asyncio_driver`).

    Raises:
        RuntimeError: neither an asyncio loop nor a trio run is active.
    """
    backend = current_backend()
    if backend == "asyncio":
        return AsyncioDriver(on_wake, on_flush)
    if backend == "trio":
        from ._trio_driver import TrioDriver

        return TrioDriver(on_wake, on_flush)
    raise RuntimeError(_NO_LOOP)


def new_waiter() -> Any:
    """Something to park the current task on until ``set_result(None)``.

    An asyncio future on asyncio; on trio, an equivalent with ``done()``,
    ``set_result()`` and ``await``.

    Raises:
        RuntimeError: no running event loop.
    """
    backend = current_backend()
    if backend == "asyncio":
        return _get_running_loop().create_future()  # type: ignore[union-attr]
    if backend == "trio":
        from ._trio_driver import TrioWaiter

        return TrioWaiter()
    raise RuntimeError(_NO_LOOP)


def current_time() -> float:
    """The running backend's clock: ``loop.time()`` or ``trio.current_time()``.

    Raises:
        RuntimeError: no running event loop.
    """
    backend = current_backend()
    if backend == "asyncio":
        return _get_running_loop().time()  # type: ignore[union-attr]
    if backend == "trio":
        return float(sys.modules["trio"].current_time())
    raise RuntimeError(_NO_LOOP)


_NO_LOOP = "no running event loop (asyncio, uvloop or trio)"
