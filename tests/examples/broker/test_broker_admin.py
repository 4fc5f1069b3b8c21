"""Administration APIs of the example broker, through three real admin clients and raw requests.

aiokafka's ``AIOKafkaAdminClient``, kafka-python's ``KafkaAdminClient`` and
confluent-kafka's ``AdminClient`` each create, list, describe and delete topics,
describe the configs, and list, describe and (where the client can) delete a
consumer group that a real aiokafka consumer keeps alive. The sync clients run
in a worker thread while the broker runs on the test's loop. Raw requests cover
what clients never send: bad input gets Kafka's error code in the response.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AIONewTopic
from aiokafka.admin.config_resource import ConfigResource as AIOConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AIOConfigResourceType
from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import ConfigResource as ConfluentConfigResource
from confluent_kafka.admin import NewTopic as ConfluentNewTopic
from kafka.admin import ConfigResource as KafkaPythonConfigResource
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KafkaPythonNewTopic
from kafka.errors import TopicAlreadyExistsError

from examples.broker import Broker, TopicPartition
from examples.broker.codec import Reader, Writer
from examples.broker.messages import API_NAMES, SUPPORTED_VERSIONS, ApiKey, ErrorCode, is_flexible
from examples.broker.rawclient import RawConnection, build_fetch_v4, build_produce_v3
from tests.support.broker import (
    eventually,
    fetch_result,
    make_batch,
    produce_result,
    producer,
    raw,
    running_broker,
)

pytestmark = pytest.mark.realtime

T = TypeVar("T")
GROUP = "admins"
ADMIN_APIS = (
    ApiKey.CREATE_TOPICS,
    ApiKey.DELETE_TOPICS,
    ApiKey.DESCRIBE_GROUPS,
    ApiKey.LIST_GROUPS,
    ApiKey.DELETE_GROUPS,
    ApiKey.DESCRIBE_CONFIGS,
    ApiKey.INIT_PRODUCER_ID,
)
SETTINGS: dict[str, Any] = {"group_min_session_timeout": 0.1, "group_initial_rebalance_delay": 0.0}


@pytest.fixture(autouse=True)
def _quiet_clients() -> None:
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)


@asynccontextmanager
async def group_member(broker: Broker, topic: str) -> AsyncIterator[AIOKafkaConsumer]:
    """A real aiokafka consumer in GROUP, assigned ``topic`` and with a committed offset."""
    async with producer(broker, acks="all") as prod:
        await prod.send_and_wait(topic, b"hello", partition=0)
    member = AIOKafkaConsumer(
        topic,
        bootstrap_servers=f"127.0.0.1:{broker.port}",
        group_id=GROUP,
        client_id="member-client",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=3000,
        heartbeat_interval_ms=100,
        fetch_max_wait_ms=100,
    )
    await member.start()
    try:
        async with asyncio.timeout(15):
            while not (await member.getmany(timeout_ms=200)):
                pass
        await member.commit()
        yield member
    finally:
        await member.stop()


def check_created(broker: Broker) -> None:
    assert broker.topics["orders"] == 3
    assert broker.topics["audit"] == 1
    assert broker.partitions[TopicPartition("orders", 2)].replicas == [0, 1, 2]
    assert broker.partitions[TopicPartition("audit", 0)].replicas == [0]  # replication factor 1


def check_deleted(broker: Broker) -> None:
    assert "audit" not in broker.topics
    assert TopicPartition("audit", 0) not in broker.partitions
    assert GROUP not in broker.coordinator.groups


# -- aiokafka ----------------------------------------------------------------------------------


async def test_aiokafka_admin_client() -> None:
    async with running_broker(**SETTINGS) as broker:
        admin = AIOKafkaAdminClient(bootstrap_servers=f"127.0.0.1:{broker.port}")
        await admin.start()
        try:
            response = await admin.create_topics(
                [AIONewTopic("orders", 3, 3), AIONewTopic("audit", 1, 1)]
            )
            assert [t[1] for t in response.topic_errors] == [0, 0]
            check_created(broker)
            again = await admin.create_topics([AIONewTopic("orders", 3, 3)])
            assert again.topic_errors[0][1] == ErrorCode.TOPIC_ALREADY_EXISTS
            assert {"orders", "audit"} <= set(await admin.list_topics())
            described = await admin.describe_topics(["orders"])
            assert len(described[0]["partitions"]) == 3
            configs = await admin.describe_configs(
                [AIOConfigResource(AIOConfigResourceType.TOPIC, "orders")]
            )
            values = {entry[0]: entry[1] for entry in configs[0].resources[0][4]}
            assert values["min.insync.replicas"] == "2"
            async with group_member(broker, "orders"):
                assert (GROUP, "consumer") in await admin.list_consumer_groups()
                (answer,) = await admin.describe_consumer_groups([GROUP])
                group = answer.groups[0]
                assert (group[0], group[1], group[2], group[3]) == (0, GROUP, "Stable", "consumer")
                (member,) = group[5]
                assert member[1] == "member-client"
                assert member[2] == "/127.0.0.1"
                assert member[4]  # the assignment the leader sent
            (answer,) = await admin.describe_consumer_groups([GROUP])
            assert answer.groups[0][2] == "Empty"  # left, offsets kept
            # aiokafka 0.14 has no delete_consumer_groups; the raw test covers DeleteGroups.
            broker.coordinator.delete_groups([GROUP])
            deleted = await admin.delete_topics(["audit"])
            assert deleted.topic_error_codes == [("audit", 0)]
            assert "audit" not in await admin.list_topics()
            check_deleted(broker)
        finally:
            await admin.close()


# -- kafka-python ------------------------------------------------------------------------------


async def in_thread(func: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(func, *args)


async def test_kafka_python_admin_client() -> None:
    async with running_broker(**SETTINGS) as broker:
        admin = await in_thread(
            lambda: KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{broker.port}")
        )
        try:
            await in_thread(
                admin.create_topics,
                [KafkaPythonNewTopic("orders", 3, 3), KafkaPythonNewTopic("audit", 1, 1)],
            )
            check_created(broker)
            with pytest.raises(TopicAlreadyExistsError):
                await in_thread(admin.create_topics, [KafkaPythonNewTopic("orders", 3, 3)])
            assert {"orders", "audit"} <= set(await in_thread(admin.list_topics))
            (described,) = await in_thread(admin.describe_topics, ["orders"])
            assert len(described["partitions"]) == 3
            configs = await in_thread(
                lambda: admin.describe_configs(
                    [KafkaPythonConfigResource("TOPIC", "orders")], config_filter="all"
                )
            )
            assert configs["topic"]["orders"]["min.insync.replicas"]["value"] == "2"
            async with group_member(broker, "orders"):
                listed = await in_thread(admin.list_groups)
                assert [(g["group_id"], g["protocol_type"]) for g in listed] == [
                    (GROUP, "consumer")
                ]
                stable = await in_thread(lambda: admin.list_groups(states_filter=["Stable"]))
                assert [(g["group_id"], g["group_state"]) for g in stable] == [(GROUP, "Stable")]
                assert await in_thread(lambda: admin.list_groups(states_filter=["Empty"])) == []
                described_groups = await in_thread(admin.describe_groups, [GROUP])
                group = described_groups[GROUP]
                assert group["group_state"] == "Stable"
                assert [m["client_id"] for m in group["members"]] == ["member-client"]
                # A group with a member cannot be deleted.
                refused = await in_thread(admin.delete_groups, [GROUP])
                assert "NonEmptyGroup" in str(refused[GROUP])
            deleted = await in_thread(admin.delete_groups, [GROUP])
            assert "Error" not in str(deleted[GROUP])
            assert (await in_thread(admin.describe_groups, [GROUP]))[GROUP]["group_state"] == "Dead"
            await in_thread(admin.delete_topics, ["audit"])
            assert "audit" not in await in_thread(admin.list_topics)
            check_deleted(broker)
            # kafka-python 3 negotiates the newest versions: the flexible encodings.
            used = dict(broker.request_counts.keys())  # API name -> version
            for api in ADMIN_APIS[:-1]:  # all but InitProducerId
                assert is_flexible(api, used[API_NAMES[api]])
        finally:
            await in_thread(admin.close)


# -- confluent-kafka -----------------------------------------------------------------------------


def _result(futures: dict[Any, Any]) -> dict[Any, Any]:
    return {key: future.result(timeout=15) for key, future in futures.items()}


async def test_confluent_admin_client() -> None:
    async with running_broker(**SETTINGS) as broker:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{broker.port}"})
        created = await in_thread(
            lambda: _result(
                admin.create_topics(
                    [ConfluentNewTopic("orders", 3, 3), ConfluentNewTopic("audit", 1, 1)]
                )
            )
        )
        assert created == {"orders": None, "audit": None}
        check_created(broker)
        with pytest.raises(KafkaException, match="TOPIC_ALREADY_EXISTS"):
            await in_thread(lambda: _result(admin.create_topics([ConfluentNewTopic("orders", 3)])))
        listed = await in_thread(lambda: admin.list_topics(timeout=15).topics)
        assert {"orders", "audit"} <= set(listed)
        described = await in_thread(
            lambda: _result(admin.describe_topics(TopicCollection(["orders"])))
        )
        assert len(described["orders"].partitions) == 3
        configs = await in_thread(
            lambda: _result(admin.describe_configs([ConfluentConfigResource("TOPIC", "orders")]))
        )
        (entries,) = configs.values()
        assert entries["min.insync.replicas"].value == "2"
        async with group_member(broker, "orders"):
            groups = await in_thread(lambda: admin.list_consumer_groups().result(timeout=15))
            assert GROUP in {g.group_id for g in groups.valid}
            description = await in_thread(lambda: _result(admin.describe_consumer_groups([GROUP])))
            group = description[GROUP]
            assert group.state.name == "STABLE"
            (member,) = group.members
            assert member.client_id == "member-client"
            assert member.host == "/127.0.0.1"
            assert {tp.topic for tp in member.assignment.topic_partitions} == {"orders"}
            with pytest.raises(KafkaException, match="NON_EMPTY_GROUP"):
                await in_thread(lambda: _result(admin.delete_consumer_groups([GROUP])))
        await in_thread(lambda: _result(admin.delete_consumer_groups([GROUP])))
        deleted = await in_thread(lambda: _result(admin.delete_topics(["audit"])))
        assert deleted == {"audit": None}
        listed = await in_thread(lambda: admin.list_topics(timeout=15).topics)
        assert "audit" not in listed
        check_deleted(broker)


# -- raw requests: bad input and deletion under load ---------------------------------------------


def create_topics_body(
    version: int,
    topics: list[tuple[str, int, int]],
    *,
    validate_only: bool = False,
    assignments: dict[str, list[int]] | None = None,
    configs: dict[str, tuple[str, str]] | None = None,
) -> bytes:
    """A CreateTopics body (classic before v5, flexible from v5)."""
    flexible = version >= 5
    w = Writer()

    def string(value: str | None) -> None:
        if flexible:
            w.compact_nullable_string(value)
        else:
            w.nullable_string(value)

    def count(n: int) -> None:
        if flexible:
            w.unsigned_varint(n + 1)
        else:
            w.int32(n)

    def tags() -> None:
        if flexible:
            w.tagged_fields()

    count(len(topics))
    for name, partitions, replication in topics:
        string(name)
        w.int32(partitions).int16(replication)
        replicas = (assignments or {}).get(name)
        count(0 if replicas is None else 1)
        if replicas is not None:
            w.int32(0)
            count(len(replicas))
            for broker_id in replicas:
                w.int32(broker_id)
            tags()
        config = (configs or {}).get(name)
        count(0 if config is None else 1)
        if config is not None:
            string(config[0])
            string(config[1])
            tags()
        tags()
    w.int32(5000).boolean(validate_only)
    tags()
    return w.getvalue()


def create_topics_errors(body: Reader, version: int) -> dict[str, tuple[int, int, int]]:
    """Per topic (error, partitions, replication factor) of a CreateTopics v4/v5 answer."""
    flexible = version >= 5
    assert body.int32() == 0  # throttle
    answers: dict[str, tuple[int, int, int]] = {}
    n = body.unsigned_varint() - 1 if flexible else body.int32()
    for _ in range(n):
        name = body.compact_string() if flexible else body.string()
        error = body.int16()
        message = body.compact_nullable_string() if flexible else body.nullable_string()
        assert (message is None) == (error == 0)  # every refusal says why
        partitions = replication = -1
        if flexible:
            partitions, replication = body.int32(), body.int16()
            configs = body.compact_nullable_array(_skip_config, 5)
            assert (configs is None) == (error != 0)
            body.tagged_fields()
        answers.setdefault(name, (error, partitions, replication))
    if flexible:
        body.tagged_fields()
    assert body.remaining == 0
    return answers


def _skip_config(r: Reader) -> str:
    name = r.compact_string()
    r.compact_nullable_string()
    r.boolean()
    r.int8()
    r.boolean()
    r.tagged_fields()
    return name


@pytest.mark.parametrize("version", [4, 5])
async def test_create_topics_bad_input_gets_kafka_error_codes(version: int) -> None:
    async with running_broker(topics={"existing": 1}) as broker, raw(broker) as conn:
        body = create_topics_body(
            version,
            [
                ("fine", 2, 3),
                ("defaults", -1, -1),
                ("negative", -3, 1),
                ("zero", 0, 1),
                ("huge", 10**9, 1),
                ("absurd-rf", 1, 500),
                ("zero-rf", 1, 0),
                ("twice", 1, 1),
                ("twice", 1, 1),
                ("bad name!", 1, 1),
                ("existing", 1, 1),
                ("manual", -1, -1),
                ("configured", 1, 1),
            ],
            assignments={"manual": [0, 1]},
            configs={"configured": ("cleanup.policy", "compact")},
        )
        answers = create_topics_errors(
            await conn.request(ApiKey.CREATE_TOPICS, version, body), version
        )
        errors = {name: answer[0] for name, answer in answers.items()}
        assert errors == {
            "fine": ErrorCode.NONE,
            "defaults": ErrorCode.NONE,
            "negative": ErrorCode.INVALID_PARTITIONS,
            "zero": ErrorCode.INVALID_PARTITIONS,
            "huge": ErrorCode.INVALID_PARTITIONS,
            "absurd-rf": ErrorCode.INVALID_REPLICATION_FACTOR,
            "zero-rf": ErrorCode.INVALID_REPLICATION_FACTOR,
            "twice": ErrorCode.INVALID_REQUEST,
            "bad name!": ErrorCode.INVALID_TOPIC_EXCEPTION,
            "existing": ErrorCode.TOPIC_ALREADY_EXISTS,
            "manual": ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "configured": ErrorCode.INVALID_CONFIG,
        }
        if version >= 5:  # the flexible answer says what the defaults were
            assert answers["defaults"][1:] == (3, 3)
            assert answers["fine"][1:] == (2, 3)
        assert broker.topics == {"existing": 1, "fine": 2, "defaults": 3}
        # validate_only checks and answers, creates nothing.
        body = create_topics_body(version, [("dry", 4, 2), ("dry-bad", 4, 9)], validate_only=True)
        answers = create_topics_errors(
            await conn.request(ApiKey.CREATE_TOPICS, version, body), version
        )
        assert answers["dry"][0] == ErrorCode.NONE
        assert answers["dry-bad"][0] == ErrorCode.INVALID_REPLICATION_FACTOR
        assert "dry" not in broker.topics
        assert broker.connection_count == 1


async def test_other_admin_apis_answer_bad_input_in_the_response() -> None:
    async with running_broker(topics={"t": 1}) as broker, raw(broker) as conn:
        # DeleteTopics v4 (flexible): unknown and duplicate names.
        w = Writer().unsigned_varint(4)
        for name in ("nope", "t2", "t2"):
            w.compact_string(name)
        w.int32(1000).tagged_fields()
        body = await conn.request(ApiKey.DELETE_TOPICS, 4, w.getvalue())
        assert body.int32() == 0
        results = []
        for _ in range(body.unsigned_varint() - 1):
            results.append((body.compact_string(), body.int16()))
            body.tagged_fields()
        body.tagged_fields()
        assert results == [
            ("nope", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
            ("t2", ErrorCode.INVALID_REQUEST),
            ("t2", ErrorCode.INVALID_REQUEST),
        ]
        # DescribeConfigs v1 (classic): unknown topic, another broker, unsupported type,
        # a key filter, and an empty filter (all keys, as Kafka reads it).
        w = Writer().int32(5)
        w.int8(2).string("nope").int32(-1)
        w.int8(4).string("7").int32(-1)
        w.int8(8).string("0").int32(-1)
        w.int8(2).string("t").int32(1).string("min.insync.replicas")
        w.int8(4).string("").int32(0)
        w.boolean(False)
        body = await conn.request(ApiKey.DESCRIBE_CONFIGS, 1, w.getvalue())
        assert body.int32() == 0
        described = []
        for _ in range(body.int32()):
            error, message = body.int16(), body.nullable_string()
            body.int8()
            name = body.string()
            entries = []
            for _ in range(body.int32()):
                key, value = body.string(), body.nullable_string()
                body.boolean()
                body.int8()
                body.boolean()
                assert body.int32() == 0  # synonyms
                entries.append((key, value))
            described.append((name, error, message is not None, entries))
        assert body.remaining == 0
        assert described == [
            ("nope", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, True, []),
            ("7", ErrorCode.INVALID_REQUEST, True, []),
            ("0", ErrorCode.INVALID_REQUEST, True, []),
            ("t", ErrorCode.NONE, False, [("min.insync.replicas", "2")]),
            ("", ErrorCode.NONE, False, described[-1][3]),
        ]
        broker_configs = dict(described[-1][3])
        assert broker_configs["default.replication.factor"] == "3"
        assert broker_configs["group.initial.rebalance.delay.ms"] == "3000"
        assert len(broker_configs) == 11
        # DeleteGroups v1: empty id, unknown group.
        w = Writer().int32(2).string("").string("ghost")
        body = await conn.request(ApiKey.DELETE_GROUPS, 1, w.getvalue())
        assert body.int32() == 0
        results = [(body.string(), body.int16()) for _ in range(body.int32())]
        assert results == [
            ("", ErrorCode.INVALID_GROUP_ID),
            ("ghost", ErrorCode.GROUP_ID_NOT_FOUND),
        ]
        # ListGroups v4 with a state filter (flexible), after a commit made group "g" exist.
        broker.coordinator.commit_offsets("g", -1, "", [(TopicPartition("t", 0), 0, None)])
        for states, expected in (([], ["g"]), (["empty"], ["g"]), (["Stable"], [])):
            w = Writer().unsigned_varint(len(states) + 1)
            for state in states:
                w.compact_string(state)
            w.tagged_fields()
            body = await conn.request(ApiKey.LIST_GROUPS, 4, w.getvalue())
            assert body.int32() == 0
            assert body.int16() == ErrorCode.NONE
            listed = []
            for _ in range(body.unsigned_varint() - 1):
                listed.append(body.compact_string())
                body.compact_string()  # protocol type
                assert body.compact_string() == "Empty"
                body.tagged_fields()
            assert listed == expected
        assert broker.connection_count == 1


async def test_deleting_a_topic_answers_its_parked_produce_and_fetch() -> None:
    async with running_broker(topics={"t": 1, "other": 1}) as broker:
        broker.stall_follower(1)
        broker.stall_follower(2)
        fetcher = await RawConnection.open("127.0.0.1", broker.port)
        fetcher.send(ApiKey.FETCH, 4, build_fetch_v4("t", 0, 0, max_wait_ms=60_000))
        producer_conn = await RawConnection.open("127.0.0.1", broker.port)
        batch = make_batch([b"x"])
        producer_conn.send(ApiKey.PRODUCE, 3, build_produce_v3("t", 0, batch, timeout_ms=60_000))
        await eventually(
            lambda: broker.produce_purgatory.delayed == 1 and broker.fetch_purgatory.delayed == 1
        )
        async with raw(broker) as admin:
            w = Writer().int32(1).string("t").int32(1000)
            body = await admin.request(ApiKey.DELETE_TOPICS, 1, w.getvalue())
            body.int32()
            assert body.int32() == 1
            assert (body.string(), body.int16()) == ("t", ErrorCode.NONE)
        async with asyncio.timeout(5):  # at once, not at the 60 s timeouts
            _, answer = await producer_conn.receive(ApiKey.PRODUCE, 3)
            assert produce_result(answer) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0)
            _, answer = await fetcher.receive(ApiKey.FETCH, 4)
            assert fetch_result(answer)[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert broker.produce_purgatory.delayed == broker.fetch_purgatory.delayed == 0
        assert broker.produce_purgatory.watched == broker.fetch_purgatory.watched == 0
        await producer_conn.close()
        await fetcher.close()
        # Created again under the same name, the topic starts empty and replicates anew.
        broker.resume_follower(1)
        broker.resume_follower(2)
        assert broker.create_topic("t", 1)
        async with raw(broker) as conn:
            body = await conn.request(ApiKey.PRODUCE, 3, build_produce_v3("t", 0, batch))
            assert produce_result(body) == (ErrorCode.NONE, 0)
        partition = broker.partitions[TopicPartition("t", 0)]
        assert partition.high_watermark == 1
        assert all(f.offsets.get(TopicPartition("t", 0)) == 1 for f in broker.followers)


async def test_garbage_bodies_of_the_new_apis_never_reach_a_traceback() -> None:
    """Random bodies for every version of each new API: answered or rejected, never a crash."""
    rng = random.Random(21)
    async with running_broker(topics={"t": 1}) as broker:
        for api in ADMIN_APIS:
            low, high = SUPPORTED_VERSIONS[api]
            for version in range(low, high + 1):
                for size in (0, 1, 3, 9, 40):
                    body = bytes(rng.randrange(256) for _ in range(size))
                    async with raw(broker) as conn:
                        conn.send(api, version, body)
                        await conn.writer.drain()
                        await conn.closed_by_peer(within=0.2)
        names = broker.log.names()
        assert "broker.handler_failed" not in names
        assert "broker.malformed_request" in names
        async with raw(broker) as conn:  # still serving
            answer = await conn.request(ApiKey.API_VERSIONS, 0, b"")
            assert answer.int16() == ErrorCode.NONE


async def test_followers_forget_a_topic_deleted_while_they_replicate_it() -> None:
    """Deleted and created again while the followers hold fetched batches of the old
    topic (``follower_lag``): they must not count those for the new one."""
    async with running_broker(topics={"t": 1}, follower_lag=0.3) as broker, raw(broker) as conn:
        body = build_produce_v3("t", 0, make_batch([b"old"] * 3), acks=1)
        assert produce_result(await conn.request(ApiKey.PRODUCE, 3, body)) == (0, 0)
        assert broker.delete_topic("t")
        assert broker.create_topic("t", 1)
        await asyncio.sleep(0.6)  # the lag passes; stale batches would count now
        tp = TopicPartition("t", 0)
        assert [f.offsets.get(tp, 0) for f in broker.followers] == [0, 0]
        body = build_produce_v3("t", 0, make_batch([b"new"]), acks=-1)
        assert produce_result(await conn.request(ApiKey.PRODUCE, 3, body)) == (0, 0)
        assert broker.partitions[tp].high_watermark == 1
