"""Table layouts of the pipeline: event log input, trace input, fact table output.

Column names are plain constants, so modules that never start Spark (the
single-process replay, the trace generator) can use them; the Spark
``StructType`` builders import pyspark only when called.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "CORRUPT_COLUMN",
    "EVENT_FIELDS",
    "FACT_COLUMNS",
    "OUTCOMES",
    "TRACE_COLUMNS",
    "event_schema",
    "fact_arrow_schema",
    "fact_ddl",
    "fact_schema",
    "trace_arrow_schema",
    "trace_schema",
]

#: The op outcomes of an event (``aiopurgatory.Outcome`` values).
OUTCOMES: Final = ("completed", "expired", "cancelled", "failed")

#: Where Spark's PERMISSIVE JSON parser puts a line it cannot parse.
CORRUPT_COLUMN: Final = "_corrupt_record"

#: Event log schema 2 (see ``docs/events.md``): field name -> Spark SQL type. Schema 1
#: is the same without ``error`` (read as null).
EVENT_FIELDS: Final[dict[str, str]] = {
    "schema": "bigint",
    "event": "string",
    "ts": "double",
    "purgatory": "string",
    "op_id": "string",  # any JSON value; numbers keep their text
    "op_type": "string",
    "keys": "array<string>",
    "timeout": "double",
    "watched_at": "double",
    "finished_at": "double",
    "outcome": "string",
    "error": "string",
    "wait": "double",
    "lateness": "double",
}

#: The per-op fact table written by both ``analyze`` and ``replay``: name -> Spark SQL type.
#: ``scenario`` is ``"observed"`` for event logs and the parameter set for replays;
#: ``source`` is the event log file or the trace; the rest are the event's fields
#: (``error`` null for no error, and for events of schema 1, which had no answer).
FACT_COLUMNS: Final[dict[str, str]] = {
    "scenario": "string",
    "source": "string",
    # An event's fields keep their types (one declaration of each: EVENT_FIELDS).
    **{
        name: EVENT_FIELDS[name]
        for name in (
            "purgatory",
            "op_id",
            "op_type",
            "keys",
            "timeout",
            "watched_at",
            "finished_at",
            "outcome",
            "error",
            "wait",
            "lateness",
            "ts",
        )
    },
}

#: A request trace: name -> Spark SQL type. ``acks`` is 0, 1 or -1 (all);
#: ``replica_delays`` holds one ack delay in seconds per follower, null (or
#: infinite) for a follower that never acknowledges.
TRACE_COLUMNS: Final[dict[str, str]] = {
    "request_id": "bigint",
    "broker": "int",
    "topic": "string",
    "partition": "int",
    "arrival": "double",
    "acks": "int",
    "replica_delays": "array<double>",
}


def _spark_type(ddl: str) -> Any:
    from pyspark.sql import types

    if ddl.startswith("array<") and ddl.endswith(">"):
        return types.ArrayType(_spark_type(ddl[6:-1]), containsNull=True)
    simple = {
        "bigint": types.LongType,
        "int": types.IntegerType,
        "string": types.StringType,
        "double": types.DoubleType,
    }
    return simple[ddl]()


def _struct(fields: dict[str, str]) -> Any:
    from pyspark.sql import types

    return types.StructType(
        [types.StructField(name, _spark_type(ddl), nullable=True) for name, ddl in fields.items()]
    )


def event_schema() -> Any:
    """The explicit Spark schema of event log lines, plus the corrupt-record column."""
    return _struct({**EVENT_FIELDS, CORRUPT_COLUMN: "string"})


def fact_schema() -> Any:
    """The Spark schema of the per-op fact table."""
    return _struct(FACT_COLUMNS)


def _arrow_type(ddl: str) -> Any:
    import pyarrow as pa

    if ddl.startswith("array<") and ddl.endswith(">"):
        return pa.list_(_arrow_type(ddl[6:-1]))
    simple = {"bigint": pa.int64, "int": pa.int32, "string": pa.string, "double": pa.float64}
    return simple[ddl]()


def fact_arrow_schema() -> Any:
    """The fact table's Arrow schema (what the replay builds, and Spark's ``mapInArrow`` takes)."""
    import pyarrow as pa

    return pa.schema([(name, _arrow_type(ddl)) for name, ddl in FACT_COLUMNS.items()])


def trace_arrow_schema() -> Any:
    """A request trace's Arrow schema (as ``trace.write_trace`` writes it)."""
    import pyarrow as pa

    return pa.schema([(name, _arrow_type(ddl)) for name, ddl in TRACE_COLUMNS.items()])


def fact_ddl() -> str:
    """The fact table schema as a DDL string (for ``applyInPandas``)."""
    return ", ".join(f"`{name}` {ddl}" for name, ddl in FACT_COLUMNS.items())


def trace_schema() -> Any:
    """The Spark schema of a request trace."""
    return _struct(TRACE_COLUMNS)
