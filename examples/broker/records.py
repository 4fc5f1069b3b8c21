"""Record batches (magic v2) as opaque bytes: validate the header, assign offsets.

The broker never decodes the records themselves (they may be compressed). It
reads only the fixed 61-byte batch header::

    offset  size  field
         0     8  baseOffset             <- rewritten by the leader on append
         8     4  batchLength            (bytes after this field)
        12     4  partitionLeaderEpoch
        16     1  magic                  (must be 2)
        17     4  crc                    CRC-32C of everything from attributes on
        21     2  attributes
        23     4  lastOffsetDelta
        27     8  baseTimestamp
        35     8  maxTimestamp
        43     8  producerId
        51     2  producerEpoch
        53     4  baseSequence
        57     4  recordCount
        61        records...

Because the CRC starts at ``attributes``, the leader may overwrite ``baseOffset``
(and ``partitionLeaderEpoch``) without invalidating it: that is how Kafka assigns
offsets without touching the batch body, and what lets us store and serve batches
as the exact bytes the producer sent.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "BATCH_HEADER_SIZE",
    "BatchHeader",
    "InvalidBatchError",
    "crc32c",
    "next_offset_after",
    "parse_batches",
    "with_base_offset",
]

BATCH_HEADER_SIZE = 61
_LOG_OVERHEAD = 12  # baseOffset + batchLength: the bytes batchLength does not count
_MAGIC = 2
_CRC_START = 21
_TRANSACTIONAL = 0x10
_CONTROL = 0x20

_HEADER = struct.Struct(">qiibIhiqqqhii")
_BASE_OFFSET = struct.Struct(">q")


def _make_table() -> list[int]:
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C_TABLE = _make_table()


def crc32c(data: bytes | memoryview) -> int:
    """CRC-32C (Castagnoli), as Kafka uses for v2 record batches.

    Pure Python (about 10 MB/s): the broker's ``verify_crc`` option pays this per
    produced byte, like a real broker does in C.
    """
    table = _CRC32C_TABLE
    crc = 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


class InvalidBatchError(ValueError):
    """The records field is not a sequence of valid v2 record batches."""

    def __init__(self, message: str, *, corrupt: bool = True) -> None:
        super().__init__(message)
        #: True for a bad CRC or broken framing (CORRUPT_MESSAGE); False for an
        #: unsupported format (magic != 2).
        self.corrupt = corrupt


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """What the broker needs from one batch: where it is and how many offsets it spans."""

    #: Start of the batch inside the records field.
    start: int
    #: Total size in bytes (12 + batchLength).
    size: int
    #: Offsets used: lastOffsetDelta + 1.
    offset_count: int
    #: baseTimestamp and maxTimestamp (ms), as sent.
    base_timestamp: int
    max_timestamp: int
    #: producerId as sent (-1 when the producer is not idempotent).
    producer_id: int
    record_count: int
    #: producerEpoch and baseSequence as sent (-1 without a producer id).
    producer_epoch: int = -1
    base_sequence: int = -1
    #: the attributes (compression, timestamp type, transactional, control bits).
    attributes: int = 0

    @property
    def is_transactional(self) -> bool:
        """The transactional bit (4) or the control bit (5) is set."""
        return bool(self.attributes & (_TRANSACTIONAL | _CONTROL))


def parse_batches(records: bytes, *, verify_crc: bool = True) -> list[BatchHeader]:
    """Split a produce request's records field into batches and validate their headers.

    Args:
        records: the concatenated batches.
        verify_crc: check each batch's CRC-32C.

    Returns:
        One header per batch, in order; at least one.

    Raises:
        InvalidBatchError: empty input, a truncated or inconsistent batch, magic
            other than 2, or a CRC mismatch.
    """
    if not records:
        raise InvalidBatchError("empty records")
    view = memoryview(records)
    total = len(records)
    pos = 0
    headers: list[BatchHeader] = []
    while pos < total:
        if total - pos < BATCH_HEADER_SIZE:
            raise InvalidBatchError(f"truncated batch header at byte {pos}")
        (
            _base_offset,
            batch_length,
            _leader_epoch,
            magic,
            crc,
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            record_count,
        ) = _HEADER.unpack_from(view, pos)
        if magic != _MAGIC:
            raise InvalidBatchError(f"unsupported record batch magic {magic}", corrupt=False)
        size = _LOG_OVERHEAD + batch_length
        if size < BATCH_HEADER_SIZE or pos + size > total:
            raise InvalidBatchError(f"batch length {batch_length} at byte {pos} does not fit")
        if last_offset_delta < 0 or record_count < 0:
            raise InvalidBatchError(f"negative lastOffsetDelta or recordCount at byte {pos}")
        if verify_crc and crc32c(view[pos + _CRC_START : pos + size]) != crc:
            raise InvalidBatchError(f"CRC mismatch in batch at byte {pos}")
        headers.append(
            BatchHeader(
                start=pos,
                size=size,
                offset_count=last_offset_delta + 1,
                base_timestamp=base_timestamp,
                max_timestamp=max_timestamp,
                producer_id=producer_id,
                record_count=record_count,
                producer_epoch=producer_epoch,
                base_sequence=base_sequence,
                attributes=attributes,
            )
        )
        pos += size
    return headers


def with_base_offset(records: bytes, header: BatchHeader, base_offset: int) -> bytes:
    """A copy of one batch with its baseOffset field set; the CRC stays valid."""
    batch = bytearray(records[header.start : header.start + header.size])
    _BASE_OFFSET.pack_into(batch, 0, base_offset)
    return bytes(batch)


def next_offset_after(data: bytes) -> int:
    """The offset after the last batch in ``data`` (a fetch response's records), or -1.

    Used by the in-process followers, which learn what they replicated by reading
    the batches they fetched, as a real follower does.
    """
    pos = 0
    end = -1
    total = len(data)
    while total - pos >= BATCH_HEADER_SIZE:
        base_offset, batch_length = struct.unpack_from(">qi", data, pos)
        last_offset_delta = struct.unpack_from(">i", data, pos + 23)[0]
        end = base_offset + last_offset_delta + 1
        pos += _LOG_OVERHEAD + batch_length
    return end
