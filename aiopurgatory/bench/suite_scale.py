"""``aiopurgatory bench scale``: cost per op as pending timers grow, its suite and options."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from . import scale as scale_bench
from ._common import Result
from ._runner import (
    SCALE_FLATNESS,
    _cell,
    _cells,
    _int_list,
    _interleaved,
    _non_negative_int,
    _positive_int,
    _ratio,
    _Runner,
    _spec,
    _target,
)

__all__ = ["_scale_args", "run_scale_suite"]

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


def _scale_args(p: argparse.ArgumentParser) -> None:
    """Add the options of ``bench scale`` to ``p``."""
    p.add_argument(
        "--pending",
        type=_int_list,
        default=[10**3, 10**4, 10**5, 10**6],
        help="comma-separated pending counts",
    )
    p.add_argument(
        "--ops",
        type=_positive_int,
        default=scale_bench.DEFAULTS["ops"],
        help="short timers added and cancelled, timed",
    )
    p.add_argument(
        "--batch",
        type=_positive_int,
        default=scale_bench.DEFAULTS["batch"],
        help="add+cancels per loop iteration",
    )
    p.add_argument(
        "--memory-pending",
        type=_non_negative_int,
        default=100_000,
        help="pending timers for the tracemalloc run (0: skip)",
    )
