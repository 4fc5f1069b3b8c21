"""The long-poll feed kept in PostgreSQL (``examples.longpoll.pgfeed``), in-process, on a real
server made by initdb: what only PostgreSQL gives (an append inside the application's own
transaction) and its failures. The program's acceptance tests run on it in
test_longpoll_redis.py (the ``store`` fixture).
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

import aiopurgatory as ap
from aiopurgatory.postgres.testing import PostgresServer
from examples.longpoll.feed import Appended, FeedError, Fetched, Settings
from examples.longpoll.pgfeed import PostgresWaiter, check_postgres, describe_dsn
from tests.support.postgres import ServerFactory

pytestmark = pytest.mark.realtime


@pytest.fixture
def server(postgres_server_factory: ServerFactory) -> PostgresServer:
    return postgres_server_factory(synchronous_commit="on")


async def until_parked(feed: Any) -> None:
    for _ in range(1000):
        if feed.parked:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the GET never parked")


async def test_an_append_rolled_back_with_the_application_s_transaction_wakes_nobody(
    server: PostgresServer,
) -> None:
    # Two processes' worth of feeds (each its own pool and PostgresTriggers): a GET parked
    # on one, the append made on the other inside a transaction that also writes the
    # application's own row.
    async with PostgresWaiter(server.dsn) as near, PostgresWaiter(server.dsn) as far:
        writer = near.make_feed(Settings())
        reader = far.make_feed(Settings())
        assert (await writer.append("orders", b"o-0")).offset == 0
        get = asyncio.create_task(reader.fetch("orders", 1, 30, 1))
        await until_parked(reader)
        assert near.pool is not None
        async with near.pool.acquire() as conn:
            await conn.execute("CREATE TABLE shipped (id int)")
            transaction = conn.transaction()
            await transaction.start()
            await conn.execute("INSERT INTO shipped VALUES (1)")
            assert await writer.append_in(conn, "orders", b"o-1") == Appended(1)
            await transaction.rollback()
            await asyncio.sleep(1.0)  # a notification would have arrived by now
            assert not get.done()
            assert await conn.fetchval("SELECT count(*) FROM shipped") == 0
            # the same, committed: the row, the message and the wake-up together
            async with conn.transaction():
                await conn.execute("INSERT INTO shipped VALUES (2)")
                assert await writer.append_in(conn, "orders", b"o-1 again") == Appended(1)
                await asyncio.sleep(0.3)
                assert not get.done()  # not before the commit
        assert await asyncio.wait_for(get, 10) == Fetched(1, ["o-1 again"], 2)
        assert (await reader.fetch("orders", 0, 0, 1)) == Fetched(0, ["o-0", "o-1 again"], 2)
        assert reader.answers["data"] == 1


async def test_a_connection_that_died_with_the_server_is_replaced(server: PostgresServer) -> None:
    async with PostgresWaiter(server.dsn) as waiter:
        feed = waiter.make_feed(Settings())
        assert (await feed.append("t", b"m0")).offset == 0
        # Restarted while this loop did not run: the pool's idle connection is dead, and
        # nothing has told the loop yet.
        server.restart()
        assert (await feed.fetch("t", 0, 0, 1)) == Fetched(0, ["m0"], 1)
        # The read went out again, on a new connection (and the health probe, every
        # 2 s, may have met a dead connection too on a slow machine: at least one).
        retried = waiter.retries
        assert retried >= 1
        server.restart()
        assert (await feed.append("t", b"m1")) == Appended(1)
        assert waiter.retries > retried
        assert (await feed.fetch("t", 0, 0, 1)) == Fetched(0, ["m0", "m1"], 2)  # stored once
        assert feed.unavailable == {"post": 0, "get": 0, "parked": 0}
        assert waiter.pg_ok


@pytest.mark.parametrize("when", ["before the GET parks", "while it is parked"])
async def test_a_paused_server_holds_a_parked_get_no_longer_than_the_command_timeout(
    server: PostgresServer, when: str
) -> None:
    async with PostgresWaiter(server.dsn, command_timeout=0.5) as waiter:
        feed = waiter.make_feed(Settings())
        await feed.append("t", b"m0")
        loop = asyncio.get_running_loop()
        started = loop.time()
        if when == "before the GET parks":
            server.pause()
            with pytest.raises(FeedError) as failed:
                await feed.fetch("t", 1, 1.0, 1)
            took = loop.time() - started
            server.resume()
            assert failed.value.status == 503
            assert took < 0.5 + 0.5 + 1.0  # its first read's deadline, and slack
            assert feed.unavailable["get"] == 1
            return
        get = asyncio.create_task(feed.fetch("t", 1, 1.0, 1))
        try:
            await until_parked(feed)
            server.pause()
            with pytest.raises(FeedError) as failed:
                await get
            took = loop.time() - started
        finally:
            server.resume()
        assert failed.value.status == 503
        # its wait (1 s), then its read's deadline (command_timeout + 0.5 s), and slack
        assert 1.0 <= took < 1.0 + 1.0 + 1.0
        assert feed.answers["early"] == 0
        assert feed.unavailable["parked"] == 1


async def test_a_waiter_that_cannot_reach_postgres_fails_and_leaves_nothing_open(
    server: PostgresServer,
) -> None:
    dsn = server.dsn
    server.stop()
    waiter = PostgresWaiter(dsn, command_timeout=1)
    with pytest.raises((OSError, asyncpg.PostgresError)):
        async with waiter:
            raise AssertionError("entered without PostgreSQL")
    assert waiter.triggers is None
    purgatory: ap.Purgatory[Any] = waiter.purgatory
    with pytest.raises(ap.PurgatoryClosedError):
        purgatory.try_complete_else_watch(ap.WatermarkOperation(1), {"t": 1})


def test_bad_arguments_are_refused_saying_why() -> None:
    with pytest.raises(ValueError, match="postgresql://"):
        PostgresWaiter("redis://127.0.0.1/0")
    with pytest.raises(ValueError, match="prefix"):
        PostgresWaiter("postgresql://u@h/db", prefix="Bad-Prefix")
    with pytest.raises(ValueError, match="pool_size"):
        PostgresWaiter("postgresql://u@h/db", pool_size=0)
    assert (
        describe_dsn("postgresql://app:s3cret@db:5433/shop") == "postgresql://app:***@db:5433/shop"
    )


def test_the_start_up_check_names_the_cause_never_the_password(server: PostgresServer) -> None:
    from examples.longpoll.pgfeed import PostgresUnavailable

    check_postgres(server.dsn)  # reachable: no error
    dsn = server.dsn.replace("postgres@", "postgres:pw-not-shown@").replace(
        "/postgres", "/no_such_db"
    )
    with pytest.raises(PostgresUnavailable) as refused:
        check_postgres(dsn)
    assert "no_such_db" in str(refused.value)
    assert "pw-not-shown" not in str(refused.value)


PASSWORD = "pw-Zq8x-not-in-logs"


def test_a_wrong_password_exits_at_once_naming_the_cause_and_the_right_one_serves(
    server: PostgresServer,
) -> None:
    import json
    import os
    import subprocess
    import sys
    import time

    import psycopg

    from tests.support.longpoll import ROOT, Program

    with psycopg.connect(server.dsn, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE app LOGIN PASSWORD '{PASSWORD}'")
        admin.execute("GRANT ALL ON SCHEMA public TO app")
    # TCP connections need a password from now on (the socket stays trusted).
    (server.data / "pg_hba.conf").write_text(
        "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
    )
    with psycopg.connect(server.dsn, autocommit=True) as admin:  # read at the reload only
        admin.execute("SELECT pg_reload_conf()")
    right = f"postgresql://app:{PASSWORD}@127.0.0.1:{server.port}/postgres"
    wrong = right.replace(PASSWORD, "Wr0ngPass-xyz")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "examples.longpoll", "--port", "0", "--postgres", wrong],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert time.monotonic() - started < 15
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "authentication" in lines[0]
    assert "Wr0ngPass-xyz" not in done.stderr + done.stdout
    # the right password, from the environment: serves, and shows it in no log line
    p = Program(env=dict(os.environ, LONGPOLL_POSTGRES=right))
    try:
        assert "***" in p.first["postgres"]
        assert p.get_json("/topics/t", "POST", b"x") == {"offset": 0}
        code, lines_ = p.stop()
        assert code == 0
        assert PASSWORD not in json.dumps([p.first, *p.early, *lines_])
    finally:
        if p.proc.poll() is None:
            p.proc.kill()
