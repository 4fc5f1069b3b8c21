"""``aiopurgatory bench``: run the benchmarks side by side and report ratios.

Usage::

    aiopurgatory bench timer [-n N] [--loop asyncio|uvloop|both|trio|all] [--repeat R] ...
    aiopurgatory bench purgatory [--num N] [--rate R] [--pct75 MS --pct50 MS] [--sweep] ...
    aiopurgatory bench purgatory --acks-only [--acks 100,1000,...] [--acks-partitions P] ...
    aiopurgatory bench scale [--pending 1000,10000,...] [--ops N] ...
    aiopurgatory bench parked [--sizes 10000,100000,1000000] [--keys K] [--impls ...]
    aiopurgatory bench all [--quick]
    aiopurgatory bench redis-fanout [--processes 2,4,8] [--baseline CHECKOUT] ...
    aiopurgatory bench jobs [--waits 1000] [--web-workers 2] ...

Every implementation runs in the same invocation, interleaved: repeat ``r`` runs
each implementation once, in an order rotated by ``r``, so drifts of the machine
(other processes, CPU frequency) hit every side alike. Each run is a fresh
subprocess (see :mod:`aiopurgatory.bench._common` for why); the report gives the
median of the repeats and the ratios of those medians. Absolute numbers are
reported for reference; the ratios are the result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Sequence
from typing import Any

from .._clitools import Parser, UsageError, check_output_file, fail, require
from . import acks as acks_bench
from . import purgatory as purgatory_bench
from . import timer as timer_bench
from ._common import TRIO_LOOPS, quiet_logging
from ._report import _print_report
from ._runner import _positive_int, _Runner
from .suite_acks import DEFAULT_PENDINGS, _acks_args, acks_params, run_acks_suite
from .suite_parked import _parked_args, run_parked_suite
from .suite_purgatory import (
    _DEFAULT_SWEEP,
    _headline_args,
    _purgatory_args,
    _scenarios,
    _sweep_args,
    completion_cases,
    headline_loops,
    run_headline,
    run_purgatory_suite,
)
from .suite_scale import _scale_args, run_scale_suite
from .suite_timer import _timer_args, run_timer_suite

__all__ = ["main", "run_purgatory_suite", "run_scale_suite", "run_timer_suite"]

SCHEMA = 1

#: --loop choice -> the loops run. 'both' keeps its meaning (and the targets of
#: issue 11 are for those two); trio runs other baselines, so it is asked for by
#: name or with 'all'.
_LOOP_CHOICES: dict[str, tuple[str, ...]] = {
    "asyncio": ("asyncio",),
    "uvloop": ("uvloop",),
    "both": ("asyncio", "uvloop"),
    "trio": ("trio",),
    "all": ("asyncio", "uvloop", "trio"),
    "virtual": ("virtual",),
    "trio-virtual": ("trio-virtual",),
}


def _parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument(
        "--loop",
        choices=tuple(_LOOP_CHOICES),
        default="both",
        help="event loop(s) to run on; 'both' = asyncio and uvloop; 'trio' = "
        "trio.run, against trio's own deadlines; 'all' = asyncio, uvloop and trio; "
        "'virtual' and 'trio-virtual' = virtual time (for tests: timings meaningless)",
    )
    common.add_argument(
        "--repeat",
        type=_positive_int,
        default=None,
        help="rounds, the median taken (default: 3); 'all --quick' runs 1 unless given",
    )
    common.add_argument("--seed", type=int, default=1, help="random seed of the workloads")
    common.add_argument(
        "--json",
        metavar="PATH",
        help="write the full report as JSON (its directory must exist; checked before the run)",
    )
    common.add_argument(
        "--plot",
        metavar="PATH",
        help="write plots (PNG, matplotlib Agg; its directory must exist; checked before the run)",
    )
    common.add_argument(
        "--no-isolate",
        action="store_true",
        help="run in this process instead of a subprocess per run (peak RSS then mixes)",
    )
    common.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress on stderr (a bar on a terminal, else a line per step)",
    )
    common.add_argument("--quiet", action="store_true", help="no result tables on stdout")

    parser = Parser(
        prog="aiopurgatory bench",
        description="Benchmarks of aiopurgatory against plain asyncio or trio, side by side.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            parents=[common],
            help=help_,
            description=help_,
        )

    p = command("timer", "ap.Timer vs loop.call_later (trio: trio's deadlines)")
    _timer_args(p)

    p = command("purgatory", "Kafka's TestPurgatoryPerformance workload")
    _purgatory_args(p)
    _sweep_args(p)
    _headline_args(p)
    _acks_args(p)

    p = command("scale", "cost per op as pending timers grow (asyncio loops)")
    _scale_args(p)

    p = command(
        "parked",
        "what one parked request costs (memory, CPU, GC-tracked objects, a full collection): "
        "try_complete_else_watch and await watch() against hand-written code (asyncio loops)",
    )
    _parked_args(p)

    # Its options are its own (it runs processes against Redis, not specs):
    # main() hands its arguments to aiopurgatory.bench.redis_fanout.
    sub.add_parser(
        "redis-fanout",
        help="RedisTriggers as watcher processes multiply: messages and CPU per process, "
        "Redis's CPU, the publisher's; one library against another (--baseline)",
        add_help=False,
    )

    # Its options are its own too: main() hands them to aiopurgatory.bench.jobs.
    sub.add_parser(
        "jobs",
        help="from a Celery task's end to the waiting HTTP request's answer under "
        "uvicorn --workers 2: aiopurgatory.jobs against polling",
        add_help=False,
    )

    p = command("all", "the default set (a few minutes)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run of every benchmark: 100x smaller workloads, latencies of "
        "milliseconds, one round, two sweep rates, two scale sizes (well under a minute "
        "on an idle machine; its numbers are not results)",
    )
    return parser


def _machine(loops: Sequence[str]) -> dict[str, Any]:
    import os

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    from importlib import metadata

    try:
        info["uvloop"] = metadata.version("uvloop")
    except metadata.PackageNotFoundError:  # pragma: no cover - uvloop is optional
        info["uvloop"] = None
    if any(loop in TRIO_LOOPS for loop in loops):
        info["trio"] = metadata.version("trio")
    import aiopurgatory

    info["aiopurgatory"] = aiopurgatory.__version__
    return info


def _count_runs(args: argparse.Namespace, loops: Sequence[str]) -> int:
    """How many runs the command will make (the progress bar's total; an estimate
    for sweeps, which stop at the first rate an implementation misses)."""
    cells = len(loops)
    timer_cells = sum(len(timer_bench.impls(loop)) for loop in loops)
    scale_cells = len(_scale_loops(loops))
    repeat: int = args.repeat
    if args.command == "timer":
        return timer_cells * repeat
    if args.command == "purgatory":
        acks = len(_acks_pendings(args)) * len(args.acks_impls) * len(_scale_loops(loops)) * repeat
        if args.acks_only:
            return acks
        n = acks + cells * 3 * repeat * len(_scenarios(args))
        if args.sweep:
            n += cells * 3 * len(args.sweep)
        if not args.no_headline:
            n += len(headline_loops(loops)) * 3 * 2 * repeat + (2 if args.gc_pending else 0)
        return n
    if args.command == "parked":
        return len(args.sizes) * scale_cells * len(args.impls) * repeat
    if args.command == "scale":
        pendings: list[int] = args.pending
        return scale_cells * 2 * (repeat * len(pendings) + (1 if args.memory_pending else 0))
    # all: timer, the headline (two completions of three impls), four purgatory
    # cases (two scenarios, check and clock completion) of three impls, a sweep of
    # two impls, scale at its sizes + memory and acks=all at one size (not on trio)
    plan = _all_plan(args.quick)
    return (
        timer_cells * repeat
        + len(headline_loops(loops)) * 6 * repeat
        + cells * (12 * repeat + 2 * len(plan["sweep"]))
        + scale_cells * 2 * (len(plan["pending"]) * repeat + 1)
        + scale_cells * len(acks_bench.IMPLS) * repeat
    )


def _acks_pendings(args: argparse.Namespace) -> list[int]:
    """The pending counts of the acks=all workload the command runs (none: not asked)."""
    if args.acks:
        return list(args.acks)
    return list(DEFAULT_PENDINGS) if args.acks_only else []


def _scale_loops(loops: Sequence[str]) -> list[str]:
    """The loops ``bench scale`` runs on: the asyncio ones (it has no trio version)."""
    return [loop for loop in loops if loop not in TRIO_LOOPS]


def _check_before_run(args: argparse.Namespace) -> None:
    """Everything that would otherwise fail after the run (and lose its results).

    Raises:
        UsageError: an output path that cannot be written, a missing extra.
    """
    if args.json:
        check_output_file(args.json, "--json")
    if args.plot:
        check_output_file(args.plot, "--plot")
        if args.json and os.path.abspath(args.json) == os.path.abspath(args.plot):
            raise UsageError("--json and --plot name the same file")
    modules = [] if args.quiet and args.no_progress else ["rich"]
    if args.plot:
        modules.append("matplotlib")
    require(modules, "bench")
    if args.loop in ("trio", "all", "trio-virtual"):
        require(["trio"], "trio")
    if args.loop in ("uvloop", "both", "all"):
        require(["uvloop"], "uvloop")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``aiopurgatory bench``; returns the exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["redis-fanout"]:
        from .redis_fanout import main as fanout_main

        return fanout_main(arguments[1:])
    if arguments[:1] == ["jobs"]:
        from .jobs import main as jobs_main

        return jobs_main(arguments[1:])
    parser = _parser()
    args = parser.parse_args(arguments)
    if args.repeat is None:
        args.repeat = 1 if getattr(args, "quick", False) else 3
    loops = list(_LOOP_CHOICES[args.loop])
    quiet_logging()
    if args.command in ("scale", "parked") and not _scale_loops(loops):
        parser.error(f"bench {args.command} runs on asyncio loops only (asyncio, uvloop, virtual)")
    if args.command == "purgatory" and args.acks_only and not _scale_loops(loops):
        parser.error("the acks=all workload runs on asyncio loops only (asyncio, uvloop, virtual)")
    try:
        scenarios = _scenarios(args) if args.command == "purgatory" else []
    except ValueError as exc:
        parser.error(str(exc))
    try:
        _check_before_run(args)
    except UsageError as exc:
        return fail(f"aiopurgatory bench {args.command}", exc)
    runner = _Runner(
        _count_runs(args, loops),
        isolate=not args.no_isolate,
        progress=not args.no_progress,
    )
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "command": args.command,
        "machine": _machine(loops),
    }

    def acks() -> dict[str, Any]:
        # The acks=all workload, alone (--acks-only) or after the Kafka scenarios.
        return run_acks_suite(
            _scale_loops(loops),
            _acks_pendings(args),
            acks_params(args),
            args.repeat,
            runner,
            impls=args.acks_impls,
        )

    try:
        if args.command == "timer":
            params = {
                "n": args.n,
                "cancel_fraction": args.cancel_fraction,
                "max_delay": args.max_delay,
                "batch": args.batch,
            }
            report["timer"] = run_timer_suite(
                loops, dict(params, seed=args.seed), args.repeat, runner
            )
        elif args.command == "purgatory" and args.acks_only:
            report["acks"] = acks()
        elif args.command == "purgatory":
            if not args.no_headline and headline_loops(loops):
                # First: the case users have (see aiopurgatory.bench.realistic).
                report["headline"] = run_headline(
                    headline_loops(loops),
                    {"num": args.headline_num, "seed": args.seed},
                    args.repeat,
                    runner,
                    gc_pending=args.gc_pending,
                )
            report["purgatory"] = run_purgatory_suite(
                loops,
                scenarios,
                args.repeat,
                runner,
                sweep=args.sweep or (),
                sweep_params=dict(scenarios[0], num=args.sweep_num),
            )
            if _acks_pendings(args) and _scale_loops(loops):
                report["acks"] = acks()
        elif args.command == "parked":
            report["parked"] = run_parked_suite(
                _scale_loops(loops),
                args.sizes,
                {"keys": args.keys},
                args.repeat,
                runner,
                impls=args.impls,
            )
        elif args.command == "scale":
            report["scale"] = run_scale_suite(
                _scale_loops(loops),
                args.pending,
                {"ops": args.ops, "batch": args.batch, "seed": args.seed},
                args.repeat,
                runner,
                memory_pending=args.memory_pending,
            )
        else:
            _run_all(args, loops, runner, report)
    finally:
        runner.close()
    if not args.quiet:
        _print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, allow_nan=True)
            f.write("\n")
    if args.plot:
        from .plot import plot_report

        plot_report(report, args.plot)
    return 0


def _all_plan(quick: bool) -> dict[str, Any]:
    """What ``bench all`` runs: the default set, or (``quick``) a smoke run of it:
    100x fewer operations, millisecond latencies and delays (the defaults are
    seconds of wall time per run), two sweep rates and two scale sizes."""
    if not quick:
        return {
            "scale_down": 1,
            "timer": {},
            "headline": {},
            "sweep": _DEFAULT_SWEEP,
            "pending": [10**3, 10**4, 10**5, 10**6],
            "acks": {"pending": 1000},
        }
    return {
        "scale_down": 100,
        "timer": {"max_delay": 0.05},
        "headline": {"timeout": 200.0, "pct75": 40.0, "pct50": 20.0},
        "sweep": _DEFAULT_SWEEP[:2],
        "pending": [10**3, 10**4],
        "acks": {"pending": 100, "rounds": 50, "cpu_budget": 0.2},
    }


def _run_all(
    args: argparse.Namespace, loops: Sequence[str], runner: _Runner, report: dict[str, Any]
) -> None:
    plan = _all_plan(args.quick)
    scale_down = plan["scale_down"]
    if args.quick:
        report["quick"] = True  # a smoke run: the numbers are not results
    report["timer"] = run_timer_suite(
        loops,
        dict(timer_bench.DEFAULTS, n=1_000_000 // scale_down, seed=args.seed, **plan["timer"]),
        args.repeat,
        runner,
    )
    if headline_loops(loops):
        report["headline"] = run_headline(
            headline_loops(loops),
            {"num": 200_000 // scale_down, "seed": args.seed, **plan["headline"]},
            args.repeat,
            runner,
        )
    base = dict(
        purgatory_bench.DEFAULTS,
        num=200_000 // scale_down,
        memory_ops=purgatory_bench.DEFAULTS["memory_ops"] // scale_down,
        seed=args.seed,
    )
    scenarios = [
        dict(base, pct75=p75, pct50=p50) for p75, p50 in purgatory_bench.SCENARIOS.values()
    ]
    # Kafka's way of completing (check_and_complete), with a flag and with the clock.
    scenarios += completion_cases(
        dict(scenarios[0], num=100_000 // scale_down, rate=None), ("check", "clock")
    )
    report["purgatory"] = run_purgatory_suite(
        loops,
        scenarios,
        args.repeat,
        runner,
        sweep=plan["sweep"],
        sweep_params=dict(scenarios[0], num=50_000 // scale_down),
        sweep_impls=("ap", "hand"),
    )
    scale_loops = _scale_loops(loops)
    if not scale_loops:
        return
    # acks=all (watermarks, issue 28) at the pending count of its targets.
    acks = dict(acks_bench.DEFAULTS, **plan["acks"])
    report["acks"] = run_acks_suite(scale_loops, [acks.pop("pending")], acks, args.repeat, runner)
    report["scale"] = run_scale_suite(
        scale_loops,
        plan["pending"],
        {"ops": 200_000 // scale_down, "batch": 1000, "seed": args.seed},
        args.repeat,
        runner,
        memory_pending=100_000 // scale_down,
    )
