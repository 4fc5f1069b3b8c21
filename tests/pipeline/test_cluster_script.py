"""The cluster script's bookkeeping without Spark: arguments, the state file, and
stopping exactly the recorded processes (a stand-in process plays a daemon).

The real start-up, readiness and shutdown run in ``test_cluster.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiopurgatory.pipeline import cluster
from aiopurgatory.pipeline.cluster import ClusterError, LocalCluster
from aiopurgatory.pipeline.cluster_processes import _start_ticks


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"workers": 0}, ValueError, "workers must be at least 1"),
        ({"cores": 0}, ValueError, "cores must be at least 1"),
        ({"workers": 1.5}, TypeError, "workers must be an int"),
        ({"cores": True}, TypeError, "cores must be an int"),
        ({"timeout": 0}, ValueError, "timeout must be"),
        ({"java_options": ["-Xmx1g"]}, TypeError, "java_options must be a str"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        LocalCluster("/tmp/unused", **kwargs)  # type: ignore[arg-type]


def test_urls_before_start_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="no cluster started"):
        _ = LocalCluster(tmp_path).master_url


def test_down_and_status_without_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cluster.main(["down", "--dir", str(tmp_path)]) == 0
    assert cluster.main(["status", "--dir", str(tmp_path)]) == 1
    assert capsys.readouterr().out.count(f"no cluster recorded in {tmp_path}") == 2


def test_missing_java_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert cluster.main(["up", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == (
        "aiopurgatory cluster: Java is missing: put java (17 or later) on PATH or set JAVA_HOME\n"
    )
    assert not (tmp_path / "cluster.json").exists()


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process recorded as a cluster's Worker in ``tmp_path/cluster.json``."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    ticks = _start_ticks(process.pid)
    assert ticks is not None
    state = {
        "directory": str(tmp_path),
        "python": sys.executable,
        "master_port": 1,
        "master_ui_port": 2,
        "connect_port": None,
        "workers": 1,
        "cores": 1,
        "processes": [
            {"name": "worker-1", "pid": process.pid, "start_ticks": ticks, "log": "w.log"}
        ],
    }
    (tmp_path / "cluster.json").write_text(json.dumps({"state": state}))
    yield process
    if process.poll() is None:
        process.kill()
    process.wait()


def test_up_refuses_to_start_over_a_running_cluster(
    tmp_path: Path, stand_in: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cluster.main(["up", "--dir", str(tmp_path)]) == 1
    assert "is still running; stop it first (make cluster-down)" in capsys.readouterr().err
    assert stand_in.poll() is None


def test_down_stops_the_recorded_process_by_pid(
    tmp_path: Path, stand_in: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cluster.main(["status", "--dir", str(tmp_path)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["processes"] == {"worker-1": {"pid": stand_in.pid, "alive": True}}
    assert cluster.main(["down", "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "aiopurgatory cluster: stopped worker-1\n"
    assert stand_in.wait(timeout=30) == -15  # SIGTERM
    assert not (tmp_path / "cluster.json").exists()


def test_a_reused_pid_is_never_signalled(
    tmp_path: Path, stand_in: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    # Same pid, another start time: another process that got the recorded pid.
    path = tmp_path / "cluster.json"
    data = json.loads(path.read_text())
    data["state"]["processes"][0]["start_ticks"] -= 1
    path.write_text(json.dumps(data))
    assert cluster.main(["down", "--dir", str(tmp_path)]) == 0
    assert "stopped nothing (no process was running)" in capsys.readouterr().out
    assert stand_in.poll() is None
    assert os.path.exists(f"/proc/{stand_in.pid}")
