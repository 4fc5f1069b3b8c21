"""Fixtures of the pipeline tests: one local Spark session for the whole run, and
one local standalone cluster for the tests that need it.

Spark sessions take seconds to start, so every Spark test shares this one
(``local[2]``, loopback only, UI off, 2 shuffle partitions, the venv's python
for workers; see :func:`aiopurgatory.pipeline.session.get_spark`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from aiopurgatory.pipeline.cluster import LocalCluster, java_missing

pytest.importorskip("pyspark")
pytest.importorskip("pandas")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from aiopurgatory.pipeline.session import get_spark

    session = get_spark("local[2]", app_name="aiopurgatory-tests", shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A standalone cluster (Master, two 1-core Workers) and a Spark Connect server
    on 127.0.0.1, started once for the run and stopped by pid at the end, whatever
    the tests did (see :mod:`aiopurgatory.pipeline.cluster`)."""
    if java_missing():
        pytest.skip("Java is missing (no java on PATH, no JAVA_HOME): cannot start Spark")
    cluster = LocalCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
