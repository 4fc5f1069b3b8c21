"""The listening socket's accept queue: connections the kernel completed, not yet accepted.

The loop-lag probe (:mod:`examples.longpoll.looplag`) is a timer: it fires within one
loop iteration, however many requests wait. A server that cannot keep up with the
requests coming in (a herd of readers asking again at once, on a loaded machine)
shows little loop lag while its new connections, ``/healthz`` among them, wait in
the kernel's accept queue for seconds: measured in the soak after a hung Redis
resumed (docs/longpoll.md). :func:`accept_queue` reads that queue's length (Linux's
``TCP_INFO`` of a listening socket: ``tcpi_unacked`` is the queue, ``tcpi_sacked``
its limit); :class:`AcceptQueue` samples it, shows it in ``/healthz``
(``accept_queue``) and ``/metrics`` (``longpoll_accept_queue``), and logs a sample
over ``log_over`` (``longpoll.accept_queue``, with the loop-clock time and ``pid``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Iterator

import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .looplag import Background

__all__ = ["AcceptQueue", "AcceptQueueCollector", "accept_queue"]

# struct tcp_info: eight u8 fields, then u32 rto, ato, snd_mss, rcv_mss, unacked, sacked.
_TCP_INFO_HEAD = struct.Struct("=8xIIIIII")


def accept_queue(sock: socket.socket) -> tuple[int, int] | None:
    """A listening TCP socket's accept queue: (connections waiting, the limit).

    None where the platform does not tell (not Linux, not TCP, a closed socket).
    """
    tcp_info = getattr(socket, "TCP_INFO", None)
    if tcp_info is None or sock.fileno() < 0:
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, tcp_info, 104)
    except OSError:
        return None
    if len(raw) < _TCP_INFO_HEAD.size:
        return None
    *_, waiting, limit = _TCP_INFO_HEAD.unpack_from(raw)
    return waiting, limit


class AcceptQueue(Background):
    """Samples a listening socket's accept queue every ``interval`` while entered.

    Args:
        sock: the listening socket; None: nothing to sample (``latest`` stays None).
        interval: seconds between samples (> 0).
        log_over: log a sample with more connections waiting than this (>= 0), None:
            log none.

    Raises:
        ValueError: ``interval`` or ``log_over`` out of range.
        RuntimeError: entered while already sampling.
    """

    def __init__(
        self, sock: socket.socket | None, interval: float = 0.25, log_over: int | None = 50
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        if log_over is not None and log_over < 0:
            raise ValueError(f"log_over must be >= 0 or None, got {log_over!r}")
        self.sock = sock
        self.interval = interval
        self.log_over = log_over
        #: Connections waiting at the latest sample; None before one or if unknown.
        self.latest: int | None = None
        #: The most seen waiting.
        self.peak = 0
        self._log = structlog.get_logger("examples.longpoll")

    def sample(self) -> int | None:
        """Read the queue now (also kept in :attr:`latest`)."""
        found = None if self.sock is None else accept_queue(self.sock)
        self.latest = None if found is None else found[0]
        if self.latest is not None:
            self.peak = max(self.peak, self.latest)
        return self.latest

    _task_name = "accept-queue"

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self.sock is not None:
            waiting = self.sample()
            if waiting is not None and self.log_over is not None and waiting > self.log_over:
                self._log.warning(
                    "longpoll.accept_queue",
                    waiting=waiting,
                    at=round(loop.time(), 4),
                    pid=os.getpid(),
                )
            await asyncio.sleep(self.interval)


class AcceptQueueCollector(Collector):
    """The ``longpoll_accept_queue`` gauge of an :class:`AcceptQueue` (none if unknown)."""

    def __init__(self, queue: AcceptQueue) -> None:
        self._queue = queue

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self._queue.sock is None:
            return
        waiting = self._queue.sample()
        if waiting is not None:
            yield GaugeMetricFamily(
                "longpoll_accept_queue",
                "Connections completed by the kernel, not yet accepted by this process.",
                value=waiting,
            )
