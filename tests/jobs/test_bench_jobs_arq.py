"""``aiopurgatory bench jobs --systems arq``: a small run of both modes answers every wait.

arq pins redis-py below 6: this runs in ``make test-arq``'s ``.venv-arq`` and is
skipped, saying so, where arq is not importable (as tests/jobs/test_arq.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip(
    "arq",
    reason="arq is not installed (it pins redis<6): its tests run in `make test-arq`'s .venv-arq",
)

from tests.jobs.test_bench_jobs import check_a_small_run

pytestmark = pytest.mark.timeout(180)


def test_a_small_arq_run_answers_every_wait_in_both_modes(tmp_path: Path) -> None:
    # arq's worker polls its queue (~20 commands/s here) in both modes; arq's
    # result polling is a four-command transaction a look.
    check_a_small_run("arq", tmp_path)
