"""The long-poll program under careless and hostile clients, over real sockets.

Clients that hang up mid-body, bodies that never arrive, names and numbers at the
edges of the protocol, a second server on a busy port. Wall clock (``realtime``):
generous deadlines, and assertions on what the server reports, never on speed.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from tests.support.longpoll import ROOT, Program, wait_until

pytestmark = pytest.mark.realtime


@pytest.fixture
def program() -> Iterator[Callable[..., Program]]:
    started: list[Program] = []

    def start(*args: str) -> Program:
        started.append(Program(*args))
        return started[-1]

    yield start
    for p in started:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.communicate()


def _raw(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    return sock


def _read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _incomplete(server: Program, reason: str) -> float:
    return server.metrics()[f'longpoll_incomplete_bodies_total{{reason="{reason}"}}']


def test_clients_hanging_up_mid_body_are_counted_without_a_traceback(
    program: Callable[..., Program],
) -> None:
    server = program()
    for n in range(3):
        sock = _raw(server.port)
        sock.sendall(
            f"POST /topics/t HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\npart{n}".encode()
        )
        time.sleep(0.2)  # the handler is reading the body when the client goes
        sock.close()
    wait_until(lambda: _incomplete(server, "disconnect") == 3, "3 bodies counted as abandoned")
    assert _incomplete(server, "timeout") == 0
    # nothing was posted, and the server serves on
    assert server.get_json("/topics/t", "POST", b"whole") == {"offset": 0}
    status, lines = server.stop()  # every line of its log is JSON: no traceback
    assert status == 0
    stopped = next(line for line in lines if line["event"] == "longpoll.stopped")
    assert stopped["incomplete_bodies"] == {"disconnect": 3, "timeout": 0}
    assert stopped["messages"] == 1


def test_a_body_that_never_arrives_gets_a_408_and_the_connection_closed(
    program: Callable[..., Program],
) -> None:
    server = program("--body-timeout", "0.5")
    stalled = _raw(server.port)
    stalled.sendall(b"POST /topics/t HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
    # a body trickled a byte at a time has one deadline for the whole body
    trickled = _raw(server.port)
    trickled.sendall(b"POST /topics/t HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
    started = time.monotonic()
    trickled.settimeout(0.1)
    answer = b""
    while not answer and time.monotonic() - started < 20:
        try:
            trickled.sendall(b"x")
            answer = trickled.recv(65536)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
    trickled.settimeout(30)
    for sock, head in ((stalled, b""), (trickled, answer)):
        try:
            response = head + _read_to_close(sock)
        except ConnectionResetError:  # the trickle's last bytes arrived after the close
            response = head
        sock.close()
        status_line, _, rest = response.partition(b"\r\n")
        assert status_line == b"HTTP/1.1 408 Request Timeout"
        headers, _, body = rest.partition(b"\r\n\r\n")
        assert b"connection: close" in headers.lower()
        assert json.loads(body) == {"error": "the body did not arrive within 0.5 seconds"}
    assert _incomplete(server, "timeout") == 2
    assert server.get_json("/topics/t?wait=0") == {"offset": 0, "messages": [], "next_offset": 0}
    status, lines = server.stop()
    assert status == 0
    stopped = next(line for line in lines if line["event"] == "longpoll.stopped")
    assert stopped["incomplete_bodies"] == {"disconnect": 0, "timeout": 2}


def _request(port: int, method: str, target: str, body: bytes = b"") -> tuple[int, object]:
    """One request with the target sent as is (http.client does not resolve ``..``)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, target, body=body or None)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_dot_names_are_refused_and_waits_take_decimal_numbers(
    program: Callable[..., Program],
) -> None:
    server = program()
    for method, target in (("GET", "/topics/.."), ("POST", "/topics/.."), ("POST", "/topics/.")):
        status, body = _request(server.port, method, target, b"m")
        assert status == 400, (method, target)
        assert "not dots only" in body["error"]  # type: ignore[index]
    assert _request(server.port, "POST", "/topics/.a.", b"m") == (200, {"offset": 0})
    for wait in (".5", "5e-1", "0.5"):
        started = time.monotonic()
        status, body = _request(server.port, "GET", f"/topics/t?wait={wait}")
        assert time.monotonic() - started >= 0.5
        assert (status, body) == (200, {"offset": 0, "messages": [], "next_offset": 0})
    status, body = _request(server.port, "GET", "/topics/t?wait=inf")
    assert status == 400
    assert "finite non-negative number" in body["error"]  # type: ignore[index]
    assert server.metrics()["longpoll_topics"] == 1.0  # only .a.
    assert server.stop()[0] == 0


def test_a_second_server_on_a_busy_port_says_so_in_one_line(
    program: Callable[..., Program],
) -> None:
    server = program()
    second = subprocess.run(
        [sys.executable, "-m", "examples.longpoll", "--port", str(server.port)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1
    assert second.stderr.splitlines() == [
        f"error: cannot listen on 127.0.0.1:{server.port}: Address already in use"
    ]
    health = server.get_json("/healthz")
    assert {k: health.pop(k) for k in ("status", "waiter")} == {
        "status": "ok",
        "waiter": "purgatory",
    }
    assert set(health) == {"loop_lag_s", "loop_lag_max_s", "accept_queue"}
    assert 0 <= health["loop_lag_s"] <= health["loop_lag_max_s"]
    # the listening socket's connections not yet accepted (Linux): none, idle
    assert health["accept_queue"] == 0
    assert server.stop()[0] == 0


def _response(data: bytes) -> tuple[bytes, bytes, object]:
    """The status line, the lower-cased headers and the JSON body of one response."""
    status_line, _, rest = data.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    return status_line, headers.lower(), json.loads(body)


def test_a_requests_head_has_a_deadline_and_a_size(program: Callable[..., Program]) -> None:
    server = program("--header-timeout", "0.5", "--max-header-bytes", "4096")
    silent = _raw(server.port)  # never sends a byte
    # a parked GET outlives the head deadline: it bounds heads, not requests
    parked = server.connection()
    parked.request("GET", "/topics/t?wait=2")
    trickled = _raw(server.port)
    for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\n":
        try:
            trickled.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            break
        time.sleep(0.05)
    large = _raw(server.port)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        large.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Large: " + b"a" * 8192)

    assert _read_to_close(silent) == b""  # closed, no answer: nothing was asked
    status_line, headers, body = _response(_read_to_close(trickled))
    assert status_line == b"HTTP/1.1 408 Request Timeout"
    assert b"connection: close" in headers
    assert body == {"error": "the request head did not arrive within 0.5 seconds"}
    status_line, headers, body = _response(_read_to_close(large))
    assert status_line == b"HTTP/1.1 431 Request Header Fields Too Large"
    assert body == {"error": "the request head is over 4096 bytes"}
    response = parked.getresponse()
    assert (response.status, json.loads(response.read())["messages"]) == (200, [])
    for sock in (silent, trickled, large):
        sock.close()
    parked.close()
    metrics = server.metrics()
    assert {
        reason: metrics[f'longpoll_refused_heads_total{{reason="{reason}"}}']
        for reason in ("idle", "timeout", "too_large")
    } == {"idle": 1, "timeout": 1, "too_large": 1}
    status, lines = server.stop()
    assert status == 0
    stopped = next(line for line in lines if line["event"] == "longpoll.stopped")
    assert stopped["refused_heads"] == {"idle": 1, "timeout": 1, "too_large": 1}
