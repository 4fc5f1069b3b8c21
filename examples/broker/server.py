"""The broker: an asyncio TCP server speaking enough Kafka for aiokafka's producer and consumer.

Every wait is an aiopurgatory delayed operation, in three purgatories sharing one
timing wheel:

* ``produce``: ``acks=all`` produces (:class:`DelayedProduce`), keyed by
  topic-partition, completed when the high watermark reaches their batches.
* ``fetch``: consumer long-polls (:class:`DelayedFetch` below the HW), completed
  when the HW moves (or at ``max_wait_ms``).
* ``replica_fetch``: the in-process followers' fetches (below the leader's LEO),
  completed by appends. Kafka keeps these in its one fetch purgatory; a separate
  one here keeps the client-facing statistics clean (a quiet broker shows 0).
* ``rebalance`` and ``heartbeat``: consumer groups' join phases, sync deadlines
  and member sessions (see :mod:`examples.broker.coordinator`).

Connections: one reader task per client reads frames ahead into a small queue and
one processor handles them strictly in order (Kafka answers in request order per
connection; clients match responses by position). If the client goes away, the
reader cancels the processor, which cancels any operation it is parked on.
A frame that is too big, a truncated or malformed request, or an unknown API key
closes that connection with one log line; nothing else is affected.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import struct
import uuid
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any

import structlog

import aiopurgatory as ap

from .admin_messages import (
    ConfigEntry,
    ConfigResource,
    ConfigType,
    CreatableTopic,
    CreatableTopicResult,
    DescribeConfigsResult,
    ResourceType,
    decode_create_topics,
    decode_delete_groups,
    decode_delete_topics,
    decode_describe_configs,
    decode_describe_groups,
    decode_init_producer_id,
    decode_list_groups,
    encode_create_topics,
    encode_delete_groups,
    encode_delete_topics,
    encode_describe_configs,
    encode_describe_groups,
    encode_init_producer_id,
    encode_list_groups,
)
from .codec import DecodeError, Reader, Writer
from .coordinator import DelayedHeartbeat, GroupCoordinator
from .idempotence import BatchMetadata, ProducerIdManager
from .messages import (
    API_NAMES,
    SUPPORTED_VERSIONS,
    ApiKey,
    ErrorCode,
    FetchRequest,
    FetchResponsePartition,
    ListOffsetsPartitionResult,
    MetadataPartition,
    MetadataTopic,
    ProducePartitionResult,
    ProduceRequest,
    RequestHeader,
    check_fully_consumed,
    decode_api_versions,
    decode_fetch,
    decode_find_coordinator,
    decode_heartbeat,
    decode_join_group,
    decode_leave_group,
    decode_list_offsets,
    decode_metadata,
    decode_offset_commit,
    decode_offset_fetch,
    decode_produce,
    decode_request_header,
    decode_sync_group,
    encode_api_versions,
    encode_error_only,
    encode_fetch,
    encode_find_coordinator,
    encode_join_group,
    encode_list_offsets,
    encode_metadata,
    encode_offset_commit,
    encode_offset_fetch,
    encode_produce,
    encode_response_header,
    encode_sync_group,
)
from .operations import DelayedFetch, DelayedProduce, FetchTarget
from .partition import LEADER_ID, Partition, TopicPartition
from .records import BatchHeader, InvalidBatchError, parse_batches
from .replication import Follower

__all__ = ["Broker", "BrokerConfig"]

_SIZE = struct.Struct(">i")
_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_READ_AHEAD = 16  # frames read ahead per connection before TCP backpressure applies
_CLUSTER_ID = "aiopurgatory-broker"
_GROUP_APIS = frozenset(
    (
        ApiKey.FIND_COORDINATOR,
        ApiKey.JOIN_GROUP,
        ApiKey.SYNC_GROUP,
        ApiKey.HEARTBEAT,
        ApiKey.LEAVE_GROUP,
        ApiKey.OFFSET_COMMIT,
        ApiKey.OFFSET_FETCH,
    )
)
_ADMIN_APIS = frozenset(
    (
        ApiKey.CREATE_TOPICS,
        ApiKey.DELETE_TOPICS,
        ApiKey.DESCRIBE_GROUPS,
        ApiKey.LIST_GROUPS,
        ApiKey.DELETE_GROUPS,
        ApiKey.DESCRIBE_CONFIGS,
        ApiKey.INIT_PRODUCER_ID,
    )
)
#: Most partitions a CreateTopics may ask for (beyond, INVALID_PARTITIONS): every
#: partition costs memory and a slot in each follower's fetch.
MAX_PARTITIONS_PER_TOPIC = 10_000


@dataclass
class BrokerConfig:
    """Broker settings (durations in seconds, sizes in bytes).

    Attributes:
        host: interface to listen on.
        port: TCP port; 0 picks a free one (see :attr:`Broker.port`).
        advertised_host: host name put in Metadata; defaults to ``host``
            (``127.0.0.1`` when listening on all interfaces).
        followers: in-process follower replicas; replication factor is this + 1.
        follower_lag: seconds each follower waits before counting fetched
            batches as replicated.
        min_insync_replicas: smallest ISR that accepts ``acks=all``.
        replica_lag_time_max: a follower not caught up for this long leaves the ISR.
        replica_fetch_max_wait: how long a follower fetch waits for data.
        topics: topics to create at start, name -> number of partitions.
        auto_create_topics: create unknown topics named in Metadata requests.
        default_partitions: partitions of auto-created topics.
        max_frame_bytes: larger request frames close the connection.
        max_message_bytes: larger records fields get MESSAGE_TOO_LARGE.
        verify_crc: check the CRC-32C of produced batches (pure Python, costs CPU).
        stats_interval: seconds between purgatory statistics log lines; 0 = off.
        shutdown_grace: seconds :meth:`Broker.close` lets answered requests flush.
        group_min_session_timeout: smallest consumer session timeout accepted
            (Kafka's ``group.min.session.timeout.ms``).
        group_max_session_timeout: largest one (``group.max.session.timeout.ms``).
        group_initial_rebalance_delay: how long an empty group waits for more
            members before its first generation (``group.initial.rebalance.delay.ms``).
    """

    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str | None = None
    followers: int = 2
    follower_lag: float = 0.0
    min_insync_replicas: int = 2
    replica_lag_time_max: float = 30.0
    replica_fetch_max_wait: float = 0.5
    topics: dict[str, int] = field(default_factory=dict)
    auto_create_topics: bool = True
    default_partitions: int = 3
    max_frame_bytes: int = 100 * 1024 * 1024
    max_message_bytes: int = 1024 * 1024 + 12
    verify_crc: bool = True
    stats_interval: float = 10.0
    shutdown_grace: float = 2.0
    group_min_session_timeout: float = 6.0
    group_max_session_timeout: float = 1800.0
    group_initial_rebalance_delay: float = 3.0

    def __post_init__(self) -> None:
        ints = {
            "port": (0, 65535),
            "followers": (0, 16),
            "min_insync_replicas": (1, 17),
            "default_partitions": (1, 10_000),
            "max_frame_bytes": (64, 2**31 - 1),
            "max_message_bytes": (61, 2**31 - 1),
        }
        for name, (lo, hi) in ints.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if not lo <= value <= hi:
                raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
        for name in (
            "follower_lag",
            "replica_lag_time_max",
            "replica_fetch_max_wait",
            "stats_interval",
            "shutdown_grace",
            "group_min_session_timeout",
            "group_max_session_timeout",
            "group_initial_rebalance_delay",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
            if not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if self.replica_lag_time_max <= 0 or self.replica_fetch_max_wait <= 0:
            raise ValueError("replica_lag_time_max and replica_fetch_max_wait must be > 0")
        if self.group_min_session_timeout > self.group_max_session_timeout:
            raise ValueError(
                "group_min_session_timeout must not exceed group_max_session_timeout, got "
                f"{self.group_min_session_timeout} > {self.group_max_session_timeout}"
            )
        for name in ("host", "advertised_host"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        if not isinstance(self.topics, dict):
            raise TypeError(f"topics must be a dict, got {type(self.topics).__name__}")
        for topic, count in self.topics.items():
            if not isinstance(topic, str) or not _TOPIC_NAME.match(topic):
                raise ValueError(f"topics: invalid topic name {topic!r}")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"topics: {topic!r} needs a positive partition count")

    @classmethod
    def field_names(cls) -> list[str]:
        """The setting names, for command-line parsing."""
        return [f.name for f in fields(cls)]


# Settings a topic and the broker both report (Kafka names the broker's
# message limit message.max.bytes, the topic's max.message.bytes).


def _min_insync_replicas(cfg: BrokerConfig) -> ConfigEntry:
    return ConfigEntry(
        "min.insync.replicas",
        str(cfg.min_insync_replicas),
        ConfigType.INT,
        "Smallest ISR that accepts acks=all.",
    )


def _max_message_bytes(name: str, cfg: BrokerConfig) -> ConfigEntry:
    return ConfigEntry(
        name,
        str(cfg.max_message_bytes),
        ConfigType.INT,
        "Largest records field of one partition in a produce.",
    )


class _CloseConnection(Exception):
    """Raised inside request handling: drop this connection (reason already logged)."""


class _Connection:
    __slots__ = ("busy", "host", "log", "processor", "reader_task", "requests", "writer")

    def __init__(self, writer: asyncio.StreamWriter, log: Any, host: str) -> None:
        self.writer = writer
        self.host = host
        self.busy = False
        self.log = log
        self.processor: asyncio.Task[None] | None = None
        self.reader_task: asyncio.Task[None] | None = None
        self.requests = 0


class Broker:
    """A single-node Kafka-protocol broker with in-process followers.

    Use ``async with Broker(config) as broker:`` (or :meth:`start` and
    :meth:`close`); ``broker.port`` is the bound port.

    Args:
        config: settings; defaults to :class:`BrokerConfig()`.
        logger: a structlog-compatible logger; defaults to ``structlog.get_logger()``.
    """

    def __init__(self, config: BrokerConfig | None = None, *, logger: Any | None = None) -> None:
        if config is None:
            config = BrokerConfig()
        elif not isinstance(config, BrokerConfig):
            raise TypeError(f"config must be a BrokerConfig, got {type(config).__name__}")
        self.config = config
        self.log: Any = logger if logger is not None else structlog.get_logger("examples.broker")
        self._timer = ap.Timer()
        self.produce_purgatory: ap.Purgatory[DelayedProduce] = ap.Purgatory(
            "produce", timer=self._timer, logger=self.log
        )
        self.fetch_purgatory: ap.Purgatory[DelayedFetch] = ap.Purgatory(
            "fetch", timer=self._timer, logger=self.log
        )
        self.replica_fetch_purgatory: ap.Purgatory[DelayedFetch] = ap.Purgatory(
            "replica_fetch", timer=self._timer, logger=self.log
        )
        self.rebalance_purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory(
            "rebalance", timer=self._timer, logger=self.log
        )
        self.heartbeat_purgatory: ap.Purgatory[DelayedHeartbeat] = ap.Purgatory(
            "heartbeat", timer=self._timer, logger=self.log
        )
        self.partitions: dict[TopicPartition, Partition] = {}
        self.topics: dict[str, int] = {}
        #: Each topic's id (CreateTopics v7 answers it); a recreated topic gets a new one.
        self.topic_ids: dict[str, uuid.UUID] = {}
        #: Producer ids issued by InitProducerId (idempotent producers).
        self.producer_ids = ProducerIdManager()
        #: Consumer groups (FindCoordinator names this broker for every group).
        self.coordinator = GroupCoordinator(
            self.rebalance_purgatory,
            self.heartbeat_purgatory,
            self.partitions.__contains__,
            min_session_timeout=config.group_min_session_timeout,
            max_session_timeout=config.group_max_session_timeout,
            initial_rebalance_delay=config.group_initial_rebalance_delay,
            logger=self.log,
        )
        self.followers = [
            Follower(i, self._replica_fetch, config.follower_lag)
            for i in range(1, config.followers + 1)
        ]
        self._replica_ops: dict[int, DelayedFetch] = {}
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._handler_tasks: set[asyncio.Task[Any]] = set()
        self._background: list[asyncio.Task[None]] = []
        self._closing = False
        self._closed = asyncio.Event()
        self.port = 0
        #: Requests handled, by (API name, version): what the clients negotiated.
        self.request_counts: dict[tuple[str, int], int] = {}
        #: Requests with an unknown API key, by key (they close the connection).
        self.unknown_api_keys: dict[int, int] = {}

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> Broker:
        """Create the configured topics, start followers and listen. Returns self.

        Raises:
            OSError: the port cannot be listened on (the followers are stopped).
        """
        if self._server is not None:
            raise RuntimeError("broker already started")
        cfg = self.config
        for topic, count in cfg.topics.items():
            self.create_topic(topic, count)
        for follower in self.followers:
            follower.start()
        try:
            self._server = await asyncio.start_server(self._on_connect, cfg.host, cfg.port)
        except OSError:
            # Not started: nothing to shut down gracefully, nothing logged.
            for follower in self.followers:
                await follower.crash()
            raise
        self.port = self._server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        self._background.append(loop.create_task(self._isr_checker(), name="broker-isr"))
        if cfg.stats_interval > 0:
            self._background.append(loop.create_task(self._stats_logger(), name="broker-stats"))
        self.log.info(
            "broker.started",
            host=cfg.host,
            port=self.port,
            followers=len(self.followers),
            min_insync_replicas=cfg.min_insync_replicas,
            topics=dict(self.topics),
        )
        return self

    @property
    def advertised_host(self) -> str:
        """The host name clients are told to connect to."""
        cfg = self.config
        if cfg.advertised_host:
            return cfg.advertised_host
        return "127.0.0.1" if cfg.host in ("", "0.0.0.0", "::") else cfg.host

    async def serve_forever(self) -> None:
        """Wait until :meth:`close` has finished."""
        await self._closed.wait()

    async def close(self) -> None:
        """Shut down gracefully. Idempotent.

        Stops listening, stops the followers, expires every parked operation so
        its client gets an answer (REQUEST_TIMED_OUT for produces still waiting,
        the available data for fetches, COORDINATOR_NOT_AVAILABLE for group
        joins and syncs; group sessions and join phases are cancelled), lets those
        answers flush for up to ``shutdown_grace`` seconds, then closes every
        connection.
        """
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        if self._server is not None:
            self._server.close()
        for task in self._background:
            task.cancel()
        for follower in self.followers:
            await follower.crash()
        pending = self.produce_purgatory.pending + self.fetch_purgatory.pending
        # Readers stop first, so no new request starts while the parked ones finish.
        for conn in list(self._connections):
            if conn.reader_task is not None:
                conn.reader_task.cancel()
        self.produce_purgatory.close(expire_pending=True)
        self.fetch_purgatory.close(expire_pending=True)
        self.replica_fetch_purgatory.close()
        await self.coordinator.close()
        # Busy processors are answering what was just expired and stop after that;
        # idle ones would wait for a next request forever.
        for conn in list(self._connections):
            if conn.processor is not None and not conn.busy:
                conn.processor.cancel()
        processors = [c.processor for c in self._connections if c.processor is not None]
        if processors:
            _, late = await asyncio.wait(processors, timeout=self.config.shutdown_grace)
            for task in late:
                task.cancel()
        for conn in list(self._connections):
            conn.writer.close()
        if self._handler_tasks:
            await asyncio.wait(list(self._handler_tasks), timeout=self.config.shutdown_grace)
        await asyncio.gather(*self._background, return_exceptions=True)
        self._timer.close()
        self.log.info("broker.stopped", answered_at_shutdown=pending)
        self._closed.set()

    async def __aenter__(self) -> Broker:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- admin hooks -----------------------------------------------------------------------

    def create_topic(
        self, name: str, partitions: int, replication_factor: int | None = None
    ) -> bool:
        """Create a topic led by this broker; False if it exists already.

        Args:
            name: the topic.
            partitions: how many.
            replication_factor: replicas of each partition, the leader included
                (1 to followers + 1; the first ``replication_factor - 1``
                followers replicate it); None: every follower.

        Raises:
            ValueError: invalid name, partition count or replication factor.
        """
        if not isinstance(name, str) or not _TOPIC_NAME.match(name):
            raise ValueError(f"name: invalid topic name {name!r}")
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"partitions must be a positive int, got {partitions!r}")
        all_replicas = len(self.followers) + 1
        if replication_factor is None:
            replication_factor = all_replicas
        elif (
            isinstance(replication_factor, bool)
            or not isinstance(replication_factor, int)
            or not 1 <= replication_factor <= all_replicas
        ):
            raise ValueError(
                f"replication_factor must be an int in [1, {all_replicas}], "
                f"got {replication_factor!r}"
            )
        if name in self.topics:
            return False
        now = asyncio.get_running_loop().time()
        followers = self.followers[: replication_factor - 1]
        follower_ids = [f.id for f in followers]
        for index in range(partitions):
            tp = TopicPartition(name, index)
            self.partitions[tp] = Partition(tp, follower_ids, self.config.min_insync_replicas, now)
            for follower in followers:
                if follower.state == "crashed" and self._server is not None:
                    self.partitions[tp].set_crashed(follower.id, True, now)
        self.topics[name] = partitions
        self.topic_ids[name] = uuid.uuid4()
        self._wake_replica_fetches()
        self.log.info(
            "broker.topic_created",
            topic=name,
            partitions=partitions,
            replication_factor=replication_factor,
        )
        return True

    def delete_topic(self, name: str) -> bool:
        """Delete a topic and its data; False if there is no such topic.

        Produces and fetches parked on its partitions finish at once: their
        partitions answer UNKNOWN_TOPIC_OR_PARTITION. Committed offsets of the
        topic and the producers' sequence state go too, and the followers forget
        it, so a topic created again under the name starts empty.
        """
        count = self.topics.pop(name, None)
        if count is None:
            return False
        del self.topic_ids[name]
        tps = {TopicPartition(name, index) for index in range(count)}
        for tp in tps:
            self.partitions.pop(tp).deleted = True
        for follower in self.followers:
            follower.forget(tps)
        self.coordinator.forget_partitions(tps)
        for tp in tps:
            self._partition_gone(tp)  # wakes the parked produces and fetches: they see `deleted`
        self._wake_replica_fetches()
        self.log.info("broker.topic_deleted", topic=name, partitions=count)
        return True

    def _wake_replica_fetches(self) -> None:
        # Parked follower fetches watch the partitions of their round: wake them so
        # the next round includes new ones (otherwise the first acks=all waits a
        # round) and leaves deleted ones.
        for op in list(self._replica_ops.values()):
            op.force_complete()

    def follower(self, follower_id: int) -> Follower:
        """The follower with this node id (1, 2, ...).

        Raises:
            ValueError: no such follower.
        """
        for follower in self.followers:
            if follower.id == follower_id:
                return follower
        raise ValueError(f"follower_id: no follower {follower_id!r}")

    def stall_follower(self, follower_id: int) -> None:
        """Stop a follower fetching; it stays in the ISR until ``replica_lag_time_max``."""
        self.follower(follower_id).stall()
        self.log.info("broker.follower_stalled", follower=follower_id)

    def resume_follower(self, follower_id: int) -> None:
        """Let a stalled follower fetch again."""
        self.follower(follower_id).resume()
        self.log.info("broker.follower_resumed", follower=follower_id)

    async def crash_follower(self, follower_id: int) -> None:
        """Kill a follower: it leaves every ISR at once (the HW may then advance)."""
        follower = self.follower(follower_id)
        await follower.crash()
        now = asyncio.get_running_loop().time()
        for tp, partition in self.partitions.items():
            if partition.has_replica(follower_id) and partition.set_crashed(follower_id, True, now):
                self._hw_advanced(tp)
        self.log.warning("broker.follower_crashed", follower=follower_id)

    def restart_follower(self, follower_id: int) -> None:
        """Restart a crashed follower; it rejoins each ISR once caught up to the HW."""
        follower = self.follower(follower_id)
        now = asyncio.get_running_loop().time()
        for partition in self.partitions.values():
            if partition.has_replica(follower_id):
                partition.set_crashed(follower_id, False, now)
        follower.start()
        self.log.info("broker.follower_restarted", follower=follower_id)

    def set_follower_lag(self, follower_id: int, lag: float) -> None:
        """Change a follower's replication lag (seconds)."""
        if isinstance(lag, bool) or not isinstance(lag, int | float) or not 0 <= lag < 3600:
            raise ValueError(f"lag must be a number of seconds in [0, 3600), got {lag!r}")
        self.follower(follower_id).lag = float(lag)

    @property
    def purgatories(self) -> list[ap.Purgatory[Any]]:
        """Every purgatory of the broker (produce, fetch, replica_fetch, rebalance, heartbeat)."""
        return [
            self.produce_purgatory,
            self.fetch_purgatory,
            self.replica_fetch_purgatory,
            self.rebalance_purgatory,
            self.heartbeat_purgatory,
        ]

    def statistics(self) -> dict[str, ap.PurgatoryStatistics]:
        """Statistics of every purgatory, by name."""
        return {p.name: p.statistics() for p in self.purgatories}

    @property
    def connection_count(self) -> int:
        """Open client connections."""
        return len(self._connections)

    # -- purgatory triggers -------------------------------------------------------------------

    def _hw_advanced(self, tp: TopicPartition) -> None:
        # Produces and consumer fetches wait for the HW with a threshold: an advance
        # checks only those it reached (and those it reached before that still wait),
        # not every operation parked on the partition.
        high_watermark = self.partitions[tp].high_watermark
        self.produce_purgatory.advance(tp, high_watermark)
        self.fetch_purgatory.advance(tp, high_watermark)

    def _partition_gone(self, tp: TopicPartition) -> None:
        # Not a watermark: every operation parked on the deleted partition must see
        # `deleted`, whatever its threshold (a topic created again starts at 0).
        self.produce_purgatory.check_and_complete(tp)
        self.fetch_purgatory.check_and_complete(tp)

    async def _replica_fetch(
        self, follower_id: int, offsets: dict[TopicPartition, int]
    ) -> dict[TopicPartition, bytes]:
        """A follower's fetch: report its LEOs, then wait for data above them."""
        now = asyncio.get_running_loop().time()
        targets: list[FetchTarget] = []
        for tp, partition in self.partitions.items():
            if not partition.has_replica(follower_id):
                continue
            offset = offsets.setdefault(tp, 0)
            in_isr = follower_id in partition.isr
            if partition.update_follower(follower_id, offset, now):
                self._hw_advanced(tp)
            if not in_isr and follower_id in partition.isr:
                self.log.info("broker.isr_expanded", partition=str(tp), follower=follower_id)
            targets.append(FetchTarget(partition, offset))
        if not targets:
            await asyncio.sleep(self.config.replica_fetch_max_wait)
            return {}
        op = DelayedFetch(
            self.config.replica_fetch_max_wait, targets, 1, lambda p: p.log_end_offset
        )
        self._replica_ops[follower_id] = op
        try:
            # Parked until some log end passes the follower's offset (one record).
            await self.replica_fetch_purgatory.watch(op, _first_record(targets))
        finally:
            self._replica_ops.pop(follower_id, None)
        return {
            t.partition.tp: t.partition.log.read(
                t.fetch_offset, t.partition.log_end_offset, 1024 * 1024, min_one=True
            )
            for t in targets
            if not t.partition.deleted
        }

    async def _isr_checker(self) -> None:
        lag_max = self.config.replica_lag_time_max
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(lag_max / 2)
            now = loop.time()
            for tp, partition in self.partitions.items():
                dropped, hw_moved = partition.shrink_isr(now, lag_max)
                if dropped:
                    self.log.warning("broker.isr_shrunk", partition=str(tp), followers=dropped)
                if hw_moved:
                    self._hw_advanced(tp)

    async def _stats_logger(self) -> None:
        # Wait percentiles over each interval: the histograms since the last line.
        previous = {p.name: p.histograms() for p in self.purgatories}
        while True:
            await asyncio.sleep(self.config.stats_interval)
            stats = self.statistics()
            current = {p.name: p.histograms() for p in self.purgatories}
            waits = {name: current[name] - previous[name] for name in current}
            previous = current
            self.log.info(
                "broker.purgatory_stats",
                connections=len(self._connections),
                **{
                    name: {
                        "pending": s.pending,
                        "watched": s.watched,
                        "completed": s.completed,
                        "expired": s.expired,
                        "cancelled": s.cancelled,
                        "advances": s.advances,
                        **_wait_summary(waits[name]),
                    }
                    for name, s in stats.items()
                },
            )

    # -- connections -------------------------------------------------------------------------

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:
            writer.close()
            return
        task = asyncio.current_task()
        if task is not None:
            self._handler_tasks.add(task)
        peer = writer.get_extra_info("peername")
        log = self.log.bind(peer=f"{peer[0]}:{peer[1]}" if peer else "?")
        conn = _Connection(writer, log, f"/{peer[0]}" if peer else "")
        self._connections.add(conn)
        queue: asyncio.Queue[bytes] = asyncio.Queue(_READ_AHEAD)
        loop = asyncio.get_running_loop()
        conn.processor = loop.create_task(self._process(conn, queue))
        conn.reader_task = loop.create_task(self._read_frames(conn, reader, queue))
        try:
            # The connection ends when either side stops: the client went away (the
            # reader ends) or a request asked to close it (the processor ends).
            await asyncio.wait(
                [conn.processor, conn.reader_task], return_when=asyncio.FIRST_COMPLETED
            )
            if conn.reader_task.done() and not self._closing:
                # Client gone (or bad framing): cancel whatever it was waiting for.
                conn.processor.cancel()
            conn.reader_task.cancel()
            await asyncio.gather(conn.processor, conn.reader_task, return_exceptions=True)
        finally:
            self._connections.discard(conn)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            log.debug("broker.connection_closed", requests=conn.requests)
            if task is not None:
                self._handler_tasks.discard(task)

    async def _read_frames(
        self, conn: _Connection, reader: asyncio.StreamReader, queue: asyncio.Queue[bytes]
    ) -> None:
        limit = self.config.max_frame_bytes
        while True:
            try:
                size_bytes = await reader.readexactly(4)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    conn.log.warning("broker.truncated_frame", got=len(exc.partial), expected=4)
                return
            except OSError as exc:
                conn.log.info("broker.connection_error", error=repr(exc))
                return
            size = _SIZE.unpack(size_bytes)[0]
            if size < 8 or size > limit:
                conn.log.warning("broker.frame_rejected", size=size, max_frame_bytes=limit)
                return
            try:
                frame = await reader.readexactly(size)
            except asyncio.IncompleteReadError as exc:
                conn.log.warning("broker.truncated_frame", got=len(exc.partial), expected=size)
                return
            except OSError as exc:
                conn.log.info("broker.connection_error", error=repr(exc))
                return
            await queue.put(frame)

    async def _process(self, conn: _Connection, queue: asyncio.Queue[bytes]) -> None:
        while not self._closing:
            frame = await queue.get()
            conn.requests += 1
            conn.busy = True
            try:
                response = await self._handle(conn, frame)
            except _CloseConnection:
                return
            except (ap.PurgatoryClosedError, ConnectionError):
                return
            except Exception as exc:
                # A bug must cost one connection, never the server.
                conn.log.error("broker.handler_failed", error=repr(exc), exc_info=exc)
                return
            if response is not None:
                conn.writer.write(response)
                try:
                    await conn.writer.drain()
                except ConnectionError:
                    return
            conn.busy = False

    # -- requests ------------------------------------------------------------------------------

    async def _handle(self, conn: _Connection, frame: bytes) -> bytes | None:
        reader = Reader(frame)
        try:
            header = decode_request_header(reader)
        except DecodeError as exc:
            conn.log.warning("broker.malformed_header", error=str(exc), size=len(frame))
            raise _CloseConnection from exc
        api, version = header.api_key, header.api_version
        versions = SUPPORTED_VERSIONS.get(api)
        if versions is None:
            self.unknown_api_keys[api] = self.unknown_api_keys.get(api, 0) + 1
            conn.log.warning(
                "broker.unknown_api_key",
                api_key=api,
                api_version=version,
                client_id=header.client_id,
            )
            raise _CloseConnection
        if not versions[0] <= version <= versions[1]:
            if api == ApiKey.API_VERSIONS:
                # KIP-511: answer in v0 with the supported ranges so the client can retry.
                writer = Writer()
                encode_api_versions(writer, 0, ErrorCode.UNSUPPORTED_VERSION, SUPPORTED_VERSIONS)
                return self._frame(header, writer)
            conn.log.warning(
                "broker.unsupported_version",
                api=API_NAMES[api],
                api_version=version,
                supported=versions,
            )
            raise _CloseConnection
        name = API_NAMES[api]
        self.request_counts[name, version] = self.request_counts.get((name, version), 0) + 1
        try:
            if api == ApiKey.PRODUCE:
                produce = decode_produce(reader, version)
                check_fully_consumed(reader, "Produce")
                return await self._produce(conn, header, produce)
            if api == ApiKey.FETCH:
                fetch = decode_fetch(reader, version)
                check_fully_consumed(reader, "Fetch")
                return await self._fetch(header, fetch)
            if api in _GROUP_APIS:
                return await self._group_request(conn, header, reader)
            if api in _ADMIN_APIS:
                return self._admin_request(header, reader)
            writer = Writer()
            if api == ApiKey.METADATA:
                metadata = decode_metadata(reader, version)
                check_fully_consumed(reader, "Metadata")
                self._metadata(writer, version, metadata.topics, metadata.allow_auto_topic_creation)
            elif api == ApiKey.LIST_OFFSETS:
                list_offsets = decode_list_offsets(reader, version)
                check_fully_consumed(reader, "ListOffsets")
                self._list_offsets(writer, version, list_offsets.topics)
            else:
                decode_api_versions(reader, version)
                check_fully_consumed(reader, "ApiVersions")
                encode_api_versions(writer, version, ErrorCode.NONE, SUPPORTED_VERSIONS)
            return self._frame(header, writer)
        except DecodeError as exc:
            conn.log.warning(
                "broker.malformed_request",
                api=API_NAMES[api],
                api_version=version,
                error=str(exc),
            )
            raise _CloseConnection from exc

    async def _group_request(
        self, conn: _Connection, header: RequestHeader, reader: Reader
    ) -> bytes:
        """The consumer-group APIs: decode, ask the coordinator, encode."""
        api, version = header.api_key, header.api_version
        coordinator = self.coordinator
        writer = Writer()
        if api == ApiKey.FIND_COORDINATOR:
            find = decode_find_coordinator(reader, version)
            check_fully_consumed(reader, "FindCoordinator")
            # Group keys only: no transactions here. Every group lives on this node.
            if find.key_type == 0:
                error = ErrorCode.COORDINATOR_NOT_AVAILABLE if self._closing else ErrorCode.NONE
            elif find.key_type == 1:
                # No transactions: refused at once rather than "not available" (which
                # clients retry until their own timeout).
                error = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            else:
                error = ErrorCode.INVALID_REQUEST
            ok = error == ErrorCode.NONE
            encode_find_coordinator(
                writer,
                version,
                error,
                LEADER_ID if ok else -1,
                self.advertised_host if ok else "",
                self.port if ok else -1,
            )
        elif api == ApiKey.JOIN_GROUP:
            join = decode_join_group(reader, version)
            check_fully_consumed(reader, "JoinGroup")
            result = await coordinator.join(
                join.group_id,
                join.member_id,
                header.client_id or "",
                join.session_timeout_ms,
                join.rebalance_timeout_ms,
                join.protocol_type,
                join.protocols,
                conn.host,
            )
            encode_join_group(writer, version, result)
        elif api == ApiKey.SYNC_GROUP:
            sync = decode_sync_group(reader, version)
            check_fully_consumed(reader, "SyncGroup")
            error, assignment = await coordinator.sync(
                sync.group_id, sync.generation_id, sync.member_id, sync.assignments
            )
            encode_sync_group(writer, version, error, assignment)
        elif api == ApiKey.HEARTBEAT:
            beat = decode_heartbeat(reader, version)
            check_fully_consumed(reader, "Heartbeat")
            error = coordinator.heartbeat(beat.group_id, beat.generation_id, beat.member_id)
            encode_error_only(writer, version, error)
        elif api == ApiKey.LEAVE_GROUP:
            group_id, member_id = decode_leave_group(reader, version)
            check_fully_consumed(reader, "LeaveGroup")
            encode_error_only(writer, version, coordinator.leave(group_id, member_id))
        elif api == ApiKey.OFFSET_COMMIT:
            commit = decode_offset_commit(reader, version)
            check_fully_consumed(reader, "OffsetCommit")
            offsets = [
                (TopicPartition(topic, index), offset, metadata)
                for topic, partitions in commit.topics
                for index, offset, metadata in partitions
            ]
            results = coordinator.commit_offsets(
                commit.group_id, commit.generation_id, commit.member_id, offsets
            )
            by_topic: dict[str, list[tuple[int, int]]] = {}
            for tp, code in results:
                by_topic.setdefault(tp.topic, []).append((tp.partition, code))
            encode_offset_commit(writer, version, list(by_topic.items()))
        else:
            fetch = decode_offset_fetch(reader, version)
            check_fully_consumed(reader, "OffsetFetch")
            error, topics = coordinator.fetch_offsets(fetch.group_id, fetch.topics)
            encode_offset_fetch(writer, version, error, topics)
        return self._frame(header, writer)

    def _admin_request(self, header: RequestHeader, reader: Reader) -> bytes:
        """Topic and group administration, DescribeConfigs and InitProducerId."""
        api, version = header.api_key, header.api_version
        writer = Writer()
        if api == ApiKey.CREATE_TOPICS:
            create = decode_create_topics(reader, version)
            check_fully_consumed(reader, "CreateTopics")
            results = self._create_topics(create.topics, create.validate_only)
            encode_create_topics(writer, version, results)
        elif api == ApiKey.DELETE_TOPICS:
            names, _timeout_ms = decode_delete_topics(reader, version)
            check_fully_consumed(reader, "DeleteTopics")
            encode_delete_topics(writer, version, self._delete_topics(names))
        elif api == ApiKey.DESCRIBE_GROUPS:
            group_ids = decode_describe_groups(reader, version)
            check_fully_consumed(reader, "DescribeGroups")
            encode_describe_groups(writer, version, self.coordinator.describe_groups(group_ids))
        elif api == ApiKey.LIST_GROUPS:
            states, types = decode_list_groups(reader, version)
            check_fully_consumed(reader, "ListGroups")
            error, groups = self.coordinator.list_groups(states, types)
            encode_list_groups(writer, version, error, groups)
        elif api == ApiKey.DELETE_GROUPS:
            group_ids = decode_delete_groups(reader, version)
            check_fully_consumed(reader, "DeleteGroups")
            encode_delete_groups(writer, version, self.coordinator.delete_groups(group_ids))
        elif api == ApiKey.DESCRIBE_CONFIGS:
            resources = decode_describe_configs(reader, version)
            check_fully_consumed(reader, "DescribeConfigs")
            encode_describe_configs(writer, version, [self._describe_configs(r) for r in resources])
        else:
            init = decode_init_producer_id(reader, version)
            check_fully_consumed(reader, "InitProducerId")
            if init.transactional_id is not None:
                # Transactions are out of scope: Kafka's answer to a transactional id
                # this client may not use, which clients treat as fatal at once.
                encode_init_producer_id(
                    writer, version, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1
                )
            else:
                producer_id, epoch = self.producer_ids.init_producer(
                    init.producer_id, init.producer_epoch
                )
                self.log.info("broker.producer_id_issued", producer_id=producer_id, epoch=epoch)
                encode_init_producer_id(writer, version, ErrorCode.NONE, producer_id, epoch)
        return self._frame(header, writer)

    def _create_topics(
        self, topics: list[CreatableTopic], validate_only: bool
    ) -> list[CreatableTopicResult]:
        """CreateTopics: validate each topic as Kafka does, then create it (unless validating)."""
        counts = Counter(topic.name for topic in topics)
        all_replicas = len(self.followers) + 1
        results: list[CreatableTopicResult] = []
        for topic in topics:
            name = topic.name
            partitions = (
                self.config.default_partitions
                if topic.num_partitions == -1
                else topic.num_partitions
            )
            replication = (
                all_replicas if topic.replication_factor == -1 else topic.replication_factor
            )
            error, message = ErrorCode.NONE, None
            if counts[name] > 1:
                error, message = (
                    ErrorCode.INVALID_REQUEST,
                    "topic named more than once in the request",
                )
            elif not _TOPIC_NAME.match(name) or name in (".", ".."):
                error, message = ErrorCode.INVALID_TOPIC_EXCEPTION, f"invalid topic name {name!r}"
            elif name in self.topics:
                error, message = ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
            elif topic.assignments:
                error = ErrorCode.INVALID_REPLICA_ASSIGNMENT
                message = (
                    "manual replica assignment is not supported: give partitions and replication"
                )
            elif not 1 <= partitions <= MAX_PARTITIONS_PER_TOPIC:
                error = ErrorCode.INVALID_PARTITIONS
                message = f"partitions must be in [1, {MAX_PARTITIONS_PER_TOPIC}], got {partitions}"
            elif not 1 <= replication <= all_replicas:
                error = ErrorCode.INVALID_REPLICATION_FACTOR
                message = (
                    f"replication factor must be in [1, {all_replicas}] "
                    f"(this broker and its {len(self.followers)} followers), got {replication}"
                )
            elif topic.configs:
                error = ErrorCode.INVALID_CONFIG
                message = "per-topic configs are not supported: every topic uses the broker's"
            result = CreatableTopicResult(name, error, message)
            if error == ErrorCode.NONE:
                if not validate_only:
                    self.create_topic(name, partitions, replication)
                    result.topic_id = self.topic_ids[name]
                result.num_partitions = partitions
                result.replication_factor = replication
                result.configs = self._topic_configs()
            else:
                self.log.info(
                    "broker.create_topic_refused", topic=name, error=error, reason=message
                )
            results.append(result)
        return results

    def _delete_topics(self, names: list[str]) -> list[tuple[str, int, str | None]]:
        """DeleteTopics: per name (name, error, message)."""
        counts = Counter(names)
        results: list[tuple[str, int, str | None]] = []
        for name in names:
            if counts[name] > 1:
                results.append((name, ErrorCode.INVALID_REQUEST, "topic named more than once"))
            elif self.delete_topic(name):
                results.append((name, ErrorCode.NONE, None))
            else:
                results.append((name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such topic"))
        return results

    def _topic_configs(self) -> list[ConfigEntry]:
        """The settings every topic has (no per-topic overrides: the broker's)."""
        cfg = self.config
        return [
            _min_insync_replicas(cfg),
            _max_message_bytes("max.message.bytes", cfg),
            ConfigEntry(
                "message.timestamp.type",
                "CreateTime",
                ConfigType.STRING,
                "Timestamps are the producer's.",
            ),
            ConfigEntry(
                "retention.ms", "-1", ConfigType.LONG, "Logs are kept in memory, unbounded."
            ),
            ConfigEntry("retention.bytes", "-1", ConfigType.LONG, "No size limit either."),
        ]

    def _broker_configs(self) -> list[ConfigEntry]:
        """The broker's settings, under Kafka's names (durations in ms)."""
        cfg = self.config

        def ms(seconds: float) -> str:
            return str(round(seconds * 1000))

        return [
            ConfigEntry("broker.id", str(LEADER_ID), ConfigType.INT, "This broker's node id."),
            ConfigEntry(
                "num.partitions",
                str(cfg.default_partitions),
                ConfigType.INT,
                "Partitions of auto-created topics.",
            ),
            ConfigEntry(
                "default.replication.factor",
                str(len(self.followers) + 1),
                ConfigType.INT,
                "Replicas of a topic: this broker and its in-process followers.",
            ),
            _min_insync_replicas(cfg),
            ConfigEntry(
                "auto.create.topics.enable",
                str(cfg.auto_create_topics).lower(),
                ConfigType.BOOLEAN,
                "Metadata requests create unknown topics.",
            ),
            ConfigEntry(
                "replica.lag.time.max.ms",
                ms(cfg.replica_lag_time_max),
                ConfigType.LONG,
                "A follower not caught up for this long leaves the ISR.",
            ),
            _max_message_bytes("message.max.bytes", cfg),
            ConfigEntry(
                "socket.request.max.bytes",
                str(cfg.max_frame_bytes),
                ConfigType.INT,
                "Largest request frame.",
            ),
            ConfigEntry(
                "group.min.session.timeout.ms",
                ms(cfg.group_min_session_timeout),
                ConfigType.INT,
                "Smallest consumer session timeout.",
            ),
            ConfigEntry(
                "group.max.session.timeout.ms",
                ms(cfg.group_max_session_timeout),
                ConfigType.INT,
                "Largest consumer session timeout.",
            ),
            ConfigEntry(
                "group.initial.rebalance.delay.ms",
                ms(cfg.group_initial_rebalance_delay),
                ConfigType.INT,
                "How long an empty group waits for more members.",
            ),
        ]

    def _describe_configs(self, resource: ConfigResource) -> DescribeConfigsResult:
        """DescribeConfigs for one resource: a topic, or this broker ("0" or "")."""
        if resource.resource_type == ResourceType.TOPIC:
            if resource.name not in self.topics:
                return DescribeConfigsResult(
                    resource, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such topic", []
                )
            entries = self._topic_configs()
        elif resource.resource_type == ResourceType.BROKER:
            if resource.name not in ("", str(LEADER_ID)):
                return DescribeConfigsResult(
                    resource,
                    ErrorCode.INVALID_REQUEST,
                    f"unexpected broker id {resource.name!r}, expected {LEADER_ID} or empty",
                    [],
                )
            entries = self._broker_configs()
        else:
            return DescribeConfigsResult(
                resource,
                ErrorCode.INVALID_REQUEST,
                f"resource type {resource.resource_type} is not supported (2 topic, 4 broker)",
                [],
            )
        if resource.keys:  # null or empty: all of them (as Kafka)
            wanted = set(resource.keys)
            entries = [e for e in entries if e.name in wanted]
        return DescribeConfigsResult(resource, ErrorCode.NONE, None, entries)

    @staticmethod
    def _frame(header: RequestHeader, body: Writer) -> bytes:
        head = Writer()
        encode_response_header(head, header)
        return _SIZE.pack(len(head.buf) + len(body.buf)) + head.buf + body.buf

    def _metadata(
        self, writer: Writer, version: int, names: list[str] | None, allow_auto_create: bool
    ) -> None:
        topics: list[MetadataTopic] = []
        for name in self.topics if names is None else names:
            if name not in self.topics:
                if not _TOPIC_NAME.match(name):
                    topics.append(MetadataTopic(ErrorCode.INVALID_TOPIC_EXCEPTION, name))
                    continue
                if not (self.config.auto_create_topics and allow_auto_create):
                    topics.append(MetadataTopic(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name))
                    continue
                self.create_topic(name, self.config.default_partitions)
            topic = MetadataTopic(ErrorCode.NONE, name)
            for index in range(self.topics[name]):
                partition = self.partitions[TopicPartition(name, index)]
                topic.partitions.append(
                    MetadataPartition(
                        ErrorCode.NONE,
                        index,
                        LEADER_ID,
                        partition.replicas,
                        sorted(partition.isr),
                        partition.offline_replicas,
                    )
                )
            topics.append(topic)
        encode_metadata(
            writer,
            version,
            node_id=LEADER_ID,
            host=self.advertised_host,
            port=self.port,
            cluster_id=_CLUSTER_ID,
            topics=topics,
        )

    async def _produce(
        self, conn: _Connection, header: RequestHeader, request: ProduceRequest
    ) -> bytes | None:
        acks = request.acks
        results: dict[str, dict[int, ProducePartitionResult]] = {}
        by_tp: dict[TopicPartition, ProducePartitionResult] = {}
        waiting: dict[TopicPartition, Partition] = {}
        required: dict[TopicPartition, int] = {}
        failed = False
        for topic, partitions in request.topics:
            topic_results = results.setdefault(topic, {})
            for index, records in partitions:
                tp = TopicPartition(topic, index)
                result = ProducePartitionResult()
                topic_results[index] = by_tp[tp] = result
                error, end_offset = self._append(
                    tp, records, acks, request.transactional_id, result
                )
                if error:
                    result.error_code = error
                    failed = True
                elif acks == -1:
                    # A retried idempotent batch waits for the HW to pass the
                    # original, in the same purgatory.
                    waiting[tp] = self.partitions[tp]
                    required[tp] = end_offset
        if acks == 0:
            if failed:
                # acks=0 has no response: closing is the only way to tell the client.
                conn.log.warning("broker.produce_failed_acks0", errors=_errors_of(by_tp))
                raise _CloseConnection
            return None
        if required:
            op = DelayedProduce(max(request.timeout_ms, 0) / 1000, waiting, required, by_tp)
            # Parked until each partition's HW reaches the end of its batches.
            outcome = await self.produce_purgatory.watch(op, dict(required))
            if outcome is ap.Outcome.CANCELLED:
                raise _CloseConnection
        writer = Writer()
        encode_produce(writer, header.api_version, results)
        return self._frame(header, writer)

    def _append(
        self,
        tp: TopicPartition,
        records: bytes | None,
        acks: int,
        transactional_id: str | None,
        result: ProducePartitionResult,
    ) -> tuple[int, int]:
        """Validate and append one partition's batches.

        Returns:
            (error code or 0, the offset after the batches: what ``acks=all``
            waits for the HW to reach).
        """
        if acks not in (-1, 0, 1):
            return ErrorCode.INVALID_REQUIRED_ACKS, -1
        if transactional_id is not None:
            return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1
        partition = self.partitions.get(tp)
        if partition is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
        if records is None:
            return ErrorCode.CORRUPT_MESSAGE, -1
        if len(records) > self.config.max_message_bytes:
            return ErrorCode.MESSAGE_TOO_LARGE, -1
        if acks == -1 and not partition.enough_replicas():
            return ErrorCode.NOT_ENOUGH_REPLICAS, -1
        try:
            headers = parse_batches(records, verify_crc=self.config.verify_crc)
        except InvalidBatchError as exc:
            self.log.warning("broker.invalid_batch", partition=str(tp), error=str(exc))
            if exc.corrupt:
                return ErrorCode.CORRUPT_MESSAGE, -1
            return ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT, -1
        idempotent = headers[0].producer_id >= 0
        if idempotent:
            error, duplicate = self._check_idempotent(partition, headers)
            if error:
                self.log.info(
                    "broker.produce_sequence_rejected",
                    partition=str(tp),
                    producer_id=headers[0].producer_id,
                    producer_epoch=headers[0].producer_epoch,
                    base_sequence=headers[0].base_sequence,
                    error=error,
                )
                return error, -1
            if duplicate is not None:
                # A retry of a batch already in the log: its original offsets, no append.
                self.log.info(
                    "broker.produce_duplicate",
                    partition=str(tp),
                    producer_id=headers[0].producer_id,
                    base_sequence=headers[0].base_sequence,
                    offset=duplicate.first_offset,
                )
                result.base_offset = duplicate.first_offset
                result.log_start_offset = partition.log.log_start_offset
                return ErrorCode.NONE, duplicate.end_offset
        elif any(h.is_transactional for h in headers):
            return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1
        base, hw_moved = partition.append(records, headers)
        if idempotent:
            partition.producers.record(headers[0], base)
        result.base_offset = base
        result.log_start_offset = partition.log.log_start_offset
        self.replica_fetch_purgatory.advance(tp, partition.log_end_offset)
        if hw_moved:
            self._hw_advanced(tp)
        return ErrorCode.NONE, partition.log_end_offset

    def _check_idempotent(
        self, partition: Partition, headers: list[BatchHeader]
    ) -> tuple[int, BatchMetadata | None]:
        """An idempotent producer's batch: (error, None), (0, the original if a retry)."""
        header = headers[0]
        if len(headers) > 1:
            # Kafka accepts exactly one batch per partition from Produce v3 on.
            return ErrorCode.INVALID_RECORD, None
        if header.is_transactional:
            return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None
        error = self.producer_ids.check(header.producer_id, header.producer_epoch)
        if error:
            return error, None
        return partition.producers.check(header)

    async def _fetch(self, header: RequestHeader, request: FetchRequest) -> bytes:
        targets: list[FetchTarget] = []
        for topic, partitions in request.topics:
            for fp in partitions:
                partition = self.partitions.get(TopicPartition(topic, fp.partition))
                if partition is not None:
                    targets.append(FetchTarget(partition, fp.fetch_offset))
        if targets and request.max_wait_ms > 0 and request.min_bytes > 0:
            op = DelayedFetch(
                request.max_wait_ms / 1000,
                targets,
                request.min_bytes,
                lambda p: p.high_watermark,
            )
            outcome = await self.fetch_purgatory.watch(op, _first_record(targets))
            if outcome is ap.Outcome.CANCELLED:
                raise _CloseConnection
        # Read after the wait, as Kafka's DelayedFetch.onComplete does: the answer
        # reflects the log at completion (or expiry) time.
        budget = request.max_bytes
        first = True
        topics: list[tuple[str, list[FetchResponsePartition]]] = []
        for topic, partitions in request.topics:
            answers: list[FetchResponsePartition] = []
            for fp in partitions:
                partition = self.partitions.get(TopicPartition(topic, fp.partition))
                if partition is None:
                    answers.append(
                        FetchResponsePartition(
                            fp.partition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, b"", -1
                        )
                    )
                    continue
                log = partition.log
                hw = partition.high_watermark
                if not log.log_start_offset <= fp.fetch_offset <= log.log_end_offset:
                    answers.append(
                        FetchResponsePartition(
                            fp.partition, ErrorCode.OFFSET_OUT_OF_RANGE, hw, b"", 0
                        )
                    )
                    continue
                data = log.read(
                    fp.fetch_offset, hw, min(fp.max_bytes, max(budget, 0)), min_one=first
                )
                if data:
                    first = False
                    budget -= len(data)
                answers.append(FetchResponsePartition(fp.partition, ErrorCode.NONE, hw, data, 0))
            topics.append((topic, answers))
        writer = Writer()
        encode_fetch(writer, header.api_version, topics)
        return self._frame(header, writer)

    def _list_offsets(
        self,
        writer: Writer,
        version: int,
        request_topics: list[tuple[str, list[tuple[int, int]]]],
    ) -> None:
        topics: list[tuple[str, list[ListOffsetsPartitionResult]]] = []
        for topic, partitions in request_topics:
            answers: list[ListOffsetsPartitionResult] = []
            for index, timestamp in partitions:
                partition = self.partitions.get(TopicPartition(topic, index))
                if partition is None:
                    answers.append(
                        ListOffsetsPartitionResult(
                            index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1
                        )
                    )
                    continue
                if timestamp == -1:  # latest: what a consumer can read up to
                    offset, found_ts = partition.high_watermark, -1
                elif timestamp == -2:  # earliest
                    offset, found_ts = partition.log.log_start_offset, -1
                else:
                    found = partition.log.offset_for_timestamp(timestamp)
                    if found is None or found[0] >= partition.high_watermark:
                        offset, found_ts = -1, -1
                    else:
                        offset, found_ts = found
                answers.append(ListOffsetsPartitionResult(index, ErrorCode.NONE, found_ts, offset))
            topics.append((topic, answers))
        encode_list_offsets(writer, version, topics)


def _first_record(targets: list[FetchTarget]) -> dict[TopicPartition, int]:
    """A fetch's watch thresholds: each partition's fetch offset + 1.

    A fetch can complete only once its bound (the HW for consumers, the log end
    for followers) has passed some fetch offset: a record is readable there.
    Offsets count records and ``min_bytes`` counts bytes, so the threshold is the
    first record, not ``offset + min_bytes``; advances past it check the fetch
    until enough bytes are readable. (A fetch offset out of range completes at
    its first check, when watched.)
    """
    thresholds: dict[TopicPartition, int] = {}
    for t in targets:
        tp = t.partition.tp
        # The lowest if one partition appears twice: checked from the first record on.
        first = t.fetch_offset + 1
        if first < thresholds.get(tp, first + 1):
            thresholds[tp] = first
    return thresholds


def _errors_of(results: dict[TopicPartition, ProducePartitionResult]) -> dict[str, int]:
    return {str(tp): r.error_code for tp, r in results.items() if r.error_code}


def _wait_summary(interval: ap.PurgatoryHistograms) -> dict[str, float | None]:
    """Interval wait percentiles (ms) of completed operations and expiry lateness."""

    def ms(value: float) -> float | None:
        return None if value != value else round(value * 1000, 3)  # NaN: none finished

    completed = interval.completed
    return {
        "wait_p50_ms": ms(completed.p50),
        "wait_p99_ms": ms(completed.p99),
        "wait_max_ms": ms(completed.quantile(1.0)),
        "lateness_p99_ms": ms(interval.lateness.p99),
    }
