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
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import random
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
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
    Errors,
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

SCENARIOS = ("healthy", "slow-follower", "follower-crash", "two-down", "timeouts")

LEADER_ID = 0


# -- configuration ---------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Everything a run depends on. Durations are seconds (Kafka's ``*.ms`` scaled down).

    Kafka's defaults are tens of seconds (``replica.lag.time.max.ms`` 30000,
    ``request.timeout.ms`` 30000); the example keeps their proportions but scales
    them so that a run shows several ISR shrinks and expansions in ten simulated
    seconds.

    Raises:
        ValueError: a field is out of range (the message names it).
    """

    #: One of :data:`SCENARIOS`.
    scenario: str = "healthy"
    #: Partitions of the topic, all led by broker 0.
    partitions: int = 6
    #: Replicas per partition: the leader and ``replication_factor - 1`` followers.
    replication_factor: int = 3
    #: ``min.insync.replicas``: an acks=all append needs at least this many in the ISR.
    min_insync_replicas: int = 2
    #: Seconds during which producers send (then in-flight requests are drained).
    duration: float = 10.0
    #: Produce requests per second, all producers together (Poisson arrivals).
    rate: float = 400.0
    #: Producer tasks.
    producers: int = 4
    #: A request carries a batch for 1..this many distinct partitions.
    max_partitions_per_request: int = 3
    #: Records per batch (offsets are record counts).
    batch_records: int = 16
    #: The produce request's ``timeout`` (seconds the leader may hold it);
    #: None: 3 s, or 20 ms for the ``timeouts`` scenario.
    ack_timeout: float | None = None
    #: ``replica.lag.time.max``: seconds a follower may stay behind before leaving the ISR.
    replica_lag_time_max: float = 1.0
    #: ``replica.fetch.wait.max``: how long the leader holds an empty follower fetch.
    replica_fetch_wait_max: float = 0.5
    #: ``replica.fetch.max.bytes``, in records: the most one fetch returns per partition.
    replica_fetch_max_records: int = 2000
    #: Follower fetch round trip (request there, response back), seconds.
    fetch_latency: LogNormal = field(default_factory=lambda: LogNormal(0.004, 0.025))
    #: The slow follower's round trips (``slow-follower``): mostly quick, with a
    #: heavy tail of stalls longer than ``replica_lag_time_max``.
    slow_latency: LogNormal = field(default_factory=lambda: LogNormal(0.02, 2.0))
    #: Random seed: same seed and config, same result (on virtual time).
    seed: int = 1
    #: Topic name (watch keys are ``TopicPartition(topic, n)``).
    topic: str = "orders"

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(
                f"scenario must be one of {', '.join(SCENARIOS)}; got {self.scenario!r}"
            )
        for name in (
            "partitions",
            "replication_factor",
            "min_insync_replicas",
            "producers",
            "max_partitions_per_request",
            "batch_records",
            "replica_fetch_max_records",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("duration", "rate", "replica_lag_time_max", "replica_fetch_wait_max"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value < float("inf")):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if self.ack_timeout is not None and not (0 <= self.ack_timeout < float("inf")):
            raise ValueError(f"ack_timeout must be a finite number >= 0, got {self.ack_timeout!r}")
        for name in ("fetch_latency", "slow_latency"):
            if not isinstance(getattr(self, name), LogNormal):
                raise ValueError(f"{name} must be a LogNormal, got {getattr(self, name)!r}")

    @property
    def request_timeout(self) -> float:
        """The effective produce request timeout, seconds."""
        if self.ack_timeout is not None:
            return self.ack_timeout
        # Near the healthy produce latency (about 5 ms median, 25 ms p99), so some expire.
        return 0.02 if self.scenario == "timeouts" else 3.0

    @property
    def topic_partitions(self) -> list[TopicPartition]:
        """Every partition of the topic, in order."""
        return [TopicPartition(self.topic, n) for n in range(self.partitions)]


@dataclass(frozen=True)
class FollowerPlan:
    """What the scenario does to one follower broker (times in seconds from the start)."""

    broker_id: int
    latency: LogNormal
    crash_at: float | None = None
    restart_at: float | None = None


def follower_plans(config: Config) -> list[FollowerPlan]:
    """The follower brokers of ``config`` and what its scenario does to them."""
    brokers = list(range(1, config.replication_factor))
    plans = {b: FollowerPlan(b, config.fetch_latency) for b in brokers}
    last = brokers[-1:]
    if config.scenario == "slow-follower":
        for b in last:
            plans[b] = replace(plans[b], latency=config.slow_latency)
    elif config.scenario == "follower-crash":
        for b in last:
            plans[b] = replace(
                plans[b], crash_at=0.2 * config.duration, restart_at=0.6 * config.duration
            )
    elif config.scenario == "two-down":
        # The last two followers (every follower if there are fewer) are down from the start.
        for b in brokers[-2:]:
            plans[b] = replace(plans[b], crash_at=0.0)
    return [plans[b] for b in brokers]


# -- the leader's view of a partition ------------------------------------------------------


class _FollowerState:
    """What the leader knows about one follower of one partition (Kafka's ``Replica``)."""

    __slots__ = (
        "broker_id",
        "last_caught_up_time",
        "last_fetch_leader_leo",
        "last_fetch_time",
        "log_end_offset",
    )

    def __init__(self, broker_id: int, now: float) -> None:
        self.broker_id = broker_id
        self.log_end_offset = 0
        # Every replica starts in sync: an empty log is caught up.
        self.last_caught_up_time = now
        self.last_fetch_leader_leo = 0
        self.last_fetch_time = now


@dataclass(frozen=True)
class IsrChange:
    """One ISR shrink or expansion of one partition (time: seconds from the start)."""

    time: float
    partition: str
    kind: str  # "shrink" or "expand"
    before: tuple[int, ...]
    after: tuple[int, ...]


class Partition:
    """The leader's replica of one partition: log end offset, ISR, high watermark.

    Offsets count records. The high watermark is the minimum log end offset over
    the ISR (the leader included) and never moves back.
    """

    def __init__(
        self, tp: TopicPartition, replicas: Sequence[int], min_insync_replicas: int, now: float
    ) -> None:
        self.tp = tp
        self.min_insync_replicas = min_insync_replicas
        self.log_end_offset = 0
        self.high_watermark = 0
        self.isr: set[int] = set(replicas)
        self.followers = {b: _FollowerState(b, now) for b in replicas if b != LEADER_ID}

    def append(self, records: int) -> int:
        """Append a batch to the leader's log; return the offset acks must reach (its end)."""
        self.log_end_offset += records
        # With the leader alone in the ISR the high watermark follows the log at once.
        self.maybe_increment_high_watermark()
        return self.log_end_offset

    def maybe_increment_high_watermark(self) -> bool:
        """Move the high watermark to the minimum log end offset over the ISR; True if it moved."""
        low = min(
            self.log_end_offset if b == LEADER_ID else self.followers[b].log_end_offset
            for b in self.isr
        )
        if low > self.high_watermark:
            self.high_watermark = low
            return True
        return False

    def update_follower_fetch_state(
        self, broker_id: int, fetch_offset: int, now: float
    ) -> tuple[bool, bool]:
        """Record a follower fetch at ``fetch_offset`` (its log end offset).

        A follower is *caught up* as of this fetch if it asks for the leader's log
        end offset, or as of its previous fetch if it asks for at least what the
        leader's log end offset was then (Kafka's ``lastCaughtUpTime`` rule, so a
        follower of a busy partition, never exactly at the end, still counts).

        Returns:
            (the high watermark moved, the follower rejoined the ISR).
        """
        state = self.followers[broker_id]
        if fetch_offset >= self.log_end_offset:
            state.last_caught_up_time = max(state.last_caught_up_time, now)
        elif fetch_offset >= state.last_fetch_leader_leo:
            state.last_caught_up_time = max(state.last_caught_up_time, state.last_fetch_time)
        state.log_end_offset = fetch_offset
        state.last_fetch_leader_leo = self.log_end_offset
        state.last_fetch_time = now
        expanded = broker_id not in self.isr and fetch_offset >= self.high_watermark
        if expanded:
            self.isr.add(broker_id)
        return self.maybe_increment_high_watermark(), expanded

    def out_of_sync_followers(self, now: float, lag_time_max: float) -> list[int]:
        """ISR followers behind the leader's log end for longer than ``lag_time_max``."""
        return [
            b
            for b in sorted(self.isr)
            if b != LEADER_ID
            and self.followers[b].log_end_offset != self.log_end_offset
            and now - self.followers[b].last_caught_up_time > lag_time_max
        ]

    def check_enough_replicas_reach_offset(self, required_offset: int) -> tuple[bool, Errors]:
        """Kafka's ``checkEnoughReplicasReachOffset``: is the batch committed, and how?

        Returns:
            ``(True, NONE)`` once the high watermark reaches ``required_offset`` with
            enough replicas in sync; ``(True, NOT_ENOUGH_REPLICAS_AFTER_APPEND)`` if
            it got there only because the ISR shrank below ``min.insync.replicas``;
            ``(False, NONE)`` while it has not.
        """
        if self.high_watermark >= required_offset:
            if len(self.isr) >= self.min_insync_replicas:
                return True, Errors.NONE
            return True, Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return False, Errors.NONE


# -- delayed operations --------------------------------------------------------------------


class _PartitionStatus:
    """One partition of a produce request (Kafka's ``ProducePartitionStatus``)."""

    __slots__ = ("acks_pending", "error", "required_offset")

    def __init__(self, required_offset: int, error: Errors) -> None:
        self.required_offset = required_offset
        # As in Kafka: a partition that appended starts as REQUEST_TIMED_OUT, the
        # answer it gets if nothing clears it before expiry.
        self.acks_pending = error is Errors.NONE
        self.error = Errors.REQUEST_TIMED_OUT if self.acks_pending else error


class DelayedProduce(ap.DelayedOperation):
    """An acks=all produce request waiting until every partition's batch is committed.

    Args:
        op_id: the request id (it names the op in the event log).
        timeout: the request's timeout, seconds.
        statuses: per partition, the append result.
        partitions: the leader's partitions, to check their high watermarks.
    """

    def __init__(
        self,
        op_id: int,
        timeout: float,
        statuses: dict[TopicPartition, _PartitionStatus],
        partitions: dict[TopicPartition, Partition],
    ) -> None:
        super().__init__(timeout)
        self.op_id = op_id
        self.statuses = statuses
        self._partitions = partitions
        #: The per-partition answer, set exactly once by :meth:`on_complete`.
        self.response: dict[TopicPartition, Errors] | None = None
        #: How many times this request was answered (exactly once, or a bug).
        self.answers = 0

    def try_complete(self) -> bool:
        """Complete once no partition still waits for acks (Kafka's ``tryComplete``)."""
        pending = False
        for tp, status in self.statuses.items():
            if status.acks_pending:
                has_enough, error = self._partitions[tp].check_enough_replicas_reach_offset(
                    status.required_offset
                )
                if has_enough or error is not Errors.NONE:
                    status.acks_pending = False
                    status.error = error
                else:
                    pending = True
        return False if pending else self.force_complete()

    def on_complete(self) -> None:
        """Answer the producer with each partition's error (REQUEST_TIMED_OUT if expired)."""
        self.answers += 1
        self.response = {tp: status.error for tp, status in self.statuses.items()}

    @property
    def error(self) -> str | None:
        """The answer's error code(s) for the op event log (its ``error`` field):
        None once every partition got ``NONE``, else the other codes joined by ``+``."""
        if self.response is None:
            return None
        return "+".join(sorted({e.name for e in self.response.values()} - {"NONE"})) or None


class FollowerFetch(ap.DelayedOperation):
    """A follower's fetch held by the leader until one of its partitions has new records.

    ``fetch.min.bytes`` is 1 for replica fetchers: any new record completes it;
    otherwise it expires after ``replica.fetch.wait.max`` and answers empty.
    """

    def __init__(
        self,
        timeout: float,
        offsets: dict[TopicPartition, int],
        partitions: dict[TopicPartition, Partition],
    ) -> None:
        super().__init__(timeout)
        self.offsets = offsets
        self._partitions = partitions

    def try_complete(self) -> bool:
        """Complete if the leader's log has grown past a requested offset."""
        partitions = self._partitions
        for tp, offset in self.offsets.items():
            if partitions[tp].log_end_offset > offset:
                return self.force_complete()
        return False


# -- the leader broker ---------------------------------------------------------------------


@dataclass(frozen=True)
class ProduceResponse:
    """What a producer gets back for one request."""

    request_id: int
    outcome: ap.Outcome
    errors: dict[TopicPartition, Errors]
    latency: float

    @property
    def error_label(self) -> str:
        """The error code, or several joined by ``+`` when partitions differ."""
        names = sorted({e.name for e in self.errors.values()})
        return "+".join(names)


class Leader:
    """Broker 0: leads every partition, holds the produce and follower-fetch purgatories."""

    def __init__(self, config: Config, timer: ap.Timer, now: float) -> None:
        self.config = config
        self.timer = timer
        # Loop time of the run's start: ISR change times are reported relative to it.
        self.origin = now
        replicas = list(range(config.replication_factor))
        self.partitions = {
            tp: Partition(tp, replicas, config.min_insync_replicas, now)
            for tp in config.topic_partitions
        }
        self.produce_purgatory: ap.Purgatory[DelayedProduce] = ap.Purgatory("produce", timer=timer)
        self.fetch_purgatory: ap.Purgatory[FollowerFetch] = ap.Purgatory("fetch", timer=timer)
        self.isr_changes: list[IsrChange] = []
        self.ops: list[DelayedProduce] = []

    async def produce(
        self, request_id: int, batches: Sequence[tuple[TopicPartition, int]]
    ) -> ProduceResponse:
        """Handle an acks=all produce request; return when it is answered."""
        started = anyio.current_time()
        statuses: dict[TopicPartition, _PartitionStatus] = {}
        for tp, records in batches:
            partition = self.partitions[tp]
            if len(partition.isr) < partition.min_insync_replicas:
                # Kafka refuses the append itself when the ISR is already too small.
                statuses[tp] = _PartitionStatus(-1, Errors.NOT_ENOUGH_REPLICAS)
                continue
            statuses[tp] = _PartitionStatus(partition.append(records), Errors.NONE)
            # New records: wake the followers' long-polling fetches this reaches.
            self.fetch_purgatory.advance(tp, partition.log_end_offset)
        op = DelayedProduce(request_id, self.config.request_timeout, statuses, self.partitions)
        self.ops.append(op)
        # Watched with thresholds: each appended partition's high watermark must reach
        # the batch's end, so an advance of a partition's high watermark checks only
        # the requests it reached (see Purgatory.advance), not every request waiting
        # there. Requests refused everywhere complete inside watch() without waiting
        # (Kafka answers them without the purgatory); going through it keeps one
        # event per request.
        thresholds = {
            tp: status.required_offset for tp, status in statuses.items() if status.acks_pending
        }
        outcome = await self.produce_purgatory.watch(op, thresholds or list(statuses))
        assert op.response is not None
        return ProduceResponse(request_id, outcome, op.response, anyio.current_time() - started)

    async def fetch_from_follower(
        self, broker_id: int, offsets: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Handle a follower's fetch; return, per partition, the offset it may copy up to."""
        now = anyio.current_time()
        for tp, offset in offsets.items():
            partition = self.partitions[tp]
            before = tuple(sorted(partition.isr))
            moved, expanded = partition.update_follower_fetch_state(broker_id, offset, now)
            if expanded:
                self._isr_changed(now, partition, "expand", before)
            if moved:
                self.produce_purgatory.advance(tp, partition.high_watermark)
        op = FollowerFetch(self.config.replica_fetch_wait_max, offsets, self.partitions)
        # fetch.min.bytes is one record: done once a log end passes the fetch offset.
        await self.fetch_purgatory.watch(op, {tp: offset + 1 for tp, offset in offsets.items()})
        limit = self.config.replica_fetch_max_records
        return {
            tp: min(self.partitions[tp].log_end_offset, offset + limit)
            for tp, offset in offsets.items()
        }

    async def isr_expiration(self) -> None:
        """Shrink ISRs every ``replica.lag.time.max / 2``, as Kafka's isr-expiration task."""
        lag = self.config.replica_lag_time_max
        while True:
            await anyio.sleep(lag / 2)
            now = anyio.current_time()
            for partition in self.partitions.values():
                out = partition.out_of_sync_followers(now, lag)
                if not out:
                    continue
                before = tuple(sorted(partition.isr))
                partition.isr.difference_update(out)
                self._isr_changed(now, partition, "shrink", before)
                # A smaller ISR can raise the high watermark: waiting produces may complete
                # (with NOT_ENOUGH_REPLICAS_AFTER_APPEND if it fell below min.insync.replicas).
                if partition.maybe_increment_high_watermark():
                    self.produce_purgatory.advance(partition.tp, partition.high_watermark)

    def _isr_changed(
        self, now: float, partition: Partition, kind: str, before: tuple[int, ...]
    ) -> None:
        self.isr_changes.append(
            IsrChange(
                now - self.origin, str(partition.tp), kind, before, tuple(sorted(partition.isr))
            )
        )


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
