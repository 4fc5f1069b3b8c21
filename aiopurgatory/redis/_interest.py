"""Interest: the partitions one subscription wants, as a sans-IO state machine.

No socket and no clock: :class:`Interest` is fed events (keys watched, a sweep
of the purgatory's keys, a (un)subscription answered, the connection lost or
renewed), each with the loop time as ``now`` where time matters, and returns
the actions the driver (:class:`~._subscriber.Subscriber`) carries out: read
some keys, resync every key, send the commands that wait, log a subscription
the server ended (:meth:`Interest.need`, called once per watch, returns the
same as plain values). The rules, which the stateful test
(``tests/redis/test_interest_stateful.py``) checks against a model:

* **One state per partition** (:class:`State`); a partition with no state is
  neither wanted nor subscribed, and nothing about it is in flight. A partition
  is *wanted* while a watched key is in it, and for ``linger`` seconds after its
  last one left (or after its last key watched through ``need`` without the
  sweep having seen it): short-lived keys do not subscribe and unsubscribe each time.
* **At most one command in flight per partition.** Redis answers a connection's
  commands in order, but a server may also end a subscription by itself (an
  ``unsubscribe`` nobody asked for); with one command in flight, the answer to
  a partition's command cannot be confused with anything but that. A change of
  mind while a command is in flight is remembered by the state
  (``ABANDONING``, ``RETURNING``) and acted on when the answer comes. (The one
  ambiguity left: the server's own ``unsubscribe`` crossing an UNSUBSCRIBE of
  ours is taken for its answer, and the real answer, if it comes after a new
  SUBSCRIBE, for the server's own: a needless resync, and the partition still
  ends subscribed. We know of no way a server ends a plain channel's
  subscription but closing the connection; a cluster's shard channels are
  watched by :mod:`._sharded`, which renews the whole subscription instead.)
* **Subscribed first, read next.** A key whose partition is not subscribed yet
  waits for the confirmation of its SUBSCRIBE, then is read *and checked* once
  (:class:`Read` with ``check``): nothing published in between slips through.
  A key watched while its partition is subscribed is read at once.
* **A subscription the server ended** (``LOST``) is subscribed again, and every
  key is resynced once that SUBSCRIBE is confirmed (not before: a resync before
  it could read a watermark and still miss a trigger published before the
  subscription is back).
* **A new connection** subscribes every wanted partition at once
  (:meth:`Interest.reconnecting`), and its confirmation asks for a resync
  (:meth:`Interest.connected`): what was published meanwhile was missed.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Final, NamedTuple, TypeAlias

from ._wire import Key, wire_keys

__all__ = [
    "RESYNC",
    "SEND",
    "Action",
    "Dropped",
    "Interest",
    "Read",
    "Resync",
    "Send",
    "State",
]


class State(enum.Enum):
    """Where one partition's subscription stands (no state: not wanted, not subscribed)."""

    #: Wanted; a SUBSCRIBE is to be sent.
    QUEUED = "queued"
    #: Wanted; its SUBSCRIBE is sent and not yet answered.
    SUBSCRIBING = "subscribing"
    #: Wanted and subscribed (the connection confirmed it).
    SUBSCRIBED = "subscribed"
    #: Wanted; the server ended its subscription: a SUBSCRIBE is to be sent, then a resync.
    LOST = "lost"
    #: Wanted; the SUBSCRIBE after a loss is sent: a resync once it is answered.
    RESUBSCRIBING = "resubscribing"
    #: Wanted again while its UNSUBSCRIBE is in flight: a SUBSCRIBE goes after its answer.
    RETURNING = "returning"
    #: Not wanted, still subscribed: an UNSUBSCRIBE is to be sent.
    LEAVING = "leaving"
    #: Not wanted; its UNSUBSCRIBE is sent and not yet answered.
    UNSUBSCRIBING = "unsubscribing"
    #: Not wanted any more while its SUBSCRIBE is in flight: an UNSUBSCRIBE goes after its answer.
    ABANDONING = "abandoning"


# Bound once: the states are compared by identity on the hot path (need, sweep).
QUEUED: Final = State.QUEUED
SUBSCRIBING: Final = State.SUBSCRIBING
SUBSCRIBED: Final = State.SUBSCRIBED
LOST: Final = State.LOST
RESUBSCRIBING: Final = State.RESUBSCRIBING
RETURNING: Final = State.RETURNING
LEAVING: Final = State.LEAVING
UNSUBSCRIBING: Final = State.UNSUBSCRIBING
ABANDONING: Final = State.ABANDONING

#: The states of a wanted partition (the others are leaving).
WANTED: Final = frozenset({QUEUED, SUBSCRIBING, SUBSCRIBED, LOST, RESUBSCRIBING, RETURNING})
#: The states with a command to send (:meth:`Interest.commands`).
_TO_SEND: Final = frozenset({QUEUED, LOST, LEAVING})


class Send:
    """Commands wait: the driver calls :meth:`Interest.commands` and sends them."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SEND"


class Resync:
    """Read and check every watched key: a subscription has just (re)started."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "RESYNC"


SEND: Final = Send()
RESYNC: Final = Resync()


class Read(NamedTuple):
    """Read these keys' stored watermarks (and, with ``check``, check each key once).

    Attributes:
        keys: the keys, in the order they were watched.
        check: their partition was subscribed just now (a plain trigger may
            have been missed before): check each key after the read.
    """

    keys: list[Key]
    check: bool


class Dropped(NamedTuple):
    """The server ended the subscription of a wanted partition (to log; it is
    subscribed again, see :attr:`State.LOST`).

    Attributes:
        partition: the partition.
    """

    partition: int


Action: TypeAlias = Read | Send | Resync | Dropped
_NOTHING: Final[tuple[Action, ...]] = ()


class Interest:
    """The wanted partitions of one subscription and where each stands (see the module).

    Args:
        partition_of: a key's partition.
        linger: seconds a partition stays wanted with no watched key in it.

    Raises:
        ValueError: ``linger`` is negative or not a number.
    """

    __slots__ = ("_count", "_idle", "_key_partition", "_linger", "_of", "_pending", "_state",
                 "_swept", "_waiting")  # fmt: skip

    def __init__(self, partition_of: Callable[[Key], int], *, linger: float) -> None:
        if not linger >= 0:  # NaN too
            raise ValueError(f"linger must be >= 0 seconds, got {linger!r}")
        self._of = partition_of
        self._linger = linger
        self._state: dict[int, State] = {}
        # An index of _state, kept for speed (16,384 partitions by default, a turn
        # of the keeper per new partition): the partitions whose state is in _TO_SEND.
        self._pending: set[int] = set()
        # The keys waiting for their partition's confirmation (partitions wanted
        # and not subscribed only), read and checked once it comes.
        self._waiting: dict[int, dict[Key, None]] = {}
        # The sweep's view: the purgatory's keys at the last sweep, the partition of
        # each, how many of them each partition holds, and since when a wanted
        # partition has held none (the loop time; released after linger).
        self._swept: set[Hashable] = set()
        self._key_partition: dict[Key, int] = {}
        self._count: dict[int, int] = {}
        self._idle: dict[int, float] = {}

    # -- queries ---------------------------------------------------------------------------

    def state(self, partition: int) -> State | None:
        """``partition``'s state, or None (neither wanted nor subscribed)."""
        return self._state.get(partition)

    @property
    def subscribed(self) -> int:
        """Partitions wanted and subscribed now (confirmed)."""
        return sum(1 for state in self._state.values() if state is SUBSCRIBED)

    def wanted(self) -> list[int]:
        """The wanted partitions, in no particular order."""
        return [n for n, state in self._state.items() if state in WANTED]

    def covers(self, keys: Iterable[Key]) -> bool:
        """The partitions of ``keys`` are all wanted and subscribed now."""
        of = self._of
        state = self._state
        return all(state.get(of(key)) is SUBSCRIBED for key in keys)

    # -- events: interest ------------------------------------------------------------------

    def need(self, keys: Iterable[Key], now: float) -> tuple[list[Key], bool]:
        """``keys`` were just watched (through ``RedisTriggers.watch``) at loop time ``now``.

        The hot path (a call per watch), so its actions are plain values rather
        than action objects: the keys to read now (without a check: their
        partition is subscribed), and whether commands now wait (:data:`SEND`).
        The others are read once their partition's SUBSCRIBE is confirmed.
        """
        of = self._of
        state = self._state
        count = self._count
        idle = self._idle
        ready: list[Key] = []
        send = False
        for key in keys:
            n = of(key)
            if n not in count:
                idle[n] = now  # released after linger unless the sweep finds its key
            current = state.get(n)
            if current is SUBSCRIBED:
                ready.append(key)
            elif current is LEAVING:  # its UNSUBSCRIBE not sent yet: keep the subscription
                state[n] = SUBSCRIBED
                self._pending.discard(n)
                ready.append(key)
            else:
                send |= self._wait(n, key, current)
        return ready, send

    def _wait(self, n: int, key: Key, current: State | None) -> bool:
        """``key`` waits for ``n``'s confirmation; True if a command is now to be sent."""
        waiting = self._waiting.get(n)
        if waiting is None:
            waiting = self._waiting[n] = {}
        waiting[key] = None
        if current is None:
            self._state[n] = QUEUED
            self._pending.add(n)
            return True
        if current is UNSUBSCRIBING:
            self._state[n] = RETURNING
        elif current is ABANDONING:
            self._state[n] = SUBSCRIBING
        return False

    def sweep(self, keys: set[Hashable], now: float) -> Sequence[Action]:
        """The purgatory's keys at loop time ``now``: want the partitions of new
        keys, release those idle for longer than ``linger``.

        The keys are compared with the last sweep's as sets (C loops); only those
        that came or went since are looked at one by one, so a sweep over many
        watched keys that did not change costs little. Returns :data:`SEND` if
        commands are now to be sent. ``keys`` is kept (not copied) until the next sweep.
        """
        swept = self._swept
        partition_of_key = self._key_partition
        count = self._count
        idle = self._idle
        for key in swept - keys:
            n = partition_of_key.pop(key, None)  # type: ignore[call-overload]
            if n is None:
                continue  # a key that cannot cross the wire
            left = count[n] - 1
            if left:
                count[n] = left
            else:
                del count[n]
                idle[n] = now
        of = self._of
        state = self._state
        send = False
        for key in wire_keys(keys - swept):
            n = partition_of_key[key] = of(key)
            count[n] = count.get(n, 0) + 1
            idle.pop(n, None)
            current = state.get(n)
            if current is SUBSCRIBED:
                continue
            if current is LEAVING:  # still subscribed: nothing to read
                state[n] = SUBSCRIBED
                self._pending.discard(n)
            else:
                send |= self._wait(n, key, current)
        self._swept = keys
        linger = self._linger
        for n in [n for n, since in idle.items() if now - since > linger]:
            del idle[n]
            send |= self._release(n)
        return (SEND,) if send else _NOTHING

    def _release(self, n: int) -> bool:
        """``n`` is no longer wanted; True if a command is now to be sent."""
        self._waiting.pop(n, None)
        current = self._state[n]
        if current is QUEUED or current is LOST:  # nothing sent: nothing to undo
            del self._state[n]
            self._pending.discard(n)
        elif current is SUBSCRIBED:
            self._state[n] = LEAVING
            self._pending.add(n)
            return True
        elif current is SUBSCRIBING or current is RESUBSCRIBING:
            self._state[n] = ABANDONING
        elif current is RETURNING:
            self._state[n] = UNSUBSCRIBING
        return False

    # -- events: the connection ------------------------------------------------------------

    def commands(self) -> tuple[list[int], list[int]]:
        """The partitions to unsubscribe and to subscribe now, each sorted; from
        here on their commands are taken as sent (in flight)."""
        leave: list[int] = []
        join: list[int] = []
        state = self._state
        for n in sorted(self._pending):
            current = state[n]
            if current is LEAVING:
                state[n] = UNSUBSCRIBING
                leave.append(n)
            else:
                state[n] = RESUBSCRIBING if current is LOST else SUBSCRIBING
                join.append(n)
        self._pending.clear()
        return leave, join

    def subscribe_answered(self, partition: int) -> Sequence[Action]:
        """The connection confirmed its SUBSCRIBE of ``partition``."""
        current = self._state.get(partition)
        if current is SUBSCRIBING:
            self._state[partition] = SUBSCRIBED
            keys = self._waiting.pop(partition, None)
            return [Read(list(keys), True)] if keys else _NOTHING
        if current is RESUBSCRIBING:
            self._state[partition] = SUBSCRIBED
            self._waiting.pop(partition, None)  # the resync reads and checks them
            return (RESYNC,)
        if current is ABANDONING:
            self._state[partition] = LEAVING
            self._pending.add(partition)
            return (SEND,)
        return _NOTHING  # nothing of ours was in flight: not ours to keep

    def unsubscribe_answered(self, partition: int) -> Sequence[Action]:
        """An ``unsubscribe`` of ``partition`` came: the answer to ours, or the server's own."""
        state = self._state
        current = state.get(partition)
        if current is UNSUBSCRIBING:
            del state[partition]
        elif current is RETURNING:
            state[partition] = QUEUED
            self._pending.add(partition)
            return (SEND,)
        elif current is SUBSCRIBED:  # the server's own: subscribe again, then resync
            state[partition] = LOST
            self._pending.add(partition)
            return [Dropped(partition), SEND]
        elif current is SUBSCRIBING or current is RESUBSCRIBING:
            # Ended before our SUBSCRIBE was served (answers come in order): that
            # SUBSCRIBE subscribes it again; a resync follows its answer.
            state[partition] = RESUBSCRIBING
            return [Dropped(partition)]
        elif current is LEAVING:  # gone already: no UNSUBSCRIBE to send
            del state[partition]
            self._pending.discard(partition)
        # QUEUED, LOST, ABANDONING (its SUBSCRIBE still to come) or none: nothing changes.
        return _NOTHING

    def disconnected(self) -> None:
        """The connection is gone: nothing is subscribed and nothing in flight; the
        wanted partitions wait for the next connection, the others are forgotten."""
        state = self._state
        for n, current in list(state.items()):
            if current in WANTED:
                state[n] = QUEUED
            else:
                del state[n]
        self._pending = set(state)

    def reconnecting(self) -> list[int]:
        """A new connection starts: the wanted partitions, which it subscribes at once
        (taken as in flight until :meth:`connected`)."""
        self.disconnected()
        self._pending.clear()
        state = self._state
        for n in state:
            state[n] = SUBSCRIBING
        return list(state)

    def connected(self) -> Sequence[Action]:
        """The new connection confirmed every partition :meth:`reconnecting` gave.

        Returns :data:`RESYNC` (what was published meanwhile was missed; the
        resync reads and checks every key, the waiting ones too) and
        :data:`SEND` if partitions wanted or released since wait for a command.
        """
        state = self._state
        for n, current in state.items():
            if current is SUBSCRIBING:
                state[n] = SUBSCRIBED
                self._waiting.pop(n, None)
            elif current is ABANDONING:
                state[n] = LEAVING
                self._pending.add(n)
        return (RESYNC, SEND) if self._pending else (RESYNC,)
