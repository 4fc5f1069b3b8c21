"""The broker's delayed operations: an ``acks=all`` produce and a long-poll fetch.

Both follow Kafka's ``DelayedProduce``/``DelayedFetch``: ``try_complete`` checks
the condition against the partitions' current state and calls
``force_complete``; the response is built after the operation finishes (by
completion, expiry or shutdown), from the state at that moment. Both are watched
under one key per partition (:class:`~examples.broker.partition.TopicPartition`).
"""

from __future__ import annotations

from collections.abc import Callable

import aiopurgatory as ap

from .messages import ErrorCode, ProducePartitionResult
from .partition import Partition, TopicPartition

__all__ = ["DelayedFetch", "DelayedProduce", "FetchTarget"]


class DelayedProduce(ap.DelayedOperation):
    """An ``acks=all`` produce waiting until the ISR has every appended batch.

    A partition is satisfied once its HW reaches the offset after its batches
    (``required_offsets``); if by then the ISR has shrunk below min.insync.replicas
    its answer is NOT_ENOUGH_REPLICAS_AFTER_APPEND, as in Kafka. A partition whose
    topic is deleted meanwhile answers UNKNOWN_TOPIC_OR_PARTITION at once.
    Partitions left unsatisfied at expiry answer REQUEST_TIMED_OUT.

    Args:
        timeout: seconds (the request's ``timeout_ms`` / 1000).
        partitions: the leader partitions appended to, by key.
        required_offsets: per key, the offset the HW must reach.
        results: per key, the result to fill in (base offset already set).
    """

    __slots__ = ("_partitions", "_required", "results")

    def __init__(
        self,
        timeout: float,
        partitions: dict[TopicPartition, Partition],
        required_offsets: dict[TopicPartition, int],
        results: dict[TopicPartition, ProducePartitionResult],
    ) -> None:
        super().__init__(timeout)
        self._partitions = partitions
        self._required = dict(required_offsets)
        self.results = results

    def try_complete(self) -> bool:
        """Complete once every partition's HW has reached its required offset."""
        required = self._required
        for tp in list(required):
            partition = self._partitions[tp]
            if partition.deleted:
                # The topic was deleted while this produce waited (DeleteTopics).
                self.results[tp].error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                del required[tp]
            elif partition.high_watermark >= required[tp]:
                if not partition.enough_replicas():
                    self.results[tp].error_code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
                del required[tp]
        if required:
            return False
        return self.force_complete()

    def on_expiration(self) -> None:
        """The partitions still waiting time out (the batches stay in the log, as in Kafka)."""
        for tp in self._required:
            result = self.results[tp]
            result.error_code = ErrorCode.REQUEST_TIMED_OUT


class FetchTarget:
    """One partition of a fetch: where to read from and the bound to read below."""

    __slots__ = ("fetch_offset", "partition")

    def __init__(self, partition: Partition, fetch_offset: int) -> None:
        self.partition = partition
        self.fetch_offset = fetch_offset


class DelayedFetch(ap.DelayedOperation):
    """A fetch waiting for ``min_bytes`` to become readable, or for ``max_wait_ms``.

    Consumers read below the HW, followers below the leader's LEO (``bound``).
    A partition whose fetch offset fell outside the log (truncation or a bad
    offset), or whose topic was deleted, completes the fetch at once, so its
    error is answered without delay.

    Args:
        timeout: seconds (``max_wait_ms`` / 1000).
        targets: the partitions to read.
        min_bytes: bytes that must be readable across all partitions.
        bound: ``partition -> offset`` to read below (HW or LEO).
    """

    __slots__ = ("_bound", "_min_bytes", "targets")

    def __init__(
        self,
        timeout: float,
        targets: list[FetchTarget],
        min_bytes: int,
        bound: Callable[[Partition], int],
    ) -> None:
        super().__init__(timeout)
        self.targets = targets
        self._min_bytes = min_bytes
        self._bound = bound

    def try_complete(self) -> bool:
        """Complete when enough bytes are readable, or some fetch offset is out of range."""
        available = 0
        bound = self._bound
        for target in self.targets:
            partition = target.partition
            offset = target.fetch_offset
            if (
                partition.deleted
                or offset > partition.log_end_offset
                or offset < partition.log.log_start_offset
            ):
                return self.force_complete()
            upper = bound(partition)
            if offset < upper:
                available += partition.log.bytes_between(offset, upper)
        if available >= self._min_bytes:
            return self.force_complete()
        return False
