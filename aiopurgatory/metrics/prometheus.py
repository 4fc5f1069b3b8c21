"""Prometheus metrics for purgatories, read at scrape time.

:class:`PurgatoryCollector` is a ``prometheus_client`` custom collector. It keeps
weak references to the purgatories registered with it and, on every scrape,
turns their :meth:`~aiopurgatory.Purgatory.statistics` into metric families.
Nothing is updated per operation, so the purgatory's hot path pays nothing,
and a purgatory that is garbage-collected simply stops being reported.

Example::

    from prometheus_client import start_http_server
    from aiopurgatory.metrics.prometheus import PurgatoryCollector

    collector = PurgatoryCollector()      # registered with prometheus_client.REGISTRY
    collector.register(produce_purgatory)
    collector.register(fetch_purgatory)
    start_http_server(9100)

Exposed families (label ``purgatory`` = the purgatory's name):

* ``aiopurgatory_purgatory_size`` (gauge): entries in all watch lists (``watched``).
* ``aiopurgatory_pending_operations`` (gauge): operations watched and not finished,
  all in the timer (``pending``; Kafka's ``NumDelayedOperations``).
* ``aiopurgatory_watch_keys`` (gauge): keys with a non-empty watch list.
* ``aiopurgatory_operations_total`` (counter, extra label ``outcome``): operations
  finished as ``completed``, ``expired``, ``cancelled`` or ``failed``.
* ``aiopurgatory_advances_total`` (counter): watermark advances, the
  :meth:`~aiopurgatory.Purgatory.advance` calls that raised a key's watermark.
* ``aiopurgatory_operation_wait_seconds`` (histogram, extra label ``outcome``):
  how long finished operations waited, from watch to finish.
* ``aiopurgatory_expiry_lateness_seconds`` (histogram): how late each expiry
  fired after its deadline.

The histograms have the standard ``_bucket{le=...}``, ``_sum`` and ``_count``
series, with the fixed edges of :data:`HISTOGRAM_EDGES` (100 us to 5 min, and
``+Inf``), read from :meth:`~aiopurgatory.Purgatory.histograms` at scrape time:
each edge is an edge of the purgatory's fine buckets, so the counts are exact.

:class:`RedisTriggersCollector` does the same for :class:`aiopurgatory.redis.RedisTriggers`
(labels ``channel`` and ``purgatory``, empty for a publisher only):
``aiopurgatory_redis_connected`` and ``aiopurgatory_redis_pending_triggers``
(gauges), ``aiopurgatory_redis_<counter>_total`` for each running total of
:class:`~aiopurgatory.redis.RedisTriggersStatistics` (``reconnects``,
``connection_errors``, ``triggers``, ``published``, ``publish_errors``,
``received``, ``echoes``, ``malformed``, ``applied``, ``completed``, ``resyncs``,
``reads``, ``read_errors``),
and ``aiopurgatory_redis_last_error_info`` (value 1, label ``error``: the type of
the last error, absent while there was none).

Needs the ``prometheus`` extra: ``pip install 'aiopurgatory[prometheus]'``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

try:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ImportError(
        "aiopurgatory.metrics.prometheus needs prometheus-client: "
        "pip install 'aiopurgatory[prometheus]'"
    ) from exc

from .. import Histogram, Outcome, Purgatory, PurgatoryHistograms, PurgatoryStatistics
from ._registry import (
    ADVANCES,
    GAUGES,
    HISTOGRAM_EDGES,
    PurgatorySet,
    Registrations,
    WeakRegistry,
    check_type,
    gauge_value,
    outcome_values,
)

if TYPE_CHECKING:
    from ..redis import RedisTriggers, RedisTriggersStatistics

__all__ = ["HISTOGRAM_EDGES", "PurgatoryCollector", "RedisTriggersCollector"]

# prometheus_client appends the _total suffix to counter samples.
_COUNTER = "aiopurgatory_operations"
_COUNTER_HELP = "Operations finished, by outcome (running total since the purgatory was created)."
_WAIT = "aiopurgatory_operation_wait_seconds"
_WAIT_HELP = "How long finished operations waited in the purgatory (watch to finish), by outcome."
_LATENESS = "aiopurgatory_expiry_lateness_seconds"
_LATENESS_HELP = "How late each expiry fired after the operation's deadline."
# The le label values, formatted as prometheus_client formats its own ("0.005",
# "1.0", "+Inf"): Python's repr gives the same digits for these edges.
_LE = ["+Inf" if edge == float("inf") else repr(edge) for edge in HISTOGRAM_EDGES]


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    return list(zip(_LE, map(float, histogram.cumulative(HISTOGRAM_EDGES)), strict=True))


class PurgatoryCollector(Registrations, Collector):
    """A Prometheus collector reporting the statistics of registered purgatories.

    Purgatories are held by weak references and read only when the registry is
    collected (a scrape), from whatever thread does the scrape. Each value read
    is exact; values of one scrape may be a few operations apart, as with any
    lock-free scrape of a live process. A closed purgatory keeps reporting its
    final totals until it is unregistered or garbage-collected.

    Args:
        purgatories: purgatories to register at once (see :meth:`register`).
        registry: the ``prometheus_client`` registry to register this collector
            with (default: the global ``REGISTRY``); None to register it yourself.

    Raises:
        TypeError: an element of ``purgatories`` is not a Purgatory, or
            ``registry`` is not a CollectorRegistry.
        ValueError: two purgatories have the same name (name them:
            ``Purgatory("produce")``); the registry already has a collector of
            these metrics (one collector per registry: register every
            purgatory with it).
    """

    def __init__(
        self,
        purgatories: Iterable[Purgatory[Any]] = (),
        *,
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        check_type("registry", registry, CollectorRegistry, "a prometheus_client CollectorRegistry")
        self._purgatories = PurgatorySet(purgatories)
        if registry is not None:
            try:
                registry.register(self)
            except ValueError:  # prometheus_client's DuplicateTimeseries lists every series
                raise ValueError(
                    "registry already has a collector of aiopurgatory's metrics: use one "
                    "PurgatoryCollector per registry and register every purgatory with it "
                    "(collector.register(purgatory))"
                ) from None

    def describe(self) -> list[Metric]:
        """The metric families this collector produces, without samples.

        ``CollectorRegistry.register`` uses it to detect name clashes without
        reading any purgatory.
        """
        return [*self._families(()), *self._histogram_families(())]

    def collect(self) -> list[Metric]:
        """Read every registered purgatory's statistics and histograms now (on scrape)."""
        return [
            *self._families(self._purgatories.snapshot()),
            *self._histogram_families(self._purgatories.histograms()),
        ]

    @staticmethod
    def _histogram_families(snapshot: Iterable[PurgatoryHistograms]) -> list[Metric]:
        wait = HistogramMetricFamily(_WAIT, _WAIT_HELP, labels=["purgatory", "outcome"])
        lateness = HistogramMetricFamily(_LATENESS, _LATENESS_HELP, labels=["purgatory"])
        for histograms in snapshot:
            for outcome in Outcome:
                histogram = histograms.wait(outcome)
                wait.add_metric(
                    [histograms.name, outcome.value], _buckets(histogram), histogram.sum
                )
            late = histograms.lateness
            lateness.add_metric([histograms.name], _buckets(late), late.sum)
        return [wait, lateness]

    @staticmethod
    def _families(snapshot: Iterable[PurgatoryStatistics]) -> list[Metric]:
        gauges = [
            (
                GaugeMetricFamily(gauge.prometheus_name, gauge.description, labels=["purgatory"]),
                gauge,
            )
            for gauge in GAUGES
        ]
        counter = CounterMetricFamily(_COUNTER, _COUNTER_HELP, labels=["purgatory", "outcome"])
        advances = CounterMetricFamily(
            ADVANCES.prometheus_name, ADVANCES.description, labels=["purgatory"]
        )
        for stats in snapshot:
            for family, gauge in gauges:
                family.add_metric([stats.name], gauge_value(stats, gauge))
            for outcome, count in outcome_values(stats):
                counter.add_metric([stats.name, outcome], count)
            advances.add_metric([stats.name], gauge_value(stats, ADVANCES))
        return [*(family for family, _ in gauges), counter, advances]


# RedisTriggersStatistics fields exported as counters (name, help).
_REDIS_COUNTERS = (
    ("reconnects", "Successful re-subscriptions after a lost connection."),
    ("connection_errors", "Connection attempts and connections to Redis that failed."),
    ("triggers", "check_and_complete/advance calls made in this process."),
    ("published", "Messages published (one per batch of coalesced triggers)."),
    ("publish_errors", "Attempts to send a batch that failed (the batch is retried)."),
    ("received", "Messages received from other processes."),
    ("echoes", "This process's own messages received back and skipped."),
    ("malformed", "Messages on the channel that could not be read (skipped)."),
    ("applied", "Triggers from other processes applied to the local purgatory."),
    ("completed", "Operations completed by triggers from other processes and by resyncs."),
    ("resyncs", "Times the stored watermarks of the watched keys were read and applied."),
    ("reads", "Round trips that read stored watermarks (watches, resyncs, fetches)."),
    ("read_errors", "Reads of stored watermarks that failed (each is retried)."),
    ("mismatches", "Publishers or subscribers of the channel found configured otherwise."),
)


class RedisTriggersCollector(Collector):
    """A Prometheus collector reporting the statistics of registered RedisTriggers.

    As :class:`PurgatoryCollector`: triggers are held by weak references and
    read at scrape time, from the scraping thread; nothing is counted on the hot
    path. Each series is labelled ``channel`` and ``purgatory`` (the local
    purgatory's name, empty for a publisher only).

    Args:
        triggers: RedisTriggers to register at once.
        registry: the registry to register with (default: the global
            ``REGISTRY``); None to register it yourself.

    Raises:
        TypeError: an element of ``triggers`` is not a RedisTriggers, or
            ``registry`` is not a CollectorRegistry.
        ValueError: two live triggers have the same channel and purgatory name.
    """

    def __init__(
        self,
        triggers: Iterable[RedisTriggers] = (),
        *,
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        check_type("registry", registry, CollectorRegistry, "a prometheus_client CollectorRegistry")
        self._triggers: WeakRegistry[tuple[str, str], RedisTriggers] = WeakRegistry(
            self._labels, self._clash
        )
        for one in triggers:
            self.register(one)
        if registry is not None:
            registry.register(self)

    @staticmethod
    def _labels(triggers: RedisTriggers) -> tuple[str, str]:
        from ..redis import RedisTriggers

        if not isinstance(triggers, RedisTriggers):
            raise TypeError(
                f"expected an aiopurgatory.redis.RedisTriggers, got {type(triggers).__name__}"
            )
        purgatory = triggers.purgatory
        return (triggers.channel, "" if purgatory is None else purgatory.name)

    @staticmethod
    def _clash(labels: tuple[str, str]) -> str:
        return (
            f"RedisTriggers for channel {labels[0]!r} and purgatory {labels[1]!r} "
            "are already registered"
        )

    def register(self, triggers: RedisTriggers) -> None:
        """Report ``triggers`` from the next scrape on. Idempotent.

        Raises:
            TypeError: ``triggers`` is not a RedisTriggers.
            ValueError: other live triggers with the same channel and purgatory
                name are registered.
        """
        self._triggers.register(triggers)

    def unregister(self, triggers: RedisTriggers) -> bool:
        """Stop reporting ``triggers``.

        Returns:
            True iff it was registered.

        Raises:
            TypeError: ``triggers`` is not a RedisTriggers.
        """
        return self._triggers.unregister(triggers)

    def _snapshot(self) -> list[RedisTriggersStatistics]:
        return sorted(
            (triggers.statistics() for triggers in self._triggers.live()),
            key=lambda stats: (stats.channel, stats.purgatory or ""),
        )

    def describe(self) -> list[Metric]:
        """The metric families this collector produces, without samples."""
        return self._families(())

    def collect(self) -> list[Metric]:
        """Read every registered RedisTriggers' statistics now (on scrape)."""
        return self._families(self._snapshot())

    @staticmethod
    def _families(snapshot: Iterable[RedisTriggersStatistics]) -> list[Metric]:
        labels = ["channel", "purgatory"]
        connected = GaugeMetricFamily(
            "aiopurgatory_redis_connected",
            "1 while the subscription (publisher only: the last command) to Redis is up.",
            labels=labels,
        )
        pending = GaugeMetricFamily(
            "aiopurgatory_redis_pending_triggers",
            "Triggers gathered and not yet sent to Redis.",
            labels=labels,
        )
        subscribed = GaugeMetricFamily(
            "aiopurgatory_redis_subscribed_partitions",
            "Partition channels subscribed now (those of the keys watched here).",
            labels=labels,
        )
        counters = [
            (
                CounterMetricFamily(f"aiopurgatory_redis_{field}", help_text, labels=labels),
                field,
            )
            for field, help_text in _REDIS_COUNTERS
        ]
        last_error = GaugeMetricFamily(
            "aiopurgatory_redis_last_error_info",
            "The type of the last error talking to Redis (1; absent while none).",
            labels=[*labels, "error"],
        )
        for stats in snapshot:
            values = [stats.channel, stats.purgatory or ""]
            connected.add_metric(values, 1.0 if stats.connected else 0.0)
            pending.add_metric(values, stats.pending)
            subscribed.add_metric(values, stats.subscribed)
            for family, field in counters:
                family.add_metric(values, getattr(stats, field))
            if stats.last_error is not None:
                last_error.add_metric([*values, stats.last_error.split(":", 1)[0]], 1.0)
        return [connected, pending, subscribed, *(family for family, _ in counters), last_error]


# dir() shows the public API, not the names the module uses.
from .._namespace import public_dir as _public_dir  # noqa: E402

__dir__ = _public_dir(__name__, __all__)
