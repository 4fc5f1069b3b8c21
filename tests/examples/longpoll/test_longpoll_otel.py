"""``python -m examples.longpoll --otel console``: the trace of one long-poll, from the
POST that woke it, read from the spans the server writes on stdout.

Wall-clock (``realtime``): it waits for states with generous deadlines.
"""

from __future__ import annotations

import json
import signal
import subprocess
from typing import Any

import pytest

from aiopurgatory.redis.testing import RedisServer
from tests.support.longpoll import Program, wait_until

pytestmark = pytest.mark.realtime


def test_a_long_poll_span_links_to_the_post_that_woke_it() -> None:
    server = Program("--otel", "console", stdout=subprocess.PIPE)
    try:
        parked = server.connection()
        parked.request("GET", "/topics/news?offset=0&wait=60", headers={"traceparent": TRACEPARENT})
        gauge = 'longpoll_parked_requests{waiter="purgatory"}'
        wait_until(lambda: server.metrics()[gauge] == 1, "the GET parked")
        assert server.get_json("/topics/news", "POST", b"hello") == {"offset": 0}
        response = parked.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["messages"] == ["hello"]
        parked.close()
        server.proc.send_signal(signal.SIGTERM)
        out, _ = server.proc.communicate(timeout=30)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.communicate()
    assert server.proc.returncode == 0
    spans = [json.loads(line) for line in out.splitlines()]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_name.setdefault(span["name"], []).append(span)
    (get,) = by_name["GET /topics/{name}"]
    (post,) = by_name["POST /topics/{name}"]
    (wait,) = by_name["wait longpoll"]
    # The GET continued the client's trace; the wait is the GET's child.
    assert get["context"]["trace_id"] == "0x" + TRACE_ID
    assert get["parent_id"] == "0x" + PARENT_ID
    assert get["kind"] == "SpanKind.SERVER"
    assert get["attributes"]["http.response.status_code"] == 200
    assert wait["parent_id"] == get["context"]["span_id"]
    assert wait["context"]["trace_id"] == get["context"]["trace_id"]
    assert wait["attributes"] == {
        "aiopurgatory.outcome": "completed",
        "aiopurgatory.keys": 1,
        "aiopurgatory.completed_by": "news",
    }
    # ... and links to the POST's span, in a trace of its own.
    (link,) = wait["links"]
    assert link["context"]["span_id"] == post["context"]["span_id"]
    assert link["context"]["trace_id"] == post["context"]["trace_id"]
    assert post["context"]["trace_id"] != get["context"]["trace_id"]


def spans_of(server: Program) -> dict[str, list[dict[str, Any]]]:
    """SIGTERM the server; the spans it wrote, by name."""
    try:
        server.proc.send_signal(signal.SIGTERM)
        out, _ = server.proc.communicate(timeout=30)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.communicate()
    assert server.proc.returncode == 0
    by_name: dict[str, list[dict[str, Any]]] = {}
    for line in out.splitlines():
        span = json.loads(line)
        by_name.setdefault(span["name"], []).append(span)
    return by_name


def test_a_long_poll_woken_by_a_post_on_another_server_links_to_that_post(
    redis_server: RedisServer,
) -> None:
    # Two processes on one Redis: the GET parks on one, the POST lands on the other;
    # the POST's trace context crosses with its trigger (the message's sender field).
    here = Program("--redis", redis_server.url, "--otel", "console", stdout=subprocess.PIPE)
    there = Program("--redis", redis_server.url, "--otel", "console", stdout=subprocess.PIPE)
    try:
        parked = here.connection()
        parked.request("GET", "/topics/news?offset=0&wait=60", headers={"traceparent": TRACEPARENT})
        gauge = 'longpoll_parked_requests{waiter="purgatory"}'
        wait_until(lambda: here.metrics()[gauge] == 1, "the GET parked")
        # ... and its topic's partition subscribed here (within the sweep interval):
        # before that, the POST's message would not reach this process, which would
        # find the new watermark by reading it from Redis, with no trace to link.
        wait_until(
            lambda: any(
                value >= 1
                for name, value in here.metrics().items()
                if name.startswith("aiopurgatory_redis_subscribed_partitions")
            ),
            "the topic's partition subscribed",
        )
        assert there.get_json("/topics/news", "POST", b"hello") == {"offset": 0}
        response = parked.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["messages"] == ["hello"]
        parked.close()
    finally:
        spans_here = spans_of(here)
        spans_there = spans_of(there)
    (get,) = spans_here["GET /topics/{name}"]
    (wait,) = spans_here["wait longpoll"]
    (post,) = spans_there["POST /topics/{name}"]
    assert get["context"]["trace_id"] == "0x" + TRACE_ID
    assert wait["parent_id"] == get["context"]["span_id"]
    assert wait["attributes"]["aiopurgatory.outcome"] == "completed"
    (link,) = wait["links"]
    assert link["context"]["span_id"] == post["context"]["span_id"]
    assert link["context"]["trace_id"] == post["context"]["trace_id"]


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
