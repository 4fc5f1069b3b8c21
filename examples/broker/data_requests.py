"""The broker's data path: Metadata, Produce, Fetch and ListOffsets requests.

Appends go to the partitions (checking idempotent producers' sequences), and
``acks=all`` produces and long-polling fetches park in the broker's purgatories.
Functions of the :class:`~examples.broker.server.Broker` they serve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiopurgatory as ap

from .codec import Writer
from .config import (
    TOPIC_NAME,
)
from .idempotence import BatchMetadata
from .messages import (
    ErrorCode,
    FetchRequest,
    FetchResponsePartition,
    ListOffsetsPartitionResult,
    MetadataPartition,
    MetadataTopic,
    ProducePartitionResult,
    ProduceRequest,
    RequestHeader,
    encode_fetch,
    encode_list_offsets,
    encode_metadata,
    encode_produce,
)
from .operations import DelayedFetch, DelayedProduce, FetchTarget
from .partition import LEADER_ID, Partition, TopicPartition
from .records import BatchHeader, InvalidBatchError, parse_batches

if TYPE_CHECKING:
    from .server import Broker, _Connection

__all__ = ["CloseConnection", "fetch", "first_record", "list_offsets", "metadata", "produce"]


_CLUSTER_ID = "aiopurgatory-broker"


class CloseConnection(Exception):
    """Raised inside request handling: drop this connection (reason already logged)."""


def metadata(
    broker: Broker, writer: Writer, version: int, names: list[str] | None, allow_auto_create: bool
) -> None:
    topics: list[MetadataTopic] = []
    for name in broker.topics if names is None else names:
        if name not in broker.topics:
            if not TOPIC_NAME.match(name):
                topics.append(MetadataTopic(ErrorCode.INVALID_TOPIC_EXCEPTION, name))
                continue
            if not (broker.config.auto_create_topics and allow_auto_create):
                topics.append(MetadataTopic(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name))
                continue
            broker.create_topic(name, broker.config.default_partitions)
        topic = MetadataTopic(ErrorCode.NONE, name)
        for index in range(broker.topics[name]):
            partition = broker.partitions[TopicPartition(name, index)]
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
        host=broker.advertised_host,
        port=broker.port,
        cluster_id=_CLUSTER_ID,
        topics=topics,
    )


async def produce(
    broker: Broker, conn: _Connection, header: RequestHeader, request: ProduceRequest
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
            error, end_offset = append(broker, tp, records, acks, request.transactional_id, result)
            if error:
                result.error_code = error
                failed = True
            elif acks == -1:
                # A retried idempotent batch waits for the HW to pass the
                # original, in the same purgatory.
                waiting[tp] = broker.partitions[tp]
                required[tp] = end_offset
    if acks == 0:
        if failed:
            # acks=0 has no response: closing is the only way to tell the client.
            conn.log.warning("broker.produce_failed_acks0", errors=_errors_of(by_tp))
            raise CloseConnection
        return None
    if required:
        op = DelayedProduce(max(request.timeout_ms, 0) / 1000, waiting, required, by_tp)
        # Parked until each partition's HW reaches the end of its batches.
        outcome = await broker.produce_purgatory.watch(op, dict(required))
        if outcome is ap.Outcome.CANCELLED:
            raise CloseConnection
    writer = Writer()
    encode_produce(writer, header.api_version, results)
    return broker._frame(header, writer)


def append(
    broker: Broker,
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
    partition = broker.partitions.get(tp)
    if partition is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
    if records is None:
        return ErrorCode.CORRUPT_MESSAGE, -1
    if len(records) > broker.config.max_message_bytes:
        return ErrorCode.MESSAGE_TOO_LARGE, -1
    if acks == -1 and not partition.enough_replicas():
        return ErrorCode.NOT_ENOUGH_REPLICAS, -1
    try:
        headers = parse_batches(records, verify_crc=broker.config.verify_crc)
    except InvalidBatchError as exc:
        broker.log.warning("broker.invalid_batch", partition=str(tp), error=str(exc))
        if exc.corrupt:
            return ErrorCode.CORRUPT_MESSAGE, -1
        return ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT, -1
    idempotent = headers[0].producer_id >= 0
    if idempotent:
        error, duplicate = check_idempotent(broker, partition, headers)
        if error:
            broker.log.info(
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
            broker.log.info(
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
    broker.replica_fetch_purgatory.advance(tp, partition.log_end_offset)
    if hw_moved:
        broker._hw_advanced(tp)
    return ErrorCode.NONE, partition.log_end_offset


def check_idempotent(
    broker: Broker, partition: Partition, headers: list[BatchHeader]
) -> tuple[int, BatchMetadata | None]:
    """An idempotent producer's batch: (error, None), (0, the original if a retry)."""
    header = headers[0]
    if len(headers) > 1:
        # Kafka accepts exactly one batch per partition from Produce v3 on.
        return ErrorCode.INVALID_RECORD, None
    if header.is_transactional:
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None
    error = broker.producer_ids.check(header.producer_id, header.producer_epoch)
    if error:
        return error, None
    return partition.producers.check(header)


async def fetch(broker: Broker, header: RequestHeader, request: FetchRequest) -> bytes:
    targets: list[FetchTarget] = []
    for topic, partitions in request.topics:
        for fp in partitions:
            partition = broker.partitions.get(TopicPartition(topic, fp.partition))
            if partition is not None:
                targets.append(FetchTarget(partition, fp.fetch_offset))
    if targets and request.max_wait_ms > 0 and request.min_bytes > 0:
        op = DelayedFetch(
            request.max_wait_ms / 1000,
            targets,
            request.min_bytes,
            lambda p: p.high_watermark,
        )
        outcome = await broker.fetch_purgatory.watch(op, first_record(targets))
        if outcome is ap.Outcome.CANCELLED:
            raise CloseConnection
    # Read after the wait, as Kafka's DelayedFetch.onComplete does: the answer
    # reflects the log at completion (or expiry) time.
    budget = request.max_bytes
    first = True
    topics: list[tuple[str, list[FetchResponsePartition]]] = []
    for topic, partitions in request.topics:
        answers: list[FetchResponsePartition] = []
        for fp in partitions:
            partition = broker.partitions.get(TopicPartition(topic, fp.partition))
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
                    FetchResponsePartition(fp.partition, ErrorCode.OFFSET_OUT_OF_RANGE, hw, b"", 0)
                )
                continue
            data = log.read(fp.fetch_offset, hw, min(fp.max_bytes, max(budget, 0)), min_one=first)
            if data:
                first = False
                budget -= len(data)
            answers.append(FetchResponsePartition(fp.partition, ErrorCode.NONE, hw, data, 0))
        topics.append((topic, answers))
    writer = Writer()
    encode_fetch(writer, header.api_version, topics)
    return broker._frame(header, writer)


def list_offsets(
    broker: Broker,
    writer: Writer,
    version: int,
    request_topics: list[tuple[str, list[tuple[int, int]]]],
) -> None:
    topics: list[tuple[str, list[ListOffsetsPartitionResult]]] = []
    for topic, partitions in request_topics:
        answers: list[ListOffsetsPartitionResult] = []
        for index, timestamp in partitions:
            partition = broker.partitions.get(TopicPartition(topic, index))
            if partition is None:
                answers.append(
                    ListOffsetsPartitionResult(index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)
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


def first_record(targets: list[FetchTarget]) -> dict[TopicPartition, int]:
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
