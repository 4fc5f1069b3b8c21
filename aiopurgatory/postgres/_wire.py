"""What crosses PostgreSQL between processes: keys, values, notifications, names.

Sans-IO: no connection, no loop, no clock. :class:`Batch` gathers the triggers of
one loop iteration (check keys in first-trigger order, the highest value per
advanced key); :func:`notifications` turns it into NOTIFY payloads, one or more per
partition channel, each shorter than PostgreSQL's limit (8000 bytes);
:func:`decode` turns a payload back into triggers, refusing anything malformed
as a whole.

A payload is ASCII JSON, a list of four (the format of the Redis transport)::

    [1, "<sender id>", [check keys...], [key, value, key, value, ...]]

A trigger made where a sampled OpenTelemetry span is current carries that
span's W3C ``traceparent`` in the sender field, after the id and a space
(:func:`sender_field`, :func:`split_sender`; as the Redis transport does): the
version before, which only compares the field with its own id, applies it as
before (an id never holds a space, so the field is never its own).

Keys keep their type: a ``str`` is a JSON string, an ``int`` a JSON integer,
``bytes`` an object ``{"b": "<the bytes as latin-1 text>"}``. In the watermark
table a key is ``bytea``: a type letter (``s``, ``i``, ``b``) and the key's bytes
(UTF-8 for a str, decimal for an int), so ``"1"``, ``1`` and ``b"1"`` stay three
keys and any str (NUL characters included, which ``text`` refuses) is stored.

A channel's keys are spread over ``partitions`` NOTIFY channels,
``<channel>_<n>`` for partition ``n`` (CRC-32 of the stored key, so every
process and the synchronous publisher agree); a process LISTENs to the
partitions of the keys it watches only.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Final

from .._transport import (
    Batch,
    Key,
    MalformedMessage,
    Value,
    key_from_wire,
    sender_field,
    split_sender,
    value_text,
    wire_keys,
)

__all__ = [
    "DEFAULT_CHANNEL",
    "DEFAULT_PARTITIONS",
    "MAX_KEY_BYTES",
    "MAX_PAYLOAD",
    "SENDER_TRANSACTION",
    "VERSION",
    "Batch",
    "MalformedMessage",
    "check_channel",
    "check_partitions",
    "check_wire_size",
    "decode",
    "notifications",
    "partition_channel",
    "partition_of",
    "sender_field",
    "split_sender",
    "stored_key",
    "wire_keys",
]

VERSION: Final = 1
#: The channel used when none is given.
DEFAULT_CHANNEL: Final = "aiopurgatory"
#: Partition channels of a channel when none is given (docs/postgres.md says why).
DEFAULT_PARTITIONS: Final = 64
_MAX_PARTITIONS: Final = 4096
#: A NOTIFY payload must be shorter than 8000 bytes (PostgreSQL's limit).
MAX_PAYLOAD: Final = 7999
#: The longest key (as JSON in a payload) accepted: a payload must hold at least one.
MAX_KEY_BYTES: Final = 4000
#: The sender id of triggers written inside a caller's transaction: applied by
#: every process, the writer's own included (its local purgatory was not
#: advanced at the call, since the transaction might roll back).
SENDER_TRANSACTION: Final = ""

# A channel names a table and NOTIFY channels: an SQL identifier with room for
# the suffixes within PostgreSQL's 63 bytes.
_CHANNEL: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")

_json_text = json.encoder.encode_basestring_ascii
_loads = json.loads


def check_channel(channel: object) -> str:
    """``channel`` (None: :data:`DEFAULT_CHANNEL`) if it can name tables and channels."""
    if channel is None:
        return DEFAULT_CHANNEL
    if not isinstance(channel, str):
        raise TypeError(f"channel must be a str, got {type(channel).__name__}")
    if not _CHANNEL.fullmatch(channel):
        raise ValueError(
            "channel must be 1 to 40 ASCII letters, digits or underscores, not starting "
            f"with a digit (it names a table and NOTIFY channels), got {channel!r}"
        )
    return channel


def check_partitions(value: object, argument: str = "partitions") -> int:
    """``value`` if it is an int from 1 to 4096, else TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, got {type(value).__name__}")
    if not 1 <= value <= _MAX_PARTITIONS:
        raise ValueError(f"{argument} must be from 1 to {_MAX_PARTITIONS}, got {value!r}")
    return value


def stored_key(key: Key) -> bytes:
    """``key`` as stored in the watermark table: its type letter and its bytes."""
    if isinstance(key, str):
        return b"s" + str.__str__(key).encode("utf-8", "surrogatepass")
    if isinstance(key, bytes):
        return b"b" + key
    return b"i" + str(int(key)).encode("ascii")


def key_from_stored(raw: bytes) -> Key | None:
    """The key :func:`stored_key` wrote, or None for anything else."""
    kind, body = raw[:1], raw[1:]
    try:
        if kind == b"s":
            return body.decode("utf-8", "surrogatepass")
        if kind == b"i":
            return int(body)
    except ValueError:
        return None
    return body if kind == b"b" else None


def partition_of(key: Key, count: int) -> int:
    """The partition (``0 <= n < count``) of ``key``: the same in every process."""
    return zlib.crc32(stored_key(key)) % count


def partition_channel(channel: str, n: int) -> str:
    """The NOTIFY channel of partition ``n`` of ``channel``."""
    return f"{channel}_{n}"


def key_json(key: Key) -> str:
    """``key`` as JSON text in a payload."""
    if type(key) is str:
        text: str = _json_text(key)
        return text
    if type(key) is int:
        return str(key)
    if isinstance(key, bytes):
        return '{"b":' + _json_text(key.decode("latin-1")) + "}"
    # str and int subclasses (StrEnum, IntEnum): their plain value.
    return _json_text(str.__str__(key)) if isinstance(key, str) else str(int(key))


def check_wire_size(key: Key, argument: str = "key") -> Key:
    """``key`` if it fits in a payload (at most :data:`MAX_KEY_BYTES` as JSON), else ValueError."""
    if isinstance(key, int):
        return key  # within +-2**53 by check_value's bounds or not: always short enough
    if len(key) * 6 + 8 > MAX_KEY_BYTES and len(key_json(key)) > MAX_KEY_BYTES:
        raise ValueError(
            f"{argument} is too long for a PostgreSQL notification: at most "
            f"{MAX_KEY_BYTES} bytes as JSON, got {len(key_json(key))}"
        )
    return key


class _Part:
    """One payload being filled: its items and its size in bytes (ASCII)."""

    __slots__ = ("advances", "checks", "size")

    def __init__(self, size: int) -> None:
        self.checks: list[str] = []
        self.advances: list[str] = []
        self.size = size


def notifications(
    sender: str, batch: Batch, channel: str, partitions: int
) -> tuple[list[str], list[str]]:
    """``(channels, payloads)``: the NOTIFYs that carry ``batch``, each payload
    shorter than :data:`MAX_PAYLOAD` bytes (a partition's triggers are split over
    as many as needed)."""
    head = f"[{VERSION}," + _json_text(sender) + ",["
    empty = len(head) + 5  # the brackets and the comma around the two lists
    # Per partition: its check items, its advance items, the payload's size so far.
    parts: dict[int, _Part] = {}
    out_channels: list[str] = []
    out_payloads: list[str] = []

    def flush(n: int, part: _Part) -> None:
        out_channels.append(partition_channel(channel, n))
        out_payloads.append(head + ",".join(part.checks) + "],[" + ",".join(part.advances) + "]]")

    def add(n: int, item: str, *, check: bool) -> None:
        part = parts.get(n)
        if part is None:
            part = parts[n] = _Part(empty)
        elif part.size + len(item) + 1 > MAX_PAYLOAD:
            flush(n, part)
            part = parts[n] = _Part(empty)
        (part.checks if check else part.advances).append(item)
        part.size += len(item) + 1

    for key in batch.checks:
        add(partition_of(key, partitions), key_json(key), check=True)
    for key, value in batch.advances.items():
        add(partition_of(key, partitions), key_json(key) + "," + value_text(value), check=False)
    for n, part in parts.items():
        flush(n, part)
    return out_channels, out_payloads


def decode(payload: str) -> tuple[str, list[Key], list[tuple[Key, Value]]]:
    """``(sender, check keys, [(key, value), ...])`` from a payload.

    Raises:
        MalformedMessage: not a payload of this version; nothing of it is usable.
    """
    try:
        message = _loads(payload)
    except ValueError as exc:
        raise MalformedMessage(f"not JSON: {exc}") from None
    if type(message) is not list or len(message) != 4 or message[0] != VERSION:
        raise MalformedMessage(f"not a version {VERSION} payload: {payload!r:.80}")
    _, sender, checks, flat = message
    if type(sender) is not str or type(checks) is not list or type(flat) is not list:
        raise MalformedMessage(f"not a version {VERSION} payload: {payload!r:.80}")
    if len(flat) % 2:
        raise MalformedMessage("advances must be key, value pairs")
    keys = [key_from_wire(item) for item in checks]
    advances: list[tuple[Key, Value]] = []
    for i in range(0, len(flat), 2):
        value = flat[i + 1]
        if type(value) is not int and type(value) is not float:
            raise MalformedMessage(f"not a value: {value!r:.80}")
        advances.append((key_from_wire(flat[i]), value))
    return sender, keys, advances
