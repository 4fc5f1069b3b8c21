"""``python -m examples.longpoll --otel console|otlp``: the trace of one long-poll, from
the POST that woke it, read from the spans the server writes on stdout or sends to an
OTLP/HTTP receiver run by the test.

Wall-clock (``realtime``): it waits for states with generous deadlines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from aiopurgatory.redis.testing import RedisServer
from tests.support.longpoll import Program, wait_until

pytestmark = pytest.mark.realtime


def test_a_long_poll_span_links_to_the_post_that_woke_it() -> None:
    server = Program("--otel", "console", stdout=subprocess.PIPE)
    try:
        one_long_poll(server)
    finally:
        by_name = spans_of(server)
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


def one_long_poll(server: Program) -> None:
    """A GET on topic ``news`` (continuing TRACEPARENT) parks, a POST wakes it."""
    parked = server.connection()
    parked.request("GET", "/topics/news?offset=0&wait=60", headers={"traceparent": TRACEPARENT})
    gauge = 'longpoll_parked_requests{waiter="purgatory"}'
    wait_until(lambda: server.metrics()[gauge] == 1, "the GET parked")
    assert server.get_json("/topics/news", "POST", b"hello") == {"offset": 0}
    response = parked.getresponse()
    assert response.status == 200
    assert json.loads(response.read())["messages"] == ["hello"]
    parked.close()


def stop(server: Program) -> tuple[str, str]:
    """SIGTERM the server (its exporter flushes); its stdout and stderr; it exited 0."""
    try:
        server.proc.send_signal(signal.SIGTERM)
        out, err = server.proc.communicate(timeout=30)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.communicate()
    assert server.proc.returncode == 0, err
    return out or "", err


def spans_of(server: Program) -> dict[str, list[dict[str, Any]]]:
    """SIGTERM the server; the spans it wrote, by name."""
    out, _ = stop(server)
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


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP traces receiver on 127.0.0.1: the requests it was sent, decoded."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Export)
        self.requests: list[ExportTraceServiceRequest] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def spans(self) -> dict[str, list[Any]]:
        """The spans received, by name."""
        by_name: dict[str, list[Any]] = {}
        with self.lock:
            for request in self.requests:
                for resource_spans in request.resource_spans:
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            by_name.setdefault(span.name, []).append(span)
        return by_name


class _Export(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path != "/v1/traces" or self.headers["Content-Type"] != "application/x-protobuf":
            self.send_error(404 if self.path != "/v1/traces" else 415)
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.server.lock:
            self.server.requests.append(request)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # not on the test's stderr


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_otlp_sends_the_long_poll_and_its_link_to_the_endpoint(receiver: Receiver) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint  # the SDK adds /v1/traces
    server = Program("--otel", "otlp", env=env)
    try:
        one_long_poll(server)
    finally:
        stop(server)  # the provider's shutdown sends what the batch processor holds
    assert receiver.requests, "the receiver got no export request"
    resources = {
        attribute.key: attribute.value.string_value
        for request in receiver.requests
        for resource_spans in request.resource_spans
        for attribute in resource_spans.resource.attributes
    }
    assert resources["service.name"] == "longpoll"
    spans = receiver.spans()
    (get,) = spans["GET /topics/{name}"]
    (post,) = spans["POST /topics/{name}"]
    (wait,) = spans["wait longpoll"]
    assert get.trace_id.hex() == TRACE_ID
    assert get.parent_span_id.hex() == PARENT_ID
    assert wait.trace_id == get.trace_id
    assert wait.parent_span_id == get.span_id
    attributes = {attribute.key: attribute.value for attribute in wait.attributes}
    assert attributes["aiopurgatory.outcome"].string_value == "completed"
    assert attributes["aiopurgatory.completed_by"].string_value == "news"
    assert attributes["aiopurgatory.keys"].int_value == 1
    # The wait's one link is the POST's span, in a trace of its own.
    (link,) = wait.links
    assert link.span_id == post.span_id
    assert link.trace_id == post.trace_id
    assert post.trace_id != get.trace_id
    # The GET parked before the POST was sent.
    assert wait.start_time_unix_nano < post.start_time_unix_nano


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
