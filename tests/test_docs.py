"""The documentation's runnable snippets run, and print what the pages say they print.

A snippet is a ```python block preceded by ``<!-- test: NAME -->``; its expected
standard output, if the page shows it, is the ```text block preceded by
``<!-- output: NAME -->``. Snippets are programs ending in ``asyncio.run(main())``:
they run on virtual time (``asyncio.run`` is replaced by
``aiopurgatory.simulation.run``), except those marked ``<!-- test: NAME realtime -->``,
which need real threads or sockets and run on the default loop (only their output is
checked, never their timing). Log lines (structlog) are captured, not compared.

Also checked: the API reference documents every public name.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
import re
from pathlib import Path
from typing import NamedTuple

import pytest
import structlog

from aiopurgatory import simulation

DOCS = Path(__file__).resolve().parent.parent / "docs"

_MARKED = re.compile(
    r"<!-- (?P<kind>test|output): (?P<name>[\w-]+)(?P<realtime> realtime)? -->\n"
    r"```(?P<lang>\w+)\n(?P<body>.*?)^```$",
    re.DOTALL | re.MULTILINE,
)


class Snippet(NamedTuple):
    page: str
    name: str
    code: str
    output: str | None
    realtime: bool


def snippets() -> list[Snippet]:
    found: list[Snippet] = []
    for path in sorted(DOCS.rglob("*.md")):
        if "_build" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        codes: dict[str, tuple[str, bool]] = {}
        outputs: dict[str, str] = {}
        for match in _MARKED.finditer(text):
            name = match["name"]
            if match["kind"] == "test":
                assert match["lang"] == "python", f"{path.name}: snippet {name} is not python"
                assert name not in codes, f"{path.name}: two snippets named {name}"
                codes[name] = (match["body"], bool(match["realtime"]))
            else:
                outputs[name] = match["body"]
        assert set(outputs) <= set(codes), f"{path.name}: output without snippet"
        page = str(path.relative_to(DOCS))
        found += [
            Snippet(page, name, code, outputs.get(name), realtime)
            for name, (code, realtime) in codes.items()
        ]
    return found


SNIPPETS = snippets()


def test_the_pages_have_snippets() -> None:
    # Guards the regular expression: a typo in a marker would silently test nothing.
    names = {(s.page, s.name) for s in SNIPPETS}
    assert ("getting-started.md", "getting-started") in names
    marked = sum(
        path.read_text(encoding="utf-8").count("<!-- test: ")
        for path in DOCS.rglob("*.md")
        if "_build" not in path.parts
    )
    assert marked == len(SNIPPETS)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: f"{s.page}:{s.name}")
def test_snippet(snippet: Snippet, monkeypatch: pytest.MonkeyPatch) -> None:
    if not snippet.realtime:
        monkeypatch.setattr(asyncio, "run", simulation.run)
    out = io.StringIO()
    namespace = {"__name__": f"docs_snippet_{snippet.name.replace('-', '_')}"}
    # structlog, unconfigured, would print the library's rare log lines (with a
    # timestamp) to stdout; the pages mention them but do not show them.
    with contextlib.redirect_stdout(out), structlog.testing.capture_logs():
        exec(compile(snippet.code, f"docs/{snippet.page}:{snippet.name}", "exec"), namespace)
    if snippet.output is not None:
        assert out.getvalue() == snippet.output


PUBLIC_MODULES = [
    "aiopurgatory",
    "aiopurgatory.simulation",
    "aiopurgatory.events",
    "aiopurgatory.metrics.prometheus",
    "aiopurgatory.metrics.otel",
    "aiopurgatory.redis",
    "aiopurgatory.redis.testing",
]


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_api_reference_documents_every_public_name(module_name: str) -> None:
    api = (DOCS / "api.md").read_text(encoding="utf-8")
    documented: set[tuple[str, str]] = set()
    current = ""
    for line in api.splitlines():
        if m := re.match(r"\.\. (?:currentmodule|automodule):: ([\w.]+)", line):
            current = m[1]
        elif m := re.match(
            r"\.\. (?:autoclass|autofunction|autoexception|autodata|py:data):: ([\w.]+)", line
        ):
            documented.add((current, m[1]))
    module = importlib.import_module(module_name)
    submodules = {
        name for name in module.__all__ if hasattr(module, name) and _is_module(module, name)
    }
    missing = [
        name
        for name in module.__all__
        if name not in submodules and (module_name, name) not in documented
    ]
    assert not missing, f"docs/api.md does not document {module_name}: {missing}"
    for name in submodules:
        assert f"automodule:: {module_name}.{name}" in api


def _is_module(module: object, name: str) -> bool:
    return type(getattr(module, name)).__name__ == "module"
