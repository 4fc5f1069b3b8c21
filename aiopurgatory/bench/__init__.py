"""Benchmarks of aiopurgatory against plain asyncio (``aiopurgatory bench ...``).

Three workloads, each run side by side with the asyncio baseline in one
invocation so that machine noise hits every implementation alike:

* :mod:`~aiopurgatory.bench.timer`: many timers, most cancelled right after being
  added (``ap.Timer`` vs ``loop.call_later``).
* :mod:`~aiopurgatory.bench.purgatory`: Kafka's ``TestPurgatoryPerformance``
  workload (``ap.Purgatory`` vs a hand-written asyncio purgatory vs a no-timer floor).
* :mod:`~aiopurgatory.bench.scale`: cost per add+cancel as pending timers grow.

The timer and purgatory workloads also run on trio (``--loop trio``), against
trio's own deadlines: :mod:`~aiopurgatory.bench.trio_timer` and
:mod:`~aiopurgatory.bench.trio_purgatory`.

The command line lives in :mod:`aiopurgatory.bench.cli`. This subpackage needs the
``bench`` extra (rich, matplotlib) only for progress bars and plots; the workloads
themselves use the standard library, aiopurgatory and, optionally, uvloop and trio.
"""

from __future__ import annotations

__all__: list[str] = []
