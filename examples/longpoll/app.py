"""The HTTP side: a Starlette application around a :class:`~examples.longpoll.feed.Feed`.

Routes: ``POST /topics/{name}``, ``GET /topics/{name}``, ``GET /metrics``,
``GET /healthz`` and the page at ``/``. Every error is a 4xx or 5xx with a one-line
JSON body ``{"error": "..."}``, unknown paths and methods included.

A POST body must arrive whole within ``Settings.body_timeout`` seconds of its
headers, else a 408 that closes the connection. A client that hangs up before
its body is whole is counted (``longpoll_incomplete_bodies_total``), like a
parked GET's client that goes away: careless clients are traffic, not errors.

A parked GET ends with its client: :class:`aiopurgatory.asgi.CancelOnDisconnect`
cancels the handler when the client goes away, which withdraws the wait at once
(for the purgatory waiter: the operation is cancelled, out of the wheel and the
watch list); the feed counts it (``longpoll_disconnects_total``).

SIGTERM and SIGINT release the parked GETs before the server drains its
connections: :func:`aiopurgatory.asgi.release_on_shutdown` in the lifespan
shuts the feed down (every parked GET is answered with what its topic holds, a
new one at once) and closes the purgatory, then the server's own handling runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from aiopurgatory.asgi import CancelOnDisconnect, release_on_shutdown
from aiopurgatory.metrics.prometheus import PurgatoryCollector

from .acceptq import AcceptQueue, AcceptQueueCollector
from .feed import Feed, FeedError, Settings, check_idempotency_key
from .looplag import LoopLag, LoopLagCollector
from .protocol import REFUSED_HEAD_REASONS
from .waiters import PurgatoryWaiter, Waiter

__all__ = ["INCOMPLETE_BODY_REASONS", "FeedCollector", "create_app", "parse_fetch"]

_PAGE = Path(__file__).with_name("page.html")
_INT = re.compile(r"[0-9]{1,15}")
# A decimal number as people write one: 30, 2.5, .5, 5., 5e-1 (no sign, no
# "inf"/"nan", no "_" or spaces, which float() would take).
_SECONDS = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_MAX_NUMBER_CHARS = 32
_FETCH_PARAMS = frozenset(("offset", "wait", "min_bytes"))

#: Why a POST body did not arrive whole: its client hung up, or it missed
#: ``Settings.body_timeout``.
INCOMPLETE_BODY_REASONS = ("disconnect", "timeout")


def error(status: int, message: str, *, close: bool = False) -> JSONResponse:
    """A one-line JSON error response; ``close``: the connection is closed after it."""
    headers = {"connection": "close"} if close else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def parse_fetch(query: Iterable[tuple[str, str]], settings: Settings) -> tuple[int, float, int]:
    """``offset``, ``wait`` and ``min_bytes`` from a query string's pairs.

    Raises:
        FeedError: 400 for an unknown or repeated parameter, an offset or min_bytes
            that is not a non-negative integer, a wait that is not a finite
            non-negative decimal number (``30``, ``2.5``, ``.5``, ``5e-1``), or a
            wait over ``settings.max_wait``.
    """
    values: dict[str, str] = {}
    for name, value in query:
        if name not in _FETCH_PARAMS:
            raise FeedError(400, f"unknown parameter {name!r} (offset, wait, min_bytes)")
        if name in values:
            raise FeedError(400, f"{name} given twice")
        values[name] = value
    offset = _parse_int(values, "offset", 0)
    min_bytes = _parse_int(values, "min_bytes", 1)
    text = values.get("wait")
    if text is None:
        wait = settings.default_wait
    elif len(text) <= _MAX_NUMBER_CHARS and _SECONDS.fullmatch(text):
        wait = float(text)
        if wait > settings.max_wait:  # 1e999 is inf: over the (finite) maximum too
            raise FeedError(400, f"wait must be at most {settings.max_wait:g} seconds, got {text}")
    else:
        raise FeedError(
            400, f"wait must be a finite non-negative number of seconds, got {text[:40]!r}"
        )
    return offset, wait, min_bytes


def _parse_int(values: dict[str, str], name: str, default: int) -> int:
    text = values.get(name)
    if text is None:
        return default
    if not _INT.fullmatch(text):
        raise FeedError(400, f"{name} must be a non-negative integer, got {text!r}")
    return int(text)


class FeedCollector(Collector):
    """Prometheus families of the feed: parked GETs, answers by reason, topics, messages;
    POST bodies that never arrived whole (``incomplete_bodies``) and connections
    refused before a request's head was whole (``refused_heads``), by reason."""

    def __init__(
        self,
        feed: Feed,
        incomplete_bodies: dict[str, int] | None = None,
        refused_heads: dict[str, int] | None = None,
    ) -> None:
        self._feed = feed
        self._incomplete = incomplete_bodies
        self._refused_heads = refused_heads

    def collect(self) -> list[Metric]:
        feed = self._feed
        parked = GaugeMetricFamily(
            "longpoll_parked_requests", "GET requests waiting now.", labels=["waiter"]
        )
        parked.add_metric([feed.waiter.name], feed.parked)
        answers = CounterMetricFamily(
            "longpoll_answers",
            "Parked GETs answered, by reason (early: before their wait without enough data).",
            labels=["waiter", "reason"],
        )
        for reason, count in feed.answers.items():
            answers.add_metric([feed.waiter.name, reason], count)
        gone = CounterMetricFamily(
            "longpoll_disconnects", "Parked GETs whose client went away.", labels=["waiter"]
        )
        gone.add_metric([feed.waiter.name], feed.disconnected)
        topics = GaugeMetricFamily("longpoll_topics", "Topics held.", value=feed.topic_count())
        posted = CounterMetricFamily(
            "longpoll_messages", "Messages posted.", value=feed.messages_posted
        )
        families: list[Metric] = [parked, answers, gone, topics, posted]
        if self._incomplete is not None:
            incomplete = CounterMetricFamily(
                "longpoll_incomplete_bodies",
                "POST bodies that never arrived whole: the client hung up (disconnect) "
                "or missed the body deadline (timeout, answered 408).",
                labels=["reason"],
            )
            for reason, count in self._incomplete.items():
                incomplete.add_metric([reason], count)
            families.append(incomplete)
        if self._refused_heads is not None:
            heads = CounterMetricFamily(
                "longpoll_refused_heads",
                "Connections closed before a request's head (request line and headers) was "
                "whole: nothing arrived in time (idle), part did (timeout, 408), or it was "
                "too large (too_large, 431).",
                labels=["reason"],
            )
            for reason, count in self._refused_heads.items():
                heads.add_metric([reason], count)
            families.append(heads)
        families += feed.metric_families()
        return families


async def _read_body(request: Request, limit: int, seconds: float) -> bytes:
    """The request body, refused with a 413 as soon as it is over ``limit`` bytes, or
    with a 408 unless it is whole within ``seconds``.

    Raises:
        FeedError: 413 or 408.
        starlette.requests.ClientDisconnect: the client hung up first.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise FeedError(413, f"the body is over {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    # One deadline for the whole body, not one per read: a client trickling a
    # byte a second would otherwise hold the connection as long as it likes.
    try:
        async with asyncio.timeout(seconds):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise FeedError(413, f"the body is over {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise FeedError(408, f"the body did not arrive within {seconds:g} seconds") from None
    return b"".join(chunks)


def create_app(settings: Settings | None = None, waiter: Waiter | None = None) -> Starlette:
    """The long-poll application.

    Args:
        settings: the feed's limits (default: :class:`Settings`'s).
        waiter: how GETs wait (default: a :class:`PurgatoryWaiter`). The
            application enters it (``async with``) for its lifespan.

    The feed is ``app.state.feed``; ``app.state.registry`` the Prometheus registry;
    ``app.state.loop_lag`` the event loop's measured lag (:class:`LoopLag`, in
    ``/healthz`` and ``/metrics``); ``app.state.accept_queue`` the listening
    socket's accept queue (:class:`AcceptQueue`: set its ``sock`` before serving);
    ``app.state.incomplete_bodies`` counts POST bodies that never arrived whole, by
    reason (:data:`INCOMPLETE_BODY_REASONS`); ``app.state.refused_heads`` is for the
    server's protocol to count heads it refused
    (:func:`examples.longpoll.protocol.bounded_protocol`).
    """
    settings = Settings() if settings is None else settings
    waiter = PurgatoryWaiter() if waiter is None else waiter
    # A waiter that keeps the feed elsewhere (RedisWaiter: in Redis) makes its own.
    make_feed = getattr(waiter, "make_feed", None)
    feed: Feed = Feed(settings, waiter) if make_feed is None else make_feed(settings)
    incomplete_bodies = dict.fromkeys(INCOMPLETE_BODY_REASONS, 0)
    refused_heads = dict.fromkeys(REFUSED_HEAD_REASONS, 0)
    registry = CollectorRegistry()
    registry.register(FeedCollector(feed, incomplete_bodies, refused_heads))
    # Probes later than 0.05 s logged: the soak reads them beside the late answers.
    loop_lag = LoopLag(log_over=0.05)
    registry.register(LoopLagCollector(loop_lag))
    # The server sets its listening socket (app.state.accept_queue.sock) before the
    # lifespan starts; without one (a test's client) nothing is sampled.
    queue = AcceptQueue(None)
    registry.register(AcceptQueueCollector(queue))
    if isinstance(waiter, PurgatoryWaiter):
        PurgatoryCollector([waiter.purgatory], registry=registry)
    # A waiter's own (RedisWaiter: its RedisTriggers' statistics).
    for collector in getattr(waiter, "collectors", list)():
        registry.register(collector)
    page = _PAGE.read_text(encoding="utf-8")

    async def post(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            keys = request.headers.getlist("idempotency-key")
            if len(keys) > 1:
                raise FeedError(400, "Idempotency-Key given twice")
            key = check_idempotency_key(keys[0]) if keys else None
            body = await _read_body(request, settings.max_body_bytes, settings.body_timeout)
            appended = await feed.append(name, body, idempotency_key=key)
        except ClientDisconnect:
            incomplete_bodies["disconnect"] += 1
            return Response(status_code=499)  # the client is gone: nobody reads this
        except FeedError as exc:
            if exc.status == 408:
                incomplete_bodies["timeout"] += 1
            # The rest of a refused body is not read: close rather than parse it
            # as the next request.
            return error(exc.status, exc.message, close=exc.status in (408, 413))
        # The header Stripe's API answers a replay with: the POST was stored before.
        headers = {"idempotent-replayed": "true"} if appended.replayed else None
        return JSONResponse({"offset": appended.offset}, headers=headers)

    async def fetch(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            offset, wait, min_bytes = parse_fetch(request.query_params.multi_items(), settings)
            # A client that goes away cancels this (CancelOnDisconnect).
            fetched = await feed.fetch(name, offset, wait, min_bytes)
        except FeedError as exc:
            return error(exc.status, exc.message)
        assert fetched is not None  # None only with a park= callable, not given here
        return JSONResponse(fetched.as_dict())

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def healthz(request: Request) -> Response:
        status, body = feed.health()
        extra = {} if queue.sock is None else {"accept_queue": queue.sample()}
        return JSONResponse({**body, **loop_lag.as_dict(), **extra}, status_code=status)

    async def index(request: Request) -> Response:
        return HTMLResponse(page)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error(exc.status_code, str(exc.detail).lower())

    async def server_error(request: Request, exc: Exception) -> Response:
        return error(500, f"internal error: {type(exc).__name__}")

    log = structlog.get_logger("examples.longpoll")

    def on_signal(sig: signal.Signals) -> None:
        released = feed.shutdown()
        log.info("longpoll.stopping", signal=sig.name, released=released)

    # The purgatory waiter's (and the Redis one's) purgatory, closed on the signal
    # too; the asyncio waiter has none, the feed's shutdown releases its waits.
    purgatories = [waiter.purgatory] if isinstance(waiter, PurgatoryWaiter) else []

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with loop_lag, queue, waiter, release_on_shutdown(*purgatories, on_signal=on_signal):
            yield
            feed.shutdown()

    app = Starlette(
        routes=[
            Route("/", index, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/topics/{name}", fetch, methods=["GET"]),
            Route("/topics/{name}", post, methods=["POST"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        middleware=[Middleware(CancelOnDisconnect)],
        lifespan=lifespan,
    )
    app.state.feed = feed
    app.state.registry = registry
    app.state.loop_lag = loop_lag
    app.state.accept_queue = queue
    app.state.incomplete_bodies = incomplete_bodies
    app.state.refused_heads = refused_heads
    return app
