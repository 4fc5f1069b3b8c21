"""The long-poll example's stores: ``store`` runs a test on Redis and on PostgreSQL."""

from tests.support.stores import postgres_server_factory, store  # noqa: F401
