"""``aiopurgatory bench timer``: ap.Timer vs loop.call_later or trio's deadlines, suite, options."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from . import timer as timer_bench
from ._common import TRIO_LOOPS
from ._runner import (
    TIMER_CPU_VS_ASYNCIO,
    TIMER_CPU_VS_UVLOOP,
    _cell,
    _cells,
    _fraction,
    _interleaved,
    _positive_float,
    _positive_int,
    _ratio,
    _Runner,
    _target,
)

__all__ = ["_timer_args", "run_timer_suite"]

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
    """Run ``bench timer`` for every loop and its implementations; aggregate.

    On asyncio loops ``ap.Timer`` against ``loop.call_later``, with the targets of
    issue 11; on trio against trio's own deadlines (a task per timer, and
    deadline scopes), ratios only.
    """
    specs = _interleaved("timer", lambda loop: list(timer_bench.impls(loop)), loops, params, repeat)
    results = [runner.run(s) for s in specs]
    cells = _cells(results, ("loop", "impl"), _TIMER_METRICS)
    ratios = []
    targets = []
    for loop in loops:
        labels = timer_bench.impls(loop)
        ap_cell = _cell(cells, loop=loop, impl=labels["ap"])
        if loop in TRIO_LOOPS:
            for key in ("task", "scope"):
                base = _cell(cells, loop=loop, impl=labels[key])
                ratios.append(
                    {
                        "loop": loop,
                        "what": f"CPU {labels[key]} / ap.Timer",
                        "baseline": labels[key],
                        "value": _ratio(base["cpu_s"], ap_cell["cpu_s"]),
                        "add_cancel": _ratio(
                            base["add_cancel_ns_per_op"], ap_cell["add_cancel_ns_per_op"]
                        ),
                    }
                )
            continue
        base = _cell(cells, loop=loop, impl=timer_bench.IMPLS["loop"])
        cpu = _ratio(base["cpu_s"], ap_cell["cpu_s"])
        add_cancel = _ratio(base["add_cancel_ns_per_op"], ap_cell["add_cancel_ns_per_op"])
        ratios.append(
            {
                "loop": loop,
                "what": "CPU loop.call_later / ap.Timer",
                "value": cpu,
                "add_cancel": add_cancel,
            }
        )
        goal = TIMER_CPU_VS_ASYNCIO if loop != "uvloop" else TIMER_CPU_VS_UVLOOP
        targets.append(
            _target(f"timer CPU vs loop.call_later on {loop}", cpu, goal, higher_is_better=True)
        )
        targets.append(
            _target(
                f"timer add+cancel CPU vs loop.call_later on {loop}",
                add_cancel,
                goal,
                higher_is_better=True,
            )
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


def _timer_args(p: argparse.ArgumentParser) -> None:
    """Add the options of ``bench timer`` to ``p``."""
    p.add_argument("-n", type=_positive_int, default=timer_bench.DEFAULTS["n"], help="timers added")
    p.add_argument(
        "--cancel-fraction",
        type=_fraction,
        default=timer_bench.DEFAULTS["cancel_fraction"],
        help="share cancelled right after being added",
    )
    p.add_argument(
        "--max-delay",
        type=_positive_float,
        default=timer_bench.DEFAULTS["max_delay"],
        help="delays are uniform in [0, MAX_DELAY) s (Kafka's run uses 1)",
    )
    p.add_argument(
        "--batch",
        type=_positive_int,
        default=timer_bench.DEFAULTS["batch"],
        help="timers added per loop iteration",
    )
