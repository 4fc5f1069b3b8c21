"""OpenTelemetry metrics for purgatories: observable instruments read at collection time.

:class:`PurgatoryInstruments` creates asynchronous (observable) instruments
whose callbacks read :meth:`~aiopurgatory.Purgatory.statistics` of the
purgatories registered with it whenever the SDK collects metrics. Nothing is
recorded per operation, so the purgatory's hot path pays nothing. It depends
only on ``opentelemetry-api``: with no SDK configured the instruments are no-ops.

Example::

    from aiopurgatory.metrics.otel import PurgatoryInstruments

    instruments = PurgatoryInstruments()   # uses the global MeterProvider
    instruments.register(produce_purgatory)

Instruments (attribute ``purgatory`` = the purgatory's name):

* ``aiopurgatory.purgatory.size`` (ObservableGauge, ``{entry}``): entries in
  all watch lists (``watched``).
* ``aiopurgatory.pending_operations`` (ObservableGauge, ``{operation}``):
  operations watched and not finished, all in the timer (``pending``; Kafka's
  ``NumDelayedOperations``).
* ``aiopurgatory.watch_keys`` (ObservableGauge, ``{key}``): keys with a
  non-empty watch list.
* ``aiopurgatory.operations`` (ObservableCounter, ``{operation}``, extra
  attribute ``outcome``): running totals of finished operations.
* ``aiopurgatory.advances`` (ObservableCounter, ``{advance}``): watermark
  advances, the :meth:`~aiopurgatory.Purgatory.advance` calls that raised a
  key's watermark.
* ``aiopurgatory.operation.wait.sum`` (ObservableCounter, ``s``, extra attribute
  ``outcome``): the running total of the waits of finished operations (with
  ``aiopurgatory.operations``, the mean wait over any interval).
* ``aiopurgatory.operation.wait.quantile`` (ObservableGauge, ``s``, extra
  attributes ``outcome`` and ``quantile`` = ``0.5``, ``0.9``, ``0.99``,
  ``0.999``, ``1``): percentiles of the waits of the operations that finished
  since the previous collection, read from the purgatory's histograms.
* ``aiopurgatory.expiry.lateness.quantile`` (ObservableGauge, ``s``, extra
  attribute ``quantile``): the same for how late expiries fired.

The OpenTelemetry API has no asynchronous histogram instrument: a ``Histogram``
is fed by ``record()`` calls, which would be one Python call per operation on
the loop. The purgatory's own histograms are always recorded in the core; this
adapter reads them at collection time and reports their percentiles and sums
(see ``docs/metrics.md``). The Prometheus collector exports the full histograms.

The names follow the Prometheus names of :mod:`aiopurgatory.metrics.prometheus`
(dots for underscores, no ``_total``), so that exporters translating OpenTelemetry
to Prometheus land on the same or closely related names.

Needs the ``otel`` extra: ``pip install 'aiopurgatory[otel]'``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

try:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation, get_meter
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ImportError(
        "aiopurgatory.metrics.otel needs opentelemetry-api: pip install 'aiopurgatory[otel]'"
    ) from exc

from .. import Histogram, Outcome, Purgatory, PurgatoryHistograms
from ._registry import (
    ADVANCES,
    GAUGES,
    Gauge,
    PurgatorySet,
    Registrations,
    check_type,
    gauge_value,
    outcome_values,
)

__all__ = ["METER_NAME", "QUANTILES", "PurgatoryInstruments"]

#: The instrumentation scope (meter) name the instruments are created under.
METER_NAME = "aiopurgatory"

#: The quantiles reported by the ``*.quantile`` gauges (1 is the maximum).
QUANTILES = (0.5, 0.9, 0.99, 0.999, 1.0)


def _quantiles(histogram: Histogram, attributes: dict[str, str]) -> list[Observation]:
    if not histogram.count:
        return []  # nothing finished in the interval: no value rather than NaN
    return [
        Observation(histogram.quantile(q), {**attributes, "quantile": f"{q:g}"}) for q in QUANTILES
    ]


class PurgatoryInstruments(Registrations):
    """OpenTelemetry observable instruments reporting registered purgatories.

    The instruments are created once, in the constructor; purgatories can be
    registered and unregistered at any time. They are held by weak references
    and read from whatever thread collects metrics (each value read is exact;
    values of one collection may be a few operations apart). A closed purgatory
    keeps reporting its final totals until unregistered or garbage-collected.

    Args:
        purgatories: purgatories to register at once (see :meth:`register`).
        meter_provider: the ``MeterProvider`` to create the instruments with;
            default: the global one (``opentelemetry.metrics.get_meter_provider()``).

    Raises:
        TypeError: an element of ``purgatories`` is not a Purgatory.
        ValueError: two purgatories have the same name.
    """

    def __init__(
        self,
        purgatories: Iterable[Purgatory[Any]] = (),
        *,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        check_type(
            "meter_provider", meter_provider, MeterProvider, "an opentelemetry MeterProvider"
        )
        from .. import __version__

        self._purgatories = PurgatorySet(purgatories)
        meter = get_meter(METER_NAME, __version__, meter_provider=meter_provider)
        for gauge in GAUGES:
            meter.create_observable_gauge(
                gauge.otel_name,
                callbacks=[self._observer(gauge)],
                unit=gauge.unit,
                description=gauge.description,
            )
        meter.create_observable_counter(
            "aiopurgatory.operations",
            callbacks=[self._observe_operations],
            unit="{operation}",
            description="Operations finished, by outcome (running total).",
        )
        meter.create_observable_counter(
            ADVANCES.otel_name,
            callbacks=[self._observer(ADVANCES)],
            unit=ADVANCES.unit,
            description=ADVANCES.description,
        )
        # The histograms' previous reading per purgatory name, for the interval
        # quantiles (collections may come from several threads: a lock).
        self._previous: dict[str, PurgatoryHistograms] = {}
        self._previous_lock = threading.Lock()
        meter.create_observable_counter(
            "aiopurgatory.operation.wait.sum",
            callbacks=[self._observe_wait_sums],
            unit="s",
            description="Total wait of finished operations, by outcome (running total).",
        )
        meter.create_observable_gauge(
            "aiopurgatory.operation.wait.quantile",
            callbacks=[self._observe_wait_quantiles],
            unit="s",
            description="Wait percentiles of the operations finished since the last collection.",
        )
        meter.create_observable_gauge(
            "aiopurgatory.expiry.lateness.quantile",
            callbacks=[self._observe_lateness_quantiles],
            unit="s",
            description="Lateness percentiles of the expiries since the last collection.",
        )

    def _observer(self, gauge: Gauge) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(gauge_value(stats, gauge), {"purgatory": stats.name})
                for stats in self._purgatories.snapshot()
            ]

        return observe

    def _intervals(self, key: str) -> list[PurgatoryHistograms]:
        # The change since the previous reading of the same gauge; the first
        # reading covers everything since the purgatory was created.
        intervals = []
        with self._previous_lock:
            for histograms in self._purgatories.histograms():
                name = f"{key}:{histograms.name}"
                previous = self._previous.get(name)
                self._previous[name] = histograms
                try:
                    interval = histograms if previous is None else histograms - previous
                except ValueError:  # a new purgatory of the same name (or reset)
                    interval = histograms
                intervals.append(interval)
        return intervals

    def _observe_wait_sums(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(
                histograms.wait(outcome).sum,
                {"purgatory": histograms.name, "outcome": outcome.value},
            )
            for histograms in self._purgatories.histograms()
            for outcome in Outcome
        ]

    def _observe_wait_quantiles(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            observation
            for histograms in self._intervals("wait")
            for outcome in Outcome
            for observation in _quantiles(
                histograms.wait(outcome), {"purgatory": histograms.name, "outcome": outcome.value}
            )
        ]

    def _observe_lateness_quantiles(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            observation
            for histograms in self._intervals("lateness")
            for observation in _quantiles(histograms.lateness, {"purgatory": histograms.name})
        ]

    def _observe_operations(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(count, {"purgatory": stats.name, "outcome": outcome})
            for stats in self._purgatories.snapshot()
            for outcome, count in outcome_values(stats)
        ]


# dir() shows the public API, not the names the module uses.
from .._namespace import public_dir as _public_dir  # noqa: E402

__dir__ = _public_dir(__name__, __all__)
