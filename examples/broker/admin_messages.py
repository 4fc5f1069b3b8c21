"""Layouts of the administration APIs and InitProducerId, classic and flexible.

The same conventions as :mod:`examples.broker.messages` (field layouts from the
Kafka protocol's message definitions, one explicit ``if version >= n`` per field
a version added). These APIs are advertised up to versions that are flexible
(KIP-482: compact strings and arrays, a tagged-field block after every struct),
because current clients pick those; :class:`_Codec` switches every string, array
and tagged-field block between the classic and compact forms, so each layout is
written once for both.

=================  ========  ==============  ==========================================
API                 key       versions        first flexible
=================  ========  ==============  ==========================================
CreateTopics        19        0-7             5 (v7 answers the topic id)
DeleteTopics        20        0-5             4 (v5 adds an error message)
DescribeGroups      15        0-5             5 (v3 authorized operations, v4 instance id)
ListGroups          16        0-5             3 (v4 state filter, v5 type filter)
DeleteGroups        42        0-2             2
DescribeConfigs     32        0-4             4 (v1 synonyms and source, v3 type and doc)
InitProducerId      22        0-4             2 (v3 sends the current id and epoch)
=================  ========  ==============  ==========================================
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from .codec import Reader, Writer

__all__ = [
    "ConfigEntry",
    "ConfigResource",
    "ConfigSource",
    "ConfigType",
    "CreatableTopic",
    "CreatableTopicResult",
    "CreateTopicsRequest",
    "DescribeConfigsResult",
    "DescribedGroup",
    "DescribedMember",
    "InitProducerIdRequest",
    "ListedGroup",
    "ResourceType",
]

T = TypeVar("T")

#: DescribeGroups v3+ asks for authorized operations; this broker has no ACLs and
#: answers Kafka's "not requested/unknown" value.
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


class _Codec:
    """Classic or compact encodings of strings, arrays and tagged fields for one version."""

    __slots__ = ("flexible",)

    def __init__(self, flexible: bool) -> None:
        self.flexible = flexible

    # reading
    def string(self, r: Reader) -> str:
        return r.compact_string() if self.flexible else r.string()

    def nullable_string(self, r: Reader) -> str | None:
        return r.compact_nullable_string() if self.flexible else r.nullable_string()

    def array(self, r: Reader, item: Callable[[Reader], T], item_min_size: int = 1) -> list[T]:
        if self.flexible:
            return r.compact_array(item, item_min_size)
        return r.array(item, item_min_size)

    def nullable_array(
        self, r: Reader, item: Callable[[Reader], T], item_min_size: int = 1
    ) -> list[T] | None:
        if self.flexible:
            return r.compact_nullable_array(item, item_min_size)
        return r.nullable_array(item, item_min_size)

    def tags(self, r: Reader) -> None:
        if self.flexible:
            r.tagged_fields()

    # writing
    def write_string(self, w: Writer, value: str | None) -> None:
        if self.flexible:
            w.compact_nullable_string(value)
        else:
            w.nullable_string(value)

    def write_bytes(self, w: Writer, value: bytes) -> None:
        if self.flexible:
            w.compact_nullable_bytes(value)
        else:
            w.nullable_bytes(value)

    def write_array(
        self, w: Writer, items: Sequence[T] | None, item: Callable[[Writer, T], object]
    ) -> None:
        if self.flexible:
            w.compact_array(items, item)
        else:
            w.array(items, item)

    def write_tags(self, w: Writer) -> None:
        if self.flexible:
            w.tagged_fields()


def _codec(version: int, first_flexible: int) -> _Codec:
    return _Codec(version >= first_flexible)


# -- CreateTopics (19) -------------------------------------------------------------------------


@dataclass(slots=True)
class CreatableTopic:
    """One topic of a CreateTopics request (-1 partitions/replication: the broker's default)."""

    name: str
    num_partitions: int
    replication_factor: int
    assignments: list[tuple[int, list[int]]]
    configs: list[tuple[str, str | None]]


@dataclass(slots=True)
class CreateTopicsRequest:
    """CreateTopics request v0-v7."""

    topics: list[CreatableTopic]
    timeout_ms: int
    validate_only: bool


def decode_create_topics(reader: Reader, version: int) -> CreateTopicsRequest:
    """CreateTopics request v0-v7 (v1 added validate_only; v5 is flexible)."""
    c = _codec(version, 5)

    def assignment(r: Reader) -> tuple[int, list[int]]:
        index = r.int32()
        brokers = c.array(r, Reader.int32, 4)
        c.tags(r)
        return index, brokers

    def config(r: Reader) -> tuple[str, str | None]:
        name = c.string(r)
        value = c.nullable_string(r)
        c.tags(r)
        return name, value

    def topic(r: Reader) -> CreatableTopic:
        name = c.string(r)
        partitions = r.int32()
        replication = r.int16()
        assignments = c.array(r, assignment, 5)
        configs = c.array(r, config, 3)
        c.tags(r)
        return CreatableTopic(name, partitions, replication, assignments, configs)

    topics = c.array(reader, topic, 12)
    timeout_ms = reader.int32()
    validate_only = reader.boolean() if version >= 1 else False
    c.tags(reader)
    return CreateTopicsRequest(topics, timeout_ms, validate_only)


@dataclass(slots=True)
class CreatableTopicResult:
    """One topic's answer; from v5 the partitions and replication factor it got."""

    name: str
    error_code: int
    error_message: str | None = None
    topic_id: uuid.UUID | None = None
    num_partitions: int = -1
    replication_factor: int = -1
    configs: list[ConfigEntry] = field(default_factory=list)


def encode_create_topics(writer: Writer, version: int, topics: list[CreatableTopicResult]) -> None:
    """CreateTopics response v0-v7."""
    c = _codec(version, 5)
    if version >= 2:
        writer.int32(0)  # throttle_time_ms

    def config(w: Writer, e: ConfigEntry) -> None:
        c.write_string(w, e.name)
        c.write_string(w, e.value)
        w.boolean(e.read_only).int8(e.source).boolean(False)  # is_sensitive
        c.write_tags(w)

    def topic(w: Writer, t: CreatableTopicResult) -> None:
        c.write_string(w, t.name)
        if version >= 7:
            w.raw((t.topic_id or uuid.UUID(int=0)).bytes)
        w.int16(t.error_code)
        if version >= 1:
            c.write_string(w, t.error_message)
        if version >= 5:
            w.int32(t.num_partitions).int16(t.replication_factor)
            c.write_array(w, t.configs if t.error_code == 0 else None, config)
            c.write_tags(w)

    c.write_array(writer, topics, topic)
    c.write_tags(writer)


# -- DeleteTopics (20) -------------------------------------------------------------------------


def decode_delete_topics(reader: Reader, version: int) -> tuple[list[str], int]:
    """DeleteTopics request v0-v5: (topic names, timeout_ms)."""
    c = _codec(version, 4)
    names = c.array(reader, c.string, 1)
    timeout_ms = reader.int32()
    c.tags(reader)
    return names, timeout_ms


def encode_delete_topics(
    writer: Writer, version: int, results: list[tuple[str, int, str | None]]
) -> None:
    """DeleteTopics response v0-v5: per topic (name, error code, message from v5)."""
    c = _codec(version, 4)
    if version >= 1:
        writer.int32(0)  # throttle_time_ms

    def topic(w: Writer, item: tuple[str, int, str | None]) -> None:
        c.write_string(w, item[0])
        w.int16(item[1])
        if version >= 5:
            c.write_string(w, item[2])
        c.write_tags(w)

    c.write_array(writer, results, topic)
    c.write_tags(writer)


# -- DescribeGroups (15) -----------------------------------------------------------------------


def decode_describe_groups(reader: Reader, version: int) -> list[str]:
    """DescribeGroups request v0-v5: the group ids (v3's include_authorized_operations is read)."""
    c = _codec(version, 5)
    groups = c.array(reader, c.string, 1)
    if version >= 3:
        reader.boolean()  # include_authorized_operations: no ACLs here
    c.tags(reader)
    return groups


@dataclass(slots=True)
class DescribedMember:
    """One member in a DescribeGroups answer."""

    member_id: str
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(slots=True)
class DescribedGroup:
    """One group in a DescribeGroups answer (unknown groups are ``Dead`` with no error)."""

    group_id: str
    error_code: int
    state: str
    protocol_type: str
    protocol: str
    members: list[DescribedMember] = field(default_factory=list)


def encode_describe_groups(writer: Writer, version: int, groups: list[DescribedGroup]) -> None:
    """DescribeGroups response v0-v5."""
    c = _codec(version, 5)
    if version >= 1:
        writer.int32(0)  # throttle_time_ms

    def member(w: Writer, m: DescribedMember) -> None:
        c.write_string(w, m.member_id)
        if version >= 4:
            c.write_string(w, None)  # group_instance_id: no static membership
        c.write_string(w, m.client_id)
        c.write_string(w, m.client_host)
        c.write_bytes(w, m.metadata)
        c.write_bytes(w, m.assignment)
        c.write_tags(w)

    def group(w: Writer, g: DescribedGroup) -> None:
        w.int16(g.error_code)
        for text in (g.group_id, g.state, g.protocol_type, g.protocol):
            c.write_string(w, text)
        c.write_array(w, g.members, member)
        if version >= 3:
            w.int32(AUTHORIZED_OPERATIONS_OMITTED)
        c.write_tags(w)

    c.write_array(writer, groups, group)
    c.write_tags(writer)


# -- ListGroups (16) ---------------------------------------------------------------------------


def decode_list_groups(reader: Reader, version: int) -> tuple[list[str], list[str]]:
    """ListGroups request v0-v5: (state filter from v4, type filter from v5); empty = all."""
    c = _codec(version, 3)
    states: list[str] = []
    types: list[str] = []
    if version >= 4:
        states = c.array(reader, c.string, 1)
    if version >= 5:
        types = c.array(reader, c.string, 1)
    c.tags(reader)
    return states, types


@dataclass(slots=True)
class ListedGroup:
    """One group in a ListGroups answer."""

    group_id: str
    protocol_type: str
    state: str
    group_type: str = "classic"


def encode_list_groups(
    writer: Writer, version: int, error_code: int, groups: list[ListedGroup]
) -> None:
    """ListGroups response v0-v5 (v4 added the state, v5 the group type)."""
    c = _codec(version, 3)
    if version >= 1:
        writer.int32(0)  # throttle_time_ms
    writer.int16(error_code)

    def group(w: Writer, g: ListedGroup) -> None:
        c.write_string(w, g.group_id)
        c.write_string(w, g.protocol_type)
        if version >= 4:
            c.write_string(w, g.state)
        if version >= 5:
            c.write_string(w, g.group_type)
        c.write_tags(w)

    c.write_array(writer, groups, group)
    c.write_tags(writer)


# -- DeleteGroups (42) -------------------------------------------------------------------------


def decode_delete_groups(reader: Reader, version: int) -> list[str]:
    """DeleteGroups request v0-v2: the group ids."""
    c = _codec(version, 2)
    groups = c.array(reader, c.string, 1)
    c.tags(reader)
    return groups


def encode_delete_groups(writer: Writer, version: int, results: list[tuple[str, int]]) -> None:
    """DeleteGroups response v0-v2: per group (id, error code)."""
    c = _codec(version, 2)
    writer.int32(0)  # throttle_time_ms

    def result(w: Writer, item: tuple[str, int]) -> None:
        c.write_string(w, item[0])
        w.int16(item[1])
        c.write_tags(w)

    c.write_array(writer, results, result)
    c.write_tags(writer)


# -- DescribeConfigs (32) ----------------------------------------------------------------------


class ConfigSource:
    """Where a config value comes from (DescribeConfigs v1+ ``config_source``)."""

    DYNAMIC_TOPIC_CONFIG = 1
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class ConfigType:
    """A config's value type (DescribeConfigs v3+ ``config_type``)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5


class ResourceType:
    """DescribeConfigs resource types this broker answers."""

    TOPIC = 2
    BROKER = 4


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One setting as DescribeConfigs (and CreateTopics v5+) reports it."""

    name: str
    value: str
    config_type: int
    documentation: str
    source: int = ConfigSource.STATIC_BROKER_CONFIG
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class ConfigResource:
    """One resource asked about: type, name and the keys wanted (None: all)."""

    resource_type: int
    name: str
    keys: list[str] | None


def decode_describe_configs(reader: Reader, version: int) -> list[ConfigResource]:
    """DescribeConfigs request v0-v4 (synonym and documentation flags are read)."""
    c = _codec(version, 4)

    def resource(r: Reader) -> ConfigResource:
        resource_type = r.int8()
        name = c.string(r)
        keys = c.nullable_array(r, c.string, 1)
        c.tags(r)
        return ConfigResource(resource_type, name, keys)

    resources = c.array(reader, resource, 4)
    if version >= 1:
        reader.boolean()  # include_synonyms: each value has one source, so no synonyms
    if version >= 3:
        reader.boolean()  # include_documentation: always sent, it is short
    c.tags(reader)
    return resources


@dataclass(slots=True)
class DescribeConfigsResult:
    """One resource's answer."""

    resource: ConfigResource
    error_code: int
    error_message: str | None
    configs: list[ConfigEntry]


def encode_describe_configs(
    writer: Writer, version: int, results: list[DescribeConfigsResult]
) -> None:
    """DescribeConfigs response v0-v4 (v0 ``is_default`` becomes v1's ``config_source``)."""
    c = _codec(version, 4)
    writer.int32(0)  # throttle_time_ms

    def entry(w: Writer, e: ConfigEntry) -> None:
        c.write_string(w, e.name)
        c.write_string(w, e.value)
        w.boolean(e.read_only)
        if version == 0:
            w.boolean(e.source == ConfigSource.DEFAULT_CONFIG)  # is_default
        else:
            w.int8(e.source)
        w.boolean(False)  # is_sensitive
        if version >= 1:
            c.write_array(w, [], lambda _w, _s: None)  # synonyms
        if version >= 3:
            w.int8(e.config_type)
            c.write_string(w, e.documentation)
        c.write_tags(w)

    def result(w: Writer, res: DescribeConfigsResult) -> None:
        w.int16(res.error_code)
        c.write_string(w, res.error_message)
        w.int8(res.resource.resource_type)
        c.write_string(w, res.resource.name)
        c.write_array(w, res.configs, entry)
        c.write_tags(w)

    c.write_array(writer, results, result)
    c.write_tags(writer)


# -- InitProducerId (22) -----------------------------------------------------------------------


@dataclass(slots=True)
class InitProducerIdRequest:
    """InitProducerId request v0-v4 (v3+ carries the producer's current id and epoch)."""

    transactional_id: str | None
    transaction_timeout_ms: int
    producer_id: int
    producer_epoch: int


def decode_init_producer_id(reader: Reader, version: int) -> InitProducerIdRequest:
    """InitProducerId request v0-v4 (v2 is flexible)."""
    c = _codec(version, 2)
    transactional_id = c.nullable_string(reader)
    timeout_ms = reader.int32()
    producer_id, epoch = -1, -1
    if version >= 3:
        producer_id = reader.int64()
        epoch = reader.int16()
    c.tags(reader)
    return InitProducerIdRequest(transactional_id, timeout_ms, producer_id, epoch)


def encode_init_producer_id(
    writer: Writer, version: int, error_code: int, producer_id: int, producer_epoch: int
) -> None:
    """InitProducerId response v0-v4."""
    c = _codec(version, 2)
    writer.int32(0)  # throttle_time_ms
    writer.int16(error_code).int64(producer_id).int16(producer_epoch)
    c.write_tags(writer)
