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

The requests are answered in modules of their own: the data path (Metadata,
Produce, Fetch, ListOffsets) in :mod:`examples.broker.data_requests`, groups and
administration in :mod:`examples.broker.admin_requests`; the settings are
:mod:`examples.broker.config` (``BrokerConfig`` is re-exported here).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import uuid
from typing import Any

import structlog

import aiopurgatory as ap

from . import admin_requests, data_requests
from .codec import DecodeError, Reader, Writer
from .config import TOPIC_NAME, BrokerConfig
from .coordinator import DelayedHeartbeat, GroupCoordinator
from .data_requests import CloseConnection, first_record
from .idempotence import ProducerIdManager
from .messages import (
    API_NAMES,
    SUPPORTED_VERSIONS,
    ApiKey,
    ErrorCode,
    RequestHeader,
    check_fully_consumed,
    decode_api_versions,
    decode_fetch,
    decode_list_offsets,
    decode_metadata,
    decode_produce,
    decode_request_header,
    encode_api_versions,
    encode_response_header,
)
from .operations import DelayedFetch, DelayedProduce, FetchTarget
from .partition import Partition, TopicPartition
from .replication import Follower

__all__ = ["Broker", "BrokerConfig"]

_SIZE = struct.Struct(">i")
_READ_AHEAD = 16  # frames read ahead per connection before TCP backpressure applies


# Settings a topic and the broker both report (Kafka names the broker's
# message limit message.max.bytes, the topic's max.message.bytes).


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
        if not isinstance(name, str) or not TOPIC_NAME.match(name):
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
            await self.replica_fetch_purgatory.watch(op, first_record(targets))
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
            except CloseConnection:
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
            raise CloseConnection from exc
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
            raise CloseConnection
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
            raise CloseConnection
        name = API_NAMES[api]
        self.request_counts[name, version] = self.request_counts.get((name, version), 0) + 1
        try:
            if api == ApiKey.PRODUCE:
                produce = decode_produce(reader, version)
                check_fully_consumed(reader, "Produce")
                return await data_requests.produce(self, conn, header, produce)
            if api == ApiKey.FETCH:
                fetch = decode_fetch(reader, version)
                check_fully_consumed(reader, "Fetch")
                return await data_requests.fetch(self, header, fetch)
            if api in admin_requests.GROUP_APIS:
                return await admin_requests.group_request(self, conn, header, reader)
            if api in admin_requests.ADMIN_APIS:
                return admin_requests.admin_request(self, header, reader)
            writer = Writer()
            if api == ApiKey.METADATA:
                metadata = decode_metadata(reader, version)
                check_fully_consumed(reader, "Metadata")
                data_requests.metadata(
                    self, writer, version, metadata.topics, metadata.allow_auto_topic_creation
                )
            elif api == ApiKey.LIST_OFFSETS:
                list_offsets = decode_list_offsets(reader, version)
                check_fully_consumed(reader, "ListOffsets")
                data_requests.list_offsets(self, writer, version, list_offsets.topics)
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
            raise CloseConnection from exc

    @staticmethod
    def _frame(header: RequestHeader, body: Writer) -> bytes:
        head = Writer()
        encode_response_header(head, header)
        return _SIZE.pack(len(head.buf) + len(body.buf)) + head.buf + body.buf


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
