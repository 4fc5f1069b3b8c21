"""The example broker's codec, record batches and log, and its robustness on raw sockets."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatch
from hypothesis import given
from hypothesis import strategies as st

from examples.broker import Broker, BrokerConfig, TopicPartition
from examples.broker.codec import DecodeError, Reader, Writer
from examples.broker.messages import SUPPORTED_VERSIONS, ApiKey, ErrorCode
from examples.broker.partition import PartitionLog
from examples.broker.rawclient import RawConnection, build_fetch_v4, build_produce_v3
from examples.broker.records import InvalidBatchError, crc32c, parse_batches
from tests.support.broker import (
    RecordingLogger,
    eventually,
    fetch_result,
    frame,
    make_batch,
    produce_result,
    producer,
    raw,
    running_broker,
)

# -- helpers ---------------------------------------------------------------------------------


async def send_parking_fetch_and_produce(broker: Broker) -> tuple[RawConnection, RawConnection]:
    """Stall both followers, then send on two new connections requests that will park.

    Returns:
        The connections of a long-poll Fetch of ``t-0`` (60 s max wait) and of an
        acks=all Produce of one record to ``t-0``.
    """
    broker.stall_follower(1)
    broker.stall_follower(2)
    fetcher = await RawConnection.open("127.0.0.1", broker.port)
    fetcher.send(ApiKey.FETCH, 4, build_fetch_v4("t", 0, 0, max_wait_ms=60_000))
    producer_conn = await RawConnection.open("127.0.0.1", broker.port)
    producer_conn.send(ApiKey.PRODUCE, 3, build_produce_v3("t", 0, make_batch([b"x"])))
    return fetcher, producer_conn


# -- codec --------------------------------------------------------------------------------------


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_varint_round_trip(value: int) -> None:
    data = Writer().varint(value).getvalue()
    reader = Reader(data)
    assert reader.varint() == value
    assert reader.remaining == 0


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_varlong_round_trip(value: int) -> None:
    assert Reader(Writer().varlong(value).getvalue()).varlong() == value


@given(
    st.one_of(st.none(), st.text(max_size=50)),
    st.one_of(st.none(), st.binary(max_size=50)),
    st.dictionaries(st.integers(0, 1000), st.binary(max_size=10), max_size=4),
)
def test_compact_and_classic_types_round_trip(
    text: str | None, blob: bytes | None, tags: dict[int, bytes]
) -> None:
    w = Writer().nullable_string(text).compact_nullable_string(text)
    w.nullable_bytes(blob).compact_nullable_bytes(blob).tagged_fields(tags)
    w.compact_array([1, 2, 3], Writer.int32).array(None, Writer.int32).int64(-5).boolean(True)
    r = Reader(w.getvalue())
    assert r.nullable_string() == text
    assert r.compact_nullable_string() == text
    assert r.nullable_bytes() == blob
    assert r.compact_nullable_bytes() == blob
    assert r.tagged_fields() == tags
    assert r.compact_array(Reader.int32, 4) == [1, 2, 3]
    assert r.nullable_array(Reader.int32, 4) is None
    assert (r.int64(), r.boolean(), r.remaining) == (-5, True, 0)


def test_known_encodings() -> None:
    assert Writer().unsigned_varint(300).getvalue() == b"\xac\x02"
    assert Writer().varint(-1).getvalue() == b"\x01"
    assert Writer().compact_string("ab").getvalue() == b"\x03ab"
    assert Writer().compact_nullable_string(None).getvalue() == b"\x00"
    assert Writer().nullable_string(None).getvalue() == b"\xff\xff"


@pytest.mark.parametrize(
    ("data", "method"),
    [
        (b"\x00", Reader.int32),
        (b"\x00\x05ab", Reader.string),
        (b"\xff\xfe", Reader.nullable_string),
        (b"\x80\x80", Reader.unsigned_varint),
        (b"\xff" * 11, Reader.unsigned_varint),
        (b"\x00\x02\xff\xfe", Reader.string),  # not UTF-8
        (b"\xff\xff", Reader.string),  # null where required
        (b"\x7f\xff\xff\xff", lambda r: r.array(Reader.int32, 4)),  # forged huge count
        (b"\x02\x05\x00\x03\x00", Reader.tagged_fields),  # tags out of order
    ],
)
def test_reader_rejects_bad_input(data: bytes, method: Any) -> None:
    with pytest.raises(DecodeError):
        method(Reader(data))


# -- record batches and the log -------------------------------------------------------------------


def test_crc32c_known_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283


def test_rewriting_base_offset_keeps_crc_valid() -> None:
    records = make_batch([b"a", b"b", b"c"])
    headers = parse_batches(records)
    assert [h.offset_count for h in headers] == [3]
    log = PartitionLog()
    log.append(make_batch([b"x"]), parse_batches(make_batch([b"x"])))
    assert log.append(records, headers) == 1
    stored = log.batches[1]
    assert stored[8:] == records[8:]  # only baseOffset changed
    batch = DefaultRecordBatch(stored)
    assert batch.base_offset == 1
    assert batch.validate_crc()
    assert [r.offset for r in batch] == [1, 2, 3]
    assert [r.value for r in DefaultRecordBatch(stored)] == [b"a", b"b", b"c"]


def test_parse_batches_rejects_corruption() -> None:
    good = make_batch([b"payload"])
    corrupted = good[:-1] + bytes([good[-1] ^ 0xFF])
    with pytest.raises(InvalidBatchError, match="CRC"):
        parse_batches(corrupted)
    assert parse_batches(corrupted, verify_crc=False)
    with pytest.raises(InvalidBatchError):
        parse_batches(good[:-3])
    with pytest.raises(InvalidBatchError):
        parse_batches(b"")
    old_magic = good[:16] + b"\x01" + good[17:]
    with pytest.raises(InvalidBatchError) as info:
        parse_batches(old_magic, verify_crc=False)
    assert not info.value.corrupt
    two = good + make_batch([b"p", b"q"])
    assert [h.offset_count for h in parse_batches(two)] == [1, 2]


def test_log_read_limits_and_bounds() -> None:
    log = PartitionLog()
    sizes = []
    for i in range(4):
        batch = make_batch([b"v%d" % i, b"w%d" % i])
        sizes.append(len(batch))
        log.append(batch, parse_batches(batch))
    assert log.log_end_offset == 8
    assert log.bytes_between(0, 8) == sum(sizes)
    assert log.bytes_between(3, 6) == sizes[1] + sizes[2]  # offset 3 is inside batch 1
    assert log.bytes_between(6, 6) == 0
    assert log.read(0, 4, 10_000, min_one=False) == log.batches[0] + log.batches[1]
    assert log.read(0, 8, sizes[0] + 1, min_one=False) == log.batches[0]
    assert log.read(0, 8, 5, min_one=False) == b""
    assert log.read(0, 8, 5, min_one=True) == log.batches[0]  # KIP-74: progress
    assert log.read(8, 8, 10_000, min_one=True) == b""


def test_config_validation_names_the_argument() -> None:
    with pytest.raises(ValueError, match="port"):
        BrokerConfig(port=70000)
    with pytest.raises(TypeError, match="followers"):
        BrokerConfig(followers=True)
    with pytest.raises(ValueError, match="follower_lag"):
        BrokerConfig(follower_lag=float("nan"))
    with pytest.raises(ValueError, match="topics"):
        BrokerConfig(topics={"bad name": 1})
    with pytest.raises(TypeError, match="config"):
        Broker({"port": 0})  # type: ignore[arg-type]


# -- protocol over raw sockets ---------------------------------------------------------------------


async def test_api_versions_v0_and_flexible_v3() -> None:
    async with running_broker() as broker, raw(broker) as conn:
        body = await conn.request(ApiKey.API_VERSIONS, 0, b"")
        assert body.int16() == ErrorCode.NONE
        entries = body.array(lambda r: (r.int16(), r.int16(), r.int16()), 6)
        assert {k: (lo, hi) for k, lo, hi in entries} == SUPPORTED_VERSIONS
        # v3 is flexible: header v2 on the request, compact types and tagged fields.
        request = Writer().compact_string("raw-test").compact_string("1.0").tagged_fields()
        body = await conn.request(ApiKey.API_VERSIONS, 3, request.getvalue())
        assert body.int16() == ErrorCode.NONE

        def entry(r: Reader) -> tuple[int, int, int]:
            item = (r.int16(), r.int16(), r.int16())
            r.tagged_fields()
            return item

        assert len(body.compact_array(entry, 7)) == len(SUPPORTED_VERSIONS)
        assert body.int32() == 0
        assert body.tagged_fields() == {}
        assert body.remaining == 0
        # A version from the future: v0 answer with UNSUPPORTED_VERSION and the ranges.
        body = await conn.request(ApiKey.API_VERSIONS, 9, Writer().tagged_fields().getvalue())
        assert body.int16() == ErrorCode.UNSUPPORTED_VERSION
        assert len(body.array(lambda r: (r.int16(), r.int16(), r.int16()), 6)) == len(
            SUPPORTED_VERSIONS
        )


async def test_server_side_produce_expiry_answers_request_timed_out() -> None:
    async with running_broker(topics={"t": 1}) as broker, raw(broker) as conn:
        broker.stall_follower(1)
        broker.stall_follower(2)
        request = build_produce_v3("t", 0, make_batch([b"late"]), timeout_ms=100)
        error, offset = produce_result(await conn.request(ApiKey.PRODUCE, 3, request))
        assert (error, offset) == (ErrorCode.REQUEST_TIMED_OUT, 0)
        stats = broker.statistics()["produce"]
        assert (stats.expired, stats.pending) == (1, 0)


async def test_not_enough_replicas_after_append() -> None:
    async with running_broker(topics={"t": 1}) as broker, raw(broker) as conn:
        broker.stall_follower(1)
        broker.stall_follower(2)
        conn.send(ApiKey.PRODUCE, 3, build_produce_v3("t", 0, make_batch([b"v"])))
        await conn.writer.drain()
        await eventually(lambda: broker.produce_purgatory.pending == 1)
        await broker.crash_follower(1)
        await broker.crash_follower(2)  # ISR {0}: the HW passes the batch, but too few replicas
        _, body = await conn.receive(ApiKey.PRODUCE, 3)
        assert produce_result(body) == (ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, 0)


async def test_produce_errors_per_partition() -> None:
    async with (
        running_broker(topics={"t": 1}, max_message_bytes=200) as broker,
        raw(broker) as conn,
    ):
        good = make_batch([b"ok"])
        corrupted = good[:-1] + bytes([good[-1] ^ 1])
        cases = [
            (build_produce_v3("t", 0, corrupted), ErrorCode.CORRUPT_MESSAGE),
            (build_produce_v3("t", 7, good), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
            (build_produce_v3("t", 0, make_batch([b"x" * 300])), ErrorCode.MESSAGE_TOO_LARGE),
            (build_produce_v3("t", 0, good, acks=2), ErrorCode.INVALID_REQUIRED_ACKS),
            (build_produce_v3("t", 0, None), ErrorCode.CORRUPT_MESSAGE),
        ]
        for request, expected in cases:
            error, _ = produce_result(await conn.request(ApiKey.PRODUCE, 3, request))
            assert error == expected
        assert broker.partitions[TopicPartition("t", 0)].log_end_offset == 0
        error, offset = produce_result(
            await conn.request(ApiKey.PRODUCE, 3, build_produce_v3("t", 0, good))
        )
        assert (error, offset) == (ErrorCode.NONE, 0)


async def test_fetch_out_of_range_and_data() -> None:
    async with running_broker(topics={"t": 1}) as broker, raw(broker) as conn:
        batch = make_batch([b"a", b"b"])
        produce_result(await conn.request(ApiKey.PRODUCE, 3, build_produce_v3("t", 0, batch)))
        body = await conn.request(ApiKey.FETCH, 4, build_fetch_v4("t", 0, 99, max_wait_ms=5000))
        assert fetch_result(body)[0] == ErrorCode.OFFSET_OUT_OF_RANGE
        body = await conn.request(ApiKey.FETCH, 4, build_fetch_v4("t", 0, 1, max_wait_ms=5000))
        error, hw, records = fetch_result(body)
        assert (error, hw) == (ErrorCode.NONE, 2)
        assert [r.value for r in DefaultRecordBatch(records)] == [b"a", b"b"]


async def test_disconnect_mid_wait_cancels_delayed_ops() -> None:
    async with running_broker(topics={"t": 1}) as broker:
        fetcher, producer_conn = await send_parking_fetch_and_produce(broker)
        await eventually(
            lambda: broker.produce_purgatory.pending == 1 and broker.fetch_purgatory.pending == 1
        )
        fetcher.writer.transport.abort()  # abrupt: RST, no FIN
        await producer_conn.close()
        await eventually(
            lambda: broker.produce_purgatory.pending == 0 and broker.fetch_purgatory.pending == 0
        )
        for name in ("produce", "fetch"):
            stats = broker.statistics()[name]
            assert (stats.pending, stats.watched, stats.delayed, stats.keys) == (0, 0, 0, 0)
            assert stats.cancelled == 1
        await eventually(lambda: broker.connection_count == 0)


async def test_bad_input_closes_only_that_connection() -> None:
    async with running_broker(topics={"t": 1}, max_frame_bytes=1024) as broker:
        log = broker.log
        assert isinstance(log, RecordingLogger)
        async with producer(broker, acks="all") as survivor:
            await survivor.send_and_wait("t", b"before")

            async def attempt(data: bytes, *, then_close: bool = False) -> bool:
                conn = await RawConnection.open("127.0.0.1", broker.port)
                conn.write_raw(data)
                if then_close:
                    await conn.close()
                    return True
                closed = await conn.closed_by_peer()
                await conn.close()
                return closed

            header = Writer().int16(ApiKey.METADATA).int16(1).int32(7).string("x").getvalue()
            unknown = Writer().int16(24).int16(0).int32(1).string("x").getvalue()
            old_version = Writer().int16(ApiKey.PRODUCE).int16(0).int32(1).string("x")
            assert await attempt(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # garbage
            assert await attempt(struct.pack(">i", 10_000) + b"\x00" * 100)  # oversize
            assert await attempt(struct.pack(">i", -5))  # negative size
            assert await attempt(frame(header + b"\x00\x00"))  # truncated body
            assert await attempt(frame(b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x09"))  # header
            assert await attempt(frame(header + b"\x00\x00\x00\x00\xff"))  # trailing bytes
            assert await attempt(frame(unknown))  # unknown API key (AddPartitionsToTxn)
            assert await attempt(frame(old_version.getvalue()))  # unsupported version
            await attempt(struct.pack(">i", 100) + b"\x00" * 10, then_close=True)  # cut short
            await attempt(b"\x00\x00", then_close=True)  # cut inside the size

            await eventually(lambda: "broker.truncated_frame" in log.names())
            names = log.names()
            for event in (
                "broker.frame_rejected",
                "broker.malformed_request",
                "broker.malformed_header",
                "broker.unknown_api_key",
                "broker.unsupported_version",
            ):
                assert event in names
            assert broker.unknown_api_keys == {24: 1}
            # The connection that behaved keeps working, and so do new ones.
            md = await survivor.send_and_wait("t", b"after")
            assert md.offset == 1
        async with producer(broker, acks="all") as newcomer:
            assert (await newcomer.send_and_wait("t", b"new")).offset == 2
        assert "broker.handler_failed" not in log.names()


async def test_close_answers_parked_requests_and_closes_sockets() -> None:
    broker = Broker(BrokerConfig(port=0, stats_interval=0, topics={"t": 1}))
    await broker.start()
    fetcher, producer_conn = await send_parking_fetch_and_produce(broker)
    idle = await RawConnection.open("127.0.0.1", broker.port)
    await eventually(
        lambda: broker.produce_purgatory.pending == 1 and broker.fetch_purgatory.pending == 1
    )
    await asyncio.wait_for(broker.close(), 10)
    _, body = await producer_conn.receive(ApiKey.PRODUCE, 3)
    assert produce_result(body) == (ErrorCode.REQUEST_TIMED_OUT, 0)
    _, body = await fetcher.receive(ApiKey.FETCH, 4)
    assert fetch_result(body) == (ErrorCode.NONE, 0, b"")  # nothing committed: HW 0
    for conn in (fetcher, producer_conn, idle):
        assert await conn.closed_by_peer()
        await conn.close()
    assert broker.connection_count == 0
    await broker.close()  # idempotent
    with pytest.raises(ConnectionError):
        await RawConnection.open("127.0.0.1", broker.port)
