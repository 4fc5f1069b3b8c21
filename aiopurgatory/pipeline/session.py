"""Spark session set-up shared by the pipeline commands.

Defaults suit one machine (``local[*]``): loopback only, no web UI, no console
progress bar, few shuffle partitions, Spark's own logging at error level. A
``sc://host:port`` master connects through Spark Connect instead
(``SparkSession.builder.remote``); everything in the pipeline uses DataFrame
APIs only, so it runs there too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_MASTER", "get_spark", "is_connect"]

DEFAULT_MASTER = "local[*]"

_LOG4J2 = Path(__file__).with_name("log4j2.properties")


def is_connect(master: str) -> bool:
    """True if ``master`` is a Spark Connect URL (``sc://...``)."""
    return master.startswith("sc://")


def get_spark(
    master: str = DEFAULT_MASTER,
    *,
    app_name: str = "aiopurgatory",
    shuffle_partitions: int | None = None,
    conf: Mapping[str, str] | None = None,
) -> Any:
    """Get (or create) a SparkSession for the pipeline.

    Args:
        master: ``local[N]``/``local[*]``, ``spark://host:port``, ``yarn``, ``k8s://...``
            (the classic driver runs in this process), or ``sc://host:port`` for Spark
            Connect (the driver runs in the Connect server).
        app_name: the Spark application name.
        shuffle_partitions: ``spark.sql.shuffle.partitions``; default: 2 per local
            core for ``local`` masters, else Spark's own default.
        conf: more Spark settings, applied last.

    Returns:
        A ``pyspark.sql.SparkSession``. If one is already active in this process it
        is returned (Spark allows one classic session per JVM) with ``conf`` applied
        where settable at runtime.

    Raises:
        TypeError: ``master`` is not a string.
        ValueError: ``master`` is empty.
    """
    if not isinstance(master, str):
        raise TypeError(f"master must be a str, got {type(master).__name__}")
    if not master:
        raise ValueError("master must not be empty")
    from pyspark.sql import SparkSession

    settings: dict[str, str] = {}
    if shuffle_partitions is not None:
        settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    settings.update(conf or {})

    if is_connect(master):
        builder = SparkSession.builder.remote(master).appName(app_name)
        for key, value in settings.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()

    # Workers must run this interpreter (with the project installed), not the
    # system python3, or the pandas UDFs fail to import aiopurgatory.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        # Loopback only: nothing listens on outside interfaces on a laptop/CI.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # The driver JVM is launched (by spark-submit) before the builder's settings
    # reach it, so JVM options must go on the submit command line.
    os.environ.setdefault(
        "PYSPARK_SUBMIT_ARGS",
        f'--driver-java-options "-Dlog4j2.configurationFile={_LOG4J2.as_uri()}" pyspark-shell',
    )
    base = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    if master.startswith("local"):
        base["spark.driver.host"] = "127.0.0.1"
        base["spark.driver.bindAddress"] = "127.0.0.1"
        if shuffle_partitions is None:
            base["spark.sql.shuffle.partitions"] = str(2 * _local_cores(master))
    base.update(settings)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in base.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _local_cores(master: str) -> int:
    inside = master[master.find("[") + 1 : master.find("]")] if "[" in master else "1"
    if inside.startswith("*") or not inside.split(",")[0].isdigit():
        return os.cpu_count() or 1
    return max(1, int(inside.split(",")[0]))
