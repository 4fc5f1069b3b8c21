"""The long-poll page at ``/`` in headless Chromium: it long-polls, shows posts, and posts.

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
JSON messages ending in a NUL byte on file descriptors 3 and 4), so the test needs
no driver and no client library. Debian's ``chromium`` package; the test is
skipped where it is missing (``.ci/run`` installs it).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.longpoll import Program, wait_until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.realtime,
    pytest.mark.skipif(
        CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)"
    ),
]

# The flags that work on a machine with no network but loopback (no background
# connections, no sandbox as root, no GPU).
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
]


class Chromium:
    """A headless Chromium and one page in it, driven over the DevTools pipe."""

    def __init__(self, executable: str, profile: Path) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def pipes_on_3_and_4() -> None:
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.proc = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=pipes_on_3_and_4,
            pass_fds=(3, 4),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]

    def send(self, method: str, session: str | None = None, **params: Any) -> Any:
        """Call a DevTools method; its result (events meanwhile are dropped)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + 30
        while True:
            while b"\0" not in self._buffer:
                left = deadline - time.monotonic()
                ready, _, _ = select.select([self._from_browser], [], [], max(left, 0))
                if not ready:
                    raise TimeoutError(f"no answer to {method}")
                chunk = os.read(self._from_browser, 65536)
                if not chunk:
                    raise ConnectionError("chromium closed the pipe")
                self._buffer += chunk
            raw, _, self._buffer = self._buffer.partition(b"\0")
            reply = json.loads(raw)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def page(self, method: str, **params: Any) -> Any:
        return self.send(method, self.session, **params)

    def evaluate(self, expression: str) -> Any:
        result = self.page("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (OSError, TimeoutError, RuntimeError):
            self.proc.kill()
        self.proc.wait(timeout=30)
        os.close(self._to_browser)
        os.close(self._from_browser)


@pytest.fixture
def browser() -> Iterator[Chromium]:
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory() as profile:
        chromium = Chromium(CHROMIUM, Path(profile))
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def server() -> Iterator[Program]:
    program = Program()
    yield program
    if program.proc.poll() is None:
        program.proc.kill()
        program.proc.communicate()


def shown(browser: Chromium) -> Callable[[], list[str]]:
    def read() -> list[str]:
        items: list[str] = browser.evaluate(
            "[...document.querySelectorAll('#messages li')].map(li => li.textContent)"
        )
        return items

    return read


def test_the_page_long_polls_shows_messages_and_posts(server: Program, browser: Chromium) -> None:
    browser.page("Page.navigate", url=f"http://127.0.0.1:{server.port}/?topic=room")
    # Page.navigate returns before the page is loaded: until then there is no #status.
    state = "document.getElementById('status')?.dataset.state"
    wait_until(lambda: browser.evaluate(state) == "waiting", "the page's first long poll")
    wait_until(
        lambda: server.metrics()['longpoll_parked_requests{waiter="purgatory"}'] == 1,
        "the page's GET parked on the server",
    )
    messages = shown(browser)
    assert messages() == []

    # a post from elsewhere reaches the page through its parked GET
    assert server.get_json("/topics/room", "POST", b"hello from the test") == {"offset": 0}
    wait_until(lambda: messages() == ["0hello from the test"], "the message on the page")

    # the page's own form posts, and its next long poll shows the message
    wait_until(
        lambda: server.metrics()['longpoll_parked_requests{waiter="purgatory"}'] == 1,
        "the page's next GET parked",
    )
    browser.evaluate("document.getElementById('message').focus()")
    browser.page("Input.insertText", text="typed in the page")
    browser.evaluate("document.getElementById('send').click()")
    wait_until(
        lambda: messages() == ["0hello from the test", "1typed in the page"],
        "the page's post on the page",
    )
    assert server.get_json("/topics/room?offset=0&wait=0")["messages"] == [
        "hello from the test",
        "typed in the page",
    ]
    assert browser.evaluate("document.getElementById('message').value") == ""
    metrics = server.metrics()
    assert metrics['aiopurgatory_operations_total{outcome="completed",purgatory="longpoll"}'] == 2
    status, _ = server.stop()
    assert status == 0
