"""A local standalone Spark cluster and a Spark Connect server, from the installed pyspark.

``python -m aiopurgatory.pipeline.cluster up`` (``make cluster-up``) starts, from
the ``bin/`` scripts that the pyspark package ships (nothing is downloaded):

* one standalone Master (``spark-class ...deploy.master.Master``),
* ``--workers`` Workers (default 2) of ``--cores`` cores each (default 1),
* a Spark Connect server (``spark-submit --class ...SparkConnectServer``, what
  ``sbin/start-connect-server.sh`` runs) whose driver uses that Master,

all bound to 127.0.0.1 on free ports, and waits until the Master reports every
Worker alive and the Connect port accepts connections. It prints the URLs for
``--master``. ``down`` (``make cluster-down``) stops every process it started,
by the process ids it recorded (each checked against its start time, so a
recycled pid is never signalled). ``status`` prints the recorded state.

Everything lives under ``--dir`` (default ``.spark-cluster``): ``cluster.json``
(urls, ports, pids), one log file per process, the Spark configuration, the
Workers' work directories and scratch space.

Processes run this interpreter's Python for their Python workers
(``PYSPARK_PYTHON``), so executors import the installed ``aiopurgatory``. The
Connect server allocates executors dynamically (none while idle), so that a
classic ``spark://`` application and Connect sessions can take turns on the
same small cluster instead of one holding every core.

The tests use :class:`LocalCluster` directly (``tests/pipeline/test_cluster.py``).
How a started process is told from a recycled pid, and what the state file
records, is in :mod:`aiopurgatory.pipeline.cluster_processes`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path
from types import TracebackType
from typing import Any

# The processes started, and the state file's records: a module of their own.
from .cluster_processes import _children, _Process, _start_ticks, _State, _tail

__all__ = ["ClusterError", "LocalCluster", "java_missing", "main", "spark_home"]

#: Seconds to wait for the cluster to come up (JVM starts on a loaded 2-core machine).
DEFAULT_TIMEOUT = 180.0
_STATE = "cluster.json"
_HOST = "127.0.0.1"
_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"

# Daemons log lifecycle events (start, registration, lost workers) at info and
# everything else at warn, to stderr, which goes to the process's log file.
_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n%ex
logger.deploy.name = org.apache.spark.deploy
logger.deploy.level = info
logger.connect.name = org.apache.spark.sql.connect.service
logger.connect.level = info
"""


class ClusterError(RuntimeError):
    """The local cluster could not be started, found or stopped; the message says why
    (with the tail of the log of a process that failed to start)."""


def spark_home() -> Path:
    """The Spark installation inside the installed ``pyspark`` package.

    Raises:
        ClusterError: pyspark is not installed, or its ``bin/spark-class`` is missing.
    """
    try:
        import pyspark
    except ImportError as exc:
        raise ClusterError(f"pyspark is missing ({exc}): install aiopurgatory[spark]") from None
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file():
        raise ClusterError(f"{home} has no bin/spark-class: not a pip-installed pyspark")
    return home


def java_missing() -> bool:
    """True if neither ``java`` on PATH nor ``JAVA_HOME`` is there to start Spark with."""
    return shutil.which("java") is None and not os.environ.get("JAVA_HOME")


def _get_json(url: str, timeout: float = 5) -> Any:
    """GET ``url`` and parse its JSON body (a Spark web UI or REST API page)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


#: How many times :meth:`LocalCluster.start` picks new ports when a process found
#: one of its ports taken (the log line of Java's BindException).
_START_ATTEMPTS = 3
_PORT_TAKEN = "Address already in use"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class LocalCluster:
    """A standalone Spark cluster (one Master, N Workers) and a Spark Connect server
    on 127.0.0.1, run from the installed pyspark's scripts.

    Args:
        directory: where the logs, the state file and the work directories go.
        workers: number of Workers, >= 1.
        cores: cores per Worker, >= 1.
        worker_memory: memory per Worker for executors (Spark size string, e.g. ``2g``).
        connect: also start a Spark Connect server on the cluster.
        python: the Python the executors run (``PYSPARK_PYTHON``); it must have
            ``aiopurgatory[spark]`` installed. Default: this interpreter.
        timeout: seconds to wait for start-up.
        java_options: options for every JVM of the cluster (Master, Workers, the
            executors they start for any application, the Connect server), passed
            in ``JAVA_TOOL_OPTIONS``; e.g. ``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC``,
            which halves the CPU of short jobs (the test suite's cluster). Each JVM
            says "Picked up JAVA_TOOL_OPTIONS" in its log.

    Raises:
        TypeError, ValueError: a bad argument (named in the message).

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        workers: int = 2,
        cores: int = 1,
        worker_memory: str = "2g",
        connect: bool = True,
        python: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        java_options: str = "",
    ) -> None:
        if not isinstance(java_options, str):
            raise TypeError(f"java_options must be a str, got {type(java_options).__name__}")
        for name, value in (("workers", workers), ("cores", cores)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.directory = Path(directory).absolute()
        self.workers = workers
        self.cores = cores
        self.worker_memory = worker_memory
        self.connect = connect
        self.python = python or sys.executable
        self.timeout = float(timeout)
        self.java_options = java_options
        self._state: _State | None = None
        self._popens: dict[str, subprocess.Popen[bytes]] = {}

    # -- urls ----------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:PORT`` of the Master."""
        return f"spark://{_HOST}:{self._started().master_port}"

    @property
    def master_ui_url(self) -> str:
        """The Master's web UI (its ``/json/`` page lists the Workers)."""
        return f"http://{_HOST}:{self._started().master_ui_port}"

    @property
    def connect_url(self) -> str:
        """``sc://127.0.0.1:PORT`` of the Spark Connect server.

        Raises:
            ClusterError: the cluster was started without a Connect server.
        """
        port = self._started().connect_port
        if port is None:
            raise ClusterError("this cluster was started without a Spark Connect server")
        return f"sc://{_HOST}:{port}"

    def _started(self) -> _State:
        if self._state is None:
            raise ClusterError(f"no cluster started from {self.directory}")
        return self._state

    # -- start ---------------------------------------------------------------------

    def start(self) -> LocalCluster:
        """Start the Master, the Workers and the Connect server; wait until all are ready.

        Returns:
            ``self``.

        Raises:
            ClusterError: Java or pyspark is missing, a cluster recorded in the
                directory is still running, or a process exited or was not ready in
                time (the message has its log's tail). Whatever had started is
                stopped again. A process that found a port taken (picked free, bound
                by another process before it) is no failure: the cluster starts again
                on new ports, up to 3 times.
        """
        if java_missing():
            raise ClusterError("Java is missing: put java (17 or later) on PATH or set JAVA_HOME")
        home = spark_home()
        previous = _load_state(self.directory)
        if previous is not None and any(p.alive() for p in previous.processes):
            raise ClusterError(
                f"a cluster recorded in {self.directory / _STATE} is still running; "
                "stop it first (make cluster-down)"
            )
        for sub in ("conf", "logs", "work", "local"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        (self.directory / "conf" / "log4j2.properties").write_text(_LOG4J2)
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                self._start_once(home)
            except ClusterError as exc:
                self.stop()
                # A free port is free when picked, not when the JVM binds it:
                # another process may take it in between. Start again on others.
                if attempt == _START_ATTEMPTS or _PORT_TAKEN not in str(exc):
                    raise
            except BaseException:
                self.stop()
                raise
            else:
                return self
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_once(self, home: Path) -> None:
        self._state = _State(
            directory=str(self.directory),
            python=self.python,
            master_port=_free_port(),
            master_ui_port=_free_port(),
            connect_port=_free_port() if self.connect else None,
            workers=self.workers,
            cores=self.cores,
        )
        self._launch_master(home)
        # Workers started before the Master listens retry only after ~10 s.
        self.wait_for_workers()
        for index in range(1, self.workers + 1):
            self._launch_worker(home, index)
        self.wait_for_workers()
        if self.connect:
            self._launch_connect(home)
            self._wait_for_connect()

    def _env(self, home: Path) -> dict[str, str]:
        # A clean Spark environment: nothing of a driver set up in this process
        # (PYSPARK_SUBMIT_ARGS, Connect mode flags) leaks into the daemons.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.update(
            SPARK_HOME=str(home),
            SPARK_CONF_DIR=str(self.directory / "conf"),
            SPARK_LOCAL_IP=_HOST,
            SPARK_LOCAL_DIRS=str(self.directory / "local"),
            SPARK_WORKER_DIR=str(self.directory / "work"),
            SPARK_NO_DAEMONIZE="1",
            PYSPARK_PYTHON=self.python,
            PYSPARK_DRIVER_PYTHON=self.python,
        )
        if self.java_options:
            # The Workers start executors with their own environment: this reaches them too.
            inherited = env.get("JAVA_TOOL_OPTIONS", "")
            env["JAVA_TOOL_OPTIONS"] = f"{inherited} {self.java_options}".strip()
        return env

    def _spawn(self, name: str, argv: list[str], home: Path, port: int | None = None) -> None:
        state = self._started()
        log = self.directory / "logs" / f"{name}.log"
        with log.open("ab") as out:
            # A session of its own: the cluster outlives `cluster up` and a
            # Ctrl-C in the terminal that started it.
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._env(home),
                cwd=self.directory,
                start_new_session=True,
            )
        # spark-class execs java, so this pid is the JVM's once it runs; the
        # start time stays the same across exec.
        ticks = _start_ticks(popen.pid)
        if ticks is None:
            popen.wait()
            raise ClusterError(f"{name} exited at once; last lines of {log}:\n{_tail(log)}")
        state.processes = [p for p in state.processes if p.name != name]
        state.processes.append(_Process(name, popen.pid, ticks, str(log), port))
        self._popens[name] = popen
        self._save()

    def _launch_master(self, home: Path) -> None:
        state = self._started()
        conf = self.directory / "conf" / "master.properties"
        conf.write_text(
            # Fail on a port taken since it was picked, rather than move to the next one.
            "spark.port.maxRetries 0\n"
            # Notice a killed Worker within seconds, not the default minute.
            "spark.worker.timeout 10\n"
            # No REST submission server (it would listen on the fixed port 6066).
            "spark.master.rest.enabled false\n"
        )
        self._spawn(
            "master",
            [
                str(home / "bin" / "spark-class"),
                _MASTER_CLASS,
                "--host",
                _HOST,
                "--port",
                str(state.master_port),
                "--webui-port",
                str(state.master_ui_port),
                "--properties-file",
                str(conf),
            ],
            home,
        )

    def _launch_worker(self, home: Path, index: int) -> None:
        conf = self.directory / "conf" / "worker.properties"
        # As the Master's: a taken port fails, and the Worker keeps the recorded port.
        conf.write_text("spark.port.maxRetries 0\nspark.worker.timeout 10\n")
        port = _free_port()
        self._spawn(
            f"worker-{index}",
            [
                str(home / "bin" / "spark-class"),
                _WORKER_CLASS,
                "--host",
                _HOST,
                "--port",
                str(port),
                "--webui-port",
                str(_free_port()),
                "--cores",
                str(self.cores),
                "--memory",
                self.worker_memory,
                "--work-dir",
                str(self.directory / "work" / f"worker-{index}"),
                "--properties-file",
                str(conf),
                self.master_url,
            ],
            home,
            port,
        )

    def _launch_connect(self, home: Path) -> None:
        state = self._started()
        conf = {
            "spark.connect.grpc.binding.address": _HOST,
            "spark.connect.grpc.binding.port": str(state.connect_port),
            "spark.driver.host": _HOST,
            "spark.driver.bindAddress": _HOST,
            "spark.ui.enabled": "false",
            "spark.pyspark.python": self.python,
            "spark.sql.session.timeZone": "UTC",
            # Executors only while there is work: a Connect server holds no core
            # when idle, so classic applications can use the cluster meanwhile.
            "spark.dynamicAllocation.enabled": "true",
            "spark.dynamicAllocation.shuffleTracking.enabled": "true",
            "spark.dynamicAllocation.shuffleTracking.timeout": "5s",
            "spark.dynamicAllocation.executorIdleTimeout": "5s",
            # Also executors holding blocks: analyze keeps its small tables by a
            # local checkpoint, and such executors would otherwise never idle out
            # (the default is never), starving spark:// applications for good. Not
            # within seconds, though: a local checkpoint lives only in its executor,
            # and a driver paused a few seconds between two jobs of one analyze
            # (a loaded machine) found its checkpoint gone with the executor
            # (CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND).
            "spark.dynamicAllocation.cachedExecutorIdleTimeout": "60s",
            "spark.dynamicAllocation.minExecutors": "0",
            "spark.executor.cores": str(self.cores),
        }
        argv = [
            str(home / "bin" / "spark-submit"),
            "--class",
            _CONNECT_CLASS,
            "--name",
            "aiopurgatory Spark Connect server",
            "--master",
            self.master_url,
        ]
        for key, value in conf.items():
            argv += ["--conf", f"{key}={value}"]
        self._spawn("connect", argv, home)

    # -- readiness -----------------------------------------------------------------

    def _check_running(self, names: list[str]) -> None:
        """Raise with the log tail if one of these processes has exited."""
        state = self._started()
        for process in state.processes:
            if process.name in names and not process.alive():
                popen = self._popens.get(process.name)
                code = popen.wait() if popen is not None else None
                raise ClusterError(
                    f"{process.name} exited during start-up (exit status {code}); "
                    f"last lines of {process.log}:\n{_tail(Path(process.log))}"
                )

    def master_json(self) -> dict[str, Any]:
        """The Master's ``/json/`` page: status, alive workers, applications.

        Raises:
            ClusterError: the Master does not answer.
        """
        try:
            data: dict[str, Any] = _get_json(f"{self.master_ui_url}/json/")
            return data
        except (OSError, ValueError) as exc:
            url = self.master_ui_url
            raise ClusterError(f"the Master at {url} does not answer: {exc}") from exc

    def wait_for_workers(self) -> None:
        """Wait until the Master is alive and counts every Worker started (or
        restarted) by this cluster as alive.

        Raises:
            ClusterError: a process exited, or not ready within the cluster's
                start-up timeout.
        """
        state = self._started()
        deadline = time.monotonic() + self.timeout
        workers = [p for p in state.processes if p.name.startswith("worker-")]
        names = ["master"] + [p.name for p in workers]
        seen = "no answer"
        while time.monotonic() < deadline:
            self._check_running(names)
            try:
                data = self.master_json()
            except ClusterError as exc:
                seen = str(exc)
            else:
                alive = {w["port"] for w in data.get("workers", []) if w.get("state") == "ALIVE"}
                ready = [p.name for p in workers if p.port in alive]
                seen = f"master {data.get('status')}, {len(ready)} of {len(workers)} workers alive"
                if data.get("status") == "ALIVE" and len(ready) == len(workers):
                    return
            time.sleep(0.5)
        logs = "\n".join(
            f"--- {p.log}:\n{_tail(Path(p.log), 10)}" for p in state.processes if p.name in names
        )
        raise ClusterError(f"cluster not ready after {self.timeout:.0f} s ({seen})\n{logs}")

    def _wait_for_connect(self) -> None:
        state = self._started()
        assert state.connect_port is not None
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            self._check_running(["connect", "master"])
            with contextlib.suppress(OSError):
                socket.create_connection((_HOST, state.connect_port), timeout=1).close()
                return
            time.sleep(0.5)
        log = self.directory / "logs" / "connect.log"
        raise ClusterError(
            f"the Spark Connect server did not accept connections on {self.connect_url} "
            f"after {self.timeout:.0f} s; last lines of {log}:\n{_tail(log)}"
        )

    # -- workers -------------------------------------------------------------------

    def worker_pid(self, index: int) -> int:
        """The pid of Worker ``index`` (1-based).

        Raises:
            ClusterError: no such Worker is running.
        """
        for process in self._started().processes:
            if process.name == f"worker-{index}" and process.alive():
                return process.pid
        raise ClusterError(f"worker-{index} is not running")

    def kill_worker(self, index: int) -> list[int]:
        """SIGKILL Worker ``index`` and every process under it (its executors and
        their Python workers), as if its machine died.

        Returns:
            The pids killed, the Worker's first.
        """
        pid = self.worker_pid(index)
        victims = [pid, *_children(pid)]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        popen = self._popens.pop(f"worker-{index}", None)
        if popen is not None:
            popen.wait(timeout=30)
        return victims

    def restart_worker(self, index: int) -> None:
        """Start Worker ``index`` again (after :meth:`kill_worker`) and wait until the
        Master counts all Workers alive."""
        self._launch_worker(spark_home(), index)
        self.wait_for_workers()

    # -- stop ----------------------------------------------------------------------

    def stop(self, grace: float = 15.0) -> list[str]:
        """Stop every process this cluster started (SIGTERM, then SIGKILL after
        ``grace`` seconds), Connect server first, and forget them.

        Returns:
            The names of the processes that were still running.
        """
        state = self._state
        if state is None:
            return []
        order = {"connect": 0, "master": 2}
        running = [p for p in state.processes if p.alive()]
        running.sort(key=lambda p: order.get(p.name, 1))
        for process in running:
            # Executors and Python workers under a Worker go with it.
            group = [process.pid, *_children(process.pid)]
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while process.alive() and time.monotonic() < deadline:
                self._reap(process.name)
                time.sleep(0.1)
            for pid in group:
                if _start_ticks(pid) is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        for name in list(self._popens):
            self._popens.pop(name).wait(timeout=30)
        state.processes = []
        with contextlib.suppress(FileNotFoundError):
            (self.directory / _STATE).unlink()
        return [p.name for p in running]

    def _reap(self, name: str) -> None:
        popen = self._popens.get(name)
        if popen is not None:
            popen.poll()

    def _save(self) -> None:
        state = self._started()
        path = self.directory / _STATE
        path.write_text(json.dumps(self.describe() | {"state": asdict(state)}, indent=2))

    def describe(self) -> dict[str, Any]:
        """URLs, log directory and processes (with whether each is alive)."""
        state = self._started()
        return {
            "master": self.master_url,
            "master_ui": self.master_ui_url,
            "connect": None if state.connect_port is None else self.connect_url,
            "logs": str(self.directory / "logs"),
            "processes": {p.name: {"pid": p.pid, "alive": p.alive()} for p in state.processes},
        }

    @classmethod
    def from_directory(cls, directory: str | os.PathLike[str]) -> LocalCluster | None:
        """The cluster recorded in ``directory`` by :meth:`start`, or None."""
        state = _load_state(Path(directory).absolute())
        if state is None:
            return None
        cluster = cls(
            state.directory,
            workers=state.workers,
            cores=state.cores,
            connect=state.connect_port is not None,
            python=state.python,
        )
        cluster._state = state
        return cluster

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _load_state(directory: Path) -> _State | None:
    try:
        data = json.loads((directory / _STATE).read_text())["state"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError) as exc:
        raise ClusterError(f"{directory / _STATE} is unreadable: {exc}") from exc
    processes = [_Process(**p) for p in data.pop("processes")]
    return _State(**data, processes=processes)


def main(argv: list[str] | None = None) -> int:
    """``python -m aiopurgatory.pipeline.cluster up|down|status``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m aiopurgatory.pipeline.cluster",
        description="A local standalone Spark cluster and Spark Connect server on 127.0.0.1.",
    )
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--dir", default=".spark-cluster", help="state, logs and work directory")
    parser.add_argument("--workers", type=int, default=2, help="number of Workers (up)")
    parser.add_argument("--cores", type=int, default=1, help="cores per Worker (up)")
    parser.add_argument("--worker-memory", default="2g", help="memory per Worker (up)")
    parser.add_argument("--no-connect", action="store_true", help="no Spark Connect server (up)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds (up)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    prog = "aiopurgatory cluster"
    try:
        if args.command == "up":
            cluster = LocalCluster(
                args.dir,
                workers=args.workers,
                cores=args.cores,
                worker_memory=args.worker_memory,
                connect=not args.no_connect,
                timeout=args.timeout,
            )
            started = time.perf_counter()
            cluster.start()
            info = cluster.describe()
            print(
                f"{prog}: up in {time.perf_counter() - started:.1f} s\n"
                f"  --master {info['master']}   (web UI {info['master_ui']})\n"
                + (f"  --master {info['connect']}   (Spark Connect)\n" if info["connect"] else "")
                + f"  logs in {info['logs']}; stop with: make cluster-down"
            )
            return 0
        found = LocalCluster.from_directory(args.dir)
        if found is None:
            print(f"{prog}: no cluster recorded in {args.dir}")
            return 0 if args.command == "down" else 1
        if args.command == "status":
            print(json.dumps(found.describe(), indent=2))
            return 0
        stopped = found.stop()
        print(f"{prog}: stopped {', '.join(stopped) or 'nothing (no process was running)'}")
        return 0
    except (ClusterError, TypeError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
