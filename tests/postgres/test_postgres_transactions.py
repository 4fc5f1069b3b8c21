"""advance_in: waiters wake when the writer's transaction commits, never when it rolls back."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import asyncpg
import psycopg
import pytest

import aiopurgatory as ap
from aiopurgatory.postgres import PostgresTriggers, PostgresTriggersClosedError, SyncPublisher
from tests.support.postgres import ROOT, PostgresServer, connected, parked

pytestmark = pytest.mark.realtime


async def test_asyncpg_commit_wakes_every_process_and_rollback_wakes_nobody(
    postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.dsn
    async with connected(dsn) as conn:
        await conn.execute("CREATE TABLE orders (id int)")
        async with (
            PostgresTriggers(ap.Purgatory("writer"), dsn) as writer,
            PostgresTriggers(ap.Purgatory("other"), dsn) as other,
        ):
            here = await parked(writer, "order-1", 1)  # in the writer's own process too
            there = await parked(other, "order-1", 1)
            tx = conn.transaction()
            await tx.start()
            await conn.execute("INSERT INTO orders VALUES (1)")
            await writer.advance_in(conn, "order-1", 1)
            await asyncio.sleep(0.3)
            assert not here.done()
            assert not there.done()
            await tx.commit()
            assert await asyncio.wait_for(there, 5) is ap.Outcome.COMPLETED
            assert await asyncio.wait_for(here, 5) is ap.Outcome.COMPLETED
            assert await other.fetch_watermark("order-1") == 1

            here = await parked(writer, "order-2", 1)
            there = await parked(other, "order-2", 1)
            tx = conn.transaction()
            await tx.start()
            await writer.advance_in(conn, "order-2", 1)
            await tx.rollback()
            await asyncio.sleep(0.5)
            assert not here.done()
            assert not there.done()
            assert await other.fetch_watermark("order-2") is None
            assert other.statistics().received == 1  # the commit's only
            here.cancel()
            there.cancel()


async def test_psycopg_async_connection_commit_wakes_and_rollback_does_not(
    postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.dsn
    async with (
        await psycopg.AsyncConnection.connect(dsn) as conn,
        PostgresTriggers(ap.Purgatory("w"), dsn) as triggers,
    ):
        committed = await parked(triggers, "committed", 1)
        async with conn.transaction():
            await triggers.advance_in(conn, "committed", 1)
            await asyncio.sleep(0.3)
            assert not committed.done()  # not committed yet
        assert await asyncio.wait_for(committed, 5) is ap.Outcome.COMPLETED

        kept = await parked(triggers, "kept", 1)

        async def fail_in_a_transaction() -> None:
            async with conn.transaction():
                await triggers.advance_in(conn, "kept", 1)
                raise ZeroDivisionError  # the block fails: psycopg rolls it back

        with pytest.raises(ZeroDivisionError):
            await fail_in_a_transaction()
        await asyncio.sleep(0.5)
        assert not kept.done()
        assert await triggers.fetch_watermark("kept") is None
        kept.cancel()


async def test_advance_in_refuses_what_is_not_a_supported_connection(
    postgres_server: PostgresServer,
) -> None:
    sync_conn = psycopg.connect(postgres_server.dsn)
    triggers = PostgresTriggers(None, postgres_server.dsn)
    conn = await asyncpg.connect(postgres_server.dsn)
    with pytest.raises(PostgresTriggersClosedError):
        await triggers.advance_in(conn, "k", 1)
    await conn.close()
    async with triggers:
        with pytest.raises(TypeError, match=r"SyncPublisher\.advance_in"):
            await triggers.advance_in(sync_conn, "k", 1)
        with pytest.raises(TypeError, match="conn"):
            await triggers.advance_in(object(), "k", 1)
    sync_conn.close()


async def test_sync_publisher_advance_in_a_django_style_connection_wakes_on_commit_only(
    postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.dsn
    conn = psycopg.connect(dsn)  # autocommit off, as Django's connection.connection in atomic()
    publisher = SyncPublisher(dsn)
    async with PostgresTriggers(ap.Purgatory("w"), dsn) as triggers:
        committed = await parked(triggers, "job-1", 2)
        rolled = await parked(triggers, "job-2", 2)

        def write() -> None:
            publisher.advance_in(conn, "job-1", 2)
            publisher.advance_in(conn, "job-2", 2)

        await asyncio.to_thread(write)
        await asyncio.sleep(0.3)
        assert not committed.done()
        await asyncio.to_thread(conn.commit)
        assert await asyncio.wait_for(committed, 5) is ap.Outcome.COMPLETED
        assert await asyncio.wait_for(rolled, 5) is ap.Outcome.COMPLETED  # same transaction

        rolled = await parked(triggers, "job-3", 1)
        await asyncio.to_thread(publisher.advance_in, conn, "job-3", 1)
        await asyncio.to_thread(conn.rollback)
        await asyncio.sleep(0.5)
        assert not rolled.done()
        rolled.cancel()
    publisher.close()
    conn.close()
    with pytest.raises(PostgresTriggersClosedError):
        publisher.advance("k", 1)


async def test_sync_publisher_in_another_process_wakes_parked_ops(
    postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.dsn
    script = textwrap.dedent(
        f"""
        import psycopg
        from aiopurgatory.postgres import SyncPublisher
        with SyncPublisher({dsn!r}) as publisher:
            publisher.advance("from-sync", 10)
            publisher.check_and_complete("checked")
        conn = psycopg.connect({dsn!r})
        with conn.transaction():
            SyncPublisher(conn).advance("on-conn", 1)
        conn.close()
        """
    )
    async with PostgresTriggers(ap.Purgatory("w"), dsn) as triggers:
        first = await parked(triggers, "from-sync", 10)
        second = await parked(triggers, "on-conn", 1)
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", script],
            cwd=ROOT,
            capture_output=True,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 0, done.stderr.decode()
        assert await asyncio.wait_for(first, 5) is ap.Outcome.COMPLETED
        assert await asyncio.wait_for(second, 5) is ap.Outcome.COMPLETED
        assert await triggers.fetch_watermark("from-sync") == 10


async def test_one_sync_publisher_shared_by_threads_keeps_the_highest_value(
    postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.dsn
    with SyncPublisher(dsn) as publisher:

        def advance_many(offset: int) -> None:
            for value in range(offset, 200, 4):
                publisher.advance("shared", value)

        await asyncio.gather(*(asyncio.to_thread(advance_many, n) for n in range(4)))
        assert publisher.published == 200
    async with PostgresTriggers(None, dsn) as triggers:
        assert await triggers.fetch_watermark("shared") == 199
