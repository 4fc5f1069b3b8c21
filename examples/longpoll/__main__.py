"""Command line: ``python -m examples.longpoll [--port 8080] [--waiter purgatory|asyncio]
[--redis URL | --postgres DSN [--workers N]] [--otel console|otlp]``.

Serves until SIGTERM or SIGINT, then stops accepting connections, answers every
parked GET with what its topic holds, lets the responses go out and exits 0.
Logs are JSON lines on stderr; the first one, ``longpoll.listening``, gives the
port (``--port 0`` picks a free one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from typing import Any

import structlog
import uvicorn

from .app import create_app
from .feed import Feed, Settings
from .protocol import bounded_protocol
from .waiters import WAITERS, PurgatoryWaiter, Waiter, make_waiter

__all__ = ["POSTGRES_ENV", "REDIS_ENV", "LongPollServer", "build_parser", "listen", "main", "serve"]

#: The environment variable read when ``--redis`` is not given (keeps a password out
#: of the process list; ``--workers`` passes the URL to its workers this way).
REDIS_ENV = "LONGPOLL_REDIS"

#: The same for ``--postgres`` (a DSN may hold a password too).
POSTGRES_ENV = "LONGPOLL_POSTGRES"

#: The server's cyclic garbage collector thresholds (``--gc-threshold``).
GC_THRESHOLD = (5_000, 10, 1_000)

LOOPS = ("auto", "asyncio", "uvloop")


class LongPollServer(uvicorn.Server):
    """uvicorn's server, with SIGTERM/SIGINT left to :func:`serve`.

    uvicorn's own handlers would re-raise the signal after shutting down, so the
    process would end by the signal, not with status 0. (Parked GETs are released
    by the application itself: ``release_on_shutdown`` in its lifespan.)
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (defaults are :class:`~examples.longpoll.feed.Settings`'s)."""
    d = Settings()
    p = argparse.ArgumentParser(
        prog="python -m examples.longpoll",
        description="An HTTP long-poll server whose waiting GETs are aiopurgatory operations.",
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (%(default)s)")
    p.add_argument("--port", type=int, default=8080, help="0 picks a free port (%(default)s)")
    p.add_argument(
        "--waiter",
        choices=sorted(WAITERS),
        default="purgatory",
        help="purgatory: a DelayedOperation per GET; asyncio: asyncio.wait_for on a future "
        "(%(default)s)",
    )
    p.add_argument(
        "--loop",
        choices=LOOPS,
        default="asyncio",
        help="event loop (%(default)s); auto: uvloop when installed. uvloop accepts one "
        "connection per loop iteration: a busy server's new connections wait "
        "(docs/longpoll.md)",
    )
    p.add_argument(
        "--default-wait",
        type=float,
        default=d.default_wait,
        help="seconds a GET without wait= waits (%(default)s)",
    )
    p.add_argument(
        "--max-wait", type=float, default=d.max_wait, help="largest wait=, seconds (%(default)s)"
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=d.max_body_bytes,
        help="largest POST body; larger: 413 (%(default)s)",
    )
    p.add_argument(
        "--max-response-bytes",
        type=int,
        default=d.max_response_bytes,
        help="messages per answer up to this many bytes, at least one (%(default)s)",
    )
    p.add_argument(
        "--retain", type=int, default=d.retain, help="messages kept per topic (%(default)s)"
    )
    p.add_argument(
        "--max-topics",
        type=int,
        default=d.max_topics,
        help="topics held; a POST creating one more: 409 (%(default)s)",
    )
    p.add_argument(
        "--max-parked",
        type=int,
        default=d.max_parked,
        help="GETs waiting at once; one more: 503 (%(default)s)",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=d.body_timeout,
        help="seconds for a POST body to arrive whole, else 408 (%(default)s)",
    )
    p.add_argument(
        "--idempotency-ttl",
        type=float,
        default=d.idempotency_ttl,
        help="seconds a POST's Idempotency-Key is remembered: a retry within it gets the "
        "first POST's offset, nothing stored twice (%(default)s)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds for a request's head (request line, headers) to arrive whole, "
        "else 408 or close (%(default)s)",
    )
    p.add_argument(
        "--max-header-bytes",
        type=int,
        default=16 * 1024,
        help="largest request head; larger: 431 (%(default)s)",
    )
    p.add_argument("--backlog", type=int, default=4096, help="listen backlog (%(default)s)")
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="of the JSON log lines on stderr (%(default)s)",
    )
    p.add_argument(
        "--redis",
        metavar="URL",
        default=None,
        help="keep the feed in Redis, shared with other processes: "
        "redis://[[user]:password@]host[:port][/db], "
        "redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db] or "
        "redis+cluster://[[user]:password@]host:port[,host:port...] (rediss for TLS); "
        "when not given, $LONGPOLL_REDIS, else the feed in this process's memory (%(default)s)",
    )
    p.add_argument(
        "--redis-replicas",
        type=int,
        default=None,
        metavar="N",
        help="a POST is acknowledged once N replicas have it (WAIT) "
        "(default: 0 on one server, 1 on redis+sentinel and redis+cluster)",
    )
    p.add_argument(
        "--redis-prefix",
        default="longpoll",
        help="prefix of the feed's Redis keys and trigger channel (%(default)s)",
    )
    p.add_argument(
        "--postgres",
        metavar="DSN",
        default=None,
        help="keep the feed in PostgreSQL tables, shared with other processes, each POST's "
        "wake-up committed with it: postgresql://[user[:password]@]host[:port]/database; "
        "when not given, $LONGPOLL_POSTGRES (%(default)s)",
    )
    p.add_argument(
        "--postgres-prefix",
        default="longpoll",
        help="prefix of the feed's PostgreSQL tables and trigger channel, "
        "[a-z_][a-z0-9_]* (%(default)s)",
    )
    p.add_argument(
        "--postgres-pool",
        type=int,
        default=10,
        metavar="N",
        help="connections of each process's pool for the feed (its triggers hold 3 more) "
        "(%(default)s)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes serving one port (SO_REUSEPORT), each with its own purgatory; "
        "more than 1 needs --redis or --postgres (%(default)s)",
    )
    p.add_argument(
        "--gc-threshold",
        type=_gc_threshold,
        default=",".join(map(str, GC_THRESHOLD)),
        metavar="G0,G1,G2",
        help="gc.set_threshold for the server, after gc.freeze() at start; "
        "'python' keeps Python's own (%(default)s)",
    )
    p.add_argument(
        "--otel",
        choices=("console", "otlp"),
        default=None,
        help="OpenTelemetry traces, a span per request and per parked GET's wait "
        "(linked to the POST that woke it): console writes them to stdout, one JSON "
        "line each; otlp sends them over OTLP/HTTP to OTEL_EXPORTER_OTLP_TRACES_ENDPOINT "
        "or OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318); needs "
        "opentelemetry-sdk, and for otlp opentelemetry-exporter-otlp-proto-http "
        "(default: off)",
    )
    # A worker of --workers N: bind with SO_REUSEPORT beside its siblings.
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    # A worker of --workers N: the supervisor's pid; the worker ends when it does.
    p.add_argument("--supervisor", type=int, default=None, help=argparse.SUPPRESS)
    return p


def _gc_threshold(text: str) -> tuple[int, int, int] | None:
    if text == "python":
        return None
    try:
        g0, g1, g2 = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"three integers G0,G1,G2 or 'python', got {text!r}"
        ) from None
    if min(g0, g1, g2) < 1:
        raise argparse.ArgumentTypeError(f"each threshold must be >= 1, got {text!r}")
    return g0, g1, g2


def _configure_logging(level: str) -> None:
    # The application configures structlog; the library never does.
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            stamp,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )
    # What logs through the standard library (uvicorn: a lifespan that failed, with
    # its traceback) as JSON lines too, warnings and errors only: without a handler,
    # Python would print them raw on stderr, lines no log reader can parse.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_log_level, stamp],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(logging.WARNING, logging.getLevelNamesMapping()[level.upper()]))


def loop_factory(choice: str) -> tuple[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The event loop for ``--loop``: its name and factory (``auto``: uvloop if importable).

    Raises:
        ImportError: ``uvloop`` asked for and not installed.
    """
    if choice in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise
        else:
            return "uvloop", uvloop.new_event_loop
    return "asyncio", asyncio.new_event_loop


def listen(host: str, port: int, backlog: int, *, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: a free port).

    Listening at once: connections queue until uvicorn serves them, so the port
    is usable as soon as it is logged. ``reuse_port``: ``SO_REUSEPORT``, so that
    the workers of ``--workers N`` listen on one port side by side.

    Raises:
        OSError: the port is taken, the host is not an address of this machine, ...
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve(
    args: argparse.Namespace,
    settings: Settings,
    loop_name: str,
    sock: socket.socket | None = None,
    redis_url: str | None = None,
    postgres_dsn: str | None = None,
) -> None:
    """Serve on ``sock`` (default: :func:`listen` on ``args.host`` and ``args.port``)
    until SIGTERM/SIGINT, then shut down gracefully; with ``redis_url``, the feed
    kept in Redis (:mod:`examples.longpoll.redisfeed`), with ``postgres_dsn`` in
    PostgreSQL (:mod:`examples.longpoll.pgfeed`)."""
    log = structlog.get_logger("examples.longpoll")
    waiter: Waiter
    if postgres_dsn is not None:
        from .pgfeed import PostgresWaiter

        waiter = PostgresWaiter(
            postgres_dsn, prefix=args.postgres_prefix, pool_size=args.postgres_pool
        )
    elif redis_url is None:
        waiter = make_waiter(args.waiter)
    else:
        from .redisfeed import RedisWaiter

        waiter = RedisWaiter(redis_url, prefix=args.redis_prefix, replicas=args.redis_replicas)
    app = create_app(settings, waiter)
    feed: Feed = app.state.feed
    served: Any = app
    provider: Any = None
    tracing: Any = None
    if args.otel is not None:
        from aiopurgatory.tracing import trace_waits

        from .tracing import TraceRequests, tracer_provider

        provider = tracer_provider(args.otel)
        served = TraceRequests(app, provider.get_tracer("examples.longpoll"))
        if isinstance(waiter, PurgatoryWaiter):  # the asyncio waiter has no purgatory
            tracing = trace_waits(waiter.purgatory, tracer_provider=provider)
    if sock is None:
        sock = listen(args.host, args.port, args.backlog, reuse_port=args.reuse_port)
    port = sock.getsockname()[1]
    app.state.accept_queue.sock = sock
    config = uvicorn.Config(
        served,
        http=bounded_protocol(args.header_timeout, args.max_header_bytes, app.state.refused_heads),
        log_config=None,
        access_log=False,
        lifespan="on",
        backlog=args.backlog,
        timeout_graceful_shutdown=10,
    )
    server = LongPollServer(config)
    log.info(
        "longpoll.listening",
        host=args.host,
        port=port,
        url=f"http://{args.host}:{port}/",
        waiter=waiter.name,
        loop=loop_name,
        http="httptools",
        **_redis_fields(redis_url, args),
        **_postgres_fields(postgres_dsn, args),
    )
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        # The server's own handling; the application's lifespan (release_on_shutdown)
        # has answered the parked GETs by the time uvicorn drains its connections.
        server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    if args.gc_threshold is not None:
        # What start-up made (modules, the app) is never garbage: out of every
        # collection. Then full collections far rarer than Python's (700, 10, 10):
        # with thousands of parked GETs alive, each walks their objects, and the
        # cyclic collector cost more CPU than the rest of the server (see
        # docs/distributed.md). Young collections stay frequent: the garbage a
        # collection frees is what it costs, and (50000, 50, 1000) stopped the loop
        # for 0.3 s per young collection and 1.7-2.1 s per middle one in the soak
        # (docs/longpoll.md, "Stalls with no fault").
        gc.freeze()
        gc.set_threshold(*args.gc_threshold)
    # SIGUSR1: every task's stack on stderr (what a server that does not stop waits for).
    loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
    try:
        await server.serve(sockets=[sock])
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if tracing is not None:
            tracing.close()
        if provider is not None:
            provider.shutdown()  # writes the spans the batch processor holds
    log.info(
        "longpoll.stopped",
        answers=feed.answers,
        disconnects=feed.disconnected,
        incomplete_bodies=app.state.incomplete_bodies,
        refused_heads=app.state.refused_heads,
        messages=feed.messages_posted,
    )


def _dump_tasks() -> None:
    for task in asyncio.all_tasks():
        print(f"--- {task!r}", file=sys.stderr)
        task.print_stack(limit=12, file=sys.stderr)
    sys.stderr.flush()


def _redis_fields(redis_url: str | None, args: argparse.Namespace) -> dict[str, object]:
    if redis_url is None:
        return {}
    from aiopurgatory.redis import describe_url

    return {"redis": describe_url(redis_url), "redis_prefix": args.redis_prefix, "pid": os.getpid()}


def _postgres_fields(dsn: str | None, args: argparse.Namespace) -> dict[str, object]:
    if dsn is None:
        return {}
    from .pgfeed import describe_dsn

    return {
        "postgres": describe_dsn(dsn),
        "postgres_prefix": args.postgres_prefix,
        "pid": os.getpid(),
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code.

    2 for bad arguments; 1 when the port cannot be listened on, or when Redis
    (``--redis``) or PostgreSQL (``--postgres``) is unreachable or refuses the
    credentials at start, with one line on stderr naming the cause.
    """
    args = build_parser().parse_args(argv)
    if args.supervisor is not None:
        from .workers import die_with_supervisor

        if not die_with_supervisor(args.supervisor):
            print("error: the supervisor is gone", file=sys.stderr)
            return 1
    redis_url = args.redis or os.environ.get(REDIS_ENV) or None
    postgres_dsn = args.postgres or os.environ.get(POSTGRES_ENV) or None
    try:
        if not 1 <= args.workers <= 64:
            raise ValueError(f"workers must be in [1, 64], got {args.workers}")
        if redis_url is not None and postgres_dsn is not None:
            raise ValueError("give --redis or --postgres, not both")
        if args.workers > 1 and redis_url is None and postgres_dsn is None:
            raise ValueError(
                "--workers N needs --redis URL or --postgres DSN: without a shared store "
                "each process has its own topics"
            )
        if (redis_url or postgres_dsn) is not None and args.waiter != "purgatory":
            raise ValueError(
                "--redis and --postgres serve with the purgatory waiter only (--waiter purgatory)"
            )
        if postgres_dsn is not None:
            from .pgsql import check_prefix

            check_prefix(args.postgres_prefix)
            if not 1 <= args.postgres_pool <= 1000:
                raise ValueError(f"--postgres-pool must be in [1, 1000], got {args.postgres_pool}")
        if args.redis_replicas is not None and (redis_url is None or args.redis_replicas < 0):
            raise ValueError("--redis-replicas takes a number of 0 or more, with --redis")
        settings = Settings(
            default_wait=args.default_wait,
            max_wait=args.max_wait,
            max_body_bytes=args.max_body_bytes,
            max_response_bytes=args.max_response_bytes,
            retain=args.retain,
            max_topics=args.max_topics,
            max_parked=args.max_parked,
            body_timeout=args.body_timeout,
            idempotency_ttl=args.idempotency_ttl,
        )
        if not 0 <= args.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {args.port}")
        bounded_protocol(args.header_timeout, args.max_header_bytes, {})  # checks them
        loop_name, factory = loop_factory(args.loop)
        if args.otel is not None:
            from .tracing import require

            require(args.otel)  # ImportError: the SDK or the exporter is missing
    except (TypeError, ValueError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if redis_url is not None:
        from .redisfeed import RedisUnavailable, check_redis

        try:
            check_redis(redis_url)
        except RedisUnavailable as exc:
            if args.supervisor is None:
                print(f"error: {exc}", file=sys.stderr)
            else:
                # A worker (re)started while Redis is away: its supervisor reads JSON
                # lines, and starts it again after a pause.
                from .workers import emit

                emit("longpoll.redis_unavailable", level="error", error=str(exc))
            return 1
    if postgres_dsn is not None:
        from .pgfeed import PostgresUnavailable, check_postgres

        try:
            check_postgres(postgres_dsn)
        except PostgresUnavailable as exc:
            if args.supervisor is None:
                print(f"error: {exc}", file=sys.stderr)
            else:
                from .workers import emit

                emit("longpoll.postgres_unavailable", level="error", error=str(exc))
            return 1
    if args.workers > 1:
        from .workers import supervise

        return supervise(args, redis_url, postgres_dsn)
    try:
        sock = listen(args.host, args.port, args.backlog, reuse_port=args.reuse_port)
    except OSError as exc:
        # A user's mistake (a busy port, a host not of this machine): one line.
        print(
            f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1
    _configure_logging(args.log_level)
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(args, settings, loop_name, sock, redis_url, postgres_dsn))
    return 0


if __name__ == "__main__":
    sys.exit(main())
