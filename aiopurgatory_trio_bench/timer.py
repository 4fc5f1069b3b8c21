"""``bench timer`` on trio: ``ap.Timer`` against trio's own deadlines.

The workload of :mod:`aiopurgatory.bench.timer` (``n`` timers, delays uniform in
[0, ``max_delay``), a fixed share cancelled right after being added, the rest
fire a callback; added in batches of ``batch`` with a scheduler checkpoint in
between), with the same seeded inputs, under ``trio.run``.

trio has no ``call_later``: a deadline belongs to a cancel scope, and when it
passes it cancels the code running inside that scope. So the baselines are the
two ways a trio programmer gets the same job done:

* ``task`` (*a callback after a delay*): each timer is a task that sleeps until
  the due instant and then runs the callback, inside a cancel scope made before
  the task is started, so that the timer can be withdrawn at once with
  ``scope.cancel()`` (even before the task has run). This is the general
  answer, what ``call_later`` becomes on trio, and it does not need to know in
  advance whether a timer will be cancelled.
* ``scope`` (*a request timeout*): the deadline is a ``trio.move_on_at`` scope in
  a task that exists anyway (the request's). A timer that is cancelled is a scope
  entered and left before its deadline (the request finished first: the
  deadline is registered in trio's deadline heap and withdrawn); a timer that
  fires is a task waiting in such a scope, which runs the callback when the
  deadline cancels the wait. The adding code chooses between the two by the
  same ``keep`` flag the other implementations branch on, and pays for no task
  per cancelled timer: the cheapest way trio has to set and withdraw a deadline.

``ap`` is ``ap.Timer().call_at(when, callback, j)`` and ``handle.cancel()``: the
same calls as on asyncio (``call_at`` rather than ``call_later`` so that every
implementation gets the very same due instant, read once from trio's clock).

Measured as on asyncio: CPU seconds (``time.process_time`` from the first add
until every timer fired and every task ended), add+cancel CPU per timer inside
the batches only (work a baseline defers to its tasks, such as a cancelled
task's first and last step, is in the CPU total, not here), fired and early
counts (early: trio's clock in the callback before the due instant), lateness,
peak RSS.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import trio

from aiopurgatory.bench._common import Result, rss_mib
from aiopurgatory.bench.workload import timer_inputs, timer_recorder, timer_result

__all__ = ["workload"]


async def _sleep_then_call(
    scope: trio.CancelScope, when: float, callback: Callable[[int], object], j: int
) -> None:
    # The "task" baseline: call_later as trio writes it.
    with scope:
        await trio.sleep_until(when)
        callback(j)


async def _wait_deadline(when: float, callback: Callable[[int], object], j: int) -> None:
    # The "scope" baseline's timers that fire: a wait that the deadline cancels.
    with trio.move_on_at(when):
        await trio.sleep_forever()
    callback(j)


async def workload(
    impl: str, n: int, cancel_fraction: float, max_delay: float, batch: int, seed: int
) -> Result:
    """One run of ``impl`` (``"ap"``, ``"task"`` or ``"scope"``) in the running trio run."""
    delays, keep = timer_inputs(n, cancel_fraction, max_delay, seed)
    kept_total = sum(keep)
    due: list[float] = []
    rss_before = rss_mib()

    # The run's clock, bound once (trio.current_time() looks the run up first).
    clock: Callable[[], float] = trio.lowlevel.current_clock().current_time
    all_fired = trio.Event()
    fired_at, remaining, fired = timer_recorder(clock, kept_total, all_fired.set)

    due_append = due.append
    checkpoint = trio.lowlevel.checkpoint
    # CPU time, not wall time (see aiopurgatory.bench.timer).
    cpu_clock = time.process_time
    add_cpu = 0.0
    j = 0
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        if impl == "scope":
            start_soon = nursery.start_soon
            move_on_at = trio.move_on_at
            for start in range(0, n, batch):
                t0 = cpu_clock()
                for i in range(start, min(start + batch, n)):
                    when = clock() + delays[i]
                    if keep[i]:
                        start_soon(_wait_deadline, when, fired, j)
                        due_append(when)
                        j += 1
                    else:
                        with move_on_at(when):
                            pass
                add_cpu += cpu_clock() - t0
                await checkpoint()
        else:
            call_at: Any
            if impl == "ap":
                import aiopurgatory as ap

                call_at = ap.Timer().call_at
            elif impl == "task":
                start_soon = nursery.start_soon
                cancel_scope = trio.CancelScope

                def call_at(
                    when: float, callback: Callable[[int], object], j: int
                ) -> trio.CancelScope:
                    scope = cancel_scope()
                    start_soon(_sleep_then_call, scope, when, callback, j)
                    return scope

            else:
                raise ValueError(f"impl must be one of ap, task, scope, got {impl!r}")
            for start in range(0, n, batch):
                t0 = cpu_clock()
                for i in range(start, min(start + batch, n)):
                    when = clock() + delays[i]
                    if keep[i]:
                        call_at(when, fired, j)
                        due_append(when)
                        j += 1
                    else:
                        call_at(when, fired, -1).cancel()
                add_cpu += cpu_clock() - t0
                await checkpoint()
        if kept_total:
            await all_fired.wait()
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0

    return timer_result(
        cpu=cpu,
        wall=wall,
        add_cpu=add_cpu,
        n=n,
        kept_total=kept_total,
        remaining=remaining[0],
        lateness=[at - when for at, when in zip(fired_at, due, strict=True)],
        rss_before=rss_before,
    )
