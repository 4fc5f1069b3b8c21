"""aiopurgatory.postgres against a real PostgreSQL: triggers and watermarks across processes."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import asyncpg
import pytest

import aiopurgatory as ap
from aiopurgatory.postgres import (
    PostgresTriggers,
    PostgresTriggersClosedError,
    PostgresTriggersError,
    schema_sql,
)
from aiopurgatory.postgres._wire import MAX_PAYLOAD, Batch, decode, notifications
from tests.support.postgres import PostgresServer, Worker, connected, eventually

pytestmark = pytest.mark.realtime


def purgatory(name: str = "p") -> ap.Purgatory[ap.DelayedOperation]:
    return ap.Purgatory(name)


async def test_an_advance_in_one_instance_completes_an_op_parked_in_another(
    postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.dsn
    async with (
        PostgresTriggers(None, dsn) as publisher,
        PostgresTriggers(purgatory(), dsn) as waiter,
    ):
        assert isinstance(waiter, ap.Triggers)
        op = ap.WatermarkOperation(10)
        watching = asyncio.ensure_future(waiter.watch(op, {"orders": 5}))
        await eventually(lambda: waiter._listener is not None and waiter._listener.listening == 1)
        publisher.advance("orders", 4)
        await publisher.flush()
        await asyncio.sleep(0.05)
        assert not watching.done()  # below the threshold
        publisher.advance("orders", 5)
        assert await asyncio.wait_for(watching, 5) is ap.Outcome.COMPLETED
        assert await waiter.fetch_watermark("orders") == 5
        stats = waiter.statistics()
        assert isinstance(stats, ap.TriggersStatistics)
        assert stats.received == 2
        assert stats.completed == 1
        assert stats.connected
        assert publisher.statistics().published == 2


async def test_a_watch_after_the_advance_catches_up_from_the_table_whatever_its_timeout(
    postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.dsn
    async with (
        PostgresTriggers(None, dsn) as publisher,
        PostgresTriggers(purgatory(), dsn) as waiter,
    ):
        publisher.advance(b"\x00\xffraw", 7)
        publisher.advance(42, 1.5)
        await publisher.flush()
        # Nothing here watched them: only the table has them.
        for timeout in (0, 0.01, 5):
            op = ap.WatermarkOperation(timeout)
            assert await waiter.watch(op, {b"\x00\xffraw": 7}) is ap.Outcome.COMPLETED
        assert await waiter.watch(ap.WatermarkOperation(0), {42: 1.5}) is ap.Outcome.COMPLETED
        # Not met: a timeout of 0 expires (never early, never held past its read).
        assert await waiter.watch(ap.WatermarkOperation(0), {42: 2}) is ap.Outcome.EXPIRED


async def test_str_int_and_bytes_keys_stay_distinct_and_nul_characters_are_stored(
    postgres_server: PostgresServer,
) -> None:
    async with PostgresTriggers(purgatory(), postgres_server.dsn) as triggers:
        triggers.advance("1", 1)
        triggers.advance(1, 2)
        triggers.advance(b"1", 3)
        triggers.advance("nul\x00é", 4)
        await triggers.flush()
        assert [await triggers.fetch_watermark(k) for k in ("1", 1, b"1", "nul\x00é")] == [
            1,
            2,
            3,
            4,
        ]
        assert await triggers.fetch_watermark("never") is None
        # The atomic max: a lower value changes nothing.
        triggers.advance("1", 0)
        await triggers.flush()
        assert await triggers.fetch_watermark("1") == 1


async def test_ops_parked_in_another_process_complete_and_a_process_watching_nothing_gets_nothing(
    postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.dsn
    worker = Worker(dsn, health_check_interval=1.0)
    idle = Worker(dsn)
    try:
        await worker.start()
        await idle.start()
        worker.send(cmd="watch", id=1, key="topic-0", threshold=3, timeout=10)
        await worker.expect("watching", id=1)
        for _ in range(500):
            if (await worker.request("covers", key="topic-0"))["covers"]:
                break
            await asyncio.sleep(0.01)
        async with PostgresTriggers(None, dsn) as publisher:
            publisher.advance("topic-0", 3)
            await publisher.flush()
        done = await worker.expect("done", id=1)
        assert done["outcome"] == "COMPLETED"
        assert done["elapsed"] < 5
        stats = await idle.request("stats")
        assert stats["received"] == 0
        assert stats["listening"] == 0
        assert (await worker.request("stats"))["received"] == 1
    finally:
        assert await worker.close() == 0
        assert await idle.close() == 0


async def test_one_loop_iterations_triggers_leave_in_one_statement_and_big_batches_split(
    postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.dsn
    async with connected(dsn) as listener:
        payloads: list[str] = []
        async with PostgresTriggers(None, dsn, partitions=1) as publisher:
            await listener.add_listener("aiopurgatory_0", lambda *a: payloads.append(a[3]))
            for i in range(2000):
                publisher.advance(f"key-{i:05d}-" + "x" * 20, i)
            publisher.check_and_complete("checked")
            await publisher.flush()
            await eventually(lambda: sum(len(decode(p)[2]) for p in payloads) == 2000)
            assert all(len(p.encode()) <= MAX_PAYLOAD for p in payloads)
            assert len(payloads) > 1
            assert publisher.statistics().published == len(payloads)
            assert next(decode(p)[1] for p in payloads) == ["checked"]
            # One statement: a single commit, so the payloads arrived as one run.
            count = await listener.fetchval('SELECT count(*) FROM "aiopurgatory_watermarks"')
            assert count == 2000


def test_payloads_are_split_below_postgresql_limit_and_keep_every_trigger() -> None:
    batch = Batch()
    for i in range(500):
        batch.advance(b"\xff" * 100 + str(i).encode(), i + 0.5)
        batch.check(f"c{i}" * 30)
    channels, payloads = notifications("me", batch, "chan", 4)
    assert all(len(p.encode("ascii")) <= MAX_PAYLOAD for p in payloads)
    advances = [a for p in payloads for a in decode(p)[2]]
    checks = [c for p in payloads for c in decode(p)[1]]
    assert sorted(v for _, v in advances) == [i + 0.5 for i in range(500)]
    assert len(checks) == 500
    assert set(channels) <= {f"chan_{n}" for n in range(4)}


async def test_bad_arguments_are_refused_naming_them_and_nothing_is_sent(
    postgres_server: PostgresServer,
) -> None:
    with pytest.raises(ValueError, match="channel"):
        PostgresTriggers(None, postgres_server.dsn, channel="no-dashes")
    with pytest.raises(TypeError, match="dsn_or_pool"):
        PostgresTriggers(None, 5432)
    with pytest.raises(ValueError, match="dsn_or_pool"):
        PostgresTriggers(None, "redis://localhost")
    with pytest.raises(ValueError, match="partitions"):
        PostgresTriggers(None, postgres_server.dsn, partitions=0)
    triggers = PostgresTriggers(purgatory(), postgres_server.dsn)
    with pytest.raises(PostgresTriggersClosedError, match="async with"):
        triggers.advance("k", 1)
    async with triggers:
        with pytest.raises(TypeError, match="key"):
            triggers.advance(("a", 1), 1)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="value"):
            triggers.advance("k", True)
        with pytest.raises(ValueError, match="finite"):
            triggers.advance("k", float("nan"))
        with pytest.raises(ValueError, match="too long"):
            triggers.check_and_complete("x" * 5000)
        with pytest.raises(TypeError, match="key"):
            await triggers.watch(ap.WatermarkOperation(1), {1.5: 2})
        assert triggers.statistics().triggers == 0
        assert triggers._purgatory is not None
        assert triggers._purgatory.watched == 0
    with pytest.raises(PostgresTriggersClosedError, match="closed"):
        triggers.check_and_complete("k")


async def test_an_unreachable_server_fails_the_start_with_a_clear_error_without_the_password(
    postgres_server: PostgresServer,
) -> None:
    dsn = f"postgresql://postgres:s3cret@127.0.0.1:{postgres_server.port + 1}/postgres"
    triggers = PostgresTriggers(purgatory(), dsn, command_timeout=2)
    with pytest.raises(PostgresTriggersError, match="cannot start on") as caught:
        await triggers.__aenter__()
    assert "s3cret" not in str(caught.value)
    assert "s3cret" not in repr(triggers)


def test_a_virtual_time_loop_is_refused_at_once_pointing_to_local_triggers() -> None:
    from aiopurgatory import simulation

    async def main() -> None:
        PostgresTriggers(None, "postgresql://nowhere/db")

    with pytest.raises(RuntimeError, match=r"virtual-time.*LocalTriggers"):
        simulation.run(main())


async def test_the_table_is_created_on_first_use_or_by_schema_sql_in_a_migration(
    postgres_server: PostgresServer,
) -> None:
    conn = await asyncpg.connect(postgres_server.dsn)
    try:
        await conn.execute(schema_sql("billing"))
        await conn.execute(schema_sql("billing"))  # idempotent
        async with PostgresTriggers(None, postgres_server.dsn, channel="billing") as triggers:
            triggers.advance("invoice", 3)
            await triggers.flush()
        assert await conn.fetchval('SELECT value FROM "billing_watermarks"') == 3
        async with PostgresTriggers(None, postgres_server.dsn, channel="fresh"):
            pass
        assert await conn.fetchval("SELECT to_regclass('\"fresh_watermarks\"')") is not None
    finally:
        await conn.close()


async def test_an_asyncpg_pool_is_used_and_left_open(postgres_server: PostgresServer) -> None:
    pool = await asyncpg.create_pool(postgres_server.dsn, min_size=1, max_size=4)
    try:
        async with (
            PostgresTriggers(None, pool) as publisher,
            PostgresTriggers(purgatory(), pool) as waiter,
        ):
            watching = asyncio.ensure_future(waiter.watch(ap.WatermarkOperation(10), {"k": 1}))
            await eventually(lambda: waiter.statistics().listening == 1)
            publisher.advance("k", 1)
            assert await asyncio.wait_for(watching, 5) is ap.Outcome.COMPLETED
        assert await pool.fetchval("SELECT 1") == 1
    finally:
        await pool.close()


async def test_statistics_are_a_frozen_dataclass_with_the_protocol_fields(
    postgres_server: PostgresServer,
) -> None:
    async with PostgresTriggers(purgatory("named"), postgres_server.dsn) as triggers:
        stats = triggers.statistics()
        assert dataclasses.is_dataclass(stats)
        with pytest.raises(dataclasses.FrozenInstanceError):
            stats.triggers = 3  # type: ignore[misc]
        assert stats.purgatory == "named"
        assert stats.pending == 0
        json.dumps(dataclasses.asdict(stats))
