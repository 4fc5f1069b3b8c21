"""Test configuration: every async test runs on each event loop of the matrix.

* By default: the standard asyncio loop and uvloop (real time; assert with tolerances).
* Tests marked ``@pytest.mark.virtual_time`` (or asking for ``virtual_loop``) run on
  aiopurgatory's virtual-time loop only (exact time assertions; ``loop.time()``
  starts at 0): the package's own pytest plugin (``aiopurgatory.pytest_plugin``,
  loaded by its ``pytest11`` entry point) overrides the matrix for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping

import pytest
import structlog

# Real Redis for the tests of aiopurgatory.redis (and the examples using it).
from tests.redis_helpers import (  # noqa: F401
    redis_client,
    redis_server,
    redis_server_factory,
)

try:
    import uvloop

    _uvloop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
except ImportError:  # pragma: no cover - uvloop is part of the test install
    _uvloop_factory = None


@pytest.fixture(autouse=True)
def _structlog_isolation() -> Iterator[None]:
    # Applications under test (examples, the broker, CLIs) configure structlog
    # globally; give every test structlog's defaults back afterwards.
    yield
    structlog.reset_defaults()


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]] | None:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    if _uvloop_factory is not None:
        factories["uvloop"] = _uvloop_factory
    return factories
