"""``aiopurgatory bench redis-fanout``: what a trigger costs as processes multiply.

Usage::

    aiopurgatory bench redis-fanout [--processes 2,4,8] [--keys 10000] [--rounds 3]
        [--batch 100] [--topology single|cluster ...] [--library PATH] [--baseline PATH]
        [--loop asyncio|uvloop] [--json PATH]
    aiopurgatory bench redis-fanout --failover N [--topology cluster|sentinel ...]

For each topology, each process count N and each library (``--library``, by
default the checkout this command runs from, and ``--baseline``, another
checkout, e.g. of main, when given), one run: N watcher processes each watch
their own share of ``--keys`` keys (every N-th key, one operation per key,
through ``RedisTriggers.watch``), and a publisher process advances every key
``--rounds`` times (``--batch`` keys per loop iteration, or with ``--batch 0``
each trigger alone, flushed: a message per trigger). A run ends when every
watcher's operations have completed (each waits until its key reached
``--rounds``), so a lost trigger shows as a run that never ends or an operation
that expired, never as a good figure. The worker processes import the library
from the named checkout (``PYTHONPATH``; ``python -P``), so both versions run
in one invocation, interleaved, on the same Redis.

Measured per run: messages received and triggers applied per watcher (its
``statistics()``), CPU seconds per watcher (``time.process_time`` from ready to
done), Redis's CPU (``INFO cpu``, every server, before and after) and the bytes
it sent (``INFO stats`` ``total_net_output_bytes``: pub/sub fan-out is most of
it), the publisher's CPU per trigger and its throughput (triggers per second
until flushed), and the end-to-end throughput (triggers per second until the
last watcher was done); with ``--idle K``, what reached each of K more
processes whose purgatory watches nothing. The topology ``single`` is one ``redis-server``;
``cluster`` a 3-master/3-replica Redis Cluster (``redis+cluster://``: the
library must support it; a library that does not is reported as such), started
with the test harness ``tests/support/redis_cluster.py`` and so only from a
source checkout.

``--failover N`` measures something else: the time from a master's (or a
Sentinel-managed primary's) SIGKILL mid-traffic to delivery resumed, N times
per topology (:mod:`.redis_fanout_failover`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .._clitools import Parser, UsageError, check_output_file, fail

__all__ = ["main", "run"]

SCHEMA = 1
WORKER = Path(__file__).with_name("_fanout_worker.py")
#: The checkout this command runs from (the library measured unless --library).
HERE = Path(__file__).resolve().parent.parent.parent


def _counts(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or any(value < 1 for value in values):
        raise argparse.ArgumentTypeError(f"positive integers expected: {text!r}")
    return values


def _checkout(text: str) -> Path:
    path = Path(text).resolve()
    if not (path / "aiopurgatory" / "redis" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{text} has no aiopurgatory/redis package")
    return path


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="aiopurgatory bench redis-fanout",
        description="Messages and CPU per process, Redis's CPU and the publisher's, as "
        "watcher processes multiply: one library against another, side by side.",
    )
    parser.add_argument("--processes", type=_counts, default=[2, 4, 8], help="watcher counts")
    parser.add_argument("--keys", type=int, default=10_000, help="keys, shared among watchers")
    parser.add_argument("--rounds", type=int, default=3, help="advances of every key")
    parser.add_argument(
        "--batch",
        type=int,
        default=100,
        help="triggers per loop iteration at the publisher (more gather while a message is "
        "in flight); 0: each trigger alone, flushed (a message per trigger)",
    )
    parser.add_argument(
        "--topology",
        action="append",
        choices=["single", "cluster", "sentinel"],
        help="one redis-server, or a 3+3 Redis Cluster (default: single); with --failover: "
        "cluster or sentinel (a primary, a replica, 3 sentinels; default: both)",
    )
    parser.add_argument(
        "--failover",
        type=int,
        default=0,
        metavar="N",
        help="instead of the fan-out: N times, SIGKILL a master (or the primary) "
        "mid-traffic and time it until a trigger advanced after the kill is delivered",
    )
    parser.add_argument(
        "--library",
        type=_checkout,
        default=HERE,
        help="the checkout whose aiopurgatory the workers import (default: this one)",
    )
    parser.add_argument(
        "--baseline", type=_checkout, help="another checkout to compare with, in the same runs"
    )
    parser.add_argument(
        "--idle",
        type=int,
        default=0,
        help="more processes whose purgatory watches nothing (what still reaches them)",
    )
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON")
    parser.add_argument("--quiet", action="store_true", help="no table on stdout")
    return parser


# -- servers -------------------------------------------------------------------------


@contextlib.contextmanager
def _servers(topology: str, directory: Path) -> Iterator[tuple[str, list[int]]]:
    """The URL to give the library and every server's port (for INFO)."""
    if topology == "single":
        from ..redis.testing import RedisServer

        with RedisServer(directory / "single", appendfsync="everysec") as server:
            yield server.url, [server.port]
        return
    cluster_type = _cluster_harness()
    with cluster_type(directory / "cluster") as cluster:
        yield cluster.url, cluster.ports


def _cluster_harness() -> Any:
    """The test harness's ClusterServers, from the source checkout this runs from.

    Raises:
        UsageError: not a source checkout.
    """
    if not (HERE / "tests" / "support" / "redis_cluster.py").is_file():
        raise UsageError(
            "--topology cluster or sentinel, and --failover, start their servers with "
            "tests/support/redis_cluster.py: run it from a source checkout of aiopurgatory"
        )
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    from tests.support.redis_cluster import ClusterServers

    return ClusterServers


def _redis_counters(ports: Sequence[int]) -> dict[str, float]:
    import redis

    cpu = out = 0.0
    for port in ports:
        with redis.Redis(host="127.0.0.1", port=port, socket_timeout=5) as client:
            info = client.info("cpu")
            cpu += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
            out += float(client.info("stats")["total_net_output_bytes"])
    return {"cpu_s": cpu, "out_bytes": out}


# -- processes -----------------------------------------------------------------------


class _Process:
    """A worker process of the named checkout's library; JSON lines on its stdout."""

    def __init__(self, library: Path, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(library)}
        self.proc = subprocess.Popen(
            [sys.executable, "-P", str(WORKER), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def read(self, event: str, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        import selectors

        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.kill()
                    raise RuntimeError(f"no {event!r} within {timeout} s: {self.stderr()}")
                if not selector.select(remaining):
                    continue
                line = self.proc.stdout.readline()
                if not line:
                    self.proc.wait()
                    raise RuntimeError(
                        f"worker exited ({self.proc.returncode}) before {event!r}: {self.stderr()}"
                    )
                if not line.startswith("{"):
                    continue
                fields: dict[str, Any] = json.loads(line)
                if fields.get("event") == event:
                    return fields

    def stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read()[-3000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def finish(self) -> None:
        """Close its stdin: the idle watcher's signal that the run is over."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()

    def close(self) -> None:
        self.kill()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def _run_one(
    url: str, ports: Sequence[int], library: Path, processes: int, args: argparse.Namespace
) -> dict[str, Any]:
    channel = f"fanout-{time.monotonic_ns()}"
    common = [url, "--channel", channel, "--keys", str(args.keys), "--rounds", str(args.rounds)]
    common += ["--loop", args.loop]
    watchers = [
        _Process(library, "watcher", *common, "--index", str(i), "--count", str(processes))
        for i in range(processes)
    ]
    idle = [_Process(library, "idle", *common) for _ in range(args.idle)]
    publisher: _Process | None = None
    try:
        ready = [process.read("ready", 60) for process in [*watchers, *idle]]
        before = _redis_counters(ports)
        publisher = _Process(library, "publisher", *common, "--batch", str(args.batch))
        publisher.read("ready", 60)
        started = time.perf_counter()
        sent = publisher.read("result", 600)
        done = [watcher.read("result", 600) for watcher in watchers]
        end_to_end = time.perf_counter() - started
        after = _redis_counters(ports)
        for process in idle:
            process.finish()
        idle_done = [process.read("result", 60) for process in idle]
    finally:
        for process in [*watchers, *idle, *([publisher] if publisher else [])]:
            process.close()
    triggers: int = sent["triggers"]
    received = [result["statistics"]["received"] for result in done]
    applied = [result["statistics"]["applied"] for result in done]
    cpu = [result["cpu_s"] for result in done]
    return {
        "library": ready[0]["library"],
        "processes": processes,
        "triggers": triggers,
        "completed": sum(result["completed"] for result in done),
        "watched": sum(result["keys"] for result in done),
        "messages_published": sent["statistics"]["published"],
        "received_per_process": statistics.fmean(received),
        "received_max": max(received),
        "applied_per_process": statistics.fmean(applied),
        "watcher_cpu_s_per_process": statistics.fmean(cpu),
        "watcher_cpu_s_total": sum(cpu),
        "redis_cpu_s": after["cpu_s"] - before["cpu_s"],
        "redis_out_bytes": after["out_bytes"] - before["out_bytes"],
        "publisher_cpu_us_per_trigger": sent["cpu_s"] / triggers * 1e6,
        "publisher_triggers_per_s": triggers / sent["wall_s"],
        "end_to_end_triggers_per_s": triggers / end_to_end,
        # What reached the processes watching nothing (--idle), each.
        "idle_received": [result["statistics"]["received"] for result in idle_done],
        "idle_cpu_s": [result["cpu_s"] for result in idle_done],
    }


def run(args: argparse.Namespace, progress: Any = None) -> dict[str, Any]:
    """Every run the arguments ask for; returns the report (see the module docs)."""
    sides = [("library", args.library)]
    if args.baseline is not None:
        sides.insert(0, ("baseline", args.baseline))
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="aiopurgatory-fanout-") as directory:
        for topology in args.topology or ["single"]:
            with _servers(topology, Path(directory) / topology) as (url, ports):
                for processes in args.processes:
                    for side, checkout in sides:
                        row: dict[str, Any] = {"topology": topology, "side": side}
                        try:
                            row.update(_run_one(url, ports, checkout, processes, args))
                        except RuntimeError as exc:
                            # A library that cannot run on this topology (a URL it
                            # refuses) is a result to report, not a crash.
                            row.update(processes=processes, error=str(exc)[-1500:])
                        runs.append(row)
                        if progress is not None:
                            progress(row)
    return {
        "schema": SCHEMA,
        "command": "redis-fanout",
        "params": {
            "keys": args.keys,
            "rounds": args.rounds,
            "batch": args.batch,
            "loop": args.loop,
            "library": str(args.library),
            "baseline": None if args.baseline is None else str(args.baseline),
        },
        "runs": runs,
        "comparisons": _comparisons(runs),
    }


def _comparisons(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """library / baseline per topology and process count, where both ran."""
    found: dict[tuple[str, int, str], dict[str, Any]] = {
        (row["topology"], row["processes"], row["side"]): row for row in runs if "error" not in row
    }
    compared = []
    for (topology, processes, side), row in found.items():
        base = found.get((topology, processes, "baseline"))
        if side != "library" or base is None:
            continue
        compared.append(
            {
                "topology": topology,
                "processes": processes,
                **{
                    f"{name}_ratio": row[name] / base[name] if base[name] else None
                    for name in (
                        "received_per_process",
                        "applied_per_process",
                        "watcher_cpu_s_per_process",
                        "redis_cpu_s",
                        "redis_out_bytes",
                        "publisher_cpu_us_per_trigger",
                        "publisher_triggers_per_s",
                    )
                },
            }
        )
    return compared


def _line(row: dict[str, Any]) -> str:
    head = f"{row['topology']:7} {row['side']:8} N={row['processes']}:"
    if "error" in row:
        return f"{head} failed: {row['error'].splitlines()[-1] if row['error'] else ''}"
    return (
        f"{head} {row['received_per_process']:8.0f} messages/process, "
        f"{row['applied_per_process']:7.0f} applied/process, "
        f"CPU {row['watcher_cpu_s_per_process'] * 1e3:6.0f} ms/process, "
        f"Redis {row['redis_cpu_s'] * 1e3:6.0f} ms {row['redis_out_bytes'] / 1e6:6.1f} MB out, "
        f"publisher {row['publisher_cpu_us_per_trigger']:5.1f} us/trigger "
        f"{row['publisher_triggers_per_s']:7.0f}/s, "
        f"end to end {row['end_to_end_triggers_per_s']:7.0f}/s "
        f"({row['completed']}/{row['watched']} completed)"
        + (f", idle received {row['idle_received']}" if row["idle_received"] else "")
    )


def _failover(args: argparse.Namespace) -> int:
    from .redis_fanout_failover import failover_times, summary

    rows = []
    with tempfile.TemporaryDirectory(prefix="aiopurgatory-failover-") as directory:
        for topology in args.topology or ["cluster", "sentinel"]:
            times = failover_times(topology, args.failover, Path(directory), HERE)
            row = summary(topology, times)
            rows.append(row)
            if not args.quiet:
                print(
                    f"{topology:8} failover to delivery resumed: median {row['median_s']:.2f} s, "
                    f"max {row['max_s']:.2f} s over {len(times)} "
                    f"({', '.join(f'{t:.2f}' for t in times)})",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(
                {"schema": SCHEMA, "command": "redis-fanout --failover", "runs": rows},
                out,
                indent=2,
            )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``aiopurgatory bench redis-fanout``; returns the exit status."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.json:
            check_output_file(args.json, "--json")
        if args.failover < 0:
            raise UsageError(f"--failover must be 0 or more, got {args.failover}")
        if args.failover:
            if "single" in (args.topology or []):
                raise UsageError("--failover needs --topology cluster or sentinel")
            _cluster_harness()
        elif "sentinel" in (args.topology or []):
            raise UsageError("--topology sentinel is for --failover only")
        elif "cluster" in (args.topology or []):
            _cluster_harness()
    except UsageError as exc:
        return fail("aiopurgatory bench redis-fanout", exc)
    if args.failover:
        return _failover(args)

    def show(row: dict[str, Any]) -> None:
        if not args.quiet:
            print(_line(row), flush=True)

    report = run(args, show)
    if not args.quiet:
        for compared in report["comparisons"]:
            print(
                f"{compared['topology']:7} N={compared['processes']}: library/baseline "
                f"messages/process {compared['received_per_process_ratio']:.3f}, "
                f"CPU/process {compared['watcher_cpu_s_per_process_ratio']:.3f}, "
                f"Redis CPU {compared['redis_cpu_s_ratio']:.3f}, "
                f"publisher CPU/trigger {compared['publisher_cpu_us_per_trigger_ratio']:.3f}"
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=2)
    # Every library runs on one server; a cluster refused by a library that
    # predates cluster support is a finding, reported above.
    return 1 if any("error" in row and row["topology"] == "single" for row in report["runs"]) else 0
