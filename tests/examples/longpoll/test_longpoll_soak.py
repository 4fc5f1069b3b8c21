"""A short run of the long-poll soak (``python -m examples.longpoll.soak``): servers across
processes on a real ``redis-server``, with every fault, checked against the ledger.

Wall clock, about 45 s: the faults need real processes and real time. The full soak
(minutes, more readers) is the command in docs/longpoll.md.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from examples.longpoll import resume, soak

pytestmark = pytest.mark.realtime


def test_a_short_soak_with_every_fault_keeps_the_ledger(tmp_path: Path) -> None:
    shape = soak.Soak(duration=30, readers=60, topics=6, writers=4, post_rate=15, stop_seconds=3)
    report = asyncio.run(soak.run(shape, keep_logs=str(tmp_path / "logs")))
    shown = json.dumps(report, indent=1)
    assert report["passed"], shown
    # each server's log kept, as it wrote it, from where it listens to where it stopped
    kept = sorted(path.name for path in (tmp_path / "logs").iterdir())
    assert kept == ["a.log", "b.log", "c.log"], kept
    for path in (tmp_path / "logs").iterdir():
        text = path.read_text()
        assert '"longpoll.listening"' in text, path
        assert '"longpoll.stopped"' in text, path
    assert [f["fault"] for f in report["faults"]] == [
        "worker SIGKILL",
        "redis SIGKILL",
        "redis restarted",
        "redis SIGSTOP",
        "redis SIGCONT",
        "CLIENT KILL TYPE pubsub",
        "CLIENT KILL TYPE pubsub",
        "output buffer limit",
        "output buffer limit",
        "server b SIGTERM",
    ], shown
    counts = report["counts"]
    # the load was there, and the faults were felt by it
    assert counts["posts_acked"] >= 200, shown
    assert counts["messages_read"] >= counts["posts_acked"], shown
    assert counts["gets_hung_up"] > 0, shown
    assert counts["gets_503"] > 0, shown  # while Redis was down or hung
    assert counts["posts_retried"] > 0, shown
    assert report["exit_statuses"] == {"a": 0, "b": 0, "c": 0}
    # /healthz probed twice a second on each server, from its own process; the slow
    # probes only excused in the soak's own stops, which are listed
    assert report["healthz"]["probes"] >= 150, shown
    assert [(w["server"], w["why"]) for w in report["excused"]] == [
        ("c", "worker of c SIGKILLed"),
        ("all", "redis SIGKILL to redis restarted"),
        ("all", "redis SIGSTOP to redis SIGCONT"),
        ("b", "server b SIGTERMed"),
    ], shown
    # every late answer judged beside its process's loop lag (the check above passed)
    assert report["late_answers"]["count"] > 0, shown  # the GETs that met the hung Redis
    assert all("lag_s" in a for a in report["late_answers"]["answers"]), shown


def test_the_soak_refuses_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert soak.main(["--duration", "5"]) == 2
    assert "duration" in capsys.readouterr().err
    with pytest.raises(ValueError, match="hangup_share"):
        soak.Soak(hangup_share=2)


def test_a_hung_redis_resuming_under_parked_gets_is_measured_and_the_bound_kept() -> None:
    """The small reproduction of the burst after SIGCONT (``python -m
    examples.longpoll.resume``), short: the probes and the late answers are there, and
    every answer came within its wait + 2.5 s + its process's loop lag."""
    report = asyncio.run(resume.run(gets=150, stop_seconds=3, before=3, after=5))
    shown = json.dumps(report, indent=1)
    assert report["exit_status"] == 0, shown
    assert report["non_json"] == [], shown
    # ~5 probes a second over the run, each timed; those during the stop excused only
    assert report["healthz"]["probes"] >= 25, shown
    assert report["statuses"].get(200, 0) > 150, shown
    assert report["statuses"].get(503, 0) > 0, shown  # the GETs that met the hung Redis
    late = report["late_answers"]
    # the GETs whose wait ended during the stop waited for the read's deadline: late,
    # each logged with its lag, and none past the bound
    assert late["count"] > 0, shown
    assert late["past_bound"] == 0, shown
    assert all(a["allowed_s"] >= 2.5 for a in late["answers"]), shown
