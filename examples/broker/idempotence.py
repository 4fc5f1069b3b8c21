"""Idempotent producers: producer ids, epochs and per-partition sequence numbers.

Sans-IO, like :mod:`examples.broker.partition`. The rules are Kafka's
(``ProducerStateManager``/``ProducerAppendInfo``), for producers without
transactions:

* InitProducerId hands out a fresh producer id with epoch 0
  (:class:`ProducerIdManager`). A producer that names its current id and epoch
  (v3+, KIP-360) gets the same id with the epoch bumped, which fences its older
  epoch (Kafka does this for transactional producers and hands idempotent ones a
  fresh id; bumping lets a test see a stale epoch refused).
* Every batch of an idempotent producer carries (producer id, epoch, base
  sequence); its last sequence is ``base + lastOffsetDelta``, wrapping from
  2**31 - 1 to 0. Per partition and producer the leader keeps the epoch and the
  metadata of the last :data:`MAX_IN_FLIGHT` appended batches (clients send at
  most 5 in flight per partition, ``max.in.flight.requests.per.connection``).
* A batch equal (same first and last sequence, same epoch) to one of those is a
  retry of a batch already appended: it is answered with the original offsets
  and not appended again.
* Otherwise its base sequence must follow the last appended one (0 for the
  producer's first batch on the partition, or the first of a new epoch):
  a gap answers ``OUT_OF_ORDER_SEQUENCE_NUMBER``. An epoch older than the one
  the partition has seen answers ``INVALID_PRODUCER_EPOCH``.

Stricter than Kafka, because this broker knows everything it ever issued and
never loses producer state (no retention): a producer id it did not issue is
``UNKNOWN_PRODUCER_ID``, an epoch other than the issued one is
``INVALID_PRODUCER_EPOCH``, and a producer's first batch on a partition must have
sequence 0.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from .messages import ErrorCode
from .records import BatchHeader

__all__ = ["MAX_IN_FLIGHT", "BatchMetadata", "ProducerIdManager", "ProducerStates", "last_sequence"]

#: Batches remembered per producer and partition for duplicate detection (Kafka's 5).
MAX_IN_FLIGHT = 5
_MAX_SEQUENCE = 2**31 - 1
_MAX_EPOCH = 2**15 - 1


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """The sequence of a batch's last record (sequences wrap from 2**31 - 1 to 0)."""
    return (base_sequence + last_offset_delta) % (_MAX_SEQUENCE + 1)


def _in_sequence(last: int, following: int) -> bool:
    return following == last + 1 or (following == 0 and last == _MAX_SEQUENCE)


class ProducerIdManager:
    """Producer ids issued by this broker (InitProducerId), with their epochs."""

    __slots__ = ("_epochs", "_next_id")

    def __init__(self) -> None:
        self._next_id = 1000
        self._epochs: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._epochs)

    def init_producer(self, producer_id: int = -1, epoch: int = -1) -> tuple[int, int]:
        """InitProducerId: (producer id, epoch) for the producer to use from now on.

        The current id and epoch of an issued producer: the same id, epoch + 1 (a
        fresh id once the epoch would overflow int16). Anything else: a fresh id.
        """
        if self._epochs.get(producer_id, -2) == epoch and epoch < _MAX_EPOCH:
            self._epochs[producer_id] = epoch + 1
            return producer_id, epoch + 1
        producer_id = self._next_id
        self._next_id += 1
        self._epochs[producer_id] = 0
        return producer_id, 0

    def check(self, producer_id: int, epoch: int) -> int:
        """The error for a batch claiming this id and epoch, or NONE."""
        issued = self._epochs.get(producer_id)
        if issued is None:
            return ErrorCode.UNKNOWN_PRODUCER_ID
        if epoch != issued:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        return ErrorCode.NONE


class BatchMetadata(NamedTuple):
    """What the leader remembers of an appended idempotent batch."""

    first_sequence: int
    last_sequence: int
    first_offset: int
    end_offset: int  # the offset after the batch's last record


class _ProducerEntry:
    __slots__ = ("batches", "epoch")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.batches: deque[BatchMetadata] = deque(maxlen=MAX_IN_FLIGHT)


class ProducerStates:
    """One partition's idempotent producers: their epoch and last batches."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[int, _ProducerEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def check(self, header: BatchHeader) -> tuple[int, BatchMetadata | None]:
        """Judge a batch of an idempotent producer before it is appended.

        Returns:
            ``(NONE, None)``: append it; ``(NONE, metadata)``: a retry of the
            batch described, already in the log; or ``(error code, None)``.
        """
        first = header.base_sequence
        if first < 0:
            return ErrorCode.INVALID_RECORD, None
        last = last_sequence(first, header.offset_count - 1)
        entry = self._entries.get(header.producer_id)
        if entry is None:
            if first != 0:
                return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None
            return ErrorCode.NONE, None
        if header.producer_epoch == entry.epoch:
            for batch in entry.batches:
                if batch.first_sequence == first and batch.last_sequence == last:
                    return ErrorCode.NONE, batch
        if header.producer_epoch < entry.epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH, None
        if header.producer_epoch > entry.epoch:
            ok = first == 0
        else:
            ok = _in_sequence(entry.batches[-1].last_sequence, first)
        return (ErrorCode.NONE if ok else ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), None

    def record(self, header: BatchHeader, first_offset: int) -> None:
        """Remember a batch that :meth:`check` accepted, now appended at ``first_offset``."""
        entry = self._entries.get(header.producer_id)
        if entry is None or header.producer_epoch != entry.epoch:
            entry = self._entries[header.producer_id] = _ProducerEntry(header.producer_epoch)
        first = header.base_sequence
        entry.batches.append(
            BatchMetadata(
                first,
                last_sequence(first, header.offset_count - 1),
                first_offset,
                first_offset + header.offset_count,
            )
        )
