"""Faults: a restarted server, a killed listener, a paused server, a long transaction.

Each: parked operations whose keys advanced meanwhile complete within the
documented bound (docs/postgres.md), nothing waits past its timeout, nothing is
lost, and the fault is counted in ``statistics()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import asyncpg
import pytest

import aiopurgatory as ap
from aiopurgatory.postgres import PostgresTriggers, SyncPublisher
from tests.support.postgres import PostgresServer, eventually, parked

pytestmark = pytest.mark.realtime

# Losses found by the connection's end (a killed backend, a restart) need no health
# check: a long interval, so that a loaded machine never fails one spuriously.
FAST: dict[str, Any] = {
    "health_check_interval": 5.0,
    "reconnect_delay": (0.05, 0.5),
    "command_timeout": 1.0,
}


def gate_reconnects(triggers: PostgresTriggers) -> asyncio.Event:
    """Hold the listener's reconnections until the event is set: what is committed
    meanwhile reaches it only through the resync."""
    listener = triggers._listener
    assert listener is not None
    gate = asyncio.Event()
    connect = listener.connect

    async def held() -> Any:
        await gate.wait()
        return await connect()

    listener.connect = held  # type: ignore[method-assign]
    return gate


async def expires_on_time(watching: asyncio.Future[ap.Outcome], expiry: float) -> None:
    start = time.perf_counter()
    assert await asyncio.wait_for(watching, expiry + 5) is ap.Outcome.EXPIRED
    assert time.perf_counter() - start < expiry + 1.0


async def test_a_killed_listener_backend_is_replaced_and_what_was_committed_meanwhile_completes(
    postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.dsn
    admin = await asyncpg.connect(dsn)
    try:
        await _killed_listener(dsn, admin)
    finally:
        await admin.close()


async def _killed_listener(dsn: str, admin: asyncpg.Connection) -> None:
    async with PostgresTriggers(ap.Purgatory("w"), dsn, **FAST) as triggers:
        listener = triggers._listener
        assert listener is not None
        watching = await parked(triggers, "k", 5)
        short = await parked(triggers, "never", 1, expiry=1.0)
        gate = gate_reconnects(triggers)
        pid = listener.connection.get_server_pid()
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        await eventually(lambda: not listener.connected)
        await asyncio.to_thread(_advance, dsn, "k", 5)  # while nobody listens here
        await expires_on_time(short, 1.0)  # an outage holds no one past its timeout
        stats = triggers.statistics()
        assert not watching.done(), (stats.received, stats.resyncs, stats.reads, stats.reconnects)
        gate.set()
        start = time.perf_counter()
        assert await asyncio.wait_for(watching, 5) is ap.Outcome.COMPLETED
        assert time.perf_counter() - start < 2.0  # reconnect backoff + one read
        stats = triggers.statistics()
        assert stats.reconnects == 1
        assert stats.connection_errors >= 1
        assert stats.resyncs >= 2  # the start's and the reconnection's
        assert stats.connected


def _advance(dsn: str, key: str, value: float) -> None:
    with SyncPublisher(dsn) as publisher:
        publisher.advance(key, value)


async def test_a_restarted_server_strands_nothing_parked_or_pending(
    postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.dsn
    async with (
        PostgresTriggers(ap.Purgatory("w"), dsn, **FAST) as waiter,
        PostgresTriggers(None, dsn, **FAST) as publisher,
    ):
        before = await parked(waiter, "before", 1)
        during = await parked(waiter, "during", 1)
        await asyncio.to_thread(postgres_server.stop)
        publisher.advance("during", 1)  # kept while the server is down, sent after
        await asyncio.sleep(0.5)
        assert publisher.statistics().pending == 1
        assert publisher.statistics().publish_errors >= 1
        await asyncio.to_thread(postgres_server.start)
        await asyncio.to_thread(_advance, dsn, "before", 1)
        assert await asyncio.wait_for(before, 10) is ap.Outcome.COMPLETED
        assert await asyncio.wait_for(during, 10) is ap.Outcome.COMPLETED
        await asyncio.wait_for(publisher.flush(), 10)
        assert publisher.statistics().pending == 0
        assert await waiter.fetch_watermark("during") == 1
        await eventually(lambda: waiter.statistics().reconnects >= 1)
        assert waiter.statistics().last_error is not None


async def test_a_paused_server_is_found_by_the_health_check_and_nothing_waits_past_its_timeout(
    postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.dsn
    options = {**FAST, "health_check_interval": 0.5}
    async with PostgresTriggers(ap.Purgatory("w"), dsn, **options) as triggers:
        watching = await parked(triggers, "k", 1)
        short = await parked(triggers, "other", 1, expiry=1.5)
        postgres_server.pause()
        try:
            await expires_on_time(short, 1.5)
            # A timeout of 0 reads first, bounded by command_timeout (1 s), then expires.
            start = time.perf_counter()
            zero = triggers.watch(ap.WatermarkOperation(0), {"k": 1})
            assert await asyncio.wait_for(zero, 5) is ap.Outcome.EXPIRED
            assert time.perf_counter() - start < 1.0 + 1.5
            await eventually(lambda: triggers.statistics().health_check_failures >= 1, 5)
            assert not triggers.connected
        finally:
            postgres_server.resume()
        await asyncio.to_thread(_advance, dsn, "k", 1)
        # Bound: the health check found it (2 intervals), a reconnection, one read.
        assert await asyncio.wait_for(watching, 10) is ap.Outcome.COMPLETED
        await eventually(lambda: triggers.connected, 10)
        assert triggers.statistics().reconnects >= 1


async def test_a_long_transaction_holding_the_notify_queue_is_reported_and_wakes_go_on(
    postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.dsn
    # Another application's session: LISTENing, then idle in a transaction. It
    # reads no notification until it ends, so the queue's tail stays behind it.
    holder = await asyncpg.connect(dsn)
    try:
        await _held_queue(dsn, holder)
    finally:
        await holder.close()


async def _held_queue(dsn: str, holder: asyncpg.Connection) -> None:
    await holder.add_listener("aiopurgatory_0", lambda *a: None)
    await holder.execute("BEGIN; SELECT 1")
    options = {**FAST, "health_check_interval": 0.5}
    async with (
        PostgresTriggers(ap.Purgatory("w"), dsn, partitions=1, **options) as waiter,
        PostgresTriggers(None, dsn, partitions=1, **options) as publisher,
    ):
        for round_ in range(20):
            watching = await parked(waiter, f"k{round_}", 1)
            for i in range(50):
                publisher.advance(f"filler-{round_}-{i}-" + "x" * 100, i)
            publisher.advance(f"k{round_}", 1)
            assert await asyncio.wait_for(watching, 5) is ap.Outcome.COMPLETED
        await eventually(lambda: (waiter.statistics().queue_usage or 0) > 0, 5)
        await holder.execute("COMMIT")
        await eventually(lambda: waiter.statistics().queue_usage == 0, 5)


async def test_a_release_cancelled_midway_gives_the_pools_connection_back(
    postgres_server: PostgresServer,
) -> None:
    # The task giving a pool's connection back is cancelled (a close() cancelled,
    # say) while the pool resets it, or just after: the caller gets its
    # CancelledError, not an InterfaceError from a detached proxy (which a
    # listener took for a failure to recover from, and went on listening), and
    # the pool has the connection again (or a new one in its place), so that its
    # close() does not wait forever.
    from aiopurgatory.postgres._connections import Source

    pool = await asyncpg.create_pool(postgres_server.dsn, min_size=1, max_size=1)
    try:
        source = Source(pool, command_timeout=5.0, reconnect_delay=(0.1, 1.0))
        # Cancelled at once (the pool's shielded release under way), and when it
        # has just finished (the proxy detached) but the task has not resumed yet.
        for spins in [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20] * 5:
            connection = await source.acquire()
            await connection.execute("LISTEN somewhere")  # a reset with work to do
            releasing = asyncio.ensure_future(source.release(connection))
            for _ in range(spins):
                await asyncio.sleep(0)
            releasing.cancel()
            # Cancelled, or done before the cancel came: nothing else.
            with contextlib.suppress(asyncio.CancelledError):
                await releasing
            async with asyncio.timeout(5):
                again = await pool.acquire()
            assert await again.fetchval("SELECT 1") == 1
            await pool.release(again)
        async with asyncio.timeout(10):
            await pool.close()
    finally:
        pool.terminate()
