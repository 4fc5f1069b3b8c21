"""LocalTriggers: the in-memory transport of the :class:`~aiopurgatory.Triggers` protocol.

Instances that share a :class:`LocalBus` stand for processes that share a Redis
channel (or a PostgreSQL one): a trigger made on one applies to its own purgatory
at once and reaches the others on a later loop iteration (or after the bus's
``latency``), and the bus stores every key's highest watermark, which a watch
reads to catch up, as the real transports do. A trigger made where a sampled
OpenTelemetry span is current carries that span's W3C ``traceparent`` and is
applied elsewhere with it as the current span (so :mod:`aiopurgatory.tracing`
links what it completes to it), in a context of its own, as in another process.
Nothing here does I/O or reads a clock, so it runs on virtual time
(:mod:`aiopurgatory.simulation`): it is the test double that application code
written against ``Triggers`` is handed, not a mock. ``LocalBus.pause()`` and
``resume()`` stand for an outage of the server.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import sys
import threading
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from types import TracebackType
from typing import Any, Self

from ._errors import TriggersClosedError
from ._logging import LazyLogger
from ._operation import DelayedOperation, Outcome
from ._purgatory import Purgatory
from ._transport import Key, Value, check_key, check_value, wire_keys
from ._validation import as_seconds

__all__ = ["LocalBus", "LocalTriggers", "LocalTriggersStatistics"]


@dataclass(frozen=True, slots=True)
class LocalTriggersStatistics:
    """A snapshot of one LocalTriggers' counters (running totals since construction).

    Attributes:
        purgatory: the local purgatory's name, or None for a publisher only.
        connected: started, not closed, and the bus is not paused.
        triggers: ``check_and_complete``/``advance`` calls on this instance.
        pending: triggers made here and not yet delivered to every other instance.
        received: triggers from other instances delivered here.
        completed: operations those triggers and the catch-up reads completed.
        resyncs: times the stored watermarks of the watched keys were applied
            after the bus resumed.
        dropped: triggers still undelivered when the instance closed (the bus paused).
    """

    purgatory: str | None
    connected: bool
    triggers: int
    pending: int
    received: int
    completed: int
    resyncs: int
    dropped: int


class LocalBus:
    """The shared medium of :class:`LocalTriggers`: a channel and its stored watermarks.

    Args:
        latency: seconds between a trigger and its delivery to the other
            instances (default 0: the next loop iteration), on their loops' clocks.

    Raises:
        TypeError, ValueError: ``latency`` is not a finite number >= 0.
    """

    def __init__(self, *, latency: float = 0.0) -> None:
        latency = as_seconds(latency, "latency")
        if latency < 0:
            raise ValueError(f"latency must not be negative, got {latency!r}")
        self._latency = latency
        self._lock = threading.Lock()
        self._watermarks: dict[Key, Value] = {}
        self._members: list[LocalTriggers] = []
        self._paused = False
        # Triggers made while paused, in order: (sender, kind, key, value, traceparent).
        self._held: list[tuple[LocalTriggers, str, Key, Value | None, str | None]] = []

    @property
    def latency(self) -> float:
        """Seconds between a trigger and its delivery elsewhere."""
        return self._latency

    @property
    def paused(self) -> bool:
        """:meth:`pause` was called and :meth:`resume` not yet."""
        return self._paused

    def watermark(self, key: Key) -> Value | None:
        """The stored watermark of ``key`` (what a catch-up read sees), or None."""
        return self._watermarks.get(check_key(key))

    def pause(self) -> None:
        """Stand for an outage: triggers are kept by their senders, not stored or delivered.

        While paused, ``flush()`` waits, a watch's catch-up read waits (its
        operation may expire meanwhile, as on a server that hangs), and
        ``fetch_watermark()`` waits. Idempotent.
        """
        self._paused = True

    def resume(self) -> None:
        """End the outage: store and deliver what was kept, then every member catches up.

        Each member re-reads the stored watermarks of the keys its purgatory
        watches and applies them (a resync, as after a reconnect). Idempotent.
        """
        if not self._paused:
            return
        self._paused = False
        held, self._held = self._held, []
        for sender, kind, key, value, traceparent in held:
            self._publish(sender, kind, key, value, traceparent)
        for member in list(self._members):
            member._resync_soon()

    def __repr__(self) -> str:
        state = " paused" if self._paused else ""
        return f"<LocalBus members={len(self._members)} keys={len(self._watermarks)}{state}>"

    # -- for LocalTriggers ---------------------------------------------------------------

    def _join(self, member: LocalTriggers) -> None:
        with self._lock:
            self._members.append(member)

    def _leave(self, member: LocalTriggers) -> None:
        with self._lock:
            if member in self._members:
                self._members.remove(member)
        self._held = [item for item in self._held if item[0] is not member]

    def _publish(
        self,
        sender: LocalTriggers,
        kind: str,
        key: Key,
        value: Value | None,
        traceparent: str | None,
    ) -> None:
        if self._paused:
            self._held.append((sender, kind, key, value, traceparent))
            return
        with self._lock:
            if value is not None:
                stored = self._watermarks.get(key)
                if stored is None or value > stored:
                    self._watermarks[key] = value
            receivers = [m for m in self._members if m is not sender and m._purgatory is not None]
        sender._sending += len(receivers)
        for receiver in receivers:
            receiver._deliver_later(sender, kind, key, value, traceparent, self._latency)
        sender._check_flushed()


class _State(Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSED = "closed"


class LocalTriggers:
    """In-memory triggers shared by the instances on one :class:`LocalBus`.

    Implements :class:`aiopurgatory.Triggers` as :class:`aiopurgatory.redis.RedisTriggers`
    does, with a :class:`LocalBus` in place of the server: ``check_and_complete``
    and ``advance`` apply here at once and reach the bus's other instances on a
    later loop iteration; the bus stores each key's highest watermark, and
    :meth:`watch` applies the stored watermarks of its keys right after watching,
    so a condition they already meet completes the watch whatever its timeout.
    No I/O, no clock: it runs on virtual time.

    Use as an async context manager; it runs on the loop it is entered on.

    Args:
        purgatory: the local purgatory, or None for a publisher only.
        bus: the bus to share with other instances; None for one of its own
            (an instance alone: its triggers reach no one else).
        logger: a structlog-compatible logger (default: the library's).

    Raises:
        TypeError: ``purgatory`` is not a Purgatory or None; ``bus`` is not a LocalBus.
    """

    def __init__(
        self,
        purgatory: Purgatory[Any] | None,
        *,
        bus: LocalBus | None = None,
        logger: Any | None = None,
    ) -> None:
        if purgatory is not None and not isinstance(purgatory, Purgatory):
            raise TypeError(
                "purgatory must be an aiopurgatory.Purgatory or None, "
                f"got {type(purgatory).__name__}"
            )
        if bus is not None and not isinstance(bus, LocalBus):
            raise TypeError(
                f"bus must be an aiopurgatory.LocalBus or None, got {type(bus).__name__}"
            )
        self._purgatory = purgatory
        self._bus = LocalBus() if bus is None else bus
        self._logger: Any = LazyLogger() if logger is None else logger
        self._state = _State.NEW
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sending = 0  # deliveries of this instance's triggers not yet applied
        self._flushed: asyncio.Event | None = None
        self._resumed: asyncio.Event | None = None
        self._triggers = 0
        self._received = 0
        self._completed = 0
        self._resyncs = 0
        self._dropped = 0

    @property
    def bus(self) -> LocalBus:
        """The bus this instance shares."""
        return self._bus

    @property
    def purgatory(self) -> Purgatory[Any] | None:
        """The local purgatory, or None for a publisher only."""
        return self._purgatory

    def __repr__(self) -> str:
        role = "publisher" if self._purgatory is None else f"purgatory={self._purgatory.name!r}"
        return f"<LocalTriggers {role} {self._state.value}>"

    def check_and_complete(self, key: Key) -> int:
        """Check ``key``'s watchers here at once, and on every other instance of the bus.

        Returns:
            How many operations of the local purgatory this call completed.

        Raises:
            TypeError: ``key`` is not a str, bytes or int (bool is refused too).
            TriggersClosedError: before ``async with`` or after ``aclose()``.
        """
        key = check_key(key)
        self._check_running()
        purgatory = self._purgatory
        completed = 0 if purgatory is None else purgatory.check_and_complete(key)
        self._triggers += 1
        self._bus._publish(self, "check", key, None, _traceparent())
        return completed

    def advance(self, key: Key, value: Value) -> int:
        """Raise ``key``'s watermark to ``value`` here at once, on the bus and everywhere.

        Returns:
            How many operations of the local purgatory this call completed.

        Raises:
            TypeError: ``key`` or ``value`` has a type that cannot be sent.
            ValueError: ``value`` is NaN, infinite, or an int beyond +-2**53.
            TriggersClosedError: before ``async with`` or after ``aclose()``.
        """
        key = check_key(key)
        value = check_value(value)
        self._check_running()
        purgatory = self._purgatory
        completed = 0 if purgatory is None else purgatory.advance(key, value)
        self._triggers += 1
        self._bus._publish(self, "advance", key, value, _traceparent())
        return completed

    async def watch(
        self, op: DelayedOperation, keys: Iterable[Hashable] | Mapping[Hashable, float]
    ) -> Outcome:
        """:meth:`Purgatory.watch` in the local purgatory, caught up with the stored watermarks.

        Watches ``op``, then applies the bus's stored watermarks of its keys (while
        the bus is paused: when it resumes), so a condition they already meet
        completes it at once, whatever its timeout (0 included). Cancelling the
        awaiting task cancels the operation.

        Returns:
            ``Outcome.COMPLETED``, ``EXPIRED`` or ``CANCELLED``, as ``Purgatory.watch``.

        Raises:
            TypeError: a key cannot cross between processes (not a str, bytes or
                int), before anything is watched; and whatever ``Purgatory.watch`` raises.
            TriggersClosedError: before ``async with``, after ``aclose()``, or on a
                publisher only.
        """
        self._check_running()
        purgatory = self._purgatory
        if purgatory is None:
            raise TriggersClosedError("a publisher-only LocalTriggers has no purgatory")
        wire: list[Key]
        if isinstance(keys, Mapping):
            keys = dict(keys)
            wire = [check_key(key) for key in keys]
        elif isinstance(keys, str | bytes | tuple):
            wire = []  # refused by the purgatory, with its own message
        else:
            keys = list(keys)  # it is read twice
            wire = [check_key(key) for key in keys]
        if purgatory.try_complete_else_watch(op, keys):
            return Outcome.COMPLETED
        if not self._bus.paused:
            # While paused the read waits for the server: the resync on resume applies.
            self._catch_up(wire)
        try:
            return await op
        except BaseException:
            op.cancel()
            raise

    async def fetch_watermark(self, key: Key) -> Value | None:
        """The watermark of ``key`` stored on the bus, or None (waits while it is paused).

        Raises:
            TypeError: ``key`` is not a str, bytes or int.
            TriggersClosedError: before ``async with`` or after ``aclose()``.
        """
        key = check_key(key)
        self._check_running()
        while self._bus.paused:
            await self._wait_resumed()
            self._check_running()
        return self._bus.watermark(key)

    async def flush(self) -> None:
        """Wait until every trigger made here has been delivered to the bus's other instances.

        Raises:
            TriggersClosedError: before ``async with``, or closed before they were delivered.
        """
        if self._state is _State.NEW:
            raise TriggersClosedError("LocalTriggers is not started: use `async with`")
        while self._sending or self._holds():
            if self._state is _State.CLOSED:
                raise TriggersClosedError("LocalTriggers is closed: pending triggers were dropped")
            await _event(self, "_flushed").wait()

    def statistics(self) -> LocalTriggersStatistics:
        """A snapshot of the counters (see :class:`LocalTriggersStatistics`)."""
        return LocalTriggersStatistics(
            purgatory=None if self._purgatory is None else self._purgatory.name,
            connected=self._state is _State.RUNNING and not self._bus.paused,
            triggers=self._triggers,
            pending=self._sending + self._holds(),
            received=self._received,
            completed=self._completed,
            resyncs=self._resyncs,
            dropped=self._dropped,
        )

    async def __aenter__(self) -> Self:
        if self._state is not _State.NEW:
            raise TriggersClosedError(f"LocalTriggers is {self._state.value}: enter it once")
        self._loop = asyncio.get_running_loop()
        self._state = _State.RUNNING
        # A publisher only joins too: it receives no trigger, but hears of resumes.
        self._bus._join(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Deliver what is pending (unless the bus is paused: then it is dropped) and stop.

        Idempotent. Dropped triggers are logged (with their number) and counted
        in ``statistics().dropped``.
        """
        if self._state is _State.CLOSED:
            return
        if self._state is _State.RUNNING and not self._bus.paused:
            await self.flush()
        held = self._holds()
        self._state = _State.CLOSED
        self._bus._leave(self)
        if held:
            self._dropped += held
            self._logger.warning("aiopurgatory.local.dropped", dropped=held)
        for event in (self._flushed, self._resumed):
            if event is not None:
                event.set()

    # -- inside ------------------------------------------------------------------------

    def _check_running(self) -> None:
        if self._state is not _State.RUNNING:
            state = "not started: use `async with`" if self._state is _State.NEW else "closed"
            raise TriggersClosedError(f"LocalTriggers is {state}")

    def _holds(self) -> int:
        return sum(1 for item in self._bus._held if item[0] is self)

    def _catch_up(self, keys: Iterable[Key]) -> None:
        purgatory = self._purgatory
        if purgatory is None:
            return
        bus = self._bus
        for key in keys:
            stored = bus.watermark(key)
            if stored is not None:
                self._completed += purgatory.advance(key, stored)

    def _resync_soon(self) -> None:
        loop = self._loop
        if loop is None or self._state is not _State.RUNNING:
            return
        # The process's own catch-up after an outage: nothing of the context of
        # the code that resumed the bus (its span would be linked to).
        self._on_loop(self._resync, context=contextvars.Context())

    def _resync(self) -> None:
        if self._state is not _State.RUNNING:
            return
        if self._resumed is not None:
            self._resumed.set()
        purgatory = self._purgatory
        if purgatory is None:
            return
        self._resyncs += 1
        self._catch_up(wire_keys(purgatory.keys()))
        self._check_flushed()

    async def _wait_resumed(self) -> None:
        await _event(self, "_resumed").wait()

    def _deliver_later(
        self,
        sender: LocalTriggers,
        kind: str,
        key: Key,
        value: Value | None,
        traceparent: str | None,
        latency: float,
    ) -> None:
        loop = self._loop
        assert loop is not None  # members are running
        # Applied in a context of its own, as in another process: nothing of the
        # sender's context variables (its current span, its bound log fields) is seen.
        args = (sender, kind, key, value, traceparent)
        apart = contextvars.Context()
        if latency <= 0:
            self._on_loop(self._apply, *args, context=apart)
        elif _running_loop() is loop:
            loop.call_later(latency, self._apply, *args, context=apart)
        else:
            loop.call_soon_threadsafe(
                functools.partial(loop.call_later, latency, self._apply, *args, context=apart)
            )

    def _apply(
        self,
        sender: LocalTriggers,
        kind: str,
        key: Key,
        value: Value | None,
        traceparent: str | None,
    ) -> None:
        try:
            purgatory = self._purgatory
            if self._state is _State.RUNNING and purgatory is not None:
                self._received += 1
                if traceparent is None:
                    self._completed += _trigger(purgatory, key, value)
                else:
                    from .tracing import _triggered_from  # carried: OpenTelemetry is there

                    with _triggered_from(traceparent):
                        self._completed += _trigger(purgatory, key, value)
        finally:
            sender._on_loop(sender._delivered)

    def _delivered(self) -> None:
        self._sending -= 1
        self._check_flushed()

    def _check_flushed(self) -> None:
        flushed = self._flushed
        if flushed is not None and not self._sending and not self._holds():
            flushed.set()

    def _on_loop(
        self, callback: Any, *args: Any, context: contextvars.Context | None = None
    ) -> None:
        # Instances may stand for processes on loops of their own, in other threads.
        loop = self._loop
        assert loop is not None
        if _running_loop() is loop:
            loop.call_soon(callback, *args, context=context)
        else:
            loop.call_soon_threadsafe(callback, *args, context=context)


def _trigger(purgatory: Purgatory[Any], key: Key, value: Value | None) -> int:
    if value is None:
        return purgatory.check_and_complete(key)
    return purgatory.advance(key, value)


def _traceparent() -> str | None:
    """The W3C traceparent a trigger made here carries: the current span's if sampled."""
    # No span can be current before OpenTelemetry's API is imported: then nothing
    # is carried, and nothing of OpenTelemetry is imported here.
    if sys.modules.get("opentelemetry.trace") is None:
        return None
    from .tracing import _sampled_traceparent

    return _sampled_traceparent()


def _event(owner: LocalTriggers, name: str) -> asyncio.Event:
    # One event per wait in progress, shared by every waiter until it is set.
    event: asyncio.Event | None = getattr(owner, name)
    if event is None or event.is_set():
        event = asyncio.Event()
        setattr(owner, name, event)
    return event


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
