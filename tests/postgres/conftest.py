"""Real PostgreSQL servers for the tests of aiopurgatory.postgres (tests/support/postgres.py)."""

from tests.support.postgres import postgres_server, postgres_server_factory  # noqa: F401
