"""What the feeds kept outside the process share: reads coalesced per loop iteration,
and the view one read gives of a topic (:mod:`~examples.longpoll.redisfeed`,
:mod:`~examples.longpoll.pgfeed`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

from .feed import Fetched

__all__ = ["Coalescer", "View"]

T = TypeVar("T")


class Coalescer:
    """Calls for one key made in the same loop iteration share one call, issued after them all.

    The first caller starts a task; callers for the same key that come before the
    task's first step (the same loop iteration: the GETs one POST completed, wakened
    together) join it. The task forgets its key before it issues the call, so a
    later caller never gets a result read before it asked: what a joined read
    returns is at least as new as a read of its own would be.
    """

    def __init__(self) -> None:
        self._pending: dict[Hashable, asyncio.Task[Any]] = {}
        #: Calls made, calls joined.
        self.calls = 0
        self.joined = 0

    async def run(self, key: Hashable, make: Callable[[], Awaitable[T]]) -> T:
        task = self._pending.get(key)
        if task is None:
            task = asyncio.create_task(self._call(key, make))
            # Every caller may be gone (their clients hung up) when the call fails:
            # its error is then nobody's, and asyncio would log it as never retrieved.
            task.add_done_callback(_collect)
            self._pending[key] = task
            self.calls += 1
        else:
            self.joined += 1
        # shield: a caller cancelled (its client gone) leaves the call to the others.
        result: T = await asyncio.shield(task)
        return result

    async def _call(self, key: Hashable, make: Callable[[], Awaitable[T]]) -> T:
        del self._pending[key]
        return await make()


def _collect(task: asyncio.Task[Any]) -> None:
    """Mark a task's error as retrieved: its callers (if any) got it from ``await``."""
    if not task.cancelled():
        task.exception()


@dataclass(frozen=True)
class View:
    """One read: the topic's bounds and the messages from the requested offset."""

    start: int
    next: int
    bytes: int
    position: int  # bytes before the first message in ``fetched``
    fetched: Fetched

    @property
    def readable(self) -> int:
        return self.bytes - self.position
