"""``aiopurgatory analyze``: op event logs -> Parquet tables, a report and a summary.

Reads event log lines (schema 2, and schema 1, see ``docs/events.md``) from files, directories
or globs on any filesystem Spark can read, with an explicit schema (no inference
pass), and writes under ``--out``:

``facts/``
    one row per finished op (:data:`~aiopurgatory.pipeline.schema.FACT_COLUMNS`).
``rollups/``
    per scenario, purgatory and ``--interval`` of ``finished_at``: ops, counts by
    outcome, ops answered with an error, wait p50/p95/p99/max, expiry rate,
    error rate, lateness p99/max.
``answers/``
    per scenario, purgatory, outcome and error (null: no error): ops, share of
    the scenario's ops, wait p50/p99/max.
``hot_keys/``
    the ``--top`` keys by ops and by expiries.
``summary/``
    per scenario and purgatory (and ``(all)``): totals and percentiles.
``malformed/``
    lines that are not valid op events: file, line, reason, text.
``report.md`` and its PNG plots; ``quality.json`` (line counts).

Malformed lines never stop a run: they are counted (during the facts write,
through a Spark ``Observation``) and, if there are any, located in a second pass.

Percentiles are Spark's ``percentile_approx`` (rank error at most 1/10000 of the
group size; on smaller groups it is the exact nearest-rank percentile).

This module reads the logs and writes the tables; the tables themselves are
computed in :mod:`aiopurgatory.pipeline.aggregates` (re-exported here).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .._clitools import OutputDir, Parser, Steps, UsageError, fail, require
from ..events import EVENT, SCHEMA_VERSIONS

# The tables computed from the facts: a module of their own, re-exported here.
from .aggregates import (
    _ANSWERS_ORDER,
    _HOT_KEYS_ORDER,
    _ROLLUP_ORDER,
    _SUMMARY_ORDER,
    PERCENTILE_ACCURACY,
    _hot_keys,
    _rollups_of,
    _summary_of,
    _tables,
    answers,
    histograms,
    hot_keys,
    rollups,
    summary,
)
from .schema import CORRUPT_COLUMN, EVENT_FIELDS, FACT_COLUMNS, OUTCOMES, event_schema
from .session import add_session_options, parse_conf
from .tables import BINS_PER_DECADE, MALFORMED_DETAIL_LIMIT, AnalysisResult, Quality

__all__ = [
    "BINS_PER_DECADE",
    "MALFORMED_DETAIL_LIMIT",
    "PERCENTILE_ACCURACY",
    "AnalysisResult",
    "Quality",
    "analyze_facts",
    "answers",
    "histograms",
    "hot_keys",
    "main",
    "read_events",
    "rollups",
    "summary",
]

#: What a non-blank line can be (``quality.json`` counts each).
KINDS = ("event", "other", "malformed")
_REQUIRED = ("purgatory", "op_id", "timeout", "watched_at", "finished_at", "outcome", "wait")


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
        .when(
            ~e["schema"].isin(*SCHEMA_VERSIONS),
            F.concat(F.lit("unsupported schema "), e["schema"]),
        )
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
    # The same tests as the locating pass, on the columns (the optimizer turns the
    # struct's field references back into plain column references).
    row = F.struct(*[F.col(name) for name in (*EVENT_FIELDS, CORRUPT_COLUMN)])
    events = events.select(
        F.col("_metadata.file_path").alias("source"), "*", _kind(row).alias("kind")
    )
    observation = Observation("aiopurgatory_event_quality")
    observed = events.observe(
        observation,
        F.count(F.lit(1)).alias("lines"),
        *[F.count(F.when(F.col("kind") == kind, 1)).alias(kind) for kind in KINDS],
        F.count(F.when((F.col("kind") == "event") & (F.col("schema") == 1), 1)).alias("schema1"),
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
        schema1=int(counts.get("schema1") or 0),
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
    steps: Steps | None = None,
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
        steps: prints each step on stderr as it starts and ends.
    """

    def step(name: str, what: str) -> Any:
        return steps.step(name, what) if steps is not None else contextlib.nullcontext()

    out = Path(out)
    seconds: dict[str, float] = {}
    facts = spark.read.parquet(str(facts_path))
    started = time.perf_counter()
    # Each table is computed once (one aggregate for rollups and summary, one for
    # the hot keys), kept by a local checkpoint, then written and brought to the
    # driver from there; written as one sorted file each (small tables), without
    # the sampling job of a global sort.
    with step("tables", "rollups and summary"):
        tables = _tables(facts, interval).localCheckpoint()
        _write_sorted(_rollups_of(tables), _ROLLUP_ORDER, out / "rollups")
        summary_pd = _to_pandas(_summary_of(tables), _SUMMARY_ORDER)
        _write_sorted(_summary_of(tables), _SUMMARY_ORDER, out / "summary")
    seconds["rollups+summary"] = time.perf_counter() - started
    started = time.perf_counter()
    with step("hot keys", f"top {top} by ops and by expiries"):
        hot = _hot_keys(facts, top).localCheckpoint()
        _write_sorted(hot, _HOT_KEYS_ORDER, out / "hot_keys")
        hot_pd = _to_pandas(hot, _HOT_KEYS_ORDER)
    seconds["hot_keys"] = time.perf_counter() - started
    started = time.perf_counter()
    with step("answers", "ops by outcome and error"):
        answers_df = answers(facts).localCheckpoint()
        _write_sorted(answers_df, _ANSWERS_ORDER, out / "answers")
        answers_pd = _to_pandas(answers_df, _ANSWERS_ORDER)
    seconds["answers"] = time.perf_counter() - started
    if quality is not None:
        (out / "quality.json").write_text(json.dumps(asdict(quality), indent=2, default=str))
        _malformed_frame(spark, quality).write.mode("overwrite").parquet(str(out / "malformed"))
    report_path = None
    if report:
        from .report import write_report

        started = time.perf_counter()
        with step("report", "report.md and plots"):
            rollups_pd = _to_pandas(_rollups_of(tables), _ROLLUP_ORDER)
            report_path = write_report(
                out,
                title=title,
                summary=summary_pd,
                rollups=rollups_pd,
                hot_keys=hot_pd,
                answers=answers_pd,
                histograms=histograms(facts),
                top=top,
                quality=quality,
                interval=interval,
                extra=extra or {},
            )
        seconds["report"] = time.perf_counter() - started
    return AnalysisResult(out, summary_pd, hot_pd, answers_pd, quality, report_path, seconds)


def _write_sorted(frame: Any, order: Sequence[str], path: Path) -> None:
    frame.coalesce(1).sortWithinPartitions(*order).write.mode("overwrite").parquet(str(path))


def _to_pandas(frame: Any, order: Sequence[str]) -> Any:
    return frame.toPandas().sort_values(list(order), kind="stable").reset_index(drop=True)


def _malformed_frame(spark: Any, quality: Quality) -> Any:
    """The located malformed lines as a DataFrame (``malformed/``). Without any, an
    empty frame made in the JVM: a Python list would start Python workers."""
    from pyspark.sql import functions as F

    columns = {"source": "string", "line": "bigint", "problem": "string", "text": "string"}
    if not quality.examples:
        return spark.range(0).select(
            *[F.lit(None).cast(ddl).alias(name) for name, ddl in columns.items()]
        )
    rows = [tuple(example[name] for name in columns) for example in quality.examples]
    return spark.createDataFrame(rows, ", ".join(f"{n} {d}" for n, d in columns.items()))


def _build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="aiopurgatory analyze",
        description="Analyse aiopurgatory op event logs (schema 2, or 1) with Spark.",
    )
    p.add_argument("events", nargs="+", help="event log files, directories or globs (any URI)")
    p.add_output_dir()
    add_session_options(p)
    add_analysis_options(p)
    return p


def add_analysis_options(parser: argparse.ArgumentParser) -> None:
    """``--interval``, ``--top`` and ``--no-report``: what :func:`analyze_facts` takes
    from the command line (``analyze`` and ``replay``); checked by
    :func:`check_analysis_options`."""
    parser.add_argument("--interval", type=float, default=1.0, help="rollup interval, seconds")
    parser.add_argument(
        "--top", type=int, default=20, help="hot keys per ranking (report and table)"
    )
    parser.add_argument(
        "--no-report", action="store_true", help="tables only (no report.md, no plots)"
    )


def analysis_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :func:`analyze_facts` keywords that :func:`add_analysis_options` reads
    (``interval``, ``top``, ``report``).

    Raises:
        UsageError: ``--interval`` is not > 0, or ``--top`` is < 1.
    """
    if not args.interval > 0 or args.top < 1:
        raise UsageError("--interval must be > 0 and --top >= 1")
    return {"interval": args.interval, "top": args.top, "report": not args.no_report}


def print_result(result: AnalysisResult, output: OutputDir, steps: Steps) -> None:
    """Point ``result`` at the committed ``output`` directory, add the steps' times
    and print the summary (the end of ``analyze`` and ``replay``)."""
    from .report import print_summary

    result.out = output.path
    if result.report is not None:
        result.report = output.path / result.report.name
    result.seconds = dict(steps.seconds)
    print_summary(result)


def _not_event_logs(paths: Sequence[str], limit: int = 1000) -> str | None:
    """Why a local input cannot be an event log (a Parquet file, binary data), or None.

    Looks at the first 4 KiB of up to ``limit`` local files (those Spark would
    read: ``_*`` and ``.*`` names skipped); URIs are not looked at.
    """
    from .session import _URI_SCHEME

    seen = 0
    for path in paths:
        if _URI_SCHEME.match(path):
            continue
        for name in sorted(glob.glob(path) if glob.has_magic(path) else [path]):
            top = Path(name)
            files = sorted(top.rglob("*")) if top.is_dir() else [top]
            for file in files:
                if not file.is_file() or file.name.startswith(("_", ".")):
                    continue
                seen += 1
                if seen > limit:
                    return None
                with file.open("rb") as handle:
                    head = handle.read(4096)
                if head.startswith(b"PAR1"):
                    return f"{file} is a Parquet file, not an event log (JSON lines)"
                if b"\0" in head:
                    return f"{file} is not text: an event log is JSON lines"
    return None


def main(argv: list[str]) -> int:
    """Run ``aiopurgatory analyze``; returns the exit status."""
    prog = "aiopurgatory analyze"
    args = _build_parser().parse_args(argv)
    try:
        options = analysis_options(args)
        conf = parse_conf(args.conf)
        from .session import check_master, is_connect, missing_inputs

        # What needs none of the extra's modules first: a mistyped argument is
        # refused without the seconds their imports take.
        check_master(args.master)
        missing = [] if is_connect(args.master) else missing_inputs(args.events)
        if missing:
            raise UsageError(f"no such file or directory: {', '.join(missing)}")
        problem = _not_event_logs(args.events)
        if problem:
            raise UsageError(problem)
        output = OutputDir(
            args.out, overwrite=args.overwrite, inputs=args.events, command="analyze"
        )
        require(
            ["pyspark", "pandas", "pyarrow", "rich", *([] if args.no_report else ["matplotlib"])],
            "spark",
        )
        from .session import check_reachable

        check_reachable(args.master)
    except (UsageError, ValueError) as exc:
        return fail(prog, exc)
    except ConnectionError as exc:  # MasterUnreachableError
        return fail(prog, exc, 1)
    from .session import cli_session, spark_path

    steps = Steps(prog)
    spark, status = steps.run(
        "session",
        f"starting Spark ({args.master})",
        lambda: cli_session(prog, args.master, args.events, conf),
    )
    if spark is None:
        return status
    with output.open() as out:
        with steps.step("read", f"event logs {' '.join(args.events)} -> facts"):
            quality = read_events(spark, [spark_path(path) for path in args.events], out / "facts")
        steps.say(
            f"read: {quality.lines:,} lines, {quality.events:,} op events, "
            f"{quality.other:,} other, {quality.malformed:,} malformed"
        )
        if not quality.events:
            first = quality.examples[0] if quality.examples else None
            where = (
                f"; first: {first['source']}:{first['line']}: {first['problem']}" if first else ""
            )
            return fail(
                prog,
                f"no op event in the input ({quality.lines:,} lines: {quality.other:,} other "
                f"events, {quality.malformed:,} malformed{where}); nothing written",
                1,
            )
        result = analyze_facts(
            spark,
            out / "facts",
            out,
            **options,
            quality=quality,
            extra={"inputs": ", ".join(args.events)},
            steps=steps,
        )
        output.commit(argv)
    print_result(result, output, steps)
    return 0
