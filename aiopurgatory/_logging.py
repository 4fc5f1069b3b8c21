"""The library's logger: quiet unless the application asks, structlog when it is set up.

A library must not decide what an application prints. So each event goes:

* to **structlog**, when the application has configured it
  (``structlog.is_configured()``): the events then follow the application's
  processors and renderer, as structlog users expect;
* otherwise to the **standard library** logger ``aiopurgatory``, which has no
  handler of its own (as asyncio's logger): with logging unconfigured, Python
  shows WARNING and above on stderr and nothing below, and
  ``logging.getLogger("aiopurgatory").setLevel(...)`` or any logging set-up of
  the application's decides the rest. The message is the event name followed by
  its fields as ``key=value``; the fields are also on the record as
  ``record.aiopurgatory`` (a dict) for structured handlers.

Which of the two is decided at each call, so an application may configure
either at any time. structlog is never imported by the library for this: an
application that configured it has imported it already. Only rare events are
logged (close, callback failures, timer lag), never one per operation.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Final

__all__ = ["LOGGER_NAME", "LazyLogger"]

#: The standard library logger the library's events go to when structlog is not set up.
LOGGER_NAME: Final = "aiopurgatory"

_stdlib = logging.getLogger(LOGGER_NAME)


class _KeyValues:
    """The fields of an event (`` k=v`` each), rendered only if a handler formats the record."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def __str__(self) -> str:
        return "".join(f" {key}={value!r}" for key, value in self.fields.items())


class LazyLogger:
    """A structlog-compatible logger (``bind``, ``debug`` ... ``error``) for the library.

    Events go to structlog if the application configured it, else to the
    standard library logger ``aiopurgatory`` (see the module documentation).
    """

    __slots__ = ("_initial", "_structlog")

    def __init__(self, **initial_values: Any) -> None:
        self._initial = initial_values
        self._structlog: Any = None

    def bind(self, **new_values: Any) -> LazyLogger:
        """A new logger with more bound values."""
        return LazyLogger(**{**self._initial, **new_values})

    def _log(self, level: int, method: str, event: str, kw: dict[str, Any]) -> Any:
        structlog = sys.modules.get("structlog")
        if structlog is not None and structlog.is_configured():
            logger = self._structlog
            if logger is None:
                logger = self._structlog = structlog.get_logger(LOGGER_NAME, **self._initial)
            return getattr(logger, method)(event, **kw)
        if not _stdlib.isEnabledFor(level):
            return None
        exc_info = kw.pop("exc_info", None)
        fields = {**self._initial, **kw}
        _stdlib.log(
            level,
            "%s%s",
            event,
            _KeyValues(fields),
            exc_info=exc_info,
            extra={"aiopurgatory": {"event": event, **fields}},
        )
        return None

    def debug(self, event: str, **kw: Any) -> Any:
        """Log ``event`` at DEBUG level with the fields ``kw``."""
        return self._log(logging.DEBUG, "debug", event, kw)

    def info(self, event: str, **kw: Any) -> Any:
        """Log ``event`` at INFO level with the fields ``kw``."""
        return self._log(logging.INFO, "info", event, kw)

    def warning(self, event: str, **kw: Any) -> Any:
        """Log ``event`` at WARNING level with the fields ``kw``."""
        return self._log(logging.WARNING, "warning", event, kw)

    def error(self, event: str, **kw: Any) -> Any:
        """Log ``event`` at ERROR level with the fields ``kw``."""
        return self._log(logging.ERROR, "error", event, kw)
