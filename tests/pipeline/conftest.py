"""Fixtures of the pipeline tests: one local Spark session for the whole run.

Spark sessions take seconds to start, so every Spark test shares this one
(``local[2]``, loopback only, UI off, 2 shuffle partitions, the venv's python
for workers; see :func:`aiopurgatory.pipeline.session.get_spark`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pandas")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from aiopurgatory.pipeline.session import get_spark

    session = get_spark("local[2]", app_name="aiopurgatory-tests", shuffle_partitions=2)
    yield session
    session.stop()
