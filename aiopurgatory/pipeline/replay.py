"""``aiopurgatory replay``: replay a request trace through the real purgatory on Spark.

Each (broker, parameter set) of the sweep (``--timeout 0.5,1,30 --min-insync 2,3``
gives six parameter sets) is a group that
:func:`~aiopurgatory.pipeline.replay_core.replay_table` replays on virtual time in a
Spark task of its own. Two data paths (``--io``):

* ``files`` (:func:`replay_files`, the default for a Parquet trace and an output
  on a filesystem path): each task reads its broker's rows of the trace and writes
  its facts as a Parquet file itself, with pyarrow; Spark schedules the tasks
  (largest first), retries a lost one, and no row passes through the JVM.
* ``spark`` (:func:`replay_spark`, the default for a CSV trace or a URI such as
  ``s3a://``): Spark reads the trace, hash-partitions it to the tasks, hands
  each task its rows as Arrow (``mapInArrow``) and writes the facts it returns.

Only DataFrame APIs are used, so both also run over Spark Connect. The output is
the same per-op fact table as ``analyze`` writes, followed by the same rollups,
hot keys, summary and report;
``scenarios/`` maps each scenario label to its parameters.

``--local`` runs the same replay in this process without Spark (the reference the
tests compare the Spark replay with), then analyses it with Spark as usual.

Which task of a ``repartition`` a key lands in (Spark's hash, in Python) is
:mod:`aiopurgatory.pipeline.spark_hash`; :func:`spark_hash_int` is re-exported here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from .._clitools import OutputDir, Parser, Steps, UsageError, fail, require
from .analyze import add_analysis_options, analysis_options, analyze_facts, print_result
from .replay_core import _REQUEST_COLUMNS, ReplayParams, parse_sweep, replay_table
from .schema import TRACE_COLUMNS
from .session import _URI_SCHEME, add_session_options, parse_conf
from .spark_hash import _task_keys, spark_hash_int
from .trace import check_trace_columns

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "ReplayedFiles",
    "files_reachable",
    "main",
    "read_trace",
    "replay_files",
    "replay_spark",
    "spark_hash_int",
]


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
    check_trace_columns(path, frame.columns)
    return frame.select(
        *[F.col(name).cast(kind).alias(name) for name, kind in TRACE_COLUMNS.items()]
    )


#: The trace columns the ``spark`` path's task gets as they are (``broker`` is in
#: the slot; the delays may travel as columns, see :func:`replay_spark`).
_REPLAY_INPUT = tuple(name for name in _REQUEST_COLUMNS if name != "replica_delays")

#: A slot: one broker and the parameter sets its task replays it under.
_Slot = tuple[int, list[ReplayParams]]


def _plan_slots(
    sizes: dict[int, int], param_sets: Sequence[ReplayParams], wanted: int
) -> list[_Slot]:
    """The replay's slots, largest first (requests x parameter sets).

    Each broker is one slot with every parameter set, unless there are fewer
    brokers than ``wanted`` tasks: then its parameter sets are split between up to
    ``ceil(wanted / brokers)`` slots, so that the cores have work of similar sizes.
    """
    copies = max(1, min(len(param_sets), -(-wanted // len(sizes))))
    chunks = [list(param_sets[k::copies]) for k in range(copies)]
    groups = sorted(
        ((broker, k) for broker in sizes for k in range(copies)),
        key=lambda group: (-sizes[group[0]] * len(chunks[group[1]]), group[0], group[1]),
    )
    return [(broker, chunks[k]) for broker, k in groups]


def _check_partitions(partitions: int | None) -> None:
    if partitions is not None and (
        isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1
    ):
        raise ValueError(f"partitions must be an int >= 1, got {partitions!r}")


def _wanted_tasks(spark: Any, partitions: int | None) -> int:
    """How many tasks keep the cores busy: ``partitions``, else the session's
    ``spark.sql.shuffle.partitions`` (2 per core on ``local[N]``)."""
    return partitions or int(spark.conf.get("spark.sql.shuffle.partitions") or 1)


def _replay_slots(
    batches: Iterator[pa.RecordBatch],
    slots: dict[int, _Slot],
    followers: int | None,
    source: str,
) -> Iterator[pa.RecordBatch]:
    """A replay task: the rows of one or more slots in, their facts out, as Arrow.

    With ``followers`` set, the delays came as columns ``d0``, ``d1``, ... (see
    :func:`replay_spark`) and become the ``replica_delays`` lists again here.
    """
    import numpy as np
    import pyarrow as pa

    received = list(batches)
    if not received:
        return
    table = pa.Table.from_batches(received)
    del received
    if followers is not None:
        table = _delays_as_lists(table, followers)
    slot = table.column("slot").to_numpy()
    for s in np.unique(slot).tolist():
        broker, param_sets = slots[s]
        rows = table.take(np.flatnonzero(slot == s)) if len(slots) > 1 else table
        for params in param_sets:
            facts = replay_table(rows, params, purgatory=f"broker-{broker}", source=source)
            yield from facts.to_batches(max_chunksize=_OUTPUT_BATCH)


def _delays_as_lists(table: pa.Table, followers: int) -> pa.Table:
    """Columns ``d0`` .. ``d{followers-1}`` (nulls kept) as one ``replica_delays`` list column."""
    import numpy as np

    from .trace import delay_lists

    names = [f"d{j}" for j in range(followers)]
    columns = [table.column(name).to_numpy(zero_copy_only=False) for name in names]
    matrix = np.column_stack(columns) if columns else np.empty((table.num_rows, 0))
    lists = delay_lists(matrix)
    return table.drop_columns(names).append_column("replica_delays", lists)


#: Rows per Arrow batch handed back to Spark.
_OUTPUT_BATCH = 65536


def replay_spark(
    spark: Any,
    trace: Any,
    param_sets: Sequence[ReplayParams],
    *,
    source: str = "",
    partitions: int | None = None,
) -> Any:
    """The Spark replay: facts of every (parameter set, broker) group, as a DataFrame.

    The data path is Arrow from end to end and as narrow as the core allows:

    * One small job counts each broker's requests and the lengths of their delay
      lists. When every list has the same length ``F`` (the usual trace), the
      delays travel as ``F`` plain double columns, not as arrays (which cost
      Spark far more per row to shuffle and convert).
    * A *slot* is a broker with some of the parameter sets. Each row goes to its
      broker's slots through a map lookup on literals (slot ids only: the
      parameters themselves ship once, with the task's function); a trace
      row is copied only when there are too few brokers to keep
      ``spark.sql.shuffle.partitions`` tasks busy (then the parameter sets are
      split between copies).
    * The rows are hash-partitioned so that each slot lands in a task of its own
      (keys chosen with Spark's own hash), largest first, and ``mapInArrow``
      replays each slot's parameter sets: Arrow batches in, the core's Arrow
      fact batches out, no pandas and no Python object per row on the way.

    Args:
        spark: a SparkSession (classic or Connect).
        trace: the trace DataFrame (see :func:`read_trace`).
        param_sets: at least one parameter set.
        source: the facts' ``source`` column.
        partitions: Spark tasks of the replay stage; default: one per slot.
            With fewer, slots are dealt to tasks largest first, round robin.

    Raises:
        ValueError: ``param_sets`` is empty, or ``partitions`` < 1.
    """
    from pyspark.sql import functions as F

    from .schema import fact_schema

    if not param_sets:
        raise ValueError("param_sets must not be empty")
    _check_partitions(partitions)
    lengths = F.size("replica_delays")  # -1 for a null list
    stats = (
        trace.groupBy("broker")
        .agg(F.count(F.lit(1)).alias("n"), F.min(lengths).alias("lo"), F.max(lengths).alias("hi"))
        .collect()
    )
    sizes = {int(row["broker"]): int(row["n"]) for row in stats if row["broker"] is not None}
    if not sizes:
        return spark.createDataFrame([], fact_schema())
    bounds = {(row["lo"], row["hi"]) for row in stats}
    uniform = len(bounds) == 1 and next(iter(bounds))[0] == next(iter(bounds))[1]
    followers = int(next(iter(bounds))[0]) if uniform and next(iter(bounds))[0] >= 0 else None

    slots = dict(enumerate(_plan_slots(sizes, param_sets, _wanted_tasks(spark, partitions))))
    tasks = len(slots) if partitions is None else partitions
    keys = _task_keys(tasks)
    # Each row's slots and each slot's task key as map lookups on literals: no
    # table to make (a local DataFrame costs a Python job) and no join.
    slots_of: dict[int, list[int]] = {}
    for s, (broker, _) in slots.items():
        slots_of.setdefault(broker, []).append(s)
    slot_map = F.create_map(
        *[
            part
            for broker, ids in sorted(slots_of.items())
            for part in (F.lit(broker), F.array(*[F.lit(s) for s in ids]))
        ]
    )
    task_map = F.create_map(*[part for s in slots for part in (F.lit(s), F.lit(keys[s % tasks]))])
    if followers is None:
        delays = [F.col("replica_delays")]
    else:
        delays = [F.col("replica_delays")[j].alias(f"d{j}") for j in range(followers)]

    def replay_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _replay_slots(batches, slots, followers, source)

    # An explicit number of partitions: adaptive execution leaves it as is (it
    # would otherwise merge the small shuffle into one task).
    slot = F.explode(slot_map[F.col("broker")]).alias("slot")
    return (
        trace.select(*_REPLAY_INPUT, *delays, slot)
        .withColumn("task", task_map[F.col("slot")].cast("int"))
        .repartition(tasks, "task")
        .drop("task")
        .mapInArrow(replay_task, fact_schema())
    )


class ReplayedFiles(NamedTuple):
    """What :func:`replay_files` did."""

    requests: int  #: trace rows replayed (each under every parameter set)
    facts: int  #: fact rows written
    files: int  #: Parquet files written


def files_reachable(*paths: str | os.PathLike[str]) -> bool:
    """Whether :func:`replay_files` can take these paths: plain filesystem paths
    (or ``file:`` URIs), and no CSV trace. Other URIs (``s3a://``, ``hdfs://``)
    and CSV traces are for :func:`replay_spark`, through Spark's own readers."""
    texts = [os.fspath(path) for path in paths]
    return all(
        not _URI_SCHEME.match(text) or text.startswith("file:") for text in texts
    ) and not any(text.lower().endswith(".csv") for text in texts)


def _local(path: str | os.PathLike[str]) -> Path:
    """A path or ``file:`` URI as an absolute local path."""
    text = os.fspath(path)
    if text.startswith("file:"):
        text = "/" + text[len("file:") :].lstrip("/")
    return Path(text).absolute()


def _trace_dataset(path: Path) -> Any:
    """The trace as a pyarrow dataset: a file, or a directory as Spark writes one
    (``_*`` and ``.*`` files skipped; ``broker=N/`` subdirectories of a
    ``partitionBy("broker")`` are the ``broker`` column, and a task then reads its
    broker's directory alone).

    Raises:
        ValueError: the trace lacks a column.
    """
    import pyarrow.dataset as ds

    dataset = ds.dataset(str(path), format="parquet", partitioning="hive")
    check_trace_columns(path, dataset.schema.names)
    return dataset


def _broker_sizes(path: Path) -> dict[int, int]:
    """Requests per broker, from the trace's ``broker`` column alone.

    Raises:
        ValueError: the trace lacks a column, or a broker is null.
    """
    import pyarrow.compute as pc

    broker = _trace_dataset(path).to_table(columns=["broker"]).column("broker")
    if broker.null_count:
        raise ValueError(f"trace {path}: {broker.null_count} requests with a null broker")
    counts = pc.value_counts(broker).to_pylist()
    return {int(item["values"]): int(item["counts"]) for item in counts}


def _broker_requests(path: Path, broker: int) -> pa.Table:
    """One broker's requests: the columns the core needs, in the trace types."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from .schema import trace_arrow_schema

    schema = trace_arrow_schema()
    table = _trace_dataset(path).to_table(
        columns=list(_REQUEST_COLUMNS), filter=ds.field("broker") == broker
    )
    return table.cast(pa.schema([schema.field(name) for name in _REQUEST_COLUMNS]))


#: Where tasks write their files until each is complete (then renamed into place).
_TEMPORARY = "_temporary"


def _write_facts(directory: Path, name: str, tables: Iterable[pa.Table]) -> int:
    """Write fact tables as one Parquet file ``directory/name``; return the rows.

    The file is written under ``_temporary/`` and renamed into place when whole,
    so a reader never sees part of it, and a retried (or speculative) attempt of the
    same task replaces it with the same facts.
    """
    import pyarrow.parquet as pq

    from .schema import fact_arrow_schema

    temporary = directory / _TEMPORARY / f"{name}.{uuid.uuid4().hex}"
    rows = 0
    with pq.ParquetWriter(temporary, fact_arrow_schema()) as writer:
        for table in tables:
            writer.write_table(table)
            rows += table.num_rows
    os.replace(temporary, directory / name)
    return rows


def _replay_files_task(
    batches: Iterator[pa.RecordBatch],
    slots: list[_Slot],
    tasks: int,
    trace: Path,
    facts: Path,
    source: str,
) -> Iterator[pa.RecordBatch]:
    """A replay task of :func:`replay_files`: task ``t`` replays slots ``t``,
    ``t + tasks``, ...; one Parquet file per slot; yields (slot, facts) rows."""
    import pyarrow as pa

    schema = pa.schema([("slot", pa.int64()), ("facts", pa.int64())])
    for batch in batches:
        for task in batch.column(0).to_pylist():
            for s in range(task, len(slots), tasks):
                broker, param_sets = slots[s]
                requests = _broker_requests(trace, broker)
                facts_of = (
                    replay_table(requests, params, purgatory=f"broker-{broker}", source=source)
                    for params in param_sets
                )
                rows = _write_facts(facts, f"part-{s:05d}.parquet", facts_of)
                yield pa.RecordBatch.from_pydict({"slot": [s], "facts": [rows]}, schema=schema)


#: What a task of :func:`replay_files` returns per slot.
_WRITTEN = "slot long, facts long"


def replay_files(
    spark: Any,
    trace: str | os.PathLike[str],
    facts: str | os.PathLike[str],
    param_sets: Sequence[ReplayParams],
    *,
    source: str = "",
    partitions: int | None = None,
) -> ReplayedFiles:
    """The Spark replay with files in and out: facts of every (parameter set,
    broker) group written as Parquet under ``facts``.

    The slots are those of :func:`replay_spark` (a broker with some of the
    parameter sets, largest first), but no row passes through Spark: each task
    reads its broker's rows of the trace with pyarrow (the columns the core
    needs, filtered on ``broker``), replays them under each of its parameter
    sets and writes the facts as one Parquet file, ``part-NNNNN.parquet`` (the
    slot's number), renamed into place when whole. Spark runs the tasks, one
    per slot, largest first, and retries a failed one (its file is then written
    again, with the same facts). When every slot is written, the driver removes
    ``_temporary/`` and writes ``_SUCCESS``, as Spark's own writers do.

    Both paths must name the same files in this process and on the executors:
    a local filesystem (``local[N]``, a cluster or Connect server on this machine)
    or one they share (NFS).

    Args:
        spark: a SparkSession (classic or Connect).
        trace: the trace, a Parquet file or directory (see :func:`files_reachable`).
        facts: the output directory; replaced if it exists.
        param_sets: at least one parameter set.
        source: the facts' ``source`` column.
        partitions: Spark tasks; default: one per slot. With fewer, slots are
            dealt to tasks largest first, round robin.

    Returns:
        The requests replayed, the fact rows and the files written.

    Raises:
        ValueError: ``param_sets`` is empty, ``partitions`` < 1, the trace lacks
            a column or has a null broker, or ``facts`` holds the trace.
    """
    if not param_sets:
        raise ValueError("param_sets must not be empty")
    _check_partitions(partitions)
    trace_path, facts_path = _local(trace), _local(facts)
    if trace_path == facts_path or facts_path in trace_path.parents:
        raise ValueError(f"facts {facts_path} would replace the trace {trace_path}")
    sizes = _broker_sizes(trace_path)
    if facts_path.is_dir():
        shutil.rmtree(facts_path)
    elif facts_path.exists():
        facts_path.unlink()
    (facts_path / _TEMPORARY).mkdir(parents=True)
    if not sizes:
        # An empty trace: one empty file, so that the facts have their schema.
        _write_facts(facts_path, "part-00000.parquet", [])
        written = []
        slots: list[_Slot] = []
    else:
        slots = _plan_slots(sizes, param_sets, _wanted_tasks(spark, partitions))
        tasks = len(slots) if partitions is None else partitions

        def replay_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return _replay_files_task(batches, slots, tasks, trace_path, facts_path, source)

        written = spark.range(0, tasks, 1, tasks).mapInArrow(replay_task, _WRITTEN).collect()
        done = sorted(int(row["slot"]) for row in written)
        if done != list(range(len(slots))):  # pragma: no cover - Spark's contract
            raise RuntimeError(f"replay: slots written {done}, expected {len(slots)}")
    shutil.rmtree(facts_path / _TEMPORARY)
    (facts_path / "_SUCCESS").touch()
    return ReplayedFiles(
        requests=sum(sizes.values()),
        facts=sum(int(row["facts"]) for row in written),
        files=max(1, len(slots)),
    )


def _build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="aiopurgatory replay",
        description=(
            "Replay a produce-request trace through aiopurgatory's Purgatory on virtual time, "
            "in Spark tasks partitioned by broker (or in this process: --local), then write "
            "the same tables and report as 'aiopurgatory analyze'. Comma-separated values sweep."
        ),
    )
    p.add_argument("trace", help="trace file: Parquet (file or directory) or .csv")
    p.add_output_dir()
    p.add_argument("--timeout", default="30", help="produce timeout(s), seconds, e.g. 0.5,1,30")
    p.add_argument(
        "--min-insync",
        default="2",
        help="replicas needed for acks=all, the leader included, e.g. 2,3; at most the "
        "trace's replication",
    )
    p.add_argument("--tick", default="0.001", help="timer tick(s), seconds")
    p.add_argument("--wheel-size", default="20", help="timing wheel size(s)")
    add_session_options(p)
    p.add_argument(
        "--local",
        action="store_true",
        help="replay in this process, without Spark; Spark starts afterwards only for the "
        "tables and report (none with --facts-only)",
    )
    p.add_argument(
        "--facts-only",
        action="store_true",
        help="write facts/ and scenarios/ only: no tables, no report; with --local, no Spark",
    )
    p.add_argument(
        "--io",
        choices=("auto", "files", "spark"),
        default="auto",
        help="how the Spark replay's tasks get the trace and give the facts: 'files' = "
        "they read and write Parquet themselves (paths this machine and the executors "
        "share); 'spark' = through Spark (CSV traces, s3a:// and other URIs); 'auto' "
        "(default) = 'files' when it can",
    )
    add_analysis_options(p)
    return p


def _write_scenarios(param_sets: Sequence[ReplayParams], path: Path) -> None:
    """``scenarios/``: each scenario label and its parameters (one Parquet file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.mkdir()
    table = pa.table(
        {
            "scenario": pa.array([p.label for p in param_sets], pa.string()),
            "timeout": pa.array([p.timeout for p in param_sets], pa.float64()),
            "min_insync": pa.array([p.min_insync for p in param_sets], pa.int32()),
            "tick": pa.array([p.tick for p in param_sets], pa.float64()),
            "wheel_size": pa.array([p.wheel_size for p in param_sets], pa.int32()),
        }
    )
    pq.write_table(table, path / "part-00000.parquet")
    (path / "_SUCCESS").touch()


def _checked(
    args: argparse.Namespace, prog: str
) -> tuple[list[ReplayParams], dict[str, str], dict[str, Any], str, OutputDir]:
    """Every check that can fail before any work: the parameter sets, the Spark
    settings, the analysis options, the data path (``files`` or ``spark``, or
    ``local``) and the output directory.

    Raises:
        UsageError, ValueError: one line saying what is wrong.
    """
    from .session import check_master, is_connect, missing_inputs
    from .trace import inspect_trace

    param_sets = parse_sweep(args.timeout, args.min_insync, args.tick, args.wheel_size)
    conf = parse_conf(args.conf)
    options = analysis_options(args)
    spark_needed = not (args.local and args.facts_only)
    # What needs none of the extra's modules first: a mistyped argument is
    # refused without the seconds their imports take.
    if spark_needed:
        check_master(args.master)
    if args.local and args.io != "auto":
        raise UsageError("--io is for the Spark replay, not --local")
    output = OutputDir(args.out, overwrite=args.overwrite, inputs=[args.trace], command="replay")
    # The trace's checks read it with pyarrow alone: a bad trace is refused
    # before the seconds that importing pandas, pyspark and matplotlib take.
    require(["numpy", "pyarrow"], "spark")
    io = "local" if args.local else args.io
    if io == "auto":
        io = "files" if files_reachable(args.trace, args.out) else "spark"
    elif io == "files" and not files_reachable(args.trace, args.out):
        raise UsageError(
            "--io files needs a Parquet trace and filesystem paths "
            "(use --io spark for a CSV trace or a URI)"
        )
    local_trace = args.local or not _URI_SCHEME.match(args.trace) or args.trace.startswith("file:")
    if local_trace and not (spark_needed and is_connect(args.master)):
        if missing_inputs([args.trace]):
            raise UsageError(f"no such file or directory: {args.trace}")
        replication = inspect_trace(_local(args.trace) if io != "local" else args.trace)
        too_many = sorted({p.min_insync for p in param_sets if p.min_insync > replication})
        if too_many:
            raise UsageError(
                f"--min-insync {','.join(map(str, too_many))} is more than the trace's "
                f"replication ({replication}: a leader and {replication - 1} followers): no "
                f"acks=all request could complete; give at most {replication}"
            )
    modules = ["pandas"]
    if spark_needed:
        modules += ["pyspark", "rich"]
    if not args.facts_only and not args.no_report:
        modules.append("matplotlib")
    require(modules, "spark")
    return param_sets, conf, options, io, output


def main(argv: list[str]) -> int:
    """Run ``aiopurgatory replay``; returns the exit status."""
    prog = "aiopurgatory replay"
    args = _build_parser().parse_args(argv)
    try:
        param_sets, conf, options, io, output = _checked(args, prog)
        if not (args.local and args.facts_only):
            from .session import check_reachable

            check_reachable(args.master)
    except (UsageError, TypeError, ValueError) as exc:
        return fail(prog, exc)
    except ConnectionError as exc:  # MasterUnreachableError
        return fail(prog, exc, 1)
    from .session import cli_session, spark_path

    steps = Steps(prog)
    spark = None

    def session(what: str) -> tuple[Any, int]:
        return steps.run(
            "session", what, lambda: cli_session(prog, args.master, [args.trace], conf)
        )

    with output.open() as out:
        if args.local:
            import pyarrow.parquet as pq

            from .replay_core import replay_trace_table
            from .trace import read_trace_table

            with steps.step("replay", f"{len(param_sets)} scenario(s) in this process, no Spark"):
                trace_table = read_trace_table(args.trace)
                requests = trace_table.num_rows
                facts_table = replay_trace_table(trace_table, param_sets, source=args.trace)
                (out / "facts").mkdir()
                pq.write_table(facts_table, out / "facts" / "part-00000.parquet")
                (out / "facts" / "_SUCCESS").touch()
            steps.say(f"replay: {requests:,} requests x {len(param_sets)} scenario(s)")
            if not args.facts_only:
                spark, status = session(
                    f"starting Spark ({args.master}) for the tables and report only: "
                    "the replay ran without it"
                )
                if spark is None:
                    return status
        else:
            spark, status = session(f"starting Spark ({args.master})")
            if spark is None:
                return status
            with steps.step("replay", f"{len(param_sets)} scenario(s) in Spark tasks, --io {io}"):
                if io == "files":
                    requests = replay_files(
                        spark, args.trace, out / "facts", param_sets, source=args.trace
                    ).requests
                else:
                    trace = read_trace(spark, spark_path(args.trace))
                    requests = trace.count()
                    replay_spark(spark, trace, param_sets, source=args.trace).write.mode(
                        "overwrite"
                    ).parquet(str(out / "facts"))
            steps.say(f"replay: {requests:,} requests x {len(param_sets)} scenario(s)")
        replay_s = steps.seconds["replay"]
        _write_scenarios(param_sets, out / "scenarios")
        simulated = requests * len(param_sets)
        if args.facts_only:
            output.commit(argv)
            steps.say(f"facts: {output.path / 'facts'} (no tables: --facts-only)")
            return 0
        rate = simulated / replay_s if replay_s > 0 else float("nan")
        where = "one process, no Spark" if args.local else f"Spark {args.master}, --io {io}"
        result = analyze_facts(
            spark,
            out / "facts",
            out,
            **options,
            title="aiopurgatory trace replay",
            extra={
                "trace": f"{args.trace} ({requests:,} requests)",
                "scenarios": len(param_sets),
                "replay": (
                    f"{simulated:,} simulated requests in {replay_s:.1f} s ({rate:,.0f}/s, {where})"
                ),
            },
            steps=steps,
        )
        output.commit(argv)
    print_result(result, output, steps)
    return 0
