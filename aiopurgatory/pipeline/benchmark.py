"""Pipeline benchmarks (not tests): analyze N events and replay M requests on Spark.

``python -m aiopurgatory.pipeline.benchmark --events 1000000 --requests 100000
--master local[2] --dir /tmp/aiopurgatory-bench`` prints one JSON object with the
times (wall seconds) and rows per second of each step, plus the load average
(the machine may be shared), and the single-process replay rate in CPU time.
Analyze is measured against the plain PySpark job of
:mod:`aiopurgatory.pipeline.baseline`: each in its own process, end to end, in
turns (``--analyze-rounds``), with the peak RSS of the JVM and Python workers.

The Spark replay runs ``--replay-rounds`` times in the one session (the first
with a cold JVM and Python workers, as a single CLI run gets it) for each data
path of ``--replay-io`` (``files``, the CLI's default for a Parquet trace, and/or
``spark``), and is compared per core with the single-process core.
``--end-to-end`` also times the CLI as a user runs it, ``aiopurgatory replay
TRACE --timeout T --no-report`` with ``--local`` and with ``--master``, each in a
fresh process, in turns (``--rounds``), and reports the ratio of the medians.

``--no-spark`` measures only the single-process replay core (no Spark session);
``--compare-plain`` also replays the same trace with the plain loop path (one
event-loop turn per event time, ``fast=False``), reports its rate and checks that
both produce identical facts.

``--compare-masters 'local[1],local[2],cluster' --rounds 2`` measures the Spark
replay (read, replay, write ``facts/``) on each master side by side: every run in
a fresh process, the masters in turns (A B C A B C), so that a change of the
machine's load hits all of them. ``cluster`` is a local standalone cluster (two
Workers of one core, :mod:`aiopurgatory.pipeline.cluster`) started for the
comparison and stopped after it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "write_synthetic_events"]


def write_synthetic_events(path: Path, n: int, *, seed: int = 0, files: int = 4) -> int:
    """Write ``n`` schema-1 op events spread over ``files`` JSON-lines files; return bytes."""
    from ..events import EVENT, SCHEMA_VERSION

    rng = random.Random(seed)
    path.mkdir(parents=True, exist_ok=True)
    total = 0
    per_file = -(-n // files)
    op_id = 0
    for f in range(files):
        with (path / f"events-{f}.jsonl").open("w", encoding="utf-8") as out:
            lines = []
            for _ in range(min(per_file, n - op_id)):
                watched = op_id / 50_000.0
                expired = rng.random() < 0.05
                lateness = rng.random() * 0.001 if expired else None
                wait = 0.2 + (lateness or 0.0) if expired else rng.lognormvariate(-5, 1)
                event = {
                    "event": EVENT,
                    "schema": SCHEMA_VERSION,
                    "ts": 1.7e9 + watched,
                    "purgatory": "produce" if op_id % 4 else "fetch",
                    "op_id": op_id,
                    "op_type": "DelayedProduce",
                    "keys": [f"topic-{op_id % 7}-{rng.randrange(32)}"],
                    "timeout": 0.2,
                    "watched_at": watched,
                    "finished_at": watched + wait,
                    "outcome": "expired" if expired else "completed",
                    "wait": wait,
                    "lateness": lateness,
                }
                lines.append(json.dumps(event))
                op_id += 1
            text = "\n".join(lines) + "\n"
            out.write(text)
            total += len(text)
    return total


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m aiopurgatory.pipeline.benchmark")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--dir", default="/tmp/aiopurgatory-bench")
    parser.add_argument("--skip-analyze", action="store_true")
    parser.add_argument("--skip-replay", action="store_true")
    parser.add_argument(
        "--no-spark", action="store_true", help="only the single-process replay core"
    )
    parser.add_argument(
        "--compare-plain",
        action="store_true",
        help="also time the plain loop path (fast=False) and check identical facts",
    )
    parser.add_argument(
        "--no-single", action="store_true", help="skip the single-process replay measurement"
    )
    parser.add_argument(
        "--task-times",
        action="store_true",
        help="also report the replay stage's task durations (from the driver's REST API, "
        "web UI on a free port) and the machine's busy cores during the Spark replay",
    )
    parser.add_argument(
        "--compare-masters",
        metavar="M1,M2,...",
        help="replay on each master in turn, each run in its own process ('cluster': a "
        "local 2-worker standalone cluster started for the comparison)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="turns of --compare-masters")
    parser.add_argument(
        "--analyze-rounds",
        type=int,
        default=3,
        help="turns of analyze (tables only), analyze (with report) and the baseline job",
    )
    parser.add_argument(
        "--analyze-variants",
        default="analyze_tables,analyze_report,baseline",
        help="which of those to run",
    )
    parser.add_argument(
        "--timeouts",
        default="0.2",
        help="replay scenarios: comma-separated timeouts (min_insync 2), e.g. 0.2,1",
    )
    parser.add_argument(
        "--replay-io",
        default="files",
        help="the Spark replay's data path(s), comma-separated: files (the CLI's default "
        "for a Parquet trace: tasks read and write Parquet), spark (through Spark)",
    )
    parser.add_argument(
        "--replay-rounds",
        type=int,
        default=2,
        help="Spark replays of each --replay-io in one session (the first with a cold "
        "JVM and Python workers)",
    )
    parser.add_argument(
        "--end-to-end",
        action="store_true",
        help="also time the CLI end to end, `aiopurgatory replay TRACE --timeout ... "
        "--no-report` with --local and with --master, each a fresh process, in turns "
        "(--rounds)",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.compare_masters:
        return _compare_masters(args)

    from .replay_core import ReplayParams
    from .trace import TraceSpec, generate_trace_table, write_trace

    root = Path(args.dir)
    result: dict[str, Any] = {"master": None if args.no_spark else args.master}
    result["cpus"] = os.cpu_count()
    spark: Any = None
    ui_port: int | None = None
    if not args.no_spark:
        from .session import get_spark

        conf = {}
        if args.task_times:
            from .cluster import _free_port

            ui_port = _free_port()
            conf = {"spark.ui.enabled": "true", "spark.ui.port": str(ui_port)}
        started = time.perf_counter()
        spark = get_spark(args.master, app_name="aiopurgatory-benchmark", conf=conf)
        result["session_s"] = time.perf_counter() - started

    if not args.no_spark and not args.skip_analyze:
        from .baseline import compare_with_analyze

        events_dir = root / f"events-{args.events}"
        if not events_dir.exists():
            result["events_bytes"] = write_synthetic_events(events_dir, args.events)
        result["analyze"] = {
            "events": args.events,
            **compare_with_analyze(
                events_dir,
                root / "analyze-runs",
                master=args.master,
                rounds=args.analyze_rounds,
                variants=args.analyze_variants.split(","),
            ),
        }

    if not args.skip_replay:
        spec = TraceSpec(requests=args.requests, brokers=4, rate=20_000.0, seed=1)
        table = generate_trace_table(spec)
        params = [ReplayParams(timeout=float(t), min_insync=2) for t in args.timeouts.split(",")]
        simulated = args.requests * len(params)
        replay: dict[str, Any] = {
            "requests": args.requests,
            "brokers": spec.brokers,
            "scenarios": len(params),
            "simulated_requests": simulated,
        }
        trace_path = root / f"trace-{args.requests}.parquet"
        if spark is not None or args.end_to_end:
            write_trace(table, trace_path)
        if spark is not None:
            cores = _master_cores(spark)
            runs = [
                _spark_replay(spark, io, trace_path, root / "replay-facts", params, ui_port)
                for _ in range(args.replay_rounds)
                for io in args.replay_io.split(",")
            ]
            for run in runs:
                run["requests_per_s_per_core"] = round(simulated / run["spark_s"] / cores)
                if run.get("spark_cpu_s"):
                    run["requests_per_cpu_s"] = round(simulated / run["spark_cpu_s"])
            # The figures of the first run of the first --replay-io (the CLI's
            # default: files), as a user's single run gets them, cold JVM and all.
            first = runs[0]
            replay["spark_cores"] = cores
            replay["spark_runs"] = runs
            measured = ("spark_", "machine_", "replay_task_")
            replay.update({k: v for k, v in first.items() if k.startswith(measured)})
            replay["spark_requests_per_s"] = round(simulated / first["spark_s"])
            replay["spark_requests_per_s_per_core"] = first["requests_per_s_per_core"]
            if "requests_per_cpu_s" in first:
                replay["spark_requests_per_cpu_s"] = first["requests_per_cpu_s"]
            replay["peak_rss_mb"] = _tree_peak_rss_mb()
        if not args.no_single:
            from .replay_core import replay_trace_table

            cpu = time.process_time()
            wall = time.perf_counter()
            fast = replay_trace_table(table, params)
            cpu_s = time.process_time() - cpu
            replay["single_process_wall_s"] = round(time.perf_counter() - wall, 2)
            replay["single_process_cpu_s"] = round(cpu_s, 2)
            replay["single_process_requests_per_cpu_s"] = round(simulated / cpu_s)
            if "spark_requests_per_s_per_core" in replay:
                single = replay["single_process_requests_per_cpu_s"]
                replay["spark_per_core_vs_single"] = round(
                    replay["spark_requests_per_s_per_core"] / single, 2
                )
                for run in replay["spark_runs"]:
                    run["per_core_vs_single"] = round(run["requests_per_s_per_core"] / single, 2)
            if args.compare_plain:
                cpu = time.process_time()
                plain = replay_trace_table(table, params, fast=False)
                cpu_s = time.process_time() - cpu
                replay["plain_loop_cpu_s"] = round(cpu_s, 2)
                replay["plain_loop_requests_per_cpu_s"] = round(simulated / cpu_s)
                replay["same_facts"] = bool(fast.equals(plain))
        result["replay"] = replay
        if args.end_to_end:
            result["end_to_end"] = _end_to_end(args, trace_path)
    result["loadavg"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    return 0


def _end_to_end(args: argparse.Namespace, trace: Path) -> dict[str, Any]:
    """``aiopurgatory replay TRACE --timeout T --no-report`` with ``--local`` and with
    ``--master M``, each in a fresh process, in turns (``--rounds``): wall seconds,
    the CLI's own step times, the medians and Spark's ratio to ``--local``."""
    runs: dict[str, list[dict[str, Any]]] = {"local": [], "spark": []}
    for _ in range(args.rounds):
        for mode in runs:
            command = [sys.executable, "-m", "aiopurgatory.cli", "replay", str(trace)]
            command += ["--out", str(Path(args.dir) / f"end-to-end-{mode}")]
            command += ["--timeout", args.timeouts, "--no-report", "--master", args.master]
            command += ["--overwrite"]  # each round writes the same --out again
            command += ["--local"] if mode == "local" else []
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - started
            if done.returncode:
                raise RuntimeError(f"{' '.join(command)}: exit {done.returncode}\n{done.stderr}")
            steps = [line for line in done.stdout.splitlines() if line.startswith("times:")]
            runs[mode].append({"wall_s": round(wall, 2), "steps": steps[-1][7:] if steps else ""})
    medians = {mode: statistics.median(r["wall_s"] for r in rs) for mode, rs in runs.items()}
    return {
        "command": f"aiopurgatory replay TRACE --timeout {args.timeouts} --no-report "
        f"[--local | --master {args.master}]",
        "runs": runs,
        "median_wall_s": medians,
        "spark_vs_local": round(medians["spark"] / medians["local"], 2),
        "loadavg_after": os.getloadavg(),
    }


def _spark_replay(
    spark: Any,
    io: str,
    trace_path: Path,
    facts: Path,
    params: list[Any],
    ui_port: int | None,
) -> dict[str, Any]:
    """One Spark replay of the trace (read, replay, write ``facts``) by ``io``
    (``files``: :func:`~.replay.replay_files`; ``spark``: :func:`~.replay.replay_spark`);
    its wall and CPU seconds by process, busy cores and task times (with a UI port)."""
    from .replay import read_trace, replay_files, replay_spark

    cpu_before = _tree_cpu()
    busy = _busy_cores() if ui_port is not None else None
    started = time.perf_counter()
    if io == "files":
        replay_files(spark, trace_path, facts, params)
    elif io == "spark":
        frame = replay_spark(spark, read_trace(spark, str(trace_path)), params)
        frame.write.mode("overwrite").parquet(str(facts))
    else:
        raise ValueError(f"--replay-io: files or spark, got {io!r}")
    run: dict[str, Any] = {"io": io, "spark_s": round(time.perf_counter() - started, 2)}
    cpu_after = _tree_cpu()
    by_process = {k: v - cpu_before.get(k, 0.0) for k, v in cpu_after.items()}
    if sum(by_process.values()) > 0:
        # This process, the driver JVM and the Python workers (their CPU time).
        run["spark_cpu_s"] = round(sum(by_process.values()), 2)
        run["spark_cpu_s_by_process"] = {k: round(v, 2) for k, v in by_process.items()}
    if ui_port is not None:
        run["machine_busy_cores"] = _busy_cores(busy)
        run["replay_task_s"] = _last_stage_task_seconds(ui_port)
    return run


def _tree() -> list[Path]:
    """/proc entries of this process and its descendants (the driver JVM, Python workers)."""
    from .cluster_processes import _children

    return [Path("/proc") / str(pid) for pid in [os.getpid(), *_children(os.getpid())]]


def _kind(process: Path) -> str | None:
    """``driver_python`` (this process), ``driver_jvm`` or ``python_worker``; None if gone."""
    if process.name == str(os.getpid()):
        return "driver_python"
    try:
        command = (process / "cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return None
    return "driver_jvm" if command.endswith("java") else "python_worker"


def _tree_cpu() -> dict[str, float]:
    """CPU seconds of this process tree so far, by kind (see :func:`_kind`): every live
    process's user and system time, with that of its reaped children; {} without /proc."""
    from .cluster_processes import _stat_fields

    ticks: dict[str, int] = {}
    for process in _tree():
        fields = _stat_fields(process)
        kind = _kind(process)
        if fields is not None and kind is not None:
            # utime stime cutime cstime
            ticks[kind] = ticks.get(kind, 0) + sum(int(x) for x in fields[11:15])
    return {kind: n / os.sysconf("SC_CLK_TCK") for kind, n in ticks.items()}


def _tree_peak_rss_mb() -> dict[str, float]:
    """Peak resident set (VmHWM, MB) of the driver JVM and the largest Python worker."""
    peaks: dict[str, float] = {}
    for process in _tree()[1:]:
        kind = _kind(process)
        try:
            status = (process / "status").read_text()
        except OSError:
            continue
        hwm = [line.split()[1] for line in status.splitlines() if line.startswith("VmHWM")]
        if kind is None or not hwm:
            continue
        peaks[kind] = max(peaks.get(kind, 0.0), round(int(hwm[0]) / 1024, 1))
    return peaks


def _master_cores(spark: Any) -> int:
    """The cores the session's tasks run on (``local[N]``: N; else Spark's default parallelism)."""
    from .session import _local_cores

    master = spark.conf.get("spark.master", "")
    if master.startswith("local"):
        return _local_cores(master)
    return max(1, int(spark.sparkContext.defaultParallelism))


def _busy_cores(since: tuple[int, int] | None = None) -> Any:
    """/proc/stat's (busy, total) jiffies; with ``since``, the busy cores in between
    (the whole machine's, other processes included). None without /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except OSError:
        return None
    now = (sum(fields) - fields[3] - fields[4], sum(fields))
    if since is None:
        return now
    total = now[1] - since[1]
    return round((os.cpu_count() or 1) * (now[0] - since[0]) / total, 2) if total else None


def _last_stage_task_seconds(ui_port: int) -> list[float]:
    """Durations (seconds) of the tasks of the application's last stage: the replay's
    ``applyInPandas`` and write of ``facts/``."""
    from .cluster import _get_json

    base = f"http://127.0.0.1:{ui_port}/api/v1/applications"
    app = _get_json(base, timeout=10)[0]["id"]
    last = max(_get_json(f"{base}/{app}/stages", timeout=10), key=lambda s: s["stageId"])
    url = f"{base}/{app}/stages/{last['stageId']}/{last['attemptId']}/taskList?length=1000"
    return sorted(round(task["duration"] / 1000, 1) for task in _get_json(url, timeout=10))


def _compare_masters(args: argparse.Namespace) -> int:
    """Spark replay throughput on several masters, side by side (see the module doc)."""
    masters = [m.strip() for m in args.compare_masters.split(",") if m.strip()]
    if not masters or args.rounds < 1:
        print("--compare-masters needs a master and --rounds >= 1", file=sys.stderr)
        return 2
    cluster = None
    if "cluster" in masters:
        from .cluster import LocalCluster

        cluster = LocalCluster(Path(args.dir) / "cluster", connect=False).start()
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in masters}
    load_before = os.getloadavg()
    try:
        for _ in range(args.rounds):
            for master in masters:
                url = cluster.master_url if cluster is not None and master == "cluster" else master
                command = [sys.executable, "-m", "aiopurgatory.pipeline.benchmark"]
                command += ["--skip-analyze", "--no-single", "--master", url]
                command += ["--requests", str(args.requests), "--dir", args.dir]
                command += ["--task-times"] if args.task_times else []
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                if done.returncode:
                    print(
                        f"{master}: exit {done.returncode}\n{done.stderr[-2000:]}", file=sys.stderr
                    )
                    return 1
                runs[master].append(json.loads(done.stdout))
    finally:
        if cluster is not None:
            cluster.stop()
    table = {}
    for master, results in runs.items():
        rates = [r["replay"]["spark_requests_per_s"] for r in results]
        table[master] = {
            "spark_s": [r["replay"]["spark_s"] for r in results],
            "requests_per_s": rates,
            "median_requests_per_s": round(statistics.median(rates)),
            "session_s": [round(r["session_s"], 1) for r in results],
            "loadavg_1min": [r["loadavg"][0] for r in results],
        }
        if args.task_times:
            table[master]["machine_busy_cores"] = [
                r["replay"]["machine_busy_cores"] for r in results
            ]
            table[master]["replay_task_s"] = [r["replay"]["replay_task_s"] for r in results]
    report = {
        "requests": args.requests,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "masters": table,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
