"""``aiopurgatory gen-trace``: a synthetic produce-request trace.

Open-loop Poisson arrivals over ``topics x partitions`` partitions (Zipf-skewed
popularity, so some partitions are hot), each partition led by one broker and
followed by the next ``replication - 1`` brokers. Follower acknowledgement delays
are log-normal, parametrised like Kafka's ``TestPurgatoryPerformance`` (by their
median and 75th percentile); some replicas are slow (delays multiplied), some are
failed (never acknowledge), and broker outages make every follower on one broker
silent for a while. Same ``--seed``, same trace.

Written with numpy and pyarrow (no Spark): Parquet, or CSV when the path ends in
``.csv`` (``replica_delays`` as ``;``-separated seconds, empty for "never").
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "TraceSpec",
    "arrow_trace",
    "check_trace_columns",
    "generate_trace",
    "generate_trace_table",
    "inspect_trace",
    "main",
    "read_trace_pandas",
    "read_trace_table",
    "write_trace",
]


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """What :func:`generate_trace` generates (all durations in seconds).

    Raises:
        ValueError: a count is below 1, a fraction outside [0, 1], a duration <= 0,
            or ``delay_p75 < delay_p50``.
    """

    requests: int = 100_000
    brokers: int = 3
    topics: int = 4
    partitions: int = 8
    replication: int = 3
    rate: float = 10_000.0
    acks_all: float = 0.8
    delay_p50: float = 0.005
    delay_p75: float = 0.012
    slow_replicas: float = 0.05
    slow_factor: float = 20.0
    failed_replicas: float = 0.01
    outages: int = 1
    outage_length: float = 0.1
    skew: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("requests", "brokers", "topics", "partitions", "replication"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if self.outages < 0:
            raise ValueError(f"outages must not be negative, got {self.outages}")
        for name in ("acks_all", "slow_replicas", "failed_replicas", "outage_length"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a fraction in [0, 1], got {value}")
        for name in ("rate", "delay_p50", "delay_p75", "slow_factor"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value}")
        if self.delay_p75 < self.delay_p50:
            raise ValueError("delay_p75 must be >= delay_p50")
        if self.skew < 0:
            raise ValueError(f"skew must be >= 0, got {self.skew}")


def generate_trace(spec: TraceSpec) -> pd.DataFrame:
    """Generate a trace (columns of :data:`~aiopurgatory.pipeline.schema.TRACE_COLUMNS`).

    ``replica_delays`` is a list per request with ``None`` for a follower that never
    acknowledges. Deterministic in ``spec`` (numpy's PCG64 seeded with ``spec.seed``).
    """
    return _pandas_trace(generate_trace_table(spec))


def delay_lists(delays: Any) -> Any:
    """A ``(requests, followers)`` float matrix as the trace's ``replica_delays``
    Arrow lists, NaN as null (never acknowledges)."""
    import numpy as np
    import pyarrow as pa

    n, followers = delays.shape
    flat = np.ascontiguousarray(delays, dtype="float64").reshape(-1)
    values = pa.array(flat, pa.float64(), mask=np.isnan(flat))
    offsets = pa.array(np.arange(n + 1, dtype="int64") * followers, pa.int32())
    return pa.ListArray.from_arrays(offsets, values)


def _pandas_trace(table: Any) -> pd.DataFrame:
    """An Arrow trace as pandas, ``replica_delays`` as lists with None for "never"."""
    trace: pd.DataFrame = table.drop_columns(["replica_delays"]).to_pandas()
    trace["replica_delays"] = table.column("replica_delays").to_pylist()
    return trace


def generate_trace_table(spec: TraceSpec) -> Any:
    """:func:`generate_trace` as an Arrow table, built from numpy columns (no Python
    object per request): what ``aiopurgatory gen-trace`` writes."""
    import numpy as np
    import pyarrow as pa

    from .schema import trace_arrow_schema

    if not isinstance(spec, TraceSpec):
        raise TypeError(f"spec must be a TraceSpec, got {type(spec).__name__}")
    rng = np.random.default_rng(spec.seed)
    n = spec.requests
    n_partitions = spec.topics * spec.partitions
    followers = min(spec.replication, spec.brokers) - 1

    # Partition popularity: Zipf weights over a random ranking of partitions.
    ranks = rng.permutation(n_partitions) + 1
    weights = 1.0 / ranks.astype("float64") ** spec.skew
    part = rng.choice(n_partitions, size=n, p=weights / weights.sum())
    topic = part // spec.partitions
    partition = part % spec.partitions
    leader = part % spec.brokers
    arrival = np.cumsum(rng.exponential(1.0 / spec.rate, size=n))
    acks = np.where(rng.random(n) < spec.acks_all, -1, 1).astype("int32")

    mu = math.log(spec.delay_p50)
    sigma = (math.log(spec.delay_p75) - mu) / 0.674490  # z of the 75th percentile
    delays = rng.lognormal(mu, sigma, size=(n, followers)) if followers else np.empty((n, 0))
    # Replica roles are per (partition, follower slot): the j-th follower of a
    # partition is broker (leader + 1 + j) mod brokers.
    slow = rng.random((n_partitions, followers)) < spec.slow_replicas
    failed = rng.random((n_partitions, followers)) < spec.failed_replicas
    delays = np.where(slow[part], delays * spec.slow_factor, delays)
    never = failed[part].copy()
    duration = float(arrival[-1]) if n else 0.0
    follower_broker = (leader[:, None] + 1 + np.arange(followers)[None, :]) % spec.brokers
    for _ in range(spec.outages):
        down = int(rng.integers(spec.brokers))
        start = float(rng.random()) * duration * (1.0 - spec.outage_length)
        end = start + duration * spec.outage_length
        hit = (arrival >= start) & (arrival < end)
        never |= hit[:, None] & (follower_broker == down)
    delays = np.where(never, np.nan, delays)
    topics = pa.DictionaryArray.from_arrays(
        pa.array(topic, pa.int32()), pa.array([f"topic-{t}" for t in range(spec.topics)])
    ).cast(pa.string())
    return pa.table(
        {
            "request_id": pa.array(np.arange(n, dtype="int64")),
            "broker": pa.array(leader.astype("int32")),
            "topic": topics,
            "partition": pa.array(partition.astype("int32")),
            "arrival": pa.array(arrival),
            "acks": pa.array(acks),
            "replica_delays": delay_lists(delays),
        },
        schema=trace_arrow_schema(),
    )


def arrow_trace(trace: pd.DataFrame, columns: Sequence[str] | None = None) -> Any:
    """A pandas trace as an Arrow table with the trace types (``columns``: a subset)."""
    import pyarrow as pa

    from .schema import trace_arrow_schema

    schema = trace_arrow_schema()
    names = [name for name in schema.names if columns is None or name in columns]
    return pa.table(
        {name: pa.array(trace[name], schema.field(name).type) for name in names},
    )


def check_trace_columns(path: object, names: Iterable[str]) -> None:
    """Refuse a trace whose columns ``names`` lack one of :data:`TRACE_COLUMNS`.

    Raises:
        ValueError: naming the trace and the missing columns.
    """
    from .schema import TRACE_COLUMNS

    missing = set(TRACE_COLUMNS) - set(names)
    if missing:
        raise ValueError(f"trace {path}: missing columns {sorted(missing)}")


def read_trace_table(path: str | Path) -> Any:
    """Read a trace written by :func:`write_trace` as an Arrow table of the trace types.

    Parquet is read column by column straight into Arrow (no Python objects per
    row); CSV goes through :func:`read_trace_pandas`.

    Raises:
        ValueError: the trace lacks a column.
    """
    import pyarrow.parquet as pq

    from .schema import TRACE_COLUMNS, trace_arrow_schema

    path = Path(path)
    if path.suffix.lower() == ".csv":
        return arrow_trace(read_trace_pandas(path))
    table = pq.read_table(path)
    check_trace_columns(path, table.column_names)
    return table.select(list(TRACE_COLUMNS)).cast(trace_arrow_schema())


#: What ``gen-trace --out`` may end in (``.csv``: CSV; the others: Parquet).
TRACE_SUFFIXES = (".parquet", ".pq", ".csv")


def inspect_trace(path: str | Path) -> int:
    """Check that ``path`` is a trace, before any work: a Parquet file or directory
    (as written by :func:`write_trace` or Spark) or a ``.csv`` file, with every
    trace column; return its replication factor (1 + the most followers of a
    request), read from ``replica_delays`` alone.

    Raises:
        ValueError: one line naming the trace and what is wrong with it (not
            Parquet, not readable, a column missing).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    path = Path(path)
    try:
        if path.suffix.lower() == ".csv":
            import pyarrow.csv as pcsv

            with path.open(encoding="utf-8", errors="replace") as file:
                header = file.readline().strip().split(",")
            check_trace_columns(path, header)
            delays = pcsv.read_csv(
                path,
                convert_options=pcsv.ConvertOptions(
                    include_columns=["replica_delays"],
                    column_types={"replica_delays": pa.string()},
                    strings_can_be_null=False,
                ),
            ).column("replica_delays")
            # _parse_delays: "" is one follower that never acknowledges.
            followers = pc.max(pc.add(pc.count_substring(delays, ";"), 1)).as_py()
        else:
            import pyarrow.dataset as ds

            dataset = ds.dataset(str(path), format="parquet", partitioning="hive")
            check_trace_columns(path, dataset.schema.names)
            delays = dataset.to_table(columns=["replica_delays"]).column("replica_delays")
            followers = pc.max(pc.list_value_length(delays)).as_py()
    except (pa.ArrowException, OSError, UnicodeError) as exc:
        kind = "CSV" if path.suffix.lower() == ".csv" else "Parquet"
        text = " ".join(str(exc).split()) or type(exc).__name__
        if "magic bytes" in text:
            text = "no Parquet magic bytes: not a Parquet file"
        elif len(text) > 160:
            text = text[:157] + "..."
        raise ValueError(
            f"trace {path} is not a readable {kind} trace ({text}); "
            "'aiopurgatory gen-trace' writes one"
        ) from None
    return 1 + int(followers or 0)


def write_trace(trace: pd.DataFrame | Any, path: str | Path) -> Path:
    """Write a trace (pandas or Arrow) as Parquet, or as CSV if ``path`` ends in
    ``.csv``; return the path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(trace, pa.Table):
        if path.suffix.lower() != ".csv":
            pq.write_table(trace, path)
            return path
        trace = _pandas_trace(trace)
    if path.suffix.lower() == ".csv":
        csv = trace.copy()
        csv["replica_delays"] = [
            ";".join("" if d is None else repr(float(d)) for d in row)
            for row in trace["replica_delays"]
        ]
        csv.to_csv(path, index=False)
    else:
        pq.write_table(arrow_trace(trace), path)
    return path


def _parse_delays(text: object) -> list[float | None]:
    if not isinstance(text, str) or text == "":
        return [] if not isinstance(text, str) else [None]
    out: list[float | None] = []
    for item in text.split(";"):
        value = float(item) if item.strip() else math.nan
        out.append(value if math.isfinite(value) else None)
    return out


def read_trace_pandas(path: str | Path) -> pd.DataFrame:
    """Read a trace written by :func:`write_trace` (Parquet file/dir, or CSV) into pandas."""
    import pandas as pd

    path = Path(path)
    if path.suffix.lower() == ".csv":
        trace = pd.read_csv(path, keep_default_na=False, dtype={"replica_delays": str})
        trace["replica_delays"] = [_parse_delays(text) for text in trace["replica_delays"]]
        return trace
    trace = pd.read_parquet(path)
    delays: list[list[float | None] | None] = [
        [None if d is None or d != d else float(d) for d in row] if row is not None else None
        for row in trace["replica_delays"]
    ]
    trace["replica_delays"] = pd.Series(delays, index=trace.index, dtype=object)
    return trace


def _build_parser() -> argparse.ArgumentParser:
    from .._clitools import Parser

    d = TraceSpec()
    p = Parser(
        prog="aiopurgatory gen-trace",
        description="Generate a synthetic produce-request trace (Parquet, or CSV for *.csv).",
    )
    p.add_argument(
        "--out",
        required=True,
        help="output file: *.parquet (or *.pq) for Parquet, *.csv for CSV; its directory must "
        "exist; an existing file is replaced",
    )
    p.add_argument("--requests", type=int, default=d.requests, help="number of requests")
    p.add_argument("--brokers", type=int, default=d.brokers, help="number of brokers")
    p.add_argument("--topics", type=int, default=d.topics, help="number of topics")
    p.add_argument("--partitions", type=int, default=d.partitions, help="partitions per topic")
    p.add_argument(
        "--replication",
        type=int,
        default=None,
        help=f"replication factor, at most --brokers (default: {d.replication}, or --brokers "
        "if fewer)",
    )
    p.add_argument("--rate", type=float, default=d.rate, help="arrivals per second (Poisson)")
    p.add_argument("--acks-all", type=float, default=d.acks_all, help="fraction with acks=all")
    p.add_argument(
        "--delay-p50-ms",
        type=float,
        default=d.delay_p50 * 1e3,
        help="median follower acknowledgement delay, ms",
    )
    p.add_argument(
        "--delay-p75-ms",
        type=float,
        default=d.delay_p75 * 1e3,
        help="75th percentile of the follower acknowledgement delay, ms",
    )
    p.add_argument(
        "--slow-replicas",
        type=float,
        default=d.slow_replicas,
        help="fraction of (partition, follower) pairs that are slow",
    )
    p.add_argument(
        "--slow-factor", type=float, default=d.slow_factor, help="how much slower a slow one is"
    )
    p.add_argument(
        "--failed-replicas",
        type=float,
        default=d.failed_replicas,
        help="fraction of (partition, follower) pairs that never acknowledge",
    )
    p.add_argument("--outages", type=int, default=d.outages, help="broker outages")
    p.add_argument(
        "--outage-length",
        type=float,
        default=d.outage_length,
        help="length of each outage, as a fraction of the trace",
    )
    p.add_argument("--skew", type=float, default=d.skew, help="Zipf exponent of partitions")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed (same seed, same trace)")
    return p


def main(argv: list[str]) -> int:
    """Run ``aiopurgatory gen-trace``; returns the exit status."""
    from .._clitools import UsageError, check_output_file, fail, require

    prog = "aiopurgatory gen-trace"
    args = _build_parser().parse_args(argv)
    replication = args.replication
    try:
        require(["numpy", "pyarrow"], "spark")
        if Path(args.out).suffix.lower() not in TRACE_SUFFIXES:
            raise UsageError(
                f"--out {args.out}: a trace is written as Parquet (name it *.parquet) or "
                "CSV (*.csv)"
            )
        check_output_file(args.out, "--out")
        if replication is None:
            replication = min(TraceSpec().replication, max(1, args.brokers))
        elif replication > args.brokers >= 1:
            raise UsageError(
                f"--replication {replication} is more than --brokers {args.brokers}: each "
                f"replica of a partition is on a broker of its own (give at most {args.brokers})"
            )
        spec = TraceSpec(
            requests=args.requests,
            brokers=args.brokers,
            topics=args.topics,
            partitions=args.partitions,
            replication=replication,
            rate=args.rate,
            acks_all=args.acks_all,
            delay_p50=args.delay_p50_ms / 1e3,
            delay_p75=args.delay_p75_ms / 1e3,
            slow_replicas=args.slow_replicas,
            slow_factor=args.slow_factor,
            failed_replicas=args.failed_replicas,
            outages=args.outages,
            outage_length=args.outage_length,
            skew=args.skew,
            seed=args.seed,
        )
    except (TypeError, ValueError, UsageError) as exc:
        return fail(prog, exc)
    started = time.perf_counter()
    trace = generate_trace_table(spec)
    path = write_trace(trace, args.out)
    print(
        f"wrote {len(trace)} requests to {path} in {time.perf_counter() - started:.2f} s",
        file=sys.stderr,
    )
    return 0
