"""SyncPublisher through Redis outages: kept, delivered when Redis is back, reported, fork-safe.

Real redis-servers, killed and started again on the same port and data directory
(a restart), or stopped with SIGSTOP (a hung Redis); the waiters are
``tests.support.redis_worker`` processes (a purgatory with a RedisTriggers).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import redis

from aiopurgatory.redis import (
    RedisTriggersClosedError,
    RedisTriggersError,
    SyncPublisher,
    SyncPublisherStatistics,
)
from aiopurgatory.redis._partitions import DEFAULT_PARTITIONS, Partitions
from aiopurgatory.redis.testing import RedisServer
from tests.support.redis import Worker, encode_key

pytestmark = pytest.mark.realtime
one_loop = pytest.mark.asyncio(loop_factories=["asyncio"])


class Recorder:
    """A structlog-style logger that keeps its events (thread-safe: list appends)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def bind(self, **_: Any) -> Recorder:
        return self

    def _log(self, level: str, event: str, **fields: Any) -> None:
        self.events.append((level, event, fields))

    def debug(self, event: str, **fields: Any) -> None:
        self._log("debug", event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log("info", event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log("warning", event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log("error", event, **fields)

    def named(self, event: str) -> list[tuple[str, str, dict[str, Any]]]:
        return [e for e in self.events if e[1] == event]


def stored_watermark(server: RedisServer, channel: str, key: str | bytes | int) -> bytes | None:
    client = redis.Redis.from_url(server.url)
    try:
        value = client.get(Partitions(channel, DEFAULT_PARTITIONS).stored_key(key))
        assert value is None or isinstance(value, bytes)
        return value
    finally:
        client.close()


async def done(worker: Worker, name: str) -> dict[str, Any]:
    """The worker's ``done`` event for op ``name`` (already read, or one to come)."""
    for event in worker.events:
        if event["event"] == "done" and event["id"] == name:
            return event
    return await worker.expect("done", id=name, within=15)


def restart(server: RedisServer, down: float = 0.0) -> None:
    """Kill ``server`` and start a new one on the same port and data directory."""
    server.kill()
    time.sleep(down)
    server.start()


# -- a restart amid many publishing threads ---------------------------------------------


@one_loop
async def test_a_restart_amid_fifty_threads_fails_no_call_and_every_waiter_gets_its_end(
    redis_server: RedisServer,
) -> None:
    jobs, done_value = 50, 1000
    log = Recorder()
    publisher = SyncPublisher(
        redis_server.url, channel="jobs", timeout=2, reconnect_delay=(0.05, 0.5), logger=log
    )
    # A short sweep: each watch waits until its partition is subscribed.
    worker = Worker(redis_server.url, "jobs", reconnect_delay=[0.05, 0.5], sweep_interval=0.01)
    try:
        await worker.start()
        for n in range(jobs):
            key = encode_key(f"job-{n}")
            await worker.request("watch", id=f"job-{n}", thresholds=[[key, done_value]], timeout=60)
        publisher.ping()
        errors: list[BaseException] = []
        running = threading.Barrier(jobs + 1)  # every job has published some progress
        killed = threading.Event()
        restarted = threading.Event()

        def job(n: int) -> None:
            # Progress, then the end: the even jobs end while Redis is away, the
            # odd ones after it is back.
            try:
                step = 0
                for step in range(3):
                    publisher.advance(f"job-{n}", step)
                running.wait()
                until = killed if n % 2 == 0 else restarted
                while not until.is_set() or step < 6:
                    step += 1
                    publisher.advance(f"job-{n}", step)
                    time.sleep(0.01 * (n % 5 + 1))
                publisher.advance(f"job-{n}", done_value)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=job, args=(n,)) for n in range(jobs)]

        def restart_amid_the_jobs() -> None:
            for thread in threads:
                thread.start()
            running.wait()
            redis_server.kill()
            killed.set()
            for thread in threads[::2]:
                thread.join(30)
            time.sleep(0.2)
            redis_server.start()  # the same port and data directory
            restarted.set()
            for thread in threads:
                thread.join(30)

        await asyncio.to_thread(restart_amid_the_jobs)
        assert errors == []
        assert await asyncio.to_thread(publisher.flush, 10) == 0
        for n in range(jobs):
            event = await done(worker, f"job-{n}")
            assert event["outcome"] == "COMPLETED"
            assert stored_watermark(redis_server, "jobs", f"job-{n}") == str(done_value).encode()
        stats = publisher.statistics()
        assert stats.kept > 0, stats  # the restart did hit the calls
        assert (stats.dropped, stats.pending) == (0, 0), stats
        assert stats.sent + stats.kept > jobs * 7
        assert stats.outages >= 1, stats
        assert stats.delivered_late > 0, stats
        # Logged once per outage (start and end), never per call.
        assert len(log.named("aiopurgatory.redis.publisher_outage")) == stats.outages
        assert len(log.named("aiopurgatory.redis.publisher_recovered")) == stats.outages
    finally:
        await worker.close()
        publisher.close()


# -- what is kept, and what is reported -------------------------------------------------


def test_flush_and_close_report_what_was_not_delivered(redis_server: RedisServer) -> None:
    log = Recorder()
    publisher = SyncPublisher(
        redis_server.url, channel="jobs", reconnect_delay=(0.05, 0.2), logger=log
    )
    assert publisher.flush() == 0  # nothing kept: at once
    publisher.advance("a", 1)
    redis_server.kill()
    for value in range(2, 50):
        publisher.advance("a", value)  # coalesced: one entry
    publisher.check_and_complete("b")
    publisher.advance("c", 7)
    stats = publisher.statistics()
    assert isinstance(stats, SyncPublisherStatistics)
    assert (stats.sent, stats.kept, stats.pending, stats.outages) == (1, 50, 3, 1)
    assert stats.connected is False
    assert stats.last_error is not None
    assert "Connection refused" in stats.last_error
    started = time.monotonic()
    assert publisher.flush(timeout=0.3) == 3
    assert 0.25 < time.monotonic() - started < 2.0
    [(level, _, fields)] = log.named("aiopurgatory.redis.publisher_outage")
    assert level == "warning"
    assert fields["kept"] == 1

    redis_server.start()
    assert publisher.flush(timeout=10) == 0
    assert stored_watermark(redis_server, "jobs", "a") == b"49"
    assert stored_watermark(redis_server, "jobs", "c") == b"7"
    stats = publisher.statistics()
    assert (stats.pending, stats.delivered_late, stats.dropped, stats.connected) == (0, 3, 0, True)
    [(_, _, fields)] = log.named("aiopurgatory.redis.publisher_recovered")
    assert fields["delivered"] == 3
    assert fields["seconds"] > 0.25
    publisher.advance("a", 50)  # Redis answers: straight through again
    assert publisher.statistics().sent == 2

    # Redis away at close: close() waits its bound, then says what it could not deliver.
    redis_server.kill()
    publisher.advance("d", 1)
    publisher.check_and_complete("d")
    started = time.monotonic()
    assert publisher.close(timeout=0.3) == 2
    assert 0.25 < time.monotonic() - started < 2.0
    assert publisher.statistics().dropped == 2
    [(level, _, fields)] = log.named("aiopurgatory.redis.publisher_dropped")
    assert level == "warning"
    assert fields["triggers"] == 2
    assert publisher.close() == 0  # idempotent
    with pytest.raises(RedisTriggersClosedError):
        publisher.advance("d", 2)
    with pytest.raises(ValueError, match="timeout must not be negative"):
        publisher.flush(-1)


def test_the_outbox_is_bounded_and_what_does_not_fit_raises(redis_server: RedisServer) -> None:
    publisher = SyncPublisher(
        redis_server.url, channel="jobs", max_pending=3, reconnect_delay=(0.05, 0.2)
    )
    redis_server.kill()
    for key in ("k1", "k2", "k3"):
        publisher.advance(key, 1)
    publisher.advance("k1", 9)  # a key kept already: its value rises, nothing added
    with pytest.raises(RedisTriggersError, match=r"3 triggers are kept .*max_pending"):
        publisher.advance("k4", 1)
    with pytest.raises(RedisTriggersError, match="max_pending"):
        publisher.check_and_complete("k1")  # a check is an entry of its own
    stats = publisher.statistics()
    assert (stats.kept, stats.pending, stats.dropped) == (4, 3, 2)
    redis_server.start()
    assert publisher.flush(timeout=10) == 0
    assert stored_watermark(redis_server, "jobs", "k1") == b"9"
    assert stored_watermark(redis_server, "jobs", "k4") is None
    publisher.close()
    bad_bounds: list[tuple[Any, type[Exception]]] = [
        (0, ValueError),
        (True, TypeError),
        (1.5, TypeError),
    ]
    for bad, error in bad_bounds:
        with pytest.raises(error, match="max_pending"):
            SyncPublisher(redis_server.url, max_pending=bad)


def test_what_redis_refuses_is_raised_or_dropped_loudly_never_kept(
    redis_server: RedisServer,
) -> None:
    log = Recorder()
    publisher = SyncPublisher(
        redis_server.url, channel="jobs", reconnect_delay=(0.05, 0.2), logger=log
    )
    client = redis.Redis.from_url(redis_server.url)
    partitions = Partitions("jobs", DEFAULT_PARTITIONS)
    client.rpush(partitions.stored_key("bad"), "x")  # not a watermark: WRONGTYPE
    with pytest.raises(RedisTriggersError, match=r"refused the command.*WRONGTYPE"):
        publisher.advance("bad", 1)
    assert publisher.statistics().pending == 0
    # Met by the delivery thread: the batch is tried trigger by trigger; the good
    # ones are delivered, the refused one dropped and logged.
    client.close()
    redis_server.kill()
    publisher.advance("good", 3)
    publisher.advance("bad", 2)
    redis_server.start()
    assert publisher.flush(timeout=10) == 0
    assert stored_watermark(redis_server, "jobs", "good") == b"3"
    stats = publisher.statistics()
    assert (stats.delivered_late, stats.dropped) == (1, 1)
    [(level, _, fields)] = log.named("aiopurgatory.redis.publisher_refused")
    assert level == "error"
    assert "WRONGTYPE" in fields["error"]
    publisher.close()


# -- fork --------------------------------------------------------------------------------


def _in_child(work: Any) -> int:
    """Fork; run ``work()`` in the child, which writes its JSON result to a pipe.

    Returns the child's pid; read its result with :func:`_child_result`.
    """
    read, write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns that forking a process with threads may deadlock:
        # that is the case under test (a Celery prefork child).
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read)
            os.write(write, json.dumps(work()).encode())
            code = 0
        except BaseException as exc:
            os.write(write, json.dumps({"error": repr(exc)}).encode())
        finally:
            os._exit(code)
    os.close(write)
    _PIPES[pid] = read
    return pid


_PIPES: dict[int, int] = {}


def _child_result(pid: int, within: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        assert time.monotonic() < deadline, "the child did not end"
        time.sleep(0.02)
    read = _PIPES.pop(pid)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    result: dict[str, Any] = json.loads(b"".join(chunks))
    assert os.waitstatus_to_exitcode(status) == 0, result
    return result


def test_a_forked_child_publishes_through_its_parents_publisher_during_an_outage(
    redis_server: RedisServer,
) -> None:
    publisher = SyncPublisher(redis_server.url, channel="jobs", reconnect_delay=(0.05, 0.2))
    publisher.advance("parent", 1)  # a pooled connection in the parent
    redis_server.kill()
    publisher.advance("parent", 2)  # kept in the parent: its thread runs, its lock is used

    def child_in_outage() -> dict[str, Any]:
        before = publisher.statistics()
        publisher.advance("child", 5)  # Redis is still away: kept, no error
        kept = publisher.statistics()
        left = publisher.flush(timeout=20)
        return {
            "before": before.pending,
            "kept": kept.pending,
            "left": left,
            "delivered": publisher.statistics().delivered_late,
        }

    pid = _in_child(child_in_outage)
    time.sleep(0.3)
    redis_server.start()
    assert publisher.flush(timeout=10) == 0
    result = _child_result(pid)
    # The child started with nothing kept (the parent delivers its own), kept its
    # advance, and its own thread delivered it on its own connections.
    assert result == {"before": 0, "kept": 1, "left": 0, "delivered": 1}
    assert stored_watermark(redis_server, "jobs", "parent") == b"2"
    assert stored_watermark(redis_server, "jobs", "child") == b"5"

    # Redis up: parent and child send at once, each on connections of its own
    # (redis-py's pool starts afresh in a child): no reply goes to the wrong process.
    def child_sends() -> dict[str, Any]:
        for value in range(200):
            publisher.advance("child-2", value)
        stats = publisher.statistics()
        return {"sent": stats.sent, "kept": stats.kept}

    pid = _in_child(child_sends)
    for value in range(200):
        publisher.advance("parent-2", value)
    assert _child_result(pid) == {"sent": 200, "kept": 0}
    assert stored_watermark(redis_server, "jobs", "child-2") == b"199"
    assert stored_watermark(redis_server, "jobs", "parent-2") == b"199"
    assert publisher.close() == 0


def test_a_wrong_password_raises_at_first_and_is_an_outage_once_it_worked(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory(password="first")
    # Never reached Redis: a misconfiguration, loud at the first call, nothing kept.
    wrong = SyncPublisher(server.url_for(None, "wrong"), channel="jobs")
    with pytest.raises(RedisTriggersError, match="authentication failed"):
        wrong.advance("k", 1)
    assert wrong.statistics().pending == 0
    wrong.close()

    # Worked, then the password changed under it (rotated): kept, logged as an
    # error, delivered once the password is right again.
    log = Recorder()
    publisher = SyncPublisher(server.url, channel="jobs", reconnect_delay=(0.05, 0.2), logger=log)
    publisher.advance("k", 1)
    admin = redis.Redis.from_url(server.url)
    admin.config_set("requirepass", "second")
    admin.client_kill_filter(_type="normal", skipme=True)  # the publisher reconnects
    publisher.advance("k", 2)  # no error: kept
    [(level, _, fields)] = log.named("aiopurgatory.redis.publisher_outage")
    assert level == "error"
    assert "WRONGPASS" in fields["error"] or "invalid" in fields["error"]
    assert "first" not in fields["error"]
    assert publisher.flush(timeout=0.3) == 1
    admin.config_set("requirepass", "first")
    assert publisher.flush(timeout=10) == 0
    assert admin.get(Partitions("jobs", DEFAULT_PARTITIONS).stored_key("k")) == b"2"
    admin.close()
    publisher.close()


def test_what_is_kept_at_exit_gets_its_delivery_time_then_is_logged(
    redis_server: RedisServer,
) -> None:
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import time
        from aiopurgatory.redis import SyncPublisher
        publisher = SyncPublisher({redis_server.url!r}, channel="jobs", close_timeout=0.5)
        publisher.advance("left", 1)
        print(publisher.statistics().pending, flush=True)
        # No close(): the interpreter's exit delivers, or says what it could not.
        """
    )
    redis_server.kill()
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True
    )
    assert done.stdout.strip() == "1"
    assert "aiopurgatory.redis.publisher_dropped" in done.stderr
    assert "triggers=1" in done.stderr
    assert "reason='exit'" in done.stderr
    assert time.monotonic() - started < 10
