"""The few asyncio internals the library relies on, checked on every Python it supports.

asyncio's private names may change between minor versions (3.13 changed what
``shutdown_default_executor`` waits on; see issue 42). The library reads three:

* ``loop._thread_id`` (``AsyncioDriver.is_current``, for asyncio's own loops): the
  thread running the loop, None while it is not running;
* ``asyncio._get_running_loop()`` (``_asyncio_driver``, ``_detect``): the running
  loop of this thread, None outside one, without raising;
* ``_clock_resolution``, which :class:`~aiopurgatory.simulation.VirtualTimeLoop`
  overrides: ``BaseEventLoop._run_once`` runs the handles due before
  ``time() + _clock_resolution``;

and :class:`~aiopurgatory.simulation.VirtualTimeLoop` relies on the loop asking its
selector to wait for exactly the time until the earliest handle. Each has a test
here, which ``make test`` runs on every Python of the matrix; the first test keeps
the list whole: a new private read without a test here fails it.
"""

from __future__ import annotations

import ast
import asyncio
import math
import re
import threading
from pathlib import Path

import pytest

from aiopurgatory import simulation

PACKAGE = Path(__file__).resolve().parents[2] / "aiopurgatory"

# Each private asyncio name the library reads, and the test below that checks it.
KNOWN = {
    "_thread_id": "test_thread_id_is_the_running_thread_and_none_when_stopped",
    "_get_running_loop": "test_get_running_loop_is_the_running_loop_or_none",
    "_clock_resolution": "test_run_once_runs_handles_due_within_the_clock_resolution_it_reads",
}


def _asyncio_private_names() -> set[str]:
    loop = asyncio.new_event_loop()
    try:
        names = set(dir(loop)) | set(vars(loop)) | set(dir(asyncio))
    finally:
        loop.close()
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


# What names an event loop or asyncio itself in the library's code (``loop``,
# ``self.loop``, ``event_loop``, ``asyncio``): the objects whose privates are asyncio's.
_LOOPISH = re.compile(r"(^|[._])(loop|event_loop|asyncio|events)$")


def _subclasses_asyncio(node: ast.ClassDef) -> bool:
    return any(re.search(r"asyncio\.|EventLoop|Selector", ast.unparse(b)) for b in node.bases)


def _private_asyncio_names_used() -> dict[str, list[str]]:
    """Private asyncio names read on a loop or on asyncio (``loop._name``), or
    overridden by a library class that subclasses one of asyncio's, anywhere in the
    library (the audit of issue 42, kept)."""
    asyncio_private = _asyncio_private_names()
    found: dict[str, list[str]] = {}

    def note(name: str, path: Path, node: ast.AST) -> None:
        if name in asyncio_private:
            where = f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', 0)}"
            found.setdefault(name, []).append(where)

    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and _LOOPISH.search(ast.unparse(node.value)):
                note(node.attr, path, node)
            elif isinstance(node, ast.ClassDef) and _subclasses_asyncio(node):
                for member in node.body:
                    if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                        note(member.name, path, member)
                # and what its methods read of the asyncio base through self
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Attribute) and ast.unparse(inner.value) == "self":
                        note(inner.attr, path, inner)
    return found


def test_every_private_asyncio_name_the_library_uses_has_a_test_here() -> None:
    used = _private_asyncio_names_used()
    assert set(used) == set(KNOWN), used
    for test in KNOWN.values():
        assert test in globals()


def test_thread_id_is_the_running_thread_and_none_when_stopped() -> None:
    for factory in (asyncio.new_event_loop, simulation.new_event_loop):
        loop = factory()
        try:
            assert isinstance(loop, asyncio.BaseEventLoop)
            assert loop._thread_id is None  # type: ignore[attr-defined]

            async def inside(loop: asyncio.AbstractEventLoop = loop) -> int | None:
                return loop._thread_id  # type: ignore[attr-defined,no-any-return]

            assert loop.run_until_complete(inside()) == threading.get_ident()
            assert loop._thread_id is None  # type: ignore[attr-defined]
        finally:
            loop.close()


def test_get_running_loop_is_the_running_loop_or_none() -> None:
    assert asyncio._get_running_loop() is None

    async def inside() -> bool:
        return asyncio._get_running_loop() is asyncio.get_running_loop()

    assert asyncio.run(inside())
    assert simulation.run(inside())
    assert asyncio._get_running_loop() is None


def test_run_once_runs_handles_due_within_the_clock_resolution_it_reads() -> None:
    # asyncio's own loop reads the real clock's resolution (1 ns here): a handle due
    # 0.1 ns from now would run now, early. The virtual loop's resolution is one ulp
    # of its clock, so the handle runs at exactly its time: asyncio still reads
    # _clock_resolution where it decides what is due.
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        assert loop._clock_resolution == math.ulp(loop.time())  # type: ignore[attr-defined]
        seen: list[float] = []
        done = loop.create_future()
        when = loop.time() + 1e-10

        def due() -> None:
            seen.append(loop.time())
            done.set_result(None)

        loop.call_at(when, due)
        await done
        return [*seen, when]

    seen, when = simulation.run(main(), start=5.0)
    assert seen == when


@pytest.mark.parametrize("start", [0.0, 12.5])
def test_the_selector_is_asked_to_wait_exactly_until_the_next_handle(start: float) -> None:
    waits: list[float | None] = []

    class Recording(simulation.VirtualTimeLoop):
        def _jump(self, timeout: float) -> None:
            waits.append(timeout)
            super()._jump(timeout)

    async def main() -> float:
        await asyncio.sleep(3)
        await asyncio.sleep(0.25)
        return asyncio.get_running_loop().time()

    with asyncio.Runner(loop_factory=lambda: Recording(start)) as runner:
        assert runner.run(main()) == start + 3.25
    assert waits == [3.0, 0.25]
