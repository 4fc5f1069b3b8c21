"""The SQL of the PostgreSQL transport: the watermark table, the publish and the read.

Sans-IO: text only. One statement publishes a whole batch, in one round trip and
one transaction (the caller's, for ``advance_in``): the advanced keys' watermarks
are raised with an atomic max (``INSERT ... ON CONFLICT DO UPDATE SET value =
GREATEST(...)``, rows locked in key order so that two batches never deadlock)
and the notifications queued; PostgreSQL delivers them when the transaction
commits, and never if it rolls back, by which time the watermarks are visible
to the listeners' catch-up reads.
"""

from __future__ import annotations

from typing import Final

from ._wire import check_channel

__all__ = [
    "ASYNCPG",
    "PSYCOPG",
    "Placeholders",
    "create_sql",
    "exists_sql",
    "publish_sql",
    "read_sql",
    "schema_sql",
    "table_name",
]

#: ``$n`` for asyncpg, ``%s`` for psycopg.
Placeholders = tuple[str, str, str, str]
ASYNCPG: Final[Placeholders] = ("$1", "$2", "$3", "$4")
PSYCOPG: Final[Placeholders] = ("%s", "%s", "%s", "%s")


def table_name(channel: str) -> str:
    """The watermark table of ``channel``, quoted: ``"<channel>_watermarks"``."""
    return f'"{check_channel(channel)}_watermarks"'


def schema_sql(channel: str = "aiopurgatory") -> str:
    """The SQL that creates ``channel``'s watermark table, for a migration.

    ``PostgresTriggers`` and ``SyncPublisher`` create it on first use when it is
    missing (and the role may create tables); run this in a migration instead
    where the application's role may not. Idempotent (``IF NOT EXISTS``).

    Raises:
        TypeError, ValueError: ``channel`` is not 1 to 40 ASCII letters, digits
            or underscores, not starting with a digit.
    """
    return (
        f"CREATE TABLE IF NOT EXISTS {table_name(channel)} (\n"
        "    key bytea PRIMARY KEY,\n"
        "    value double precision NOT NULL,\n"
        "    updated_at timestamptz NOT NULL DEFAULT now()\n"
        ");\n"
    )


def publish_sql(channel: str, marks: Placeholders = ASYNCPG) -> str:
    """One statement: raise the watermarks of keys ``$1`` (bytea[]) to values ``$2``
    (float8[]) and NOTIFY payloads ``$4`` (text[]) on channels ``$3`` (text[]);
    it returns how many notifications it queued."""
    keys, values, channels, payloads = marks
    return (
        "WITH raised AS ("
        f"INSERT INTO {table_name(channel)} AS w (key, value) "
        f"SELECT k, v FROM unnest({keys}::bytea[], {values}::float8[]) AS a(k, v) ORDER BY k "
        "ON CONFLICT (key) DO UPDATE SET value = GREATEST(w.value, EXCLUDED.value), "
        "updated_at = now() RETURNING 1) "
        "SELECT count(*) FROM (SELECT pg_notify(c, p) "
        f"FROM unnest({channels}::text[], {payloads}::text[]) AS n(c, p)) AS sent"
    )


def read_sql(channel: str) -> str:
    """The stored watermarks of keys ``$1`` (bytea[]): rows ``(key, value)``."""
    return f"SELECT key, value FROM {table_name(channel)} WHERE key = ANY($1::bytea[])"


def exists_sql(channel: str) -> str:
    """One row: the watermark table's regclass, or NULL while it does not exist."""
    return f"SELECT to_regclass('{table_name(channel)}')"


def create_sql(channel: str) -> str:
    """:func:`schema_sql` behind a transaction-scoped advisory lock (two processes
    creating the table at once would otherwise race on the catalog), as one
    script to run inside a transaction."""
    return (
        f"SELECT pg_advisory_xact_lock(hashtext('aiopurgatory:' || '{table_name(channel)}'));\n"
        + schema_sql(channel)
    )
