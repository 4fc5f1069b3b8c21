"""Spark master URLs: parsing, the reachability probe, and the CLIs failing fast on a
master that is not there (no Spark session is started for these tests)."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from aiopurgatory.cli import main as cli
from aiopurgatory.pipeline.cluster import _free_port
from aiopurgatory.pipeline.session import (
    MasterUnreachableError,
    SparkSetupError,
    check_executors,
    check_reachable,
    get_spark,
    master_endpoints,
    missing_inputs,
    spark_path,
)
from aiopurgatory.pipeline.trace import TraceSpec, generate_trace_table, write_trace


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound for a moment, then released)."""
    return _free_port()


@pytest.mark.parametrize(
    ("master", "endpoints"),
    [
        ("spark://127.0.0.1:7078", [("127.0.0.1", 7078)]),
        ("spark://node-a", [("node-a", 7077)]),
        ("spark://a:7077,b:7078", [("a", 7077), ("b", 7078)]),
        ("sc://localhost", [("localhost", 15002)]),
        ("sc://h.example:443/;token=abc;use_ssl=true", [("h.example", 443)]),
        ("sc://[::1]:15003", [("::1", 15003)]),
        ("local[2]", []),
        ("yarn", []),
        ("k8s://https://k8s.example:6443", []),
    ],
)
def test_master_endpoints(master: str, endpoints: list[tuple[str, int]]) -> None:
    assert master_endpoints(master) == endpoints


@pytest.mark.parametrize("master", ["spark://", "spark://h:port", "sc://h:0", "sc://h:70000"])
def test_malformed_master_is_a_value_error_naming_it(master: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"master {master!r}")):
        master_endpoints(master)


def test_master_of_the_wrong_type() -> None:
    with pytest.raises(TypeError, match="master must be a str"):
        master_endpoints(7077)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="master must be a str"):
        get_spark(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("scheme", ["spark", "sc"])
def test_unreachable_master_fails_fast_naming_the_url(scheme: str, closed_port: int) -> None:
    master = f"{scheme}://127.0.0.1:{closed_port}"
    started = time.monotonic()
    with pytest.raises(MasterUnreachableError) as caught:
        get_spark(master)
    assert time.monotonic() - started < 10  # Spark alone would retry for about a minute
    assert master in str(caught.value)
    assert "refused" in str(caught.value).lower()
    assert isinstance(caught.value, SparkSetupError)
    assert isinstance(caught.value, ConnectionError)


def test_one_reachable_standalone_master_is_enough(closed_port: int) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        check_reachable(f"spark://127.0.0.1:{closed_port},127.0.0.1:{port}")
        check_reachable(f"sc://127.0.0.1:{port}")
    with pytest.raises(MasterUnreachableError, match=f"127.0.0.1:{closed_port}: "):
        check_reachable(f"spark://127.0.0.1:{closed_port}")


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), True])
def test_probe_timeout_must_be_positive(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        check_reachable("spark://127.0.0.1:7077", timeout)


def test_local_and_cluster_managers_are_not_probed() -> None:
    for master in ("local[*]", "yarn", "k8s://https://127.0.0.1:1"):
        check_reachable(master)


@pytest.mark.parametrize("command", ["replay", "analyze"])
@pytest.mark.parametrize("scheme", ["spark", "sc"])
def test_cli_prints_one_line_and_exits_non_zero(
    command: str,
    scheme: str,
    closed_port: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    master = f"{scheme}://127.0.0.1:{closed_port}"
    out = tmp_path / "out"
    (tmp_path / "input").mkdir()
    source = tmp_path / "input"
    if command == "replay":  # a trace: the inputs are checked before the master
        source = write_trace(generate_trace_table(TraceSpec(requests=10)), source / "t.parquet")
    status = cli([command, str(source), "--out", str(out), "--master", master])
    assert status == 1
    err = capsys.readouterr().err
    assert err.startswith(f"aiopurgatory {command}: cannot reach the Spark")
    assert master in err
    assert err.count("\n") == 1  # one line, no traceback
    assert not out.exists()  # failed before writing anything


def test_cli_rejects_a_malformed_master(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = cli(
        ["analyze", str(tmp_path), "--out", str(tmp_path / "o"), "--master", "spark://h:x"]
    )
    assert status == 2  # a user's mistake, found before anything starts
    assert "aiopurgatory analyze: master 'spark://h:x': expected spark://host:port" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("command", ["replay", "analyze"])
def test_cli_names_a_missing_input_without_starting_spark(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "present.jsonl").write_text("")
    inputs = [str(tmp_path / "absent.parquet")]
    if command == "analyze":
        inputs = [str(tmp_path / "present.jsonl"), str(tmp_path / "*.nothing"), *inputs]
    out = tmp_path / "out"
    started = time.monotonic()
    assert cli([command, *inputs, "--out", str(out), "--master", "local[1]"]) == 2
    assert time.monotonic() - started < 10  # no Spark session
    err = capsys.readouterr().err
    missing = ", ".join(inputs[1:] if command == "analyze" else inputs)
    assert err == f"aiopurgatory {command}: no such file or directory: {missing}\n"
    assert not out.exists()


def test_missing_inputs_skips_uris(tmp_path: Path) -> None:
    assert missing_inputs(["s3a://bucket/x", "file:/nope", str(tmp_path)]) == []
    assert missing_inputs([str(tmp_path / "a?c")]) == [str(tmp_path / "a?c")]


def test_spark_path() -> None:
    assert spark_path("s3a://bucket/key") == "s3a://bucket/key"
    assert spark_path("file:/tmp/x") == "file:/tmp/x"
    assert spark_path("/abs/x") == "/abs/x"
    assert spark_path("rel/x") == str(Path.cwd() / "rel" / "x")
    assert spark_path(Path("rel")) == str(Path.cwd() / "rel")


class _Rows:
    """What ``spark.range(...).mapInPandas(...)`` gives check_executors: collected rows,
    or the error a failed job raises (the real jobs run in test_cluster.py)."""

    def __init__(self, version: str = "", error: Exception | None = None) -> None:
        self.version = version
        self.error = error

    def range(self, *args: object, **kwargs: object) -> _Rows:
        return self

    def mapInPandas(self, *args: object) -> _Rows:
        return self

    def collect(self) -> list[Any]:
        if self.error is not None:
            raise self.error
        row = {"version": self.version, "compiled": True, "python": "3.11.7"}
        return [type("Row", (), {"asDict": lambda self: row})()]


def test_check_executors_reports_what_they_have() -> None:
    import aiopurgatory

    found = check_executors(_Rows(aiopurgatory.__version__), "spark://h:1")
    assert found == {"version": aiopurgatory.__version__, "compiled": True, "python": "3.11.7"}


def test_check_executors_refuses_another_version() -> None:
    with pytest.raises(
        SparkSetupError, match=r"executors of spark://h:1 have aiopurgatory 0\.0\.1"
    ):
        check_executors(_Rows("0.0.1"), "spark://h:1")


def test_check_executors_names_the_python_error_in_one_line() -> None:
    text = (
        "An exception was thrown from the Python worker. Please see the stack trace below.\n"
        "Traceback (most recent call last):\n"
        '  File "worker.py", line 1, in main\n'
        "ModuleNotFoundError: No module named 'aiopurgatory'\n\n"
        "JVM stacktrace:\norg.apache.spark.api.python.PythonException: boom\n"
    )
    with pytest.raises(SparkSetupError) as caught:
        check_executors(_Rows(error=RuntimeError(text)), "sc://h:2")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("the executors of sc://h:2 cannot run the pipeline's Python code")
    assert "(ModuleNotFoundError: No module named 'aiopurgatory')" in message
