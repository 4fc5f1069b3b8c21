"""The human-readable report of ``aiopurgatory bench``: rich tables on stdout."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from ._common import TRIO_LOOPS

__all__ = ["_print_report"]


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

    if "headline" in report:
        h = report["headline"]
        print_table(
            f"bench purgatory, the realistic case: tasks await ops, try_complete reads a "
            f"flag, check_and_complete on keys ({h['params']['num']:,} requests; CPU us per "
            f"request, median of {h['repeat']})",
            (
                "completion",
                "loop",
                "null (generator + tasks)",
                "ap.Purgatory.watch",
                "hand-written",
                "ap own cost",
                "hand own cost",
                "CPU hand/ap",
                "peak pending",
            ),
            [
                (
                    row["completion"],
                    row["loop"],
                    _fmt(row["null_us"]),
                    _fmt(row["ap_us"]),
                    _fmt(row["hand_us"]),
                    _fmt(row["ap_own_us"]),
                    _fmt(row["hand_own_us"]),
                    _fmt(row["cpu_hand_over_ap"]),
                    _fmt(row["peak_pending"]),
                )
                for row in h["rows"]
            ],
        )
        if h.get("gc"):
            print_table(
                "full gc.collect() with operations pending",
                ("impl", "pending", "gc.collect() s", "GC-tracked objects per pending op"),
                [
                    (
                        g["impl"],
                        _fmt(g["pending"]),
                        _fmt(g["gc_collect_s"]),
                        _fmt(g["tracked_per_pending"]),
                    )
                    for g in h["gc"]
                ],
            )
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
        trio_rows = [r for r in t["ratios"] if r["loop"] in TRIO_LOOPS]
        if trio_rows:
            print_table(
                "timer on trio: trio's own deadlines against ap.Timer (ratios of medians)",
                ("loop", "baseline", "CPU baseline / ap.Timer", "add+cancel baseline / ap.Timer"),
                (
                    (r["loop"], r["baseline"], _fmt(r["value"]), _fmt(r["add_cancel"]))
                    for r in trio_rows
                ),
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
                    "skipped"
                    if c.get("memory_skipped")
                    else _fmt(m["memory_per_pending_op_bytes"]),
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
        trio_rows = [r for r in p["ratios"] if r["loop"] in TRIO_LOOPS]
        if trio_rows:
            print_table(
                "purgatory on trio: awaited requests (ratios of medians)",
                (
                    "scenario",
                    "loop",
                    "CPU hand-written / ap",
                    "CPU ap / floor",
                    "memory ap / hand-written",
                ),
                (
                    (
                        r["scenario"],
                        r["loop"],
                        _fmt(r["cpu_hand_over_ap"]),
                        _fmt(r["cpu_ap_over_floor"]),
                        "skipped" if r.get("memory_skipped") else _fmt(r["memory_ap_over_hand"]),
                    )
                    for r in trio_rows
                ),
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
    if "acks" in report:
        _print_acks(report["acks"], print_table)
    if "parked" in report:
        _print_parked(report["parked"], print_table)
    # The project's own performance targets stay in the JSON report (--json), for
    # its benchmark pages; users are shown results and baselines.


def _print_acks(a: dict[str, Any], print_table: Any) -> None:
    """The acks=all tables: CPU per trigger of every implementation, then the ratios."""
    params = a["params"]
    impls: list[str] = a["impls"]
    medians = {
        (c["loop"], c["pending"], c["impl"]): c["median"]["cpu_us_per_trigger"] for c in a["cells"]
    }
    compiled = a.get("compiled")
    core = "compiled core" if compiled else "pure-Python core" if compiled is False else ""
    print_table(
        f"bench purgatory, acks=all: {params.get('partitions')} partitions, high watermark "
        f"+{params.get('step')} per trigger, tasks await their requests; CPU us per trigger, "
        f"median of {a['repeat']} ({core})",
        ("loop", "pending / partition", *impls),
        (
            (
                loop,
                f"{pending:,}",
                *(_fmt(medians.get((loop, pending, impl))) for impl in impls),
            )
            for loop, pending in dict.fromkeys((r["loop"], r["pending"]) for r in a["ratios"])
        ),
    )
    print_table(
        "acks=all: ratios of medians (CPU per trigger)",
        (
            "loop",
            "pending",
            "advance / heap",
            "WatermarkOperation / heap",
            "heap + the op / heap",
            "advance / heap + the op",
            "list scan / advance",
            "check_and_complete / advance",
            "threshold / plain watch (own cost)",
        ),
        (
            (
                r["loop"],
                f"{r['pending']:,}",
                _fmt(r["advance_over_heap"]),
                _fmt(r["wm_over_heap"]),
                _fmt(r["heap_op_over_heap"]),
                _fmt(r["advance_over_heap_op"]),
                _fmt(r["scan_over_advance"]),
                _fmt(r["check_over_advance"]),
                _fmt(r["threshold_over_plain_own"]),
            )
            for r in a["ratios"]
        ),
    )
    calls = {
        (c["loop"], c["pending"], c["impl"]): c["median"].get("call_us_per_trigger")
        for c in a["cells"]
    }
    print_table(
        "acks=all: us inside the trigger call alone (finding and completing the requests, "
        "no task), median",
        ("loop", "pending / partition", *impls, "check_and_complete / advance"),
        (
            (
                r["loop"],
                f"{r['pending']:,}",
                *(_fmt(calls.get((r["loop"], r["pending"], impl))) for impl in impls),
                _fmt(r.get("check_over_advance_call")),
            )
            for r in a["ratios"]
        ),
    )


def _print_parked(p: dict[str, Any], print_table: Any) -> None:
    """The tables of ``bench parked``: the cost per parked wait, then library / hand-written."""
    core = "compiled core" if p.get("compiled") else "pure-Python core"
    print_table(
        f"bench parked: waits parked at once on {p['params']['keys']:,} keys, each run a "
        f"fresh process; median of {p['repeat']} ({core})",
        (
            "loop",
            "waits",
            "impl",
            "RSS B/wait",
            "CPU us/wait",
            "GC-tracked objects",
            "per wait",
            "gc.collect() ms",
            "after gc.freeze() ms",
        ),
        (
            (
                c["loop"],
                f"{c['waits']:,}",
                c["impl"],
                _fmt(c["median"]["rss_per_wait_bytes"], 4),
                _fmt(c["median"]["cpu_us_per_wait"]),
                f"{c['median']['gc_objects']:,.0f}",
                _fmt(c["median"]["gc_objects_per_wait"], 4),
                _fmt(c["median"]["collect_ms"], 4),
                _fmt(c["median"]["collect_frozen_ms"]),
            )
            for c in p["cells"]
        ),
    )
    if p["ratios"]:
        print_table(
            "bench parked: library / hand-written (below 1: the library costs less)",
            ("loop", "waits", "pair", "memory", "CPU", "GC-tracked objects", "gc.collect()"),
            (
                (
                    r["loop"],
                    f"{r['waits']:,}",
                    r["pair"],
                    _fmt(r["memory"]),
                    _fmt(r["cpu"]),
                    _fmt(r["gc_objects"]),
                    _fmt(r["collect"]),
                )
                for r in p["ratios"]
            ),
        )
