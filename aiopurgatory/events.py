"""The op event log: one JSON line per finished operation (opt-in).

Attach an :class:`EventRecorder` to one or more purgatories; every operation that
finishes there becomes one event. Nothing is recorded, and nothing costs more than
one attribute test per finished operation, unless a recorder is attached.

Schema 2 (every event has every field; see ``docs/events.md``):

===============  ===========================================================
``schema``       2
``event``        ``"aiopurgatory.op_finished"``
``ts``           when the event was written, seconds since the epoch (or the
                 recorder's ``clock``)
``purgatory``    the purgatory's name
``op_id``        the op's ``op_id`` attribute if it has one, else a counter
                 unique within this recorder
``op_type``      the op's class name
``keys``         its watch keys, as strings (empty if it completed at once)
``timeout``      seconds
``watched_at``   loop time it was watched (``deadline - timeout``), or
                 ``finished_at`` if it finished before being scheduled
``finished_at``  loop time it finished
``outcome``      ``completed``, ``expired``, ``cancelled`` or ``failed``
``error``        the answer's error, or null: the op's ``error`` attribute
                 if it has one and it is not None (an enum member as its
                 name, anything else as ``str()``); else, for ``failed``,
                 the exception's class name; else null
``wait``         ``finished_at - watched_at``, seconds
``lateness``     for expiries ``finished_at - deadline`` (>= 0, except
                 when ``close(expire_pending=True)`` expired it early), else null
===============  ===========================================================

Schema 1 had no ``error``: an op that completed with an error answer (a produce
request answered ``NOT_ENOUGH_REPLICAS``) read as a plain ``completed``. The
version went to 2 because ``outcome`` alone no longer says whether the op
succeeded; readers of schema 1 must not take schema-2 lines for it.

Events go through structlog's JSON renderer on a logger of the recorder's own;
structlog's global configuration is neither used nor changed. A structlog logger
may be given as the sink instead (it gets ``info("aiopurgatory.op_finished", ...)``).
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable
from typing import IO, Any, Final, TextIO, cast

from . import DelayedOperation, Outcome, Purgatory

__all__ = ["EVENT", "SCHEMA_VERSION", "SCHEMA_VERSIONS", "EventRecorder", "error_of"]

#: The schema this recorder writes.
SCHEMA_VERSION: Final = 2
#: The schemas ``aiopurgatory analyze`` reads (1: no ``error`` field, read as null).
SCHEMA_VERSIONS: Final = (1, 2)
EVENT: Final = "aiopurgatory.op_finished"


def error_of(op: DelayedOperation) -> str | None:
    """The ``error`` field of ``op``'s event: its answer's error, or None.

    The op's ``error`` attribute if it has one and it is not None (an
    :class:`enum.Enum` member as its name, anything else as ``str()``); else,
    for an op whose ``try_complete`` raised (outcome ``failed``), the
    exception's class name; else None (no error).
    """
    error = getattr(op, "error", None)
    if error is not None:
        return error.name if isinstance(error, enum.Enum) else str(error)
    if op.outcome is Outcome.FAILED:
        exc = op.exception()
        return type(exc).__name__ if exc is not None else None
    return None


class EventRecorder:
    """Writes the op event log of the purgatories it is attached to.

    Args:
        sink: a path (opened for appending, closed by :meth:`close`), an open
            text file, or a structlog-compatible logger.
        clock: returns the ``ts`` of an event; default ``time.time``.

    Raises:
        TypeError: ``sink`` is none of those.
    """

    def __init__(
        self,
        sink: str | os.PathLike[str] | IO[str] | Any,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._file: IO[str] | None = None
        if isinstance(sink, str | os.PathLike):
            self._file = open(sink, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
            self._logger: Any = self._json_logger(self._file)
        elif hasattr(sink, "write"):
            self._logger = self._json_logger(sink)
        elif callable(getattr(sink, "info", None)):
            self._logger = sink
        else:
            raise TypeError(
                f"sink must be a path, a text file or a structlog logger, got {type(sink).__name__}"
            )
        self._clock = clock
        self._next_id = 0
        self._attached: list[tuple[Purgatory[Any], Callable[[DelayedOperation], None]]] = []
        self.events = 0

    @staticmethod
    def _json_logger(file: IO[str]) -> Any:
        import structlog  # here, not at import: it is slow to import (see _logging)

        # Everything explicit, so that nothing of the application's global
        # configuration (a level filter, say) can drop or reshape events.
        return structlog.wrap_logger(
            structlog.WriteLogger(cast("TextIO", file)),
            processors=[structlog.processors.JSONRenderer(sort_keys=False)],
            wrapper_class=structlog.make_filtering_bound_logger(0),
            context_class=dict,
            cache_logger_on_first_use=True,
        )

    def attach(self, purgatory: Purgatory[Any]) -> None:
        """Record every operation that finishes in ``purgatory`` from now on.

        Raises:
            TypeError: ``purgatory`` is not a Purgatory.
            ValueError: a recorder is already attached to it.
        """
        if not isinstance(purgatory, Purgatory):
            raise TypeError(f"purgatory must be a Purgatory, got {type(purgatory).__name__}")
        if purgatory.recorder is not None:
            raise ValueError(f"purgatory {purgatory.name!r} already has a recorder attached")

        def record(op: DelayedOperation) -> None:
            self.record(purgatory, op)

        purgatory.set_recorder(record)
        self._attached.append((purgatory, record))

    def record(self, purgatory: Purgatory[Any], op: DelayedOperation) -> None:
        """Write the event of one finished ``op`` (called by attached purgatories)."""
        outcome = op.outcome
        assert outcome is not None
        finished_at = purgatory.timer.time()
        deadline = op.deadline
        watched_at = finished_at if deadline is None else deadline - op.timeout
        op_id = getattr(op, "op_id", None)
        if op_id is None:
            op_id = self._next_id
            self._next_id += 1
        self.events += 1
        self._logger.info(
            EVENT,
            schema=SCHEMA_VERSION,
            ts=self._clock(),
            purgatory=purgatory.name,
            op_id=op_id,
            op_type=type(op).__name__,
            # op.keys is empty for an op its first check finished (never watched).
            keys=[str(key) for key in op.keys],
            timeout=op.timeout,
            watched_at=watched_at,
            finished_at=finished_at,
            outcome=outcome.value,
            error=error_of(op),
            wait=finished_at - watched_at,
            lateness=(
                finished_at - deadline
                if outcome.value == "expired" and deadline is not None
                else None
            ),
        )

    def close(self) -> None:
        """Detach from every purgatory and close the file this recorder opened."""
        for purgatory, record in self._attached:
            if purgatory.recorder is record:  # still ours: leave others' alone
                purgatory.set_recorder(None)
        self._attached.clear()
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> EventRecorder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# dir() shows the public API, not the names the module uses.
from ._namespace import public_dir as _public_dir  # noqa: E402

__dir__ = _public_dir(__name__, __all__)
