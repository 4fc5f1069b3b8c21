"""The broker's consumer-group and administration requests (Kafka APIs): decode, act, encode.

Group APIs go to the coordinator; CreateTopics, DeleteTopics, the group
listings, DescribeConfigs and InitProducerId are answered here. Functions of
the :class:`~examples.broker.server.Broker` they serve.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

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
from .codec import Reader, Writer
from .config import (
    MAX_PARTITIONS_PER_TOPIC,
    TOPIC_NAME,
    max_message_bytes_entry,
    min_insync_replicas_entry,
)
from .group_messages import (
    decode_find_coordinator,
    decode_heartbeat,
    decode_join_group,
    decode_leave_group,
    decode_offset_commit,
    decode_offset_fetch,
    decode_sync_group,
    encode_error_only,
    encode_find_coordinator,
    encode_join_group,
    encode_offset_commit,
    encode_offset_fetch,
    encode_sync_group,
)
from .messages import (
    ApiKey,
    ErrorCode,
    RequestHeader,
    check_fully_consumed,
)
from .partition import LEADER_ID, TopicPartition

if TYPE_CHECKING:
    from .server import Broker, _Connection

__all__ = ["ADMIN_APIS", "GROUP_APIS", "admin_request", "group_request"]

#: The APIs answered here: consumer groups (the coordinator's), and administration.
GROUP_APIS = frozenset(
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


ADMIN_APIS = frozenset(
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


async def group_request(
    broker: Broker, conn: _Connection, header: RequestHeader, reader: Reader
) -> bytes:
    """The consumer-group APIs: decode, ask the coordinator, encode."""
    api, version = header.api_key, header.api_version
    coordinator = broker.coordinator
    writer = Writer()
    if api == ApiKey.FIND_COORDINATOR:
        find = decode_find_coordinator(reader, version)
        check_fully_consumed(reader, "FindCoordinator")
        # Group keys only: no transactions here. Every group lives on this node.
        if find.key_type == 0:
            error = ErrorCode.COORDINATOR_NOT_AVAILABLE if broker._closing else ErrorCode.NONE
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
            broker.advertised_host if ok else "",
            broker.port if ok else -1,
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
    return broker._frame(header, writer)


def admin_request(broker: Broker, header: RequestHeader, reader: Reader) -> bytes:
    """Topic and group administration, DescribeConfigs and InitProducerId."""
    api, version = header.api_key, header.api_version
    writer = Writer()
    if api == ApiKey.CREATE_TOPICS:
        create = decode_create_topics(reader, version)
        check_fully_consumed(reader, "CreateTopics")
        results = create_topics(broker, create.topics, create.validate_only)
        encode_create_topics(writer, version, results)
    elif api == ApiKey.DELETE_TOPICS:
        names, _timeout_ms = decode_delete_topics(reader, version)
        check_fully_consumed(reader, "DeleteTopics")
        encode_delete_topics(writer, version, delete_topics(broker, names))
    elif api == ApiKey.DESCRIBE_GROUPS:
        group_ids = decode_describe_groups(reader, version)
        check_fully_consumed(reader, "DescribeGroups")
        encode_describe_groups(writer, version, broker.coordinator.describe_groups(group_ids))
    elif api == ApiKey.LIST_GROUPS:
        states, types = decode_list_groups(reader, version)
        check_fully_consumed(reader, "ListGroups")
        error, groups = broker.coordinator.list_groups(states, types)
        encode_list_groups(writer, version, error, groups)
    elif api == ApiKey.DELETE_GROUPS:
        group_ids = decode_delete_groups(reader, version)
        check_fully_consumed(reader, "DeleteGroups")
        encode_delete_groups(writer, version, broker.coordinator.delete_groups(group_ids))
    elif api == ApiKey.DESCRIBE_CONFIGS:
        resources = decode_describe_configs(reader, version)
        check_fully_consumed(reader, "DescribeConfigs")
        encode_describe_configs(writer, version, [describe_configs(broker, r) for r in resources])
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
            producer_id, epoch = broker.producer_ids.init_producer(
                init.producer_id, init.producer_epoch
            )
            broker.log.info("broker.producer_id_issued", producer_id=producer_id, epoch=epoch)
            encode_init_producer_id(writer, version, ErrorCode.NONE, producer_id, epoch)
    return broker._frame(header, writer)


def create_topics(
    broker: Broker, topics: list[CreatableTopic], validate_only: bool
) -> list[CreatableTopicResult]:
    """CreateTopics: validate each topic as Kafka does, then create it (unless validating)."""
    counts = Counter(topic.name for topic in topics)
    all_replicas = len(broker.followers) + 1
    results: list[CreatableTopicResult] = []
    for topic in topics:
        name = topic.name
        partitions = (
            broker.config.default_partitions if topic.num_partitions == -1 else topic.num_partitions
        )
        replication = all_replicas if topic.replication_factor == -1 else topic.replication_factor
        error, message = ErrorCode.NONE, None
        if counts[name] > 1:
            error, message = (
                ErrorCode.INVALID_REQUEST,
                "topic named more than once in the request",
            )
        elif not TOPIC_NAME.match(name) or name in (".", ".."):
            error, message = ErrorCode.INVALID_TOPIC_EXCEPTION, f"invalid topic name {name!r}"
        elif name in broker.topics:
            error, message = ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
        elif topic.assignments:
            error = ErrorCode.INVALID_REPLICA_ASSIGNMENT
            message = "manual replica assignment is not supported: give partitions and replication"
        elif not 1 <= partitions <= MAX_PARTITIONS_PER_TOPIC:
            error = ErrorCode.INVALID_PARTITIONS
            message = f"partitions must be in [1, {MAX_PARTITIONS_PER_TOPIC}], got {partitions}"
        elif not 1 <= replication <= all_replicas:
            error = ErrorCode.INVALID_REPLICATION_FACTOR
            message = (
                f"replication factor must be in [1, {all_replicas}] "
                f"(this broker and its {len(broker.followers)} followers), got {replication}"
            )
        elif topic.configs:
            error = ErrorCode.INVALID_CONFIG
            message = "per-topic configs are not supported: every topic uses the broker's"
        result = CreatableTopicResult(name, error, message)
        if error == ErrorCode.NONE:
            if not validate_only:
                broker.create_topic(name, partitions, replication)
                result.topic_id = broker.topic_ids[name]
            result.num_partitions = partitions
            result.replication_factor = replication
            result.configs = topic_configs(broker)
        else:
            broker.log.info("broker.create_topic_refused", topic=name, error=error, reason=message)
        results.append(result)
    return results


def delete_topics(broker: Broker, names: list[str]) -> list[tuple[str, int, str | None]]:
    """DeleteTopics: per name (name, error, message)."""
    counts = Counter(names)
    results: list[tuple[str, int, str | None]] = []
    for name in names:
        if counts[name] > 1:
            results.append((name, ErrorCode.INVALID_REQUEST, "topic named more than once"))
        elif broker.delete_topic(name):
            results.append((name, ErrorCode.NONE, None))
        else:
            results.append((name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such topic"))
    return results


def topic_configs(broker: Broker) -> list[ConfigEntry]:
    """The settings every topic has (no per-topic overrides: the broker's)."""
    cfg = broker.config
    return [
        min_insync_replicas_entry(cfg),
        max_message_bytes_entry("max.message.bytes", cfg),
        ConfigEntry(
            "message.timestamp.type",
            "CreateTime",
            ConfigType.STRING,
            "Timestamps are the producer's.",
        ),
        ConfigEntry("retention.ms", "-1", ConfigType.LONG, "Logs are kept in memory, unbounded."),
        ConfigEntry("retention.bytes", "-1", ConfigType.LONG, "No size limit either."),
    ]


def broker_configs(broker: Broker) -> list[ConfigEntry]:
    """The broker's settings, under Kafka's names (durations in ms)."""
    cfg = broker.config

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
            str(len(broker.followers) + 1),
            ConfigType.INT,
            "Replicas of a topic: this broker and its in-process followers.",
        ),
        min_insync_replicas_entry(cfg),
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
        max_message_bytes_entry("message.max.bytes", cfg),
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


def describe_configs(broker: Broker, resource: ConfigResource) -> DescribeConfigsResult:
    """DescribeConfigs for one resource: a topic, or this broker ("0" or "")."""
    if resource.resource_type == ResourceType.TOPIC:
        if resource.name not in broker.topics:
            return DescribeConfigsResult(
                resource, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such topic", []
            )
        entries = topic_configs(broker)
    elif resource.resource_type == ResourceType.BROKER:
        if resource.name not in ("", str(LEADER_ID)):
            return DescribeConfigsResult(
                resource,
                ErrorCode.INVALID_REQUEST,
                f"unexpected broker id {resource.name!r}, expected {LEADER_ID} or empty",
                [],
            )
        entries = broker_configs(broker)
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
