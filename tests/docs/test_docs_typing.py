"""The documentation's Python snippets pass ``mypy --strict``, as a user's code would.

Every ```python block of docs/ and README.md is written to a file of its own and
all are checked in one mypy run, with the project's configuration (strict).
A block that is a fragment (it uses names the prose around it defines, or awaits
at the top level as in a REPL) is marked ``<!-- fragment -->`` just above it and
skipped; a test keeps those the exception.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

# The docs import what only the 3.11 development install has (the broker's Kafka
# clients, pandas stubs): checked once, there.
pytestmark = pytest.mark.not_library

ROOT = Path(__file__).resolve().parents[2]

_BLOCK = re.compile(r"^```python\n(?P<body>.*?)^```$", re.DOTALL | re.MULTILINE)
_FRAGMENT = "<!-- fragment -->\n"
# A program of a page, which the page's other programs may import by its name.
_FILE = re.compile(r"<!-- file: (?P<name>\w+\.py) -->\n$")


class Block(NamedTuple):
    page: str
    line: int  # of the block's first line of code, in the page
    code: str
    fragment: bool
    file: str | None = None  # a program's name (``<!-- file: NAME.py -->``)


def blocks() -> list[Block]:
    pages = [ROOT / "README.md"]
    pages += sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)
    found = []
    for path in pages:
        text = path.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 2
            before = text[max(0, match.start() - 200) : match.start()]
            fragment = before.endswith(_FRAGMENT)
            named = _FILE.search(before)
            found.append(
                Block(
                    str(path.relative_to(ROOT)),
                    line,
                    match["body"],
                    fragment,
                    None if named is None else named["name"],
                )
            )
    return found


BLOCKS = blocks()


def test_the_pages_have_blocks_and_few_fragments() -> None:
    checked = [b for b in BLOCKS if not b.fragment]
    assert len(checked) >= 20
    # Fragments are the exception: a page's runnable examples are checked.
    assert len(BLOCKS) - len(checked) < len(checked) / 1.5


def test_the_docs_python_snippets_pass_mypy_strict(tmp_path: Path) -> None:
    files: dict[str, Block] = {}
    for n, block in enumerate(BLOCKS):
        if block.fragment:
            continue
        stem = re.sub(r"\W", "_", block.page.removesuffix(".md"))
        if block.file is None:
            path = tmp_path / f"snippet_{n:02d}_{stem}_L{block.line}.py"
        else:
            # A page's programs side by side under their own names, as its how-to
            # runs them: one imports another (a web app, its worker's tasks).
            path = tmp_path / f"programs_{stem}" / block.file
            path.parent.mkdir(exist_ok=True)
        path.write_text(block.code, encoding="utf-8")
        files[str(path.resolve())] = block
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--strict",
            "--no-error-summary",
            "--hide-error-context",
            *sorted(files),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    problems = []
    for line in result.stdout.splitlines():
        match = re.match(r"(.*?\.py):(\d+): (.*)", line)
        where = None if match is None else files.get(str((ROOT / match[1]).resolve()))
        if match is None or where is None:
            problems.append(line)
            continue
        problems.append(f"{where.page}:{where.line + int(match[2]) - 1}: {match[3]}")
    assert result.returncode == 0, "\n".join(problems) + result.stderr
