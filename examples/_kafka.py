"""Shared pieces of the Kafka examples: error codes, topic-partitions, latency, loops.

Nothing here is part of aiopurgatory; it is the small amount of Kafka vocabulary
the examples have in common, plus the plumbing every example needs (a log-normal
latency model, percentiles, running on virtual or wall-clock time, argparse
checks, structlog set-up).
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import math
import random
import sys
import time
from collections.abc import Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

import structlog

from aiopurgatory import simulation

__all__ = [
    "Errors",
    "LogNormal",
    "Runner",
    "TopicPartition",
    "add_runtime_arguments",
    "cancel_and_wait",
    "checked_config",
    "configure_logging",
    "non_negative_float",
    "percentile",
    "positive_float",
    "positive_int",
    "run_main",
    "run_timed",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

# z-score of the 99th percentile of the standard normal distribution.
_Z99 = 2.3263478740408408


class Errors(enum.Enum):
    """The Kafka protocol error codes the examples answer with (name = Kafka's)."""

    NONE = 0
    REQUEST_TIMED_OUT = 7
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    UNKNOWN_MEMBER_ID = 25
    REBALANCE_IN_PROGRESS = 27


class TopicPartition(NamedTuple):
    """A topic-partition: the watch key of produce and fetch operations."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class LogNormal:
    """A log-normal latency distribution given by its median and 99th percentile (seconds).

    Args:
        p50: the median, seconds, > 0.
        p99: the 99th percentile, seconds, >= p50.

    Raises:
        ValueError: ``p50`` is not positive and finite, or ``p99 < p50``.
    """

    p50: float
    p99: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.p50) and self.p50 > 0):
            raise ValueError(f"p50 must be a positive number of seconds, got {self.p50!r}")
        if not (math.isfinite(self.p99) and self.p99 >= self.p50):
            raise ValueError(f"p99 must be finite and >= p50 ({self.p50}), got {self.p99!r}")

    @property
    def mu(self) -> float:
        """Mean of the underlying normal distribution."""
        return math.log(self.p50)

    @property
    def sigma(self) -> float:
        """Standard deviation of the underlying normal distribution."""
        return (math.log(self.p99) - self.mu) / _Z99

    def scaled(self, factor: float) -> LogNormal:
        """The same shape, every percentile multiplied by ``factor``."""
        return LogNormal(self.p50 * factor, self.p99 * factor)

    def sample(self, rng: random.Random) -> float:
        """One latency, seconds."""
        return rng.lognormvariate(self.mu, self.sigma)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of already sorted values.

    Returns NaN for an empty sequence.
    """
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


async def cancel_and_wait(tasks: Collection[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait until all have finished, ignoring their outcomes."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# -- command line --------------------------------------------------------------------


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every example shares: seed, clock, loop, verbosity."""
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument(
        "--real-time",
        action="store_true",
        help="run on the wall clock instead of virtual time (slower, not deterministic)",
    )
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="event loop for --real-time (default asyncio)",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show aiopurgatory's info logs on stderr"
    )


def checked_config(
    parser: argparse.ArgumentParser, args: argparse.Namespace, make: Callable[[], T]
) -> T:
    """``make()`` (an example's config) after checking the runtime options in ``args``.

    A bad ``--loop`` combination or a ValueError from ``make`` exits with a usage error.
    """
    if args.loop != "asyncio" and not args.real_time:
        parser.error("--loop applies to --real-time only (virtual time has its own loop)")
    try:
        return make()
    except ValueError as exc:
        parser.error(str(exc))


class Runner(Protocol[T_co]):
    """An example's run, bound to its config: ``functools.partial(run, config)``."""

    def __call__(self, *, real_time: bool, loop: str) -> T_co: ...


def run_timed(args: argparse.Namespace, run: Runner[T]) -> tuple[T, float]:
    """Configure logging from ``args``, then run on the clock and loop it names.

    Returns:
        The run's result and the wall-clock seconds it took.
    """
    configure_logging(args.verbose)
    started = time.perf_counter()
    result = run(real_time=args.real_time, loop=args.loop)
    return result, time.perf_counter() - started


def configure_logging(verbose: bool) -> None:
    """Configure structlog for an example (an application may; the library never does).

    Logs go to stderr so that the summary on stdout stays clean; warnings and errors
    only unless ``verbose``.
    """
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(20 if verbose else 30),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


def run_main(
    main: Callable[[], Coroutine[Any, Any, T]], *, real_time: bool, loop: str = "asyncio"
) -> T:
    """Run ``main()`` on virtual time (default) or on the wall clock with ``loop``.

    Raises:
        ValueError: ``loop`` is neither ``"asyncio"`` nor ``"uvloop"``.
    """
    if loop not in ("asyncio", "uvloop"):
        raise ValueError(f"loop must be 'asyncio' or 'uvloop', got {loop!r}")
    if not real_time:
        if loop != "asyncio":
            raise ValueError("loop applies to real time only: virtual time has its own loop")
        return simulation.run(main())
    factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    if loop == "uvloop":
        import uvloop  # lazily: an optional extra

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())
