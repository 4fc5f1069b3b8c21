"""Fixtures of the pipeline tests: one local Spark session for the whole run, and
one local standalone cluster for the tests that need it.

Spark sessions take seconds to start, so every Spark test shares this one
(``local[2]``, loopback only, UI off, 2 shuffle partitions, the venv's python
for workers; see :func:`aiopurgatory.pipeline.session.get_spark`).

Every JVM the tests start (this process's driver, the drivers of the commands run
in subprocesses, the cluster's daemons and executors) runs with :data:`FAST_JVM`:
the client compiler only and the serial collector. A Spark JVM spends most of a
short job compiling itself and collecting with threads the 2 cores do not have;
with these options an ``aiopurgatory analyze`` of 1,500 events took 37 CPU seconds
instead of 74 here. The drivers the tests start (this process's, and those of the
commands in subprocesses, which inherit ``PYSPARK_SUBMIT_ARGS``) also leave out
Spark SQL's whole-stage code generation: for the tests' small tables, compiling
the generated Java of each query (Janino, then the JIT) costs more than it saves
(the pipeline's local Spark tests took 97 CPU seconds instead of 113 without it,
in one run here); Spark runs the same physical plan operator by operator. (A
``-Dspark.*`` option cannot go into the executors' Java options, which Spark
refuses; the driver plans the queries anyway.) These options change how fast the
JVM gets, never what Spark computes (the tests compare every table with the
pure-Python pipeline's).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiopurgatory.pipeline.cluster import LocalCluster, java_missing

pytest.importorskip("pyspark")
pytest.importorskip("pandas")

#: JVM options of every Spark JVM of the tests (see the module's docstring).
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: Spark settings of every driver of the tests (see the module's docstring).
FAST_SQL = "spark.sql.codegen.wholeStage=false"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A module's Spark Connect runs after its other tests: the Connect server keeps
    # an executor that holds blocks for a minute after its job (LocalCluster), and
    # a spark:// application started meanwhile would wait for that core.
    def connect(item: pytest.Item) -> bool:
        callspec = getattr(item, "callspec", None)
        return callspec is not None and callspec.params.get("kind") == "connect"

    first: dict[Path, int] = {}
    for index, item in enumerate(items):
        first.setdefault(item.path, index)
    items.sort(key=lambda item: (first[item.path], connect(item)))  # stable otherwise


@pytest.fixture(scope="session", autouse=True)
def _fast_spark_jvms() -> Iterator[None]:
    # Drivers read PYSPARK_SUBMIT_ARGS when they launch their JVM (the library
    # only sets it when absent: keep its log4j2 file); subprocesses inherit it.
    # Executors of local masters live in the driver's JVM; those of a cluster
    # get the options from the cluster (java_options) or from the driver's conf.
    from aiopurgatory.pipeline.session import _LOG4J2

    submit_args = (
        f'--driver-java-options "-Dlog4j2.configurationFile={_LOG4J2.as_uri()} {FAST_JVM}" '
        f'--conf "spark.executor.extraJavaOptions={FAST_JVM}" --conf "{FAST_SQL}" pyspark-shell'
    )
    with pytest.MonkeyPatch.context() as patch:
        if "PYSPARK_SUBMIT_ARGS" not in os.environ:
            patch.setenv("PYSPARK_SUBMIT_ARGS", submit_args)
        yield


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
    cluster = LocalCluster(
        tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1, java_options=FAST_JVM
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
