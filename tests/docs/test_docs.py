"""The documentation's runnable snippets run, and print what the pages say they print.

A snippet is a ```python block preceded by ``<!-- test: NAME -->``; its expected
standard output, if the page shows it, is the ```text block preceded by
``<!-- output: NAME -->``. Snippets run **as written**, as a reader who copies one
runs it: one that ends in ``asyncio.run(main())`` runs on the real clock (so what it
prints must not depend on timing finer than its own margins), one that shows exact
times runs itself on virtual time (``simulation.run(main())``, and says so).
Log lines (structlog) are captured, not compared.

Also checked: the API reference documents every public name.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import re
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import structlog

DOCS = Path(__file__).resolve().parents[2] / "docs"

_MARKED = re.compile(
    r"<!-- (?P<kind>test|output): (?P<name>[\w-]+) -->\n"
    r"```(?P<lang>\w+)\n(?P<body>.*?)^```$",
    re.DOTALL | re.MULTILINE,
)


class Snippet(NamedTuple):
    page: str
    name: str
    code: str
    output: str | None


def snippets() -> list[Snippet]:
    found: list[Snippet] = []
    for path in sorted(DOCS.rglob("*.md")):
        if "_build" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        codes: dict[str, str] = {}
        outputs: dict[str, str] = {}
        for match in _MARKED.finditer(text):
            name = match["name"]
            if match["kind"] == "test":
                assert match["lang"] == "python", f"{path.name}: snippet {name} is not python"
                assert name not in codes, f"{path.name}: two snippets named {name}"
                codes[name] = match["body"]
            else:
                outputs[name] = match["body"]
        assert set(outputs) <= set(codes), f"{path.name}: output without snippet"
        page = str(path.relative_to(DOCS))
        found += [Snippet(page, name, code, outputs.get(name)) for name, code in codes.items()]
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


@pytest.mark.parametrize(
    "snippet",
    [
        # On the wall clock: those that run themselves with asyncio.run (or trio.run).
        pytest.param(s, marks=[pytest.mark.realtime] if "simulation.run" not in s.code else [])
        for s in SNIPPETS
    ],
    ids=lambda s: f"{s.page}:{s.name}",
)
def test_snippet(snippet: Snippet) -> None:
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
    "aiopurgatory.asgi",
    "aiopurgatory.metrics.prometheus",
    "aiopurgatory.metrics.otel",
    "aiopurgatory.tracing",
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


def _docs_conf() -> object:
    spec = importlib.util.spec_from_file_location("_aiopurgatory_docs_conf", DOCS / "conf.py")
    assert spec is not None
    assert spec.loader is not None
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    return conf


def test_the_reference_shows_the_compiled_classes_signatures_as_written() -> None:
    # The compiled core's classes are C types: Python cannot inspect their
    # __init__, and the signature Cython embeds misplaces "*" (Timer's keyword-only
    # tick looked positional). docs/conf.py takes them from the .py source instead.
    import aiopurgatory as ap

    conf: Any = _docs_conf()
    expected = {
        ap.Timer: "(*, tick: float=0.001, wheel_size: int=20)",
        ap.DelayedOperation: "(timeout: float)",  # the typed stub, not the sentinel default
        ap.WatermarkOperation: "(timeout: float, *, all_keys: bool=False)",
    }
    for cls, signature in expected.items():
        assert conf.source_signature(cls) == signature, cls
        # Applied to exactly the compiled classes (in the pure-Python core autodoc
        # inspects the Python classes as they are).
        applied = conf._class_signature(None, "class", cls.__name__, cls, None, "(x)", "")
        assert applied == ((signature, "") if ap.COMPILED else None), cls
    assert conf._class_signature(None, "class", "Purgatory", ap.Purgatory, None, "(x)", "") is None
    # What the signatures say is what the classes do, on both cores.
    with pytest.raises(TypeError):
        ap.Timer(0.002)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        ap.WatermarkOperation(1.0, True)  # type: ignore[call-arg]
    original = ["WatermarkOperation(timeout: float) -> None", "", "An operation."]
    lines = list(original)
    conf._drop_embedded_signatures(None, "class", "x", ap.WatermarkOperation, None, lines)
    assert lines == (["An operation."] if ap.COMPILED else original)
