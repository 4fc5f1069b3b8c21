"""Benchmarks of aiopurgatory against plain asyncio (``aiopurgatory bench ...``).

Three workloads, each run side by side with the asyncio baseline in one
invocation so that machine noise hits every implementation alike:

* :mod:`~aiopurgatory.bench.timer`: many timers, most cancelled right after being
  added (``ap.Timer`` vs ``loop.call_later``).
* :mod:`~aiopurgatory.bench.purgatory`: Kafka's ``TestPurgatoryPerformance``
  workload (``ap.Purgatory`` vs a hand-written asyncio purgatory vs a no-timer floor).
* :mod:`~aiopurgatory.bench.scale`: cost per add+cancel as pending timers grow.

The timer and purgatory workloads also run on trio (``--loop trio``), against
trio's own deadlines, written in plain trio: :mod:`aiopurgatory_trio_bench.timer`
and :mod:`aiopurgatory_trio_bench.purgatory`, in a package of their own beside
this one (same distribution) so that :mod:`aiopurgatory` imports trio only in its
trio driver, virtual time and the pytest plugin; imported only for a trio loop.

The command line lives in :mod:`aiopurgatory.bench.cli`. This subpackage needs the
``bench`` extra (rich, matplotlib) only for progress bars and plots; the workloads
themselves use the standard library, aiopurgatory and, optionally, uvloop and trio.
"""

from __future__ import annotations

__all__: list[str] = []
