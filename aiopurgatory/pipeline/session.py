"""Spark session set-up shared by the pipeline commands.

Defaults suit one machine (``local[*]``): loopback only, no web UI, no console
progress bar, few shuffle partitions, Spark's own logging at error level. A
``sc://host:port`` master connects through Spark Connect instead
(``SparkSession.builder.remote``); everything in the pipeline uses DataFrame
APIs only, so it runs there too.

Before a session is built for a ``spark://`` or ``sc://`` master, its TCP port is
probed with a short timeout, so that a wrong or stopped master fails at once
with :class:`MasterUnreachableError` naming the URL (Spark itself would retry for
a minute and end in a Java stack trace). Once the session is up, one tiny job
checks that the executors can import this ``aiopurgatory`` (same version): the
pipeline's tasks run its code on the executors, which must have it installed
(see ``docs/cluster.md``).
"""

from __future__ import annotations

import argparse
import glob
import ipaddress
import os
import platform
import re
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "DEFAULT_MASTER",
    "PROBE_TIMEOUT",
    "MasterUnreachableError",
    "SparkSetupError",
    "add_session_options",
    "check_executors",
    "check_master",
    "check_reachable",
    "cli_session",
    "get_spark",
    "is_connect",
    "master_endpoints",
    "missing_inputs",
    "parse_conf",
    "spark_path",
]

DEFAULT_MASTER = "local[*]"
#: Seconds to wait for a ``spark://`` or ``sc://`` master's port to accept a connection.
PROBE_TIMEOUT = 5.0
_DEFAULT_PORTS = {"spark": 7077, "sc": 15002}

_LOG4J2 = Path(__file__).with_name("log4j2.properties")
#: A URI's scheme (``s3a:``, ``file:``, ``hdfs:``): such paths go to Spark unchanged.
_URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


class SparkSetupError(RuntimeError):
    """The pipeline cannot run on the given Spark master; the message says why."""


class MasterUnreachableError(SparkSetupError, ConnectionError):
    """A ``spark://`` or ``sc://`` master does not accept connections."""


#: The masters the pipeline takes (Spark's own forms): ``local``, ``local[N]``,
#: ``local[*]``, ``local[N,F]`` (F: task failures allowed), ``local-cluster[N,C,M]``,
#: ``yarn``, and URLs ``spark://``, ``sc://``, ``k8s://``.
_MASTER_FORMS = re.compile(
    r"local(\[(\*|[1-9]\d*)(\s*,\s*[1-9]\d*)?\])?"
    r"|local-cluster\[\s*[1-9]\d*\s*,\s*[1-9]\d*\s*,\s*[1-9]\d*\s*\]"
    r"|yarn|(spark|sc|k8s)://\S+"
)


def check_master(master: str) -> None:
    """Refuse a master that Spark would refuse, before starting anything.

    Raises:
        TypeError: ``master`` is not a string.
        ValueError: a master of none of Spark's forms (``bogus``, ``local[x]``), or a
            malformed ``spark://``/``sc://`` URL; the message names it and the forms.
    """
    if not isinstance(master, str):
        raise TypeError(f"master must be a str, got {type(master).__name__}")
    if not _MASTER_FORMS.fullmatch(master):
        raise ValueError(
            f"master {master!r} is not a Spark master: expected local, local[N], local[*], "
            "spark://host:port, sc://host:port, yarn or k8s://..."
        )
    master_endpoints(master)


def add_session_options(parser: argparse.ArgumentParser) -> None:
    """``--master`` and ``--conf``: the Spark session of a command (``analyze``,
    ``replay``), as :func:`cli_session` takes them (``--conf`` through :func:`parse_conf`)."""
    parser.add_argument(
        "--master",
        default=DEFAULT_MASTER,
        help="Spark master: local[*] (default), local[N], spark://host:port, yarn, k8s://..., "
        "or sc://host:port (Spark Connect)",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting (repeatable)",
    )


def parse_conf(items: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings -> dict; raises ValueError naming a bad item."""
    conf = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--conf: expected KEY=VALUE, got {item!r}")
        conf[key] = value
    return conf


def is_connect(master: str) -> bool:
    """True if ``master`` is a Spark Connect URL (``sc://...``)."""
    return master.startswith("sc://")


def master_endpoints(master: str) -> list[tuple[str, int]]:
    """The (host, port) pairs of a ``spark://`` or ``sc://`` master; [] for others.

    ``spark://h1:7077,h2:7077`` (standalone masters with standby) gives two pairs;
    the default ports are 7077 (``spark://``) and 15002 (``sc://``). A Connect URL's
    ``/;token=...`` parameters are ignored.

    Raises:
        TypeError: ``master`` is not a string.
        ValueError: a ``spark://`` or ``sc://`` URL without a host or with a bad port.
    """
    if not isinstance(master, str):
        raise TypeError(f"master must be a str, got {type(master).__name__}")
    scheme, sep, rest = master.partition("://")
    if not sep or scheme not in _DEFAULT_PORTS:
        return []
    authority = rest.split("/", 1)[0]
    endpoints = []
    for item in authority.split(","):
        match = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^:\[\]]+)(?::(\d{1,5}))?", item.strip())
        if match is None or (match[2] is not None and not 0 < int(match[2]) < 65536):
            raise ValueError(f"master {master!r}: expected {scheme}://host:port, got {item!r}")
        port = int(match[2]) if match[2] is not None else _DEFAULT_PORTS[scheme]
        endpoints.append((match[1].strip("[]"), port))
    return endpoints


def check_reachable(master: str, timeout: float = PROBE_TIMEOUT) -> None:
    """Raise unless a ``spark://`` or ``sc://`` master accepts TCP connections.

    For a list of standalone masters, one reachable is enough. Other masters
    (``local``, ``yarn``, ``k8s://``) are not probed.

    Raises:
        MasterUnreachableError: no endpoint accepted a connection within ``timeout``
            seconds; the message names the URL.
        ValueError: a malformed ``spark://`` or ``sc://`` URL, or ``timeout`` <= 0.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    problems = []
    for host, port in master_endpoints(master):
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
            problems.append(f"{host}:{port}: {reason}")
        else:
            return
    if problems:
        kind = "Spark Connect server" if is_connect(master) else "Spark master"
        raise MasterUnreachableError(
            f"cannot reach the {kind} {master} ({'; '.join(problems)}); "
            "is it running, and is the URL right?"
        )


def _loopback(master: str) -> bool:
    """True for a ``spark://`` master whose hosts are all loopback addresses."""
    hosts = [host for host, _ in master_endpoints(master)]
    if not hosts:
        return False
    for host in hosts:
        if host == "localhost":
            continue
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return False
        except ValueError:
            return False
    return True


def spark_path(path: str | os.PathLike[str]) -> str:
    """A local path made absolute for Spark; a URI (``s3a://...``, ``file:/...``)
    unchanged.

    Relative paths are resolved by the driver, which for Spark Connect is the
    server, in its own working directory: the pipeline passes absolute ones.
    """
    text = os.fspath(path)
    if _URI_SCHEME.match(text):
        return text
    return str(Path(text).absolute())


def missing_inputs(paths: Sequence[str]) -> list[str]:
    """The local paths (no URI scheme) among ``paths`` that name nothing: no such
    file or directory, or a glob that matches nothing. URIs are not checked."""
    missing = []
    for path in paths:
        if _URI_SCHEME.match(path):
            continue
        found = glob.glob(path) if glob.has_magic(path) else os.path.exists(path)
        if not found:
            missing.append(path)
    return missing


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _probe_batches(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """Runs on an executor: which aiopurgatory and Python it has."""
    import pandas as pd

    import aiopurgatory

    for _ in batches:
        pass
    yield pd.DataFrame(
        {
            "version": [aiopurgatory.__version__],
            "compiled": [aiopurgatory.COMPILED],
            "python": [platform.python_version()],
        }
    )


def check_executors(spark: Any, master: str = "") -> dict[str, Any]:
    """Run one task that imports ``aiopurgatory`` on an executor; check its version.

    Returns:
        What the executor has: ``version``, ``compiled`` (its core), ``python``.

    Raises:
        SparkSetupError: the executor cannot import aiopurgatory (or pandas,
            pyarrow), or has another version of it than this process.
    """
    import aiopurgatory

    where = f"the executors of {master}" if master else "the executors"
    try:
        rows = (
            spark.range(1, numPartitions=1)
            .mapInPandas(_probe_batches, "version string, compiled boolean, python string")
            .collect()
        )
    except Exception as exc:
        text = str(exc)
        found = re.findall(r"^\s*(\w+(?:Error|Exception): .+)$", text, re.MULTILINE)
        python_errors = [line for line in found if not line.startswith(("org.", "java."))]
        reason = python_errors[-1] if python_errors else _first_line(exc)
        raise SparkSetupError(
            f"{where} cannot run the pipeline's Python code ({reason.strip()}); install "
            f"aiopurgatory[spark] {aiopurgatory.__version__} in the Python they run "
            "(PYSPARK_PYTHON, or spark.pyspark.python)"
        ) from None
    found_on = rows[0].asDict()
    if found_on["version"] != aiopurgatory.__version__:
        raise SparkSetupError(
            f"{where} have aiopurgatory {found_on['version']}, this process "
            f"{aiopurgatory.__version__}: install the same version on both"
        )
    return dict(found_on)


def get_spark(
    master: str = DEFAULT_MASTER,
    *,
    app_name: str = "aiopurgatory",
    shuffle_partitions: int | None = None,
    conf: Mapping[str, str] | None = None,
    probe_timeout: float = PROBE_TIMEOUT,
    check: bool = True,
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
        probe_timeout: seconds to wait for a ``spark://`` or ``sc://`` master's
            port before giving up (:func:`check_reachable`).
        check: for a master other than ``local``, run :func:`check_executors`
            once the session is up.

    Returns:
        A ``pyspark.sql.SparkSession``. If one is already active in this process it
        is returned (Spark allows one classic session per JVM) with ``conf`` applied
        where settable at runtime.

    Raises:
        TypeError: ``master`` is not a string.
        ValueError: ``master`` is empty, or a malformed ``spark://``/``sc://`` URL.
        MasterUnreachableError: a ``spark://`` or ``sc://`` master does not accept
            connections.
        SparkSetupError: the executors cannot import this aiopurgatory.
    """
    if not isinstance(master, str):
        raise TypeError(f"master must be a str, got {type(master).__name__}")
    if not master:
        raise ValueError("master must not be empty")
    check_master(master)
    check_reachable(master, probe_timeout)
    try:
        session = _build(master, app_name, shuffle_partitions, conf)
    except ImportError as exc:  # e.g. Spark Connect's client libraries
        raise SparkSetupError(f"no Spark session for {master}: {_first_line(exc)}") from exc
    except Exception as exc:
        if master.startswith("local"):
            raise
        if master_endpoints(master):
            # Something answers on the port, but it is not (a working) Spark.
            raise SparkSetupError(
                f"{master} accepts connections, but no Spark session could be made there: "
                f"{_first_line(exc)}"
            ) from exc
        raise SparkSetupError(
            f"no Spark session could be made on {master}: {_first_line(exc)}"
        ) from exc
    if check and not master.startswith("local"):
        try:
            check_executors(session, master)
        except SparkSetupError:
            # A session whose executors cannot run the pipeline is of no use: stop
            # it (and its executors' retries, whose Java errors would otherwise
            # follow the caller's one-line message on stderr).
            session.stop()
            raise
    return session


def cli_session(
    prog: str, master: str, inputs: Sequence[str], conf: Mapping[str, str]
) -> tuple[Any, int]:
    """For a command (``aiopurgatory replay``, ``analyze``): its session, once its
    local inputs are known to exist.

    Args:
        prog: the command's name, for messages; its app name is the same, hyphenated.
        master, conf: as for :func:`get_spark`.
        inputs: the paths the job reads.

    Returns:
        ``(session, 0)``; or ``(None, status)`` after printing why not on stderr:
        status 2 for a missing input, 1 for a master that cannot be used.
    """
    # A Spark Connect server resolves paths itself; a classic driver lists them here.
    missing = [] if is_connect(master) else missing_inputs(inputs)
    if missing:
        print(f"{prog}: no such file or directory: {', '.join(missing)}", file=sys.stderr)
        return None, 2
    try:
        return get_spark(master, app_name=prog.replace(" ", "-"), conf=conf), 0
    except (SparkSetupError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return None, 1
    except Exception as exc:  # e.g. no Java: Spark's gateway exits at once
        print(f"{prog}: could not start Spark ({master}): {_first_line(exc)}", file=sys.stderr)
        return None, 1


def _build(
    master: str, app_name: str, shuffle_partitions: int | None, conf: Mapping[str, str] | None
) -> Any:
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
    on_this_machine = master.startswith("local") or _loopback(master)
    if on_this_machine:
        # Loopback only: nothing listens on outside interfaces on a laptop/CI
        # (also for a cluster on 127.0.0.1, whose executors call back the driver).
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
    if on_this_machine:
        base["spark.driver.host"] = "127.0.0.1"
        base["spark.driver.bindAddress"] = "127.0.0.1"
    if master.startswith("local") and shuffle_partitions is None:
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
