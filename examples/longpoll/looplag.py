"""The server's event-loop lag, measured: how late a timer set every ``interval`` fires.

The bound the docs give a parked GET (its wait + 2.5 s + the process's loop lag)
holds only if the loop lag is known: a loop busy with a burst (a catch-up after
Redis resumes, a collection, a slow callback) answers everything late by as much.
:class:`LoopLag` sleeps ``interval`` seconds again and again on the loop it
measures and records how much later than asked each sleep ended: the latest
lateness, the largest within the last ``window`` seconds, and the largest since
the start. ``/healthz`` and ``/metrics`` show them (``loop_lag_s``,
``loop_lag_max_s``; ``longpoll_loop_lag_seconds``, ``longpoll_loop_lag_max_seconds``).

Costs one timer every ``interval`` (0.1 s by default): nothing measurable.

With ``log_over`` set, every probe later than that is also logged
(``longpoll.loop_lag``: ``asked`` and ``ended``, the process's loop-clock times the
probe was due and ran, ``lag_s`` and ``pid``), so that a reader of the log (the
soak, :mod:`examples.longpoll.soakcheck`) can put each late answer beside the lag
its process measured around it, rather than a lag sampled at some other moment.
With it, each collection of the cyclic garbage collector that took longer than
``log_over`` is logged too (``longpoll.gc_pause``: ``at``, the process's
monotonic clock when it ended, ``generation``, ``seconds``, ``collected``), so a
stall can be told from a collection (timed with ``gc.callbacks`` while entered).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import os
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Self

import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["Background", "LoopLag", "LoopLagCollector"]


class Background:
    """Runs the instance's ``_run()`` as a task while entered (``async with``), cancelled
    at the exit; for the samplers here (:class:`LoopLag`, and
    :class:`~examples.longpoll.acceptq.AcceptQueue`).

    Raises:
        RuntimeError: entered while already running.
    """

    _task: asyncio.Task[None] | None = None
    _task_name = "background"

    async def _run(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        if self._task is not None:
            raise RuntimeError(f"this {type(self).__name__} is already running")
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self._task_name)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class LoopLag(Background):
    """Measures the running loop's lag while entered (``async with LoopLag() as lag``).

    Args:
        interval: seconds between two probes (> 0).
        window: seconds :attr:`recent_max` looks back (>= ``interval``).
        log_over: log each probe later than this many seconds (``longpoll.loop_lag``,
            a warning); None: log none.

    Raises:
        ValueError: ``interval``, ``window`` or ``log_over`` out of range.
    """

    def __init__(
        self, interval: float = 0.1, window: float = 10.0, log_over: float | None = None
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        if not window >= interval:
            raise ValueError(f"window must be >= interval ({interval}), got {window!r}")
        if log_over is not None and not log_over >= 0:
            raise ValueError(f"log_over must be >= 0 seconds or None, got {log_over!r}")
        self.log_over = log_over
        self._log = structlog.get_logger("examples.longpoll")
        self.interval = interval
        self.window = window
        #: The latest probe's lateness, in seconds.
        self.last = 0.0
        #: The largest lateness since entered, in seconds.
        self.peak = 0.0
        self.probes = 0
        # (loop time the probe ended, its lateness), the last ``window`` seconds.
        self._recent: collections.deque[tuple[float, float]] = collections.deque()
        # Collections longer than log_over, not yet logged: (ended, generation,
        # seconds, collected), appended by the collector's callback.
        self._pauses: collections.deque[tuple[float, int, float, int]] = collections.deque(
            maxlen=1000
        )
        self._gc_started = 0.0

    @property
    def recent_max(self) -> float:
        """The largest lateness of the last ``window`` seconds (seconds)."""
        if self._task is not None:
            self._forget(self._task.get_loop().time())
        return max((lateness for _, lateness in self._recent), default=0.0)

    def _forget(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - self.window:
            self._recent.popleft()

    _task_name = "loop-lag"

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        # Called by the collector, before and after each collection: only timed
        # and kept here; logged from the loop (_log_pauses).
        now = time.perf_counter()
        if phase == "start":
            self._gc_started = now
        elif self._gc_started and self.log_over is not None:
            took = now - self._gc_started
            if took > self.log_over:
                self._pauses.append((time.monotonic(), info["generation"], took, info["collected"]))

    def _log_pauses(self) -> None:
        while self._pauses:
            ended, generation, took, collected = self._pauses.popleft()
            self._log.warning(
                "longpoll.gc_pause",
                at=round(ended, 4),
                generation=generation,
                seconds=round(took, 4),
                collected=collected,
                pid=os.getpid(),
            )

    async def _run(self) -> None:
        if self.log_over is None:
            await self._probe()
            return
        gc.callbacks.append(self._on_gc)
        try:
            await self._probe()
        finally:
            gc.callbacks.remove(self._on_gc)
            self._log_pauses()

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            now = loop.time()
            lateness = max(0.0, now - asked)
            self.last = lateness
            self.peak = max(self.peak, lateness)
            self.probes += 1
            self._recent.append((now, lateness))
            self._forget(now)
            if self.log_over is not None and lateness > self.log_over:
                # Both ends on the loop's clock: the reader matches them against
                # answers timed on the same clock, in the same process.
                self._log.warning(
                    "longpoll.loop_lag",
                    asked=round(asked, 4),
                    ended=round(now, 4),
                    lag_s=round(lateness, 4),
                    pid=os.getpid(),
                )
            self._log_pauses()

    def as_dict(self) -> dict[str, float]:
        """``/healthz``'s fields: the latest and the window's largest lateness (s)."""
        return {"loop_lag_s": round(self.last, 4), "loop_lag_max_s": round(self.recent_max, 4)}


class LoopLagCollector(Collector):
    """Prometheus gauges of a :class:`LoopLag`."""

    def __init__(self, lag: LoopLag) -> None:
        self._lag = lag

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "longpoll_loop_lag_seconds",
            "How late the latest event-loop probe fired.",
            value=self._lag.last,
        )
        yield GaugeMetricFamily(
            "longpoll_loop_lag_max_seconds",
            f"The largest event-loop probe lateness of the last {self._lag.window:g} seconds.",
            value=self._lag.recent_max,
        )
