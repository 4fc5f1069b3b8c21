"""A pytest plugin: run async tests on aiopurgatory's virtual-time loop.

Installed with the package (a ``pytest11`` entry point) and inert until a test
asks for it, with the marker or the fixture::

    @pytest.mark.virtual_time
    async def test_request_times_out() -> None:
        async with ap.timeout(30):  # returns at once, at loop time 30.0
            ...

    async def test_with_the_loop(virtual_loop: VirtualTimeLoop) -> None:
        virtual_loop.advance(10)

* ``@pytest.mark.virtual_time`` (or ``@pytest.mark.virtual_time(start=12.5)``)
  runs the test, and its async fixtures, on a new
  :class:`~aiopurgatory.simulation.VirtualTimeLoop` whose clock starts at
  ``start`` (default 0.0): ``loop.time()`` jumps to the next timer whenever every
  task waits, so a 30-second timeout takes microseconds and times can be
  asserted exactly.
* The ``virtual_loop`` fixture gives the test its running virtual loop (to
  ``advance`` or ``advance_to`` the clock); asking for it implies the marker.

It works through pytest-asyncio (1.4 or later), in both of its modes: the marker
(or the fixture) is enough, also in ``strict`` mode, pytest-asyncio's default,
where the plugin marks the test ``@pytest.mark.asyncio`` itself (a test with its
own ``asyncio`` marker keeps it, ``loop_scope`` included), and hands the test's
plain ``@pytest.fixture`` async fixtures to pytest-asyncio for that test (strict
mode otherwise runs only ``@pytest_asyncio.fixture`` ones). It supplies the loop through
pytest-asyncio's ``pytest_asyncio_loop_factories`` hook, and overrides a project's
own implementation of that hook (a loop matrix, say) only for the tests that ask
for virtual time; the others keep the project's loops, or asyncio's default loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
from collections.abc import Callable, Generator, Mapping
from typing import Any

import pytest

__all__ = ["MARKER", "virtual_loop"]

#: The marker's name.
MARKER = "virtual_time"
_FIXTURE = "virtual_loop"
# The attribute by which pytest-asyncio (1.x) recognises a fixture declared with
# @pytest_asyncio.fixture (its _is_asyncio_fixture_function).
_ASYNCIO_FIXTURE_FLAG = "_force_asyncio_fixture"

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(start=0.0): run this async test (and its async fixtures) on "
        "aiopurgatory's virtual-time event loop, its clock starting at start seconds",
    )


def _wants_virtual_time(item: pytest.Item) -> bool:
    return item.get_closest_marker(MARKER) is not None or _FIXTURE in getattr(
        item, "fixturenames", ()
    )


def _start_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return 0.0
    if marker.args and "start" in marker.kwargs:
        raise pytest.UsageError(f"{item.nodeid}: give virtual_time's start once")
    if len(marker.args) > 1 or set(marker.kwargs) - {"start"}:
        raise pytest.UsageError(
            f"{item.nodeid}: virtual_time takes one argument, start (seconds), "
            f"got args={marker.args!r} kwargs={marker.kwargs!r}"
        )
    start = marker.args[0] if marker.args else marker.kwargs.get("start", 0.0)
    from ._validation import as_seconds

    try:
        return as_seconds(start, "start")
    except (TypeError, ValueError) as exc:
        raise pytest.UsageError(f"{item.nodeid}: virtual_time: {exc}") from None


def _virtual_factory(start: float) -> asyncio.AbstractEventLoop:
    from .simulation import VirtualTimeLoop

    return VirtualTimeLoop(start)


def _asks_for_virtual_time(collector: pytest.Collector, obj: object) -> bool:
    """Whether the test function ``obj``, about to be collected, asks for virtual time.

    Its own marks, those of its class or module, or a ``virtual_loop`` parameter.
    """
    marks = getattr(obj, "pytestmark", ())
    if any(getattr(mark, "name", None) == MARKER for mark in marks):
        return True
    if collector.get_closest_marker(MARKER) is not None:
        return True
    try:
        return _FIXTURE in inspect.signature(obj).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):  # pragma: no cover - not introspectable
        return False


@pytest.hookimpl(wrapper=True)
def pytest_pycollect_makeitem(
    collector: pytest.Module | pytest.Class, name: str, obj: object
) -> Generator[None, object, object]:
    # Before pytest (and pytest-asyncio) make the item: in strict mode,
    # pytest-asyncio takes only async tests marked asyncio, so a virtual-time
    # test gets that mark here, as if the user had written it. Nothing else is
    # touched: auto mode marks every async test anyway, and a test with its own
    # asyncio mark (a loop_scope, say) keeps it.
    if (
        inspect.iscoroutinefunction(obj)
        and collector.funcnamefilter(name)
        and _asks_for_virtual_time(collector, obj)
        and not any(
            getattr(mark, "name", None) == "asyncio" for mark in getattr(obj, "pytestmark", ())
        )
        and collector.get_closest_marker("asyncio") is None
    ):
        pytest.mark.asyncio(obj)
    return (yield)


@pytest.hookimpl(wrapper=True, optionalhook=True)
def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Generator[None, Mapping[str, LoopFactory] | None, Mapping[str, LoopFactory] | None]:
    # A wrapper, so that a project's own hook (a conftest with a loop matrix)
    # still decides for every test that does not ask for virtual time.
    chosen = yield
    if _wants_virtual_time(item):
        return {"virtual": functools.partial(_virtual_factory, _start_of(item))}
    if chosen is None:
        # No hook of the project's: pytest-asyncio requires a mapping once any
        # implementation exists. asyncio's default loop is what it would use.
        return {"asyncio": asyncio.new_event_loop}
    return chosen


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    # In strict mode pytest-asyncio runs only the async fixtures declared with
    # @pytest_asyncio.fixture and leaves a plain @pytest.fixture coroutine to
    # pytest, which refuses it. For a test that asks for virtual time the plugin
    # promises its async fixtures run too, so each plain async fixture the test
    # uses is flagged as pytest-asyncio's own while this test runs (set-up, call
    # and teardown; pytest-asyncio reads the flag at each), and only then:
    # another test using the same fixture (a trio test, say) sees it unflagged.
    # In auto mode pytest-asyncio takes every async fixture anyway.
    if not _wants_virtual_time(item):
        return (yield)
    flagged = _flag_async_fixtures(item)
    try:
        return (yield)
    finally:
        for function in flagged:
            with contextlib.suppress(AttributeError):
                delattr(function, _ASYNCIO_FIXTURE_FLAG)


def _flag_async_fixtures(item: pytest.Item) -> list[Any]:
    """Flag ``item``'s unflagged async fixture functions as pytest-asyncio's; return them."""
    info = getattr(item, "_fixtureinfo", None)
    flagged: list[Any] = []
    for fixturedefs in getattr(info, "name2fixturedefs", {}).values():
        for fixturedef in fixturedefs:
            # A fixture in a class is a method: the flag goes on its function.
            function = getattr(fixturedef.func, "__func__", fixturedef.func)
            if (
                inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)
            ) and not getattr(function, _ASYNCIO_FIXTURE_FLAG, False):
                setattr(function, _ASYNCIO_FIXTURE_FLAG, True)
                flagged.append(function)
    return flagged


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if not _wants_virtual_time(item):
        return
    try:
        from pytest_asyncio import is_async_test
    except ImportError:
        pytest.fail(
            f"{item.nodeid}: virtual time needs pytest-asyncio (1.4 or later) "
            "to run async tests: pip install pytest-asyncio",
            pytrace=False,
        )
    if not hasattr(item.config.hook, "pytest_asyncio_loop_factories"):
        pytest.fail(
            f"{item.nodeid}: virtual time needs pytest-asyncio 1.4 or later "
            "(its pytest_asyncio_loop_factories hook chooses the test's loop)",
            pytrace=False,
        )
    if not is_async_test(item):
        pytest.fail(
            f"{item.nodeid}: virtual time applies to async tests that pytest-asyncio "
            "runs: make the test 'async def'",
            pytrace=False,
        )


def _virtual_loop_fixture() -> Any:
    async def virtual_loop() -> Any:
        """The test's running :class:`~aiopurgatory.simulation.VirtualTimeLoop`.

        Asking for it runs the test on virtual time, as ``@pytest.mark.virtual_time``.
        """
        from .simulation import VirtualTimeLoop

        loop = asyncio.get_running_loop()
        if not isinstance(loop, VirtualTimeLoop):  # pragma: no cover - the hook chose it
            raise RuntimeError(
                "virtual_loop: the test is not running on the virtual-time loop "
                "(a pytest_asyncio_loop_factories hook of higher priority chose another)"
            )
        return loop

    try:
        import pytest_asyncio
    except ImportError:  # pragma: no cover - pytest-asyncio is part of the test install
        return pytest.fixture(name=_FIXTURE)(virtual_loop)
    return pytest_asyncio.fixture(name=_FIXTURE)(virtual_loop)


virtual_loop = _virtual_loop_fixture()
