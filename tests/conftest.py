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


# -- which tests each pass of `make test` runs (docs/pythons.md) ------------------------
#
# `library`: the tests of the library itself, what a user's install runs. They run on
# every Python of the matrix and on both cores: the core is everything the
# library does (the timer, the wheel, operations, the purgatory, watermarks, virtual
# time, the Redis triggers all run on it), so their outcome can depend on which core
# is in use and on the interpreter. Every test is one, unless its module is listed
# here as exercising something built on the library (and needing that something's
# extras, which the other Pythons' venvs do not install):
NOT_LIBRARY = (
    "tests/pipeline/",  # the Spark pipeline (pyspark, Java): the spark extra
    "tests/test_broker",  # the example Kafka broker (examples/broker) and Kafka clients
    "tests/test_longpoll",  # the long-poll example (examples/longpoll) under real servers
    "tests/test_examples",  # the other examples, and how they are installed
)
# They run once, on 3.11 and the compiled core: the library they use is checked on
# both cores by the library's tests. A module of their kind, named otherwise, says so
# with `pytestmark = pytest.mark.not_library`.
#
# `packaging`: builds and installs the distribution (minutes); `slow`: a test of more
# than ~10 s here (`make test-fast` leaves both out). Both are marked where they are.


def _is_library_test(item: pytest.Item) -> bool:
    if item.get_closest_marker("not_library") is not None:
        return False
    path = item.path.relative_to(item.config.rootpath).as_posix()
    return not path.startswith(NOT_LIBRARY)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _is_library_test(item):
            item.add_marker(pytest.mark.library)
        if item.get_closest_marker("spark") is not None:
            # One worker runs every Spark test: pytest-xdist's loadgroup gives a
            # group to one worker, so its session fixtures start one Spark, not two.
            item.add_marker(pytest.mark.xdist_group("spark"))


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]] | None:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    if _uvloop_factory is not None:
        factories["uvloop"] = _uvloop_factory
    return factories
