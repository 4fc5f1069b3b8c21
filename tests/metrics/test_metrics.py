"""Metrics adapters: Prometheus text exposition and OpenTelemetry observations.

A purgatory is driven on virtual time through every outcome; the exported values
are parsed back (Prometheus: ``generate_latest`` + ``prometheus_client.parser``;
OpenTelemetry: the SDK's ``InMemoryMetricReader``) and checked against the
numbers the scenario must produce.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
from typing import Any

import pytest
import structlog
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import aiopurgatory as ap
from aiopurgatory.metrics.otel import PurgatoryInstruments
from aiopurgatory.metrics.prometheus import PurgatoryCollector


class Op(ap.DelayedOperation):
    """Completes once ``ready`` is set; raises from ``try_complete`` if ``fail``."""

    def __init__(self, timeout: float, *, fail: bool = False) -> None:
        super().__init__(timeout)
        self.ready = False
        self.fail = fail

    def try_complete(self) -> bool:
        if self.ready and self.fail:
            raise RuntimeError("condition cannot be evaluated")
        return self.ready and self.force_complete()


GaugeValues = dict[str, int]  # purgatory_size, pending, keys + outcome totals


def expected(
    size: int,
    pending: int,
    keys: int,
    done: tuple[int, int, int, int],
    advances: int = 0,
) -> GaugeValues:
    completed, expired, cancelled, failed = done
    return {
        "advances": advances,
        "size": size,
        "pending": pending,
        "keys": keys,
        "completed": completed,
        "expired": expired,
        "cancelled": cancelled,
        "failed": failed,
    }


def scrape(registry: CollectorRegistry) -> dict[str, GaugeValues]:
    """Parse the text exposition into {purgatory: values}, checking types and names."""
    text = generate_latest(registry).decode()
    names = {
        "aiopurgatory_purgatory_size": "size",
        "aiopurgatory_pending_operations": "pending",
        "aiopurgatory_watch_keys": "keys",
    }
    result: dict[str, GaugeValues] = {}
    seen = set()
    for family in text_string_to_metric_families(text):
        if family.type == "histogram":
            continue  # tests/core/test_histograms.py
        seen.add(family.name)
        if family.name in names:
            assert family.type == "gauge"
            for sample in family.samples:
                assert sample.name == family.name
                assert set(sample.labels) == {"purgatory"}
                values = result.setdefault(sample.labels["purgatory"], {})
                values[names[family.name]] = int(sample.value)
        elif family.name == "aiopurgatory_operations":
            assert family.type == "counter"
            for sample in family.samples:
                assert sample.name == "aiopurgatory_operations_total"
                values = result.setdefault(sample.labels["purgatory"], {})
                values[sample.labels["outcome"]] = int(sample.value)
        elif family.name == "aiopurgatory_advances":
            assert family.type == "counter"
            for sample in family.samples:
                assert sample.name == "aiopurgatory_advances_total"
                assert set(sample.labels) == {"purgatory"}
                values = result.setdefault(sample.labels["purgatory"], {})
                values["advances"] = int(sample.value)
    assert seen >= {*names, "aiopurgatory_operations", "aiopurgatory_advances"}
    # One gauge for pending operations: Kafka's "delayed" is an alias, not a twin.
    assert not [name for name in seen if "delayed" in name]
    return result


async def drive(check: Any, purgatory: ap.Purgatory[Op]) -> None:
    """Run one op to each outcome on virtual time, calling ``check(expected)`` between steps."""
    loop = asyncio.get_running_loop()
    a, b, c, d = Op(1.0), Op(0.5), Op(5.0), Op(5.0, fail=True)
    assert not purgatory.try_complete_else_watch(a, ["t0", "t1"])
    assert not purgatory.try_complete_else_watch(b, ["t0"])
    assert not purgatory.try_complete_else_watch(c, ["t2"])
    assert not purgatory.try_complete_else_watch(d, ["t1"])
    check(expected(size=5, pending=4, keys=3, done=(0, 0, 0, 0)))

    await asyncio.sleep(0.75)  # b's 0.5 s timeout passes
    assert loop.time() == 0.75
    assert b.outcome is ap.Outcome.EXPIRED
    check(expected(size=4, pending=3, keys=3, done=(0, 1, 0, 0)))

    a.ready = d.ready = True
    with structlog.testing.capture_logs() as logs:
        assert purgatory.check_and_complete("t1") == 1  # a completes, d's check raises
        assert d.exception() is not None  # received: it will not be logged
    assert logs == []
    assert (a.outcome, d.outcome) == (ap.Outcome.COMPLETED, ap.Outcome.FAILED)
    check(expected(size=1, pending=1, keys=1, done=(1, 1, 0, 1)))

    assert c.cancel()
    check(expected(size=0, pending=0, keys=0, done=(1, 1, 1, 1)))


def test_importing_the_package_imports_no_client_library() -> None:
    code = (
        "import sys, aiopurgatory, aiopurgatory.metrics\n"
        "clients = ('prometheus_client', 'opentelemetry')\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in clients]\n"
        "assert not bad, bad\n"
        "from aiopurgatory.metrics import prometheus\n"
        "assert 'prometheus_client' in sys.modules and 'opentelemetry' not in sys.modules\n"
        "import aiopurgatory.metrics as m\n"
        "assert m.otel.PurgatoryInstruments and 'opentelemetry' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- Prometheus -------------------------------------------------------------------------


@pytest.mark.virtual_time
async def test_prometheus_exposition_follows_the_purgatory() -> None:
    registry = CollectorRegistry()
    produce: ap.Purgatory[Op] = ap.Purgatory("produce")
    idle: ap.Purgatory[Op] = ap.Purgatory("fetch")
    collector = PurgatoryCollector([produce], registry=registry)
    collector.register(idle)
    assert collector.purgatories == [idle, produce]
    idle_values = expected(size=0, pending=0, keys=0, done=(0, 0, 0, 0))

    def check(values: GaugeValues) -> None:
        assert scrape(registry) == {"produce": values, "fetch": idle_values}
        stats = produce.statistics()
        assert (stats.watched, stats.pending) == (values["size"], values["pending"])

    await drive(check, produce)
    produce.close()
    # A closed purgatory keeps its final totals until unregistered.
    check(expected(size=0, pending=0, keys=0, done=(1, 1, 1, 1)))
    assert collector.unregister(produce)
    assert not collector.unregister(produce)
    assert scrape(registry) == {"fetch": idle_values}


def test_prometheus_collector_holds_purgatories_weakly() -> None:
    registry = CollectorRegistry()
    collector = PurgatoryCollector(registry=registry)
    purgatory: ap.Purgatory[Op] | None = ap.Purgatory("dropped")
    assert purgatory is not None
    collector.register(purgatory)
    assert set(scrape(registry)) == {"dropped"}
    del purgatory
    gc.collect()
    assert scrape(registry) == {}
    assert collector.purgatories == []
    # The name is free again once its purgatory is gone.
    collector.register(ap.Purgatory("dropped"))


def test_two_unnamed_purgatories_on_one_collector_are_told_to_take_names() -> None:
    collector = PurgatoryCollector(registry=None)
    first: ap.Purgatory[Op] = ap.Purgatory()
    collector.register(first)
    with pytest.raises(ValueError) as caught:
        collector.register(ap.Purgatory())
    message = str(caught.value)
    assert "'purgatory' is already registered (the default name)" in message
    assert "Purgatory('produce')" in message
    assert "\n" not in message


def test_a_second_collector_on_the_default_registry_says_one_per_registry() -> None:
    from prometheus_client import REGISTRY

    collector = PurgatoryCollector()
    try:
        with pytest.raises(ValueError, match=r"^registry already has a collector of aiopurgatory"):
            PurgatoryCollector()
    finally:
        REGISTRY.unregister(collector)


def test_prometheus_collector_registration_rules() -> None:
    registry = CollectorRegistry()
    first: ap.Purgatory[Op] = ap.Purgatory("p")
    collector = PurgatoryCollector(registry=registry)
    collector.register(first)
    collector.register(first)  # idempotent
    assert collector.purgatories == [first]
    with pytest.raises(ValueError, match="'p' is already registered"):
        collector.register(ap.Purgatory("p"))
    with pytest.raises(TypeError, match="purgatory must be"):
        collector.register("p")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="purgatory must be"):
        collector.unregister(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="registry must be"):
        PurgatoryCollector(registry="default")  # type: ignore[arg-type]
    # describe() lets the registry refuse a second collector of the same names; the
    # error says what to do in one line, not prometheus_client's list of series.
    with pytest.raises(ValueError, match="one PurgatoryCollector per registry") as caught:
        PurgatoryCollector(registry=registry)
    assert "\n" not in str(caught.value)
    assert "_bucket" not in str(caught.value)
    assert caught.value.__suppress_context__
    q: ap.Purgatory[Op] = ap.Purgatory("q")
    unregistered = PurgatoryCollector([q], registry=None)
    assert scrape(registry) == {"p": expected(size=0, pending=0, keys=0, done=(0, 0, 0, 0))}
    assert unregistered.purgatories == [q]


# -- OpenTelemetry --------------------------------------------------------------------


HISTOGRAM_INSTRUMENTS = {
    "aiopurgatory.operation.wait.sum",
    "aiopurgatory.operation.wait.quantile",
    "aiopurgatory.expiry.lateness.quantile",
}


def observe(reader: InMemoryMetricReader) -> dict[str, GaugeValues]:
    """Collect through the SDK into {purgatory: values}, checking instrument kinds."""
    names = {
        "aiopurgatory.purgatory.size": "size",
        "aiopurgatory.pending_operations": "pending",
        "aiopurgatory.watch_keys": "keys",
    }
    data = reader.get_metrics_data()
    result: dict[str, GaugeValues] = {}
    if data is None:
        return result
    seen = set()
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "aiopurgatory"
            assert scope.scope.version == ap.__version__
            for metric in scope.metrics:
                if metric.name in HISTOGRAM_INSTRUMENTS:
                    continue  # tests/core/test_histograms.py
                seen.add(metric.name)
                kind = type(metric.data).__name__
                for point in metric.data.data_points:
                    attributes = dict(point.attributes or {})
                    values = result.setdefault(str(attributes.pop("purgatory")), {})
                    if metric.name in names:
                        assert kind == "Gauge"
                        assert attributes == {}
                        values[names[metric.name]] = int(point.value)  # type: ignore[union-attr]
                    elif metric.name == "aiopurgatory.advances":
                        assert kind == "Sum"
                        assert metric.data.is_monotonic  # type: ignore[union-attr]
                        assert attributes == {}
                        values["advances"] = int(point.value)  # type: ignore[union-attr]
                    else:
                        assert metric.name == "aiopurgatory.operations"
                        assert kind == "Sum"
                        assert metric.data.is_monotonic  # type: ignore[union-attr]
                        values[str(attributes["outcome"])] = int(point.value)  # type: ignore[union-attr]
    if result:
        assert seen == {*names, "aiopurgatory.operations", "aiopurgatory.advances"}
    return result


@pytest.mark.virtual_time
async def test_otel_observations_follow_the_purgatory() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        produce: ap.Purgatory[Op] = ap.Purgatory("produce")
        instruments = PurgatoryInstruments([produce], meter_provider=provider)

        def check(values: GaugeValues) -> None:
            assert observe(reader) == {"produce": values}

        await drive(check, produce)
        assert instruments.unregister(produce)
        assert observe(reader) == {}
        assert instruments.purgatories == []
    finally:
        provider.shutdown()


def test_otel_instruments_hold_purgatories_weakly_and_check_arguments() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        instruments = PurgatoryInstruments(meter_provider=provider)
        purgatory: ap.Purgatory[Op] | None = ap.Purgatory("dropped")
        assert purgatory is not None
        instruments.register(purgatory)
        with pytest.raises(ValueError, match="already registered"):
            instruments.register(ap.Purgatory("dropped"))
        assert set(observe(reader)) == {"dropped"}
        del purgatory
        gc.collect()
        assert observe(reader) == {}
        with pytest.raises(TypeError, match="purgatory must be"):
            instruments.register(object())  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="meter_provider must be"):
            PurgatoryInstruments(meter_provider=reader)  # type: ignore[arg-type]
    finally:
        provider.shutdown()


def test_otel_without_sdk_is_a_no_op() -> None:
    # Only the API: a NoOpMeterProvider accepts the instruments and never calls back.
    from opentelemetry.metrics import NoOpMeterProvider

    purgatory: ap.Purgatory[Op] = ap.Purgatory("p")
    instruments = PurgatoryInstruments([purgatory], meter_provider=NoOpMeterProvider())
    assert instruments.purgatories == [purgatory]


async def drive_advances(check: Any, purgatory: ap.Purgatory[ap.WatermarkOperation]) -> None:
    """Watermark advances counted: those that raised a watermark, not the others."""
    a, b = ap.WatermarkOperation(5.0), ap.WatermarkOperation(5.0)
    assert not purgatory.try_complete_else_watch(a, {"orders-0": 10})
    assert not purgatory.try_complete_else_watch(b, {"orders-0": 20, "orders-1": 5})
    check(expected(size=3, pending=2, keys=2, done=(0, 0, 0, 0)))
    assert purgatory.advance("orders-0", 12) == 1  # a completes
    assert purgatory.advance("orders-0", 11) == 0  # lower: not an advance
    assert purgatory.advance("nobody", 99) == 0  # an unwatched key keeps nothing
    check(expected(size=2, pending=1, keys=2, done=(1, 0, 0, 0), advances=1))
    assert purgatory.advance("orders-1", 5) == 1  # b completes on either key
    check(expected(size=0, pending=0, keys=0, done=(2, 0, 0, 0), advances=2))


@pytest.mark.virtual_time
async def test_prometheus_and_otel_export_watermark_advances() -> None:
    registry = CollectorRegistry()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        produce: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("produce")
        PurgatoryCollector([produce], registry=registry)
        PurgatoryInstruments([produce], meter_provider=provider)

        def check(values: GaugeValues) -> None:
            assert scrape(registry) == {"produce": values}
            assert observe(reader) == {"produce": values}
            assert produce.statistics().advances == values["advances"]

        await drive_advances(check, produce)
    finally:
        provider.shutdown()
