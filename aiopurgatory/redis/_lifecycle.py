"""A RedisTriggers' lifecycle: its state, its start and its close.

:class:`State` is one of NEW -> RUNNING -> CLOSING -> CLOSED (or NEW -> CLOSED,
closed before it was started). :class:`Lifecycle` moves it along:

* **start** (``async with``): one PING on the sender's connection and, with a
  purgatory, the first subscription and the resync of what it watches, all
  within one ``command_timeout``. A failure closes what was opened and raises
  :class:`~._errors.RedisTriggersError` naming the cause (redacted); a
  cancellation closes it too. Then the tasks start: the sender's, the reader's
  and the subscriber's.
* **close** (``aclose()``): what is pending is sent for up to ``close_timeout``,
  the tasks are cancelled and awaited, the subscription and the connections
  closed, and the fetches and ``flush()`` waiters still waiting failed.

The tasks end only when closing cancels them: one that ends while running is a
bug, logged and kept as the last error.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Callable, Coroutine
from typing import Any

from ._connections import Connections
from ._errors import RedisTriggersClosedError, RedisTriggersError, connection_cause
from ._link import CONNECTION_ERRORS, CONNECTION_LOST
from ._publisher import Sender
from ._reader import WatermarkReader
from ._subscriber import Subscriber

__all__ = ["Lifecycle", "State"]


class State(enum.Enum):
    """A RedisTriggers' lifecycle: NEW -> RUNNING -> CLOSING -> CLOSED (or NEW -> CLOSED)."""

    NEW = "new"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class Lifecycle:
    """Starts and closes the parts of one RedisTriggers (see the module documentation).

    Args:
        instance: the owner's id (its tasks' names carry it).
        connections: the owner's connections (their record of failures too).
        sender: the owner's sender.
        reader: the owner's watermark reader.
        subscriber: the owner's subscriber, or None for a publisher only.
        command_timeout: seconds the whole start may take.
        close_timeout: seconds closing waits for pending triggers to be sent.
        logger: the owner's bound logger.
        checks: makes the coroutine of the configuration checks
            (:mod:`._agreement`), run as a task beside the others; None for none.
    """

    def __init__(
        self,
        instance: str,
        connections: Connections,
        sender: Sender,
        reader: WatermarkReader,
        subscriber: Subscriber | None,
        *,
        command_timeout: float,
        close_timeout: float,
        logger: Any,
        checks: Callable[[], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        self._checks = checks
        self._id = instance
        self._connections = connections
        self._sender = sender
        self._reader = reader
        self._subscriber = subscriber
        self._command_timeout = command_timeout
        self._close_timeout = close_timeout
        self._logger = logger
        self.state = State.NEW
        self._tasks: list[asyncio.Task[None]] = []

    def check_running(self) -> None:
        """Raise :class:`~._errors.RedisTriggersClosedError` unless RUNNING."""
        if self.state is not State.RUNNING:
            raise RedisTriggersClosedError(
                "RedisTriggers is not started: use `async with`"
                if self.state is State.NEW
                else "RedisTriggers is closed"
            )

    async def start(self) -> None:
        """Connect (and subscribe, and resync) once, then start the tasks.

        Raises:
            RedisTriggersClosedError: started before.
            RedisTriggersError: Redis is unreachable, refuses the credentials or
                does not answer within ``command_timeout`` (message redacted).
        """
        if self.state is not State.NEW:
            raise RedisTriggersClosedError("a RedisTriggers can be entered once")
        subscriber = self._subscriber
        failure: BaseException | None = None
        connection: Any = None
        try:
            # The whole start is one call to Redis for command_timeout.
            async with asyncio.timeout(self._command_timeout):
                with CONNECTION_LOST:
                    reply = (await self._sender.link.execute(("PING",)))[0]
                    if isinstance(reply, Exception):
                        raise reply
                    if subscriber is not None:
                        connection = await subscriber.subscribe()
                        await self._reader.serve(resync=True)
        except TimeoutError:
            failure = TimeoutError(f"no answer within {self._command_timeout:g} s")
        except CONNECTION_ERRORS as exc:
            failure = exc
        except BaseException:  # cancelled while connecting: leave nothing open
            if connection is not None:
                await connection.disconnect(nowait=True)
            await self._close_connections()
            self.state = State.CLOSED
            raise
        if failure is not None:
            # Raised outside the except block: no chained redis-py exception
            # (whose text we do not control) travels with ours.
            text = self._connections.record_error(failure)
            message = (
                f"cannot connect to Redis at {self._connections.where}: "
                f"{connection_cause(failure)} ({text})"
            )
            failure = None
            if connection is not None:
                await connection.disconnect(nowait=True)
            await self._close_connections()
            self.state = State.CLOSED
            raise RedisTriggersError(message)
        # The resync done above is the start's; the one the subscription asked
        # for would only repeat it.
        self._reader.cancel_resync()
        self._sender.connected = True
        self.state = State.RUNNING
        self._start_task(self._sender.run(), "send")
        self._start_task(self._reader.run(), "read")
        if subscriber is not None:
            self._start_task(subscriber.run(connection), "sub")
        if self._checks is not None:
            self._start_task(self._checks(), "check")
        self._logger.info("aiopurgatory.redis.started", redis=self._connections.where)

    async def close(self) -> None:
        """Send what is pending (up to ``close_timeout``), stop the tasks, disconnect.

        Idempotent. Pending triggers that could not be sent in time are dropped
        (logged with their number; their ``flush()`` waiters get
        :class:`~._errors.RedisTriggersClosedError`).
        """
        if self.state in (State.CLOSING, State.CLOSED):
            return
        if self.state is State.NEW:
            self.state = State.CLOSED
            return
        self.state = State.CLOSING
        dropped = 0
        sender = self._sender
        try:
            if sender:
                try:
                    await asyncio.wait_for(self._drain(), self._close_timeout)
                except TimeoutError:
                    dropped = len(sender)
        finally:
            # Also when the closing task is cancelled: nothing is left running.
            tasks, self._tasks = self._tasks, []
            for task in tasks:
                task.cancel()
            for task in tasks:
                # A task that died of a bug was logged by _task_ended already.
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            subscriber = self._subscriber
            if subscriber is not None:
                await subscriber.drop()
            await self._close_connections()
            self._reader.fail_fetches(
                RedisTriggersClosedError("RedisTriggers closed before the watermark was read")
            )
            self.state = State.CLOSED
        sender.fail_waiters(
            RedisTriggersClosedError("RedisTriggers closed before the triggers were sent")
        )
        if dropped:
            self._logger.warning("aiopurgatory.redis.dropped_on_close", triggers=dropped)
        self._logger.info("aiopurgatory.redis.closed")

    def _start_task(self, work: Coroutine[Any, Any, None], role: str) -> None:
        task = asyncio.create_task(work, name=f"aiopurgatory-redis-{role}-{self._id}")
        task.add_done_callback(self._task_ended)
        self._tasks.append(task)

    async def _drain(self) -> None:
        while self._sender:
            await self._sender.wait_sent()

    async def _close_connections(self) -> None:
        """Close the sender's and the reader's connections (the subscriber's is apart),
        and the clients made to ask the sentinels."""
        await self._sender.link.drop()
        await self._reader.drop()
        await self._connections.aclose()

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        # The loops end only when close() cancels them; anything else is a bug,
        # and must not go unnoticed.
        if task.cancelled():
            return
        exc = task.exception()  # retrieved in every case: never "never retrieved"
        if self.state is not State.RUNNING:
            return
        connections = self._connections
        connections.last_error = "ended" if exc is None else connections.redactor.error(exc)
        self._logger.error(
            "aiopurgatory.redis.task_ended", task=task.get_name(), error=connections.last_error
        )
