"""``aiopurgatory bench purgatory``: Kafka's purgatory workload, its suite and options.

The suite over scenarios, the rate sweep for the saturation rate, and the
scenario helpers that turn the command's options into params dicts.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

from . import purgatory as purgatory_bench
from . import realistic
from ._common import TRIO_LOOPS, Result
from ._runner import (
    MEMORY_VS_HAND,
    PURGATORY_SATURATION_UVLOOP,
    PURGATORY_VS_FLOOR,
    PURGATORY_VS_HAND,
    _cell,
    _cells,
    _interleaved,
    _non_negative_float,
    _non_negative_int,
    _positive_float,
    _positive_int,
    _rate_list,
    _ratio,
    _Runner,
    _spec,
    _target,
)

__all__ = [
    "CHECK_RATE",
    "HEADLINE_COMPLETIONS",
    "_DEFAULT_SWEEP",
    "_headline_args",
    "_purgatory_args",
    "_scenarios",
    "_sweep_args",
    "completion_cases",
    "headline_loops",
    "run_headline",
    "run_purgatory_suite",
]

_DEFAULT_SWEEP = (50_000.0, 100_000.0, 150_000.0, 200_000.0, 250_000.0, 300_000.0)


_PURGATORY_METRICS = (
    "target_rate",
    "requests_per_cpu_s",
    "achieved_rate",
    "cpu_s",
    "cpu_us_per_request",
    "wall_s",
    "completed",
    "expired",
    "expiry_lateness.p50",
    "expiry_lateness.p99",
    "expiry_lateness.max",
    "peak_rss_mib",
    "rss_before_mib",
    "memory_per_pending_op_bytes",
)


#: Arrival rate (req/s) of the check and clock completions when --rate is not given:
#: each completion scans a watch list, so back-to-back arrivals (thousands pending
#: per key) would measure little but that scan.
CHECK_RATE = 20_000.0


#: The headline's rows: the realistic case (try_complete reads a flag), then force.
HEADLINE_COMPLETIONS = ("check", "force")

_HEADLINE_METRICS = (
    "cpu_s",
    "cpu_us_per_request",
    "wall_s",
    "completed",
    "expired",
    "peak_pending",
    "gc_collections",
)


def headline_loops(loops: Sequence[str]) -> list[str]:
    """The loops the headline runs on: the asyncio ones (its tasks are asyncio tasks)."""
    return [loop for loop in loops if loop not in TRIO_LOOPS]


def run_headline(
    loops: Sequence[str],
    params: dict[str, Any],
    repeat: int,
    runner: _Runner,
    *,
    gc_pending: int = 0,
) -> dict[str, Any]:
    """The realistic case (:mod:`.realistic`) on each asyncio loop, one row per completion.

    Each row: CPU per request of the null run, ``ap`` and the hand-written
    purgatory (medians of ``repeat`` interleaved rounds), and each purgatory's own
    cost above the null run. With ``gc_pending``, also the full-GC stall with that
    many operations pending.
    """
    rows = []
    runs: list[Result] = []
    for completion in HEADLINE_COMPLETIONS:
        case = dict(params, completion=completion)
        specs = _interleaved("realistic", list(realistic.IMPLS), loops, case, repeat)
        results = [runner.run(s) for s in specs]
        runs += results
        cells = _cells(results, ("loop", "impl"), _HEADLINE_METRICS)
        for loop in loops:
            null, ap, hand = (
                _cell(cells, loop=loop, impl=realistic.IMPLS[k]) for k in ("null", "ap", "hand")
            )
            rows.append(
                {
                    "completion": completion,
                    "loop": loop,
                    "null_us": null["cpu_us_per_request"],
                    "ap_us": ap["cpu_us_per_request"],
                    "hand_us": hand["cpu_us_per_request"],
                    "ap_own_us": ap["cpu_us_per_request"] - null["cpu_us_per_request"],
                    "hand_own_us": hand["cpu_us_per_request"] - null["cpu_us_per_request"],
                    "cpu_hand_over_ap": _ratio(hand["cpu_s"], ap["cpu_s"]),
                    "peak_pending": ap["peak_pending"],
                    "expired": ap["expired"],
                }
            )
    report: dict[str, Any] = {"params": params, "repeat": repeat, "rows": rows, "runs": runs}
    if gc_pending:
        gc_runs = [
            runner.run(s)
            for s in _interleaved("gcstall", ("ap", "hand"), loops[:1], {"pending": gc_pending}, 1)
        ]
        report["gc"] = gc_runs
    return report


def _headline_args(p: argparse.ArgumentParser) -> None:
    """Add the options of the realistic headline to ``p``."""
    p.add_argument(
        "--no-headline", action="store_true", help="skip the realistic case (tasks await ops)"
    )
    p.add_argument(
        "--headline-num",
        type=_positive_int,
        default=realistic.DEFAULTS["num"],
        help="requests of the realistic case (10^5 to 10^6 pending at the peak)",
    )
    p.add_argument(
        "--gc-pending",
        type=_non_negative_int,
        default=0,
        help="also time a full gc.collect() with this many ops pending (e.g. 1000000)",
    )


def _scenario_name(params: dict[str, Any]) -> str:
    completion = params.get("completion", "force")
    suffix = "" if completion == "force" else f"/{completion}"
    for name, (p75, p50) in purgatory_bench.SCENARIOS.items():
        if (params["pct75"], params["pct50"]) == (p75, p50):
            return name + suffix
    return f"pct75={params['pct75']},pct50={params['pct50']}{suffix}"


def completion_cases(base: dict[str, Any], completions: Sequence[str]) -> list[dict[str, Any]]:
    """``base`` once per completion kind; check/clock at :data:`CHECK_RATE` unless a rate is set."""
    cases = []
    for completion in completions:
        case = dict(base, completion=completion)
        if case.get("rate") is None:
            case["rate"] = 0.0 if completion == "force" else CHECK_RATE
        cases.append(case)
    return cases


def run_purgatory_suite(
    loops: Sequence[str],
    scenarios: Sequence[dict[str, Any]],
    repeat: int,
    runner: _Runner,
    *,
    sweep: Sequence[float] = (),
    sweep_params: dict[str, Any] | None = None,
    sweep_impls: Sequence[str] = ("ap", "hand", "floor"),
) -> dict[str, Any]:
    """Run ``bench purgatory`` for each scenario (a params dict) and loop; aggregate.

    With ``sweep`` rates, also run each implementation at each rate (once, in
    ascending order, stopping at its first rate it cannot keep up with) and report
    the saturation rate: the highest achieved rate that kept within 5% of target.
    """
    cells = []
    ratios = []
    targets = []
    all_runs: list[Result] = []
    for params in scenarios:
        scenario = _scenario_name(params)
        specs = _interleaved(
            "purgatory", lambda loop: list(purgatory_bench.impls(loop)), loops, params, repeat
        )
        results = [runner.run(s) for s in specs]
        all_runs += [dict(r, scenario=scenario) for r in results]
        memory_skipped = not params.get("memory_ops")
        cells += _cells(
            results,
            ("loop", "impl"),
            _PURGATORY_METRICS,
            scenario=scenario,
            memory_skipped=memory_skipped,
        )
        for loop in loops:
            labels = purgatory_bench.impls(loop)
            ap_cell = _cell(cells, loop=loop, impl=labels["ap"], scenario=scenario)
            hand = _cell(cells, loop=loop, impl=labels["hand"], scenario=scenario)
            floor = _cell(cells, loop=loop, impl=labels["floor"], scenario=scenario)
            vs_hand = _ratio(hand["cpu_s"], ap_cell["cpu_s"])
            vs_floor = _ratio(ap_cell["cpu_s"], floor["cpu_s"])
            memory = _ratio(
                ap_cell["memory_per_pending_op_bytes"], hand["memory_per_pending_op_bytes"]
            )
            ratios.append(
                {
                    "scenario": scenario,
                    "loop": loop,
                    "cpu_hand_over_ap": vs_hand,
                    "cpu_ap_over_floor": vs_floor,
                    "memory_ap_over_hand": memory,
                    "memory_skipped": memory_skipped,
                }
            )
            if loop in TRIO_LOOPS:
                continue  # the targets of issue 11 are for asyncio and uvloop
            where = f"{scenario} on {loop}"
            targets.append(
                _target(
                    f"purgatory CPU vs hand-written, {where}",
                    vs_hand,
                    PURGATORY_VS_HAND,
                    higher_is_better=True,
                )
            )
            targets.append(
                _target(
                    f"purgatory CPU over floor, {where}",
                    vs_floor,
                    PURGATORY_VS_FLOOR,
                    higher_is_better=False,
                )
            )
            if not memory_skipped:  # --memory-ops 0: not measured, so no target either
                targets.append(
                    _target(
                        f"memory per pending op vs hand-written, {where}",
                        memory,
                        MEMORY_VS_HAND,
                        higher_is_better=False,
                    )
                )
    report: dict[str, Any] = {
        "scenarios": scenarios,
        "repeat": repeat,
        "cells": cells,
        "ratios": ratios,
        "targets": targets,
        "runs": all_runs,
    }
    if sweep:
        report["sweep"] = _sweep(
            loops, sweep, sweep_params or dict(scenarios[0]), sweep_impls, runner
        )
        targets.extend(
            _target(
                "purgatory saturation on uvloop (req/s)",
                row["saturation_rate"],
                PURGATORY_SATURATION_UVLOOP,
                higher_is_better=True,
            )
            for row in report["sweep"]["saturation"]
            if row["loop"] == "uvloop" and row["impl"] == purgatory_bench.IMPLS["ap"]
        )
    return report


def _sweep(
    loops: Sequence[str],
    rates: Sequence[float],
    params: dict[str, Any],
    impls: Sequence[str],
    runner: _Runner,
) -> dict[str, Any]:
    points = []
    saturation = []
    for loop in loops:
        for impl in impls:
            best = math.nan
            best_any = 0.0
            for rate in sorted(rates):
                spec = _spec("purgatory", impl, loop, dict(params, rate=rate, memory_ops=0))
                result = runner.run(spec)
                kept_up = result["achieved_rate"] >= 0.95 * rate
                points.append(
                    {
                        "loop": loop,
                        "impl": result["impl"],
                        "target_rate": rate,
                        "achieved_rate": result["achieved_rate"],
                        "cpu_us_per_request": result["cpu_us_per_request"],
                        "expiry_lateness_p99": result["expiry_lateness"]["p99"],
                        "kept_up": kept_up,
                    }
                )
                best_any = max(best_any, result["achieved_rate"])
                if not kept_up:
                    break
                best = (
                    result["achieved_rate"]
                    if math.isnan(best)
                    else max(best, result["achieved_rate"])
                )
            saturation.append(
                {
                    "loop": loop,
                    "impl": purgatory_bench.impls(loop)[impl],
                    # NaN if even the lowest rate was missed; then see best_achieved.
                    "saturation_rate": best,
                    "best_achieved_rate": best_any,
                    "kept_up_with_all": all(
                        p["kept_up"]
                        for p in points
                        if p["loop"] == loop and p["impl"] == purgatory_bench.impls(loop)[impl]
                    ),
                }
            )
    return {"params": params, "rates": list(rates), "points": points, "saturation": saturation}


def _purgatory_args(p: argparse.ArgumentParser) -> None:
    d = purgatory_bench.DEFAULTS
    p.add_argument("--num", type=_positive_int, default=d["num"], help="requests")
    p.add_argument(
        "--rate",
        type=_non_negative_float,
        default=None,
        help=f"req/s; 0 = back to back (default: 0 for --completion force, "
        f"{CHECK_RATE:g} for check and clock)",
    )
    p.add_argument(
        "--timeout", type=_positive_float, default=d["timeout"], help="operation timeout, ms"
    )
    p.add_argument(
        "--pct75",
        type=_positive_float,
        default=None,
        help="75th percentile of completion latency, ms, with --pct50 "
        "(default: the --scenario's, 60 for low-timeout)",
    )
    p.add_argument(
        "--pct50",
        type=_positive_float,
        default=None,
        help="median completion latency, ms, with --pct75 "
        "(default: the --scenario's, 20 for low-timeout)",
    )
    p.add_argument(
        "--scenario",
        choices=(*purgatory_bench.SCENARIOS, "both"),
        default=None,
        help="Kafka's published pct75/pct50 pairs: low-timeout 60/20, high-timeout 400/200 "
        "(default: low-timeout, unless --pct75/--pct50 are given)",
    )
    p.add_argument(
        "--completion",
        choices=(*purgatory_bench.COMPLETIONS, "all"),
        default=d["completion"],
        help="how requests complete: force = force_complete() from outside (Kafka's "
        "TestPurgatoryPerformance), check = check_and_complete(key) with a flag "
        "(Kafka's way), clock = check_and_complete(key), try_complete reads the clock",
    )
    p.add_argument("--keys", type=_positive_int, default=d["keys"], help="watch keys per request")
    p.add_argument(
        "--key-space-size",
        type=_positive_int,
        default=d["key_space_size"],
        help="distinct keys the requests' keys are drawn from",
    )
    p.add_argument(
        "--batch", type=_positive_int, default=d["batch"], help="most arrivals per loop wake-up"
    )
    p.add_argument(
        "--memory-ops",
        type=_non_negative_int,
        default=d["memory_ops"],
        help="ops pending during the tracemalloc measurement (0: skip it; shown as skipped)",
    )


def _sweep_args(p: argparse.ArgumentParser) -> None:
    """Add the rate-sweep options of ``bench purgatory`` to ``p``."""
    p.add_argument(
        "--sweep",
        nargs="?",
        const=",".join(str(int(r)) for r in _DEFAULT_SWEEP),
        type=_rate_list,
        metavar="RATES",
        help="also sweep these rates (comma-separated req/s) for the saturation rate; "
        "--sweep alone sweeps the default rates (default: no sweep)",
    )
    p.add_argument(
        "--sweep-num", type=_positive_int, default=100_000, help="requests per sweep point"
    )


def _scenarios(args: argparse.Namespace) -> list[dict[str, Any]]:
    base = {
        "num": args.num,
        "rate": args.rate,
        "timeout": args.timeout,
        "keys": args.keys,
        "key_space_size": args.key_space_size,
        "batch": args.batch,
        "memory_ops": args.memory_ops,
        "seed": args.seed,
    }
    if args.pct75 is not None or args.pct50 is not None:
        if args.scenario is not None:
            raise ValueError("give either --scenario or --pct75/--pct50, not both")
        if args.pct75 is None or args.pct50 is None:
            raise ValueError("--pct75 and --pct50 go together")
        if not args.pct50 < args.pct75:
            raise ValueError(f"--pct50 ({args.pct50}) must be below --pct75 ({args.pct75})")
        return completion_cases(
            dict(base, pct75=args.pct75, pct50=args.pct50),
            list(purgatory_bench.COMPLETIONS) if args.completion == "all" else [args.completion],
        )
    names = (
        list(purgatory_bench.SCENARIOS)
        if args.scenario == "both"
        else [args.scenario or "low-timeout"]
    )
    completions = (
        list(purgatory_bench.COMPLETIONS) if args.completion == "all" else [args.completion]
    )
    return [
        case
        for n in names
        for case in completion_cases(
            dict(
                base,
                pct75=purgatory_bench.SCENARIOS[n][0],
                pct50=purgatory_bench.SCENARIOS[n][1],
            ),
            completions,
        )
    ]
