"""The request and response layouts this broker speaks, per API and version.

Field layouts follow the Kafka protocol's message definitions
(``clients/src/main/resources/common/message/*.json`` in apache/kafka). Each
request has a ``decode_*(reader, version)`` and each response an
``encode_*(writer, version, ...)``; version differences are explicit ``if``s so
one can read which version added what.

Versions advertised (:data:`SUPPORTED_VERSIONS`): only record-batch (magic v2)
versions of Produce/Fetch, all non-flexible, which is what aiokafka 0.14 picks;
plus ApiVersions v0-v3, whose v3 is flexible (compact strings, tagged fields,
request header v2) for clients that send it. Clients that need flexible
Produce/Fetch/Metadata (v9+/v12+/v9+) get older versions from the negotiation.
The consumer-group APIs (FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit, OffsetFetch) are advertised only in the classic
versions before static membership (KIP-345) and KIP-394's MEMBER_ID_REQUIRED,
which is all aiokafka 0.14 needs. The administration APIs and InitProducerId
(layouts in :mod:`examples.broker.admin_messages`) go up to flexible versions.
The consumer-group layouts are in :mod:`examples.broker.group_messages`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .codec import DecodeError, Reader, Writer

__all__ = [
    "API_NAMES",
    "SUPPORTED_VERSIONS",
    "ApiKey",
    "ErrorCode",
    "FetchPartition",
    "FetchRequest",
    "FetchResponsePartition",
    "ListOffsetsPartitionResult",
    "ListOffsetsRequest",
    "MetadataPartition",
    "MetadataRequest",
    "MetadataTopic",
    "ProducePartitionResult",
    "ProduceRequest",
    "RequestHeader",
    "decode_request_header",
    "is_flexible",
]


class ApiKey:
    """API keys (the first field of every request header)."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    INIT_PRODUCER_ID = 22
    DESCRIBE_CONFIGS = 32
    DELETE_GROUPS = 42


API_NAMES = {
    ApiKey.PRODUCE: "Produce",
    ApiKey.FETCH: "Fetch",
    ApiKey.LIST_OFFSETS: "ListOffsets",
    ApiKey.METADATA: "Metadata",
    ApiKey.OFFSET_COMMIT: "OffsetCommit",
    ApiKey.OFFSET_FETCH: "OffsetFetch",
    ApiKey.FIND_COORDINATOR: "FindCoordinator",
    ApiKey.JOIN_GROUP: "JoinGroup",
    ApiKey.HEARTBEAT: "Heartbeat",
    ApiKey.LEAVE_GROUP: "LeaveGroup",
    ApiKey.SYNC_GROUP: "SyncGroup",
    ApiKey.DESCRIBE_GROUPS: "DescribeGroups",
    ApiKey.LIST_GROUPS: "ListGroups",
    ApiKey.API_VERSIONS: "ApiVersions",
    ApiKey.CREATE_TOPICS: "CreateTopics",
    ApiKey.DELETE_TOPICS: "DeleteTopics",
    ApiKey.INIT_PRODUCER_ID: "InitProducerId",
    ApiKey.DESCRIBE_CONFIGS: "DescribeConfigs",
    ApiKey.DELETE_GROUPS: "DeleteGroups",
}

#: (min, max) version per API key, as advertised in ApiVersions.
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 7),
    ApiKey.FETCH: (4, 11),
    ApiKey.LIST_OFFSETS: (1, 3),
    ApiKey.METADATA: (1, 5),
    ApiKey.OFFSET_COMMIT: (2, 3),
    ApiKey.OFFSET_FETCH: (1, 3),
    ApiKey.FIND_COORDINATOR: (0, 1),
    ApiKey.JOIN_GROUP: (0, 2),
    ApiKey.HEARTBEAT: (0, 1),
    ApiKey.LEAVE_GROUP: (0, 1),
    ApiKey.SYNC_GROUP: (0, 1),
    ApiKey.DESCRIBE_GROUPS: (0, 5),
    ApiKey.LIST_GROUPS: (0, 5),
    ApiKey.API_VERSIONS: (0, 3),
    ApiKey.CREATE_TOPICS: (0, 7),
    ApiKey.DELETE_TOPICS: (0, 5),
    ApiKey.INIT_PRODUCER_ID: (0, 4),
    ApiKey.DESCRIBE_CONFIGS: (0, 4),
    ApiKey.DELETE_GROUPS: (0, 2),
}

# First flexible version of each API (request header v2, response header v1 except
# ApiVersions, compact types, tagged fields).
_FIRST_FLEXIBLE = {
    ApiKey.PRODUCE: 9,
    ApiKey.FETCH: 12,
    ApiKey.LIST_OFFSETS: 6,
    ApiKey.METADATA: 9,
    ApiKey.OFFSET_COMMIT: 8,
    ApiKey.OFFSET_FETCH: 6,
    ApiKey.FIND_COORDINATOR: 3,
    ApiKey.JOIN_GROUP: 6,
    ApiKey.HEARTBEAT: 4,
    ApiKey.LEAVE_GROUP: 4,
    ApiKey.SYNC_GROUP: 4,
    ApiKey.DESCRIBE_GROUPS: 5,
    ApiKey.LIST_GROUPS: 3,
    ApiKey.API_VERSIONS: 3,
    ApiKey.CREATE_TOPICS: 5,
    ApiKey.DELETE_TOPICS: 4,
    ApiKey.INIT_PRODUCER_ID: 2,
    ApiKey.DESCRIBE_CONFIGS: 4,
    ApiKey.DELETE_GROUPS: 2,
}


def is_flexible(api_key: int, version: int) -> bool:
    """True if this version of this API uses the flexible (tagged-field) encoding."""
    first = _FIRST_FLEXIBLE.get(api_key)
    return first is not None and version >= first


class ErrorCode:
    """The Kafka error codes this broker answers with."""

    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    COORDINATOR_NOT_AVAILABLE = 15
    INVALID_TOPIC_EXCEPTION = 17
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    INVALID_PRODUCER_EPOCH = 47
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    UNKNOWN_PRODUCER_ID = 59
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    INVALID_RECORD = 87


# -- request header --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """Request header v1 (or v2 for flexible versions, which adds tagged fields)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def decode_request_header(reader: Reader) -> RequestHeader:
    """Decode a request header; v2 (tagged fields) when the API version is flexible.

    ``client_id`` stays a classic nullable string even in header v2.
    """
    api_key = reader.int16()
    api_version = reader.int16()
    correlation_id = reader.int32()
    client_id = reader.nullable_string()
    if is_flexible(api_key, api_version):
        reader.tagged_fields()
    return RequestHeader(api_key, api_version, correlation_id, client_id)


def encode_response_header(writer: Writer, header: RequestHeader) -> None:
    """Response header v0, or v1 (tagged fields) for flexible versions.

    ApiVersions always answers with header v0, so that a client that does not know
    the broker's versions yet can parse the reply.
    """
    writer.int32(header.correlation_id)
    if header.api_key != ApiKey.API_VERSIONS and is_flexible(header.api_key, header.api_version):
        writer.tagged_fields()


# -- ApiVersions ------------------------------------------------------------------------


def decode_api_versions(reader: Reader, version: int) -> None:
    """ApiVersions request: empty before v3; v3 adds client software name/version."""
    if version >= 3:
        reader.compact_string()
        reader.compact_string()
        reader.tagged_fields()


def encode_api_versions(
    writer: Writer, version: int, error_code: int, versions: dict[int, tuple[int, int]]
) -> None:
    """ApiVersions response (v0-v3)."""
    entries = sorted((key, lo, hi) for key, (lo, hi) in versions.items())
    writer.int16(error_code)

    def entry(w: Writer, item: tuple[int, int, int]) -> None:
        w.int16(item[0]).int16(item[1]).int16(item[2])
        if version >= 3:
            w.tagged_fields()

    if version >= 3:
        writer.compact_array(entries, entry)
    else:
        writer.array(entries, entry)
    if version >= 1:
        writer.int32(0)  # throttle_time_ms
    if version >= 3:
        writer.tagged_fields()


# -- Metadata ---------------------------------------------------------------------------


@dataclass(slots=True)
class MetadataRequest:
    """Metadata request (v1-v5): ``topics`` None means all topics."""

    topics: list[str] | None
    allow_auto_topic_creation: bool


def decode_metadata(reader: Reader, version: int) -> MetadataRequest:
    """Metadata request v1-v5."""
    topics = reader.nullable_array(Reader.string, 2)
    allow = reader.boolean() if version >= 4 else True
    return MetadataRequest(topics, allow)


@dataclass(slots=True)
class MetadataPartition:
    """One partition of a Metadata response."""

    error_code: int
    partition: int
    leader: int
    replicas: list[int]
    isr: list[int]
    offline_replicas: list[int]


@dataclass(slots=True)
class MetadataTopic:
    """One topic of a Metadata response."""

    error_code: int
    name: str
    partitions: list[MetadataPartition] = field(default_factory=list)


def encode_metadata(
    writer: Writer,
    version: int,
    *,
    node_id: int,
    host: str,
    port: int,
    cluster_id: str,
    topics: list[MetadataTopic],
) -> None:
    """Metadata response v1-v5 (one broker, which is also the controller)."""
    if version >= 3:
        writer.int32(0)  # throttle_time_ms
    writer.int32(1)  # brokers
    writer.int32(node_id).string(host).int32(port).nullable_string(None)  # rack
    if version >= 2:
        writer.nullable_string(cluster_id)
    writer.int32(node_id)  # controller_id

    def int_item(w: Writer, value: int) -> None:
        w.int32(value)

    def partition(w: Writer, p: MetadataPartition) -> None:
        w.int16(p.error_code).int32(p.partition).int32(p.leader)
        w.array(p.replicas, int_item).array(p.isr, int_item)
        if version >= 5:
            w.array(p.offline_replicas, int_item)

    def topic(w: Writer, t: MetadataTopic) -> None:
        w.int16(t.error_code).string(t.name).boolean(False)  # is_internal
        w.array(t.partitions, partition)

    writer.array(topics, topic)


# -- Produce ------------------------------------------------------------------------------


@dataclass(slots=True)
class ProduceRequest:
    """Produce request v3-v7: records per topic-partition, as raw bytes."""

    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: list[tuple[str, list[tuple[int, bytes | None]]]]


def decode_produce(reader: Reader, version: int) -> ProduceRequest:
    """Produce request v3-v7 (the same layout)."""
    transactional_id = reader.nullable_string()
    acks = reader.int16()
    timeout_ms = reader.int32()

    def partition(r: Reader) -> tuple[int, bytes | None]:
        return r.int32(), r.nullable_bytes()

    def topic(r: Reader) -> tuple[str, list[tuple[int, bytes | None]]]:
        return r.string(), r.array(partition, 8)

    return ProduceRequest(transactional_id, acks, timeout_ms, reader.array(topic, 6))


@dataclass(slots=True)
class ProducePartitionResult:
    """One partition's answer to a produce."""

    error_code: int = ErrorCode.NONE
    base_offset: int = -1
    log_start_offset: int = -1


def encode_produce(
    writer: Writer, version: int, results: dict[str, dict[int, ProducePartitionResult]]
) -> None:
    """Produce response v3-v7."""

    def partition(w: Writer, item: tuple[int, ProducePartitionResult]) -> None:
        index, result = item
        w.int32(index).int16(result.error_code).int64(result.base_offset)
        w.int64(-1)  # log_append_time: -1 means the topic uses CreateTime
        if version >= 5:
            w.int64(result.log_start_offset)

    def topic(w: Writer, item: tuple[str, dict[int, ProducePartitionResult]]) -> None:
        w.string(item[0]).array(list(item[1].items()), partition)

    writer.array(list(results.items()), topic)
    writer.int32(0)  # throttle_time_ms


# -- Fetch --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchPartition:
    """One partition of a fetch request."""

    partition: int
    fetch_offset: int
    max_bytes: int


@dataclass(slots=True)
class FetchRequest:
    """Fetch request v4-v11 (sessions, leader epochs and rack are read and ignored)."""

    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    session_id: int
    topics: list[tuple[str, list[FetchPartition]]]


def decode_fetch(reader: Reader, version: int) -> FetchRequest:
    """Fetch request v4-v11."""
    replica_id = reader.int32()
    max_wait_ms = reader.int32()
    min_bytes = reader.int32()
    max_bytes = reader.int32()
    isolation_level = reader.int8()
    session_id = 0
    if version >= 7:
        session_id = reader.int32()
        reader.int32()  # session_epoch

    def partition(r: Reader) -> FetchPartition:
        index = r.int32()
        if version >= 9:
            r.int32()  # current_leader_epoch
        fetch_offset = r.int64()
        if version >= 5:
            r.int64()  # log_start_offset (followers only)
        return FetchPartition(index, fetch_offset, r.int32())

    def topic(r: Reader) -> tuple[str, list[FetchPartition]]:
        return r.string(), r.array(partition, 16)

    topics = reader.array(topic, 6)
    if version >= 7:

        def forgotten(r: Reader) -> tuple[str, list[int]]:
            return r.string(), r.array(Reader.int32, 4)

        reader.array(forgotten, 6)
    if version >= 11:
        reader.string()  # rack_id
    return FetchRequest(
        replica_id, max_wait_ms, min_bytes, max_bytes, isolation_level, session_id, topics
    )


@dataclass(slots=True)
class FetchResponsePartition:
    """One partition's answer to a fetch."""

    partition: int
    error_code: int
    high_watermark: int
    records: bytes
    log_start_offset: int = 0


def encode_fetch(
    writer: Writer, version: int, topics: list[tuple[str, list[FetchResponsePartition]]]
) -> None:
    """Fetch response v4-v11 (no fetch sessions: session_id 0, full responses)."""
    writer.int32(0)  # throttle_time_ms
    if version >= 7:
        writer.int16(ErrorCode.NONE).int32(0)  # error_code, session_id

    def partition(w: Writer, p: FetchResponsePartition) -> None:
        w.int32(p.partition).int16(p.error_code).int64(p.high_watermark)
        w.int64(p.high_watermark)  # last_stable_offset: no transactions, so the HW
        if version >= 5:
            w.int64(p.log_start_offset)
        w.int32(0)  # aborted_transactions: empty array
        if version >= 11:
            w.int32(-1)  # preferred_read_replica: none, read from the leader
        w.nullable_bytes(p.records)

    def topic(w: Writer, item: tuple[str, list[FetchResponsePartition]]) -> None:
        w.string(item[0]).array(item[1], partition)

    writer.array(topics, topic)


# -- ListOffsets ----------------------------------------------------------------------------


@dataclass(slots=True)
class ListOffsetsRequest:
    """ListOffsets request v1-v3: a timestamp per partition (-1 latest, -2 earliest)."""

    replica_id: int
    isolation_level: int
    topics: list[tuple[str, list[tuple[int, int]]]]


def decode_list_offsets(reader: Reader, version: int) -> ListOffsetsRequest:
    """ListOffsets request v1-v3."""
    replica_id = reader.int32()
    isolation_level = reader.int8() if version >= 2 else 0

    def partition(r: Reader) -> tuple[int, int]:
        return r.int32(), r.int64()

    def topic(r: Reader) -> tuple[str, list[tuple[int, int]]]:
        return r.string(), r.array(partition, 12)

    return ListOffsetsRequest(replica_id, isolation_level, reader.array(topic, 6))


@dataclass(slots=True)
class ListOffsetsPartitionResult:
    """One partition's answer to ListOffsets."""

    partition: int
    error_code: int
    timestamp: int
    offset: int


def encode_list_offsets(
    writer: Writer, version: int, topics: list[tuple[str, list[ListOffsetsPartitionResult]]]
) -> None:
    """ListOffsets response v1-v3."""
    if version >= 2:
        writer.int32(0)  # throttle_time_ms

    def partition(w: Writer, p: ListOffsetsPartitionResult) -> None:
        w.int32(p.partition).int16(p.error_code).int64(p.timestamp).int64(p.offset)

    def topic(w: Writer, item: tuple[str, list[ListOffsetsPartitionResult]]) -> None:
        w.string(item[0]).array(item[1], partition)

    writer.array(topics, topic)


def check_fully_consumed(reader: Reader, what: str) -> None:
    """Raise DecodeError if a request body has bytes left over (a sign of a wrong layout)."""
    if reader.remaining:
        raise DecodeError(f"{reader.remaining} unexpected trailing bytes after {what}")
