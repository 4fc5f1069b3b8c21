"""The PostgreSQL transport's errors (``aiopurgatory.postgres`` shows them as its own)."""

from __future__ import annotations

from .._errors import PurgatoryError

__all__ = ["PostgresTriggersClosedError", "PostgresTriggersError"]


class PostgresTriggersError(PurgatoryError):
    """PostgreSQL could not be reached, refused the connection or failed a call."""


class PostgresTriggersClosedError(PostgresTriggersError, RuntimeError):
    """Use of a PostgresTriggers before ``async with`` or after ``aclose()``."""
