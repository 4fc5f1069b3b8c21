"""Triggers and watermarks across processes through PostgreSQL alone.

:class:`PostgresTriggers` connects a process's :class:`~aiopurgatory.Purgatory`
to a PostgreSQL channel (asyncpg): the :class:`aiopurgatory.Triggers`
interface, with watermarks stored in a table (atomic max) and wake-ups carried
by LISTEN/NOTIFY. :meth:`PostgresTriggers.advance_in` advances inside the
caller's transaction: waiters wake when it commits, never if it rolls back.
:class:`SyncPublisher` does the same from synchronous code (psycopg 3).
:func:`schema_sql` gives the table's DDL for a migration. See the
documentation page "Across processes (PostgreSQL)".

Needs the ``postgres`` extra: ``pip install 'aiopurgatory[postgres]'``.
"""

try:
    import asyncpg
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ImportError(
        "aiopurgatory.postgres needs asyncpg: pip install 'aiopurgatory[postgres]'"
    ) from exc

from .._namespace import public_dir as _public_dir
from ._errors import PostgresTriggersClosedError, PostgresTriggersError
from ._sql import schema_sql
from ._statistics import PostgresTriggersStatistics, SyncPublisherStatistics
from ._sync import SyncPublisher
from ._triggers import PostgresTriggers
from ._wire import DEFAULT_CHANNEL, DEFAULT_PARTITIONS, MAX_KEY_BYTES

__all__ = [
    "DEFAULT_CHANNEL",
    "DEFAULT_PARTITIONS",
    "MAX_KEY_BYTES",
    "PostgresTriggers",
    "PostgresTriggersClosedError",
    "PostgresTriggersError",
    "PostgresTriggersStatistics",
    "SyncPublisher",
    "SyncPublisherStatistics",
    "schema_sql",
]

for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type) and issubclass(_value, BaseException):
        _value.__module__ = __name__
del _name, _value, asyncpg


def __getattr__(name: str) -> object:
    # aiopurgatory.postgres.testing (a test helper) loads on first access.
    if name == "testing":
        import importlib

        return importlib.import_module(f"{__name__}.testing")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__dir__ = _public_dir(__name__, [*__all__, "testing"])
