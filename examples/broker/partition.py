"""One partition's leader log and replication state (log end offsets, ISR, high watermark).

Sans-IO: nothing here awaits or touches a loop; the broker passes ``now`` in and
runs the purgatory triggers that the returned flags call for. The rules are
Kafka's:

* The leader's log end offset (LEO) advances on append. A follower's LEO is what
  it says in its next fetch (the offset it asks for), so the leader learns of a
  replicated batch one fetch later.
* The high watermark (HW) is the smallest LEO among in-sync replicas (the leader
  included); it never moves back. Consumers read only below it.
* A follower joins the ISR once its LEO reaches the HW; it leaves when it has not
  been caught up for ``replica_lag_time_max`` seconds, or at once when it crashes.
* ``acks=all`` is refused (NOT_ENOUGH_REPLICAS) when the ISR is smaller than
  ``min_insync_replicas``.
"""

from __future__ import annotations

import bisect

# A partition's identity and its purgatory watch key: the examples' shared one.
from .._kafka import TopicPartition
from .idempotence import ProducerStates
from .records import BatchHeader, with_base_offset

__all__ = ["LEADER_ID", "Partition", "PartitionLog", "TopicPartition"]

#: The broker's own node id; followers are 1, 2, ...
LEADER_ID = 0


class PartitionLog:
    """An in-memory log of record batches, each kept as the exact bytes produced.

    Indexes are parallel lists so a fetch at any offset is one bisect: batch ``i``
    holds offsets ``[base_offsets[i], end_offsets[i])`` and starts at byte
    ``positions[i]`` of the (virtual) concatenated log.
    """

    __slots__ = ("base_offsets", "batches", "end_offsets", "max_timestamps", "positions")

    def __init__(self) -> None:
        self.batches: list[bytes] = []
        self.base_offsets: list[int] = []
        self.end_offsets: list[int] = []
        self.max_timestamps: list[int] = []
        self.positions: list[int] = [0]

    @property
    def log_start_offset(self) -> int:
        """The first offset (no retention: always 0)."""
        return 0

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended record gets."""
        return self.end_offsets[-1] if self.end_offsets else 0

    @property
    def size_bytes(self) -> int:
        """Total bytes of all batches."""
        return self.positions[-1]

    def append(self, records: bytes, headers: list[BatchHeader]) -> int:
        """Append validated batches, giving each the next offsets; return the first base offset."""
        first = self.log_end_offset
        next_offset = first
        for header in headers:
            batch = with_base_offset(records, header, next_offset)
            self.batches.append(batch)
            self.base_offsets.append(next_offset)
            next_offset += header.offset_count
            self.end_offsets.append(next_offset)
            self.max_timestamps.append(header.max_timestamp)
            self.positions.append(self.positions[-1] + len(batch))
        return first

    def _span(self, offset: int, upper: int) -> tuple[int, int]:
        # Batches i..j-1 hold offsets >= offset and end at or before upper.
        # Bounds (HW, follower LEOs) always fall on batch boundaries.
        i = bisect.bisect_right(self.end_offsets, offset)
        j = bisect.bisect_right(self.end_offsets, upper)
        return i, max(i, j)

    def bytes_between(self, offset: int, upper: int) -> int:
        """Bytes a fetch from ``offset`` could return when reading below ``upper``."""
        i, j = self._span(offset, upper)
        return self.positions[j] - self.positions[i]

    def read(self, offset: int, upper: int, max_bytes: int, *, min_one: bool) -> bytes:
        """Whole batches from the one holding ``offset``, below ``upper``, within ``max_bytes``.

        Args:
            offset: the fetch offset (may be inside a batch: the whole batch is
                returned and the client skips the records before its offset).
            upper: read only batches ending at or before this offset.
            max_bytes: soft limit on the total size.
            min_one: return the first batch even if it exceeds ``max_bytes``
                (KIP-74: a consumer must always be able to make progress).
        """
        i, j = self._span(offset, upper)
        if i >= j:
            return b""
        positions = self.positions
        limit = positions[i] + max_bytes
        k = bisect.bisect_right(positions, limit, i + 1, j + 1) - 1
        if k <= i:
            if not min_one:
                return b""
            k = i + 1
        return b"".join(self.batches[i:k])

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(base offset, max timestamp) of the first batch with a record at or after ``timestamp``.

        Batch granularity: the records are opaque, so the answer may be a few
        offsets early (the consumer then skips them), never late.
        """
        for i, max_ts in enumerate(self.max_timestamps):
            if max_ts >= timestamp:
                return self.base_offsets[i], max_ts
        return None


class _FollowerState:
    __slots__ = ("crashed", "last_caught_up", "last_fetch_leader_leo", "last_fetch_time", "leo")

    def __init__(self, now: float) -> None:
        self.leo = 0
        self.last_caught_up = now
        self.last_fetch_time = now
        self.last_fetch_leader_leo = 0
        self.crashed = False


class Partition:
    """A partition led by this broker: its log, its followers' progress, ISR and HW.

    Args:
        tp: the partition.
        follower_ids: node ids of the follower replicas of this partition (1, 2, ...;
            fewer than the broker's followers for a topic created with a smaller
            replication factor).
        min_insync_replicas: smallest ISR that accepts ``acks=all``.
        now: loop time of creation (followers count as caught up then).
    """

    __slots__ = (
        "_followers",
        "deleted",
        "high_watermark",
        "isr",
        "log",
        "min_insync_replicas",
        "producers",
        "tp",
    )

    def __init__(
        self,
        tp: TopicPartition,
        follower_ids: list[int],
        min_insync_replicas: int,
        now: float,
    ) -> None:
        self.tp = tp
        self.log = PartitionLog()
        self.high_watermark = 0
        self.min_insync_replicas = min_insync_replicas
        self._followers = {fid: _FollowerState(now) for fid in follower_ids}
        #: Idempotent producers' sequence state on this partition.
        self.producers = ProducerStates()
        #: Set when its topic is deleted: parked operations on it then finish.
        self.deleted = False
        # A new partition is empty, so every replica starts in sync.
        self.isr: set[int] = {LEADER_ID, *follower_ids}

    @property
    def replicas(self) -> list[int]:
        """All replica node ids, leader first."""
        return [LEADER_ID, *self._followers]

    def has_replica(self, follower_id: int) -> bool:
        """True if this follower replicates this partition."""
        return follower_id in self._followers

    @property
    def offline_replicas(self) -> list[int]:
        """Followers that are crashed."""
        return [fid for fid, state in self._followers.items() if state.crashed]

    @property
    def log_end_offset(self) -> int:
        """The leader's LEO."""
        return self.log.log_end_offset

    def follower_leo(self, follower_id: int) -> int:
        """The LEO the leader last heard from a follower."""
        return self._followers[follower_id].leo

    def enough_replicas(self) -> bool:
        """True if ``acks=all`` may be accepted (ISR size >= min.insync.replicas)."""
        return len(self.isr) >= self.min_insync_replicas

    def _recompute_hw(self) -> bool:
        leo = self.log.log_end_offset
        followers = self._followers
        new_hw = min(
            (followers[rid].leo if rid != LEADER_ID else leo for rid in self.isr), default=leo
        )
        if new_hw > self.high_watermark:
            self.high_watermark = new_hw
            return True
        return False

    def append(self, records: bytes, headers: list[BatchHeader]) -> tuple[int, bool]:
        """Append batches as leader; return (base offset, whether the HW moved)."""
        base = self.log.append(records, headers)
        return base, self._recompute_hw()

    def update_follower(self, follower_id: int, fetch_offset: int, now: float) -> bool:
        """Record a follower fetch at ``fetch_offset``; return whether the HW moved.

        May add the follower to the ISR (its LEO reached the HW).
        """
        state = self._followers[follower_id]
        leader_leo = self.log.log_end_offset
        fetch_offset = min(fetch_offset, leader_leo)
        # Kafka's lastCaughtUpTime: caught up now if it asks for the LEO; caught up
        # as of its previous fetch if it asks for what the LEO was back then.
        if fetch_offset >= leader_leo:
            state.last_caught_up = now
        elif fetch_offset >= state.last_fetch_leader_leo:
            state.last_caught_up = max(state.last_caught_up, state.last_fetch_time)
        state.last_fetch_leader_leo = leader_leo
        state.last_fetch_time = now
        state.leo = max(state.leo, fetch_offset)
        if follower_id not in self.isr and not state.crashed and state.leo >= self.high_watermark:
            self.isr.add(follower_id)
        return self._recompute_hw()

    def shrink_isr(self, now: float, lag_time_max: float) -> tuple[list[int], bool]:
        """Drop followers not caught up for ``lag_time_max`` seconds; return (dropped, HW moved)."""
        dropped = [
            fid
            for fid, state in self._followers.items()
            if fid in self.isr
            and state.leo < self.log.log_end_offset
            and now - state.last_caught_up > lag_time_max
        ]
        for fid in dropped:
            self.isr.discard(fid)
        return dropped, bool(dropped) and self._recompute_hw()

    def set_crashed(self, follower_id: int, crashed: bool, now: float) -> bool:
        """Mark a follower crashed (out of the ISR at once) or restarted; return HW moved."""
        state = self._followers[follower_id]
        state.crashed = crashed
        if crashed:
            self.isr.discard(follower_id)
            return self._recompute_hw()
        state.last_caught_up = now
        state.last_fetch_time = now
        return False
