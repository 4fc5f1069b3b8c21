"""Where the examples run: from a checkout (or an unpacked sdist), never from a wheel.

``examples`` is not part of the distribution: no wheel installs it and no extra
promises it (``tests/core/test_compiled.py`` checks the wheel). The sdist carries
the examples with the tests and docs, and an editable install of a checkout, as
``make install`` does, maps the ``examples`` package, so that
``python -m examples.NAME`` runs from any directory of the checkout.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest

from tests.support.dist import checkout_dist, venv_with

ROOT = Path(__file__).resolve().parents[2]


def test_no_extra_promises_the_examples() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = config["project"]["optional-dependencies"]
    assert "examples" not in extras
    assert not any("examples" in spec for spec in extras["all"])


@pytest.mark.packaging
@pytest.mark.timeout(900)  # minutes on a loaded 2-core machine: builds, venvs, installs
@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("AIOPURGATORY_NO_EXTENSIONS", "") not in ("", "0"),
    reason="packaging is checked once, in the compiled run",
)
def test_the_sdist_carries_the_examples_and_an_editable_install_runs_them_anywhere(
    tmp_path: Path,
) -> None:
    # Only what the machine already needs, none of the caller's checkout.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["AIOPURGATORY_NO_EXTENSIONS"] = "1"  # the compiled core is not the point here
    # `make test` built this checkout's sdist already (AIOPURGATORY_TEST_DIST, see
    # tests/core/test_compiled.py); alone, the test builds it.
    dist = checkout_dist(tmp_path / "dist", sdist_only=True, env=env)
    (sdist,) = dist.glob("aiopurgatory-*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = {name.split("/", 1)[1] for name in tf.getnames() if "/" in name}
        tf.extractall(tmp_path / "src", filter="data")
    for path in (
        "examples/__init__.py",
        "examples/acks_all.py",
        "examples/broker/__main__.py",
        "examples/longpoll/page.html",
        "tests/support/longpoll.py",
        "tests/conftest.py",
        "docs/longpoll.md",
        "CHANGELOG.md",
    ):
        assert path in names, path
    assert not any(name.endswith((".so", ".pyc")) for name in names)
    (checkout,) = (tmp_path / "src").iterdir()

    python = venv_with(tmp_path / "venv", checkout, editable=True, env=env)
    for cwd, argv in (
        (checkout / "docs", ["-m", "examples.timer_demo"]),
        (checkout / "tests", ["-m", "examples.acks_all", "--help"]),
        (tmp_path, ["-m", "examples.group_join", "--help"]),
    ):
        done = subprocess.run(
            [python, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (cwd, argv, done.stderr)
        assert done.stdout.strip()
    # the library and the examples come from the checkout, not from elsewhere
    where = subprocess.run(
        [
            python,
            "-c",
            "import aiopurgatory, examples; print(aiopurgatory.__file__, examples.__file__)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert where.stdout.split() == [
        str(checkout / "aiopurgatory" / "__init__.py"),
        str(checkout / "examples" / "__init__.py"),
    ]
