"""The tables ``aiopurgatory analyze`` computes from a fact table (Spark DataFrames).

Rollups and summary (one aggregate, one scan of the facts), hot keys, answers
by outcome and error, and the wait histograms; percentiles are Spark's
``percentile_approx`` at :data:`PERCENTILE_ACCURACY`. Reading the event logs and
writing the tables is :mod:`aiopurgatory.pipeline.analyze`, which re-exports the
public names of this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .schema import OUTCOMES
from .tables import BINS_PER_DECADE

__all__ = [
    "PERCENTILE_ACCURACY",
    "WAIT_PERCENTS",
    "answers",
    "histograms",
    "hot_keys",
    "rollups",
    "summary",
]


#: ``percentile_approx`` accuracy: rank error at most ``1/accuracy`` of the group size.
PERCENTILE_ACCURACY = 10_000


#: Percentiles of ``wait`` in rollups and summary (one digest per group answers all).
WAIT_PERCENTS = (50, 95, 99)


#: Columns of ``rollups/`` and ``summary/`` after their group columns, in order.
_MEASURES = (
    "ops",
    *OUTCOMES,
    "errors",
    *[f"wait_p{p}" for p in WAIT_PERCENTS],
    "wait_max",
    "lateness_p99",
    "lateness_max",
)


#: ``grouping_id()`` of each level of :func:`_tables` (a set bit: a column not grouped).
_LEVEL_ROLLUP, _LEVEL_PURGATORY, _LEVEL_SCENARIO = 0, 1, 3


_LEVELS = (_LEVEL_ROLLUP, _LEVEL_PURGATORY, _LEVEL_SCENARIO)


#: Row order of the tables as written.
_ROLLUP_ORDER = ("scenario", "purgatory", "interval_start")


_SUMMARY_ORDER = ("scenario", "purgatory")


_HOT_KEYS_ORDER = ("scenario", "rank_by_ops")


def _interval_start(interval: float) -> Any:
    from pyspark.sql import functions as F

    if not interval > 0:
        raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
    return (F.floor(F.col("finished_at") / interval) * interval).alias("interval_start")


def _tables(facts: Any, interval: float, levels: Sequence[int] = _LEVELS) -> Any:
    """Rollups and summary in one aggregate (one scan of the facts, one shuffle):
    grouping sets (scenario, purgatory, interval), (scenario, purgatory) and
    (scenario), or those of ``levels``, told apart by ``level`` (``grouping_id()``).
    One ``percentile_approx`` digest per group gives the three wait percentiles."""
    from pyspark.sql import functions as F

    start = _interval_start(interval)
    groups = ["scenario", "purgatory", start]
    sets = {_LEVEL_ROLLUP: groups, _LEVEL_PURGATORY: groups[:2], _LEVEL_SCENARIO: groups[:1]}
    wait = F.percentile_approx("wait", [p / 100 for p in WAIT_PERCENTS], PERCENTILE_ACCURACY)
    return (
        facts.groupingSets([sets[level] for level in levels], *groups)
        .agg(
            F.count(F.lit(1)).alias("ops"),
            *[F.count(F.when(F.col("outcome") == o, 1)).alias(o) for o in OUTCOMES],
            F.count("error").alias("errors"),
            wait.alias("wait_p"),
            F.max("wait").alias("wait_max"),
            F.percentile_approx("lateness", 0.99, PERCENTILE_ACCURACY).alias("lateness_p99"),
            F.max("lateness").alias("lateness_max"),
            F.min("finished_at").alias("first_finished_at"),
            F.max("finished_at").alias("last_finished_at"),
            F.grouping_id().alias("level"),
        )
        .select(
            "*",
            *[F.col("wait_p")[i].alias(f"wait_p{p}") for i, p in enumerate(WAIT_PERCENTS)],
            (F.col("expired") / F.col("ops")).alias("expiry_rate"),
            (F.col("errors") / F.col("ops")).alias("error_rate"),
        )
    )


def _rollups_of(tables: Any) -> Any:
    from pyspark.sql import functions as F

    return tables.where(F.col("level") == _LEVEL_ROLLUP).select(
        "scenario", "purgatory", "interval_start", *_MEASURES, "expiry_rate", "error_rate"
    )


def _summary_of(tables: Any) -> Any:
    from pyspark.sql import functions as F

    return tables.where(F.col("level") != _LEVEL_ROLLUP).select(
        "scenario",
        F.coalesce("purgatory", F.lit("(all)")).alias("purgatory"),
        *_MEASURES,
        "first_finished_at",
        "last_finished_at",
        "expiry_rate",
        "error_rate",
    )


def rollups(facts: Any, interval: float) -> Any:
    """Per scenario, purgatory and interval of ``finished_at``: counts and percentiles.

    Columns: ``scenario, purgatory, interval_start, ops, completed, expired,
    cancelled, failed, errors, wait_p50, wait_p95, wait_p99, wait_max,
    lateness_p99, lateness_max, expiry_rate, error_rate`` (seconds;
    ``interval_start`` in loop time; ``errors``: ops whose event carries an
    ``error``, whatever their outcome).

    Raises:
        ValueError: ``interval`` is not > 0.
    """
    return _rollups_of(_tables(facts, interval, (_LEVEL_ROLLUP,))).orderBy(*_ROLLUP_ORDER)


def summary(facts: Any) -> Any:
    """Per scenario and purgatory, plus ``(all)`` per scenario: totals and percentiles."""
    levels = (_LEVEL_PURGATORY, _LEVEL_SCENARIO)
    return _summary_of(_tables(facts, 1.0, levels)).orderBy(*_SUMMARY_ORDER)


def hot_keys(facts: Any, top: int) -> Any:
    """The ``top`` keys of each scenario by ops and by expiries.

    Columns: ``scenario, purgatory, key, ops, expired, completed, errors,
    wait_p99, rank_by_ops, rank_by_expired`` (``rank_by_expired`` null for keys
    without expiries). A key is a (purgatory, key) pair; ops finished at once
    have no keys. Runs one Spark job at once (the top keys, see :func:`_hot_keys`).

    Raises:
        ValueError: ``top`` < 1.
    """
    return _hot_keys(facts, top).orderBy(*_HOT_KEYS_ORDER)


def _hot_keys(facts: Any, top: int) -> Any:
    """The ``top`` keys of each scenario by ops and by expiries.

    Columns: as :func:`hot_keys`.

    Raises:
        ValueError: ``top`` < 1.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be an int >= 1, got {top!r}")
    names = ["scenario", "purgatory", "key"]
    exploded = facts.select(
        "scenario", "purgatory", "outcome", "error", "wait", F.explode("keys").alias("key")
    )
    # First the counts of every key (a hash aggregate), and the top keys from them
    # (a few rows, kept by a local checkpoint); only then the wait percentile of
    # those keys: with more than 128 keys per task, a percentile_approx aggregate
    # over all of them falls back to sorting its input.
    per_key = exploded.groupBy(*names).agg(
        F.count(F.lit(1)).alias("ops"),
        F.count(F.when(F.col("outcome") == "expired", 1)).alias("expired"),
        F.count(F.when(F.col("outcome") == "completed", 1)).alias("completed"),
        F.count("error").alias("errors"),
    )
    by_ops = Window.partitionBy("scenario").orderBy(F.desc("ops"), "purgatory", "key")
    by_expired = Window.partitionBy("scenario").orderBy(F.desc("expired"), "purgatory", "key")
    ranked = per_key.select(
        "*",
        F.row_number().over(by_ops).alias("rank_by_ops"),
        F.when(F.col("expired") > 0, F.row_number().over(by_expired)).alias("rank_by_expired"),
    )
    chosen = ranked.where((F.col("rank_by_ops") <= top) | (F.col("rank_by_expired") <= top))
    chosen = chosen.localCheckpoint()
    wait_p99 = (
        exploded.join(F.broadcast(chosen.select(*names)), names)
        .groupBy(*names)
        .agg(F.percentile_approx("wait", 0.99, PERCENTILE_ACCURACY).alias("wait_p99"))
    )
    return chosen.join(wait_p99, names, "left").select(
        *names,
        "ops",
        "expired",
        "completed",
        "errors",
        "wait_p99",
        "rank_by_ops",
        "rank_by_expired",
    )


#: Row order of ``answers/``.
_ANSWERS_ORDER = ("scenario", "purgatory", "outcome", "error")


def answers(facts: Any) -> Any:
    """Ops per scenario, purgatory, outcome and error (null: no error).

    Columns: ``scenario, purgatory, outcome, error, ops, share`` (of the
    scenario and purgatory's ops), ``wait_p50, wait_p99, wait_max`` (seconds).
    An op that completed with an error answer (``NOT_ENOUGH_REPLICAS``) is a row
    of its own, apart from the ops that completed without one.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    wait = F.percentile_approx("wait", [0.5, 0.99], PERCENTILE_ACCURACY)
    per = (
        facts.groupBy("scenario", "purgatory", "outcome", "error")
        .agg(F.count(F.lit(1)).alias("ops"), wait.alias("wait_p"), F.max("wait").alias("wait_max"))
        .select(
            "scenario",
            "purgatory",
            "outcome",
            "error",
            "ops",
            (F.col("ops") / F.sum("ops").over(Window.partitionBy("scenario", "purgatory"))).alias(
                "share"
            ),
            F.col("wait_p")[0].alias("wait_p50"),
            F.col("wait_p")[1].alias("wait_p99"),
            "wait_max",
        )
    )
    return per


def histograms(facts: Any) -> Any:
    """Log-binned counts of wait (by outcome and error) and of lateness (pandas:
    ``scenario, metric, outcome, error, bin, count``; ``bin`` null for zero,
    ``error`` null for no error), from one aggregate."""
    import pandas as pd

    counts = _histogram_counts(facts).toPandas()
    parts = []
    for metric, rows in (("wait", counts), ("lateness", counts[counts["has_lateness"]])):
        part = (
            rows.groupby(["scenario", "outcome", "error", f"{metric}_bin"], dropna=False)["count"]
            .sum()
            .reset_index()
            .rename(columns={f"{metric}_bin": "bin"})
        )
        part.insert(1, "metric", metric)
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def _histogram_counts(facts: Any) -> Any:
    """Ops per (scenario, outcome, error, wait bin, lateness bin): a few hundred
    rows at most; each histogram is a sum over the other's bins."""
    from pyspark.sql import functions as F

    def binned(column: str) -> Any:
        return F.when(F.col(column) > 0, F.floor(F.log10(column) * BINS_PER_DECADE)).cast("int")

    return facts.groupBy(
        "scenario",
        "outcome",
        "error",
        binned("wait").alias("wait_bin"),
        F.col("lateness").isNotNull().alias("has_lateness"),
        binned("lateness").alias("lateness_bin"),
    ).count()
