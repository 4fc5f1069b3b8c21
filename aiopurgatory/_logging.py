"""The library's logger: structlog, imported only when something is logged.

``import structlog`` costs a lot at start-up (it loads its dev console renderer,
and with it ``rich`` when that is installed), and the library logs only rare
events (close, callback failures, timer lag). So the library holds this small
stand-in, which imports structlog and builds ``structlog.get_logger`` on the first
log call. structlog's logger is itself a lazy proxy that follows the application's
configuration at log time, so applications may configure structlog at any point.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LazyLogger"]


class LazyLogger:
    """A structlog-compatible logger with bound values that imports structlog on first use."""

    __slots__ = ("_initial", "_logger")

    def __init__(self, **initial_values: Any) -> None:
        self._initial = initial_values
        self._logger: Any = None

    def _get(self) -> Any:
        logger = self._logger
        if logger is None:
            import structlog

            logger = self._logger = structlog.get_logger("aiopurgatory", **self._initial)
        return logger

    def bind(self, **new_values: Any) -> LazyLogger:
        """A new logger with more bound values."""
        return LazyLogger(**{**self._initial, **new_values})

    def debug(self, event: str, **kw: Any) -> Any:
        return self._get().debug(event, **kw)

    def info(self, event: str, **kw: Any) -> Any:
        return self._get().info(event, **kw)

    def warning(self, event: str, **kw: Any) -> Any:
        return self._get().warning(event, **kw)

    def error(self, event: str, **kw: Any) -> Any:
        return self._get().error(event, **kw)
