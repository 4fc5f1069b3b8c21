"""The set of purgatories an adapter reports on: weakly held, readable from any thread.

Metrics are collected on another thread than the purgatories' event loop (the
Prometheus HTTP server thread, the OpenTelemetry export thread), while purgatories
are registered and dropped on the loop. A lock guards the name -> weak reference
map. Dead references are pruned lazily under that lock rather than by a weakref
callback: a callback can run from the garbage collector at any allocation,
including one made while this thread holds the lock.

Reading ``statistics()`` from another thread takes no lock in the purgatory: each
value is a plain ``int`` read atomically under the GIL, so a snapshot is made of
valid values, possibly from instants a few operations apart.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Generic, NamedTuple, TypeVar

from .. import Outcome, Purgatory, PurgatoryHistograms, PurgatoryStatistics

__all__ = [
    "ADVANCES",
    "GAUGES",
    "HISTOGRAM_EDGES",
    "Gauge",
    "PurgatorySet",
    "Registrations",
    "WeakRegistry",
    "check_type",
    "gauge_value",
    "outcome_values",
]

#: The fixed ``le`` edges (seconds) of the exported histograms, coarse enough for a
#: dashboard: 1, 2.5 and 5 times powers of ten from 100 us to 10 s, then 30 s, 1 min
#: and 5 min (purgatory timeouts are typically 0.5 s to 5 min), and +Inf. Each is
#: an edge of the core's fine buckets, so every cumulative count is exact.
HISTOGRAM_EDGES: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    float("inf"),
)


class Gauge(NamedTuple):
    """One gauge both adapters export: its names, unit, help text and source field."""

    prometheus_name: str
    otel_name: str
    unit: str
    description: str
    field: str  # the PurgatoryStatistics attribute it reports


GAUGES = (
    Gauge(
        "aiopurgatory_purgatory_size",
        "aiopurgatory.purgatory.size",
        "{entry}",
        "Entries in all watch lists of pending operations (Kafka PurgatorySize).",
        "watched",
    ),
    Gauge(
        "aiopurgatory_pending_operations",
        "aiopurgatory.pending_operations",
        "{operation}",
        "Operations watched and not yet finished, all in the timer "
        "(Kafka NumDelayedOperations; what max_pending limits).",
        "pending",
    ),
    Gauge(
        "aiopurgatory_watch_keys",
        "aiopurgatory.watch_keys",
        "{key}",
        "Keys with a non-empty watch list.",
        "keys",
    ),
)


#: The running total of watermark advances both adapters export (a counter): the
#: :meth:`~aiopurgatory.Purgatory.advance` calls that raised a key's watermark
#: (``PurgatoryStatistics.advances``). Each checked only the operations it reached.
ADVANCES = Gauge(
    "aiopurgatory_advances",
    "aiopurgatory.advances",
    "{advance}",
    "Watermark advances: Purgatory.advance calls that raised a key's watermark "
    "(running total since the purgatory was created).",
    "advances",
)


def gauge_value(stats: PurgatoryStatistics, gauge: Gauge) -> int:
    """The value ``gauge`` reports for one purgatory."""
    value: int = getattr(stats, gauge.field)
    return value


def outcome_values(stats: PurgatoryStatistics) -> list[tuple[str, int]]:
    """``(outcome, running total)`` of one purgatory, in :class:`Outcome` order."""
    # The statistics fields are named after the outcome values.
    return [(outcome.value, getattr(stats, outcome.value)) for outcome in Outcome]


_K = TypeVar("_K")
_T = TypeVar("_T")


class WeakRegistry(Generic[_K, _T]):
    """Objects by key, held by weak references: what an adapter reports on.

    ``key(obj)`` checks an object (raising TypeError) and gives its key; two live
    objects with one key would be two series with the same labels, invalid in
    Prometheus and silently merged in OpenTelemetry: ``clash(key)`` says so.
    """

    __slots__ = ("_clash", "_key", "_lock", "_refs")

    def __init__(self, key: Callable[[_T], _K], clash: Callable[[_K], str]) -> None:
        self._key = key
        self._clash = clash
        self._lock = threading.Lock()
        self._refs: dict[_K, weakref.ref[_T]] = {}

    def register(self, obj: _T) -> None:
        """Hold ``obj`` (idempotent); ValueError if another live one has its key."""
        key = self._key(obj)
        with self._lock:
            ref = self._refs.get(key)
            current = None if ref is None else ref()
            if current is obj:
                return
            if current is not None:
                raise ValueError(self._clash(key))
            self._refs[key] = weakref.ref(obj)

    def unregister(self, obj: _T) -> bool:
        """Forget ``obj``; True iff it was held."""
        key = self._key(obj)
        with self._lock:
            ref = self._refs.get(key)
            if ref is None or ref() is not obj:
                return False
            del self._refs[key]
            return True

    def live(self) -> list[_T]:
        """The objects still alive, in registration order (pruning dead references)."""
        live: list[_T] = []
        with self._lock:
            dead = []
            for key, ref in self._refs.items():
                obj = ref()
                if obj is None:
                    dead.append(key)
                else:
                    live.append(obj)
            for key in dead:
                del self._refs[key]
        return live


def _purgatory_name(purgatory: Purgatory[Any]) -> str:
    if not isinstance(purgatory, Purgatory):
        raise TypeError(
            f"purgatory must be an aiopurgatory.Purgatory, got {type(purgatory).__name__}"
        )
    return purgatory.name


def _name_clash(name: str) -> str:
    hint = (
        " (the default name): name each one, e.g. Purgatory('produce')"
        if name == "purgatory"
        else ": give each purgatory its own name"
    )
    return f"purgatory: another purgatory named {name!r} is already registered{hint}"


class PurgatorySet:
    """Registered purgatories by name, held by weak references."""

    __slots__ = ("_registry",)

    def __init__(self, purgatories: Iterable[Purgatory[Any]] = ()) -> None:
        self._registry: WeakRegistry[str, Purgatory[Any]] = WeakRegistry(
            _purgatory_name, _name_clash
        )
        for purgatory in purgatories:
            self.register(purgatory)

    def register(self, purgatory: Purgatory[Any]) -> None:
        self._registry.register(purgatory)

    def unregister(self, purgatory: Purgatory[Any]) -> bool:
        return self._registry.unregister(purgatory)

    def purgatories(self) -> list[Purgatory[Any]]:
        """The live registered purgatories, sorted by name (pruning dead references)."""
        return sorted(self._registry.live(), key=lambda p: p.name)

    def snapshot(self) -> list[PurgatoryStatistics]:
        """``statistics()`` of every live registered purgatory, sorted by name."""
        # Outside the lock: statistics() is cheap, but nothing needs to wait on it.
        return [purgatory.statistics() for purgatory in self.purgatories()]

    def histograms(self) -> list[PurgatoryHistograms]:
        """``histograms()`` of every live registered purgatory, sorted by name."""
        return [purgatory.histograms() for purgatory in self.purgatories()]


def check_type(name: str, value: object, kind: type, what: str) -> None:
    """Raise TypeError naming ``name`` unless ``value`` is None or a ``kind``."""
    if value is not None and not isinstance(value, kind):
        raise TypeError(f"{name} must be {what} or None, got {type(value).__name__}")


class Registrations:
    """``register``, ``unregister`` and ``purgatories`` of an adapter, over its
    :class:`PurgatorySet` (``self._purgatories``, set by the adapter)."""

    __slots__ = ()
    _purgatories: PurgatorySet

    def register(self, purgatory: Purgatory[Any]) -> None:
        """Report ``purgatory`` from the next collection (scrape) on. Idempotent.

        Raises:
            TypeError: ``purgatory`` is not a Purgatory.
            ValueError: another live purgatory with the same name is registered.
        """
        self._purgatories.register(purgatory)

    def unregister(self, purgatory: Purgatory[Any]) -> bool:
        """Stop reporting ``purgatory``.

        Returns:
            True iff it was registered.

        Raises:
            TypeError: ``purgatory`` is not a Purgatory.
        """
        return self._purgatories.unregister(purgatory)

    @property
    def purgatories(self) -> list[Purgatory[Any]]:
        """The live registered purgatories, sorted by name."""
        return self._purgatories.purgatories()
