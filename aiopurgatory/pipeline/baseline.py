"""The plain PySpark job that ``aiopurgatory analyze`` is measured against.

What a user would write by hand to get the same tables from op event logs:
an explicit schema, JSON lines to Parquet facts, then rollups per purgatory and
interval (counts by outcome, ``percentile_approx`` of wait and lateness), a
per-purgatory summary (plus an ``(all)`` row) and the top keys by ops and by
expiries, each computed from the written facts with the DataFrame API and
written as Parquet. No malformed-line accounting, no report.

It is a yardstick, not part of the pipeline: ``python -m
aiopurgatory.pipeline.benchmark`` runs it next to ``analyze`` on the same events
with :func:`compare_with_analyze` (see ``docs/pipeline.md``), and ``python -m
aiopurgatory.pipeline.baseline EVENTS... --out DIR`` runs it alone and prints its
times as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..events import EVENT
from .schema import EVENT_FIELDS

__all__ = ["compare_with_analyze", "main", "run_baseline"]


def run_baseline(
    spark: Any, paths: Sequence[str], out: str | Path, *, interval: float = 1.0, top: int = 20
) -> dict[str, float]:
    """Write ``facts/``, ``rollups/``, ``summary/`` and ``hot_keys/`` under ``out``
    the plain way; returns the seconds of each step."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    out = Path(out)
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    schema = ", ".join(f"`{name}` {ddl}" for name, ddl in EVENT_FIELDS.items())
    events = spark.read.schema(schema).option("recursiveFileLookup", "true").json(list(paths))
    facts = events.where(F.col("event") == EVENT).select(
        F.lit("observed").alias("scenario"),
        F.col("_metadata.file_path").alias("source"),
        "purgatory",
        "op_id",
        "op_type",
        "keys",
        "timeout",
        "watched_at",
        "finished_at",
        "outcome",
        "wait",
        "lateness",
        "ts",
    )
    facts.write.mode("overwrite").parquet(str(out / "facts"))
    seconds["facts"] = time.perf_counter() - started

    facts = spark.read.parquet(str(out / "facts"))
    counts = [
        F.count(F.lit(1)).alias("ops"),
        *[
            F.count(F.when(F.col("outcome") == o, 1)).alias(o)
            for o in ("completed", "expired", "cancelled", "failed")
        ],
        F.percentile_approx("wait", [0.5, 0.95, 0.99]).alias("wait_p"),
        F.max("wait").alias("wait_max"),
        F.percentile_approx("lateness", 0.99).alias("lateness_p99"),
        F.max("lateness").alias("lateness_max"),
    ]
    waits = [F.col("wait_p")[i].alias(f"wait_p{p}") for i, p in enumerate((50, 95, 99))]
    rest = ["wait_max", "lateness_p99", "lateness_max"]
    rate = (F.col("expired") / F.col("ops")).alias("expiry_rate")
    outcomes = ["ops", "completed", "expired", "cancelled", "failed"]

    started = time.perf_counter()
    start = (F.floor(F.col("finished_at") / interval) * interval).alias("interval_start")
    (
        facts.groupBy("scenario", "purgatory", start)
        .agg(*counts)
        .select("scenario", "purgatory", "interval_start", *outcomes, rate, *waits, *rest)
        .orderBy("scenario", "purgatory", "interval_start")
        .write.mode("overwrite")
        .parquet(str(out / "rollups"))
    )
    seconds["rollups"] = time.perf_counter() - started

    started = time.perf_counter()
    per_purgatory = facts.groupBy("scenario", "purgatory").agg(*counts)
    overall = facts.groupBy("scenario").agg(*counts).withColumn("purgatory", F.lit("(all)"))
    (
        per_purgatory.unionByName(overall)
        .select("scenario", "purgatory", *outcomes, rate, *waits, *rest)
        .orderBy("scenario", "purgatory")
        .write.mode("overwrite")
        .parquet(str(out / "summary"))
    )
    seconds["summary"] = time.perf_counter() - started

    started = time.perf_counter()
    per_key = (
        facts.select("scenario", "purgatory", "outcome", "wait", F.explode("keys").alias("key"))
        .groupBy("scenario", "purgatory", "key")
        .agg(
            F.count(F.lit(1)).alias("ops"),
            F.count(F.when(F.col("outcome") == "expired", 1)).alias("expired"),
            F.count(F.when(F.col("outcome") == "completed", 1)).alias("completed"),
            F.percentile_approx("wait", 0.99).alias("wait_p99"),
        )
    )
    by_ops = Window.partitionBy("scenario").orderBy(F.desc("ops"), "purgatory", "key")
    by_expired = Window.partitionBy("scenario").orderBy(F.desc("expired"), "purgatory", "key")
    (
        per_key.withColumn("rank_by_ops", F.row_number().over(by_ops))
        .withColumn(
            "rank_by_expired",
            F.when(F.col("expired") > 0, F.row_number().over(by_expired)),
        )
        .where((F.col("rank_by_ops") <= top) | (F.col("rank_by_expired") <= top))
        .orderBy("scenario", "rank_by_ops")
        .write.mode("overwrite")
        .parquet(str(out / "hot_keys"))
    )
    seconds["hot_keys"] = time.perf_counter() - started
    return seconds


#: What :func:`compare_with_analyze` runs, in this order.
VARIANTS = ("analyze_tables", "analyze_report", "baseline")


def compare_with_analyze(
    events: Path, out: Path, *, master: str, rounds: int, variants: Sequence[str] = VARIANTS
) -> dict[str, Any]:
    """Wall time and peak memory of ``aiopurgatory analyze`` and of the baseline job
    on the same events, each run end to end in a fresh process (Spark session
    included), in turns: analyze (``analyze_tables``: ``--no-report``), analyze with
    its report (``analyze_report``), then the baseline, ``rounds`` times, so that a
    change of the machine's load hits all; ``variants`` picks some of them.

    Peak RSS is sampled from /proc every 0.1 s over the run's process tree: the
    driver JVM, the Python workers (``pyspark.daemon``/``worker``) and the driver's
    Python process, each a sum over its processes at one instant; ``cpu_s`` is
    their CPU time, which depends less on the machine's load than wall time.
    """
    commands = {
        "analyze": [sys.executable, "-m", "aiopurgatory.cli", "analyze"],
        "baseline": [sys.executable, "-m", "aiopurgatory.pipeline.baseline"],
    }
    known = {
        # --overwrite: each round writes the same --out again.
        "analyze_tables": [*commands["analyze"], str(events), "--no-report", "--overwrite"],
        "analyze_report": [*commands["analyze"], str(events), "--overwrite"],
        "baseline": [*commands["baseline"], str(events)],
    }
    unknown = set(variants) - set(known)
    if unknown or not variants or rounds < 1:
        raise ValueError(f"variants must be some of {VARIANTS} and rounds >= 1")
    # The commands refuse an --out whose parent is missing: this is it.
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS if name in variants}
    for _ in range(rounds):
        for name in runs:
            command = known[name]
            load = os.getloadavg()[0]
            full = [*command, "--out", str(out / name), "--master", master]
            wall, peak, done = _timed_run(full)
            if done.returncode:
                raise RuntimeError(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}")
            steps = [line for line in done.stdout.splitlines() if line.startswith(("times:", "{"))]
            runs[name].append(
                {
                    "wall_s": round(wall, 2),
                    "loadavg_1min_before": load,
                    **peak,
                    "steps": steps[-1] if steps else None,
                }
            )
    result: dict[str, Any] = {"rounds": rounds, "master": master, "runs": runs}
    median = {name: statistics.median(r["wall_s"] for r in rs) for name, rs in runs.items()}
    result["median_wall_s"] = median
    result["median_cpu_s"] = {
        name: statistics.median(r["cpu_s"] for r in rs) for name, rs in runs.items()
    }
    for name in runs:
        if name != "baseline" and "baseline" in runs:
            ratios = [
                round(a["wall_s"] / b["wall_s"], 3)
                for a, b in zip(runs[name], runs["baseline"], strict=True)
            ]
            result[f"{name}_over_baseline"] = ratios
    return result


def _timed_run(command: list[str]) -> tuple[float, dict[str, Any], Any]:
    """Run ``command``; return its wall time, the peak RSS (MiB) of its driver JVM,
    Python workers and driver Python with the CPU seconds of these processes (as
    last sampled, up to 0.1 s before each ended), and the completed process."""
    peak = {
        "jvm_peak_rss_mib": 0,
        "python_workers_peak_rss_mib": 0,
        "driver_python_peak_rss_mib": 0,
    }
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()

    cpu_ticks: dict[int, int] = {}

    def sample() -> None:
        while not stop.wait(0.1):
            now = dict.fromkeys(peak, 0)
            for pid in [process.pid, *_descendants(process.pid)]:
                kind, rss = _kind_and_rss(pid, process.pid)
                if kind is not None:
                    now[kind] += rss
                    cpu_ticks[pid] = _cpu_ticks(pid) or cpu_ticks.get(pid, 0)
            for kind, value in now.items():
                peak[kind] = max(peak[kind], value)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = process.communicate()
    wall = time.perf_counter() - started
    stop.set()
    sampler.join()
    done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    usage: dict[str, Any] = {k: v // 1024 for k, v in peak.items()}
    usage["cpu_s"] = round(sum(cpu_ticks.values()) / os.sysconf("SC_CLK_TCK"), 1)
    return wall, usage, done


def _cpu_ticks(pid: int) -> int | None:
    """User + system CPU time of a process so far (clock ticks), None if it is gone."""
    from .cluster_processes import _stat_fields

    fields = _stat_fields(Path(f"/proc/{pid}"))
    return None if fields is None else int(fields[11]) + int(fields[12])


def _descendants(pid: int) -> list[int]:
    from .cluster_processes import _children

    return _children(pid)


def _kind_and_rss(pid: int, driver: int) -> tuple[str | None, int]:
    """Which peak a process counts in, and its RSS in KiB (None for a gone process
    or one of none of the three kinds)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None, 0
    rss = next(
        (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0
    )
    if pid == driver:
        return "driver_python_peak_rss_mib", rss
    if "java" in cmdline.split(" ", 1)[0]:
        return "jvm_peak_rss_mib", rss
    if "pyspark.daemon" in cmdline or "pyspark.worker" in cmdline:
        return "python_workers_peak_rss_mib", rss
    return None, 0


def main(argv: list[str] | None = None) -> int:
    """``python -m aiopurgatory.pipeline.baseline EVENTS... --out DIR``: run the job,
    print its times (session included) as JSON; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m aiopurgatory.pipeline.baseline")
    parser.add_argument("events", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from .session import get_spark

    started = time.perf_counter()
    spark = get_spark(args.master, app_name="aiopurgatory-baseline")
    session_s = time.perf_counter() - started
    seconds = run_baseline(
        spark,
        [str(Path(p).absolute()) for p in args.events],
        Path(args.out).absolute(),
        interval=args.interval,
        top=args.top,
    )
    total = time.perf_counter() - started
    print(
        json.dumps(
            {
                "session": round(session_s, 2),
                **{k: round(v, 2) for k, v in seconds.items()},
                "total": round(total, 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
