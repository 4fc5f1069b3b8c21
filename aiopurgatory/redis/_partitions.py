"""Where a key's triggers travel and where its watermark is stored: partitions of a channel.

Sans-IO. A channel's keys are spread over ``count`` partitions by a hash of the
key as it crosses the wire (:func:`partition_of`: CRC-32 of the key's type letter
and bytes, so every process, the asynchronous and the synchronous publisher
alike, puts a key in the same partition). Partition ``n`` has

* a channel, ``{<tag n>}<channel>:t``, on which the triggers of its keys are
  published (a process subscribes to the partitions of the keys it watches);
* the Redis keys of its watermarks, ``{<tag n>}<channel>:wm:<type><key bytes>``.

The tag in braces is a Redis Cluster hash tag: the partition's channel and its
watermarks live in one slot, so the script that raises watermarks and publishes
the trigger (one round trip) never spans slots. Tags are chosen so that the
slots of the partitions are spread evenly over the 16,384 slots: partition ``n``
lands in the ``n``-th of ``count`` equal runs of slots, so however a cluster's
masters split the slot range into runs, each master gets its share of the
partitions (with plain tags ``0..N`` the slots fall where CRC16 puts them, and
some masters get many more than others).

Besides, every subscriber listens on the *control* channel (the channel's name
itself; nothing this version publishes goes there, but triggers published
there by hand still reach every process) and on its own *canary* channel, on
which it sends itself a message to prove its subscription delivers.
"""

from __future__ import annotations

import binascii
import functools
import itertools
import zlib
from typing import Final

from ._wire import Key, redis_key

__all__ = [
    "DEFAULT_PARTITIONS",
    "SLOTS",
    "Partitions",
    "check_partitions",
    "key_slot",
    "partition_of",
]

#: Partitions of a channel when none is given (docs/distributed.md says why).
DEFAULT_PARTITIONS: Final = 16384
#: Redis Cluster's hash slots.
SLOTS: Final = 16384
_MAX_PARTITIONS: Final = SLOTS


def check_partitions(value: object, argument: str = "partitions") -> int:
    """``value`` if it is an int from 1 to 16,384, else TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, got {type(value).__name__}")
    if not 1 <= value <= _MAX_PARTITIONS:
        raise ValueError(f"{argument} must be from 1 to {_MAX_PARTITIONS}, got {value!r}")
    return value


def key_slot(name: bytes) -> int:
    """The Redis Cluster slot of the Redis key or shard channel ``name``."""
    start = name.find(b"{")
    if start > -1:
        end = name.find(b"}", start + 1)
        if end > start + 1:
            name = name[start + 1 : end]
    return binascii.crc_hqx(name, 0) % SLOTS


def partition_of(key: Key, count: int) -> int:
    """The partition (``0 <= n < count``) of ``key``: the same in every process."""
    return zlib.crc32(redis_key(b"", key)) % count


# Tag candidates: the 65,536 strings of four letters from "@ABCDEFGHIJKLMNO"
# (printable, no braces), in order; their CRC16s hit every one of the 16,384 slots.
_TAG_LETTERS: Final = range(0x40, 0x50)


@functools.cache
def _tags(count: int) -> tuple[bytes, ...]:
    """One hash tag per partition, partition ``n``'s slot in the ``n``-th run of slots.

    Deterministic (for each partition, the first fitting candidate), so every
    process and version computes the same tags. The candidates are hashed by C
    loops (``map``): about 0.1 s once per process.
    """
    candidates = [bytes(letters) for letters in itertools.product(_TAG_LETTERS, repeat=4)]
    slots = map(binascii.crc_hqx, candidates, itertools.repeat(0))
    runs = [(slot % SLOTS) * count // SLOTS for slot in slots]
    # dict() keeps the last value per run: fed in reverse, the first candidate.
    first = dict(zip(reversed(runs), reversed(candidates), strict=True))
    return tuple(first[n] for n in range(count))


class Partitions:
    """The partitions of one channel: channel names, watermark keys, and back.

    Args:
        channel: the channel's name.
        count: the number of partitions (every process on the channel uses the
            same; checked by :func:`check_partitions`).
        instance: this process's instance id (names its canary channel).
    """

    __slots__ = ("_by_channel", "_channels", "_name", "_prefixes", "canary", "control", "count")

    def __init__(self, channel: str, count: int, instance: str = "") -> None:
        self._name = name = channel.encode("utf-8", "surrogatepass")
        self.count = count
        # Built at first use (a process's first watch or publish): the tags take
        # about 0.1 s once per process, which a start need not wait for.
        self._channels: tuple[bytes, ...] | None = None
        self._prefixes: tuple[bytes, ...] = ()
        self._by_channel: dict[bytes, int] = {}
        #: The control channel (the channel's name).
        self.control = name
        #: This process's canary channel.
        self.canary = name + b":canary:" + instance.encode("ascii")

    @property
    def channels(self) -> tuple[bytes, ...]:
        """Partition n's channel, for each n."""
        channels = self._channels
        if channels is None:
            name = self._name
            tags = _tags(self.count)
            channels = tuple(b"{" + t + b"}" + name + b":t" for t in tags)
            self._prefixes = tuple(b"{" + t + b"}" + name + b":wm:" for t in tags)
            self._by_channel = {channel: n for n, channel in enumerate(channels)}
            # Set last: a SyncPublisher's other threads see all three, or build
            # them too (the same values).
            self._channels = channels
        return channels

    def of(self, key: Key) -> int:
        """``key``'s partition."""
        return zlib.crc32(redis_key(b"", key)) % self.count

    def channel(self, key: Key) -> bytes:
        """The channel on which ``key``'s triggers are published."""
        return self.channels[self.of(key)]

    def stored_key(self, key: Key) -> bytes:
        """The Redis key holding ``key``'s watermark."""
        return redis_key(self.prefix(self.of(key)), key)

    @property
    def prefixes(self) -> tuple[bytes, ...]:
        """Partition n's watermark prefix, for each n."""
        if self._channels is None:
            self.channels  # noqa: B018  # builds them
        return self._prefixes

    def prefix(self, partition: int) -> bytes:
        """The prefix of the Redis keys of ``partition``'s watermarks."""
        if self._channels is None:
            self.channels  # noqa: B018  # builds them
        return self._prefixes[partition]

    def partition_of_channel(self, channel: bytes) -> int | None:
        """The partition whose channel is ``channel``, or None (control, canary, other)."""
        if self._channels is None:
            return None  # no partition subscribed yet
        return self._by_channel.get(channel)
