"""The SQL of a database trigger that publishes a job's end in the transaction that stores it.

Sans-IO: text only. For job systems whose jobs live in PostgreSQL (Procrastinate,
django-tasks' database backend): a row trigger on the job system's own table,
fired when a job's status column becomes an end, raises the job's watermark
(the table of :mod:`aiopurgatory.postgres`, the same atomic max) and NOTIFYs its
partition channel with the payload :mod:`aiopurgatory.postgres._wire` writes,
inside the writing transaction. Its commit wakes the waiters of every process;
its rollback wakes nobody and leaves no watermark. No worker code is involved,
so every path that ends a job (a worker, an admin, a manual UPDATE) publishes.

The partition of a key is CRC-32 of its stored form, modulo the partitions, as
:func:`aiopurgatory.postgres._wire.partition_of` computes it; PostgreSQL 15 has
no CRC-32, so the SQL defines ``"<channel>_crc32"`` (PL/pgSQL, a byte at a time
through a table; once per job end). No ``%`` anywhere: the text goes through
drivers that also format parameters.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

from ..postgres._sql import schema_sql as watermarks_sql
from ..postgres._sql import table_name
from ..postgres._wire import check_channel, check_partitions
from ._layout import END, JobEnd, check_namespace, job_key

__all__ = ["check_sql_namespace", "crc32_sql", "trigger_sql"]

# The dollar quote of the functions' bodies.
_QUOTE = "$aiopurgatory$"


def check_sql_namespace(namespace: object) -> str:
    """``namespace`` if it can be written into a function's body, else TypeError/ValueError."""
    namespace = check_namespace(namespace)
    if "$" in namespace or "\x00" in namespace:
        raise ValueError(f"namespace must not hold '$' or NUL characters, got {namespace!r}")
    return namespace


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _crc_table() -> list[int]:
    """zlib's CRC-32 table: reflected, polynomial 0xEDB88320, one entry per byte value."""
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
        table.append(crc)
    return table


def crc32_sql(channel: str) -> str:
    """``CREATE OR REPLACE FUNCTION "<channel>_crc32"(bytea) RETURNS bigint``: zlib's CRC-32.

    A byte at a time through the 256-entry table (a constant array: PL/pgSQL
    plans it once per session); a bit at a time took 8 times the iterations.
    """
    table = "{" + ",".join(map(str, _crc_table())) + "}"
    return (
        f'CREATE OR REPLACE FUNCTION "{channel}_crc32"(data bytea) RETURNS bigint\n'
        f"LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS {_QUOTE}\n"
        "DECLARE\n"
        "    crc bigint := 4294967295;\n"
        f"    t CONSTANT bigint[] := '{table}'::bigint[];\n"
        "BEGIN\n"
        "    FOR i IN 0 .. length(data) - 1 LOOP\n"
        "        crc := (crc >> 8) # t[((crc # get_byte(data, i)) & 255) + 1];\n"
        "    END LOOP;\n"
        "    RETURN crc # 4294967295;\n"
        "END\n"
        f"{_QUOTE};\n"
    )


def trigger_sql(
    *,
    system: str,
    table: str,
    id_column: str,
    status_column: str,
    ends: Mapping[str, JobEnd],
    namespace: str,
    channel: str,
    partitions: int,
) -> str:
    """The SQL that installs (again: idempotent; concurrent installs wait for each other,
    under a transaction-level advisory lock per channel) the trigger of one job system's table.

    Args:
        system: names the function and trigger (``"<channel>_<system>_ended"``,
            ``"<channel>_<system>_ends"``): letters, digits, underscores.
        table: the job table, as SQL (quoted if it must be).
        id_column, status_column: the columns (SQL identifiers) of the job's id
            (its text is the job id of the key) and of its status.
        ends: each status (as text) that ends a job, and its :class:`JobEnd`.
        namespace, channel, partitions: the waiters' (checked here).

    Raises:
        TypeError, ValueError: an unusable namespace, channel or partitions.
    """
    namespace = check_sql_namespace(namespace)
    channel = check_channel(channel)
    count = check_partitions(partitions)
    head = job_key(namespace, "")  # "job:<namespace>:", the id appended in SQL
    assert isinstance(head, str)
    crc = f'"{channel}_crc32"'
    function = f'"{channel}_{system}_ended"'
    trigger = f'"{channel}_{system}_ends"'
    cases = "".join(
        f"        WHEN {_literal(status)} THEN {end.value}\n" for status, end in ends.items()
    )
    statuses = ", ".join(_literal(status) for status in ends)
    # Installers serialised per channel, to the end of their transaction: two
    # processes installing at once (a web server's workers, each at start) had
    # CREATE OR REPLACE FUNCTION fail with "tuple concurrently updated" (18, 25 of 60
    # concurrent installs on PostgreSQL 15), CREATE TABLE IF NOT EXISTS with a
    # unique violation.
    lock = zlib.crc32(f"{channel} job-end trigger".encode())
    return (
        f"SELECT pg_advisory_xact_lock({lock});\n"
        + watermarks_sql(channel)
        + crc32_sql(channel)
        + f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger\n"
        f"LANGUAGE plpgsql AS {_QUOTE}\n"
        "DECLARE\n"
        f"    k text := {_literal(head)} || NEW.{id_column}::text;\n"
        "    stored bytea := convert_to('s' || k, 'UTF8');\n"
        f"    v float8 := {END!r} + CASE NEW.{status_column}::text\n"
        f"{cases}"
        "    END;\n"
        "BEGIN\n"
        f"    INSERT INTO {table_name(channel)} AS w (key, value) VALUES (stored, v)\n"
        "        ON CONFLICT (key) DO UPDATE\n"
        "        SET value = GREATEST(w.value, EXCLUDED.value), updated_at = now();\n"
        # The payload of _wire.notifications: version 1, the sender of a
        # transaction's triggers ("": applied by every process), no checks.
        f"    PERFORM pg_notify('{channel}_' || mod({crc}(stored), {count}),\n"
        "        json_build_array(1, '', json_build_array(), json_build_array(k, v))::text);\n"
        "    RETURN NULL;\n"
        "END\n"
        f"{_QUOTE};\n"
        f"DROP TRIGGER IF EXISTS {trigger} ON {table};\n"
        f"CREATE TRIGGER {trigger}\n"
        f"    AFTER UPDATE OF {status_column} ON {table}\n"
        f"    FOR EACH ROW WHEN (OLD.{status_column} IS DISTINCT FROM NEW.{status_column}\n"
        f"        AND NEW.{status_column}::text IN ({statuses}))\n"
        f"    EXECUTE FUNCTION {function}();\n"
    )
