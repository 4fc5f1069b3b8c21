"""The PostgreSQL SyncPublisher through outages: kept, delivered when the server is back,
bounded, reported once, fork-safe (the outbox it shares with Redis's: aiopurgatory._outbox).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import warnings
from typing import Any

import psycopg
import pytest

import aiopurgatory as ap
from aiopurgatory.postgres import (
    PostgresTriggers,
    PostgresTriggersClosedError,
    PostgresTriggersError,
    SyncPublisher,
)
from aiopurgatory.postgres._sync import failure_kind
from aiopurgatory.postgres._wire import stored_key
from tests.support.postgres import PostgresServer, parked

pytestmark = pytest.mark.realtime

FAST: dict[str, Any] = {
    "health_check_interval": 5.0,
    "reconnect_delay": (0.05, 0.5),
    "command_timeout": 1.0,
}


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


def stored(dsn: str, key: str, channel: str = "aiopurgatory") -> float | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            f'SELECT value FROM "{channel}_watermarks" WHERE key = %s', (stored_key(key),)
        ).fetchone()
    return None if row is None else float(row[0])


async def test_a_restart_amid_threads_publishing_fails_no_call_and_every_waiter_completes(
    postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.dsn
    threads, calls = 4, 60
    log = Recorder()
    publisher = SyncPublisher(dsn, reconnect_delay=(0.05, 0.5), connect_timeout=2, logger=log)
    publisher.advance("warm-up", 1)  # the publisher's connection is made before the restart
    async with PostgresTriggers(ap.Purgatory("w"), dsn, **FAST) as waiter:
        # Per thread: an op waiting for its last advance, one for its midpoint.
        ops = [await parked(waiter, f"t{n}", calls, expiry=60) for n in range(threads)]
        ops += [await parked(waiter, f"t{n}", calls // 2, expiry=60) for n in range(threads)]
        failures: list[BaseException] = []
        progress = [0] * threads

        def publish(n: int) -> None:
            try:
                for value in range(1, calls + 1):
                    publisher.advance(f"t{n}", value)
                    progress[n] = value
                    time.sleep(0.02)
            except BaseException as exc:
                failures.append(exc)

        workers = [threading.Thread(target=publish, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        while min(progress) < 10:  # noqa: ASYNC110 - the threads' progress, polled
            await asyncio.sleep(0.01)
        await asyncio.to_thread(postgres_server.stop)
        down_at = min(progress)
        await asyncio.sleep(1.0)  # the threads go on calling meanwhile
        assert min(progress) > down_at  # calls returned while the server was down
        kept = publisher.statistics()
        assert kept.pending >= 1
        assert not kept.connected
        await asyncio.to_thread(postgres_server.start)
        for worker in workers:
            await asyncio.to_thread(worker.join, 60)
        assert failures == []  # no call raised
        assert await asyncio.to_thread(publisher.flush, 20) == 0
        outcomes = await asyncio.wait_for(asyncio.gather(*ops), 20)
        assert outcomes == [ap.Outcome.COMPLETED] * (2 * threads)
    stats = publisher.statistics()
    assert stats.kept >= 1
    assert stats.delivered_late >= 1
    assert stats.dropped == 0
    assert stats.outages == 1
    assert stats.sent + stats.kept == threads * calls + 1
    # logged once for the outage, once for its end, never per call
    [(level, _, outage)] = log.named("aiopurgatory.postgres.publisher_outage")
    assert level == "warning"
    assert outage["kept"] >= 1
    [(_, _, recovered)] = log.named("aiopurgatory.postgres.publisher_recovered")
    assert recovered["delivered"] >= 1
    for n in range(threads):
        assert stored(dsn, f"t{n}") == calls
    assert publisher.close() == 0


def test_the_outbox_is_bounded_and_flush_and_close_report_what_is_left(
    postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.dsn
    log = Recorder()
    publisher = SyncPublisher(dsn, max_pending=2, reconnect_delay=(0.05, 0.2), logger=log)
    publisher.advance("a", 1)
    postgres_server.stop()
    publisher.advance("a", 2)  # kept
    publisher.advance("b", 1)  # kept
    publisher.advance("a", 3)  # coalesced with the kept advance of "a": fits
    with pytest.raises(PostgresTriggersError, match="max_pending"):
        publisher.advance("c", 1)
    stats = publisher.statistics()
    assert (stats.pending, stats.kept, stats.dropped) == (2, 3, 1)
    assert publisher.flush(timeout=0.3) == 2  # still away: both left
    postgres_server.start()
    assert publisher.flush(timeout=20) == 0
    assert stored(dsn, "a") == 3
    assert stored(dsn, "b") == 1
    # kept again, then closed before the server is back: close says how many
    postgres_server.stop()
    publisher.check_and_complete("d")
    publisher.advance("e", 1)
    assert publisher.close(timeout=0.3) == 2
    assert publisher.statistics().dropped == 3
    [(_, _, dropped)] = log.named("aiopurgatory.postgres.publisher_dropped")
    assert dropped["triggers"] == 2
    with pytest.raises(PostgresTriggersClosedError):
        publisher.advance("f", 1)
    assert publisher.close() == 0
    postgres_server.start()


def test_what_cannot_be_kept_still_raises(postgres_server: PostgresServer) -> None:
    # A publisher on the application's connection keeps nothing: its advance is the
    # application's transaction's.
    conn = psycopg.connect(postgres_server.dsn, autocommit=True)
    on_conn = SyncPublisher(conn)
    on_conn.advance("k", 1)
    conn.close()
    with pytest.raises(PostgresTriggersError, match="closed"):
        on_conn.advance("k", 2)
    # The server refusing the statement for good (the table not ours to write):
    # raised, nothing kept.
    with psycopg.connect(postgres_server.dsn, autocommit=True) as admin:
        admin.execute("CREATE ROLE reader LOGIN")
        admin.execute("GRANT SELECT ON aiopurgatory_watermarks TO reader")
    dsn = postgres_server.dsn.replace("postgres@", "reader@")
    refused = SyncPublisher(dsn)
    with pytest.raises(PostgresTriggersError, match="permission denied"):
        refused.advance("k", 3)
    assert refused.statistics().pending == 0
    refused.close()
    assert failure_kind(psycopg.OperationalError("connection refused")) == "transient"
    assert (
        failure_kind(psycopg.OperationalError('password authentication failed for user "x"'))
        == "auth"
    )


def test_bad_arguments_are_refused() -> None:
    dsn = "postgresql://u@127.0.0.1:1/db"
    with pytest.raises(ValueError, match="max_pending"):
        SyncPublisher(dsn, max_pending=0)
    with pytest.raises(TypeError, match="max_pending"):
        SyncPublisher(dsn, max_pending=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reconnect_delay"):
        SyncPublisher(dsn, reconnect_delay=(2.0, 1.0))
    with pytest.raises(ValueError, match="close_timeout"):
        SyncPublisher(dsn, close_timeout=0)
    with pytest.raises(ValueError, match="timeout"):
        SyncPublisher(dsn).flush(-1)


def _in_child(work: Any) -> int:
    read, write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns that forking a process with threads may deadlock: that
        # is the case under test (a Celery prefork child).
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


def test_a_forked_child_publishes_on_a_connection_of_its_own(
    postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.dsn
    publisher = SyncPublisher(dsn, reconnect_delay=(0.05, 0.2))
    publisher.advance("parent", 1)  # the parent's connection exists
    postgres_server.stop()
    publisher.advance("parent", 2)  # kept in the parent: its thread runs

    def child_in_outage() -> dict[str, Any]:
        before = publisher.statistics().pending
        publisher.advance("child", 5)
        return {"before": before, "left": publisher.flush(timeout=20)}

    pid = _in_child(child_in_outage)
    time.sleep(0.3)
    postgres_server.start()
    assert publisher.flush(timeout=20) == 0
    # the child started with nothing kept and delivered its own
    assert _child_result(pid) == {"before": 0, "left": 0}

    def child_sends() -> dict[str, Any]:
        for value in range(100):
            publisher.advance("child-2", value)
        return {"sent": publisher.statistics().sent}

    pid = _in_child(child_sends)
    for value in range(100):
        publisher.advance("parent-2", value)  # the parent's connection, unharmed
    assert _child_result(pid) == {"sent": 100}
    assert stored(dsn, "parent") == 2
    assert stored(dsn, "child") == 5
    assert stored(dsn, "child-2") == 99
    assert stored(dsn, "parent-2") == 99
    assert publisher.close() == 0
