"""Run one async test on every backend: asyncio, uvloop and trio (or on virtual time).

pytest-asyncio (auto mode) runs the rest of the suite on its asyncio/uvloop loop
matrix, and it claims every ``async def`` test it collects. So a test meant for
every backend is written as an ``async def`` with backend-neutral code (anyio's
functions work under asyncio and trio alike) and decorated with
:func:`each_backend`, which turns it into a plain function taking a ``backend``
parameter and running the coroutine itself: pytest-asyncio leaves it alone, and
anyio's pytest plugin is not needed. ``@each_backend(virtual=True)`` runs it on
virtual time instead: ``aiopurgatory.simulation.run`` (asyncio) and
``aiopurgatory.simulation.run_trio`` (trio's autojumping mock clock), where exact
times can be asserted.

:func:`now` reads the running backend's clock also from inside a timer callback
(``anyio.current_time()`` needs a task on asyncio).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import pytest
import trio
import trio.testing
import uvloop

from aiopurgatory import simulation
from aiopurgatory._backends import current_time as now

__all__ = ["REAL", "VIRTUAL", "each_backend", "now", "run_on", "settle"]

REAL = ("asyncio", "uvloop", "trio")
VIRTUAL = ("asyncio-virtual", "trio-virtual")

T = TypeVar("T")


def run_on(backend: str, fn: Callable[[], Awaitable[T]]) -> T:
    """Run the coroutine function ``fn`` to completion on ``backend``."""

    async def main() -> T:
        return await fn()

    if backend == "asyncio":
        with asyncio.Runner() as runner:
            return runner.run(main())
    if backend == "uvloop":
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main())
    if backend == "trio":
        return trio.run(main)
    if backend == "asyncio-virtual":
        return simulation.run(main())
    if backend == "trio-virtual":
        return simulation.run_trio(main)
    raise ValueError(f"unknown backend {backend!r}")


async def settle() -> None:
    """Let every other task and callback run until all wait (a few loop iterations)."""
    if trio.lowlevel.in_trio_run():
        await trio.testing.wait_all_tasks_blocked()
    else:
        for _ in range(5):
            await asyncio.sleep(0)


_AsyncTest = Callable[..., Awaitable[None]]


@overload
def each_backend(test: _AsyncTest, *, virtual: bool = False) -> Callable[..., None]: ...
@overload
def each_backend(
    test: None = None, *, virtual: bool = False
) -> Callable[[_AsyncTest], Callable[..., None]]: ...


def each_backend(test: _AsyncTest | None = None, *, virtual: bool = False) -> Any:
    """Parametrise an ``async def`` test over the real backends (or the virtual ones).

    The test may ask for fixtures, and for ``backend`` (its name) to branch on.
    """

    def decorate(test: _AsyncTest) -> Callable[..., None]:
        signature = inspect.signature(test)
        wants_backend = "backend" in signature.parameters

        @functools.wraps(test)
        def wrapper(backend: str, **kwargs: Any) -> None:
            if wants_backend:
                kwargs["backend"] = backend
            run_on(backend, lambda: test(**kwargs))

        parameters = [p for p in signature.parameters.values() if p.name != "backend"]
        backend_parameter = inspect.Parameter("backend", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[backend_parameter, *parameters]
        )
        del wrapper.__wrapped__  # a plain function to pytest
        marked: Callable[..., None] = pytest.mark.parametrize(
            "backend", VIRTUAL if virtual else REAL
        )(wrapper)
        return marked

    return decorate if test is None else decorate(test)
