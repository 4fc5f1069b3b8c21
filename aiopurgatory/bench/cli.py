"""``aiopurgatory bench``: run the benchmarks side by side and report ratios.

Usage::

    aiopurgatory bench timer [-n N] [--loop asyncio|uvloop|both] [--repeat R] ...
    aiopurgatory bench purgatory [--num N] [--rate R] [--pct75 MS --pct50 MS] [--sweep] ...
    aiopurgatory bench scale [--pending 1000,10000,...] [--ops N] ...
    aiopurgatory bench all [--quick]

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
import math
import platform
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from . import purgatory as purgatory_bench
from . import scale as scale_bench
from . import timer as timer_bench
from ._common import Result, Spec, execute, median, quiet_logging

__all__ = ["main", "run_purgatory_suite", "run_scale_suite", "run_timer_suite"]

SCHEMA = 1

#: Issue 4's targets, checked in every report.
TIMER_CPU_VS_ASYNCIO = 3.0
TIMER_CPU_VS_UVLOOP = 1.0
PURGATORY_VS_HAND = 1.5
PURGATORY_VS_FLOOR = 1.2
PURGATORY_SATURATION_UVLOOP = 150_000.0
SCALE_FLATNESS = 1.2
MEMORY_VS_HAND = 0.5

_DEFAULT_SWEEP = (50_000.0, 100_000.0, 150_000.0, 200_000.0, 300_000.0)


# -- running and aggregating --------------------------------------------------------


class _Runner:
    """Runs specs with an optional rich progress bar on stderr."""

    def __init__(self, total: int, *, isolate: bool, progress: bool) -> None:
        self.isolate = isolate
        self._progress: Any = None
        self._task: Any = None
        if progress and total:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._task = self._progress.add_task("bench", total=total)
            self._progress.start()

    def run(self, spec: Spec) -> Result:
        if self._progress is not None:
            params = spec.get("params", {})
            detail = ", ".join(f"{k}={v}" for k, v in params.items() if k in _SHOWN_PARAMS)
            self._progress.update(
                self._task,
                description=f"{spec['bench']} {spec['impl']} on {spec['loop']} {detail}",
            )
        result = execute(spec, isolate=self.isolate)
        if self._progress is not None:
            self._progress.advance(self._task)
        return result

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


_SHOWN_PARAMS = ("n", "num", "rate", "pct50", "pending")


def _interleaved(
    bench: str, impls: Sequence[str], loops: Sequence[str], params: dict[str, Any], repeat: int
) -> list[Spec]:
    """Specs for ``repeat`` rounds; each round runs every (loop, impl), rotated."""
    cells = [(loop, impl) for loop in loops for impl in impls]
    specs: list[Spec] = []
    for r in range(repeat):
        k = r % len(cells)
        for loop, impl in cells[k:] + cells[:k]:
            specs.append(_spec(bench, impl, loop, dict(params)))
    return specs


def _spec(bench: str, impl: str, loop: str, params: dict[str, Any]) -> Spec:
    return {"bench": bench, "impl": impl, "loop": loop, "params": params}


def _get(result: Result, path: str) -> float:
    value: Any = result
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return math.nan
        value = value[part]
    return float(value) if isinstance(value, int | float) and value is not None else math.nan


def _aggregate(runs: list[Result], metrics: Sequence[str]) -> dict[str, Any]:
    """Median of each metric over runs; histograms summed; early fires summed."""
    out: dict[str, Any] = {m: median([_get(r, m) for r in runs]) for m in metrics}
    for name in ("lateness", "expiry_lateness"):
        hists = [r[name]["hist"] for r in runs if name in r]
        if hists:
            counts = [sum(c) for c in zip(*(h["counts"] for h in hists), strict=True)]
            out[f"{name}.hist"] = {
                "edges": hists[0]["edges"],
                "counts": counts,
                "zero": sum(h["zero"] for h in hists),
            }
    if runs and "early" in runs[0]:
        out["early_total"] = sum(int(r["early"]) for r in runs)
    out["repeats"] = len(runs)
    return out


def _group(
    results: list[Result], key: Callable[[Result], tuple[Any, ...]]
) -> dict[Any, list[Result]]:
    groups: dict[Any, list[Result]] = {}
    for r in results:
        groups.setdefault(key(r), []).append(r)
    return groups


def _cells(
    results: list[Result], keys: tuple[str, ...], metrics: Sequence[str], **extra: Any
) -> list[dict[str, Any]]:
    """One cell per distinct value of ``keys`` in ``results``: ``extra``, the keys, the medians."""
    return [
        {**extra, **dict(zip(keys, key, strict=True)), "median": _aggregate(runs, metrics)}
        for key, runs in _group(results, lambda r: tuple(r[k] for k in keys)).items()
    ]


def _ratio(numerator: float, denominator: float) -> float:
    if denominator == 0 or math.isnan(numerator) or math.isnan(denominator):
        return math.nan
    return numerator / denominator


def _target(name: str, value: float, target: float, *, higher_is_better: bool) -> dict[str, Any]:
    met = (value >= target) if higher_is_better else (value <= target)
    return {
        "name": name,
        "value": value,
        "target": target,
        "higher_is_better": higher_is_better,
        "met": bool(met) and not math.isnan(value),
    }


# -- the three suites -----------------------------------------------------------------

_TIMER_METRICS = (
    "cpu_s",
    "wall_s",
    "add_cancel_ns_per_op",
    "fired",
    "cancelled",
    "early",
    "lateness.p50",
    "lateness.p99",
    "lateness.max",
    "peak_rss_mib",
    "rss_before_mib",
)


def run_timer_suite(
    loops: Sequence[str], params: dict[str, Any], repeat: int, runner: _Runner
) -> dict[str, Any]:
    """Run ``bench timer`` for every loop and both implementations; aggregate."""
    specs = _interleaved("timer", list(timer_bench.IMPLS), loops, params, repeat)
    results = [runner.run(s) for s in specs]
    cells = _cells(results, ("loop", "impl"), _TIMER_METRICS)
    ratios = []
    targets = []
    for loop in loops:
        ap_cell = _cell(cells, loop=loop, impl=timer_bench.IMPLS["ap"])
        base = _cell(cells, loop=loop, impl=timer_bench.IMPLS["loop"])
        cpu = _ratio(base["cpu_s"], ap_cell["cpu_s"])
        ratios.append(
            {
                "loop": loop,
                "what": "CPU loop.call_later / ap.Timer",
                "value": cpu,
                "add_cancel": _ratio(base["add_cancel_ns_per_op"], ap_cell["add_cancel_ns_per_op"]),
            }
        )
        goal = TIMER_CPU_VS_ASYNCIO if loop != "uvloop" else TIMER_CPU_VS_UVLOOP
        targets.append(
            _target(f"timer CPU vs loop.call_later on {loop}", cpu, goal, higher_is_better=True)
        )
        targets.append(
            _target(
                f"timer early fires on {loop}", ap_cell["early_total"], 0, higher_is_better=False
            )
        )
    return {
        "params": params,
        "repeat": repeat,
        "cells": cells,
        "ratios": ratios,
        "targets": targets,
        "runs": results,
    }


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


def _scenario_name(params: dict[str, Any]) -> str:
    for name, (p75, p50) in purgatory_bench.SCENARIOS.items():
        if (params["pct75"], params["pct50"]) == (p75, p50):
            return name
    return f"pct75={params['pct75']},pct50={params['pct50']}"


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
    impls = list(purgatory_bench.IMPLS)
    cells = []
    ratios = []
    targets = []
    all_runs: list[Result] = []
    for params in scenarios:
        scenario = _scenario_name(params)
        specs = _interleaved("purgatory", impls, loops, params, repeat)
        results = [runner.run(s) for s in specs]
        all_runs += [dict(r, scenario=scenario) for r in results]
        cells += _cells(results, ("loop", "impl"), _PURGATORY_METRICS, scenario=scenario)
        for loop in loops:
            ap_cell = _cell(cells, loop=loop, impl=purgatory_bench.IMPLS["ap"], scenario=scenario)
            hand = _cell(cells, loop=loop, impl=purgatory_bench.IMPLS["hand"], scenario=scenario)
            floor = _cell(cells, loop=loop, impl=purgatory_bench.IMPLS["floor"], scenario=scenario)
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
                }
            )
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
                    "impl": purgatory_bench.IMPLS[impl],
                    # NaN if even the lowest rate was missed; then see best_achieved.
                    "saturation_rate": best,
                    "best_achieved_rate": best_any,
                    "kept_up_with_all": all(
                        p["kept_up"]
                        for p in points
                        if p["loop"] == loop and p["impl"] == purgatory_bench.IMPLS[impl]
                    ),
                }
            )
    return {"params": params, "rates": list(rates), "points": points, "saturation": saturation}


_SCALE_METRICS = ("cpu_ns_per_op", "cpu_s", "rss_per_pending_bytes", "peak_rss_mib")


def run_scale_suite(
    loops: Sequence[str],
    pendings: Sequence[int],
    params: dict[str, Any],
    repeat: int,
    runner: _Runner,
    *,
    memory_pending: int = 100_000,
) -> dict[str, Any]:
    """Run ``bench scale`` at each pending count, for every loop; aggregate.

    Also one ``tracemalloc`` run per implementation and loop at ``memory_pending``
    timers (0: skip) for the bytes per pending timer.
    """
    impls = list(scale_bench.IMPLS)
    results: list[Result] = []
    for pending in pendings:
        specs = _interleaved("scale", impls, loops, dict(params, pending=pending), repeat)
        results += [runner.run(s) for s in specs]
    cells = _cells(results, ("loop", "impl", "pending"), _SCALE_METRICS)
    memory = []
    if memory_pending:
        for loop in loops:
            for impl in impls:
                spec = _spec(
                    "scale",
                    impl,
                    loop,
                    dict(params, pending=memory_pending, ops=1, trace_memory=True),
                )
                r = runner.run(spec)
                memory.append(
                    {
                        "loop": loop,
                        "impl": r["impl"],
                        "pending": memory_pending,
                        "traced_per_pending_bytes": r["traced_per_pending_bytes"],
                    }
                )
    ratios = []
    targets = []
    low, high = min(pendings), max(pendings)
    for loop in loops:
        for impl in scale_bench.IMPLS.values():
            a = _cell(cells, loop=loop, impl=impl, pending=low)
            b = _cell(cells, loop=loop, impl=impl, pending=high)
            growth = _ratio(b["cpu_ns_per_op"], a["cpu_ns_per_op"])
            ratios.append(
                {"loop": loop, "impl": impl, "from": low, "to": high, "cpu_growth": growth}
            )
            if impl == scale_bench.IMPLS["ap"] and high > low:
                targets.append(
                    _target(
                        f"scale: CPU/op at {high} pending over {low}, {loop}",
                        growth,
                        SCALE_FLATNESS,
                        higher_is_better=False,
                    )
                )
    return {
        "params": params,
        "pendings": list(pendings),
        "repeat": repeat,
        "cells": cells,
        "memory": memory,
        "ratios": ratios,
        "targets": targets,
        "runs": results,
    }


def _cell(cells: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    """The medians of the first cell whose fields equal ``match`` (a missing field is None)."""
    for c in cells:
        if all(c.get(k) == v for k, v in match.items()):
            median_: dict[str, Any] = c["median"]
            return median_
    raise KeyError(tuple(match.values()))


# -- printing -------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if math.isinf(value):
            return "inf"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return str(value)


def _ms(value: Any) -> str:
    return _fmt(value * 1000.0 if isinstance(value, float) else value)


def _print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=180)  # files and pipes: no wrapping of wide tables

    def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
        table = Table(title=title)
        for col in columns:
            table.add_column(col)
        for row in rows:
            table.add_row(*row)
        console.print(table)

    if "timer" in report:
        t = report["timer"]
        rows: list[tuple[str, ...]] = []
        for c in t["cells"]:
            m = c["median"]
            rows.append(
                (
                    c["loop"],
                    c["impl"],
                    _fmt(m["cpu_s"]),
                    _fmt(m["add_cancel_ns_per_op"]),
                    _fmt(m["fired"]),
                    str(m.get("early_total", "-")),
                    _ms(m["lateness.p50"]),
                    _ms(m["lateness.p99"]),
                    _ms(m["lateness.max"]),
                    _fmt(m["peak_rss_mib"]),
                )
            )
        print_table(
            f"bench timer (n={t['params']['n']:,}, median of {t['repeat']})",
            (
                "loop",
                "impl",
                "CPU s",
                "add+cancel ns/op",
                "fired",
                "early",
                "late p50 ms",
                "p99 ms",
                "max ms",
                "peak RSS MiB",
            ),
            rows,
        )
    if "purgatory" in report:
        p = report["purgatory"]
        rows = []
        for c in p["cells"]:
            m = c["median"]
            rows.append(
                (
                    c["scenario"],
                    c["loop"],
                    c["impl"],
                    "max" if m["target_rate"] == 0 else _fmt(m["target_rate"]),
                    _fmt(m["achieved_rate"]),
                    _fmt(m["requests_per_cpu_s"]),
                    _fmt(m["cpu_us_per_request"]),
                    _fmt(m["completed"]),
                    _fmt(m["expired"]),
                    _ms(m["expiry_lateness.p50"]),
                    _ms(m["expiry_lateness.p99"]),
                    _fmt(m["peak_rss_mib"]),
                    _fmt(m["memory_per_pending_op_bytes"]),
                )
            )
        print_table(
            f"bench purgatory (median of {p['repeat']})",
            (
                "scenario",
                "loop",
                "impl",
                "target req/s",
                "achieved req/s",
                "req per CPU s",
                "CPU us/req",
                "completed",
                "expired",
                "expiry late p50 ms",
                "p99 ms",
                "peak RSS MiB",
                "B/pending op",
            ),
            rows,
        )
        if "sweep" in p:
            print_table(
                "rate sweep: saturation (highest rate kept within 5%)",
                ("loop", "impl", "saturation req/s", "best achieved req/s"),
                (
                    (
                        row["loop"],
                        row["impl"],
                        _fmt(row["saturation_rate"]),
                        _fmt(row["best_achieved_rate"]),
                    )
                    for row in p["sweep"]["saturation"]
                ),
            )
    if "scale" in report:
        s = report["scale"]
        print_table(
            f"bench scale (ops={s['params']['ops']:,}, median of {s['repeat']})",
            ("loop", "impl", "pending", "CPU ns/op", "RSS B/pending"),
            (
                (
                    c["loop"],
                    c["impl"],
                    f"{c['pending']:,}",
                    _fmt(c["median"]["cpu_ns_per_op"]),
                    _fmt(c["median"]["rss_per_pending_bytes"]),
                )
                for c in s["cells"]
            ),
        )
        for row in s["memory"]:
            console.print(
                f"tracemalloc: {row['impl']} on {row['loop']}: "
                f"{_fmt(row['traced_per_pending_bytes'])} B per pending timer "
                f"({row['pending']:,} pending)"
            )
    targets = [
        t for part in report.values() if isinstance(part, dict) for t in part.get("targets", [])
    ]
    if targets:
        print_table(
            "targets (issue 4)",
            ("target", "measured", "goal", "met"),
            (
                (
                    t["name"],
                    _fmt(t["value"]),
                    (">= " if t["higher_is_better"] else "<= ") + _fmt(t["target"]),
                    "yes" if t["met"] else "NO",
                )
                for t in targets
            ),
        )


# -- argument parsing ---------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be finite and >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def _int_list(text: str) -> list[int]:
    return [_positive_int(part) for part in text.split(",") if part]


def _rate_list(text: str) -> list[float]:
    return [_positive_float(part) for part in text.split(",") if part]


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--loop",
        choices=("asyncio", "uvloop", "both", "virtual"),
        default="both",
        help="event loop(s) to run on; 'both' = asyncio and uvloop (default); "
        "'virtual' = aiopurgatory's virtual-time loop (for tests: timings meaningless)",
    )
    common.add_argument("--repeat", type=_positive_int, default=3, help="rounds (median taken)")
    common.add_argument("--seed", type=int, default=1, help="random seed of the workloads")
    common.add_argument("--json", metavar="PATH", help="write the full report as JSON")
    common.add_argument("--plot", metavar="PATH", help="write plots (PNG, matplotlib Agg)")
    common.add_argument(
        "--no-isolate",
        action="store_true",
        help="run in this process instead of a subprocess per run (peak RSS then mixes)",
    )
    common.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    common.add_argument("--quiet", action="store_true", help="no result tables on stdout")

    parser = argparse.ArgumentParser(
        prog="aiopurgatory bench",
        description="Benchmarks of aiopurgatory against plain asyncio, run side by side.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("timer", parents=[common], help="ap.Timer vs loop.call_later")
    p.add_argument("-n", type=_positive_int, default=timer_bench.DEFAULTS["n"], help="timers")
    p.add_argument(
        "--cancel-fraction",
        type=float,
        default=timer_bench.DEFAULTS["cancel_fraction"],
        help="share cancelled right after being added (default 0.9)",
    )
    p.add_argument(
        "--max-delay",
        type=_positive_float,
        default=timer_bench.DEFAULTS["max_delay"],
        help="delays are uniform in [0, MAX_DELAY) s (default 1, as Kafka's run)",
    )
    p.add_argument("--batch", type=_positive_int, default=timer_bench.DEFAULTS["batch"])

    p = sub.add_parser(
        "purgatory", parents=[common], help="Kafka's TestPurgatoryPerformance workload"
    )
    _purgatory_args(p)
    p.add_argument(
        "--sweep",
        nargs="?",
        const=",".join(str(int(r)) for r in _DEFAULT_SWEEP),
        type=_rate_list,
        metavar="RATES",
        help="also sweep these rates (comma-separated req/s) for the saturation rate",
    )
    p.add_argument(
        "--sweep-num", type=_positive_int, default=100_000, help="requests per sweep point"
    )

    p = sub.add_parser("scale", parents=[common], help="cost per op as pending timers grow")
    p.add_argument(
        "--pending",
        type=_int_list,
        default=[10**3, 10**4, 10**5, 10**6],
        help="comma-separated pending counts (default 1000,10000,100000,1000000)",
    )
    p.add_argument("--ops", type=_positive_int, default=scale_bench.DEFAULTS["ops"])
    p.add_argument("--batch", type=_positive_int, default=scale_bench.DEFAULTS["batch"])
    p.add_argument(
        "--memory-pending",
        type=int,
        default=100_000,
        help="pending timers for the tracemalloc run (0: skip)",
    )

    p = sub.add_parser("all", parents=[common], help="the default set (a few minutes)")
    p.add_argument(
        "--quick", action="store_true", help="10x smaller workloads (a smoke run, seconds)"
    )
    return parser


def _purgatory_args(p: argparse.ArgumentParser) -> None:
    d = purgatory_bench.DEFAULTS
    p.add_argument("--num", type=_positive_int, default=d["num"], help="requests")
    p.add_argument(
        "--rate", type=_non_negative_float, default=d["rate"], help="req/s; 0 = back to back"
    )
    p.add_argument("--timeout", type=_positive_float, default=d["timeout"], help="ms")
    p.add_argument(
        "--pct75",
        type=_positive_float,
        default=None,
        help="75th percentile of completion latency, ms (default 60; 400 for high-timeout)",
    )
    p.add_argument(
        "--pct50", type=_positive_float, default=None, help="median completion latency, ms"
    )
    p.add_argument(
        "--scenario",
        choices=(*purgatory_bench.SCENARIOS, "both"),
        default=None,
        help="Kafka's published pct75/pct50 pairs: low-timeout 60/20, high-timeout 400/200",
    )
    p.add_argument("--keys", type=_positive_int, default=d["keys"])
    p.add_argument("--key-space-size", type=_positive_int, default=d["key_space_size"])
    p.add_argument("--batch", type=_positive_int, default=d["batch"])
    p.add_argument(
        "--memory-ops",
        type=int,
        default=d["memory_ops"],
        help="ops pending during the tracemalloc measurement (0: skip)",
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
        return [dict(base, pct75=args.pct75, pct50=args.pct50)]
    names = (
        list(purgatory_bench.SCENARIOS)
        if args.scenario == "both"
        else [args.scenario or "low-timeout"]
    )
    return [
        dict(base, pct75=purgatory_bench.SCENARIOS[n][0], pct50=purgatory_bench.SCENARIOS[n][1])
        for n in names
    ]


def _machine() -> dict[str, Any]:
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
    import aiopurgatory

    info["aiopurgatory"] = aiopurgatory.__version__
    return info


def _count_runs(args: argparse.Namespace, loops: Sequence[str]) -> int:
    """How many runs the command will make (the progress bar's total; an estimate
    for sweeps, which stop at the first rate an implementation misses)."""
    cells = len(loops)
    repeat: int = args.repeat
    if args.command == "timer":
        return cells * 2 * repeat
    if args.command == "purgatory":
        n = cells * 3 * repeat * len(_scenarios(args))
        if args.sweep:
            n += cells * 3 * len(args.sweep)
        return n
    if args.command == "scale":
        pendings: list[int] = args.pending
        return cells * 2 * (repeat * len(pendings) + (1 if args.memory_pending else 0))
    # all: timer, two purgatory scenarios, a sweep of two impls, scale at 4 sizes + memory
    return cells * (2 * repeat + 6 * repeat + 2 * len(_DEFAULT_SWEEP) + 2 * (4 * repeat + 1))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``aiopurgatory bench``; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    loops = ["asyncio", "uvloop"] if args.loop == "both" else [args.loop]
    quiet_logging()
    try:
        scenarios = _scenarios(args) if args.command == "purgatory" else []
    except ValueError as exc:
        parser.error(str(exc))
    runner = _Runner(
        _count_runs(args, loops),
        isolate=not args.no_isolate,
        progress=not args.no_progress,
    )
    report: dict[str, Any] = {"schema": SCHEMA, "command": args.command, "machine": _machine()}
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
        elif args.command == "purgatory":
            report["purgatory"] = run_purgatory_suite(
                loops,
                scenarios,
                args.repeat,
                runner,
                sweep=args.sweep or (),
                sweep_params=dict(scenarios[0], num=args.sweep_num),
            )
        elif args.command == "scale":
            report["scale"] = run_scale_suite(
                loops,
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


def _run_all(
    args: argparse.Namespace, loops: Sequence[str], runner: _Runner, report: dict[str, Any]
) -> None:
    scale_down = 10 if args.quick else 1
    report["timer"] = run_timer_suite(
        loops,
        dict(timer_bench.DEFAULTS, n=1_000_000 // scale_down, seed=args.seed),
        args.repeat,
        runner,
    )
    base = dict(purgatory_bench.DEFAULTS, num=200_000 // scale_down, seed=args.seed)
    scenarios = [
        dict(base, pct75=p75, pct50=p50) for p75, p50 in purgatory_bench.SCENARIOS.values()
    ]
    report["purgatory"] = run_purgatory_suite(
        loops,
        scenarios,
        args.repeat,
        runner,
        sweep=_DEFAULT_SWEEP,
        sweep_params=dict(scenarios[0], num=50_000 // scale_down),
        sweep_impls=("ap", "hand"),
    )
    report["scale"] = run_scale_suite(
        loops,
        [10**3, 10**4, 10**5, 10**6 // scale_down],
        {"ops": 200_000 // scale_down, "batch": 1000, "seed": args.seed},
        args.repeat,
        runner,
        memory_pending=100_000 // scale_down,
    )
