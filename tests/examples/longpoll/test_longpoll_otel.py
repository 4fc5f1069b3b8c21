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


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
