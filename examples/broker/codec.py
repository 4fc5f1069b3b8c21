"""Kafka wire-protocol primitives: a reader and a writer of the basic types.

The protocol is big-endian. Classic ("non-flexible") versions use fixed-width
lengths (int16 for strings, int32 for bytes and arrays, -1 for null); flexible
versions (KIP-482) use *compact* forms, an unsigned varint holding ``length + 1``
(0 for null), and end every struct with a block of *tagged fields*. Records inside
a record batch use zig-zag varints/varlongs. Every reader method raises
:class:`DecodeError` on truncated or inconsistent input, never ``struct.error`` or
``IndexError``, so the server can answer a malformed request with one log line.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["DecodeError", "Reader", "Writer"]

T = TypeVar("T")

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")

# Arrays and strings cannot be longer than the frame they arrive in; this bound only
# stops a forged count from allocating a huge list before the bytes run out.
_MAX_VARINT_BYTES = 10


class DecodeError(ValueError):
    """The bytes do not form a valid value of the expected type (truncated, bad length...)."""


class Reader:
    """Sequential decoder over one request body.

    Args:
        data: the bytes to decode (not copied).
        pos: where to start.
    """

    __slots__ = ("_buf", "_end", "pos")

    def __init__(self, data: bytes | bytearray | memoryview, pos: int = 0) -> None:
        self._buf = memoryview(data)
        self._end = len(self._buf)
        self.pos = pos

    @property
    def remaining(self) -> int:
        """Bytes not consumed yet."""
        return self._end - self.pos

    def _take(self, n: int) -> memoryview:
        pos = self.pos
        if n < 0 or pos + n > self._end:
            raise DecodeError(f"need {n} bytes at offset {pos}, only {self._end - pos} left")
        self.pos = pos + n
        return self._buf[pos : pos + n]

    def _unpack(self, fmt: struct.Struct) -> int:
        pos = self.pos
        if pos + fmt.size > self._end:
            raise DecodeError(f"truncated: need {fmt.size} bytes at offset {pos}")
        self.pos = pos + fmt.size
        value: int = fmt.unpack_from(self._buf, pos)[0]
        return value

    # -- fixed width ---------------------------------------------------------------

    def int8(self) -> int:
        """A signed 8-bit integer."""
        return self._unpack(_I8)

    def int16(self) -> int:
        """A signed 16-bit integer."""
        return self._unpack(_I16)

    def int32(self) -> int:
        """A signed 32-bit integer."""
        return self._unpack(_I32)

    def uint32(self) -> int:
        """An unsigned 32-bit integer."""
        return self._unpack(_U32)

    def int64(self) -> int:
        """A signed 64-bit integer."""
        return self._unpack(_I64)

    def boolean(self) -> bool:
        """A boolean (one byte, non-zero is true)."""
        return self._unpack(_I8) != 0

    # -- variable width --------------------------------------------------------------

    def unsigned_varint(self) -> int:
        """An unsigned LEB128 varint (at most 10 bytes)."""
        result = 0
        shift = 0
        for _ in range(_MAX_VARINT_BYTES):
            if self.pos >= self._end:
                raise DecodeError(f"truncated varint at offset {self.pos}")
            byte = self._buf[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
        raise DecodeError(f"varint longer than {_MAX_VARINT_BYTES} bytes at offset {self.pos}")

    def varint(self) -> int:
        """A zig-zag signed varint (32-bit range)."""
        raw = self.unsigned_varint()
        if raw > 0xFFFFFFFF:
            raise DecodeError(f"varint out of 32-bit range at offset {self.pos}")
        return (raw >> 1) ^ -(raw & 1)

    def varlong(self) -> int:
        """A zig-zag signed varlong (64-bit range)."""
        raw = self.unsigned_varint()
        if raw > 0xFFFFFFFFFFFFFFFF:
            raise DecodeError(f"varlong out of 64-bit range at offset {self.pos}")
        return (raw >> 1) ^ -(raw & 1)

    # -- strings and bytes -------------------------------------------------------------

    def _text(self, n: int) -> str:
        try:
            return str(self._take(n), "utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"invalid UTF-8 string at offset {self.pos - n}") from exc

    def string(self) -> str:
        """A non-null string (int16 length)."""
        value = self.nullable_string()
        if value is None:
            raise DecodeError(f"null where a string is required at offset {self.pos - 2}")
        return value

    def nullable_string(self) -> str | None:
        """A string or null (int16 length, -1 for null)."""
        n = self.int16()
        if n == -1:
            return None
        if n < 0:
            raise DecodeError(f"negative string length {n}")
        return self._text(n)

    def compact_string(self) -> str:
        """A non-null compact string (unsigned varint length + 1)."""
        value = self.compact_nullable_string()
        if value is None:
            raise DecodeError(f"null where a compact string is required at offset {self.pos}")
        return value

    def compact_nullable_string(self) -> str | None:
        """A compact string or null (0 for null)."""
        n = self.unsigned_varint()
        if n == 0:
            return None
        return self._text(n - 1)

    def nullable_bytes(self) -> bytes | None:
        """Bytes or null (int32 length, -1 for null)."""
        n = self.int32()
        if n == -1:
            return None
        if n < 0:
            raise DecodeError(f"negative bytes length {n}")
        return bytes(self._take(n))

    def compact_nullable_bytes(self) -> bytes | None:
        """Compact bytes or null (unsigned varint length + 1, 0 for null)."""
        n = self.unsigned_varint()
        if n == 0:
            return None
        return bytes(self._take(n - 1))

    def raw(self, n: int) -> bytes:
        """The next ``n`` bytes as they are."""
        return bytes(self._take(n))

    # -- arrays -------------------------------------------------------------------------

    def _count(self, n: int, item_min_size: int) -> int:
        # A forged count cannot make us loop or allocate past what the frame holds.
        if n * item_min_size > self.remaining:
            raise DecodeError(f"array of {n} items does not fit in {self.remaining} bytes")
        return n

    def array(self, item: Callable[[Reader], T], item_min_size: int = 1) -> list[T]:
        """A non-null array (int32 count); ``item`` decodes one element."""
        value = self.nullable_array(item, item_min_size)
        if value is None:
            raise DecodeError(f"null where an array is required at offset {self.pos - 4}")
        return value

    def nullable_array(self, item: Callable[[Reader], T], item_min_size: int = 1) -> list[T] | None:
        """An array or null (int32 count, -1 for null)."""
        n = self.int32()
        if n == -1:
            return None
        if n < 0:
            raise DecodeError(f"negative array length {n}")
        return [item(self) for _ in range(self._count(n, item_min_size))]

    def compact_array(self, item: Callable[[Reader], T], item_min_size: int = 1) -> list[T]:
        """A non-null compact array (unsigned varint count + 1)."""
        value = self.compact_nullable_array(item, item_min_size)
        if value is None:
            raise DecodeError(f"null where a compact array is required at offset {self.pos}")
        return value

    def compact_nullable_array(
        self, item: Callable[[Reader], T], item_min_size: int = 1
    ) -> list[T] | None:
        """A compact array or null (0 for null)."""
        n = self.unsigned_varint()
        if n == 0:
            return None
        return [item(self) for _ in range(self._count(n - 1, item_min_size))]

    def tagged_fields(self) -> dict[int, bytes]:
        """A tagged-field block: count, then (tag, size, bytes) with strictly increasing tags."""
        n = self._count(self.unsigned_varint(), 2)
        fields: dict[int, bytes] = {}
        last = -1
        for _ in range(n):
            tag = self.unsigned_varint()
            if tag <= last:
                raise DecodeError(f"tagged field {tag} out of order (after {last})")
            last = tag
            fields[tag] = bytes(self._take(self.unsigned_varint()))
        return fields


class Writer:
    """Encoder into a growing buffer; every method returns ``self`` for chaining."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def getvalue(self) -> bytes:
        """The encoded bytes."""
        return bytes(self.buf)

    # -- fixed width ---------------------------------------------------------------

    def int8(self, value: int) -> Writer:
        """A signed 8-bit integer."""
        self.buf += _I8.pack(value)
        return self

    def int16(self, value: int) -> Writer:
        """A signed 16-bit integer."""
        self.buf += _I16.pack(value)
        return self

    def int32(self, value: int) -> Writer:
        """A signed 32-bit integer."""
        self.buf += _I32.pack(value)
        return self

    def uint32(self, value: int) -> Writer:
        """An unsigned 32-bit integer."""
        self.buf += _U32.pack(value)
        return self

    def int64(self, value: int) -> Writer:
        """A signed 64-bit integer."""
        self.buf += _I64.pack(value)
        return self

    def boolean(self, value: bool) -> Writer:
        """A boolean as one byte."""
        self.buf.append(1 if value else 0)
        return self

    # -- variable width --------------------------------------------------------------

    def unsigned_varint(self, value: int) -> Writer:
        """An unsigned LEB128 varint."""
        if value < 0:
            raise ValueError(f"unsigned varint must not be negative, got {value}")
        while value > 0x7F:
            self.buf.append((value & 0x7F) | 0x80)
            value >>= 7
        self.buf.append(value)
        return self

    def varint(self, value: int) -> Writer:
        """A zig-zag signed varint (32-bit range)."""
        return self.unsigned_varint(((value << 1) ^ (value >> 31)) & 0xFFFFFFFF)

    def varlong(self, value: int) -> Writer:
        """A zig-zag signed varlong (64-bit range)."""
        return self.unsigned_varint(((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)

    # -- strings and bytes -------------------------------------------------------------

    def nullable_string(self, value: str | None) -> Writer:
        """A string or null (int16 length)."""
        if value is None:
            return self.int16(-1)
        data = value.encode()
        self.int16(len(data))
        self.buf += data
        return self

    string = nullable_string

    def compact_nullable_string(self, value: str | None) -> Writer:
        """A compact string or null."""
        if value is None:
            return self.unsigned_varint(0)
        data = value.encode()
        self.unsigned_varint(len(data) + 1)
        self.buf += data
        return self

    compact_string = compact_nullable_string

    def nullable_bytes(self, value: bytes | bytearray | memoryview | None) -> Writer:
        """Bytes or null (int32 length)."""
        if value is None:
            return self.int32(-1)
        self.int32(len(value))
        self.buf += value
        return self

    def compact_nullable_bytes(self, value: bytes | None) -> Writer:
        """Compact bytes or null."""
        if value is None:
            return self.unsigned_varint(0)
        self.unsigned_varint(len(value) + 1)
        self.buf += value
        return self

    def raw(self, value: bytes | bytearray | memoryview) -> Writer:
        """Bytes as they are, no length."""
        self.buf += value
        return self

    # -- arrays -------------------------------------------------------------------------

    def array(self, items: Sequence[T] | None, item: Callable[[Writer, T], object]) -> Writer:
        """An array or null (int32 count); ``item(writer, element)`` encodes one element."""
        if items is None:
            return self.int32(-1)
        self.int32(len(items))
        for element in items:
            item(self, element)
        return self

    def compact_array(
        self, items: Sequence[T] | None, item: Callable[[Writer, T], object]
    ) -> Writer:
        """A compact array or null."""
        if items is None:
            return self.unsigned_varint(0)
        self.unsigned_varint(len(items) + 1)
        for element in items:
            item(self, element)
        return self

    def tagged_fields(self, fields: dict[int, bytes] | None = None) -> Writer:
        """A tagged-field block (empty by default), tags in increasing order."""
        if not fields:
            self.buf.append(0)
            return self
        self.unsigned_varint(len(fields))
        for tag in sorted(fields):
            data = fields[tag]
            self.unsigned_varint(tag).unsigned_varint(len(data))
            self.buf += data
        return self
