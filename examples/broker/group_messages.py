"""The consumer-group request and response layouts: FindCoordinator, JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, OffsetCommit and OffsetFetch.

Classic versions only, before static membership (KIP-345) and KIP-394's
MEMBER_ID_REQUIRED (see :mod:`examples.broker.messages` for the versions
advertised and the conventions: ``decode_*(reader, version)``, ``encode_*(writer,
version, ...)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .codec import DecodeError, Reader, Writer
from .messages import ErrorCode

__all__ = [
    "FindCoordinatorRequest",
    "HeartbeatRequest",
    "JoinGroupRequest",
    "JoinGroupResult",
    "OffsetCommitRequest",
    "OffsetFetchPartition",
    "OffsetFetchRequest",
    "SyncGroupRequest",
    "decode_find_coordinator",
    "decode_heartbeat",
    "decode_join_group",
    "decode_leave_group",
    "decode_offset_commit",
    "decode_offset_fetch",
    "decode_sync_group",
    "encode_error_only",
    "encode_find_coordinator",
    "encode_join_group",
    "encode_offset_commit",
    "encode_offset_fetch",
    "encode_sync_group",
]


@dataclass(slots=True)
class FindCoordinatorRequest:
    """FindCoordinator request v0-v1: the key (a group id) and, from v1, its type."""

    key: str
    key_type: int


def decode_find_coordinator(reader: Reader, version: int) -> FindCoordinatorRequest:
    """FindCoordinator request v0-v1 (key type 0 = group, 1 = transaction)."""
    key = reader.string()
    key_type = reader.int8() if version >= 1 else 0
    return FindCoordinatorRequest(key, key_type)


def encode_find_coordinator(
    writer: Writer, version: int, error_code: int, node_id: int, host: str, port: int
) -> None:
    """FindCoordinator response v0-v1."""
    if version >= 1:
        writer.int32(0)  # throttle_time_ms
    writer.int16(error_code)
    if version >= 1:
        writer.nullable_string(None)  # error_message
    writer.int32(node_id).string(host).int32(port)


@dataclass(slots=True)
class JoinGroupRequest:
    """JoinGroup request v0-v2: ``protocols`` is [(name, metadata)] in preference order."""

    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    member_id: str
    protocol_type: str
    protocols: list[tuple[str, bytes]]


def decode_join_group(reader: Reader, version: int) -> JoinGroupRequest:
    """JoinGroup request v0-v2 (v1 added the rebalance timeout; v0 uses the session timeout)."""
    group_id = reader.string()
    session_timeout = reader.int32()
    rebalance_timeout = reader.int32() if version >= 1 else session_timeout
    member_id = reader.string()
    protocol_type = reader.string()

    def protocol(r: Reader) -> tuple[str, bytes]:
        name = r.string()
        metadata = r.nullable_bytes()
        return name, b"" if metadata is None else metadata

    return JoinGroupRequest(
        group_id,
        session_timeout,
        rebalance_timeout,
        member_id,
        protocol_type,
        reader.array(protocol, 6),
    )


@dataclass(slots=True)
class JoinGroupResult:
    """A JoinGroup answer; ``members`` (id, metadata) is filled for the leader only."""

    error_code: int
    generation_id: int = -1
    protocol_name: str = ""
    leader_id: str = ""
    member_id: str = ""
    members: list[tuple[str, bytes]] = field(default_factory=list)


def encode_join_group(writer: Writer, version: int, result: JoinGroupResult) -> None:
    """JoinGroup response v0-v2 (v2 added throttle_time_ms)."""
    if version >= 2:
        writer.int32(0)  # throttle_time_ms
    writer.int16(result.error_code).int32(result.generation_id)
    writer.string(result.protocol_name).string(result.leader_id).string(result.member_id)

    def member(w: Writer, item: tuple[str, bytes]) -> None:
        w.string(item[0]).nullable_bytes(item[1])

    writer.array(result.members, member)


@dataclass(slots=True)
class SyncGroupRequest:
    """SyncGroup request v0-v1: the leader sends every member's assignment, followers none."""

    group_id: str
    generation_id: int
    member_id: str
    assignments: list[tuple[str, bytes]]


def decode_sync_group(reader: Reader, version: int) -> SyncGroupRequest:
    """SyncGroup request v0-v1 (the same layout)."""
    group_id = reader.string()
    generation_id = reader.int32()
    member_id = reader.string()

    def assignment(r: Reader) -> tuple[str, bytes]:
        member = r.string()
        data = r.nullable_bytes()
        return member, b"" if data is None else data

    return SyncGroupRequest(group_id, generation_id, member_id, reader.array(assignment, 6))


def encode_sync_group(writer: Writer, version: int, error_code: int, assignment: bytes) -> None:
    """SyncGroup response v0-v1 (v1 added throttle_time_ms)."""
    if version >= 1:
        writer.int32(0)  # throttle_time_ms
    writer.int16(error_code).nullable_bytes(assignment)


@dataclass(slots=True)
class HeartbeatRequest:
    """Heartbeat request v0-v1."""

    group_id: str
    generation_id: int
    member_id: str


def decode_heartbeat(reader: Reader, version: int) -> HeartbeatRequest:
    """Heartbeat request v0-v1 (the same layout)."""
    return HeartbeatRequest(reader.string(), reader.int32(), reader.string())


def decode_leave_group(reader: Reader, version: int) -> tuple[str, str]:
    """LeaveGroup request v0-v1: (group id, member id)."""
    return reader.string(), reader.string()


def encode_error_only(writer: Writer, version: int, error_code: int) -> None:
    """Heartbeat or LeaveGroup response v0-v1 (v1 added throttle_time_ms)."""
    if version >= 1:
        writer.int32(0)  # throttle_time_ms
    writer.int16(error_code)


@dataclass(slots=True)
class OffsetCommitRequest:
    """OffsetCommit request v2-v3: per topic, [(partition, offset, metadata)]."""

    group_id: str
    generation_id: int
    member_id: str
    retention_time_ms: int
    topics: list[tuple[str, list[tuple[int, int, str | None]]]]


def decode_offset_commit(reader: Reader, version: int) -> OffsetCommitRequest:
    """OffsetCommit request v2-v3 (the same layout)."""
    group_id = reader.string()
    generation_id = reader.int32()
    member_id = reader.string()
    retention = reader.int64()

    def partition(r: Reader) -> tuple[int, int, str | None]:
        return r.int32(), r.int64(), r.nullable_string()

    def topic(r: Reader) -> tuple[str, list[tuple[int, int, str | None]]]:
        return r.string(), r.array(partition, 14)

    return OffsetCommitRequest(
        group_id, generation_id, member_id, retention, reader.array(topic, 6)
    )


def encode_offset_commit(
    writer: Writer, version: int, topics: list[tuple[str, list[tuple[int, int]]]]
) -> None:
    """OffsetCommit response v2-v3: per topic, [(partition, error code)]."""
    if version >= 3:
        writer.int32(0)  # throttle_time_ms

    def partition(w: Writer, item: tuple[int, int]) -> None:
        w.int32(item[0]).int16(item[1])

    def topic(w: Writer, item: tuple[str, list[tuple[int, int]]]) -> None:
        w.string(item[0]).array(item[1], partition)

    writer.array(topics, topic)


@dataclass(slots=True)
class OffsetFetchRequest:
    """OffsetFetch request v1-v3: ``topics`` None (v2+) means every committed partition."""

    group_id: str
    topics: list[tuple[str, list[int]]] | None


def decode_offset_fetch(reader: Reader, version: int) -> OffsetFetchRequest:
    """OffsetFetch request v1-v3 (null topics allowed from v2, KIP-88)."""
    group_id = reader.string()

    def topic(r: Reader) -> tuple[str, list[int]]:
        return r.string(), r.array(Reader.int32, 4)

    topics = reader.nullable_array(topic, 6)
    if topics is None and version < 2:
        raise DecodeError("OffsetFetch v1 needs a topic list")
    return OffsetFetchRequest(group_id, topics)


@dataclass(slots=True)
class OffsetFetchPartition:
    """One partition's committed offset (-1 if none) with its metadata and error."""

    partition: int
    offset: int
    metadata: str | None
    error_code: int = ErrorCode.NONE


def encode_offset_fetch(
    writer: Writer,
    version: int,
    error_code: int,
    topics: list[tuple[str, list[OffsetFetchPartition]]],
) -> None:
    """OffsetFetch response v1-v3 (v2 added a top-level error, v3 throttle_time_ms)."""
    if version >= 3:
        writer.int32(0)  # throttle_time_ms

    def partition(w: Writer, p: OffsetFetchPartition) -> None:
        w.int32(p.partition).int64(p.offset).nullable_string(p.metadata).int16(p.error_code)

    def topic(w: Writer, item: tuple[str, list[OffsetFetchPartition]]) -> None:
        w.string(item[0]).array(item[1], partition)

    writer.array(topics, topic)
    if version >= 2:
        writer.int16(error_code)
