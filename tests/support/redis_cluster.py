"""Real Redis past one server for the tests: a Redis Cluster and a Sentinel set-up.

:class:`ClusterServers` starts a 3-master/3-replica Redis Cluster (six
``redis-server --cluster-enabled yes``, joined by ``redis-cli --cluster create``)
and :class:`SentinelServers` a primary, a replica and three ``redis-server
--sentinel`` (quorum 2), each process on a loopback port in a directory of the
caller's, from Debian's ``redis-server`` (:func:`aiopurgatory.redis.testing.find_redis_server`).
Both wait until the set-up is whole (every slot served, every replica in sync,
every sentinel knowing the others) before handing it over, and both are tuned to
fail over in a few seconds (node timeout 1.5 s; down-after 1 s).

The helpers that break things wait until the set-up has healed:
:meth:`ClusterServers.kill_master` (SIGKILL a master, wait for its replica's
promotion and ``cluster_state:ok``), :meth:`ClusterServers.hang_master` (SIGSTOP
one, wait for its replica's promotion), :meth:`ClusterServers.migrate_slot`,
:meth:`ClusterServers.reshard`, :meth:`SentinelServers.kill_primary` and
:meth:`SentinelServers.failover`. They block: from async code, run them with
``await asyncio.to_thread(cluster.kill_master)`` so the loop under test keeps running.

The fixtures ``redis_cluster`` and ``redis_sentinel`` start one set-up per test
module (a start takes a few seconds) and kill every process at the end, whether
the tests passed or not; an ``atexit`` hook kills what an interrupted run left.
A test that breaks the set-up should call :meth:`ClusterServers.heal` /
:meth:`SentinelServers.heal` when done so the module's next test finds it whole.
A machine without ``redis-server`` or ``redis-cli`` FAILS the test with the
install instructions; it never skips.

Import the fixtures into a test module (or a conftest)::

    from tests.support.redis_cluster import redis_cluster, redis_sentinel  # noqa: F401
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TypeVar

import pytest
import redis

from aiopurgatory.redis.testing import (
    INSTALL_HINT,
    RedisServer,
    RedisServerMissing,
    find_redis_server,
)

__all__ = [
    "SLOTS",
    "ClusterNode",
    "ClusterServers",
    "SentinelServers",
    "find_redis_cli",
    "kill_pubsub_clients",
    "redis_cluster",
    "redis_sentinel",
]

SLOTS = 16384
_Setup = TypeVar("_Setup", "ClusterServers", "SentinelServers")
SERVICE = "mymaster"
# A replica (re)joining gets its copy at once: Redis otherwise waits 5 s for more
# replicas to share one diskless transfer.
_QUICK_SYNC = ("--repl-diskless-sync-delay", "0")

# Every set-up still running, for the atexit hook (a run interrupted before the
# fixtures' finalizers must not leave redis-servers behind).
_LIVE: set[_Processes] = set()


@atexit.register
def _kill_leftovers() -> None:
    for setup in list(_LIVE):
        setup.close()


def find_redis_cli() -> str:
    """The path of ``redis-cli`` (PATH, else /usr/bin; Debian's redis-tools, a
    dependency of redis-server).

    Raises:
        RedisServerMissing: none found (the message says how to install it).
    """
    found = shutil.which("redis-cli") or (
        "/usr/bin/redis-cli" if os.access("/usr/bin/redis-cli", os.X_OK) else None
    )
    if found is None:
        raise RedisServerMissing(f"redis-cli is missing. {INSTALL_HINT}")
    return found


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int, *, bus: bool) -> list[int]:
    """``count`` free loopback ports; with ``bus``, each one's port + 10000 free too.

    A cluster node also listens on its bus port (port + 10000), so its port must be
    below 55536; the kernel's ephemeral ports (bind to 0) mostly are not, hence a
    random pick in a low range rather than bind(0).
    """
    ports: list[int] = []
    tried = 0
    while len(ports) < count:
        tried += 1
        if tried > 2000:
            raise RuntimeError("found no free loopback ports for Redis")
        port = random.randrange(20000, 45000)
        if port in ports or (bus and port + 10000 in ports):
            continue
        if _bindable(port) and (not bus or _bindable(port + 10000)):
            ports.append(port)
    return ports


def _wait(
    what: str, check: Callable[[], bool], timeout: float, describe: Callable[[], str]
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.RedisError, OSError):
            pass  # a node restarting or failing over: ask again
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s\n{describe()}")


def _client(port: int) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        decode_responses=True,
        socket_timeout=2,
        socket_connect_timeout=2,
    )


def _ask(port: int, *command: Any) -> Any:
    with _client(port) as client:
        return client.execute_command(*command)


def kill_pubsub_clients(ports: list[int]) -> int:
    """``CLIENT KILL TYPE pubsub`` on every server of ``ports`` (what Redis does to a
    subscriber past its ``client-output-buffer-limit``); returns how many it closed."""
    return sum(int(_ask(port, "CLIENT", "KILL", "TYPE", "pubsub")) for port in ports)


def _replication(port: int) -> dict[str, Any]:
    with _client(port) as client:
        info: dict[str, Any] = client.info("replication")
        return info


class _Processes:
    """What both set-ups share: a start that leaves nothing running when it fails, a
    close that kills every process (idempotent, also at exit), a context manager."""

    def _launch(self, timeout: float) -> None:
        raise NotImplementedError

    def _processes(self) -> list[RedisServer | _Sentinel]:
        raise NotImplementedError

    def start(self, *, timeout: float = 30.0) -> None:
        """Start every process and wait until the set-up is whole (see the subclass).

        Raises:
            RuntimeError: a process did not start (or the cluster could not be created).
            AssertionError: not whole within ``timeout`` seconds (with what each saw).
        """
        _LIVE.add(self)
        try:
            self._launch(timeout)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """SIGKILL every process (idempotent)."""
        for process in self._processes():
            process.kill()
        _LIVE.discard(self)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- the cluster -------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterNode:
    """One node of CLUSTER NODES as its peers see it."""

    node_id: str
    port: int
    role: str  # "master" or "replica"
    master_id: str | None  # a replica's master
    failed: bool  # flagged fail or pfail
    slots: tuple[tuple[int, int], ...]  # (first, last) ranges, inclusive

    @property
    def slot_count(self) -> int:
        return sum(last - first + 1 for first, last in self.slots)


def _parse_nodes(text: str) -> list[ClusterNode]:
    nodes = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        node_id, address, flags, master = fields[0], fields[1], fields[2].split(","), fields[3]
        port = int(address.split("@")[0].rsplit(":", 1)[1])
        slots = []
        for spec in fields[8:]:
            if spec.startswith("["):  # a slot being migrated or imported
                continue
            first, _, last = spec.partition("-")
            slots.append((int(first), int(last or first)))
        nodes.append(
            ClusterNode(
                node_id=node_id,
                port=port,
                role="master" if "master" in flags else "replica",
                master_id=None if master == "-" else master,
                failed="fail" in flags or "fail?" in flags,
                slots=tuple(slots),
            )
        )
    return nodes


class ClusterServers(_Processes):
    """A Redis Cluster of ``masters`` masters with ``replicas`` replicas each, on loopback.

    Args:
        directory: each node keeps its nodes.conf, append-only file and log in a
            subdirectory ``node-<port>``.
        masters: how many masters (at least 3, Redis's minimum).
        replicas: replicas per master.
        node_timeout_ms: ``cluster-node-timeout``: how long a silent master has
            before its replica takes over (a failover takes about 2 to 3 times it).
        extra_args: more ``redis-server`` arguments for every node.

    Raises:
        RedisServerMissing: redis-server or redis-cli is not installed.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 1500,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        if masters < 3:
            raise ValueError(f"masters must be at least 3 (Redis's minimum), got {masters}")
        find_redis_server()
        self.cli = find_redis_cli()
        self.directory = Path(directory)
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        ports = _free_ports(masters * (1 + replicas), bus=True)
        self.servers: dict[int, RedisServer] = {}
        self.paused: set[int] = set()  # SIGSTOPped by hang_master, until heal()
        for port in ports:
            self.servers[port] = RedisServer(
                self.directory / f"node-{port}",
                port=port,
                appendfsync="everysec",
                extra_args=[
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(node_timeout_ms),
                    # Sharded pub/sub and reads must keep going on a cluster missing
                    # a slot's master while its replica takes over.
                    "--cluster-require-full-coverage", "no",
                    "--cluster-allow-reads-when-down", "yes",
                    *_QUICK_SYNC,
                    *extra_args,
                ],
            )  # fmt: skip

    # -- addresses --

    @property
    def ports(self) -> list[int]:
        """Every node's port (masters and replicas, as started)."""
        return list(self.servers)

    @property
    def live_ports(self) -> list[int]:
        """The nodes running and not paused (:meth:`hang_master`)."""
        return [
            port
            for port, server in self.servers.items()
            if server.running and port not in self.paused
        ]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...`` (every node as a seed)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every node, for redis-py's ``ClusterNode``."""
        return [("127.0.0.1", port) for port in self.ports]

    # -- start and stop --

    def _launch(self, timeout: float) -> None:
        """Start every node, create the cluster and wait until it is whole."""
        for server in self.servers.values():
            server.start()
        addresses = [f"127.0.0.1:{port}" for port in self.ports]
        self._cli(
            "--cluster", "create", *addresses,
            "--cluster-replicas", str(self.replicas), "--cluster-yes",
        )  # fmt: skip
        self.wait_whole(timeout=timeout)

    def _processes(self) -> list[RedisServer | _Sentinel]:
        return list(self.servers.values())

    # -- what the cluster looks like --

    def nodes(self) -> list[ClusterNode]:
        """CLUSTER NODES as a live node sees it."""
        for port in self.live_ports:
            try:
                return _parse_nodes(_ask(port, "CLUSTER", "NODES"))
            except (redis.RedisError, OSError):
                continue
        raise AssertionError("no cluster node answers")

    def masters(self) -> list[ClusterNode]:
        """The masters serving slots, as a live node sees them (not flagged failed)."""
        return [n for n in self.nodes() if n.role == "master" and n.slots and not n.failed]

    def master_of_slot(self, slot: int) -> ClusterNode:
        for node in self.masters():
            if any(first <= slot <= last for first, last in node.slots):
                return node
        raise AssertionError(f"no master serves slot {slot}: {self.describe()}")

    def master_of_key(self, key: str | bytes) -> ClusterNode:
        return self.master_of_slot(self.slot_of(key))

    def slot_of(self, key: str | bytes) -> int:
        """The key's hash slot, as the cluster computes it (CLUSTER KEYSLOT)."""
        return int(_ask(self.live_ports[0], "CLUSTER", "KEYSLOT", key))

    def replicas_of(self, master: ClusterNode) -> list[ClusterNode]:
        return [n for n in self.nodes() if n.master_id == master.node_id and not n.failed]

    def describe(self) -> str:
        """Every live node's CLUSTER INFO state and view of the nodes, for failure messages."""
        lines = []
        for port in self.ports:
            if not self.servers[port].running:
                lines.append(f"{port}: not running")
                continue
            try:
                info = _ask(port, "CLUSTER", "INFO")
                nodes = _ask(port, "CLUSTER", "NODES")
            except (redis.RedisError, OSError) as exc:
                lines.append(f"{port}: {exc!r}")
                continue
            state = info if isinstance(info, str) else str(info)
            lines.append(f"{port}: {' '.join(state.split()[:5])}")
            lines.extend(f"    {line}" for line in nodes.splitlines())
        return "\n".join(lines)

    def _whole(self) -> bool:
        live = self.live_ports
        views = []
        for port in live:
            info = _ask(port, "CLUSTER", "INFO")
            if "cluster_state:ok" not in info or f"cluster_slots_ok:{SLOTS}" not in info:
                return False
            views.append(_parse_nodes(_ask(port, "CLUSTER", "NODES")))
        for view in views:
            # Every live node known to every live node, none flagged failed, and the
            # masters' slots covering all 16384 exactly once.
            known = {n.port: n for n in view}
            if any(port not in known or known[port].failed for port in live):
                return False
            if sum(n.slot_count for n in view if n.role == "master" and n.port in live) != SLOTS:
                return False
            # Every live node in its place: a master serving slots, or the replica of
            # one (just after `--cluster create`, replicas are still empty masters).
            serving = {n.node_id for n in view if n.role == "master" and n.slots}
            if any(
                known[port].node_id not in serving and known[port].master_id not in serving
                for port in live
            ):
                return False
        # Every live replica in sync with its master (a replica out of sync cannot
        # take over, and WAIT would not count it).
        for port in live:
            replication = _replication(port)
            if replication["role"] == "slave" and replication.get("master_link_status") != "up":
                return False
        return True

    def wait_whole(self, *, timeout: float = 30.0) -> None:
        """Wait until every live node says ``cluster_state:ok``, every slot is served by a
        live master, all agree, and every live replica's link to its master is up.

        Raises:
            AssertionError: not within ``timeout`` seconds (with every node's view).
        """
        _wait("the cluster to be whole", self._whole, timeout, self.describe)

    # -- breaking it --

    def kill_master(
        self, port: int | None = None, *, timeout: float = 30.0
    ) -> tuple[ClusterNode, ClusterNode]:
        """SIGKILL a master (the one on ``port``, else the first) and wait until one of
        its replicas serves its slots and the cluster is ok again.

        Returns:
            ``(killed, promoted)``: the killed master and the replica now serving its slots.

        Raises:
            ValueError: ``port`` is not a master serving slots.
            AssertionError: no replica took over within ``timeout`` seconds.
        """
        masters = self.masters()
        victim = masters[0] if port is None else next((m for m in masters if m.port == port), None)
        if victim is None:
            raise ValueError(f"port {port} is not a live master: {[m.port for m in masters]}")
        candidates = {n.node_id for n in self.replicas_of(victim)}
        if not candidates:
            raise ValueError(f"master {victim.port} has no replica to take over")
        self.servers[victim.port].kill()
        promoted: list[ClusterNode] = []

        def taken_over() -> bool:
            for node in self.masters():
                if node.node_id in candidates and set(victim.slots) <= set(node.slots):
                    promoted[:] = [node]
                    return self._whole()
            return False

        _wait(f"a replica of {victim.port} to take over", taken_over, timeout, self.describe)
        return victim, promoted[0]

    def hang_master(self, *, timeout: float = 30.0) -> tuple[ClusterNode, ClusterNode]:
        """SIGSTOP the first master (it hangs: connections stay open, nothing answers,
        as behind a silent network), wait for its replica's promotion and a whole
        cluster without it. :meth:`heal` continues it (it rejoins as a replica).

        Returns:
            ``(hung, promoted)``.
        """
        victim = self.masters()[0]
        candidates = {n.node_id for n in self.replicas_of(victim)}
        self.servers[victim.port].pause()
        self.paused.add(victim.port)
        promoted: list[ClusterNode] = []

        def taken_over() -> bool:
            for node in self.masters():
                if node.node_id in candidates and set(victim.slots) <= set(node.slots):
                    promoted[:] = [node]
                    return True
            return False

        _wait(f"a replica of {victim.port} to take over", taken_over, timeout, self.describe)
        return victim, promoted[0]

    def restart(self, port: int, *, timeout: float = 30.0) -> None:
        """Start a killed node again (same port, same nodes.conf: it rejoins, as a replica
        when its slots went to another) and wait until the cluster is whole."""
        self.servers[port].start()
        self.wait_whole(timeout=timeout)

    def heal(self, *, timeout: float = 30.0) -> None:
        """Continue every paused node, restart every killed one, and wait until the
        cluster is whole."""
        paused, self.paused = self.paused, set()
        for port in paused:
            self.servers[port].resume()
        for server in self.servers.values():
            if not server.running:
                server.start()
        self.wait_whole(timeout=timeout)

    def migrate_slot(self, slot: int, to_port: int, *, timeout: float = 30.0) -> None:
        """Move one slot (with its keys) to the master on ``to_port``, as
        ``redis-cli --cluster reshard`` does it (SETSLOT IMPORTING/MIGRATING, MIGRATE
        the keys, SETSLOT NODE on every master), and wait until every node agrees.

        Raises:
            ValueError: ``to_port`` is not a live master.
        """
        source = self.master_of_slot(slot)
        target = next((m for m in self.nodes() if m.port == to_port), None)
        if target is None or target.role != "master" or target.failed:
            raise ValueError(f"port {to_port} is not a live master")
        if source.node_id == target.node_id:
            return
        _ask(target.port, "CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
        _ask(source.port, "CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
        while True:
            keys = _ask(source.port, "CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            _ask(source.port, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
        # The target first (it then serves the slot), then the source, then the rest.
        for master in [target, source, *(m for m in self.masters() if m not in (source, target))]:
            _ask(master.port, "CLUSTER", "SETSLOT", slot, "NODE", target.node_id)

        def agreed() -> bool:
            return (
                all(
                    any(
                        n.node_id == target.node_id and any(a <= slot <= b for a, b in n.slots)
                        for n in _parse_nodes(_ask(port, "CLUSTER", "NODES"))
                    )
                    for port in self.live_ports
                )
                and self._whole()
            )

        _wait(f"every node to see slot {slot} on {to_port}", agreed, timeout, self.describe)

    def reshard(self, slots: int, from_port: int, to_port: int, *, timeout: float = 60.0) -> None:
        """``redis-cli --cluster reshard``: move ``slots`` slots (with their keys) from
        one master to another, then wait until the cluster is whole."""
        ids = {n.port: n.node_id for n in self.nodes()}
        self._cli(
            "--cluster", "reshard", f"127.0.0.1:{to_port}",
            "--cluster-from", ids[from_port], "--cluster-to", ids[to_port],
            "--cluster-slots", str(slots), "--cluster-yes",
        )  # fmt: skip
        self.wait_whole(timeout=timeout)

    def _cli(self, *args: str) -> str:
        done = subprocess.run(
            [self.cli, *args], capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode != 0 or "[ERR]" in done.stdout:
            raise RuntimeError(
                f"redis-cli {' '.join(args)} failed ({done.returncode}):\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-2000:]}\n{self.describe()}"
            )
        return done.stdout


# -- Sentinel ----------------------------------------------------------------------


class _Sentinel:
    """One ``redis-server sentinel.conf --sentinel`` process (it rewrites its config file)."""

    def __init__(self, executable: str, directory: Path, port: int) -> None:
        self.executable = executable
        self.directory = directory
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, primary_port: int, *, down_after_ms: int, failover_timeout_ms: int) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "sentinel.conf"
        if not config.exists():  # a restarted sentinel keeps what it learnt
            config.write_text(
                f"port {self.port}\n"
                "bind 127.0.0.1\n"
                f"dir {self.directory}\n"
                f"logfile {self.directory / 'sentinel.log'}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} {failover_timeout_ms}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
        self.process = subprocess.Popen(
            [self.executable, str(config), "--sentinel"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = (self.directory / "sentinel.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


class SentinelServers(_Processes):
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels (quorum 2), on loopback.

    The service is named ``mymaster`` (:attr:`service`).

    Args:
        directory: each process keeps its files in a subdirectory.
        down_after_ms: ``down-after-milliseconds``: how long a silent primary has
            before the sentinels agree it is down (a failover takes about 3 times it).
        failover_timeout_ms: ``failover-timeout``.

    Raises:
        RedisServerMissing: redis-server is not installed.
    """

    service = SERVICE

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        replicas: int = 1,
        sentinels: int = 3,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
    ) -> None:
        executable = find_redis_server()
        self.directory = Path(directory)
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        ports = _free_ports(1 + replicas + sentinels, bus=False)
        primary_port, ports = ports[0], ports[1:]
        self.servers: dict[int, RedisServer] = {
            primary_port: RedisServer(
                self.directory / f"redis-{primary_port}",
                port=primary_port,
                appendfsync="everysec",
                extra_args=list(_QUICK_SYNC),
            )
        }
        for port in ports[:replicas]:
            self.servers[port] = RedisServer(
                self.directory / f"redis-{port}",
                port=port,
                appendfsync="everysec",
                extra_args=[*_QUICK_SYNC, "--replicaof", "127.0.0.1", str(primary_port)],
            )
        self.sentinels = [
            _Sentinel(executable, self.directory / f"sentinel-{port}", port)
            for port in ports[replicas:]
        ]
        self._first_primary = primary_port

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every sentinel, for ``redis.asyncio.sentinel.Sentinel``."""
        return [("127.0.0.1", s.port) for s in self.sentinels]

    @property
    def url(self) -> str:
        """``redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/mymaster``."""
        seeds = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{seeds}/{self.service}"

    def _launch(self, timeout: float) -> None:
        """Start the data servers and the sentinels; wait until the replica is in sync and
        every sentinel knows the primary, the replica and the other sentinels (only then
        can they fail over)."""
        for server in self.servers.values():
            server.start()
        for sentinel in self.sentinels:
            sentinel.start(
                self._first_primary,
                down_after_ms=self.down_after_ms,
                failover_timeout_ms=self.failover_timeout_ms,
            )
        self.wait_ready(timeout=timeout)

    def _processes(self) -> list[RedisServer | _Sentinel]:
        return [*self.sentinels, *self.servers.values()]

    def primary_port(self, sentinel: int = 0) -> int:
        """The primary's port as the ``sentinel``-th sentinel reports it."""
        _, port = _ask(
            self.sentinels[sentinel].port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service
        )
        return int(port)

    def primary(self) -> RedisServer:
        """The primary's server, as every sentinel agrees (fails when they do not)."""
        ports = {self.primary_port(i) for i in range(len(self.sentinels))}
        if len(ports) != 1:
            raise AssertionError(f"the sentinels disagree on the primary: {ports}")
        return self.servers[ports.pop()]

    def describe(self) -> str:
        lines = []
        for port, server in self.servers.items():
            if not server.running:
                lines.append(f"redis {port}: not running")
                continue
            try:
                replication = _replication(port)
                lines.append(
                    f"redis {port}: role={replication['role']} "
                    f"link={replication.get('master_link_status', '-')}"
                )
            except (redis.RedisError, OSError) as exc:
                lines.append(f"redis {port}: {exc!r}")
        for sentinel in self.sentinels:
            lines.append(f"sentinel {sentinel.port} (running={sentinel.running}):")
            lines.extend(f"    {line}" for line in sentinel.log_tail().splitlines())
        return "\n".join(lines)

    def _ready(self) -> bool:
        live = [port for port, server in self.servers.items() if server.running]
        roles = {port: _replication(port) for port in live}
        primaries = [port for port, info in roles.items() if info["role"] == "master"]
        if len(primaries) != 1:
            return False
        if any(
            info["role"] == "slave" and info.get("master_link_status") != "up"
            for info in roles.values()
        ):
            return False
        if roles[primaries[0]].get("connected_slaves") != len(live) - 1:
            return False
        for sentinel in self.sentinels:
            if not sentinel.running:
                continue
            if self.primary_port(self.sentinels.index(sentinel)) != primaries[0]:
                return False
            with _client(sentinel.port) as client:
                # redis-py parses these replies into dicts (flags as a string, counts as ints).
                master = client.sentinel_master(self.service)
                replicas = client.sentinel_slaves(self.service)
            if master["flags"] != "master" or master["num-slaves"] < len(live) - 1:
                return False
            if master["num-other-sentinels"] != len(self.sentinels) - 1:
                return False
            if sum(replica["flags"] == "slave" for replica in replicas) != len(live) - 1:
                return False
        return True

    def wait_ready(self, *, timeout: float = 30.0) -> None:
        """Wait until one primary, every live replica in sync with it, and every sentinel
        agreeing on it and knowing the replicas and the other sentinels.

        Raises:
            AssertionError: not within ``timeout`` seconds.
        """
        _wait("the sentinel set-up to be ready", self._ready, timeout, self.describe)

    def kill_primary(self, *, timeout: float = 30.0) -> tuple[int, int]:
        """SIGKILL the primary and wait until every sentinel names a promoted replica.

        Returns:
            ``(old, new)``: the killed primary's port and the new primary's.

        Raises:
            AssertionError: no failover within ``timeout`` seconds.
        """
        old = self.primary().port
        self.servers[old].kill()
        new = self._await_new_primary(old, timeout)
        return old, new

    def failover(self, *, timeout: float = 30.0) -> tuple[int, int]:
        """``SENTINEL FAILOVER``: promote a replica while the primary is alive (it becomes
        a replica), and wait until it is done and the set-up ready again.

        Returns:
            ``(old, new)``: the former primary's port and the new primary's.
        """
        old = self.primary().port
        _ask(self.sentinels[0].port, "SENTINEL", "FAILOVER", self.service)
        new = self._await_new_primary(old, timeout)
        # The sentinels turn the former primary into a replica only at their next look
        # at it (every 10 s); do what they will do, now.
        _ask(old, "REPLICAOF", "127.0.0.1", new)
        self.wait_ready(timeout=timeout)
        return old, new

    def _await_new_primary(self, old: int, timeout: float) -> int:
        def moved() -> bool:
            ports = {
                self.primary_port(i)
                for i, sentinel in enumerate(self.sentinels)
                if sentinel.running
            }
            if len(ports) != 1 or old in ports:
                return False
            (new,) = ports
            return bool(_replication(new)["role"] == "master")

        _wait(f"the sentinels to replace primary {old}", moved, timeout, self.describe)
        return self.primary().port

    def heal(self, *, timeout: float = 30.0) -> None:
        """Restart every killed server and sentinel (a former primary comes back and the
        sentinels turn it into a replica) and wait until the set-up is ready."""
        primary = self.primary().port
        for server in self.servers.values():
            if not server.running:
                # Straight back as the current primary's replica: the sentinels would
                # convert a returning former primary, but only after their next look
                # at it (up to 10 s).
                server.extra_args = [*_QUICK_SYNC, "--replicaof", "127.0.0.1", str(primary)]
                server.start()
        for sentinel in self.sentinels:
            if not sentinel.running:
                sentinel.start(
                    self._first_primary,
                    down_after_ms=self.down_after_ms,
                    failover_timeout_ms=self.failover_timeout_ms,
                )
        self.wait_ready(timeout=timeout)


# -- fixtures ----------------------------------------------------------------------


def _running(make: Callable[[], _Setup]) -> Iterator[_Setup]:
    """Start the set-up ``make`` builds, yield it, kill it whatever happened; a machine
    without redis-server or redis-cli fails the test with how to install them."""
    try:
        setup = make()
    except RedisServerMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    setup.start()
    try:
        yield setup
    finally:
        setup.close()


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServers]:
    """A running 3-master/3-replica Redis Cluster, one per test module, killed at the end."""
    yield from _running(lambda: ClusterServers(tmp_path_factory.mktemp("redis-cluster")))


@pytest.fixture(scope="module")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelServers]:
    """A primary, a replica and 3 sentinels (quorum 2), one per test module, killed at the end."""
    yield from _running(lambda: SentinelServers(tmp_path_factory.mktemp("redis-sentinel")))
