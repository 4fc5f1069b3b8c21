"""The Triggers protocol: one interface for every transport of triggers between processes.

Application code that parks operations and wakes them from other processes is
written against :class:`Triggers`; each transport implements it:
:class:`aiopurgatory.redis.RedisTriggers` (Redis pub/sub and stored watermarks),
the PostgreSQL transport, and :class:`aiopurgatory.LocalTriggers` (in memory:
instances sharing a bus stand for processes; it runs on virtual time, so it is
what tests hand the application).

The keys and values that may cross between processes are checked here, once for
every transport, so a key the Redis transport would refuse is refused by the
in-memory one too (a test on it catches what production would).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from types import TracebackType
from typing import Final, Protocol, Self, TypeAlias, runtime_checkable

from ._operation import DelayedOperation, Outcome

__all__ = [
    "MAX_EXACT_INT",
    "Batch",
    "Key",
    "MalformedMessage",
    "Triggers",
    "TriggersStatistics",
    "Value",
    "check_key",
    "check_value",
    "key_from_wire",
    "sender_field",
    "split_sender",
    "value_text",
    "wire_keys",
]

#: A key that can cross between processes: a str, bytes or int (not bool).
Key: TypeAlias = str | bytes | int
#: A watermark value: an int or float, finite, within +-2**53.
Value: TypeAlias = int | float

#: Stored watermarks are compared as doubles (Redis's Lua, PostgreSQL's
#: double precision): larger ints would compare inexactly, so they are refused.
MAX_EXACT_INT: Final = 2**53


def check_key(key: object, argument: str = "key") -> Key:
    """``key`` if it can cross the wire (str, bytes or int, not bool), else TypeError."""
    if isinstance(key, str | bytes) or (isinstance(key, int) and not isinstance(key, bool)):
        return key
    raise TypeError(
        f"{argument} must be a str, bytes or int to be sent to other processes, "
        f"got {type(key).__name__}"
    )


def check_value(value: object, argument: str = "value") -> Value:
    """``value`` if it is a finite int or float within +-2**53, else TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{argument} must be an int or float, got {type(value).__name__}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{argument} must be finite, got {value!r}")
    elif not -MAX_EXACT_INT <= value <= MAX_EXACT_INT:
        raise ValueError(
            f"{argument} must be within +-2**53 (watermarks are compared as doubles), got {value!r}"
        )
    return value


# -- what every transport's wire format shares (sans-IO) ------------------------


class MalformedMessage(ValueError):
    """A message or payload that this version cannot read (nothing of it is applied)."""


class Batch:
    """Triggers gathered for one message: check keys, and the highest value per advanced key."""

    __slots__ = ("advances", "checks")

    def __init__(self) -> None:
        # dicts as ordered sets: a key triggered twice is sent once.
        self.checks: dict[Key, None] = {}
        self.advances: dict[Key, Value] = {}

    def __len__(self) -> int:
        return len(self.checks) + len(self.advances)

    def check(self, key: Key) -> None:
        self.checks[key] = None

    def advance(self, key: Key, value: Value) -> None:
        advances = self.advances
        current = advances.get(key)
        if current is None or value > current:
            advances[key] = value

    def merge(self, newer: Batch) -> None:
        """Add ``newer``'s triggers to this batch (it was gathered after this one)."""
        self.checks.update(newer.checks)
        for key, value in newer.advances.items():
            self.advance(key, value)

    def split(self, size: int) -> list[Batch]:
        """This batch as batches of at most ``size`` triggers each (itself if it fits)."""
        if len(self) <= size:
            return [self]
        parts: list[Batch] = []
        part = Batch()
        for key in self.checks:
            if len(part) == size:
                parts.append(part)
                part = Batch()
            part.checks[key] = None
        for key, value in self.advances.items():
            if len(part) == size:
                parts.append(part)
                part = Batch()
            part.advances[key] = value
        parts.append(part)
        return parts


def key_from_wire(item: object) -> Key:
    """A key as JSON carries it back (a str, an int, or ``{"b": latin-1 text}`` for bytes)."""
    kind = type(item)
    if kind is str or kind is int:
        return item  # type: ignore[return-value]
    if kind is dict and len(item) == 1:  # type: ignore[arg-type]
        text = item.get("b")  # type: ignore[attr-defined]
        if type(text) is str:
            try:
                return text.encode("latin-1")
            except UnicodeEncodeError:
                pass
    raise MalformedMessage(f"not a key: {item!r:.80}")


def sender_field(instance: str, traceparent: str | None) -> str:
    """A message's sender field from ``instance``, carrying ``traceparent`` if any."""
    return instance if traceparent is None else f"{instance} {traceparent}"


def split_sender(sender: str) -> tuple[str, str | None]:
    """``(instance id, traceparent or None)`` from a message's (a payload's) sender field."""
    instance, space, traceparent = sender.partition(" ")
    return (instance, traceparent) if space else (sender, None)


def value_text(value: Value) -> str:
    """``value`` as decimal text, which is JSON too: an int's digits, a float's ``repr``.

    An int or float subclass (an ``IntEnum``) is written as its plain value.
    """
    if type(value) is int or type(value) is float:
        return repr(value)
    return float.__repr__(value) if isinstance(value, float) else int.__repr__(value)


def wire_keys(keys: Iterable[Hashable]) -> list[Key]:
    """The keys of ``keys`` that can cross the wire, in order (others are skipped)."""
    return [
        key
        for key in keys
        if isinstance(key, str | bytes) or (isinstance(key, int) and not isinstance(key, bool))
    ]


@runtime_checkable
class TriggersStatistics(Protocol):
    """What every transport's ``statistics()`` snapshot has (each adds its own counters).

    Attributes:
        purgatory: the local purgatory's name, or None for a publisher only.
        connected: the transport can deliver and receive triggers now.
        triggers: ``check_and_complete``/``advance`` calls made on the instance.
        pending: triggers made here and not yet delivered to the other processes.
        completed: local operations completed by other processes' triggers and
            by catch-up reads of stored watermarks.
    """

    @property
    def purgatory(self) -> str | None: ...
    @property
    def connected(self) -> bool: ...
    @property
    def triggers(self) -> int: ...
    @property
    def pending(self) -> int: ...
    @property
    def completed(self) -> int: ...


@runtime_checkable
class Triggers(Protocol):
    """A purgatory's triggers shared with other processes, whatever carries them.

    Every implementation keeps these promises:

    * ``check_and_complete(key)`` and ``advance(key, value)`` apply to the local
      purgatory at once (returning how many of its operations they completed)
      and reach every other process on the same transport and channel; they
      never block and never wait for the network.
    * Watermarks are stored by the transport (an atomic max): a process that
      missed a message, or watches after the advance, catches up by reading them.
    * ``await watch(op, keys)`` is :meth:`aiopurgatory.Purgatory.watch` caught
      up with that stored state: a watch whose condition the stored watermarks
      already meet completes, whatever its timeout (0 included). Cancelling the
      awaiting task cancels the operation.
    * ``await flush()`` returns once every trigger made so far has been delivered.
    * ``async with`` starts the transport; ``aclose()`` (idempotent) delivers what
      is pending within the transport's bound and stops it.
    * A transport that cannot run on a virtual-time loop
      (:mod:`aiopurgatory.simulation`) refuses it at once, with an error that says so.

    Keys are str, bytes or int (not bool); values int or float, finite, within
    +-2**53. Anything else is refused with a TypeError or ValueError, before
    anything is applied or sent.
    """

    def check_and_complete(self, key: Key) -> int:
        """Check ``key``'s watchers here at once, and in every other process."""
        ...

    def advance(self, key: Key, value: Value) -> int:
        """Raise ``key``'s watermark to ``value`` here at once, in the store and everywhere."""
        ...

    async def watch(
        self, op: DelayedOperation, keys: Iterable[Hashable] | Mapping[Hashable, float]
    ) -> Outcome:
        """Watch ``op`` in the local purgatory, caught up with the stored watermarks."""
        ...

    async def fetch_watermark(self, key: Key) -> Value | None:
        """The watermark of ``key`` the transport stores, or None."""
        ...

    async def flush(self) -> None:
        """Wait until every trigger made so far has been delivered."""
        ...

    def statistics(self) -> TriggersStatistics:
        """A snapshot of the transport's counters."""
        ...

    async def aclose(self) -> None:
        """Deliver what is pending (within the transport's bound) and stop. Idempotent."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
