"""Releasing parked requests on SIGTERM and SIGINT: :func:`release_on_shutdown`.

POSIX signal handling for a web service's lifespan, apart from the ASGI middleware
(:mod:`aiopurgatory.asgi`, which re-exports it: that is its public path).
uvicorn (and gunicorn's uvicorn workers) wait for open requests to finish before
they run the application's lifespan shutdown, so ``async with purgatory:`` in the
lifespan releases parked requests only after they have all timed out. Entered in
the lifespan, :func:`release_on_shutdown` makes SIGTERM and SIGINT close the
purgatories first (every parked operation ends ``CANCELLED``, its handler answers
at once), then lets the server's own handling run. It imports no framework or server.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, Final, Self

from . import Purgatory
from ._logging import LazyLogger

__all__ = ["SHUTDOWN_SIGNALS", "release_on_shutdown"]

#: The signals :func:`release_on_shutdown` answers: what process managers
#: (systemd, Kubernetes, Docker, gunicorn's arbiter) and Ctrl+C send to stop a server.
SHUTDOWN_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)

_logger = LazyLogger()


class _ReleaseOnShutdown:
    """What :func:`release_on_shutdown` returns (an async context manager)."""

    __slots__ = ("_installed", "_loop", "_on_signal", "_purgatories", "_released")

    def __init__(
        self,
        purgatories: tuple[Purgatory[Any], ...],
        on_signal: Callable[[signal.Signals], object] | None,
    ) -> None:
        self._purgatories = purgatories
        self._on_signal = on_signal
        self._installed: dict[int, tuple[Any, Callable[[int, FrameType | None], None]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._released = False

    async def __aenter__(self) -> Self:
        if self._loop is not None:
            raise RuntimeError("release_on_shutdown(...) is entered once; call it again for more")
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "release_on_shutdown needs an asyncio loop (asyncio or uvloop)"
            ) from None
        if threading.current_thread() is not threading.main_thread():
            # Python runs signal handlers in the main thread only: a server serving
            # from another thread (uvicorn there) does not handle signals either.
            _logger.debug("aiopurgatory.release_on_shutdown_inactive", reason="not main thread")
            return self
        for sig in SHUTDOWN_SIGNALS:
            previous = signal.getsignal(sig)
            if previous is signal.SIG_IGN or previous is None:
                # Ignored on purpose (hypercorn's workers ignore SIGINT and stop when
                # their parent says so), or set outside Python: not ours to take over.
                continue
            handler = self._handler(previous)
            signal.signal(sig, handler)
            self._installed[sig] = (previous, handler)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._restore()

    def _restore(self) -> None:
        installed, self._installed = self._installed, {}
        for sig, (previous, handler) in installed.items():
            # Only if ours is still there: a server that replaced it since (asyncio's
            # remove_signal_handler, say) keeps its own choice.
            if signal.getsignal(sig) is handler:
                signal.signal(sig, previous)

    def _handler(self, previous: Any) -> Callable[[int, FrameType | None], None]:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            # A signal handler runs between two bytecodes of whatever the main thread
            # was doing, possibly inside a purgatory: the closing waits for the loop.
            loop = self._loop
            if not self._released and loop is not None and not loop.is_closed():
                self._released = True
                loop.call_soon_threadsafe(self._release, signum)
            if callable(previous):
                # The server's handler, in the context it was written for (uvicorn's
                # sets a flag its main loop polls; the Python half of asyncio's and
                # uvloop's add_signal_handler hands the signal to the loop).
                previous(signum, frame)
            elif previous == signal.SIG_DFL and loop is not None and not loop.is_closed():
                # Nobody handles it: the default action (the end of the process),
                # once the purgatories are closed.
                loop.call_soon_threadsafe(self._default, signum)

        return on_signal

    def _release(self, signum: int) -> None:
        sig = signal.Signals(signum)
        if self._on_signal is not None:
            try:
                self._on_signal(sig)
            except Exception as exc:
                # Logged, and the purgatories are closed all the same.
                _logger.error(
                    "aiopurgatory.on_signal_failed",
                    signal=sig.name,
                    error=f"{type(exc).__name__}: {exc}",
                    exc_info=exc,
                )
        pending = sum(p.pending for p in self._purgatories)
        for purgatory in self._purgatories:
            purgatory.close()
        _logger.info(
            "aiopurgatory.released_on_shutdown",
            signal=sig.name,
            purgatories=[p.name for p in self._purgatories],
            cancelled=pending,
        )

    def _default(self, signum: int) -> None:
        self._restore()
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)


def release_on_shutdown(
    *purgatories: Purgatory[Any],
    on_signal: Callable[[signal.Signals], object] | None = None,
) -> _ReleaseOnShutdown:
    """An async context manager for an application's lifespan: SIGTERM and SIGINT close
    ``purgatories`` first, then run the server's own handling.

    On entry it puts its handler in front of the process's current ones (those
    that the server installed before the lifespan started: uvicorn's, also under
    ``--workers N`` and in gunicorn's uvicorn workers, or the Python half of an
    event loop's ``add_signal_handler``, as hypercorn uses). On a signal, the
    purgatories are closed on the loop at once (every parked operation ends
    ``CANCELLED``, so its handler answers now, and a new ``watch()`` raises
    ``PurgatoryClosedError``), and the previous handler is called as it would
    have been; with none (``SIG_DFL``), the default action follows the closing.
    A signal ignored (``SIG_IGN``) stays ignored. On exit the previous handlers
    are back, unless the server has replaced ours since.

    Signals reach Python's handlers in the main thread only: entered in another
    thread, it installs nothing (a server there does not handle signals either).

    Args:
        *purgatories: the purgatories whose parked operations hold requests.
        on_signal: called with the signal, on the loop, just before the
            purgatories are closed: for what else the application stops at that
            moment (a draining flag that ``/healthz`` reports, waits of its own).
            An exception from it is logged (``aiopurgatory.on_signal_failed``)
            and the purgatories are closed all the same.

    Raises:
        TypeError: neither a purgatory nor ``on_signal`` given; an argument that
            is not an :class:`~aiopurgatory.Purgatory` (the message names its
            position); ``on_signal`` not callable.
        RuntimeError: (on entry) no running asyncio loop; entered twice.
    """
    for index, purgatory in enumerate(purgatories):
        if not isinstance(purgatory, Purgatory):
            raise TypeError(
                f"purgatories[{index}] must be an aiopurgatory.Purgatory, "
                f"got {type(purgatory).__name__}"
            )
    if on_signal is not None and not callable(on_signal):
        raise TypeError(f"on_signal must be callable or None, got {type(on_signal).__name__}")
    if not purgatories and on_signal is None:
        raise TypeError("release_on_shutdown() needs a purgatory (or on_signal)")
    return _ReleaseOnShutdown(purgatories, on_signal)
