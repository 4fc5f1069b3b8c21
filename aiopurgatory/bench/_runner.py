"""Shared machinery of ``aiopurgatory bench``'s suites.

The interleaved runner (:class:`_Runner`, :func:`_interleaved`, :func:`_spec`), the
aggregation of repeats into median cells (:func:`_cells`, :func:`_cell`), the ratio
and target helpers, the targets of issue 11 (the compiled core), and the argparse
value types.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._common import Result, Spec, execute, median

__all__ = [
    "MEMORY_VS_HAND",
    "PURGATORY_SATURATION_UVLOOP",
    "PURGATORY_VS_FLOOR",
    "PURGATORY_VS_HAND",
    "SCALE_FLATNESS",
    "TIMER_CPU_VS_ASYNCIO",
    "TIMER_CPU_VS_UVLOOP",
    "_Runner",
    "_cell",
    "_cells",
    "_fraction",
    "_int_list",
    "_interleaved",
    "_non_negative_float",
    "_non_negative_int",
    "_positive_float",
    "_positive_int",
    "_rate_list",
    "_ratio",
    "_spec",
    "_target",
]

#: The targets of issue 11 (the compiled core), checked in every report. Ratios
#: of medians, side by side in one run.
TIMER_CPU_VS_ASYNCIO = 5.0
TIMER_CPU_VS_UVLOOP = 2.0
PURGATORY_VS_HAND = 2.5
PURGATORY_VS_FLOOR = 1.0
PURGATORY_SATURATION_UVLOOP = 250_000.0
SCALE_FLATNESS = 1.2
MEMORY_VS_HAND = 0.4


# -- running and aggregating --------------------------------------------------------


class _Runner:
    """Runs specs with progress on stderr: a rich bar on a terminal, else (a CI
    log, a pipe) a plain line when a benchmark starts and at least every
    :data:`_LINE_EVERY` seconds, flushed at once."""

    def __init__(self, total: int, *, isolate: bool, progress: bool) -> None:
        self.isolate = isolate
        self._progress: Any = None
        self._task: Any = None
        self._lines = False
        self._total = total
        self._done = 0
        self._started = time.perf_counter()
        self._last_line = -math.inf
        self._last_bench = ""
        if progress and total and not sys.stderr.isatty():
            self._lines = True
        elif progress and total:
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
        params = spec.get("params", {})
        detail = ", ".join(f"{k}={v}" for k, v in params.items() if k in _SHOWN_PARAMS)
        description = f"{spec['bench']} {spec['impl']} on {spec['loop']} {detail}"
        if self._progress is not None:
            self._progress.update(self._task, description=description)
        elif self._lines:
            now = time.perf_counter()
            if spec["bench"] != self._last_bench or now - self._last_line >= _LINE_EVERY:
                self._line(f"run {self._done + 1}/{self._total}: {description}")
                self._last_bench = spec["bench"]
        result = execute(spec, isolate=self.isolate)
        self._done += 1
        if self._progress is not None:
            self._progress.advance(self._task)
        return result

    def _line(self, text: str) -> None:
        now = time.perf_counter()
        self._last_line = now
        print(
            f"aiopurgatory bench [{now - self._started:6.1f} s] {text}",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        elif self._lines:
            self._line(f"{self._done} runs done")


_SHOWN_PARAMS = ("n", "num", "rate", "pct50", "pending")
#: Without a terminal, a progress line at least this often (seconds).
_LINE_EVERY = 5.0


def _interleaved(
    bench: str,
    impls: Sequence[str] | Callable[[str], Sequence[str]],
    loops: Sequence[str],
    params: dict[str, Any],
    repeat: int,
) -> list[Spec]:
    """Specs for ``repeat`` rounds; each round runs every (loop, impl), rotated.

    ``impls`` is the implementations of every loop, or a function from a loop to
    its implementations (trio has other baselines than asyncio).
    """
    cells = [(loop, impl) for loop in loops for impl in (impls(loop) if callable(impls) else impls)]
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
    """A target and whether it was met: ``met`` is None when nothing was measured
    (a NaN value: a skipped measurement is neither met nor missed)."""
    met = (value >= target) if higher_is_better else (value <= target)
    return {
        "name": name,
        "value": value,
        "target": target,
        "higher_is_better": higher_is_better,
        "met": None if math.isnan(value) else bool(met),
    }


def _cell(cells: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    """The medians of the first cell whose fields equal ``match`` (a missing field is None)."""
    for c in cells:
        if all(c.get(k) == v for k, v in match.items()):
            median_: dict[str, Any] = c["median"]
            return median_
    raise KeyError(tuple(match.values()))


# -- argument types ---------------------------------------------------------------


def _integer(text: str) -> int:
    try:
        return int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _positive_int(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _fraction(text: str) -> float:
    value = _non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 1], got {text}")
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
