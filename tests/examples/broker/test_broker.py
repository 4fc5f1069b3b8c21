"""The example broker against real, unmodified aiokafka clients on loopback.

Each test starts its own broker on a free port in-process. Timings are checked
only as "never early" lower bounds with generous upper bounds.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import NotEnoughReplicasError, RequestTimedOutError

import aiopurgatory as ap
from examples.broker import TopicPartition
from examples.broker.loadtest import run_load
from tests.support.broker import consumer, eventually, producer, running_broker

pytestmark = pytest.mark.realtime


@pytest.fixture(autouse=True)
def _quiet_aiokafka() -> None:
    # aiokafka logs retries at WARNING; the tests provoke them on purpose.
    logging.getLogger("aiokafka").setLevel(logging.ERROR)


async def test_acks_all_produce_then_consume_in_order() -> None:
    n, partitions = 90, 3
    async with running_broker(topics={"orders": partitions}) as broker:
        async with producer(broker, acks="all") as prod:
            futures = [
                await prod.send("orders", f"value-{i}".encode(), key=b"k%d" % i, partition=i % 3)
                for i in range(n)
            ]
            metadata = await asyncio.gather(*futures)
        stats = broker.statistics()["produce"]
        assert stats.pending == 0
        assert stats.completed >= 1  # acks=all went through the purgatory
        # Each parked produce was completed by an advance of its partition's HW.
        assert stats.advances >= 1
        assert broker.statistics()["replica_fetch"].advances >= 1  # appends woke followers
        by_partition: dict[int, list[int]] = {}
        for i, md in enumerate(metadata):
            assert md.partition == i % 3
            by_partition.setdefault(md.partition, []).append(md.offset)
        for offsets in by_partition.values():
            assert offsets == list(range(len(offsets)))  # increasing, no gaps, from 0
        for tp in broker.partitions.values():
            assert tp.high_watermark == tp.log_end_offset == n // partitions

        async with consumer(broker, fetch_max_wait_ms=200) as cons:
            tps = [KafkaTopicPartition("orders", p) for p in range(partitions)]
            cons.assign(tps)
            await cons.seek_to_beginning(*tps)
            got: dict[int, list[tuple[int, bytes | None, bytes | None]]] = {}
            async with asyncio.timeout(20):
                while sum(len(v) for v in got.values()) < n:
                    for tp, messages in (await cons.getmany(timeout_ms=500)).items():
                        got.setdefault(tp.partition, []).extend(
                            (m.offset, m.key, m.value) for m in messages
                        )
        for p in range(partitions):
            expected = [
                (md.offset, b"k%d" % i, f"value-{i}".encode())
                for i, md in enumerate(metadata)
                if md.partition == p
            ]
            assert got[p] == expected


async def test_negotiated_versions_and_compressed_batches() -> None:
    async with running_broker() as broker:
        async with producer(broker, acks="all", compression_type="gzip") as prod:
            for i in range(5):
                await prod.send("zipped", b"value-%d" % i, partition=0)
            await prod.flush()
        async with consumer(broker) as cons:
            tp = KafkaTopicPartition("zipped", 0)
            cons.assign([tp])
            await cons.seek_to_beginning(tp)
            batch = await cons.getmany(timeout_ms=2000)
        assert [m.value for m in batch[tp]] == [b"value-%d" % i for i in range(5)]
        assert broker.topics == {"zipped": 3}  # auto-created with default_partitions
        used = set(broker.request_counts)
        assert {("Produce", 7), ("Fetch", 11), ("Metadata", 5), ("ApiVersions", 0)} <= used
        assert ("ListOffsets", 3) in used
        assert broker.unknown_api_keys == {}


async def test_acks_1_and_0_do_not_wait_for_followers() -> None:
    async with running_broker(topics={"t": 1}) as broker:
        broker.stall_follower(1)
        broker.stall_follower(2)
        async with producer(broker, acks=1, request_timeout_ms=2000) as prod:
            md = await prod.send_and_wait("t", b"one")
            assert md.offset == 0
        async with producer(broker, acks=0) as prod:
            await prod.send_and_wait("t", b"zero")
            await eventually(lambda: broker.partitions[TopicPartition("t", 0)].log_end_offset == 2)
        assert broker.statistics()["produce"].completed == 0
        # The followers never fetched the records, so the HW did not move.
        assert broker.partitions[TopicPartition("t", 0)].high_watermark == 0


async def test_empty_fetch_long_polls_for_fetch_max_wait() -> None:
    max_wait = 0.3
    async with running_broker(topics={"quiet": 1}) as broker:
        loop = asyncio.get_running_loop()
        lifetimes: list[float] = []

        def record(op: ap.DelayedOperation) -> None:
            assert op.deadline is not None
            if op.outcome is ap.Outcome.EXPIRED:
                lifetimes.append(loop.time() - (op.deadline - op.timeout))

        broker.fetch_purgatory.set_recorder(record)
        async with consumer(broker, fetch_max_wait_ms=int(max_wait * 1000)) as cons:
            tp = KafkaTopicPartition("quiet", 0)
            cons.assign([tp])
            await cons.seek_to_beginning(tp)
            assert await cons.getmany(timeout_ms=1500) == {}
        # About 1.5 s / 0.3 s fetches, each parked for max_wait, never less.
        assert 2 <= len(lifetimes) <= 6
        assert all(max_wait - 0.002 <= t < max_wait + 0.5 for t in lifetimes), lifetimes


async def test_long_poll_is_completed_by_produce() -> None:
    async with running_broker(topics={"wake": 1}) as broker:
        async with consumer(broker, fetch_max_wait_ms=10_000) as cons:
            tp = KafkaTopicPartition("wake", 0)
            cons.assign([tp])
            await cons.seek_to_beginning(tp)
            getter = asyncio.ensure_future(cons.getone())
            await eventually(lambda: broker.fetch_purgatory.pending == 1)
            async with producer(broker, acks="all") as prod:
                await prod.send_and_wait("wake", b"hello")
            async with asyncio.timeout(5):  # far below fetch_max_wait_ms
                message = await getter
            assert message.value == b"hello"
        stats = broker.statistics()["fetch"]
        assert stats.completed >= 1


async def test_stalled_followers_produce_times_out() -> None:
    async with running_broker(topics={"slow": 1}) as broker:
        async with producer(broker, acks="all", request_timeout_ms=400) as prod:
            await prod.send_and_wait("slow", b"ok")
            broker.stall_follower(1)
            broker.stall_follower(2)
            # Both sides time out at 400 ms (aiokafka uses request_timeout_ms for the
            # produce's timeout field and its own wait); either way it surfaces as this.
            with pytest.raises(RequestTimedOutError):
                await prod.send_and_wait("slow", b"stuck")
            broker.resume_follower(1)
            broker.resume_follower(2)
            md = await prod.send_and_wait("slow", b"later")
        # The timed-out batch stayed in the log (as in Kafka): "later" comes after it.
        # When the broker's REQUEST_TIMED_OUT reaches aiokafka before its own 400 ms
        # wait ends, aiokafka retries the batch (the error is retriable) and it is
        # appended a second time; which side wins is a race on the client.
        assert md.offset in (2, 3)
        await eventually(lambda: broker.statistics()["produce"].pending == 0)


async def test_two_followers_crashed_not_enough_replicas() -> None:
    async with running_broker(topics={"fragile": 1}, min_insync_replicas=2) as broker:
        async with producer(broker, acks="all", request_timeout_ms=600) as prod:
            await prod.send_and_wait("fragile", b"before")
            await broker.crash_follower(1)
            await broker.crash_follower(2)
            assert broker.partitions[TopicPartition("fragile", 0)].isr == {0}
            # Retriable: aiokafka retries until its request timeout, then raises it.
            with pytest.raises(NotEnoughReplicasError):
                await prod.send_and_wait("fragile", b"refused")
            broker.restart_follower(1)
            await eventually(lambda: 1 in broker.partitions[TopicPartition("fragile", 0)].isr)
            md = await prod.send_and_wait("fragile", b"after")
        assert md.offset == 1  # the refused batch was never appended
        names = broker.log.names()
        assert "broker.follower_crashed" in names
        assert "broker.isr_expanded" in names


async def test_follower_lag_delays_acks_all() -> None:
    async with running_broker(topics={"lagged": 1}, follower_lag=0.2) as broker:
        loop = asyncio.get_running_loop()
        async with producer(broker, acks="all") as prod:
            await prod.send_and_wait("lagged", b"warm-up")
            start = loop.time()
            await prod.send_and_wait("lagged", b"x")
            elapsed = loop.time() - start
        assert elapsed >= 0.2 - 0.002


async def test_stalled_follower_leaves_isr_after_lag_time_max() -> None:
    async with running_broker(topics={"isr": 1}, replica_lag_time_max=0.3) as broker:
        partition = broker.partitions[TopicPartition("isr", 0)]
        async with producer(broker, acks="all", request_timeout_ms=5000) as prod:
            await prod.send_and_wait("isr", b"a")
            broker.stall_follower(2)
            # Parked until follower 2 is dropped from the ISR; then {0, 1} suffices.
            md = await prod.send_and_wait("isr", b"b")
            assert md.offset == 1
            assert partition.isr == {0, 1}
            broker.resume_follower(2)
            await eventually(lambda: partition.isr == {0, 1, 2})
        assert "broker.isr_shrunk" in broker.log.names()


async def test_consumer_disconnect_mid_wait_cancels_fetch() -> None:
    async with running_broker(topics={"gone": 1}) as broker:
        cons = AIOKafkaConsumer(
            bootstrap_servers=f"127.0.0.1:{broker.port}",
            enable_auto_commit=False,
            fetch_max_wait_ms=30_000,
        )
        await cons.start()
        tp = KafkaTopicPartition("gone", 0)
        cons.assign([tp])
        await cons.seek_to_beginning(tp)
        getter = asyncio.ensure_future(cons.getmany(timeout_ms=30_000))
        await eventually(lambda: broker.fetch_purgatory.pending == 1)
        getter.cancel()
        await cons.stop()
        await eventually(lambda: broker.fetch_purgatory.pending == 0)
        stats = broker.statistics()["fetch"]
        assert (stats.pending, stats.watched, stats.delayed, stats.keys) == (0, 0, 0, 0)
        assert stats.cancelled >= 1


async def test_tiny_load_test_loses_nothing() -> None:
    result = await run_load(producers=2, seconds=0.5, window=4, partitions=2)
    assert result.acked > 0
    assert result.failed == 0
    assert result.consumed == result.acked
    assert (result.lost, result.duplicated, result.misplaced) == (0, 0, 0)
    assert result.latency_p99_ms >= result.latency_p50_ms > 0
