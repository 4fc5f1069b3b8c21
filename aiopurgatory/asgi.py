"""Web frameworks: a parked request that ends with its client, and a shutdown that does not wait.

Pure ASGI (Starlette, FastAPI or any ASGI application), on asyncio loops (asyncio,
uvloop: what uvicorn, gunicorn's uvicorn workers and hypercorn's asyncio and
uvloop workers run). Two problems of a web service that parks requests in a
purgatory, and their tools:

* :class:`CancelOnDisconnect`: ASGI servers do not cancel a request's handler when
  its client hangs up; they only say so with an ``http.disconnect`` message, to a
  handler that is not listening while it awaits ``purgatory.watch(...)``. The
  middleware listens for it and cancels the handler, which withdraws its
  operation at once (``Outcome.CANCELLED``, out of the timer and every watch list).
* :func:`release_on_shutdown`: uvicorn (and gunicorn's uvicorn workers) wait for
  open requests to finish before they run the application's lifespan shutdown, so
  ``async with purgatory:`` in the lifespan releases parked requests only after
  they have all timed out. Entered in the lifespan, it makes SIGTERM and SIGINT
  close the purgatories first (every parked operation ends ``CANCELLED``, its
  handler answers at once), then lets the server's own handling run.

Neither imports a framework or a server. The signal handling is in
``aiopurgatory._shutdown``; this module re-exports it.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

# The shutdown half lives in its own module (POSIX signals, not ASGI); this is
# its public path.
from ._shutdown import SHUTDOWN_SIGNALS, release_on_shutdown

__all__ = ["SHUTDOWN_SIGNALS", "CancelOnDisconnect", "release_on_shutdown"]

# The ASGI callable's types, spelled out so that no framework is needed for them.
_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]
_ASGIApp = Callable[[_Scope, _Receive, _Send], Awaitable[None]]

# Messages that end a response unless they say ``more_body`` (pathsend never does).
_LAST_PARTS = frozenset(
    ("http.response.body", "http.response.zerocopysend", "http.response.pathsend")
)


class CancelOnDisconnect:
    """ASGI middleware: cancel an HTTP request's handler when its client disconnects.

    Wrap the application (``app = CancelOnDisconnect(app)``, or Starlette's and
    FastAPI's ``Middleware(CancelOnDisconnect)``). For each HTTP request still
    running on the next loop iteration (or reading its body), one task reads the
    server's ``receive`` and hands the messages on to the handler, which reads
    its request body as before; a handler that answers at once costs no task.
    When the client disconnects while the handler runs and before its response
    is complete, the handler's task is cancelled: an ``await purgatory.watch(...)``
    there withdraws its operation at once (``Outcome.CANCELLED``) and
    ``CancelledError`` unwinds the handler. The middleware then returns normally
    (there is nobody to answer), so the server logs no error.

    What it does not change: a handler that finished (its response complete) is
    never cancelled, background work after the response included. The body is
    read ahead by at most one message while the handler has not taken it, so the
    server's flow control on large uploads stays in force, and a hang-up before
    the body is whole reaches the handler from its next ``receive()``, as without
    the middleware (Starlette's ``ClientDisconnect``). A cancellation from
    elsewhere (the server's own shutdown timeout) propagates as before.
    WebSocket and lifespan scopes pass through untouched.

    Reading ahead means the server's ``receive()`` is called as soon as the
    request starts: a request with ``Expect: 100-continue`` is told to send its
    body then, not when the handler first asks for it.

    Args:
        app: the ASGI application to wrap.

    Raises:
        TypeError: ``app`` is not callable.
        RuntimeError: (per request) the server does not run an asyncio loop.
    """

    __slots__ = ("app",)

    def __init__(self, app: _ASGIApp) -> None:
        if not callable(app):
            raise TypeError(f"app must be an ASGI application (callable), got {type(app).__name__}")
        self.app = app

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        if task is None:
            raise RuntimeError("CancelOnDisconnect needs an asyncio loop (asyncio or uvloop)")
        loop = asyncio.get_running_loop()
        request = _Request(receive, send, task, loop)
        # The reader starts on the next loop iteration (or at the handler's first
        # receive()): a handler that answers without waiting, most of them, never
        # costs a task.
        starting = loop.call_soon(request.start_reading)
        try:
            await self.app(scope, request.receive, request.send)
        except asyncio.CancelledError:
            # Ours (the client is gone): the request ends here, quietly. Anyone
            # else's (uvicorn's shutdown timeout, an outer cancel scope): on its way.
            if request.cancelled and task.uncancel() == 0:
                return
            raise
        except BaseException:
            if request.cancelled:
                task.uncancel()  # the handler turned our cancellation into an error
            raise
        else:
            if request.cancelled:
                # The handler caught our cancellation and returned: it is spent.
                task.uncancel()
        finally:
            request.finished = True
            starting.cancel()
            if request.reader is not None:
                request.reader.cancel()


class _Request:
    """One HTTP request's messages: read from the server by :meth:`read`, handed to the
    application by :meth:`receive`; :meth:`send` notes when the response is complete."""

    __slots__ = (
        "_body_done",
        "_error",
        "_loop",
        "_messages",
        "_receive",
        "_send",
        "_taken",
        "_task",
        "_waiters",
        "cancelled",
        "finished",
        "reader",
        "responded",
    )

    def __init__(
        self,
        receive: _Receive,
        send: _Send,
        task: asyncio.Task[Any],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._receive = receive
        self._send = send
        self._task = task
        self._loop = loop
        # Read from the server, not yet taken by the application (at most a request
        # message and the disconnect).
        self._messages: collections.deque[_Message] = collections.deque()
        # The application's receive() calls waiting for a message (futures, not
        # Events: they cost less, and most requests never wait).
        self._waiters: list[asyncio.Future[None]] = []
        # The reader, waiting for the application to take a part of the body.
        self._taken: asyncio.Future[None] | None = None
        self._error: Exception | None = None
        self._body_done = False
        #: The handler was cancelled because its client disconnected.
        self.cancelled = False
        #: The handler returned (or raised).
        self.finished = False
        #: The response is complete (its last body message was sent).
        self.responded = False
        #: The task running :meth:`read`, once started.
        self.reader: asyncio.Task[None] | None = None

    def start_reading(self) -> None:
        """Start :meth:`read` (once, and not after the handler finished)."""
        if self.reader is None and not self.finished:
            self.reader = self._loop.create_task(self.read())

    async def read(self) -> None:
        """Read the server's messages until the disconnect (then cancel the handler if
        it still runs and has not answered) or until the handler finishes."""
        while True:
            try:
                message = await self._receive()
            except Exception as exc:
                # The application gets it from its next receive(), as it would have.
                self._error = exc
                self._wake()
                return
            self._messages.append(message)
            self._wake()
            kind = message["type"]
            if kind == "http.disconnect":
                # Before the body is whole the handler is reading it: it learns of the
                # hang-up from its next receive(), as without the middleware.
                if self._body_done and not (self.finished or self.responded):
                    self.cancelled = True
                    self._task.cancel()
                return
            if kind != "http.request" or not message.get("more_body", False):
                self._body_done = True
            else:
                # More body to come: read it when the handler has taken this part, so
                # the server keeps pausing a client that sends faster than it is read.
                while self._messages:
                    self._taken = self._loop.create_future()
                    await self._taken

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def receive(self) -> _Message:
        """The application's ``receive``: the server's messages, in order."""
        if self.reader is None:
            self.start_reading()  # one reader of the server's receive, always
        while not self._messages:
            if self._error is not None:
                raise self._error
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if not waiter.done():  # cancelled while waiting (Starlette's is_disconnected)
                    self._waiters.remove(waiter)
        message = self._messages[0]
        if message["type"] == "http.disconnect":
            # Left in place: every later receive() says so too, as servers do.
            return message
        self._messages.popleft()
        taken = self._taken
        if taken is not None and not taken.done():
            taken.set_result(None)
        return message

    async def send(self, message: _Message) -> None:
        """The application's ``send``: the server's, noting the end of the response."""
        kind = message["type"]
        if kind in _LAST_PARTS and not message.get("more_body", False):
            self.responded = True
        await self._send(message)


from ._namespace import public_dir as _public_dir  # noqa: E402

__dir__ = _public_dir(__name__, __all__)
