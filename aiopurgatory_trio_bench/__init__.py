"""trio's own deadlines and tasks as baselines of ``aiopurgatory bench --loop trio``.

The timer and purgatory workloads of :mod:`aiopurgatory.bench` on trio:
:mod:`aiopurgatory_trio_bench.timer` (``ap.Timer`` against a task per timer and
against ``trio.move_on_at`` scopes) and :mod:`aiopurgatory_trio_bench.purgatory`
(``ap.Purgatory`` against a hand-written trio purgatory of events and
``trio.move_on_after`` scopes, and against a floor with no deadlines).

The baselines are written in plain trio, as a trio programmer would write them:
going through anyio would add its layer to every baseline operation and flatter
aiopurgatory. They live in this package, next to :mod:`aiopurgatory` in the same
distribution, so that the library itself imports trio only in its trio driver,
virtual time (:func:`aiopurgatory.simulation.run_trio`) and the pytest plugin.
``aiopurgatory bench`` imports these modules only when asked for a trio loop.
"""

from __future__ import annotations

__all__: list[str] = []
