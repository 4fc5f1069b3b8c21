"""``aiopurgatory replay``: replay a request trace through the real purgatory on Spark.

The trace (Parquet, or CSV) is cross-joined with the parameter sets of the sweep
(``--timeout 0.5,1,30 --min-insync 2,3`` gives six scenarios) and grouped by
(scenario, broker); each group runs :func:`~aiopurgatory.pipeline.replay_core.replay_requests`
in a Spark task (``applyInPandas``) on virtual time. Only DataFrame APIs are used,
so it also runs over Spark Connect. The output is the same per-op fact table as
``analyze`` writes, followed by the same rollups, hot keys, summary and report;
``scenarios/`` maps each scenario label to its parameters.

``--local`` runs the same replay in this process without Spark (the reference the
tests compare the Spark replay with), then analyses it with Spark as usual.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .replay_core import ReplayParams, parse_sweep, replay_requests
from .schema import TRACE_COLUMNS, fact_ddl
from .session import DEFAULT_MASTER

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["main", "read_trace", "replay_spark"]


def read_trace(spark: Any, path: str) -> Any:
    """Read a trace as a Spark DataFrame with the trace columns and types.

    Parquet (file or directory) is read as written and cast to the trace types;
    ``*.csv`` is read with an explicit schema, ``replica_delays`` being a
    ``;``-separated list of seconds (an empty item or ``inf`` = never acknowledges).

    Raises:
        ValueError: the trace lacks a column.
    """
    from pyspark.sql import functions as F

    if path.lower().endswith(".csv"):
        ddl = ", ".join(
            f"`{name}` {'string' if name == 'replica_delays' else kind}"
            for name, kind in TRACE_COLUMNS.items()
        )
        frame = spark.read.schema(ddl).option("header", "true").csv(path)
        items = F.split(F.coalesce(F.col("replica_delays"), F.lit("")), ";")
        delays = F.transform(
            items,
            lambda item: F.when(F.trim(item) == "", F.lit(None)).otherwise(item.cast("double")),
        )
        frame = frame.withColumn("replica_delays", delays)
    else:
        frame = spark.read.parquet(path)
    missing = set(TRACE_COLUMNS) - set(frame.columns)
    if missing:
        raise ValueError(f"trace {path}: missing columns {sorted(missing)}")
    return frame.select(
        *[F.col(name).cast(kind).alias(name) for name, kind in TRACE_COLUMNS.items()]
    )


def _replay_group(source: str, group: pd.DataFrame) -> pd.DataFrame:
    """One (scenario, broker) group in a Spark task."""
    first = group.iloc[0]
    params = ReplayParams(
        timeout=float(first["p_timeout"]),
        min_insync=int(first["p_min_insync"]),
        tick=float(first["p_tick"]),
        wheel_size=int(first["p_wheel_size"]),
    )
    return replay_requests(group, params, purgatory=f"broker-{int(first['broker'])}", source=source)


def replay_spark(
    spark: Any,
    trace: Any,
    param_sets: Sequence[ReplayParams],
    *,
    source: str = "",
    partitions: int | None = None,
) -> Any:
    """The Spark replay: facts of every (parameter set, broker) group, as a DataFrame.

    Args:
        spark: a SparkSession (classic or Connect).
        trace: the trace DataFrame (see :func:`read_trace`).
        param_sets: at least one parameter set.
        source: the facts' ``source`` column.
        partitions: Spark tasks of the replay stage; default: one per (parameter
            set, broker) group (counting the brokers takes one small job). Groups
            are hashed to tasks, so some tasks may get two groups and some none.

    Raises:
        ValueError: ``param_sets`` is empty, or ``partitions`` < 1.
    """
    from pyspark.sql import functions as F

    if not param_sets:
        raise ValueError("param_sets must not be empty")
    if partitions is None:
        partitions = max(1, trace.select("broker").distinct().count()) * len(param_sets)
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions must be an int >= 1, got {partitions!r}")
    params = spark.createDataFrame(
        [(p.label, p.timeout, p.min_insync, p.tick, p.wheel_size) for p in param_sets],
        "scenario string, p_timeout double, p_min_insync int, p_tick double, p_wheel_size int",
    )

    # A plain function (not functools.partial), so that pyspark's eval-type
    # inference from type hints does not warn.
    def replay_group(group: pd.DataFrame) -> pd.DataFrame:
        return _replay_group(source, group)

    # An explicit number of partitions: adaptive execution would otherwise merge
    # the small shuffle into one task and replay every group on one core. The
    # grouping reuses this partitioning (no second shuffle).
    return (
        trace.crossJoin(F.broadcast(params))
        .repartition(partitions, "scenario", "broker")
        .groupBy("scenario", "broker")
        .applyInPandas(replay_group, schema=fact_ddl())
    )


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="aiopurgatory replay",
        description=(
            "Replay a produce-request trace through aiopurgatory's Purgatory on virtual time, "
            "in Spark tasks partitioned by broker. Comma-separated values sweep."
        ),
    )
    p.add_argument("trace", help="trace file: Parquet (file or directory) or .csv")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--timeout", default="30", help="produce timeout(s), seconds, e.g. 0.5,1,30")
    p.add_argument("--min-insync", default="2", help="replicas needed for acks=all, e.g. 2,3")
    p.add_argument("--tick", default="0.001", help="timer tick(s), seconds")
    p.add_argument("--wheel-size", default="20", help="timing wheel size(s)")
    p.add_argument(
        "--master",
        default=DEFAULT_MASTER,
        help="Spark master: local[*] (default), spark://..., yarn, or sc://host:port (Connect)",
    )
    p.add_argument("--local", action="store_true", help="replay in this process (no Spark tasks)")
    p.add_argument("--interval", type=float, default=1.0, help="rollup interval, seconds")
    p.add_argument("--top", type=int, default=20, help="hot keys per ranking")
    p.add_argument("--no-report", action="store_true", help="tables only")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="Spark setting")
    return p


def main(argv: list[str]) -> int:
    """Run ``aiopurgatory replay``; returns the exit status."""
    args = _build_parser().parse_args(argv)
    from .analyze import analyze_facts, parse_conf

    try:
        param_sets = parse_sweep(args.timeout, args.min_insync, args.tick, args.wheel_size)
        conf = parse_conf(args.conf)
        if not args.interval > 0 or args.top < 1:
            raise ValueError("--interval must be > 0 and --top >= 1")
    except (TypeError, ValueError) as exc:
        print(f"aiopurgatory replay: {exc}", file=sys.stderr)
        return 2
    from .report import print_summary
    from .session import cli_session, spark_path

    seconds: dict[str, float] = {}
    started = time.perf_counter()
    spark, status = cli_session("aiopurgatory replay", args.master, [args.trace], conf)
    if spark is None:
        return status
    seconds["session"] = time.perf_counter() - started
    # Absolute, so that a Spark Connect server resolves them as this process does.
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    if args.local:
        from .replay_core import replay_trace
        from .trace import read_trace_pandas

        trace_pd = read_trace_pandas(args.trace)
        requests = len(trace_pd)
        facts_pd = replay_trace(trace_pd, param_sets, source=args.trace)
        facts_pd.to_parquet(out / "facts.parquet", index=False)
        facts_path = out / "facts.parquet"
    else:
        trace = read_trace(spark, spark_path(args.trace))
        requests = trace.count()
        replay_spark(spark, trace, param_sets, source=args.trace).write.mode("overwrite").parquet(
            str(out / "facts")
        )
        facts_path = out / "facts"
    seconds["replay"] = time.perf_counter() - started
    spark.createDataFrame(
        [(p.label, p.timeout, p.min_insync, p.tick, p.wheel_size) for p in param_sets],
        "scenario string, timeout double, min_insync int, tick double, wheel_size int",
    ).write.mode("overwrite").parquet(str(out / "scenarios"))

    simulated = requests * len(param_sets)
    rate = simulated / seconds["replay"] if seconds["replay"] > 0 else float("nan")
    result = analyze_facts(
        spark,
        facts_path,
        out,
        interval=args.interval,
        top=args.top,
        title="aiopurgatory trace replay",
        report=not args.no_report,
        extra={
            "trace": f"{args.trace} ({requests:,} requests)",
            "scenarios": len(param_sets),
            "replay": (
                f"{simulated:,} simulated requests in {seconds['replay']:.1f} s "
                f"({rate:,.0f}/s, {'one process' if args.local else 'Spark ' + args.master})"
            ),
        },
    )
    result.seconds = {**seconds, **result.seconds}
    print_summary(result)
    return 0
