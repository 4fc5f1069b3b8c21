"""The long-poll example's shared stores, one fixture for both: ``store`` runs a test once on
a real ``redis-server`` (``--redis URL``) and once on a real PostgreSQL (``--postgres
DSN``), each started by the test on a free port in a temporary directory.

A :class:`Store` gives the command-line arguments that point a server at it, kills
it (as a crash: ``redis-server`` SIGKILLed, PostgreSQL's immediate shutdown, which
ends every backend at once and recovers from its log at the next start) and
starts it again on the same port and data. Both are durable at acknowledgement:
Redis with ``appendfsync always``, PostgreSQL with ``synchronous_commit=on`` (its
``fsync=off`` loses nothing when only the processes die), so a test may require
every acknowledged POST to survive the crash.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import pytest

from aiopurgatory.postgres.testing import PostgresServer
from aiopurgatory.redis.testing import RedisServer
from tests.support.postgres import postgres_server_factory

__all__ = ["STORES", "Store", "postgres_server_factory", "store"]

STORES = ("redis", "postgres")


class Store:
    """A running store of the long-poll feed (see the module's docs)."""

    def __init__(self, name: str, server: RedisServer | PostgresServer) -> None:
        self.name = name
        self.server = server

    @property
    def option(self) -> str:
        """The server's option: ``--redis`` or ``--postgres``."""
        return f"--{self.name}"

    @property
    def address(self) -> str:
        """The Redis URL or the PostgreSQL DSN."""
        if isinstance(self.server, RedisServer):
            return self.server.url
        return self.server.dsn

    @property
    def args(self) -> list[str]:
        """The server's arguments pointing at this store."""
        return [self.option, self.address]

    @property
    def env(self) -> str:
        """The environment variable the server reads when the option is not given."""
        return f"LONGPOLL_{self.name.upper()}"

    def kill(self) -> None:
        """Crash it: every connection ends at once, nothing is shut down cleanly."""
        server = self.server
        if isinstance(server, RedisServer):
            server.kill()
            return
        proc, server.proc = server.proc, None
        assert proc is not None
        proc.send_signal(signal.SIGQUIT)  # PostgreSQL's immediate shutdown
        proc.wait(30)

    def start(self) -> None:
        """Start it again on the same port and data."""
        self.server.start()

    def idempotency_ttl_ms(self, topic: str, key: str) -> float:
        """Milliseconds the record of a client's ``Idempotency-Key`` on ``topic`` has left."""
        if isinstance(self.server, RedisServer):
            import redis

            client = redis.Redis(port=self.server.port)
            try:
                return float(client.pttl(f"longpoll:{{t:{topic}}}:idem:c:{key}"))
            finally:
                client.close()
        import psycopg

        with psycopg.connect(self.server.dsn) as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM expires - clock_timestamp()) * 1000 "
                "FROM longpoll_idempotency WHERE topic = %s AND token = %s",
                (topic, f"c:{key}"),
            ).fetchone()
        assert row is not None, "no idempotency record"
        return float(row[0])


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Store:
    """A running Redis or PostgreSQL for the long-poll feed (the test runs on each)."""
    name: str = request.param
    server: Any
    if name == "redis":
        server = request.getfixturevalue("redis_server")
    else:
        factory: Callable[..., PostgresServer] = request.getfixturevalue("postgres_server_factory")
        server = factory(synchronous_commit="on", max_connections="150")
    return Store(name, server)
