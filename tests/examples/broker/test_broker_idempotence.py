"""Idempotent producers on the example broker: raw requests, and confluent-kafka for real.

The raw tests send hand-built batches (aiokafka's batch builder, so the CRC is
right) with chosen producer ids, epochs and sequences and read the answers; the
confluent-kafka test runs librdkafka's idempotent producer against a stalled
follower, so that its produce requests time out in the produce purgatory and
are retried with the same sequences, and checks that every message is in the
log exactly once, at the offset its delivery report gave.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition as KafkaTopicPartition
from confluent_kafka import KafkaException, Producer

from examples.broker import Broker, TopicPartition
from examples.broker.codec import Writer
from examples.broker.idempotence import (
    MAX_IN_FLIGHT,
    ProducerIdManager,
    ProducerStates,
    last_sequence,
)
from examples.broker.messages import ApiKey, ErrorCode
from examples.broker.rawclient import RawConnection, build_produce_v3
from examples.broker.records import parse_batches
from tests.support.broker import (
    consumer,
    eventually,
    make_batch,
    produce_result,
    producer,
    raw,
    running_broker,
)

pytestmark = pytest.mark.realtime


async def init_producer_id(
    conn: RawConnection,
    version: int = 0,
    *,
    transactional_id: str | None = None,
    producer_id: int = -1,
    epoch: int = -1,
) -> tuple[int, int, int]:
    """InitProducerId; (error, producer id, epoch). v2+ is flexible, v3+ names the current id."""
    w = Writer()
    if version >= 2:
        w.compact_nullable_string(transactional_id)
    else:
        w.nullable_string(transactional_id)
    w.int32(60_000)
    if version >= 3:
        w.int64(producer_id).int16(epoch)
    if version >= 2:
        w.tagged_fields()
    body = await conn.request(ApiKey.INIT_PRODUCER_ID, version, w.getvalue())
    assert body.int32() == 0  # throttle
    answer = body.int16(), body.int64(), body.int16()
    if version >= 2:
        body.tagged_fields()
    assert body.remaining == 0
    return answer


async def produce(
    conn: RawConnection,
    values: list[bytes],
    *,
    pid: int,
    epoch: int,
    seq: int,
    partition: int = 0,
    acks: int = -1,
    timeout_ms: int = 10_000,
) -> tuple[int, int]:
    """Produce one idempotent batch to t-<partition>; (error, base offset)."""
    batch = make_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    body = build_produce_v3("t", partition, batch, acks=acks, timeout_ms=timeout_ms)
    return produce_result(await conn.request(ApiKey.PRODUCE, 3, body))


def log_values(broker: Broker, partition: int = 0) -> list[int]:
    """Base offsets of the batches in t-<partition>'s log."""
    return list(broker.partitions[TopicPartition("t", partition)].log.base_offsets)


# -- sans-IO rules ---------------------------------------------------------------------------


def test_sequences_wrap_and_ids_bump_their_epoch() -> None:
    assert last_sequence(0, 4) == 4
    assert last_sequence(2**31 - 2, 3) == 1  # ..., 2**31 - 1, 0, 1
    ids = ProducerIdManager()
    first = ids.init_producer()
    second = ids.init_producer()
    assert first[0] != second[0]
    assert first[1] == second[1] == 0
    assert ids.init_producer(*first) == (first[0], 1)  # current id and epoch: bumped
    assert ids.check(first[0], 0) == ErrorCode.INVALID_PRODUCER_EPOCH  # the old epoch is fenced
    assert ids.check(first[0], 1) == ErrorCode.NONE
    assert ids.init_producer(first[0], 0)[0] not in (first[0], second[0])  # stale: a fresh id
    assert ids.check(999_999, 0) == ErrorCode.UNKNOWN_PRODUCER_ID


def test_partition_state_remembers_the_last_five_batches() -> None:
    states = ProducerStates()

    def header(seq: int, count: int = 1, epoch: int = 0) -> Any:
        batch = make_batch([b"v"] * count, producer_id=7, producer_epoch=epoch, base_sequence=seq)
        return parse_batches(batch)[0]

    assert states.check(header(3)) == (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None)
    offset = 0
    for seq in range(0, 2 * (MAX_IN_FLIGHT + 1), 2):  # six batches of two records
        assert states.check(header(seq, 2)) == (ErrorCode.NONE, None)
        states.record(header(seq, 2), offset)
        offset += 2
    # The last five are known duplicates (with their offsets); the first is forgotten.
    error, duplicate = states.check(header(2, 2))
    assert error == ErrorCode.NONE
    assert duplicate is not None
    assert (duplicate.first_offset, duplicate.end_offset) == (2, 4)
    assert states.check(header(0, 2)) == (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None)
    assert states.check(header(13)) == (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None)
    assert states.check(header(12)) == (ErrorCode.NONE, None)
    # A new epoch starts again at 0; an older one is refused.
    assert states.check(header(5, epoch=1)) == (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None)
    states.record(header(0, epoch=1), 12)
    assert states.check(header(12, epoch=0)) == (ErrorCode.INVALID_PRODUCER_EPOCH, None)
    assert states.check(header(-3, epoch=1)) == (ErrorCode.INVALID_RECORD, None)


# -- raw protocol ------------------------------------------------------------------------------


async def test_replayed_batch_gets_its_original_offset() -> None:
    async with running_broker(topics={"t": 1}) as broker, raw(broker) as conn:
        error, pid, epoch = await init_producer_id(conn)
        assert error == ErrorCode.NONE
        assert pid >= 0
        assert epoch == 0
        assert await produce(conn, [b"a", b"b"], pid=pid, epoch=epoch, seq=0) == (0, 0)
        assert await produce(conn, [b"c"], pid=pid, epoch=epoch, seq=2) == (0, 2)
        # The client did not hear the first answer and sends the same batch again.
        assert await produce(conn, [b"a", b"b"], pid=pid, epoch=epoch, seq=0) == (0, 0)
        assert await produce(conn, [b"c"], pid=pid, epoch=epoch, seq=2) == (0, 2)
        assert log_values(broker) == [0, 2]  # nothing appended twice
        assert broker.partitions[TopicPartition("t", 0)].log_end_offset == 3
        names = broker.log.names()
        assert names.count("broker.produce_duplicate") == 2
        # In order again after the replays.
        assert await produce(conn, [b"d"], pid=pid, epoch=epoch, seq=3) == (0, 3)


async def test_gaps_stale_epochs_and_bad_sequences_get_kafka_error_codes() -> None:
    async with running_broker(topics={"t": 2}) as broker, raw(broker) as conn:
        _, pid, epoch = await init_producer_id(conn)
        assert await produce(conn, [b"a"], pid=pid, epoch=epoch, seq=0) == (0, 0)
        gap = await produce(conn, [b"b"], pid=pid, epoch=epoch, seq=2)
        assert gap == (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
        first_on_partition = await produce(conn, [b"b"], pid=pid, epoch=epoch, seq=4, partition=1)
        assert first_on_partition == (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
        negative = await produce(conn, [b"b"], pid=pid, epoch=epoch, seq=-5)
        assert negative == (ErrorCode.INVALID_RECORD, -1)
        unknown = await produce(conn, [b"b"], pid=pid + 10_000, epoch=0, seq=0)
        assert unknown == (ErrorCode.UNKNOWN_PRODUCER_ID, -1)
        # KIP-360: the producer bumps its epoch (InitProducerId v3, flexible); the
        # old epoch is fenced, the new one starts at sequence 0.
        error, same_pid, new_epoch = await init_producer_id(conn, 3, producer_id=pid, epoch=epoch)
        assert (error, same_pid, new_epoch) == (ErrorCode.NONE, pid, epoch + 1)
        stale = await produce(conn, [b"b"], pid=pid, epoch=epoch, seq=1)
        assert stale == (ErrorCode.INVALID_PRODUCER_EPOCH, -1)
        assert await produce(conn, [b"b"], pid=pid, epoch=new_epoch, seq=0) == (0, 1)
        # Two batches of one producer in one partition's records: Kafka's INVALID_RECORD.
        two = make_batch([b"x"], producer_id=pid, producer_epoch=new_epoch, base_sequence=1)
        two += make_batch([b"y"], producer_id=pid, producer_epoch=new_epoch, base_sequence=2)
        body = await conn.request(ApiKey.PRODUCE, 3, build_produce_v3("t", 0, two))
        assert produce_result(body) == (ErrorCode.INVALID_RECORD, -1)
        assert log_values(broker) == [0, 1]  # only the accepted batches
        assert await produce(conn, [b"c"], pid=pid, epoch=new_epoch, seq=1) == (0, 2)
        assert broker.connection_count == 1  # every refusal was an answer, not a hang-up


async def test_transactions_are_refused_with_the_authorization_error() -> None:
    async with running_broker(topics={"t": 1}) as broker, raw(broker) as conn:
        error, pid, _ = await init_producer_id(conn, 0, transactional_id="tx")
        assert (error, pid) == (ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1)
        error, pid, _ = await init_producer_id(conn, 4, transactional_id="tx")
        assert (error, pid) == (ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1)
        find = Writer().string("tx").int8(1).getvalue()  # FindCoordinator v1, key type 1
        body = await conn.request(ApiKey.FIND_COORDINATOR, 1, find)
        body.int32()
        assert body.int16() == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        _, pid, epoch = await init_producer_id(conn)
        batch = make_batch([b"x"], producer_id=pid, producer_epoch=epoch, base_sequence=0,
                           transactional=True)  # fmt: skip
        body = await conn.request(ApiKey.PRODUCE, 3, build_produce_v3("t", 0, batch))
        assert produce_result(body) == (ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1)
        assert log_values(broker) == []


async def test_retry_of_a_timed_out_batch_waits_in_the_produce_purgatory() -> None:
    async with running_broker(topics={"t": 1}) as broker, raw(broker) as conn:
        _, pid, epoch = await init_producer_id(conn)
        broker.stall_follower(1)
        broker.stall_follower(2)
        # acks=all cannot complete: the produce expires in the purgatory.
        timed_out = await produce(conn, [b"a"], pid=pid, epoch=epoch, seq=0, timeout_ms=100)
        assert timed_out == (ErrorCode.REQUEST_TIMED_OUT, 0)
        # The retry is a duplicate: not appended, parked for the HW to pass the original.
        retry = asyncio.ensure_future(
            produce(conn, [b"a"], pid=pid, epoch=epoch, seq=0, timeout_ms=30_000)
        )
        await eventually(lambda: broker.produce_purgatory.statistics().delayed == 1)
        assert not retry.done()
        broker.resume_follower(1)
        broker.resume_follower(2)
        assert await asyncio.wait_for(retry, 10) == (ErrorCode.NONE, 0)
        assert log_values(broker) == [0]
        assert broker.partitions[TopicPartition("t", 0)].high_watermark == 1


async def test_five_batches_in_flight_and_all_their_retries() -> None:
    """Five pipelined batches, then all five again (acks=all): each retry is recognised.

    The retries wait in the produce purgatory for the stalled followers, one at a
    time, since a connection's requests are handled in order (as Kafka does).
    """
    async with running_broker(topics={"t": 1}) as broker, raw(broker) as first:
        _, pid, epoch = await init_producer_id(first)
        broker.stall_follower(1)
        broker.stall_follower(2)
        batches = [
            make_batch([b"r"] * 2, producer_id=pid, producer_epoch=epoch, base_sequence=2 * i)
            for i in range(MAX_IN_FLIGHT)
        ]

        async def pipelined(conn: RawConnection, acks: int) -> list[tuple[int, int]]:
            for batch in batches:
                body = build_produce_v3("t", 0, batch, acks=acks, timeout_ms=30_000)
                conn.send(ApiKey.PRODUCE, 3, body)
            await conn.writer.drain()
            return [produce_result((await conn.receive(ApiKey.PRODUCE, 3))[1]) for _ in batches]

        expected = [(ErrorCode.NONE, 2 * i) for i in range(MAX_IN_FLIGHT)]
        assert await pipelined(first, acks=1) == expected
        async with raw(broker) as second:
            retries = asyncio.ensure_future(pipelined(second, acks=-1))
            await eventually(lambda: broker.produce_purgatory.statistics().delayed == 1)
            assert "broker.produce_duplicate" in broker.log.names()
            broker.resume_follower(1)
            broker.resume_follower(2)
            assert await asyncio.wait_for(retries, 10) == expected
        assert broker.log.names().count("broker.produce_duplicate") == MAX_IN_FLIGHT
        assert log_values(broker) == [0, 2, 4, 6, 8]


async def test_aiokafka_idempotent_producer_gets_an_id_and_sends_sequences() -> None:
    async with running_broker(topics={"t": 2}) as broker:
        async with producer(broker, enable_idempotence=True) as prod:
            sent = [await prod.send_and_wait("t", b"v", partition=i % 2) for i in range(6)]
        assert [(m.partition, m.offset) for m in sent] == [(i % 2, i // 2) for i in range(6)]
        assert broker.request_counts["InitProducerId", 0] == 1
        assert len(broker.producer_ids) == 1
        for p in (0, 1):  # each partition tracks the producer's sequence
            assert len(broker.partitions[TopicPartition("t", p)].producers) == 1


# -- confluent-kafka -------------------------------------------------------------------------


def _produce_with_librdkafka(
    bootstrap: str, topic: str, count: int, partitions: int
) -> dict[tuple[int, int], bytes]:
    """Send ``count`` messages idempotently; (partition, offset) -> value from delivery reports."""
    delivered: dict[tuple[int, int], bytes] = {}
    failures: list[Any] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(err)
        else:
            delivered[msg.partition(), msg.offset()] = msg.value()

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            # Shorter than the follower stall: requests expire in the produce
            # purgatory (REQUEST_TIMED_OUT) and are retried with their sequences.
            "request.timeout.ms": 300,
            "message.timeout.ms": 60_000,
            "retry.backoff.ms": 50,
            "linger.ms": 5,
            "batch.num.messages": 7,
        }
    )
    for i in range(count):
        producer.produce(topic, f"m{i}".encode(), partition=i % partitions, on_delivery=report)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures, failures
    return delivered


async def test_confluent_idempotent_producer_with_a_stalled_follower() -> None:
    count, partitions = 400, 3
    async with running_broker(topics={"idem": partitions}, replica_lag_time_max=60) as broker:
        bootstrap = f"127.0.0.1:{broker.port}"
        # Follower 1 stays in the ISR (replica_lag_time_max) but fetches nothing, so
        # no acks=all produce can complete until it resumes.
        broker.stall_follower(1)
        sending = asyncio.ensure_future(
            asyncio.to_thread(_produce_with_librdkafka, bootstrap, "idem", count, partitions)
        )
        produce_stats = broker.produce_purgatory.statistics
        await eventually(lambda: produce_stats().expired >= 3, within=30)
        broker.resume_follower(1)
        delivered = await asyncio.wait_for(sending, 90)
        assert len(delivered) == count
        # Requests expired in the purgatory, and their retries were recognised.
        assert "broker.produce_duplicate" in broker.log.names()
        async with consumer(broker, auto_offset_reset="earliest") as reader:
            reader.assign([KafkaTopicPartition("idem", p) for p in range(partitions)])
            got: dict[tuple[int, int], bytes] = {}
            async with asyncio.timeout(30):
                while len(got) < count:
                    for tp, messages in (await reader.getmany(timeout_ms=500)).items():
                        for m in messages:
                            assert (tp.partition, m.offset) not in got
                            got[tp.partition, m.offset] = m.value or b""
        # Exactly once, at the offsets the delivery reports gave, in order per partition.
        assert got == delivered
        for p in range(partitions):
            offsets = sorted(o for q, o in got if q == p)
            assert offsets == list(range(len(offsets)))
            numbers = [int(got[p, o][1:]) for o in offsets]
            assert numbers == sorted(numbers)
            assert numbers == list(range(p, count, partitions))


def _init_transactions(bootstrap: str) -> Any:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "tx"})
    with pytest.raises(KafkaException) as raised:
        producer.init_transactions(30)
    return raised.value.args[0]


async def test_confluent_transactional_producer_is_refused_at_once() -> None:
    async with running_broker(topics={"t": 1}) as broker:
        loop = asyncio.get_running_loop()
        started = loop.time()
        error = await asyncio.to_thread(_init_transactions, f"127.0.0.1:{broker.port}")
        assert error.code() == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert error.fatal()
        assert loop.time() - started < 20  # not the 30 s of retrying a "not available"
