"""Shared machinery of the benchmarks: loops, statistics, memory, isolated runs.

Every benchmark is a list of *runs*; a run is one implementation on one loop with
one set of parameters, described by a JSON-able spec dict::

    {"bench": "timer", "impl": "ap", "loop": "asyncio", "params": {...}}

:func:`execute` runs a spec and returns a JSON-able result dict. By default each
run goes to a fresh subprocess (``python -m aiopurgatory.bench._worker SPEC``):

* peak RSS (``ru_maxrss``) is a per-process high-water mark that cannot be reset
  portably, so measuring two implementations in one process would report the
  larger of the two for both; and CPython rarely returns freed arenas to the
  OS, so the second run would start from the first one's heap;
* a fresh interpreter also gives each run the same garbage-collector state and
  the same heap layout, whatever ran before it.

The price is ~0.1 s of interpreter start-up per run, outside every measurement.
``isolate=False`` runs in-process (tests, quick looks); peaks then mix.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import math
import os
import resource
import subprocess
import sys
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from ._registry import runner

T = TypeVar("T")

#: Loops a benchmark can run on. "virtual" is aiopurgatory's virtual-time loop:
#: sleeps cost no wall time, which makes it handy for tests (timings meaningless).
#: "trio" is ``trio.run`` (started through ``anyio.run``); "trio-virtual" is trio on
#: its autojumping mock clock (:func:`aiopurgatory.simulation.run_trio`), the same
#: for trio. The trio workloads live outside this package, in
#: :mod:`aiopurgatory_trio_bench` (see :func:`trio_baselines`).
LOOP_NAMES = ("asyncio", "uvloop", "virtual", "trio", "trio-virtual")

#: The loop names of :data:`LOOP_NAMES` that are trio runs, not asyncio loops.
TRIO_LOOPS = ("trio", "trio-virtual")

Spec = dict[str, Any]
Result = dict[str, Any]


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop factory for a loop name of :data:`LOOP_NAMES`.

    Raises:
        ValueError: unknown name, or a trio name (trio has no event loop object).
        RuntimeError: uvloop asked for but not installed.
    """
    if name in TRIO_LOOPS:
        raise ValueError(f"{name!r} is a trio run, not an asyncio loop: use run_on()")
    if name == "asyncio":
        return asyncio.new_event_loop
    if name == "uvloop":
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is in the dev install
            raise RuntimeError(
                "--loop uvloop needs uvloop: pip install 'aiopurgatory[uvloop]'"
            ) from None
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    if name == "virtual":
        from aiopurgatory import simulation

        return simulation.new_event_loop
    raise ValueError(f"loop must be one of {', '.join(LOOP_NAMES)}, got {name!r}")


def run_on(loop_name: str, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` to completion on a new loop (or trio run) of the given kind.

    Raises:
        ValueError: unknown loop name (before ``main`` is called).
        RuntimeError: uvloop or trio asked for but not installed.
    """
    if loop_name in TRIO_LOOPS:
        # Asked before anything starts: anyio.run's LookupError for a missing
        # backend could not be told from one raised by main().
        if importlib.util.find_spec("trio") is None:  # pragma: no cover - in the dev install
            raise RuntimeError(_NEEDS_TRIO.format(loop=loop_name))
        if loop_name == "trio":
            # anyio's trio backend is trio.run(main) once the run starts: nothing
            # of anyio runs inside the timed part of a workload.
            import anyio

            return anyio.run(main, backend="trio")
        from aiopurgatory import simulation

        return simulation.run_trio(main)
    factory = loop_factory(loop_name)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())


_NEEDS_TRIO = "--loop {loop} needs trio: pip install 'aiopurgatory[trio]'"


@contextlib.contextmanager
def trio_baselines(loop_name: str) -> Iterator[None]:
    """Around the lazy import of a trio workload from :mod:`aiopurgatory_trio_bench`.

    The trio workloads and baselines are plain trio, kept out of this package so
    that the library imports trio only in its trio driver, virtual time and the
    pytest plugin; they ship in the same distribution. A missing trio, or a
    missing ``aiopurgatory_trio_bench`` (a copy of the ``aiopurgatory`` directory
    alone), becomes a :class:`RuntimeError` that says what to install.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing == "trio":
            raise RuntimeError(_NEEDS_TRIO.format(loop=loop_name)) from exc
        if missing == "aiopurgatory_trio_bench":
            raise RuntimeError(
                f"--loop {loop_name} needs the trio baselines, the aiopurgatory_trio_bench "
                "package of aiopurgatory's distribution, which is not importable here: "
                "install aiopurgatory (pip install 'aiopurgatory[trio]') rather than copying "
                "the aiopurgatory directory alone"
            ) from exc
        raise


# -- statistics -------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of already sorted values, nearest rank; NaN if empty."""
    if not sorted_values:
        return math.nan
    rank = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return float(sorted_values[rank])


def median(values: Sequence[float]) -> float:
    """Median of the finite values (NaN if there are none)."""
    finite = sorted(v for v in values if not math.isnan(v))
    if not finite:
        return math.nan
    mid = len(finite) // 2
    if len(finite) % 2:
        return finite[mid]
    return (finite[mid - 1] + finite[mid]) / 2


#: Log-spaced histogram edges for latencies in seconds: 1 us .. 10 s, 10 per decade.
HIST_EDGES: list[float] = [10 ** (e / 10) for e in range(-60, 11)]


def latency_summary(samples: list[float]) -> dict[str, Any]:
    """Count, early count (< 0), min/p50/p99/max (seconds) and a log histogram.

    Samples at or below zero (on time to the clock's resolution) are counted in
    ``hist.zero``; those above the last edge in the last bin.
    """
    samples.sort()
    counts = [0] * (len(HIST_EDGES) - 1)
    zero = 0
    j = 0
    last = len(counts) - 1
    for value in samples:
        if value <= 0.0:
            zero += 1
            continue
        while j < last and value >= HIST_EDGES[j + 1]:
            j += 1
        counts[j] += 1
    return {
        "count": len(samples),
        "early": sum(1 for v in samples if v < 0.0),
        "min": samples[0] if samples else math.nan,
        "p50": percentile(samples, 0.50),
        "p99": percentile(samples, 0.99),
        "max": samples[-1] if samples else math.nan,
        "hist": {"edges": HIST_EDGES, "counts": counts, "zero": zero},
    }


# -- memory -----------------------------------------------------------------------


def peak_rss_mib() -> float:
    """This process's peak resident set size so far, in MiB (``ru_maxrss``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def rss_mib() -> float:
    """This process's current resident set size in MiB (Linux; else the peak)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except OSError:  # pragma: no cover - not Linux
        return peak_rss_mib()
    return pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)


# -- running specs ----------------------------------------------------------------


def quiet_logging() -> None:
    """Send structlog output to stderr, warnings and above only.

    Unconfigured structlog prints every level to stdout, which would mix the
    timer's debug "lag" events into results. The library never configures
    structlog; this command-line tool, being an application, does.
    """
    import logging

    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def execute(spec: Spec, *, isolate: bool = True) -> Result:
    """Run one benchmark spec, in a fresh subprocess unless ``isolate`` is False.

    Raises:
        RuntimeError: the subprocess failed (its stderr is in the message).
    """
    if not isolate:
        # In this process: the caller imported the workload, which registered it.
        result = runner(spec["bench"])(spec)
        result["isolated"] = False
        return result
    proc = subprocess.run(
        [sys.executable, "-m", "aiopurgatory.bench._worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"benchmark run {spec!r} failed with exit status {proc.returncode}:\n{proc.stderr}"
        )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(result, dict)
    result["isolated"] = True
    return result
