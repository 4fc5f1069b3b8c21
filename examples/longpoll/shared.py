"""What the feeds kept outside the process share (:mod:`~examples.longpoll.redisfeed`,
:mod:`~examples.longpoll.pgfeed`): the fetch, reads coalesced per loop iteration, and
the view one read gives of a topic."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from .feed import Feed, FeedError, Fetched, Settings, answer_reason, check_topic
from .waiters import Waiter

__all__ = ["Coalescer", "StoredFeed", "View"]

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


class StoredFeed(Feed):
    """A feed whose topics are kept outside the process (Redis, PostgreSQL): the fetch.

    A subclass reads a topic (``_read``: one :class:`View`, FeedError 503 when its
    store is down) and parks a fetch until the topic's byte count reaches a
    threshold (``_wait``); it says its store's name in ``store``.
    """

    #: The store's name, in messages.
    store = "the store"
    #: A parked GET answered more than this many seconds after its wait is logged
    #: (``longpoll.late_answer``), so that its lateness can be judged beside the loop
    #: lag measured around it (:mod:`examples.longpoll.soakcheck`).
    late_logged_over = 1.0

    def __init__(self, settings: Settings, waiter: Waiter) -> None:
        super().__init__(settings, waiter)
        self._late_log = structlog.get_logger("examples.longpoll")
        #: Requests answered 503 because the store could not be read or written:
        #: ``post``, ``get`` (a new GET's first read), ``parked`` (a parked GET's read
        #: at its end).
        self.unavailable = {"post": 0, "get": 0, "parked": 0}
        #: The most a parked GET was answered (200 or 503) after its wait, seconds,
        #: from its arrival in the application.
        self.lateness_max = 0.0

    # The in-memory feed's synchronous calls have no meaning here: the topics are in
    # the store, read by fetch(). Refuse them rather than answer from an empty dict.
    def post(self, name: str, body: bytes) -> int:
        raise TypeError(f"a {type(self).__name__} posts asynchronously: await feed.append(...)")

    def readable(self, name: str, offset: int) -> int:
        raise TypeError(f"a {type(self).__name__} reads asynchronously: await feed.fetch(...)")

    def check_fetch(self, name: str, offset: int) -> None:
        raise TypeError(f"a {type(self).__name__} reads asynchronously: await feed.fetch(...)")

    def read(self, name: str, offset: int) -> Fetched:
        raise TypeError(f"a {type(self).__name__} reads asynchronously: await feed.fetch(...)")

    async def _read(self, name: str, offset: int) -> View:
        raise NotImplementedError

    async def _wait(self, name: str, wait: float, threshold: int) -> None:
        raise NotImplementedError

    async def fetch(
        self,
        name: str,
        offset: int,
        wait: float,
        min_bytes: int,
        park: Callable[[Awaitable[None]], Awaitable[bool]] | None = None,
    ) -> Fetched | None:
        """Answer a fetch from the store, parking it first if it is not answerable yet.

        A parked fetch is answered from a read made once its wait ended, never from
        what was read when it parked: if that read fails, the answer is a 503
        (counted in :attr:`unavailable`), never an empty answer before the wait.
        Returns None if ``park`` said the client went away.

        Raises:
            FeedError: a bad name or an offset past the end (400), too many parked
                (503), the store down (503).
        """
        check_topic(name)
        loop = asyncio.get_running_loop()
        # The wait counts from the request, so a slow first read shortens the park
        # rather than adding to it.
        start = loop.time()
        try:
            view = await self._read(name, offset)
        except FeedError:
            self.unavailable["get"] += 1
            raise
        if offset > view.next:
            raise FeedError(400, f"offset {offset} is past the end of topic {name} ({view.next})")
        left = start + wait - loop.time()
        if self.closing or left <= 0 or view.readable >= min_bytes:
            return view.fetched
        waiting = self._wait(name, left, view.position + min_bytes)
        if park is None:
            await waiting
        elif not await park(waiting):
            return None
        try:
            view = await self._read(name, offset)
        except FeedError as exc:
            self.unavailable["parked"] += 1
            self._answered_parked(name, start, wait, loop.time(), exc.status)
            raise
        enough = view.readable >= min_bytes
        now = loop.time()
        self.answers[answer_reason(enough, self.closing, now, start + wait)] += 1
        self._answered_parked(name, start, wait, now, 200)
        return view.fetched

    def _answered_parked(
        self, name: str, start: float, wait: float, now: float, status: int
    ) -> None:
        late = now - start - wait
        self.lateness_max = max(self.lateness_max, late)
        if late > self.late_logged_over:
            # Loop-clock times, as the loop-lag probe's (longpoll.loop_lag) are.
            self._late_log.warning(
                "longpoll.late_answer",
                topic=name,
                status=status,
                start=round(start, 4),
                wait=wait,
                answered=round(now, 4),
                late_s=round(late, 4),
                pid=os.getpid(),
            )
