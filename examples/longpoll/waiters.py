"""The two ways of parking a long-poll GET: a purgatory, and asyncio.wait_for on a future.

Both offer the same four calls to :class:`~examples.longpoll.feed.Feed`:

* ``await wait(key, ready, seconds)``: return once ``ready()`` is true after a
  :meth:`notify` of ``key``, after ``seconds``, or after :meth:`release`
  of ``key``; cancelling the caller withdraws the wait at once.
* ``notify(key)``: something was posted to ``key``; wake the waits now ready.
* ``release(key)``: wake every wait under ``key`` (shutdown).
* ``async with waiter:`` for the server's lifetime.

:class:`PurgatoryWaiter` makes each wait a :class:`~aiopurgatory.DelayedOperation`
watched under its topic: ``check_and_complete(topic)`` on a post, expiry on the
timing wheel. :class:`AsyncioWaiter` is what asyncio users write today: a future
per request in a per-topic table, ``asyncio.wait_for(future, seconds)``, and a
post that walks the table.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Protocol, Self

import aiopurgatory as ap

__all__ = ["WAITERS", "AsyncioWaiter", "PurgatoryWaiter", "Waiter", "make_waiter"]

Ready = Callable[[], bool]


class Waiter(Protocol):
    """What :class:`~examples.longpoll.feed.Feed` needs from a waiter."""

    #: ``purgatory`` or ``asyncio`` (the ``--waiter`` choice).
    name: str

    async def wait(self, key: str, ready: Ready, seconds: float) -> None: ...
    def notify(self, key: str) -> None: ...
    def release(self, key: str) -> None: ...
    async def __aenter__(self) -> Self: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class LongPoll(ap.DelayedOperation):
    """A parked GET: complete once ``ready()`` (enough bytes past its offset)."""

    def __init__(self, ready: Ready, seconds: float) -> None:
        super().__init__(seconds)
        self.ready = ready

    def try_complete(self) -> bool:
        return self.ready() and self.force_complete()


class PurgatoryWaiter:
    """Each wait is a :class:`LongPoll` watched under its topic in one purgatory.

    Args:
        purgatory: the purgatory to use (default: a new one named ``longpoll``);
            it is closed when the waiter's ``async with`` block ends.
    """

    name = "purgatory"

    def __init__(self, purgatory: ap.Purgatory[LongPoll] | None = None) -> None:
        self.purgatory: ap.Purgatory[LongPoll] = (
            ap.Purgatory("longpoll") if purgatory is None else purgatory
        )

    async def wait(self, key: str, ready: Ready, seconds: float) -> None:
        # Cancelling this task cancels the operation: out of the wheel and the watch list.
        await self.purgatory.watch(LongPoll(ready, seconds), [key])

    def notify(self, key: str) -> None:
        self.purgatory.check_and_complete(key)

    def release(self, key: str) -> None:
        # The waits return Outcome.CANCELLED; the feed answers them with what there is.
        self.purgatory.cancel_for_key(key)

    async def __aenter__(self) -> Self:
        await self.purgatory.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.purgatory.__aexit__(exc_type, exc, tb)


class AsyncioWaiter:
    """Each wait is a future in a per-topic table, awaited with ``asyncio.wait_for``."""

    name = "asyncio"

    def __init__(self) -> None:
        self._waiting: dict[str, dict[asyncio.Future[None], Ready]] = {}

    async def wait(self, key: str, ready: Ready, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(key, {})
        waiting[future] = ready
        try:
            await asyncio.wait_for(future, seconds)
        except TimeoutError:
            pass
        finally:
            del waiting[future]
            if not waiting:
                del self._waiting[key]

    def notify(self, key: str) -> None:
        for future, ready in self._waiting.get(key, {}).items():
            if not future.done() and ready():
                future.set_result(None)

    def release(self, key: str) -> None:
        for future in self._waiting.get(key, {}):
            if not future.done():
                future.set_result(None)

    @property
    def waiting(self) -> int:
        """Futures in the table (parked GETs)."""
        return sum(len(futures) for futures in self._waiting.values())

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release_all()

    def release_all(self) -> None:
        """Wake every wait (the server is stopping)."""
        for key in list(self._waiting):
            self.release(key)


WAITERS: dict[str, Callable[[], Waiter]] = {
    "purgatory": PurgatoryWaiter,
    "asyncio": AsyncioWaiter,
}


def make_waiter(name: str) -> Waiter:
    """A new waiter by ``--waiter`` name.

    Raises:
        ValueError: an unknown name.
    """
    try:
        factory = WAITERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"waiter must be one of {sorted(WAITERS)}, got {name!r}") from None
    return factory()
