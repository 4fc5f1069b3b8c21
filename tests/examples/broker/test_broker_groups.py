"""Consumer groups on the example broker: real aiokafka group consumers, and raw requests.

aiokafka consumers subscribe (``group_id`` set, no manual assignment), so they go
through FindCoordinator, JoinGroup (parked as a DelayedJoin in the ``rebalance``
purgatory), SyncGroup, Heartbeat (sessions in the ``heartbeat`` purgatory),
OffsetCommit/OffsetFetch and LeaveGroup. Small session/rebalance timeouts keep
the rebalances fast; nothing asserts timings.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition

from examples.broker import Broker, TopicPartition
from examples.broker.admin import execute
from examples.broker.codec import Reader, Writer
from examples.broker.coordinator import GroupState
from examples.broker.messages import ApiKey, ErrorCode
from examples.broker.rawclient import RawConnection
from tests.support.broker import eventually, producer, running_broker

pytestmark = pytest.mark.realtime

TOPIC = "events"
GROUP_SETTINGS: dict[str, Any] = {
    "group_min_session_timeout": 0.1,
    "group_initial_rebalance_delay": 0.0,
    "topics": {TOPIC: 4},
}
CONSUMER_SETTINGS: dict[str, Any] = {
    "group_id": "g",
    "auto_offset_reset": "earliest",
    "enable_auto_commit": False,
    "session_timeout_ms": 3000,
    "rebalance_timeout_ms": 3000,
    "heartbeat_interval_ms": 100,
    "fetch_max_wait_ms": 100,
    "retry_backoff_ms": 50,
}


@pytest.fixture(autouse=True)
def _quiet_aiokafka() -> None:
    # aiokafka logs every rebalance it is told about at WARNING.
    logging.getLogger("aiokafka").setLevel(logging.ERROR)


def group_consumer(broker: Broker) -> AIOKafkaConsumer:
    """An unstarted aiokafka consumer subscribed to TOPIC in group "g"."""
    return AIOKafkaConsumer(
        TOPIC, bootstrap_servers=f"127.0.0.1:{broker.port}", **CONSUMER_SETTINGS
    )


async def produce(broker: Broker, values: list[bytes]) -> None:
    """Send values round robin over the 4 partitions (acks=all)."""
    async with producer(broker, acks="all") as prod:
        for i, value in enumerate(values):
            await prod.send_and_wait(TOPIC, value, partition=i % 4)


async def read(consumers: list[AIOKafkaConsumer], count: int) -> list[list[tuple[int, int, bytes]]]:
    """Poll all consumers until ``count`` messages arrived in total; (partition, offset, value)."""
    got: list[list[tuple[int, int, bytes]]] = [[] for _ in consumers]
    async with asyncio.timeout(15):
        while sum(map(len, got)) < count:
            batches = await asyncio.gather(*(c.getmany(timeout_ms=200) for c in consumers))
            for mine, batch in zip(got, batches, strict=True):
                for tp, messages in batch.items():
                    mine.extend((tp.partition, m.offset, m.value or b"") for m in messages)
    return got


def partitions_of(consumer: AIOKafkaConsumer) -> set[int]:
    return {tp.partition for tp in consumer.assignment()}


def group_pending(broker: Broker) -> tuple[int, int]:
    stats = broker.statistics()
    return stats["rebalance"].pending, stats["heartbeat"].pending


async def test_group_consumer_commits_and_a_new_member_resumes() -> None:
    first = [b"a%d" % i for i in range(40)]
    second = [b"b%d" % i for i in range(20)]
    async with running_broker(**GROUP_SETTINGS) as broker:
        await produce(broker, first)
        cons = group_consumer(broker)
        await cons.start()
        try:
            [got] = await read([cons], len(first))
            assert sorted(v for _, _, v in got) == sorted(first)
            assert partitions_of(cons) == {0, 1, 2, 3}
            await cons.commit()
            tps = [KafkaTopicPartition(TOPIC, p) for p in range(4)]
            assert [await cons.committed(tp) for tp in tps] == [10, 10, 10, 10]
            reply = await execute(broker, "groups")
            assert reply.startswith("ok ")
            described = json.loads(reply[3:])["g"]
            assert (described["state"], described["generation"]) == ("Stable", 1)
            assert described["committed_partitions"] == 4
        finally:
            await cons.stop()
        group = broker.coordinator.groups["g"]
        assert group.state is GroupState.EMPTY  # LeaveGroup emptied it
        assert group.offsets == {TopicPartition(TOPIC, p): (10, "") for p in range(4)}
        stats = broker.statistics()
        assert stats["rebalance"].completed + stats["rebalance"].expired >= 2  # join + sync

        await produce(broker, second)
        resumed = group_consumer(broker)
        await resumed.start()
        try:
            [got] = await read([resumed], len(second))
            # Resumed at the committed offsets: only the new messages, from offset 10 on.
            assert sorted(v for _, _, v in got) == sorted(second)
            assert all(offset >= 10 for _, offset, _ in got)
        finally:
            await resumed.stop()
        await eventually(lambda: group_pending(broker) == (0, 0))
        assert broker.unknown_api_keys == {}


async def test_two_members_split_partitions_and_one_takes_over() -> None:
    async with running_broker(**GROUP_SETTINGS) as broker:
        one, two = group_consumer(broker), group_consumer(broker)
        await asyncio.gather(one.start(), two.start())
        stopped = False
        try:
            group = broker.coordinator.groups["g"]
            await eventually(
                lambda: (
                    group.state is GroupState.STABLE
                    and len(group.members) == 2
                    and partitions_of(one) | partitions_of(two) == {0, 1, 2, 3}
                    and not partitions_of(one) & partitions_of(two)
                ),
                within=15,
            )
            assert partitions_of(one)
            assert partitions_of(two)
            # Stable again: the join phase and sync deadline left the rebalance purgatory.
            await eventually(lambda: group_pending(broker) == (0, 2))

            values = [b"m%d" % i for i in range(80)]
            await produce(broker, values)
            got_one, got_two = await read([one, two], len(values))
            assert {p for p, _, _ in got_one} <= partitions_of(one)
            assert {p for p, _, _ in got_two} <= partitions_of(two)
            everything = got_one + got_two
            assert len(everything) == len(values)  # exactly once between them
            assert sorted(v for _, _, v in everything) == sorted(values)
            await asyncio.gather(one.commit(), two.commit())

            generation = group.generation
            await one.stop()  # LeaveGroup: the group rebalances onto `two`
            stopped = True
            await eventually(lambda: partitions_of(two) == {0, 1, 2, 3}, within=15)
            assert group.generation > generation
            assert len(group.members) == 1

            more = [b"n%d" % i for i in range(40)]
            await produce(broker, more)
            [got] = await read([two], len(more))
            # `two` resumed `one`'s partitions at the offsets `one` committed.
            assert sorted(v for _, _, v in got) == sorted(more)
            await eventually(lambda: group_pending(broker) == (0, 1))
        finally:
            if not stopped:
                await one.stop()
            await two.stop()
        await eventually(lambda: group_pending(broker) == (0, 0))
        assert group.state is GroupState.EMPTY


# -- raw requests: error codes, expiry of the join phase and of sessions, disconnects --------


def join_v2(member_id: str, *, session_ms: int, rebalance_ms: int, group: str = "raw") -> bytes:
    w = Writer().string(group).int32(session_ms).int32(rebalance_ms).string(member_id)
    w.string("consumer").int32(1).string("range").nullable_bytes(b"subscription")
    return w.getvalue()


def parse_join_v2(body: Reader) -> tuple[int, int, str, str, list[str]]:
    body.int32()  # throttle
    error, generation = body.int16(), body.int32()
    body.string()  # protocol
    leader, member = body.string(), body.string()
    members = body.array(lambda r: (r.string(), r.nullable_bytes()))
    return error, generation, leader, member, [m for m, _ in members]


def member_request(member_id: str, generation: int, group: str = "raw") -> bytes:
    return Writer().string(group).int32(generation).string(member_id).getvalue()


def sync_v1(member_id: str, generation: int, assignment: bytes | None) -> bytes:
    w = Writer().string("raw").int32(generation).string(member_id)
    if assignment is None:
        w.int32(0)
    else:
        w.int32(1).string(member_id).nullable_bytes(assignment)
    return w.getvalue()


async def error_of(conn: RawConnection, api: int, body: bytes) -> int:
    reply = await conn.request(api, 1, body)
    reply.int32()  # throttle
    return reply.int16()


async def test_raw_join_sync_heartbeat_errors_and_session_expiry() -> None:
    async with running_broker(**GROUP_SETTINGS) as broker:
        conn = await RawConnection.open("127.0.0.1", broker.port)
        try:
            body = await conn.request(
                ApiKey.JOIN_GROUP, 2, join_v2("", session_ms=300, rebalance_ms=300)
            )
            error, generation, leader, member, members = parse_join_v2(body)
            assert (error, generation, leader, members) == (ErrorCode.NONE, 1, member, [member])
            body = await conn.request(ApiKey.SYNC_GROUP, 1, sync_v1(member, generation, b"mine"))
            body.int32()
            assert (body.int16(), body.nullable_bytes()) == (ErrorCode.NONE, b"mine")

            hb = ApiKey.HEARTBEAT
            assert await error_of(conn, hb, member_request(member, generation)) == ErrorCode.NONE
            assert await error_of(conn, hb, member_request(member, 99)) == (
                ErrorCode.ILLEGAL_GENERATION
            )
            assert await error_of(conn, hb, member_request("nobody", generation)) == (
                ErrorCode.UNKNOWN_MEMBER_ID
            )
            body = await conn.request(
                ApiKey.JOIN_GROUP, 2, join_v2("nobody", session_ms=300, rebalance_ms=300)
            )
            assert parse_join_v2(body)[0] == ErrorCode.UNKNOWN_MEMBER_ID
            body = await conn.request(
                ApiKey.JOIN_GROUP, 2, join_v2("", session_ms=50, rebalance_ms=300)
            )
            assert parse_join_v2(body)[0] == ErrorCode.INVALID_SESSION_TIMEOUT
            assert broker.statistics()["heartbeat"].pending == 1

            # No more heartbeats: the session (300 ms) expires and the member is removed.
            await eventually(lambda: broker.statistics()["heartbeat"].pending == 0)
            assert broker.statistics()["heartbeat"].expired >= 1
            assert await error_of(conn, hb, member_request(member, generation)) == (
                ErrorCode.UNKNOWN_MEMBER_ID
            )
            assert group_pending(broker) == (0, 0)
        finally:
            await conn.close()


async def test_raw_late_member_is_dropped_when_the_join_phase_expires() -> None:
    async with running_broker(**GROUP_SETTINGS) as broker:
        old = await RawConnection.open("127.0.0.1", broker.port)
        new = await RawConnection.open("127.0.0.1", broker.port)
        try:
            body = await old.request(
                ApiKey.JOIN_GROUP, 2, join_v2("", session_ms=5000, rebalance_ms=300)
            )
            _, generation, _, member, _ = parse_join_v2(body)
            await old.request(ApiKey.SYNC_GROUP, 1, sync_v1(member, generation, b"x"))
            # A second member starts a rebalance; the first one hears it but never rejoins.
            new.send(ApiKey.JOIN_GROUP, 2, join_v2("", session_ms=5000, rebalance_ms=300))
            await eventually(lambda: broker.statistics()["rebalance"].pending == 1)
            assert await error_of(old, ApiKey.HEARTBEAT, member_request(member, generation)) == (
                ErrorCode.REBALANCE_IN_PROGRESS
            )
            # The DelayedJoin expires after the rebalance timeout: `old` is out.
            _, body = await new.receive(ApiKey.JOIN_GROUP, 2)
            error, new_generation, leader, new_member, members = parse_join_v2(body)
            assert error == ErrorCode.NONE
            assert new_generation == generation + 1
            assert leader == new_member
            assert members == [new_member]
            assert broker.statistics()["rebalance"].expired >= 1
            sync = sync_v1(new_member, generation, b"y")  # stale generation
            assert await error_of(new, ApiKey.SYNC_GROUP, sync) == ErrorCode.ILLEGAL_GENERATION
            sync = sync_v1(new_member, new_generation, b"y")
            assert await error_of(new, ApiKey.SYNC_GROUP, sync) == ErrorCode.NONE
            leave = Writer().string("raw").string(new_member).getvalue()
            assert await error_of(new, ApiKey.LEAVE_GROUP, leave) == ErrorCode.NONE
            assert await error_of(new, ApiKey.LEAVE_GROUP, leave) == ErrorCode.UNKNOWN_MEMBER_ID
            await eventually(lambda: group_pending(broker) == (0, 0))
        finally:
            await old.close()
            await new.close()


async def test_raw_disconnect_mid_join_and_close_answer_everything() -> None:
    settings = {**GROUP_SETTINGS, "group_initial_rebalance_delay": 30.0}
    async with running_broker(**settings) as broker:
        conn = await RawConnection.open("127.0.0.1", broker.port)
        conn.send(ApiKey.JOIN_GROUP, 2, join_v2("", session_ms=5000, rebalance_ms=60_000))
        await conn.writer.drain()
        await eventually(lambda: broker.statistics()["rebalance"].pending == 1)
        await conn.close()  # the client goes away while its join waits
        await eventually(lambda: group_pending(broker) == (0, 0))
        assert "raw" not in broker.coordinator.groups  # emptied, nothing committed: gone

        # A malformed group request costs only its connection.
        bad = await RawConnection.open("127.0.0.1", broker.port)
        bad.send(ApiKey.JOIN_GROUP, 2, join_v2("", session_ms=5000, rebalance_ms=1)[:-3])
        assert await bad.closed_by_peer()
        await bad.close()

        waiting = await RawConnection.open("127.0.0.1", broker.port)
        waiting.send(ApiKey.JOIN_GROUP, 2, join_v2("", session_ms=5000, rebalance_ms=60_000))
        await waiting.writer.drain()
        await eventually(lambda: broker.statistics()["rebalance"].pending == 1)
        closing = asyncio.create_task(broker.close())
        _, body = await waiting.receive(ApiKey.JOIN_GROUP, 2)
        assert parse_join_v2(body)[0] == ErrorCode.COORDINATOR_NOT_AVAILABLE
        await closing
        assert await waiting.closed_by_peer()
        await waiting.close()
        assert group_pending(broker) == (0, 0)


async def test_raw_initial_delay_gathers_members_and_sync_waits_for_the_leader() -> None:
    settings = {**GROUP_SETTINGS, "group_initial_rebalance_delay": 0.3}
    async with running_broker(**settings) as broker:
        a = await RawConnection.open("127.0.0.1", broker.port)
        b = await RawConnection.open("127.0.0.1", broker.port)
        c = await RawConnection.open("127.0.0.1", broker.port)
        try:
            join = join_v2("", session_ms=5000, rebalance_ms=5000)
            a.send(ApiKey.JOIN_GROUP, 2, join)
            await eventually(lambda: "raw" in broker.coordinator.groups)
            b.send(ApiKey.JOIN_GROUP, 2, join)
            # Both arrive within the InitialDelayedJoin: one generation with both members.
            (_, body_a), (_, body_b) = await asyncio.gather(
                a.receive(ApiKey.JOIN_GROUP, 2), b.receive(ApiKey.JOIN_GROUP, 2)
            )
            ja, jb = parse_join_v2(body_a), parse_join_v2(body_b)
            assert ja[0] == jb[0] == ErrorCode.NONE
            assert ja[1] == jb[1] == 1
            leader = ja[2]
            assert sorted(ja[4] + jb[4]) == sorted([ja[3], jb[3]])  # only the leader sees members
            follower_conn, follower = (b, jb[3]) if leader == ja[3] else (a, ja[3])
            leader_conn = a if follower_conn is b else b

            # The follower's SyncGroup waits for the leader's; a newcomer starts a
            # rebalance first, so the follower is told to rejoin.
            follower_conn.send(ApiKey.SYNC_GROUP, 1, sync_v1(follower, 1, None))
            await follower_conn.writer.drain()
            await eventually(
                lambda: bool(broker.coordinator.groups["raw"].members[follower].awaiting_sync)
            )
            # (short timeouts: once alone, its unsynced generation expires quickly)
            c.send(ApiKey.JOIN_GROUP, 2, join_v2("", session_ms=300, rebalance_ms=300))
            _, body = await follower_conn.receive(ApiKey.SYNC_GROUP, 1)
            body.int32()
            assert body.int16() == ErrorCode.REBALANCE_IN_PROGRESS
            # Stale leader sync: the group is rebalancing.
            assert await error_of(leader_conn, ApiKey.SYNC_GROUP, sync_v1(leader, 1, b"x")) == (
                ErrorCode.REBALANCE_IN_PROGRESS
            )
            for conn, member in ((leader_conn, leader), (follower_conn, follower)):
                leave = Writer().string("raw").string(member).getvalue()
                assert await error_of(conn, ApiKey.LEAVE_GROUP, leave) == ErrorCode.NONE
        finally:
            for conn in (a, b, c):
                await conn.close()
        await eventually(lambda: group_pending(broker) == (0, 0))


def commit_v2(group: str, generation: int, member: str, offset: int) -> bytes:
    w = Writer().string(group).int32(generation).string(member).int64(-1)
    w.int32(2)
    w.string(TOPIC).int32(1).int32(0).int64(offset).nullable_string("meta")
    w.string("missing").int32(1).int32(0).int64(offset).nullable_string(None)
    return w.getvalue()


def fetch_offsets(body: Reader, version: int) -> tuple[list[tuple[str, int, int, int]], int]:
    if version >= 3:
        body.int32()

    def partition(r: Reader) -> tuple[int, int, int]:
        index, offset = r.int32(), r.int64()
        r.nullable_string()
        return index, offset, r.int16()

    topics = body.array(lambda r: (r.string(), r.array(partition)))
    error = body.int16() if version >= 2 else 0
    return [(t, p, o, e) for t, ps in topics for p, o, e in ps], error


async def test_raw_offset_commit_and_fetch_without_membership() -> None:
    async with running_broker(**GROUP_SETTINGS) as broker:
        conn = await RawConnection.open("127.0.0.1", broker.port)
        try:
            # Generation -1, no member: a consumer assigning partitions itself.
            reply = await conn.request(ApiKey.OFFSET_COMMIT, 2, commit_v2("solo", -1, "", 7))
            results = reply.array(lambda r: (r.string(), r.array(lambda p: (p.int32(), p.int16()))))
            assert results == [
                (TOPIC, [(0, ErrorCode.NONE)]),
                ("missing", [(0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]),
            ]
            # A generation for a group nobody joined is refused.
            reply = await conn.request(ApiKey.OFFSET_COMMIT, 3, commit_v2("other", 4, "m", 1))
            reply.int32()
            assert reply.array(
                lambda r: (r.string(), r.array(lambda p: (p.int32(), p.int16())))
            ) == [
                (TOPIC, [(0, ErrorCode.ILLEGAL_GENERATION)]),
                ("missing", [(0, ErrorCode.ILLEGAL_GENERATION)]),
            ]
            asked = Writer().string("solo").int32(1).string(TOPIC).int32(2).int32(0).int32(1)
            reply = await conn.request(ApiKey.OFFSET_FETCH, 1, asked.getvalue())
            assert fetch_offsets(reply, 1) == ([(TOPIC, 0, 7, 0), (TOPIC, 1, -1, 0)], 0)
            everything = Writer().string("solo").int32(-1).getvalue()  # null: all (v2+)
            reply = await conn.request(ApiKey.OFFSET_FETCH, 3, everything)
            assert fetch_offsets(reply, 3) == ([(TOPIC, 0, 7, 0)], 0)
            # Null topics in v1 is malformed: that connection closes.
            conn.send(ApiKey.OFFSET_FETCH, 1, everything)
            assert await conn.closed_by_peer()
        finally:
            await conn.close()
        assert broker.coordinator.groups["solo"].offsets == {TopicPartition(TOPIC, 0): (7, "meta")}


GROUP_REQUESTS = [
    (ApiKey.FIND_COORDINATOR, 1, Writer().string("g").int8(0).getvalue()),
    (ApiKey.JOIN_GROUP, 2, join_v2("", session_ms=5000, rebalance_ms=5000)),
    (ApiKey.SYNC_GROUP, 1, sync_v1("m", 1, b"x")),
    (ApiKey.HEARTBEAT, 1, member_request("m", 1)),
    (ApiKey.LEAVE_GROUP, 1, Writer().string("g").string("m").getvalue()),
    (ApiKey.OFFSET_COMMIT, 3, commit_v2("g", -1, "", 1)),
    (ApiKey.OFFSET_FETCH, 3, Writer().string("g").int32(-1).getvalue()),
]


async def test_truncated_or_padded_group_requests_close_only_their_connection() -> None:
    async with running_broker(**GROUP_SETTINGS) as broker:
        for api, version, body in GROUP_REQUESTS:
            for bad in (body[:-1], body[: len(body) // 2], body + b"\0"):
                conn = await RawConnection.open("127.0.0.1", broker.port)
                conn.send(api, version, bad)
                assert await conn.closed_by_peer(), (api, len(bad))
                await conn.close()
        # Still serving: FindCoordinator names this broker.
        conn = await RawConnection.open("127.0.0.1", broker.port)
        try:
            reply = await conn.request(*GROUP_REQUESTS[0])
            reply.int32()
            assert reply.int16() == ErrorCode.NONE
            reply.nullable_string()
            assert (reply.int32(), reply.string(), reply.int32()) == (0, "127.0.0.1", broker.port)
        finally:
            await conn.close()
        assert group_pending(broker) == (0, 0)
