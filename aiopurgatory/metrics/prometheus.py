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
* ``aiopurgatory_delayed_operations`` (gauge): operations pending in the timer
  (``delayed``).
* ``aiopurgatory_pending_operations`` (gauge): operations watched and not finished.
* ``aiopurgatory_watch_keys`` (gauge): keys with a non-empty watch list.
* ``aiopurgatory_operations_total`` (counter, extra label ``outcome``): operations
  finished as ``completed``, ``expired``, ``cancelled`` or ``failed``.
* ``aiopurgatory_operation_wait_seconds`` (histogram, extra label ``outcome``):
  how long finished operations waited, from watch to finish.
* ``aiopurgatory_expiry_lateness_seconds`` (histogram): how late each expiry
  fired after its deadline.

The histograms have the standard ``_bucket{le=...}``, ``_sum`` and ``_count``
series, with the fixed edges of :data:`HISTOGRAM_EDGES` (100 us to 5 min, and
``+Inf``), read from :meth:`~aiopurgatory.Purgatory.histograms` at scrape time:
each edge is an edge of the purgatory's fine buckets, so the counts are exact.

Needs the ``prometheus`` extra: ``pip install 'aiopurgatory[prometheus]'``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

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
from ._registry import GAUGES, HISTOGRAM_EDGES, PurgatorySet, gauge_value, outcome_values

__all__ = ["HISTOGRAM_EDGES", "PurgatoryCollector"]

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


class PurgatoryCollector(Collector):
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
        if registry is not None and not isinstance(registry, CollectorRegistry):
            raise TypeError(
                f"registry must be a prometheus_client CollectorRegistry or None, "
                f"got {type(registry).__name__}"
            )
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

    def register(self, purgatory: Purgatory[Any]) -> None:
        """Report ``purgatory`` from the next scrape on. Idempotent.

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
        for stats in snapshot:
            for family, gauge in gauges:
                family.add_metric([stats.name], gauge_value(stats, gauge))
            for outcome, count in outcome_values(stats):
                counter.add_metric([stats.name, outcome], count)
        return [*(family for family, _ in gauges), counter]
