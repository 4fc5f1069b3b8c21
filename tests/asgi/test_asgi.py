"""aiopurgatory.asgi in process: the middleware against a scripted ASGI server, Starlette
and FastAPI applications, and release_on_shutdown with signals raised in this process.

Under real servers, with real signals and clients that hang up: tests/asgi/test_asgi_servers.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from types import FrameType
from typing import Any

import pytest
from fastapi import Depends, FastAPI
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import aiopurgatory as ap
from aiopurgatory.asgi import CancelOnDisconnect, release_on_shutdown

Message = MutableMapping[str, Any]
App = Callable[[Any, Any, Any], Awaitable[None]]


class Wait(ap.DelayedOperation):
    """Never completes by itself: only a timeout, a cancel or a close ends it."""

    def try_complete(self) -> bool:
        return False


class Server:
    """A scripted ASGI server for one HTTP request, behaving as uvicorn's: ``receive()``
    hands out what the test queued, and says ``http.disconnect`` once the response is
    complete."""

    def __init__(self, *messages: Message) -> None:
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        for message in messages:
            self.inbox.put_nowait(message)
        self.sent: list[Message] = []
        self.reads = 0
        self.response_complete = False

    async def receive(self) -> Message:
        if self.response_complete and self.inbox.empty():
            return {"type": "http.disconnect"}
        message = await self.inbox.get()
        self.reads += 1
        return message

    async def send(self, message: Message) -> None:
        self.sent.append(dict(message))
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.response_complete = True

    def hang_up(self) -> None:
        self.inbox.put_nowait({"type": "http.disconnect"})

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    def status(self) -> int | None:
        for message in self.sent:
            if message["type"] == "http.response.start":
                return int(message["status"])
        return None


def http_scope(method: str = "GET", path: str = "/", body: bool = False) -> dict[str, Any]:
    headers = [(b"host", b"test")]
    if body:
        headers.append((b"content-type", b"application/json"))
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


async def until(condition: Callable[[], bool], seconds: float = 2.0) -> None:
    """Let the loop run until ``condition()`` holds (fails after ``seconds``)."""
    async with asyncio.timeout(seconds):
        while not condition():  # noqa: ASYNC110 - the conditions are the library's state
            await asyncio.sleep(0.001)


def request(body: bytes = b"", more_body: bool = False) -> Message:
    return {"type": "http.request", "body": body, "more_body": more_body}


# -- the middleware, on a bare ASGI application -----------------------------------------------


async def test_a_hang_up_withdraws_the_parked_watch() -> None:
    purgatory: ap.Purgatory[Wait] = ap.Purgatory("web")
    op = Wait(30)
    unwound: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            await purgatory.watch(op, ["job"])
        except asyncio.CancelledError:
            unwound.append("cancelled")
            raise
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    server = Server(request())
    call = asyncio.create_task(CancelOnDisconnect(app)(http_scope(), server.receive, server.send))
    await until(lambda: purgatory.pending == 1)
    server.hang_up()
    await until(lambda: purgatory.pending == 0)
    assert op.outcome is ap.Outcome.CANCELLED
    # The request ends quietly: no exception for the server to log, nothing sent.
    await call
    assert not call.cancelled()
    assert unwound == ["cancelled"]
    assert server.sent == []
    assert not call.cancelled()


async def test_the_handler_reads_its_own_body_one_part_ahead_at_most() -> None:
    parts = [b"abc", b"def", b"ghi"]
    received: list[bytes] = []
    reads_seen: list[int] = []
    server = Server(*(request(p, more_body=i < 2) for i, p in enumerate(parts)))
    step = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            await step.wait()  # the test lets the handler read one part at a time
            step.clear()
            message = await receive()
            received.append(message["body"])
            reads_seen.append(server.reads)
            if not message["more_body"]:
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"".join(received)})

    call = asyncio.create_task(CancelOnDisconnect(app)(http_scope(), server.receive, server.send))
    for _ in range(20):
        await asyncio.sleep(0)
    # Nothing taken yet: the middleware has read one part, and waits for it to be taken.
    assert server.reads == 1
    for _ in parts:
        step.set()
        await until(lambda: not step.is_set())
        for _ in range(5):
            await asyncio.sleep(0)
    await call
    assert received == parts
    assert server.body() == b"abcdefghi"
    assert reads_seen == [1, 2, 3]


async def test_a_hang_up_before_the_body_is_whole_reaches_the_handler() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            seen.append(message["type"])
            if message["type"] == "http.disconnect":
                return

    server = Server(request(b"part", more_body=True))
    call = asyncio.create_task(CancelOnDisconnect(app)(http_scope(), server.receive, server.send))
    await until(lambda: seen == ["http.request"])
    server.hang_up()
    await call  # the handler saw the hang-up itself and returned: not cancelled
    assert seen == ["http.request", "http.disconnect"]


async def test_a_handler_that_answers_at_once_costs_no_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    created: list[object] = []
    create_task = loop.create_task

    def counting(coro: Any, **kwargs: Any) -> Any:
        created.append(coro)
        return create_task(coro, **kwargs)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    server = Server(request())
    monkeypatch.setattr(loop, "create_task", counting)
    try:
        await CancelOnDisconnect(app)(http_scope(), server.receive, server.send)
        await asyncio.sleep(0)
    finally:
        monkeypatch.undo()
    assert created == []
    assert server.body() == b"ok"
    assert server.reads == 0


async def test_a_finished_handler_is_not_cancelled_and_leaves_no_task() -> None:
    before = asyncio.all_tasks()
    background_done = asyncio.Event()
    finished: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        # Work after the response (Starlette's background tasks run here): the
        # server now says http.disconnect, which must not cancel it.
        await asyncio.sleep(0.01)
        assert (await receive())["type"] == "http.request"
        assert (await receive())["type"] == "http.disconnect"
        finished.append("background")
        background_done.set()

    server = Server(request())
    await CancelOnDisconnect(app)(http_scope(), server.receive, server.send)
    assert finished == ["background"]
    assert server.body() == b"ok"
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert asyncio.all_tasks() == before


async def test_a_disconnect_during_a_streamed_response_cancels_it() -> None:
    chunks = 0

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal chunks
        await send({"type": "http.response.start", "status": 200, "headers": []})
        while True:
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
            chunks += 1
            await asyncio.sleep(0.005)

    server = Server(request())
    call = asyncio.create_task(CancelOnDisconnect(app)(http_scope(), server.receive, server.send))
    await until(lambda: chunks >= 3)
    server.hang_up()
    await asyncio.wait_for(call, 2)
    assert call.result() is None
    stopped_at = chunks
    await asyncio.sleep(0.02)
    assert chunks == stopped_at


async def test_a_cancellation_from_elsewhere_propagates() -> None:
    purgatory: ap.Purgatory[Wait] = ap.Purgatory("web")
    op = Wait(30)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await purgatory.watch(op, ["job"])

    server = Server(request())
    call = asyncio.create_task(CancelOnDisconnect(app)(http_scope(), server.receive, server.send))
    await until(lambda: purgatory.pending == 1)
    call.cancel()  # as a server's shutdown timeout does
    with pytest.raises(asyncio.CancelledError):
        await call
    assert op.outcome is ap.Outcome.CANCELLED


@pytest.mark.parametrize("ends", ["returns", "raises"])
async def test_a_handler_that_swallows_the_cancellation_leaves_its_task_clean(ends: str) -> None:
    purgatory: ap.Purgatory[Wait] = ap.Purgatory("web")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            await purgatory.watch(Wait(30), ["job"])
        except asyncio.CancelledError:
            if ends == "raises":
                raise ValueError("gone") from None

    async def serve() -> int:
        task = asyncio.current_task()
        assert task is not None
        with contextlib.suppress(ValueError):
            await CancelOnDisconnect(app)(http_scope(), server.receive, server.send)
        # A later timeout in the same task still works: no cancellation left pending.
        async with asyncio.timeout(0.01):
            await asyncio.sleep(0)
        return task.cancelling()

    server = Server(request())
    call = asyncio.create_task(serve())
    await until(lambda: purgatory.pending == 1)
    server.hang_up()
    assert await call == 0


async def test_the_handler_errors_pass_unchanged() -> None:
    error = ValueError("boom")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise error

    server = Server(request())
    with pytest.raises(ValueError, match="boom") as caught:
        await CancelOnDisconnect(app)(http_scope(), server.receive, server.send)
    assert caught.value is error


async def test_a_receive_error_reaches_the_handler() -> None:
    seen: list[BaseException] = []

    async def receive() -> Message:
        raise OSError("connection reset")

    async def send(message: Message) -> None:
        pass

    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            await receive()
        except OSError as exc:
            seen.append(exc)

    await CancelOnDisconnect(app)(http_scope(), receive, send)
    assert [str(e) for e in seen] == ["connection reset"]


@pytest.mark.parametrize("kind", ["websocket", "lifespan"])
async def test_other_scopes_pass_through_untouched(kind: str) -> None:
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.extend([scope, receive, send])

    server = Server()
    scope = {"type": kind, "asgi": {"version": "3.0"}}
    await CancelOnDisconnect(app)(scope, server.receive, server.send)
    assert seen == [scope, server.receive, server.send]


def test_the_app_must_be_callable() -> None:
    with pytest.raises(TypeError, match="app must be an ASGI application"):
        CancelOnDisconnect("app")  # type: ignore[arg-type]


# -- Starlette and FastAPI ---------------------------------------------------------------------


def starlette_app(purgatory: ap.Purgatory[Wait]) -> Starlette:
    async def wait(request: Request) -> Response:
        outcome = await purgatory.watch(Wait(30), ["job"])
        return JSONResponse({"outcome": outcome.value})

    async def echo(request: Request) -> Response:
        body = await request.body()
        outcome = await purgatory.watch(Wait(0.01), ["echo"])
        return JSONResponse({"body": body.decode(), "outcome": outcome.value})

    async def stream(request: Request) -> Response:
        async def numbers() -> Any:
            for i in range(1000):
                yield f"{i}\n"
                await asyncio.sleep(0.005)

        return StreamingResponse(numbers())

    return Starlette(
        routes=[
            Route("/wait", wait),
            Route("/echo", echo, methods=["POST"]),
            Route("/stream", stream),
        ]
    )


async def test_starlette_a_hang_up_withdraws_the_wait() -> None:
    purgatory: ap.Purgatory[Wait] = ap.Purgatory("web")
    app = CancelOnDisconnect(starlette_app(purgatory))
    server = Server(request())
    call = asyncio.create_task(app(http_scope(path="/wait"), server.receive, server.send))
    await until(lambda: purgatory.pending == 1)
    server.hang_up()
    await until(lambda: purgatory.pending == 0)
    await call
    assert not call.cancelled()
    assert server.sent == []


async def test_starlette_reads_the_body_and_answers() -> None:
    purgatory: ap.Purgatory[Wait] = ap.Purgatory("web")
    app = CancelOnDisconnect(starlette_app(purgatory))
    server = Server(request(b'{"a":', more_body=True), request(b" 1}"))
    await app(http_scope("POST", "/echo", body=True), server.receive, server.send)
    assert server.status() == 200
    assert server.body() == b'{"body":"{\\"a\\": 1}","outcome":"expired"}'


async def test_starlette_streaming_response_ends_on_hang_up() -> None:
    purgatory: ap.Purgatory[Wait] = ap.Purgatory("web")
    app = CancelOnDisconnect(starlette_app(purgatory))
    server = Server(request())
    call = asyncio.create_task(app(http_scope(path="/stream"), server.receive, server.send))
    await until(lambda: len(server.sent) >= 4)
    server.hang_up()
    await asyncio.wait_for(call, 2)
    sent = len(server.sent)
    await asyncio.sleep(0.03)
    assert len(server.sent) == sent < 100


class Job(BaseModel):
    name: str


def fastapi_app(purgatory: ap.Purgatory[Wait]) -> FastAPI:
    def get_purgatory() -> ap.Purgatory[Wait]:
        return purgatory

    api = FastAPI()

    @api.get("/wait")
    async def wait(p: ap.Purgatory[Wait] = Depends(get_purgatory)) -> dict[str, str]:  # noqa: B008
        outcome = await p.watch(Wait(30), ["job"])
        return {"outcome": outcome.value}

    @api.post("/jobs")
    async def create(
        job: Job,
        p: ap.Purgatory[Wait] = Depends(get_purgatory),  # noqa: B008
    ) -> dict[str, str]:
        outcome = await p.watch(Wait(0.01), [job.name])
        return {"name": job.name, "outcome": outcome.value}

    return api


async def test_fastapi_a_hang_up_withdraws_the_wait() -> None:
    purgatory: ap.Purgatory[Wait] = ap.Purgatory("web")
    app = CancelOnDisconnect(fastapi_app(purgatory))
    server = Server(request())
    call = asyncio.create_task(app(http_scope(path="/wait"), server.receive, server.send))
    await until(lambda: purgatory.pending == 1)
    server.hang_up()
    await until(lambda: purgatory.pending == 0)
    await call
    assert not call.cancelled()
    assert server.sent == []


async def test_fastapi_reads_the_body_and_answers() -> None:
    purgatory: ap.Purgatory[Wait] = ap.Purgatory("web")
    app = CancelOnDisconnect(fastapi_app(purgatory))
    server = Server(request(b'{"name": "j1"}'))
    await app(http_scope("POST", "/jobs", body=True), server.receive, server.send)
    assert server.status() == 200
    assert server.body() == b'{"name":"j1","outcome":"expired"}'


# -- release_on_shutdown, with signals raised in this process ---------------------------------


@pytest.fixture
def server_handler() -> Iterator[list[int]]:
    """A SIGTERM handler as uvicorn installs one (signal.signal), recording its calls;
    the original handler back afterwards."""
    calls: list[int] = []

    def handle_exit(signum: int, frame: FrameType | None) -> None:
        calls.append(signum)

    original = signal.signal(signal.SIGTERM, handle_exit)
    try:
        yield calls
    finally:
        signal.signal(signal.SIGTERM, original)


async def test_sigterm_closes_the_purgatories_then_runs_the_servers_handler(
    server_handler: list[int],
) -> None:
    handler = signal.getsignal(signal.SIGTERM)
    first: ap.Purgatory[Wait] = ap.Purgatory("first")
    second: ap.Purgatory[Wait] = ap.Purgatory("second")
    ops = [Wait(30), Wait(30)]
    async with release_on_shutdown(first, second):
        assert signal.getsignal(signal.SIGTERM) is not handler
        waits = [
            asyncio.create_task(first.watch(ops[0], ["a"])),
            asyncio.create_task(second.watch(ops[1], ["b"])),
        ]
        await until(lambda: first.pending + second.pending == 2)
        signal.raise_signal(signal.SIGTERM)
        assert server_handler == [signal.SIGTERM]  # called as it would have been
        assert await asyncio.gather(*waits) == [ap.Outcome.CANCELLED] * 2
        assert first.closed
        assert second.closed
        with pytest.raises(ap.PurgatoryClosedError):
            await first.watch(Wait(1), ["a"])
        # A second signal goes to the server's handler too (uvicorn: force exit).
        signal.raise_signal(signal.SIGTERM)
        assert server_handler == [signal.SIGTERM] * 2
    assert signal.getsignal(signal.SIGTERM) is handler


async def test_on_signal_runs_first_and_its_failure_does_not_stop_the_closing(
    server_handler: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    purgatory: ap.Purgatory[Wait] = ap.Purgatory("web")
    seen: list[tuple[signal.Signals, bool]] = []

    def on_signal(sig: signal.Signals) -> None:
        seen.append((sig, purgatory.closed))
        raise RuntimeError("draining flag broken")

    async with release_on_shutdown(purgatory, on_signal=on_signal):
        wait = asyncio.create_task(purgatory.watch(Wait(30), ["a"]))
        await until(lambda: purgatory.pending == 1)
        signal.raise_signal(signal.SIGTERM)
        assert await wait is ap.Outcome.CANCELLED
    assert seen == [(signal.SIGTERM, False)]
    assert "aiopurgatory.on_signal_failed" in caplog.text
    assert "draining flag broken" in caplog.text


async def test_on_signal_alone(server_handler: list[int]) -> None:
    seen: list[signal.Signals] = []
    async with release_on_shutdown(on_signal=seen.append):
        signal.raise_signal(signal.SIGTERM)
        await until(lambda: seen == [signal.SIGTERM])
    assert server_handler == [signal.SIGTERM]


async def test_a_loops_signal_handler_still_runs() -> None:
    # hypercorn's way: loop.add_signal_handler, whose Python half is replaced by ours.
    loop = asyncio.get_running_loop()
    calls: list[str] = []
    loop.add_signal_handler(signal.SIGINT, calls.append, "server")
    try:
        purgatory: ap.Purgatory[Wait] = ap.Purgatory("web")
        op = Wait(30)
        async with release_on_shutdown(purgatory):
            wait = asyncio.create_task(purgatory.watch(op, ["a"]))
            await until(lambda: purgatory.pending == 1)
            os.kill(os.getpid(), signal.SIGINT)
            await until(lambda: calls == ["server"])
            assert await wait is ap.Outcome.CANCELLED
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


async def test_an_ignored_signal_stays_ignored() -> None:
    original = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        purgatory: ap.Purgatory[Wait] = ap.Purgatory("web")
        async with release_on_shutdown(purgatory):
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, original)


async def test_a_handler_replaced_meanwhile_is_kept(server_handler: list[int]) -> None:
    purgatory: ap.Purgatory[Wait] = ap.Purgatory("web")

    def other(signum: int, frame: FrameType | None) -> None:
        pass

    async with release_on_shutdown(purgatory):
        signal.signal(signal.SIGTERM, other)
    assert signal.getsignal(signal.SIGTERM) is other


def test_outside_the_main_thread_nothing_is_installed() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    seen: list[object] = []

    async def enter() -> None:
        async with release_on_shutdown(ap.Purgatory("web")):
            seen.extend(signal.getsignal(sig) for sig in before)

    thread = threading.Thread(target=asyncio.run, args=(enter(),))
    thread.start()
    thread.join()
    assert seen == list(before.values())


def test_bad_arguments_are_named() -> None:
    with pytest.raises(TypeError, match=r"purgatories\[1\] must be an aiopurgatory.Purgatory"):
        release_on_shutdown(ap.Purgatory("web"), "web")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"needs a purgatory \(or on_signal\)"):
        release_on_shutdown()
    with pytest.raises(TypeError, match="on_signal must be callable"):
        release_on_shutdown(ap.Purgatory("web"), on_signal="stop")  # type: ignore[arg-type]


async def test_entered_once() -> None:
    releasing = release_on_shutdown(ap.Purgatory("web"))
    async with releasing:
        with pytest.raises(RuntimeError, match="entered once"):
            await releasing.__aenter__()
