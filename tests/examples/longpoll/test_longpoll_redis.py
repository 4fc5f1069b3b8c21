"""The long-poll example across processes: ``--redis URL`` and ``--workers N`` on a real
``redis-server`` (started by the test on a free port in a temporary directory). The
acceptance tests, those taking the ``store`` fixture, run once on Redis and once on
PostgreSQL (``--postgres DSN``, a server made by initdb: :mod:`tests.support.stores`).

Wall-clock tests (``realtime``): they wait for states with generous deadlines and
assert what the servers answer and report; the only durations asserted are bounds
the issue promises (a POST answers within a few seconds while Redis is down, no
GET is held long past its wait), never how fast a healthy server was.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from aiopurgatory.redis.testing import RedisServer
from examples.longpoll.feed import Appended, FeedError, Fetched, Settings
from tests.support.longpoll import ROOT, Program, wait_until
from tests.support.redis import ServerFactory, write_on_a_closed_uvloop_transport
from tests.support.stores import Store

pytestmark = pytest.mark.realtime

PASSWORD = "pw-Zq8x-not-in-logs"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def program() -> Iterator[Callable[..., Program]]:
    started: list[Program] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Program:
        started.append(Program(*args, env=env))
        return started[-1]

    yield start
    for p in started:
        if p.proc.poll() is None:
            p.proc.send_signal(signal.SIGTERM)
            try:
                p.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.proc.kill()
                p.proc.communicate()


def call(
    port: int, method: str, path: str, body: bytes | None = None, timeout: float = 30
) -> tuple[int, Any]:
    """One request on a new connection: the status and the JSON body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def post(port: int, topic: str, text: str, timeout: float = 30) -> tuple[int, Any]:
    return call(port, "POST", f"/topics/{topic}", text.encode(), timeout)


def park(port: int, path: str) -> http.client.HTTPConnection:
    """Send a GET and leave it waiting; read it later with ``getresponse()``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", path)
    return conn


def answer(conn: http.client.HTTPConnection) -> tuple[int, Any]:
    response = conn.getresponse()
    result = response.status, json.loads(response.read())
    conn.close()
    return result


def parked_by_pid(port: int, expected: int, pids: int = 1, seconds: float = 20) -> dict[int, int]:
    """Wait until the processes behind ``port`` hold ``expected`` parked GETs in all, as
    their ``/healthz`` says (each request lands on one worker: ask until ``pids`` answered)."""
    seen: dict[int, int] = {}
    deadline = time.monotonic() + seconds
    while True:
        status, body = call(port, "GET", "/healthz")
        assert status == 200, body
        seen[body["pid"]] = body["parked"]
        if len(seen) >= pids and sum(seen.values()) == expected:
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"parked GETs: {seen}, expected {expected} over {pids} pids")
        time.sleep(0.05)


def health_is(port: int, status: str) -> bool:
    """``/healthz`` says ``status`` (ok: 200; degraded: 503)."""
    code, body = call(port, "GET", "/healthz")
    return code == (200 if status == "ok" else 503) and body["status"] == status


def all_messages(port: int, topic: str) -> list[str]:
    """Every message of ``topic`` from offset 0, page by page."""
    messages: list[str] = []
    offset = 0
    while True:
        status, body = call(port, "GET", f"/topics/{topic}?offset={offset}&wait=0")
        assert status == 200, body
        assert body["offset"] == offset
        if not body["messages"]:
            return messages
        messages += body["messages"]
        offset = body["next_offset"]


def test_a_post_on_any_server_answers_gets_parked_on_every_server(
    store: Store, program: Callable[..., Program]
) -> None:
    a = program(*store.args)
    b = program(*store.args)
    c = program(*store.args, "--workers", "2")
    assert c.first["workers"] == 2
    assert len({w["pid"] for w in c.early if w["event"] == "longpoll.worker_listening"}) == 2
    servers = [a, b, c]
    conns = [park(s.port, "/topics/news?offset=0&wait=60") for s in servers for _ in range(16)]
    parked_by_pid(a.port, 16)
    parked_by_pid(b.port, 16)
    assert len(parked_by_pid(c.port, 16, pids=2)) == 2  # both workers hold some
    started = time.monotonic()
    assert post(a.port, "news", "first") == (200, {"offset": 0})
    for conn in conns:
        assert answer(conn) == (200, {"offset": 0, "messages": ["first"], "next_offset": 1})
    assert time.monotonic() - started < 30  # answered by the post, not by their 60 s wait

    # and the other way round: a post on a worker answers GETs parked on the single servers
    conns = [park(s.port, "/topics/news?offset=1&wait=60") for s in (a, b) for _ in range(4)]
    parked_by_pid(a.port, 4)
    parked_by_pid(b.port, 4)
    assert post(c.port, "news", "second") == (200, {"offset": 1})
    for conn in conns:
        assert answer(conn) == (200, {"offset": 1, "messages": ["second"], "next_offset": 2})

    metrics = a.metrics()
    assert metrics[f"longpoll_{store.name}_up"] == 1
    if store.name == "redis":
        connected = [v for k, v in metrics.items() if k.startswith("aiopurgatory_redis_connected")]
        assert connected == [1]  # its RedisTriggers, through aiopurgatory.metrics.prometheus
    else:
        assert metrics["longpoll_postgres_triggers_connected"] == 1  # the listener
    for server in servers:
        status, lines = server.stop()
        assert status == 0
        data = sum(
            line["answers"]["data"]
            for line in lines
            if line["event"] == "longpoll.stopped"
            if "answers" in line
        )
        assert data == (20 if server is not c else 16)


def test_racing_posts_on_three_servers_get_distinct_dense_offsets(
    store: Store, program: Callable[..., Program]
) -> None:
    servers = [
        program(*store.args),
        program(*store.args),
        program(*store.args, "--workers", "2"),
    ]
    per_lane = 40
    lanes = [(s.port, f"s{i}-l{j}") for i, s in enumerate(servers) for j in range(4)]

    def lane(port: int, name: str) -> list[tuple[int, str]]:
        acks = []
        for k in range(per_lane):
            text = f"{name}-m{k}"
            status, body = post(port, "race", text)
            assert status == 200, body
            acks.append((body["offset"], text))
        return acks

    with ThreadPoolExecutor(len(lanes)) as pool:
        acked = [ack for acks in pool.map(lambda a: lane(*a), lanes) for ack in acks]
    offsets = sorted(offset for offset, _ in acked)
    assert offsets == list(range(len(lanes) * per_lane))  # distinct and dense
    expected = [text for _, text in sorted(acked)]
    for server in servers:
        assert all_messages(server.port, "race") == expected  # once each, one order
    # each lane's own posts keep their order
    for _, name in lanes:
        mine = [t for t in expected if t.startswith(name + "-")]
        assert mine == [f"{name}-m{k}" for k in range(per_lane)]


def test_retention_is_kept_in_redis_for_every_process(
    store: Store, program: Callable[..., Program]
) -> None:
    a = program(*store.args, "--retain", "3")
    b = program(*store.args, "--retain", "3")
    for k in range(6):
        assert post((a, b)[k % 2].port, "kept", f"m{k}") == (200, {"offset": k})
    for server in (a, b):
        # 6 >= 2 * retain: the oldest 3 dropped; a fetch from 0 starts at the oldest kept
        status, body = call(server.port, "GET", "/topics/kept?offset=0&wait=0")
        assert status == 200
        assert body == {"offset": 3, "messages": ["m3", "m4", "m5"], "next_offset": 6}
        status, body = call(server.port, "GET", "/topics/kept?offset=7&wait=0")
        assert status == 400
        assert "past the end" in body["error"]


def test_min_bytes_threshold_across_processes(
    store: Store, program: Callable[..., Program]
) -> None:
    a = program(*store.args)
    b = program(*store.args)
    assert post(a.port, "mb", "skip") == (200, {"offset": 0})
    conn = park(b.port, "/topics/mb?offset=1&wait=60&min_bytes=10")
    parked_by_pid(b.port, 1)
    assert post(a.port, "mb", "héllo") == (200, {"offset": 1})  # 6 bytes from offset 1
    time.sleep(0.5)
    assert parked_by_pid(b.port, 1)  # still waiting: below its threshold
    assert post(a.port, "mb", "four") == (200, {"offset": 2})  # 10 bytes
    assert answer(conn) == (200, {"offset": 1, "messages": ["héllo", "four"], "next_offset": 3})


def test_redis_killed_and_restarted_mid_traffic(
    store: Store, program: Callable[..., Program]
) -> None:
    a = program(*store.args)
    c = program(*store.args, "--workers", "2")
    ports = [a.port, c.port]
    stop = threading.Event()
    acked: dict[int, str] = {}
    post_times: list[float] = []
    lateness: list[float] = []  # how long past its wait each GET was answered
    statuses: list[int] = []
    problems: list[str] = []  # seen in the client threads, asserted here
    lock = threading.Lock()

    def poster(n: int) -> None:
        k = 0
        while not stop.is_set():
            text = f"p{n}-{k}"
            k += 1
            started = time.monotonic()
            try:
                status, body = post(ports[n % 2], "live", text, timeout=20)
            except (OSError, http.client.HTTPException):
                status, body = -1, None
            with lock:
                post_times.append(time.monotonic() - started)
                statuses.append(status)
                if status == 200:
                    if body["offset"] in acked:
                        problems.append(f"offset {body['offset']} acknowledged twice")
                    acked[body["offset"]] = text
            time.sleep(0.02)

    def poller(n: int) -> None:
        offset = 0
        while not stop.is_set():
            wait = 1.5
            started = time.monotonic()
            try:
                status, body = call(
                    ports[n % 2], "GET", f"/topics/live?offset={offset}&wait={wait}", timeout=30
                )
            except (OSError, http.client.HTTPException) as exc:
                problems.append(f"GET failed: {exc!r}")
                return
            elapsed = time.monotonic() - started
            with lock:
                lateness.append(elapsed - wait)
            if status == 200:
                offset = body["next_offset"]
            else:
                if status != 503:
                    problems.append(f"GET answered {status}: {body}")
                time.sleep(0.1)

    threads = [threading.Thread(target=poster, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=poller, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(acked) >= 20, "posts acknowledged before the outage")
        store.kill()
        time.sleep(0.5)
        # degraded, not dead: both servers answer /healthz with 503 "degraded"
        for port in ports:
            wait_until(partial(health_is, port, "degraded"), "healthz degraded")
        with lock:
            before = len(statuses)
        wait_until(lambda: len(statuses) >= before + 8, "POSTs answered while Redis is down")
        with lock:
            assert 503 in statuses[before:]
        time.sleep(2)
        store.start()
        acked_at_restart = len(acked)
        wait_until(lambda: len(acked) >= acked_at_restart + 20, "posts resume", 30)
        for port in ports:
            wait_until(partial(health_is, port, "ok"), "healthz ok", 30)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    if problems:  # the servers' logs tell why (an internal error's traceback is there)
        logs = "".join(p.stop_and_read() for p in (a, c))
        pytest.fail(f"{problems}\nthe servers' logs:\n{logs[-20000:]}")
    assert a.proc.poll() is None  # no server exited
    assert c.proc.poll() is None
    assert set(statuses) <= {200, 503}
    assert max(post_times) < 5  # a POST answers (503) within a few seconds
    assert max(lateness) < 3  # no GET held long past its wait
    # every acknowledged message is in the log, at its offset, once
    stored = all_messages(a.port, "live")
    for offset, text in acked.items():
        assert stored[offset] == text
    assert len(set(stored)) == len(stored)
    # Redis is back: no request fails for a connection the outage left behind
    with ThreadPoolExecutor(16) as pool:
        gets = list(pool.map(lambda n: call(ports[n % 2], "GET", "/topics/live?wait=0"), range(50)))
        posts = list(pool.map(lambda n: post(ports[n % 2], "back", f"b{n}"), range(50)))
    assert [status for status, _ in gets + posts] == [200] * 100
    # delivery resumed across processes: a GET parked on one server, a POST on the other
    conn = park(a.port, f"/topics/live?offset={len(stored)}&wait=60")
    parked_by_pid(a.port, 1)
    assert post(c.port, "live", "after")[0] == 200
    assert answer(conn)[1]["messages"] == ["after"]
    for server in (a, c):
        status, _ = server.stop()
        assert status == 0


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_wrong_password_exits_at_once_naming_the_cause(
    redis_server_factory: ServerFactory, workers: str
) -> None:
    server = redis_server_factory(password=PASSWORD)
    wrong = server.url.replace(PASSWORD, "Wr0ngPass-xyz")
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.longpoll",
            "--port",
            "0",
            "--redis",
            wrong,
            "--workers",
            workers,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert time.monotonic() - started < 15
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "authentication" in lines[0]
    assert "Wr0ngPass-xyz" not in done.stderr + done.stdout
    # no password at all, against a server that wants one
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.longpoll",
            "--port",
            "0",
            "--redis",
            f"redis://127.0.0.1:{server.port}/0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert "authentication" in done.stderr
    # the right password: serves, and shows it in no log line
    env = dict(os.environ, LONGPOLL_REDIS=server.url)
    p = Program("--workers", workers, env=env)
    try:
        assert "***" in p.first["redis"]
        assert post(p.port, "t", "x") == (200, {"offset": 0})
        status, lines_ = p.stop()
        assert status == 0
        assert PASSWORD not in json.dumps([p.first, *p.early, *lines_])
    finally:
        if p.proc.poll() is None:
            p.proc.kill()


@pytest.mark.parametrize(
    ("option", "address"),
    [("--redis", "redis://127.0.0.1:{port}"), ("--postgres", "postgresql://u@127.0.0.1:{port}/db")],
)
def test_unreachable_redis_exits_at_once_naming_the_cause(option: str, address: str) -> None:
    port = free_port()  # nothing listens there
    done = subprocess.run(
        [sys.executable, "-m", "examples.longpoll", option, address.format(port=port)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert "unreachable" in done.stderr
    assert f"127.0.0.1:{port}" in done.stderr


def test_workers_need_redis() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.longpoll", "--workers", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "--redis" in done.stderr
    assert "--postgres" in done.stderr


def test_sigterm_with_redis_answers_every_parked_get(
    store: Store, program: Callable[..., Program]
) -> None:
    a = program(*store.args)
    c = program(*store.args, "--workers", "2")
    assert post(a.port, "t0", "kept") == (200, {"offset": 0})
    conns = {
        server.port: [
            park(server.port, f"/topics/t{n % 4}?offset=0&wait=120&min_bytes=1000")
            for n in range(20)
        ]
        for server in (a, c)
    }
    parked_by_pid(a.port, 20)
    parked_by_pid(c.port, 20, pids=2)
    for server in (a, c):
        server.proc.send_signal(signal.SIGTERM)
        for n, conn in enumerate(conns[server.port]):
            status, body = answer(conn)
            assert status == 200
            assert body["messages"] == (["kept"] if n % 4 == 0 else [])
        status, lines = server.stop()
        assert status == 0
        stopped = [line for line in lines if line["event"] == "longpoll.stopped"]
        stopped = [line for line in stopped if "answers" in line]  # the workers' own
        assert len(stopped) == (1 if server is a else 2)
        assert sum(line["answers"]["shutdown"] for line in stopped) == 20
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{c.port}/healthz", timeout=5)


async def test_calls_of_one_loop_iteration_share_one_call_issued_after_them() -> None:
    from examples.longpoll.redisfeed import Coalescer

    coalescer = Coalescer()
    issued: list[int] = []
    state = {"value": 0}

    async def read() -> int:
        value = state["value"]  # what Redis holds when the call is issued
        issued.append(value)
        await asyncio.sleep(0)
        return value

    first = [asyncio.create_task(coalescer.run("k", read)) for _ in range(5)]
    state["value"] = 1  # written after the callers asked, before the call is issued
    other = asyncio.create_task(coalescer.run("other", read))
    assert await asyncio.gather(*first) == [1] * 5  # one call, and it saw the write
    assert await other == 1
    assert (coalescer.calls, coalescer.joined) == (2, 4)
    # a caller that comes once the call is issued gets a call of its own
    started = asyncio.create_task(coalescer.run("k", read))
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the call has been issued
    state["value"] = 2
    late = asyncio.create_task(coalescer.run("k", read))
    assert await started == 1
    assert await late == 2
    assert coalescer.calls == 4
    # a cancelled caller leaves the call to the others
    a = asyncio.create_task(coalescer.run("k", read))
    b = asyncio.create_task(coalescer.run("k", read))
    await asyncio.sleep(0)
    a.cancel()
    assert await b == 2
    assert issued == [1, 1, 1, 2, 2]
    assert coalescer.calls == 5


async def test_a_cancelled_redis_call_is_cancelled_not_taken_for_redis_down() -> None:
    from examples.longpoll.redisfeed import RedisWaiter

    waiter = RedisWaiter("redis://127.0.0.1:1/0")  # never connected: the call is faked

    async def command() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            # what a timeout meeting the cancellation in flight can turn it into
            raise TimeoutError from None

    task = asyncio.create_task(waiter.call(command))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (waiter.redis_ok, waiter.timeouts, waiter.redis_errors) == (True, 0, 0)


@pytest.mark.parametrize("store", ["redis", "postgres"])
def test_a_small_crossbench_run(capsys: pytest.CaptureFixture[str], store: str) -> None:
    from examples.longpoll import crossbench

    argv = ["--parked", "60", "--topics", "6", "--seconds", "1", "--scenarios", "across,two"]
    assert crossbench.main([*argv, "--store", store]) == 0
    runs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["scenario"], r["processes"]) for r in runs] == [("across", 2), ("two", 2)]
    for run in runs:
        assert run["store"] == store
        assert run["store_cpu_s"] >= 0  # 5 posts: it may round to 0
        if store == "postgres":
            assert run["redis_cpu_s"] == 0
        # 5 posts, each to the 10 GETs parked on its topic, all delivered
        assert (run["posts"], run["expected"], run["delivered"]) == (5, 50, 50)
        assert (run["errors"], run["exit_status"]) == (0, 0)
        assert run["latency_p50_ms"] > 0
        assert run["server_cpu_s"] > 0
    # across: half the GETs on the server that took no POST, delivered across processes
    assert runs[0]["by_server"]["remote"]["delivered"] == 25
    assert crossbench.main(["--parked", "0"]) == 2


def test_the_gc_threshold_option() -> None:
    from examples.longpoll.__main__ import GC_THRESHOLD, build_parser

    parser = build_parser()
    assert parser.parse_args([]).gc_threshold == GC_THRESHOLD
    assert parser.parse_args(["--gc-threshold", "700,10,10"]).gc_threshold == (700, 10, 10)
    assert parser.parse_args(["--gc-threshold", "python"]).gc_threshold is None
    for bad in ("1,2", "0,10,10", "a,b,c"):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(["--gc-threshold", bad])
        assert exited.value.code == 2


def test_a_worker_that_dies_is_restarted_and_the_port_keeps_serving(
    store: Store, program: Callable[..., Program]
) -> None:
    server = program(*store.args, "--workers", "2")
    pids = server.first["pids"]
    assert len(pids) == 2
    os.kill(pids[0], signal.SIGKILL)

    def replaced() -> bool:
        seen = set()
        for _ in range(40):
            try:
                _, body = call(server.port, "GET", "/healthz", timeout=5)
            except OSError:
                continue  # a connection the dead worker held
            seen.add(body["pid"])
        return pids[0] not in seen and len(seen) == 2

    wait_until(replaced, "a new worker in place of the killed one", 60)
    assert post(server.port, "after", "x") == (200, {"offset": 0})
    assert call(server.port, "GET", "/topics/after?wait=0")[1]["messages"] == ["x"]
    status, lines = server.stop()
    assert status == 0
    events = [line["event"] for line in lines]
    assert "longpoll.worker_exited" in events
    assert "longpoll.worker_restarted" in events


async def test_a_waiter_that_cannot_reach_redis_fails_and_leaves_nothing_open() -> None:
    import aiopurgatory as ap
    from aiopurgatory.redis import RedisTriggersError
    from examples.longpoll.redisfeed import RedisWaiter

    waiter = RedisWaiter(f"redis://:secret-pw@127.0.0.1:{free_port()}/0", command_timeout=1)
    with pytest.raises(RedisTriggersError) as failed:
        async with waiter:
            raise AssertionError("entered without Redis")
    assert "secret-pw" not in str(failed.value)
    assert waiter.triggers is None
    purgatory: ap.Purgatory[Any] = waiter.purgatory
    with pytest.raises(ap.PurgatoryClosedError):
        purgatory.try_complete_else_watch(ap.WatermarkOperation(1), {"t": 1})


def test_a_write_on_a_closed_uvloop_transport_is_a_503_not_a_500() -> None:
    # Seen in CI: Redis went away between redis-py's connect and its HELLO; uvloop
    # raised RuntimeError for the write and a GET was answered 500. A lost
    # connection is Redis down: 503, Redis marked down. Other errors stay errors.
    import uvloop

    from examples.longpoll.feed import FeedError
    from examples.longpoll.redisfeed import RedisWaiter

    waiter = RedisWaiter("redis://127.0.0.1:1")  # call() runs the command it is given

    async def main() -> tuple[BaseException, BaseException]:
        raw = await write_on_a_closed_uvloop_transport(contextlib.nullcontext)

        async def lost() -> None:
            raise raw

        async def bug() -> None:
            raise RuntimeError("a bug")

        with pytest.raises(FeedError) as lost_info:
            await waiter.call(lost)
        with pytest.raises(RuntimeError) as bug_info:
            await waiter.call(bug)
        return lost_info.value, bug_info.value

    lost, bug = uvloop.run(main())
    assert isinstance(lost, FeedError)
    assert lost.status == 503
    assert not waiter.redis_ok
    assert waiter.last_error is not None
    assert "the handler is closed" in waiter.last_error
    assert str(bug) == "a bug"


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan waits for init to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_workers_die_with_a_supervisor_killed_with_sigkill(
    store: Store, program: Callable[..., Program]
) -> None:
    server = program(*store.args, "--workers", "2")
    pids = server.first["pids"]
    conns = [park(server.port, "/topics/orphan?offset=0&wait=60") for _ in range(8)]
    parked_by_pid(server.port, 8, pids=2)
    os.kill(server.proc.pid, signal.SIGKILL)  # no chance to pass a signal on
    killed = time.monotonic()
    wait_until(lambda: not any(alive(pid) for pid in pids), "the workers to end", 10)
    assert time.monotonic() - killed < 2
    for conn in conns:  # each answered its parked GETs as on any SIGTERM
        assert answer(conn) == (200, {"offset": 0, "messages": [], "next_offset": 0})
    server.proc.communicate(timeout=30)  # reaped, its pipe closed


def test_a_worker_whose_supervisor_is_gone_at_start_exits() -> None:
    # The supervisor's pid given is not our parent: as if it died before prctl was armed.
    done = subprocess.run(
        [sys.executable, "-m", "examples.longpoll", "--port", "0", "--supervisor", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == "error: the supervisor is gone"


def post_with_key(
    port: int, topic: str, text: str, key: str, timeout: float = 30
) -> tuple[int, Any, str | None]:
    """A POST with an ``Idempotency-Key``: status, JSON body, ``Idempotent-Replayed``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", f"/topics/{topic}", text.encode(), {"Idempotency-Key": f'"{key}"'})
        response = conn.getresponse()
        return (
            response.status,
            json.loads(response.read()),
            response.getheader("idempotent-replayed"),
        )
    finally:
        conn.close()


def test_an_idempotency_key_holds_across_processes_for_its_ttl(
    store: Store, program: Callable[..., Program]
) -> None:
    a = program(*store.args, "--idempotency-ttl", "3")
    c = program(*store.args, "--workers", "2", "--idempotency-ttl", "3")
    assert post(a.port, "pay", "before") == (200, {"offset": 0})
    assert post_with_key(a.port, "pay", "order 1", "k-1") == (200, {"offset": 1}, None)
    # the retry lands on other processes (the client lost the reply, say): not stored again
    for _ in range(4):
        assert post_with_key(c.port, "pay", "order 1", "k-1") == (200, {"offset": 1}, "true")
    status, body, _ = post_with_key(c.port, "pay", "order 2", "k-1")
    assert (status, body) == (422, {"error": "this Idempotency-Key was used for another body"})
    assert post_with_key(c.port, "pay", "order 2", "k-2") == (200, {"offset": 2}, None)
    assert all_messages(a.port, "pay") == ["before", "order 1", "order 2"]
    assert a.metrics()["longpoll_replayed_posts_total"] == 0
    # the record lives in the store beside the topic, with the TTL asked for
    assert 0 < store.idempotency_ttl_ms("pay", "k-1") <= 3000
    time.sleep(3.5)  # the key is forgotten: a POST with it is a new message
    assert post_with_key(c.port, "pay", "order 1", "k-1") == (200, {"offset": 3}, None)
    assert all_messages(c.port, "pay") == ["before", "order 1", "order 2", "order 1"]


async def test_a_connection_that_died_while_redis_was_away_is_replaced(
    redis_server: RedisServer,
) -> None:
    from examples.longpoll.redisfeed import RedisWaiter

    async with RedisWaiter(redis_server.url) as waiter:
        feed = waiter.make_feed(Settings())
        assert (await feed.append("t", b"m0")).offset == 0
        assert (await feed.fetch("t", 0, 0, 1)) == Fetched(0, ["m0"], 1)
        # Restarted while this loop did not run: the pool's idle connection is dead, and
        # nothing has told the loop yet (its end of the socket still looks open).
        redis_server.kill()
        redis_server.start()
        assert (await feed.fetch("t", 0, 0, 1)) == Fetched(0, ["m0"], 1)
        assert waiter.retries == 1  # the read went out again, on a new connection
        redis_server.kill()
        redis_server.start()
        assert (await feed.append("t", b"m1")) == Appended(1)
        assert waiter.retries == 2
        assert (await feed.fetch("t", 0, 0, 1)) == Fetched(0, ["m0", "m1"], 2)  # stored once
        assert feed.unavailable == {"post": 0, "get": 0, "parked": 0}
        assert waiter.redis_ok


async def test_a_parked_get_whose_feed_cannot_be_read_is_a_503_never_an_early_answer(
    redis_server: RedisServer,
) -> None:
    from examples.longpoll.redisfeed import RedisWaiter

    async with RedisWaiter(redis_server.url, command_timeout=0.5) as waiter:
        feed = waiter.make_feed(Settings())
        await feed.append("t", b"m0")
        get = asyncio.create_task(feed.fetch("t", 1, 30, 1))
        await until_parked(feed)
        await feed.append("t", b"m1")  # completes the parked GET...
        redis_server.kill()  # ...and Redis dies before it could read what it answers
        with pytest.raises(FeedError) as failed:
            await get
        assert failed.value.status == 503
        assert feed.unavailable == {"post": 0, "get": 0, "parked": 1}
        assert feed.answers == {"data": 0, "timeout": 0, "shutdown": 0, "early": 0}
        redis_server.start()


@pytest.mark.parametrize("when", ["before the GET parks", "while it is parked"])
async def test_a_hung_redis_holds_a_parked_get_no_longer_than_the_command_timeout(
    redis_server: RedisServer, when: str
) -> None:
    from examples.longpoll.redisfeed import RedisWaiter

    assert redis_server.process is not None
    async with RedisWaiter(redis_server.url, command_timeout=0.5) as waiter:
        feed = waiter.make_feed(Settings())
        await feed.append("t", b"m0")
        loop = asyncio.get_running_loop()
        if when == "before the GET parks":
            # its catch-up read, made after it watched, meets the hang
            feed._reads.run = partial(_read_then_stop, feed._reads.run, redis_server)  # type: ignore[method-assign]
        started = loop.time()
        get = asyncio.create_task(feed.fetch("t", 1, 1.0, 1))
        try:
            if when == "while it is parked":
                await until_parked(feed)
                redis_server.process.send_signal(signal.SIGSTOP)
            with pytest.raises(FeedError) as failed:
                await get
            took = loop.time() - started
        finally:
            redis_server.process.send_signal(signal.SIGCONT)
        assert failed.value.status == 503
        # its wait (1 s), then its read's deadline (command_timeout + 0.5 s), and slack
        assert 1.0 <= took < 1.0 + 1.0 + 1.0
        assert feed.answers["early"] == 0


async def until_parked(feed: Any) -> None:
    for _ in range(1000):
        if feed.parked:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the GET never parked")


async def _read_then_stop(run: Any, server: RedisServer, key: Any, make: Any) -> Any:
    result = await run(key, make)
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    return result


async def test_a_shared_read_whose_every_caller_hung_up_leaves_no_unretrieved_error() -> None:
    import gc

    from examples.longpoll.redisfeed import Coalescer

    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    coalescer = Coalescer()
    failing = asyncio.Event()

    async def read() -> None:
        await failing.wait()
        raise FeedError(503, "redis unavailable")

    callers = [asyncio.create_task(coalescer.run("k", read)) for _ in range(3)]
    await asyncio.sleep(0)
    for caller in callers:
        caller.cancel()  # their clients hung up
    await asyncio.gather(*callers, return_exceptions=True)
    failing.set()
    for _ in range(5):
        await asyncio.sleep(0)
    del callers, caller  # their CancelledErrors' tracebacks hold the shared task
    gc.collect()
    await asyncio.sleep(0)
    assert reported == []


def _children(pid: int) -> set[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return {int(word) for word in f.read().split()}


def test_a_worker_restarted_while_redis_is_down_says_so_in_json_and_comes_back(
    store: Store, program: Callable[..., Program]
) -> None:
    # A worker that dies during a Redis outage is started again by its supervisor,
    # finds Redis away, and exits: its one line about it is JSON like every other
    # (the soak's "only JSON lines" check), and once Redis is back a later start
    # takes its place.
    server = program(*store.args, "--workers", "2")
    pids = server.first["pids"]
    supervisor = server.proc.pid
    store.kill()
    os.kill(pids[0], signal.SIGKILL)
    seen: set[int] = set()

    def a_restart_came_and_went() -> bool:
        now = _children(supervisor)
        seen.update(now - set(pids))
        return bool(seen - now)

    wait_until(a_restart_came_and_went, "a worker started while Redis is down to exit", 30)
    store.start()

    def replaced() -> bool:
        answered = set()
        for _ in range(40):
            try:
                _, body = call(server.port, "GET", "/healthz", timeout=5)
            except OSError:
                continue
            answered.add(body["pid"])
        return pids[0] not in answered and len(answered) == 2

    wait_until(replaced, "a worker in place of the killed one", 60)
    assert post(server.port, "back", "x") == (200, {"offset": 0})
    status, lines = server.stop()  # parses every line: one that is not JSON fails here
    assert status == 0
    events = [line["event"] for line in lines]
    # Every line of every worker from its own logger: none the supervisor had to wrap.
    assert "longpoll.worker_output" not in events
    unavailable = [line for line in lines if line["event"] == f"longpoll.{store.name}_unavailable"]
    assert unavailable
    assert "unreachable" in unavailable[0]["error"]


def test_what_uvicorn_logs_with_a_traceback_is_one_json_line() -> None:
    # A lifespan that fails (Redis gone between the start-up check and the triggers'
    # start) is logged by uvicorn through the standard library, traceback and all.
    script = (
        "import logging\n"
        "from examples.longpoll.__main__ import _configure_logging\n"
        "_configure_logging('info')\n"
        "logging.getLogger('uvicorn.error').info('not shown: below warnings')\n"
        "try:\n"
        "    raise ConnectionError('redis went away')\n"
        "except ConnectionError:\n"
        "    logging.getLogger('uvicorn.error').exception('Traceback (most recent call last):')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    [line] = done.stderr.splitlines()
    record = json.loads(line)
    assert record["level"] == "error"
    assert "ConnectionError: redis went away" in record["exception"]
