"""Command line: ``python -m examples.broker [--port 9092] [--topic NAME:PARTITIONS] ...``.

Runs the broker until SIGINT or SIGTERM, then shuts down gracefully (every parked
request is answered, every socket closed). Logs go to stderr through structlog,
as JSON lines (``--log-format json``) or for humans (``console``, the default on
a terminal).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import Any

import structlog

from .admin import start_admin_server
from .server import Broker, BrokerConfig


def _topic(text: str) -> tuple[str, int]:
    name, _, count = text.partition(":")
    try:
        return name, int(count) if count else 1
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME[:PARTITIONS], got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (defaults are :class:`BrokerConfig`'s)."""
    d = BrokerConfig()
    p = argparse.ArgumentParser(
        prog="python -m examples.broker",
        description="A small Kafka-protocol broker built on aiopurgatory.",
    )
    p.add_argument("--host", default=d.host, help="interface to listen on (%(default)s)")
    p.add_argument("--port", type=int, default=d.port, help="0 picks a free port (%(default)s)")
    p.add_argument(
        "--advertised-host",
        default=None,
        help="host name given to clients (default: --host; 127.0.0.1 when that is all interfaces)",
    )
    p.add_argument(
        "--followers",
        type=int,
        default=d.followers,
        help="in-process follower replicas; replication factor is this + 1 (%(default)s)",
    )
    p.add_argument(
        "--follower-lag",
        type=float,
        default=d.follower_lag,
        help="seconds a follower takes to replicate each fetch (%(default)s)",
    )
    p.add_argument(
        "--min-insync-replicas",
        type=int,
        default=d.min_insync_replicas,
        help="smallest ISR that accepts acks=all (%(default)s)",
    )
    p.add_argument(
        "--replica-lag-time-max",
        type=float,
        default=d.replica_lag_time_max,
        help="a follower not caught up for this many seconds leaves the ISR (%(default)s)",
    )
    p.add_argument(
        "--topic",
        type=_topic,
        action="append",
        default=[],
        metavar="NAME[:PARTITIONS]",
        help="a topic to create at start, repeatable; PARTITIONS 1 when left out (default: none)",
    )
    p.add_argument("--no-auto-create", action="store_true", help="do not auto-create topics")
    p.add_argument(
        "--default-partitions",
        type=int,
        default=d.default_partitions,
        help="partitions of an auto-created topic (%(default)s)",
    )
    p.add_argument(
        "--max-frame-bytes",
        type=int,
        default=d.max_frame_bytes,
        help="a larger request frame closes the connection (%(default)s)",
    )
    p.add_argument("--no-verify-crc", action="store_true", help="skip batch CRC checks")
    p.add_argument(
        "--stats-interval",
        type=float,
        default=d.stats_interval,
        help="seconds between purgatory statistics log lines; 0: none (%(default)s)",
    )
    p.add_argument(
        "--group-min-session-timeout",
        type=float,
        default=d.group_min_session_timeout,
        help="smallest consumer session timeout accepted, seconds (%(default)s)",
    )
    p.add_argument(
        "--group-initial-rebalance-delay",
        type=float,
        default=d.group_initial_rebalance_delay,
        help="an empty group waits this long for more members, seconds (%(default)s)",
    )
    p.add_argument(
        "--log-format",
        choices=["json", "console"],
        default=None,
        help="of the log lines on stderr (default: console on a terminal, else json)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="of the log lines on stderr (%(default)s)",
    )
    p.add_argument(
        "--admin-port",
        type=int,
        default=None,
        help="port for line-based admin commands, 0 picks a free one (default: none)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="port for Prometheus /metrics, 0 picks a free one (default: none)",
    )
    p.add_argument("--uvloop", action="store_true", help="run on uvloop")
    return p


def configure_logging(fmt: str | None, level: str) -> None:
    """Configure structlog for the broker process (stderr, JSON or console)."""
    if fmt is None:
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


class ListenError(Exception):
    """A port the broker cannot listen on (taken, or a host not of this machine)."""

    def __init__(self, what: str, host: str, port: int, exc: OSError) -> None:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        super().__init__(f"cannot listen on {host}:{port} ({what}): {reason}")


def _start_metrics(broker: Broker, host: str, port: int) -> Any:
    """Serve the purgatories' statistics for Prometheus; return the HTTP server."""
    from prometheus_client import CollectorRegistry, start_http_server

    from aiopurgatory.metrics.prometheus import PurgatoryCollector

    registry = CollectorRegistry()
    PurgatoryCollector(broker.purgatories, registry=registry)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server


async def run(
    config: BrokerConfig, *, admin_port: int | None = None, metrics_port: int | None = None
) -> None:
    """Run a broker until SIGINT/SIGTERM, then close it gracefully.

    Args:
        config: broker settings.
        admin_port: also listen for admin commands (see :mod:`examples.broker.admin`).
        metrics_port: also serve Prometheus metrics of the purgatories over HTTP.

    Raises:
        ListenError: a port cannot be listened on; nothing was started or logged.
    """
    broker = Broker(config)
    admin: asyncio.Server | None = None
    metrics: Any = None
    # Every port is bound before the broker starts, so that a port taken by
    # another process stops the program before anything runs or is logged.
    try:
        if admin_port is not None:
            try:
                admin = await start_admin_server(broker, config.host, admin_port)
            except OSError as exc:
                raise ListenError("admin", config.host, admin_port, exc) from None
        if metrics_port is not None:
            try:
                metrics = _start_metrics(broker, config.host, metrics_port)
            except OSError as exc:
                raise ListenError("metrics", config.host, metrics_port, exc) from None
        try:
            await broker.start()
        except OSError as exc:
            raise ListenError("Kafka", config.host, config.port, exc) from None
    except ListenError:
        if admin is not None:
            admin.close()
        if metrics is not None:
            await asyncio.to_thread(metrics.shutdown)
        raise
    if admin is not None:
        bound = admin.sockets[0].getsockname()[1]
        broker.log.info("broker.admin_listening", host=config.host, port=bound)
    if metrics is not None:
        broker.log.info("broker.metrics_listening", host=config.host, port=metrics.server_port)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        broker.log.info("broker.signal_received")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if admin is not None:
            admin.close()
        if metrics is not None:
            await asyncio.to_thread(metrics.shutdown)
        await broker.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code: 0, 2 for bad arguments, 1 when a
    port cannot be listened on (one line on stderr, no traceback)."""
    args = build_parser().parse_args(argv)
    try:
        config = BrokerConfig(
            host=args.host,
            port=args.port,
            advertised_host=args.advertised_host,
            followers=args.followers,
            follower_lag=args.follower_lag,
            min_insync_replicas=args.min_insync_replicas,
            replica_lag_time_max=args.replica_lag_time_max,
            topics=dict(args.topic),
            auto_create_topics=not args.no_auto_create,
            default_partitions=args.default_partitions,
            max_frame_bytes=args.max_frame_bytes,
            verify_crc=not args.no_verify_crc,
            stats_interval=args.stats_interval,
            group_min_session_timeout=args.group_min_session_timeout,
            group_initial_rebalance_delay=args.group_initial_rebalance_delay,
        )
    except (TypeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_format, args.log_level)
    coro = run(config, admin_port=args.admin_port, metrics_port=args.metrics_port)
    try:
        if args.uvloop:
            import uvloop

            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(coro)
        else:
            asyncio.run(coro)
    except ListenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
