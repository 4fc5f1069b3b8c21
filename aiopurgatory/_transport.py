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
    "Key",
    "Triggers",
    "TriggersStatistics",
    "Value",
    "check_key",
    "check_value",
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
