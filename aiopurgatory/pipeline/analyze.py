"""``aiopurgatory analyze``: op event logs -> Parquet tables, a report and a summary.

Reads event log lines (schema 1, see ``docs/events.md``) from files, directories
or globs on any filesystem Spark can read, with an explicit schema (no inference
pass), and writes under ``--out``:

``facts/``
    one row per finished op (:data:`~aiopurgatory.pipeline.schema.FACT_COLUMNS`).
``rollups/``
    per scenario, purgatory and ``--interval`` of ``finished_at``: ops, counts by
    outcome, wait p50/p95/p99/max, expiry rate, lateness p99/max.
``hot_keys/``
    the ``--top`` keys by ops and by expiries.
``summary/``
    per scenario and purgatory (and ``(all)``): totals and percentiles.
``malformed/``
    lines that are not valid schema-1 events: file, line, reason, text.
``report.md`` and its PNG plots; ``quality.json`` (line counts).

Malformed lines never stop a run: they are counted (during the facts write,
through a Spark ``Observation``) and, if there are any, located in a second pass.

Percentiles are Spark's ``percentile_approx`` (rank error at most 1/10000 of the
group size; on smaller groups it is the exact nearest-rank percentile).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..events import EVENT, SCHEMA_VERSION
from .schema import CORRUPT_COLUMN, EVENT_FIELDS, FACT_COLUMNS, OUTCOMES, event_schema
from .session import DEFAULT_MASTER

__all__ = [
    "PERCENTILE_ACCURACY",
    "AnalysisResult",
    "Quality",
    "analyze_facts",
    "hot_keys",
    "main",
    "read_events",
    "rollups",
    "summary",
]

#: ``percentile_approx`` accuracy: rank error at most ``1/accuracy`` of the group size.
PERCENTILE_ACCURACY = 10_000
#: At most this many malformed lines are located (file and line) and reported.
MALFORMED_DETAIL_LIMIT = 1000
#: What a non-blank line can be (``quality.json`` counts each).
KINDS = ("event", "other", "malformed")
_REQUIRED = ("purgatory", "op_id", "timeout", "watched_at", "finished_at", "outcome", "wait")


@dataclass
class Quality:
    """Line counts of an event log read (``quality.json``)."""

    #: Non-blank lines read.
    lines: int = 0
    #: Valid op events (rows of the fact table).
    events: int = 0
    #: Valid JSON with another ``event`` name (e.g. other structlog events): skipped.
    other: int = 0
    #: Lines that are not valid schema-1 op events.
    malformed: int = 0
    #: Up to :data:`MALFORMED_DETAIL_LIMIT` of them: file, line, reason, text.
    examples: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class AnalysisResult:
    """What :func:`analyze_facts` wrote and computed (small tables as pandas)."""

    out: Path
    summary: Any
    hot_keys: Any
    quality: Quality | None
    report: Path | None
    seconds: dict[str, float]


def _problem(e: Any) -> Any:
    """Why a parsed line (struct column ``e``) is not a valid op event, or null: an op
    event, or another event (``event`` set to another name). Null checks first, so
    a valid line builds no string."""
    from functools import reduce

    from pyspark.sql import functions as F

    required = ("schema", *_REQUIRED)
    missing = F.concat_ws(", ", *[F.when(e[name].isNull(), F.lit(name)) for name in required])
    any_missing = reduce(lambda a, b: a | b, [e[name].isNull() for name in required])
    return (
        F.when(e[CORRUPT_COLUMN].isNotNull(), F.lit("not JSON, or a field of the wrong type"))
        .when(e["event"].isNull(), F.lit("missing field: event"))
        .when(e["event"] != EVENT, F.lit(None))
        .when(e["schema"] != SCHEMA_VERSION, F.concat(F.lit("unsupported schema "), e["schema"]))
        .when(any_missing, F.concat(F.lit("missing field: "), missing))
        .when(~e["outcome"].isin(*OUTCOMES), F.concat(F.lit("unknown outcome "), e["outcome"]))
    )


def _kind(e: Any) -> Any:
    """``malformed``, ``other`` (another event) or ``event`` (a valid op event)."""
    from pyspark.sql import functions as F

    return (
        F.when(_problem(e).isNotNull(), F.lit("malformed"))
        .when(e["event"] != EVENT, F.lit("other"))
        .otherwise(F.lit("event"))
    )


def _read_json(spark: Any, paths: Sequence[str]) -> Any:
    """The event logs through Spark's JSON source: one parse per line, blank lines
    skipped, unparsable lines (or fields of the wrong type) in ``_corrupt_record``."""
    return (
        spark.read.schema(event_schema())
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
        .option("recursiveFileLookup", "true")
        .json(list(paths))
    )


def _parsed_lines(spark: Any, paths: Sequence[str]) -> Any:
    """Every line with its file, split start, row id and parse result (the second
    pass that locates malformed lines: only run when there are some)."""
    from pyspark.sql import functions as F

    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}
    parsed = (
        spark.read.option("recursiveFileLookup", "true")
        .text(list(paths))
        .select(
            "value",
            F.col("_metadata.file_path").alias("source"),
            F.col("_metadata.file_block_start").alias("block_start"),
            # Increasing within a split, so the line number follows from it (see _locate).
            F.monotonically_increasing_id().alias("row_id"),
            # explode(array(...)) makes the parse a Generate node: filters on its
            # fields cannot be pushed below it, where the optimizer would inline
            # from_json into every reference (parsing each line ~25 times).
            F.explode(F.array(F.from_json("value", event_schema(), options))).alias("e"),
        )
    )
    e = F.col("e")
    kind = F.when(F.trim("value") == "", F.lit("blank")).otherwise(_kind(e))
    return parsed.select("*", _problem(e).alias("problem"), kind.alias("kind"))


def _locate(spark: Any, paths: Sequence[str], bad: Any) -> list[dict[str, Any]]:
    """File and line of malformed rows: the line number is the lines of earlier
    splits of the same file plus the row's offset within its own split."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    lines = (
        spark.read.option("recursiveFileLookup", "true")
        .text(list(paths))
        .select(
            F.col("_metadata.file_path").alias("source"),
            F.col("_metadata.file_block_start").alias("block_start"),
            F.monotonically_increasing_id().alias("row_id"),
        )
    )
    splits = lines.groupBy("source", "block_start").agg(
        F.min("row_id").alias("first_row"), F.count("*").alias("rows")
    )
    earlier = (
        Window.partitionBy("source")
        .orderBy("block_start")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    splits = splits.select(
        "*", F.coalesce(F.sum("rows").over(earlier), F.lit(0)).alias("lines_before")
    )
    located = (
        bad.join(splits, ["source", "block_start"], "left")
        .select(
            "source",
            (F.col("lines_before") + F.col("row_id") - F.col("first_row") + 1).alias("line"),
            "problem",
            F.substring("value", 1, 200).alias("text"),
        )
        .orderBy("source", "line")
    )
    return [row.asDict() for row in located.collect()]


def read_events(spark: Any, paths: Sequence[str], facts_out: str | Path) -> Quality:
    """Parse event logs and write the fact table to ``facts_out`` (Parquet).

    Args:
        spark: a SparkSession.
        paths: files, directories (read recursively) or globs; any URI Spark reads.
        facts_out: where to write the facts.

    Returns:
        The line counts and up to :data:`MALFORMED_DETAIL_LIMIT` located malformed lines.

    Raises:
        ValueError: ``paths`` is empty.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    if isinstance(paths, str) or not paths:
        raise ValueError("paths must be a non-empty list of paths")
    events = _read_json(spark, paths)
    row = F.struct(*[F.col(name) for name in (*EVENT_FIELDS, CORRUPT_COLUMN)])
    events = events.select(
        F.col("_metadata.file_path").alias("source"), "*", _kind(row).alias("kind")
    )
    observation = Observation("aiopurgatory_event_quality")
    observed = events.observe(
        observation,
        F.count(F.lit(1)).alias("lines"),
        *[F.count(F.when(F.col("kind") == kind, 1)).alias(kind) for kind in KINDS],
    )
    columns = {"scenario": F.lit("observed"), "source": F.col("source")}
    observed.where(F.col("kind") == "event").select(
        *[columns.get(name, F.col(name)).alias(name) for name in FACT_COLUMNS]
    ).write.mode("overwrite").parquet(str(facts_out))
    counts = observation.get
    quality = Quality(
        lines=int(counts.get("lines") or 0),
        events=int(counts.get("event") or 0),
        other=int(counts.get("other") or 0),
        malformed=int(counts.get("malformed") or 0),
    )
    if quality.malformed:
        # The second pass: Spark's JSON source does not tell where a line was.
        parsed = _parsed_lines(spark, paths)
        bad = (
            parsed.where(F.col("kind") == "malformed")
            .select("source", "block_start", "row_id", "problem", "value")
            .orderBy("source", "block_start", "row_id")
            .limit(MALFORMED_DETAIL_LIMIT)
        )
        quality.examples = _locate(spark, paths, bad)
    return quality


def _outcome_counts() -> list[Any]:
    from pyspark.sql import functions as F

    return [
        F.sum(F.when(F.col("outcome") == outcome, 1).otherwise(0)).alias(outcome)
        for outcome in OUTCOMES
    ]


def _percentile_columns(prefix: str, column: str, percents: Sequence[int]) -> list[Any]:
    from pyspark.sql import functions as F

    return [
        F.percentile_approx(column, p / 100, PERCENTILE_ACCURACY).alias(f"{prefix}_p{p}")
        for p in percents
    ]


def rollups(facts: Any, interval: float) -> Any:
    """Per scenario, purgatory and interval of ``finished_at``: counts and percentiles.

    Columns: ``scenario, purgatory, interval_start, ops, completed, expired,
    cancelled, failed, expiry_rate, wait_p50, wait_p95, wait_p99, wait_max,
    lateness_p99, lateness_max`` (seconds; ``interval_start`` in loop time).

    Raises:
        ValueError: ``interval`` is not > 0.
    """
    from pyspark.sql import functions as F

    if not interval > 0:
        raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
    start = (F.floor(F.col("finished_at") / interval) * interval).alias("interval_start")
    return (
        facts.groupBy("scenario", "purgatory", start)
        .agg(
            F.count(F.lit(1)).alias("ops"),
            *_outcome_counts(),
            *_percentile_columns("wait", "wait", (50, 95, 99)),
            F.max("wait").alias("wait_max"),
            *_percentile_columns("lateness", "lateness", (99,)),
            F.max("lateness").alias("lateness_max"),
        )
        .withColumn("expiry_rate", F.col("expired") / F.col("ops"))
        .orderBy("scenario", "purgatory", "interval_start")
    )


def summary(facts: Any) -> Any:
    """Per scenario and purgatory, plus ``(all)`` per scenario: totals and percentiles."""
    from pyspark.sql import functions as F

    return (
        facts.rollup("scenario", "purgatory")
        .agg(
            F.count(F.lit(1)).alias("ops"),
            *_outcome_counts(),
            *_percentile_columns("wait", "wait", (50, 95, 99)),
            F.max("wait").alias("wait_max"),
            *_percentile_columns("lateness", "lateness", (99,)),
            F.max("lateness").alias("lateness_max"),
            F.min("finished_at").alias("first_finished_at"),
            F.max("finished_at").alias("last_finished_at"),
        )
        .where(F.col("scenario").isNotNull())
        .withColumn("purgatory", F.coalesce("purgatory", F.lit("(all)")))
        .withColumn("expiry_rate", F.col("expired") / F.col("ops"))
        .orderBy("scenario", "purgatory")
    )


def hot_keys(facts: Any, top: int) -> Any:
    """The ``top`` keys of each scenario by ops and by expiries.

    Columns: ``scenario, purgatory, key, ops, expired, completed, wait_p99,
    rank_by_ops, rank_by_expired`` (``rank_by_expired`` null for keys without
    expiries). A key is a (purgatory, key) pair; ops finished at once have no keys.

    Raises:
        ValueError: ``top`` < 1.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be an int >= 1, got {top!r}")
    per_key = (
        facts.select("scenario", "purgatory", "outcome", "wait", F.explode("keys").alias("key"))
        .groupBy("scenario", "purgatory", "key")
        .agg(
            F.count(F.lit(1)).alias("ops"),
            F.sum(F.when(F.col("outcome") == "expired", 1).otherwise(0)).alias("expired"),
            F.sum(F.when(F.col("outcome") == "completed", 1).otherwise(0)).alias("completed"),
            F.percentile_approx("wait", 0.99, PERCENTILE_ACCURACY).alias("wait_p99"),
        )
    )
    by_ops = Window.partitionBy("scenario").orderBy(F.desc("ops"), "purgatory", "key")
    by_expired = Window.partitionBy("scenario").orderBy(F.desc("expired"), "purgatory", "key")
    ranked = per_key.select(
        "*",
        F.row_number().over(by_ops).alias("rank_by_ops"),
        F.when(F.col("expired") > 0, F.row_number().over(by_expired)).alias("rank_by_expired"),
    )
    return ranked.where((F.col("rank_by_ops") <= top) | (F.col("rank_by_expired") <= top)).orderBy(
        "scenario", "rank_by_ops"
    )


def analyze_facts(
    spark: Any,
    facts_path: str | Path,
    out: str | Path,
    *,
    interval: float = 1.0,
    top: int = 20,
    quality: Quality | None = None,
    title: str = "aiopurgatory op analysis",
    report: bool = True,
    extra: dict[str, Any] | None = None,
) -> AnalysisResult:
    """Write rollups, hot keys, summary, malformed lines and the report for a fact table.

    Shared by ``analyze`` (facts from event logs) and ``replay`` (facts from a replay).

    Args:
        spark: a SparkSession.
        facts_path: the fact table (Parquet) to read.
        out: the output directory.
        interval: rollup interval, seconds.
        top: hot keys per ranking.
        quality: line counts of the event log read, if any.
        title: the report's title.
        report: write ``report.md`` and plots.
        extra: more facts for the report (e.g. replay timings), name -> value.
    """
    from pyspark.sql import functions as F

    out = Path(out)
    seconds: dict[str, float] = {}
    facts = spark.read.parquet(str(facts_path))
    started = time.perf_counter()
    rollups(facts, interval).write.mode("overwrite").parquet(str(out / "rollups"))
    seconds["rollups"] = time.perf_counter() - started
    started = time.perf_counter()
    hot = hot_keys(facts, top)
    hot.write.mode("overwrite").parquet(str(out / "hot_keys"))
    hot_pd = spark.read.parquet(str(out / "hot_keys")).toPandas()
    seconds["hot_keys"] = time.perf_counter() - started
    started = time.perf_counter()
    summary(facts).write.mode("overwrite").parquet(str(out / "summary"))
    summary_pd = (
        spark.read.parquet(str(out / "summary")).orderBy("scenario", "purgatory").toPandas()
    )
    seconds["summary"] = time.perf_counter() - started
    if quality is not None:
        (out / "quality.json").write_text(json.dumps(asdict(quality), indent=2, default=str))
        schema = "source string, line long, problem string, text string"
        rows = [(e["source"], e["line"], e["problem"], e["text"]) for e in quality.examples]
        spark.createDataFrame(rows, schema).write.mode("overwrite").parquet(str(out / "malformed"))
    report_path = None
    if report:
        from .report import write_report

        started = time.perf_counter()
        rollups_pd = spark.read.parquet(str(out / "rollups")).toPandas()
        histograms = _histograms(facts, F)
        report_path = write_report(
            out,
            title=title,
            summary=summary_pd,
            rollups=rollups_pd,
            hot_keys=hot_pd,
            histograms=histograms,
            quality=quality,
            interval=interval,
            extra=extra or {},
        )
        seconds["report"] = time.perf_counter() - started
    return AnalysisResult(out, summary_pd, hot_pd, quality, report_path, seconds)


#: Histogram bins per decade of seconds (log scale); zero goes to its own bin.
BINS_PER_DECADE = 10


def _histograms(facts: Any, F: Any) -> Any:
    """Log-binned counts of wait (by outcome) and of lateness, computed in Spark."""

    def binned(column: str) -> Any:
        return F.when(F.col(column) > 0, F.floor(F.log10(column) * BINS_PER_DECADE)).cast("int")

    wait = facts.groupBy(
        "scenario", F.lit("wait").alias("metric"), "outcome", binned("wait").alias("bin")
    ).count()
    late = (
        facts.where(F.col("lateness").isNotNull())
        .groupBy(
            "scenario",
            F.lit("lateness").alias("metric"),
            "outcome",
            binned("lateness").alias("bin"),
        )
        .count()
    )
    return wait.unionByName(late).toPandas()


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="aiopurgatory analyze",
        description="Analyse aiopurgatory op event logs (schema 1) with Spark.",
    )
    p.add_argument("events", nargs="+", help="event log files, directories or globs (any URI)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--master",
        default=DEFAULT_MASTER,
        help="Spark master: local[*] (default), spark://..., yarn, or sc://host:port (Connect)",
    )
    p.add_argument("--interval", type=float, default=1.0, help="rollup interval, seconds")
    p.add_argument("--top", type=int, default=20, help="hot keys per ranking")
    p.add_argument("--no-report", action="store_true", help="tables only")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="Spark setting")
    return p


def parse_conf(items: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings -> dict; raises ValueError naming a bad item."""
    conf = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--conf: expected KEY=VALUE, got {item!r}")
        conf[key] = value
    return conf


def main(argv: list[str]) -> int:
    """Run ``aiopurgatory analyze``; returns the exit status."""
    args = _build_parser().parse_args(argv)
    if not args.interval > 0 or args.top < 1:
        print("aiopurgatory analyze: --interval must be > 0 and --top >= 1", file=sys.stderr)
        return 2
    try:
        conf = parse_conf(args.conf)
    except ValueError as exc:
        print(f"aiopurgatory analyze: {exc}", file=sys.stderr)
        return 2
    from .report import print_summary
    from .session import cli_session, spark_path

    started = time.perf_counter()
    spark, status = cli_session("aiopurgatory analyze", args.master, args.events, conf)
    if spark is None:
        return status
    session_s = time.perf_counter() - started
    # Absolute, so that a Spark Connect server resolves them as this process does.
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    quality = read_events(spark, [spark_path(path) for path in args.events], out / "facts")
    read_s = time.perf_counter() - started
    result = analyze_facts(
        spark,
        out / "facts",
        out,
        interval=args.interval,
        top=args.top,
        quality=quality,
        report=not args.no_report,
        extra={"inputs": ", ".join(args.events)},
    )
    result.seconds = {"session": session_s, "read+facts": read_s, **result.seconds}
    print_summary(result)
    return 0
