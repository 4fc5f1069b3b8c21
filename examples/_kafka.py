"""Shared pieces of the Kafka examples: error codes, topic-partitions, latency, loops.

Nothing here is part of aiopurgatory; it is the small amount of Kafka vocabulary
the examples have in common, plus the plumbing every example needs (a log-normal
latency model, percentiles, running on virtual or wall-clock time with asyncio,
uvloop or trio, argparse checks, structlog set-up).

The examples' bodies are written with anyio (task groups, ``anyio.sleep``,
``anyio.Event``), so the same code runs on every loop :func:`run_main` offers.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import math
import random
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

import structlog

from aiopurgatory import simulation

__all__ = [
    "LOOPS",
    "VIRTUAL_LOOPS",
    "Errors",
    "LogNormal",
    "Runner",
    "TopicPartition",
    "add_runtime_arguments",
    "checked_config",
    "configure_logging",
    "non_negative_float",
    "percentile",
    "positive_float",
    "positive_int",
    "run_main",
    "run_timed",
    "running_clock",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

#: What ``--loop`` takes: the example bodies are anyio code and run on each.
LOOPS = ("asyncio", "uvloop", "trio")
#: The loops with a virtual clock: asyncio's ``VirtualTimeLoop`` and trio's ``MockClock``.
VIRTUAL_LOOPS = ("asyncio", "trio")

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


def running_clock() -> Callable[[], float]:
    """The running loop's clock (seconds), as a function to keep and call anywhere in the run.

    ``loop.time`` on asyncio and uvloop, ``trio.current_time`` on trio. Unlike
    ``anyio.current_time()``, the function also works where no task runs, such as
    in a ``DelayedOperation``'s ``on_complete`` called by the timer on expiry
    (anyio finds its backend through the current task, and an asyncio callback has
    none).

    Raises:
        RuntimeError: neither an asyncio loop nor a trio run is active.
    """
    try:
        return asyncio.get_running_loop().time
    except RuntimeError:
        pass
    import trio  # lazily: only trio programs pay for the import

    if not trio.lowlevel.in_trio_run():
        raise RuntimeError("no running event loop (asyncio, uvloop or trio)")
    return trio.current_time


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
    parser.add_argument(
        "--seed",
        type=int,
        default=1,
        help="random seed (default 1); on trio's virtual time it also seeds trio's scheduler",
    )
    parser.add_argument(
        "--real-time",
        action="store_true",
        help="run on the wall clock instead of virtual time (slower, not deterministic)",
    )
    parser.add_argument(
        "--loop",
        choices=LOOPS,
        default="asyncio",
        help=(
            "event loop (default asyncio); virtual time runs on asyncio or on trio's mock "
            "clock, uvloop needs --real-time"
        ),
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
    if args.loop not in VIRTUAL_LOOPS and not args.real_time:
        parser.error(
            f"--loop {args.loop} needs --real-time "
            f"(virtual time runs on {' or '.join(VIRTUAL_LOOPS)})"
        )
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
    main: Callable[[], Coroutine[Any, Any, T]],
    *,
    real_time: bool,
    loop: str = "asyncio",
    seed: int = 0,
) -> T:
    """Run ``main()`` on ``loop``, on virtual time (default) or on the wall clock.

    Virtual time is :func:`aiopurgatory.simulation.run` on asyncio and
    :func:`aiopurgatory.simulation.run_trio` (trio's autojumping ``MockClock``) on
    trio; ``seed`` seeds trio's scheduler there, which otherwise shuffles the
    order of tasks woken at the same instant. uvloop runs on the wall clock only.

    Raises:
        ValueError: ``loop`` is not one of :data:`LOOPS`, or is ``"uvloop"``
            without ``real_time``.
    """
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {', '.join(LOOPS)}; got {loop!r}")
    if not real_time:
        if loop not in VIRTUAL_LOOPS:
            raise ValueError(
                f"{loop} runs on real time only: virtual time runs on {' or '.join(VIRTUAL_LOOPS)}"
            )
        if loop == "trio":
            return simulation.run_trio(main, seed=seed)
        return simulation.run(main())
    if loop == "trio":
        import trio  # lazily: an optional extra

        return trio.run(main)
    factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    if loop == "uvloop":
        import uvloop  # lazily: an optional extra

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())
