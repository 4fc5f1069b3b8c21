"""``aiopurgatory bench parked``: what one parked request costs, its suite and options."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from . import parked as parked_bench
from ._common import Result
from ._runner import _cell, _cells, _int_list, _interleaved, _positive_int, _ratio, _Runner

__all__ = ["PARKED_METRICS", "_parked_args", "run_parked_suite"]

PARKED_METRICS = (
    "rss_per_wait_bytes",
    "cpu_us_per_wait",
    "gc_objects",
    "gc_objects_per_wait",
    "collect_ms",
    "collect_frozen_ms",
    "peak_rss_mib",
)

#: Each library way against its hand-written equivalent.
_PAIRS = (("callback", "hand-callback"), ("awaited", "hand-awaited"))


def run_parked_suite(
    loops: Sequence[str],
    sizes: Sequence[int],
    params: dict[str, Any],
    repeat: int,
    runner: _Runner,
    *,
    impls: Sequence[str] = tuple(parked_bench.IMPLS),
) -> dict[str, Any]:
    """Park each size of waits with every implementation and loop, interleaved; aggregate.

    Returns the median cells and, per pair of :data:`_PAIRS` run, the ratios
    library / hand-written of memory, CPU and GC-tracked objects.
    """
    from aiopurgatory._compiled import COMPILED

    results: list[Result] = []
    for size in sizes:
        specs = _interleaved("parked", list(impls), loops, dict(params, waits=size), repeat)
        results += [runner.run(s) for s in specs]
    cells = _cells(results, ("loop", "impl", "waits"), PARKED_METRICS)
    ratios = []
    for loop in loops:
        for size in sizes:
            for lib, hand in _PAIRS:
                if lib not in impls or hand not in impls:
                    continue
                a = _cell(cells, loop=loop, impl=parked_bench.IMPLS[lib], waits=size)
                b = _cell(cells, loop=loop, impl=parked_bench.IMPLS[hand], waits=size)
                ratios.append(
                    {
                        "loop": loop,
                        "waits": size,
                        "pair": f"{lib} / {hand}",
                        "memory": _ratio(a["rss_per_wait_bytes"], b["rss_per_wait_bytes"]),
                        "cpu": _ratio(a["cpu_us_per_wait"], b["cpu_us_per_wait"]),
                        "gc_objects": _ratio(a["gc_objects"], b["gc_objects"]),
                        "collect": _ratio(a["collect_ms"], b["collect_ms"]),
                    }
                )
    return {
        "params": params,
        "sizes": list(sizes),
        "repeat": repeat,
        "compiled": COMPILED,
        "cells": cells,
        "ratios": ratios,
        "runs": results,
    }


def _sizes(text: str) -> list[int]:
    """``--sizes``: comma-separated wait counts, each at least 1."""
    sizes = _int_list(text)
    if not sizes or any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be integers >= 1, got {text!r}")
    return sizes


def _impls(text: str) -> list[str]:
    """``--impls``: comma-separated names of :data:`aiopurgatory.bench.parked.IMPLS`."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in parked_bench.IMPLS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"impls must be among {', '.join(parked_bench.IMPLS)}, got {text!r}"
        )
    return names


def _parked_args(p: argparse.ArgumentParser) -> None:
    """Add the options of ``bench parked`` to ``p``."""
    p.add_argument(
        "--sizes",
        type=_sizes,
        default=[10**4, 10**5, 10**6],
        help="comma-separated counts of waits parked at once (default: 10000,100000,1000000)",
    )
    p.add_argument(
        "--keys",
        type=_positive_int,
        default=parked_bench.DEFAULTS["keys"],
        help="keys the waits are spread over",
    )
    p.add_argument(
        "--impls",
        type=_impls,
        default=list(parked_bench.IMPLS),
        help=f"comma-separated implementations (default: all: {','.join(parked_bench.IMPLS)})",
    )
