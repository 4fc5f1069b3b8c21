"""The always-on histograms: snapshots, the purgatory's waits and lateness, their exposition.

The suite runs on the compiled core and again on the pure-Python one (``make
test``), so every test here checks both. Purgatories run on virtual time, where
every wait is exact: the expected bucket of each one is known.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import aiopurgatory as ap
from aiopurgatory import _duration_counts
from aiopurgatory._histograms import BOUNDS
from aiopurgatory.metrics.prometheus import HISTOGRAM_EDGES, PurgatoryCollector
from tests.metrics.test_metrics import (
    Op as Flag,  # completes once ready; fail=True: its check raises
)

COMPLETED = ap.Outcome.COMPLETED
EXPIRED = ap.Outcome.EXPIRED
CANCELLED = ap.Outcome.CANCELLED
FAILED = ap.Outcome.FAILED

UPPER = _duration_counts.upper_bounds()


async def close(purgatory: ap.Purgatory[Any], *, expire_pending: bool = False) -> None:
    await purgatory.aclose(expire_pending=expire_pending)


def bucket_of(seconds: float) -> int:
    """The bucket a duration belongs in, found from the edges alone (the model)."""
    ns = round(seconds * 1e9)
    for i, upper in enumerate(UPPER):
        if upper < 0 or ns <= upper:
            return i
    raise AssertionError("the last bucket has no edge")


# -- snapshots ------------------------------------------------------------------------


def snapshot_of(values: list[float]) -> ap.Histogram:
    counts = [0] * _duration_counts.BUCKETS
    for value in values:
        counts[bucket_of(value)] += 1
    return ap.Histogram(len(values), sum(values), max(values, default=0.0), tuple(counts))


def assert_holds(h: ap.Histogram, values: list[float]) -> None:
    """``h`` recorded exactly ``values``: same buckets; sum and max up to float rounding."""
    model = snapshot_of(values)
    assert (h.count, h.buckets) == (model.count, model.buckets)
    assert h.sum == pytest.approx(model.sum, abs=1e-12)
    assert h.max == pytest.approx(model.max, abs=1e-12)


def test_quantiles_are_the_upper_edge_of_the_true_value_bucket() -> None:
    rng = random.Random(7)
    values = sorted(rng.lognormvariate(math.log(0.02), 1.0) for _ in range(5000))
    h = snapshot_of(values)
    for q in (0.0, 0.5, 0.9, 0.99, 0.999, 1.0):
        true = values[max(1, math.ceil(q * len(values))) - 1]
        got = h.quantile(q)
        assert got == min(BOUNDS[bucket_of(true)], h.max)
        assert true <= got <= true * 1.05 + 1e-9
    assert (h.p50, h.p90, h.p99, h.p999) == tuple(h.quantile(q) for q in (0.5, 0.9, 0.99, 0.999))
    assert h.max == values[-1]
    assert h.mean == pytest.approx(sum(values) / len(values))
    assert math.isnan(ap.Histogram.empty().p99)
    with pytest.raises(ValueError, match="q must be within"):
        h.quantile(1.5)
    with pytest.raises(TypeError, match="q must be a number"):
        h.quantile(True)


def test_snapshots_merge_and_subtract() -> None:
    a = snapshot_of([0.001, 0.002, 0.5])
    b = snapshot_of([0.003, 7.0])
    both = a + b
    assert both == snapshot_of([0.001, 0.002, 0.5, 0.003, 7.0])
    delta = both - a
    assert delta.buckets == b.buckets
    assert delta.count == 2
    assert delta.sum == pytest.approx(b.sum)
    assert delta.max == 7.0
    with pytest.raises(ValueError, match="not an earlier snapshot"):
        a - both


def test_cumulative_counts_at_edges_are_exact() -> None:
    h = snapshot_of([0.001, 0.001, 0.0010001, 0.0025, 2.5, 1e6])
    assert h.cumulative([0.001, 0.0025, 2.5, 300.0, math.inf]) == [2, 4, 5, 5, 6]
    with pytest.raises(ValueError, match="not a bucket edge"):
        h.cumulative([0.00103])


# -- purgatories on virtual time ---------------------------------------------------------


@pytest.mark.virtual_time
async def test_waits_and_lateness_are_recorded_by_outcome() -> None:
    loop = asyncio.get_running_loop()
    p: ap.Purgatory[Flag] = ap.Purgatory("produce", tick=0.001)
    now = Flag(1.0)
    now.ready = True
    assert p.try_complete_else_watch(now, ["k"])  # completed by its check: waited 0
    done, expire, cancel, fail = Flag(1.0), Flag(0.0995), Flag(5.0), Flag(5.0, fail=True)
    for op in (done, expire, cancel, fail):
        p.try_complete_else_watch(op, ["k"])
    await asyncio.sleep(0.05)
    done.ready = True
    assert p.check_and_complete("k") == 1
    await asyncio.sleep(0.25)  # expire's deadline 0.0995 fires at the next tick, 0.1
    assert expire.outcome is EXPIRED
    assert cancel.cancel()
    fail.ready = True
    p.check_and_complete("k")
    assert fail.outcome is FAILED
    assert loop.time() == 0.3

    h = p.histograms()
    assert h.name == "produce"
    assert_holds(h.completed, [0.0, 0.05])
    assert_holds(h.expired, [0.1])
    assert_holds(h.lateness, [0.0005])
    assert_holds(h.cancelled, [0.3])
    assert_holds(h.failed, [0.3])
    assert h.wait(None).count == 5 == sum(h.wait(o).count for o in ap.Outcome)
    stats = p.statistics()
    assert [h.wait(o).count for o in ap.Outcome] == [
        stats.completed,
        stats.expired,
        stats.cancelled,
        stats.failed,
    ]
    with pytest.raises(TypeError, match="outcome must be"):
        h.wait("completed")  # type: ignore[arg-type]
    await close(p)


@pytest.mark.virtual_time
async def test_reset_and_intervals() -> None:
    p: ap.Purgatory[Flag] = ap.Purgatory("fetch")
    first = Flag(0.5)
    p.try_complete_else_watch(first, ["k"])
    await asyncio.sleep(1)
    before = p.histograms()
    second = Flag(2.0)
    p.try_complete_else_watch(second, ["k"])
    await asyncio.sleep(3)
    after = p.histograms(reset=True)
    interval = after - before
    assert interval.expired.count == 1
    assert interval.expired.max == pytest.approx(2.0, rel=0.05)
    assert after.expired.count == 2
    assert p.histograms().expired.count == 0  # reset
    other = ap.Purgatory[Flag]("other")
    merged = ap.PurgatoryHistograms.merge([after, other.histograms()], name="all")
    assert merged.name == "all"
    assert merged.expired == after.expired
    assert (after + other.histograms()).name == "fetch+other"
    await close(p)
    await close(other)


@pytest.mark.virtual_time
async def test_close_expiring_early_counts_the_wait_not_the_lateness() -> None:
    p: ap.Purgatory[Flag] = ap.Purgatory()
    op = Flag(10.0)
    p.try_complete_else_watch(op, ["k"])
    await asyncio.sleep(2)
    await close(p, expire_pending=True)
    h = p.histograms()
    assert_holds(h.expired, [2.0])
    assert h.lateness.count == 0


# -- Prometheus ------------------------------------------------------------------------------


Labels = tuple[tuple[str, str], ...]


def parse_histograms(text: str) -> dict[str, dict[Labels, dict[str, Any]]]:
    """{family: {labels (without le): {"buckets": [(le, n)], "sum": s, "count": n}}}."""
    result: dict[str, dict[Labels, dict[str, Any]]] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        series = result.setdefault(family.name, {})
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            entry = series.setdefault(tuple(sorted(labels.items())), {"buckets": []})
            if sample.name.endswith("_bucket"):
                entry["buckets"].append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_sum"):
                entry["sum"] = sample.value
            elif sample.name.endswith("_count"):
                entry["count"] = sample.value
    return result


class Timed(Flag):
    """Notes the loop time it finished at (completion or expiry)."""

    finished_at: float | None = None

    def on_complete(self) -> None:
        self.finished_at = asyncio.get_running_loop().time()


@pytest.mark.virtual_time
async def test_prometheus_exposition_of_a_virtual_time_run() -> None:
    loop = asyncio.get_running_loop()
    registry = CollectorRegistry()
    p: ap.Purgatory[Flag] = ap.Purgatory("produce")
    PurgatoryCollector([p], registry=registry)
    rng = random.Random(20)
    waits: list[float] = []
    expected_expired = 0

    async def one(i: int) -> None:
        nonlocal expected_expired
        await asyncio.sleep(rng.uniform(0, 1))
        op = Timed(0.5)
        start = loop.time()
        # A log-normal completion time; past the timeout the op expires.
        latency = rng.lognormvariate(math.log(0.02), 1.2)
        p.try_complete_else_watch(op, [i % 7])
        await asyncio.sleep(latency)
        op.ready = True
        p.check_and_complete(i % 7)
        await op
        assert op.finished_at is not None
        waits.append(op.finished_at - start)
        if op.outcome is EXPIRED:
            expected_expired += 1

    await asyncio.gather(*(one(i) for i in range(2000)))
    text = generate_latest(registry).decode()
    families = parse_histograms(text)
    assert set(families) == {
        "aiopurgatory_operation_wait_seconds",
        "aiopurgatory_expiry_lateness_seconds",
    }
    wait = families["aiopurgatory_operation_wait_seconds"]
    by_outcome = {dict(key)["outcome"]: entry for key, entry in wait.items()}
    assert set(by_outcome) == {"completed", "expired", "cancelled", "failed"}
    assert all(dict(key)["purgatory"] == "produce" for key in wait)
    stats = p.statistics()
    assert by_outcome["completed"]["count"] == stats.completed == 2000 - expected_expired
    assert by_outcome["expired"]["count"] == stats.expired == expected_expired > 0
    assert by_outcome["cancelled"]["count"] == 0
    [lateness] = families["aiopurgatory_expiry_lateness_seconds"].values()
    assert lateness["count"] == expected_expired

    # All outcomes together, as a dashboard would sum them: the true p99 wait lies
    # in the bucket where the cumulative count crosses 99%.
    edges = [le for le, _ in by_outcome["completed"]["buckets"]]
    assert edges == list(HISTOGRAM_EDGES)
    cumulative = [
        sum(entry["buckets"][i][1] for entry in by_outcome.values()) for i in range(len(edges))
    ]
    total = sum(entry["count"] for entry in by_outcome.values())
    assert total == len(waits) == 2000
    assert cumulative[-1] == total
    assert sum(entry["sum"] for entry in by_outcome.values()) == pytest.approx(sum(waits))
    rank = math.ceil(0.99 * total)
    crossing = next(i for i, n in enumerate(cumulative) if n >= rank)
    true_p99 = sorted(waits)[rank - 1]
    lower = edges[crossing - 1] if crossing else 0.0
    assert lower < true_p99 <= edges[crossing]
    # And the fine snapshot agrees to within its 5% bucket.
    fine = p.histograms().wait(None).p99
    assert true_p99 <= fine <= true_p99 * 1.05
    await close(p)


# -- OpenTelemetry ---------------------------------------------------------------------------


@pytest.mark.virtual_time
async def test_otel_reports_wait_sums_and_interval_quantiles() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from aiopurgatory.metrics.otel import PurgatoryInstruments

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    p: ap.Purgatory[Flag] = ap.Purgatory("fetch")
    PurgatoryInstruments([p], meter_provider=provider)

    def collect() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        data = reader.get_metrics_data()
        assert data is not None
        found = {}
        for metric in data.resource_metrics[0].scope_metrics[0].metrics:
            if ".wait." not in metric.name and ".lateness." not in metric.name:
                continue
            for point in metric.data.data_points:
                attributes = tuple(sorted((k, str(v)) for k, v in (point.attributes or {}).items()))
                found[metric.name, attributes] = point.value  # type: ignore[union-attr]
        return found

    try:
        for timeout in (0.1, 0.2, 0.4):
            p.try_complete_else_watch(Flag(timeout), ["k"])
        await asyncio.sleep(1)
        first = collect()
        key = (("outcome", "expired"), ("purgatory", "fetch"))
        assert first[("aiopurgatory.operation.wait.sum", key)] == pytest.approx(0.7, abs=0.004)
        quantile = "aiopurgatory.operation.wait.quantile"
        assert first[(quantile, (*key[:1], ("purgatory", "fetch"), ("quantile", "0.5")))] == (
            pytest.approx(0.2, rel=0.05)
        )
        assert first[(quantile, (*key[:1], ("purgatory", "fetch"), ("quantile", "1")))] == (
            pytest.approx(0.4, rel=0.05)
        )
        # Only what finished since the previous collection: one 2 s expiry.
        p.try_complete_else_watch(Flag(2.0), ["k"])
        await asyncio.sleep(3)
        second = collect()
        assert second[(quantile, (*key[:1], ("purgatory", "fetch"), ("quantile", "0.5")))] == (
            pytest.approx(2.0, rel=0.05)
        )
        lateness = (
            "aiopurgatory.expiry.lateness.quantile",
            (("purgatory", "fetch"), ("quantile", "1")),
        )
        assert 0 <= second[lateness] <= 0.001
        # Nothing finished since: no quantile observations at all.
        assert not any(name.endswith("quantile") for name, _ in collect())
    finally:
        provider.shutdown()
