"""The benchmarks' registry: benchmark name -> the function that runs one spec.

Each workload module registers its runner when imported (``register("timer",
run_spec)``); :func:`aiopurgatory.bench._common.execute` looks specs up here, and
the isolated worker process (:mod:`aiopurgatory.bench._worker`) imports the
workload modules first so that the registry is full. Nothing here imports a
workload: imports go one way, from the workloads to the shared machinery.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["register", "runner"]

Spec = dict[str, Any]
Result = dict[str, Any]

_RUNNERS: dict[str, Callable[[Spec], Result]] = {}


def register(bench: str, run_spec: Callable[[Spec], Result]) -> None:
    """Make ``run_spec`` the runner of specs with ``{"bench": bench}``.

    Raises:
        ValueError: another runner is registered under ``bench``.
    """
    current = _RUNNERS.get(bench)
    if current is not None and current is not run_spec:
        raise ValueError(f"benchmark {bench!r} is already registered")
    _RUNNERS[bench] = run_spec


def runner(bench: str) -> Callable[[Spec], Result]:
    """The runner registered under ``bench``.

    Raises:
        ValueError: nothing is registered under that name.
    """
    try:
        return _RUNNERS[bench]
    except KeyError:
        raise ValueError(
            f"unknown benchmark {bench!r} (registered: {', '.join(sorted(_RUNNERS))})"
        ) from None
