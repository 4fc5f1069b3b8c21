"""Test configuration: every async test runs on each event loop of the matrix.

* By default: the standard asyncio loop and uvloop (real time; assert with tolerances).
* Tests marked ``@pytest.mark.virtual_time`` run on aiopurgatory's virtual-time loop
  only (exact time assertions; ``loop.time()`` starts at 0).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping

import pytest
import structlog

from aiopurgatory import simulation

try:
    import uvloop

    _uvloop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
except ImportError:  # pragma: no cover - uvloop is part of the test install
    _uvloop_factory = None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "virtual_time: run this async test on the virtual-time loop only"
    )


@pytest.fixture(autouse=True)
def _structlog_isolation() -> Iterator[None]:
    # Applications under test (examples, the broker, CLIs) configure structlog
    # globally; give every test structlog's defaults back afterwards.
    yield
    structlog.reset_defaults()


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]] | None:
    if item.get_closest_marker("virtual_time") is not None:
        return {"virtual": simulation.new_event_loop}
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    if _uvloop_factory is not None:
        factories["uvloop"] = _uvloop_factory
    return factories
