"""The Kafka model of :mod:`examples.acks_all`: configuration, a partition leader, its operations.

:class:`Config` (everything a run depends on) and the followers' plans; a
:class:`Partition` with its ISR and high watermark; the two delayed operations
(:class:`DelayedProduce`, parked until the high watermark reaches its batch,
and :class:`FollowerFetch`, a follower's long poll); and the :class:`Leader`
that appends, tracks its followers and shrinks or grows the ISR.
:mod:`examples.acks_all` runs them and re-exports the public names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import anyio
import anyio.abc

import aiopurgatory as ap
from examples._kafka import (
    Errors,
    LogNormal,
    TopicPartition,
)

__all__ = [
    "LEADER_ID",
    "SCENARIOS",
    "Config",
    "DelayedProduce",
    "FollowerFetch",
    "FollowerPlan",
    "IsrChange",
    "Leader",
    "Partition",
    "ProduceResponse",
    "follower_plans",
]


SCENARIOS = ("healthy", "slow-follower", "follower-crash", "two-down", "timeouts")


LEADER_ID = 0


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
