"""What crosses the wire between processes: keys, values, messages, Redis key names.

Sans-IO: no sockets, no loop, no clock. :class:`Batch` gathers the triggers of one
loop iteration (check keys in first-trigger order, the highest value per advanced
key); :func:`encode` turns a batch into one message, :func:`decode` turns a
message back into triggers, refusing anything malformed as a whole.

A message is JSON, a list of four::

    [1, "<sender id>", [check keys...], [key, value, key, value, ...]]

``sender`` is the publishing instance's id (``<pid>-<hex>``, never with a
space), which a receiver compares with its own only, to skip its own messages.
A message whose triggers were made where a sampled OpenTelemetry span was
current carries that span's W3C ``traceparent`` after the id and a space
(:func:`sender_field`, :func:`split_sender`): a receiver of a version that
predates it sees another sender's id and applies the triggers as before (every
released ``decode`` refuses a fifth element or another version, so the
context could go nowhere else without losing triggers on a mixed-version
channel); a newer one splits it off and applies them with that span current.

Keys keep their type across processes, so ``"1"``, ``1`` and ``b"1"`` stay three
keys, as they are in a purgatory: a ``str`` is a JSON string, an ``int`` a JSON
integer, and ``bytes`` an object ``{"b": "<the bytes as latin-1 text>"}`` (latin-1
maps each byte to one character and back, so every byte string survives).
Values are JSON numbers: ints stay ints and floats stay floats (``repr`` round
trips). In Redis, a watermark lives under ``{<channel>}:wm:`` followed by a
type letter (``s``, ``i``, ``b``) and the key's bytes (UTF-8 for a str, decimal
for an int); the braces put every key of a channel in one Redis Cluster slot,
which the one-round-trip script needs.
"""

from __future__ import annotations

import enum
import json
import math
from typing import Final

from .._transport import (
    MAX_EXACT_INT,
    Batch,
    Key,
    MalformedMessage,
    Value,
    check_key,
    check_value,
    key_from_wire,
    sender_field,
    split_sender,
    value_text,
    wire_keys,
)

__all__ = [
    "MAX_EXACT_INT",
    "VERSION",
    "Batch",
    "Key",
    "MalformedMessage",
    "PublishMode",
    "Value",
    "check_key",
    "check_value",
    "decode",
    "encode",
    "parse_stored",
    "redis_key",
    "sender_field",
    "split_sender",
    "stored",
    "value_text",
    "watermark_prefix",
    "wire_keys",
]


class PublishMode(enum.Enum):
    """How a channel's triggers are published: its command, by the kind of channel.

    The value is the command's name, as sent (bytes).
    """

    #: One server or a Sentinel-managed primary: plain channels (``PUBLISH``,
    #: ``SUBSCRIBE``); a whole batch goes through one script call.
    PLAIN = b"PUBLISH"
    #: A Redis Cluster: shard channels (``SPUBLISH``, ``SSUBSCRIBE``), a partition's
    #: triggers per command (a command cannot span slots).
    SHARDED = b"SPUBLISH"


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode
_loads = json.loads

VERSION: Final = 1


def _wire_key(key: Key) -> object:
    if type(key) is str or type(key) is int:
        return key
    if isinstance(key, bytes):
        return {"b": key.decode("latin-1")}
    # str and int subclasses (StrEnum, IntEnum): their plain value, which is
    # equal to them and hashes the same, so the receiving purgatory finds them.
    return str.__str__(key) if isinstance(key, str) else int(key)


def encode(sender: str, batch: Batch) -> bytes:
    """One message carrying ``batch`` from ``sender``."""
    advances: list[object] = []
    for key, value in batch.advances.items():
        advances.append(_wire_key(key))
        advances.append(value)
    return _dumps([VERSION, sender, [_wire_key(key) for key in batch.checks], advances]).encode(
        "ascii"
    )


def decode(data: bytes | str) -> tuple[str, list[Key], list[tuple[Key, Value]]]:
    """``(sender, check keys, [(key, value), ...])`` from a message.

    Raises:
        MalformedMessage: not a message of this version; nothing of it is usable.
    """
    try:
        message = _loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedMessage(f"not JSON: {exc}") from None
    if type(message) is not list or len(message) != 4 or message[0] != VERSION:
        raise MalformedMessage(f"not a version {VERSION} message: {data!r:.80}")
    _, sender, checks, flat = message
    if type(sender) is not str or type(checks) is not list or type(flat) is not list:
        raise MalformedMessage(f"not a version {VERSION} message: {data!r:.80}")
    if len(flat) % 2:
        raise MalformedMessage("advances must be key, value pairs")
    keys = [key_from_wire(item) for item in checks]
    advances: list[tuple[Key, Value]] = []
    for i in range(0, len(flat), 2):
        value = flat[i + 1]
        kind = type(value)
        if kind is not int and kind is not float:
            raise MalformedMessage(f"not a value: {value!r:.80}")
        advances.append((key_from_wire(flat[i]), value))
    return sender, keys, advances


def redis_key(prefix: bytes, key: Key) -> bytes:
    """The Redis key holding ``key``'s watermark under ``prefix``."""
    if isinstance(key, str):
        return prefix + b"s" + str.__str__(key).encode("utf-8", "surrogatepass")
    if isinstance(key, bytes):
        return prefix + b"b" + key
    return prefix + b"i" + str(int(key)).encode("ascii")


def watermark_prefix(channel: str) -> bytes:
    """The prefix of the Redis keys holding ``channel``'s watermarks (one Cluster slot)."""
    return b"{" + channel.encode("utf-8", "surrogatepass") + b"}:wm:"


def parse_stored(raw: bytes | str | None) -> Value | None:
    """A watermark as stored in Redis (an int or float in decimal), or None if absent or garbled."""
    if raw is None:
        return None
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def stored(value: Value) -> bytes:
    """``value`` as written to Redis: decimal digits, a float keeping its ``repr``."""
    return value_text(value).encode("ascii")
