"""The soak's judgement of the tail: late answers beside their loop lag, slow ``/healthz``.

Pure functions over what the soak collected (:mod:`examples.longpoll.soak`), so that
they are tested without a soak:

* :func:`judge_late` puts every parked GET a server logged as late
  (``longpoll.late_answer``: its start, wait and answer on the process's loop clock)
  beside the loop lag the same process measured around it (``longpoll.loop_lag``:
  each probe of :class:`~examples.longpoll.looplag.LoopLag` later than 0.05 s, the
  times it was due and ran), and fails those later than ``wait + bound + lag``.
  The lag around an answer is the time, between the end of its wait and its
  answer, during which a logged probe was overdue (the overlaps summed), plus
  ``unlogged`` (0.05 s): a probe later by less than that is not logged, so that
  much lag may have gone unseen. A queue of requests in front of the loop (the
  kernel's accept queue of a server that cannot keep up) is not loop lag: it
  delays new requests, not a parked GET's answer, and the probes of ``/healthz``
  see it.
* :func:`judge_probes` reports every ``/healthz`` probe slower than its timeout or
  failed (:mod:`examples.longpoll.healthprobe`), excusing those whose time overlaps
  a window in which the soak itself stopped that server, one of its processes, or
  Redis (:func:`excused_windows`).

Times are seconds on the monotonic clock every process here reads
(``loop.time()`` of asyncio and uvloop, ``time.monotonic()``), so a server's
records and the soak's faults compare directly.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Window",
    "excused_windows",
    "judge_late",
    "judge_probes",
    "lag_around",
    "spikes_by_pid",
]


@dataclass(frozen=True, slots=True)
class Window:
    """A time (monotonic seconds) in which the soak's own fault excuses a slow probe.

    ``server``: the server it excuses, None for every server.
    """

    start: float
    end: float
    why: str
    server: str | None = None

    def covers(self, server: str, start: float, end: float) -> bool:
        """Whether it excuses ``server`` for a probe from ``start`` to ``end``."""
        return (self.server is None or self.server == server) and (
            start <= self.end and end >= self.start
        )


def excused_windows(
    faults: Iterable[Mapping[str, Any]], end: float, restarts: Mapping[str, float] | None = None
) -> list[Window]:
    """The windows the soak's faults excuse, from its fault notes (``t``: monotonic time).

    Redis SIGKILLed until restarted, and SIGSTOPped until SIGCONT, excuse every
    server; a worker of ``c`` SIGKILLed excuses ``c`` until its supervisor restarted
    it (``restarts["c"]``, else 10 s); server ``b`` SIGTERMed excuses ``b`` to the
    ``end``. Nothing else: not the time after Redis resumes.

    Raises:
        ValueError: a stop without its end (a SIGKILL of Redis never restarted, a
            SIGSTOP never continued).
    """
    windows: list[Window] = []
    opened: dict[str, float] = {}
    pairs = {"redis restarted": "redis SIGKILL", "redis SIGCONT": "redis SIGSTOP"}
    for fault in faults:
        what, t = fault["fault"], float(fault["t"])
        if what in ("redis SIGKILL", "redis SIGSTOP"):
            opened[what] = t
        elif what in pairs:
            began = opened.pop(pairs[what])
            windows.append(Window(began, t, f"{pairs[what]} to {what}"))
        elif what == "worker SIGKILL":
            back = (restarts or {}).get("c", t + 10.0)
            windows.append(Window(t, max(t, back), "worker of c SIGKILLed", "c"))
        elif what == "server b SIGTERM":
            windows.append(Window(t, end, "server b SIGTERMed", "b"))
    if opened:
        raise ValueError(f"faults never ended: {sorted(opened)}")
    return windows


def lag_around(spikes: list[tuple[float, float, float]], start: float, end: float) -> float:
    """Seconds of ``start`` to ``end`` during which a logged probe was overdue.

    ``spikes``: ``(asked, ended, lag)`` of one process, sorted by ``asked``.
    """
    if end <= start:
        return 0.0
    total = 0.0
    # A probe is overdue from when it was asked to when it ran; probes follow one
    # another, so their overdue times do not overlap.
    first = bisect.bisect_left(spikes, (start - 3600.0,))
    for asked, ended, _ in spikes[first:]:
        if asked >= end:
            break
        total += max(0.0, min(ended, end) - max(asked, start))
    return total


def judge_late(
    answers: Iterable[Mapping[str, Any]],
    spikes: Iterable[Mapping[str, Any]],
    bound: float,
    origin: float,
    keep: int = 50,
    unlogged: float = 0.05,
) -> dict[str, Any]:
    """Each late answer against ``wait + bound + unlogged + the lag around it``.

    Args:
        answers: ``longpoll.late_answer`` records (``start``, ``wait``, ``answered``,
            ``late_s``, ``pid``, ``status``, ``topic``), each with ``server``.
        spikes: ``longpoll.loop_lag`` records (``asked``, ``ended``, ``lag_s``, ``pid``).
        bound: seconds allowed past the wait before the lag (2.5: the docs' bound).
        origin: the soak's start (monotonic), for ``at`` in the report.
        keep: how many answers the report lists (the latest first), and as many of
            those past the bound.
        unlogged: seconds of lag a process does not log (its ``LoopLag.log_over``).

    Returns:
        ``count``, ``past_bound`` (answers later than the bound allows), ``late_max_s``,
        ``lag_max_s`` (the most lag around one answer), ``excess_max_s`` (the most an
        answer went past its bound; <= 0 when none did), ``answers`` and
        ``past``: the answers listed, each with its ``lag_s`` and ``allowed_s``.
    """
    by_pid = spikes_by_pid(spikes)
    judged = []
    for a in answers:
        due = float(a["start"]) + float(a["wait"])
        lag = lag_around(by_pid.get(int(a["pid"]), []), due, float(a["answered"]))
        late = float(a["late_s"])
        judged.append(
            {
                "server": a["server"],
                "at": round(float(a["answered"]) - origin, 1),
                "status": a.get("status"),
                "wait": a["wait"],
                "late_s": round(late, 3),
                "lag_s": round(lag, 3),
                "allowed_s": round(bound + unlogged + lag, 3),
                "_excess": late - bound - unlogged - lag,
            }
        )
    past = [j for j in judged if j["_excess"] > 0]
    result = {
        "count": len(judged),
        "past_bound": len(past),
        "late_max_s": round(max((j["late_s"] for j in judged), default=0.0), 3),
        "lag_max_s": round(max((j["lag_s"] for j in judged), default=0.0), 3),
        "excess_max_s": round(max((j["_excess"] for j in judged), default=0.0), 3),
    }
    for j in judged:
        del j["_excess"]
    judged.sort(key=lambda j: -j["late_s"])
    past.sort(key=lambda j: -j["late_s"])
    result["answers"] = judged[:keep]
    result["past"] = past[:keep]
    return result


def spikes_by_pid(
    spikes: Iterable[Mapping[str, Any]],
) -> dict[int, list[tuple[float, float, float]]]:
    """``longpoll.loop_lag`` records as :func:`lag_around` takes them, per process."""
    by_pid: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
    for s in spikes:
        by_pid[int(s["pid"])].append((float(s["asked"]), float(s["ended"]), float(s["lag_s"])))
    for series in by_pid.values():
        series.sort()
    return by_pid


def judge_probes(
    probes: Iterable[Mapping[str, Any]],
    windows: list[Window],
    timeout: float,
    origin: float,
    keep: int = 50,
    lags: Mapping[str, list[list[tuple[float, float, float]]]] | None = None,
    queues: Mapping[str, list[tuple[float, int]]] | None = None,
) -> dict[str, Any]:
    """The ``/healthz`` probes slower than ``timeout`` or failed, excused or not.

    Args:
        probes: :mod:`~examples.longpoll.healthprobe`'s records (``server``, ``sent``,
            ``took`` or None, ``error``, ``prober_lag_s``).
        windows: what the soak's own faults excuse (:func:`excused_windows`).
        timeout: seconds a probe may take.
        origin: the soak's start (monotonic), for ``at`` in the report.
        lags: per server, each of its processes' loop-lag spikes (:func:`spikes_by_pid`'s
            lists): a slow probe is listed with the most lag one of them had then.
        queues: per server, ``(time, connections waiting)`` as its processes logged
            them (``longpoll.accept_queue``): listed with the most waiting then.

    Returns:
        ``probes`` (how many), ``slow`` (slower than ``timeout`` or failed, not
        excused), ``excused``, ``took_max_s`` (the slowest probe answered, excused or
        not), and ``listed``: the slow ones, each with its time, the server's loop
        lag and accept queue then, and the prober's own loop lag.
    """
    count = excused = 0
    took_max = 0.0
    slow: list[dict[str, Any]] = []
    for p in probes:
        count += 1
        took = p.get("took")
        if took is not None:
            took_max = max(took_max, float(took))
        if took is not None and took <= timeout and p.get("error") is None:
            continue
        sent = float(p["sent"])
        end = sent + (timeout if took is None else float(took))
        if any(w.covers(p["server"], sent, end) for w in windows):
            excused += 1
            continue
        server = p["server"]
        lag = max((lag_around(s, sent, end) for s in (lags or {}).get(server, [])), default=0.0)
        waiting = [n for t, n in (queues or {}).get(server, []) if sent <= t <= end]
        slow.append(
            {
                "server": server,
                "at": round(sent - origin, 1),
                "took_s": None if took is None else round(float(took), 3),
                "error": p.get("error"),
                "connect_s": p.get("connect_s"),
                "server_lag_s": round(lag, 3),
                "accept_queue": max(waiting, default=None),
                "prober_lag_s": p.get("prober_lag_s"),
            }
        )
    return {
        "probes": count,
        "slow": len(slow),
        "excused": excused,
        "took_max_s": round(took_max, 3),
        "listed": slow[:keep],
    }
