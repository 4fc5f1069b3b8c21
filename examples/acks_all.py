"""acks=all produce requests waiting in a purgatory for the in-sync replicas.

A simulated Kafka partition leader (broker 0) with ``--replication-factor``
replicas per partition and ``min.insync.replicas``. Every follower broker is a
task that fetches from the leader in a loop (log-normal round trips); the
leader tracks each follower's log end offset, shrinks the ISR when a follower
lags more than ``replica.lag.time.max`` and grows it back when the follower
catches up to the high watermark, which is the minimum log end offset over the
ISR. Producers send ``acks=all`` requests at ``--rate``: the leader appends each
batch, then parks a ``DelayedProduce`` in the produce purgatory, watched under its
topic-partitions with the batch's end offset as threshold (``advance`` of a
partition's high watermark checks only the requests it reached), until every
partition's high watermark reaches the batch
(``NONE``, or ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` if the ISR shrank below
``min.insync.replicas`` meanwhile) or the request timeout expires
(``REQUEST_TIMED_OUT``). A partition whose ISR is already too small refuses the
append (``NOT_ENOUGH_REPLICAS``). Follower fetches long-poll in a second
purgatory (``FollowerFetch``, watched with the fetch offset + 1 as threshold and
woken by ``advance`` of the log end offset at each append) that shares the timing
wheel.

Runs on virtual time (fast, deterministic for a ``--seed``) unless ``--real-time``,
on asyncio unless ``--loop`` says otherwise (uvloop, trio: the body is anyio code).
``python -m examples.acks_all --scenario follower-crash`` (or ``make demo``).

The model (configuration, partitions, the two operations, the leader) is
:mod:`examples.acks_all_model`; this module runs it (followers, producers, a
run's result, output, the command line) and re-exports the model's public names.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import random
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TextIO

import anyio
import anyio.abc

if __name__ == "__main__" and not __package__:
    # Run as a script (python examples/acks_all.py): make the examples package importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiopurgatory as ap
from aiopurgatory.events import EventRecorder
from examples._kafka import (
    LogNormal,
    TopicPartition,
    add_runtime_arguments,
    checked_config,
    non_negative_float,
    percentile,
    positive_float,
    positive_int,
    run_main,
    run_timed,
    running_clock,
)
from examples.acks_all_model import (
    SCENARIOS,
    Config,
    DelayedProduce,
    FollowerFetch,
    FollowerPlan,
    IsrChange,
    Leader,
    Partition,
    ProduceResponse,
    follower_plans,
)

__all__ = [
    "SCENARIOS",
    "AcksAllResult",
    "Config",
    "DelayedProduce",
    "FollowerFetch",
    "IsrChange",
    "Leader",
    "Partition",
    "main",
    "run",
    "simulate",
]


# -- followers and producers ---------------------------------------------------------------


async def _replicate(
    leader: Leader, plan: FollowerPlan, log: dict[TopicPartition, int], rng: random.Random
) -> None:
    """A follower's fetcher: fetch from the leader, copy what it returns, repeat."""
    while True:
        round_trip = plan.latency.sample(rng)
        await anyio.sleep(round_trip / 2)
        upto = await leader.fetch_from_follower(plan.broker_id, dict(log))
        await anyio.sleep(round_trip / 2)
        log.update(upto)


async def _follower(
    leader: Leader,
    plan: FollowerPlan,
    start: float,
    rng: random.Random,
    lifecycle: list[tuple[float, int, str]],
) -> None:
    """One follower broker over the run: replicate, crash and restart as planned."""
    # The follower's log survives a crash (it is on disk); it resumes from its end.
    log = dict.fromkeys(leader.partitions, 0)
    if plan.crash_at is None:
        await _replicate(leader, plan, log, rng)
        return
    with contextlib.suppress(TimeoutError):
        async with leader.timer.timeout_at(start + plan.crash_at):
            await _replicate(leader, plan, log, rng)
    lifecycle.append((anyio.current_time() - start, plan.broker_id, "crash"))
    if plan.restart_at is None:
        return
    await anyio.sleep(max(0.0, start + plan.restart_at - anyio.current_time()))
    lifecycle.append((anyio.current_time() - start, plan.broker_id, "restart"))
    await _replicate(leader, plan, log, rng)


# -- a run ---------------------------------------------------------------------------------


@dataclass
class AcksAllResult:
    """What a run produced (all times in seconds)."""

    config: Config
    #: Requests sent.
    requests: int
    #: Request id -> how many times it was answered (must be 1 for each).
    answers: dict[int, int]
    #: Request outcome (``completed`` / ``expired``) -> requests.
    outcomes: Counter[str]
    #: Error code -> partition responses.
    errors: Counter[str]
    #: (outcome, error code(s)) -> requests.
    by_outcome_error: Counter[tuple[str, str]]
    #: Produce latency per request, in request id order.
    latencies: list[float]
    #: Outcome per request, in request id order.
    request_outcomes: list[str]
    #: Error code(s) per request (:attr:`ProduceResponse.error_label`), in request id order.
    request_errors: list[str]
    isr_changes: list[IsrChange]
    #: (time, broker, "crash" | "restart").
    follower_events: list[tuple[float, int, str]]
    #: Produce purgatory statistics after the drain.
    statistics: ap.PurgatoryStatistics
    #: Follower-fetch purgatory statistics after the drain.
    fetch_statistics: ap.PurgatoryStatistics
    high_watermarks: dict[str, int]
    log_end_offsets: dict[str, int]
    #: Loop seconds from start to the end of the drain.
    elapsed: float
    #: Lines written to the event log (0 without one).
    events_written: int = 0

    def latency_percentiles(self, outcome: str | None = None) -> dict[str, float]:
        """p50/p90/p99/max of produce latency (seconds), of one outcome or of all."""
        values = sorted(
            lat
            for lat, out in zip(self.latencies, self.request_outcomes, strict=True)
            if outcome is None or out == outcome
        )
        return {
            "p50": percentile(values, 50),
            "p90": percentile(values, 90),
            "p99": percentile(values, 99),
            "max": values[-1] if values else float("nan"),
        }


async def simulate(config: Config, *, events: TextIO | None = None) -> AcksAllResult:
    """Run the scenario of ``config`` on the running loop and return what happened.

    Producers send for ``config.duration`` seconds; every request is then answered
    (at the latest when it expires), followers are stopped and the purgatories closed.

    Args:
        config: the run's parameters.
        events: a text file for the produce purgatory's op event log (schema 2),
            one JSON line per request.
    """
    now = running_clock()
    start = now()
    timer = ap.Timer()
    leader = Leader(config, timer, start)
    recorder: EventRecorder | None = None
    if events is not None:
        # Event timestamps follow the loop's clock, so virtual-time logs are reproducible.
        recorder = EventRecorder(events, clock=now)
        recorder.attach(leader.produce_purgatory)

    lifecycle: list[tuple[float, int, str]] = []
    request_ids = itertools.count()
    responses: list[ProduceResponse] = []
    tps = config.topic_partitions
    end = start + config.duration

    async def send(request_id: int, batches: list[tuple[TopicPartition, int]]) -> None:
        responses.append(await leader.produce(request_id, batches))

    async def producer(index: int, requests: anyio.abc.TaskGroup) -> None:
        rng = random.Random(f"{config.seed}-p{index}")
        per_producer = config.rate / config.producers
        while True:
            gap = rng.expovariate(per_producer)
            if now() + gap >= end:
                return
            await anyio.sleep(gap)
            width = rng.randint(1, min(config.max_partitions_per_request, len(tps)))
            batches = [(tp, config.batch_records) for tp in rng.sample(tps, width)]
            requests.start_soon(send, next(request_ids), batches)

    try:
        async with anyio.create_task_group() as background:
            for plan in follower_plans(config):
                rng = random.Random(f"{config.seed}-f{plan.broker_id}")
                background.start_soon(_follower, leader, plan, start, rng, lifecycle)
            background.start_soon(leader.isr_expiration)
            # A backstop only: every request is answered by its own timeout.
            with anyio.fail_after(config.duration + config.request_timeout + 60.0):
                # The requests' group outlives the producers': leaving it is the drain.
                async with (
                    anyio.create_task_group() as requests,
                    anyio.create_task_group() as producers,
                ):
                    for index in range(config.producers):
                        producers.start_soon(producer, index, requests)
            background.cancel_scope.cancel()
    finally:
        statistics = leader.produce_purgatory.statistics()
        fetch_statistics = leader.fetch_purgatory.statistics()
        leader.produce_purgatory.close()
        leader.fetch_purgatory.close()
        timer.close()
        if recorder is not None:
            recorder.close()

    responses.sort(key=lambda r: r.request_id)
    errors: Counter[str] = Counter()
    for response in responses:
        errors.update(e.name for e in response.errors.values())
    return AcksAllResult(
        config=config,
        requests=len(leader.ops),
        answers={op.op_id: op.answers for op in leader.ops},
        outcomes=Counter(r.outcome.value for r in responses),
        errors=errors,
        by_outcome_error=Counter((r.outcome.value, r.error_label) for r in responses),
        latencies=[r.latency for r in responses],
        request_outcomes=[r.outcome.value for r in responses],
        request_errors=[r.error_label for r in responses],
        isr_changes=leader.isr_changes,
        follower_events=lifecycle,
        statistics=statistics,
        fetch_statistics=fetch_statistics,
        high_watermarks={str(tp): p.high_watermark for tp, p in leader.partitions.items()},
        log_end_offsets={str(tp): p.log_end_offset for tp, p in leader.partitions.items()},
        elapsed=now() - start,
        events_written=recorder.events if recorder is not None else 0,
    )


def run(
    config: Config,
    *,
    events: str | Path | None = None,
    real_time: bool = False,
    loop: str = "asyncio",
) -> AcksAllResult:
    """Run a whole simulation of ``config`` and return its result: on virtual time
    unless ``real_time``, on ``loop``, seeded with ``config.seed``
    (:func:`examples._kafka.run_main`); the op event log to ``events`` (a path,
    overwritten) unless None."""
    if events is None:
        return run_main(lambda: simulate(config), real_time=real_time, loop=loop, seed=config.seed)
    with open(events, "w", encoding="utf-8") as file:
        return run_main(
            lambda: simulate(config, events=file), real_time=real_time, loop=loop, seed=config.seed
        )


# -- output -----------------------------------------------------------------------------------


def print_summary(result: AcksAllResult, wall: float, file: IO[str] | None = None) -> None:
    """Print the result as rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stdout, width=100)
    config = result.config
    console.print(
        f"[bold]acks=all[/bold] scenario [bold]{config.scenario}[/bold]: "
        f"{config.partitions} partitions x RF {config.replication_factor}, "
        f"min.insync.replicas {config.min_insync_replicas}, "
        f"{result.requests} requests in {config.duration:g} s at {config.rate:g}/s, "
        f"timeout {1000 * config.request_timeout:g} ms; "
        f"{result.elapsed:.2f} s simulated in {wall:.2f} s"
    )

    table = Table(title="Produce requests by outcome and error code")
    table.add_column("outcome")
    table.add_column("error code")
    table.add_column("requests", justify="right")
    table.add_column("share", justify="right")
    for (kind, error), count in sorted(result.by_outcome_error.items()):
        table.add_row(kind, error, str(count), f"{100 * count / max(1, result.requests):.1f}%")
    console.print(table)

    table = Table(title="Produce latency (ms)")
    for column in ("requests", "p50", "p90", "p99", "max"):
        table.add_column(column, justify="right")
    table.columns[0].justify = "left"
    for outcome in (None, "completed", "expired"):
        if outcome is not None and not result.outcomes.get(outcome):
            continue
        stats = result.latency_percentiles(outcome)
        table.add_row(
            outcome or "all",
            *(f"{1000 * stats[k]:.1f}" for k in ("p50", "p90", "p99", "max")),
        )
    console.print(table)

    shrinks = sum(1 for c in result.isr_changes if c.kind == "shrink")
    expands = len(result.isr_changes) - shrinks
    table = Table(title=f"ISR changes: {shrinks} shrinks, {expands} expansions")
    for column in ("time (s)", "partition", "change", "ISR"):
        table.add_column(column)
    shown = result.isr_changes[:8]
    for change in shown:
        table.add_row(
            f"{change.time:.3f}",
            change.partition,
            change.kind,
            f"{list(change.before)} -> {list(change.after)}",
        )
    if len(result.isr_changes) > len(shown):
        table.add_row("...", f"{len(result.isr_changes) - len(shown)} more", "", "")
    if result.isr_changes:
        console.print(table)
    else:
        console.print("ISR changes: none")
    for when, broker, what in result.follower_events:
        console.print(f"  broker {broker} {what} at {when:.3f} s")

    table = Table(title="Purgatory statistics after the drain")
    columns = (
        "completed",
        "expired",
        "cancelled",
        "failed",
        "pending",
        "watched",
        "delayed",
        "advances",
    )
    table.add_column("purgatory")
    for column in columns:
        table.add_column(column, justify="right")
    for snapshot in (result.statistics, result.fetch_statistics):
        table.add_row(snapshot.name, *(str(getattr(snapshot, c)) for c in columns))
    console.print(table)


def write_plot(result: AcksAllResult, path: str | Path) -> None:
    """Write a histogram of produce latency by outcome to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    try:
        groups = [
            (
                outcome,
                [
                    1000 * lat
                    for lat, out in zip(result.latencies, result.request_outcomes, strict=True)
                    if out == outcome
                ],
            )
            for outcome in ("completed", "expired")
        ]
        groups = [(label, values) for label, values in groups if values]
        if groups:
            ax.hist(
                [values for _, values in groups],
                bins=60,
                stacked=True,
                label=[g[0] for g in groups],
            )
            ax.legend()
        ax.axvline(1000 * result.config.request_timeout, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("produce latency (ms); dashed: request timeout")
        ax.set_ylabel("requests (log scale)")
        ax.set_yscale("log")
        ax.set_title(f"acks=all produce latency, scenario {result.config.scenario}")
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)


# -- command line -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The example's argument parser."""
    defaults = Config()
    parser = argparse.ArgumentParser(
        prog="acks_all",
        description="Simulate acks=all produce requests waiting for the ISR in a purgatory.",
    )
    parser.add_argument("--scenario", choices=SCENARIOS, default=defaults.scenario)
    parser.add_argument(
        "--duration", type=positive_float, default=defaults.duration, help="seconds producers send"
    )
    parser.add_argument(
        "--rate", type=positive_float, default=defaults.rate, help="produce requests per second"
    )
    parser.add_argument("--producers", type=positive_int, default=defaults.producers)
    parser.add_argument("--partitions", type=positive_int, default=defaults.partitions)
    parser.add_argument(
        "--replication-factor", type=positive_int, default=defaults.replication_factor
    )
    parser.add_argument(
        "--min-insync-replicas", type=positive_int, default=defaults.min_insync_replicas
    )
    parser.add_argument(
        "--ack-timeout",
        type=non_negative_float,
        default=None,
        help="produce request timeout, seconds (default 3, or 0.02 for --scenario timeouts)",
    )
    parser.add_argument(
        "--replica-lag-time-max", type=positive_float, default=defaults.replica_lag_time_max
    )
    _add_latency_arguments(
        parser, "fetch", defaults.fetch_latency, "follower fetch round trip", median_note=""
    )
    _add_latency_arguments(
        parser,
        "slow",
        defaults.slow_latency,
        "slow follower's fetch round trip",
        median_note=" (--scenario slow-follower)",
    )
    parser.add_argument("--plot", metavar="FILE", help="write a latency histogram PNG")
    parser.add_argument("--events", metavar="FILE", help="write the op event log (JSON lines)")
    add_runtime_arguments(parser)
    return parser


def _add_latency_arguments(
    parser: argparse.ArgumentParser,
    name: str,
    default: LogNormal,
    what: str,
    *,
    median_note: str,
) -> None:
    # --NAME-p50 and --NAME-p99: the two percentiles that give a LogNormal.
    parser.add_argument(
        f"--{name}-p50",
        type=positive_float,
        default=default.p50,
        help=f"{what} median, seconds{median_note}",
    )
    parser.add_argument(
        f"--{name}-p99",
        type=positive_float,
        default=default.p99,
        help=f"{what} 99th percentile, seconds",
    )


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Config:
    """Build a :class:`Config` from parsed arguments; bad combinations are usage errors."""
    for name in ("fetch", "slow"):
        if getattr(args, f"{name}_p99") < getattr(args, f"{name}_p50"):
            parser.error(f"--{name}-p99 must be >= --{name}-p50")
    return checked_config(
        parser,
        args,
        lambda: Config(
            scenario=args.scenario,
            partitions=args.partitions,
            replication_factor=args.replication_factor,
            min_insync_replicas=args.min_insync_replicas,
            duration=args.duration,
            rate=args.rate,
            producers=args.producers,
            ack_timeout=args.ack_timeout,
            replica_lag_time_max=args.replica_lag_time_max,
            fetch_latency=LogNormal(args.fetch_p50, args.fetch_p99),
            slow_latency=LogNormal(args.slow_p50, args.slow_p99),
            seed=args.seed,
        ),
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    config = config_from_args(args, parser)
    result, wall = run_timed(args, functools.partial(run, config, events=args.events))
    print_summary(result, wall)
    if args.plot:
        write_plot(result, args.plot)
        print(f"latency histogram written to {args.plot}")
    if args.events:
        print(f"{result.events_written} op events written to {args.events}")
    # Every request must be answered exactly once; anything else is a bug worth a failure.
    return 0 if all(n == 1 for n in result.answers.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
