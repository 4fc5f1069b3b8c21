"""A minimal raw Kafka-protocol client, for poking at the broker byte by byte.

Real clients (aiokafka) are what the broker is for; this exists to send what
they never would: hand-picked versions, server-side timeouts shorter than the
client's, garbage, truncated frames. Used by the tests; handy in a REPL::

    conn = await RawConnection.open("127.0.0.1", 9092)
    body = await conn.request(18, 0, b"")      # ApiVersions v0
"""

from __future__ import annotations

import asyncio
import contextlib
import struct

from .codec import Reader, Writer
from .messages import ApiKey, is_flexible

__all__ = ["RawConnection", "build_fetch_v4", "build_produce_v3"]


class RawConnection:
    """One TCP connection speaking request/response frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._correlation_id = 0

    @classmethod
    async def open(cls, host: str, port: int) -> RawConnection:
        """Connect to ``host:port``."""
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    def send(self, api_key: int, version: int, body: bytes, *, client_id: str = "raw") -> int:
        """Send one request (header v1, or v2 when flexible); return its correlation id."""
        self._correlation_id += 1
        head = Writer().int16(api_key).int16(version).int32(self._correlation_id)
        head.nullable_string(client_id)
        if is_flexible(api_key, version):
            head.tagged_fields()
        payload = head.getvalue() + body
        self.writer.write(struct.pack(">i", len(payload)) + payload)
        return self._correlation_id

    async def receive(self, api_key: int, version: int) -> tuple[int, Reader]:
        """Read one response; return (correlation id, reader positioned at the body)."""
        size = struct.unpack(">i", await self.reader.readexactly(4))[0]
        reader = Reader(await self.reader.readexactly(size))
        correlation_id = reader.int32()
        if api_key != ApiKey.API_VERSIONS and is_flexible(api_key, version):
            reader.tagged_fields()
        return correlation_id, reader

    async def request(self, api_key: int, version: int, body: bytes) -> Reader:
        """Send a request and read its response body.

        Raises:
            ValueError: the response has another correlation id.
        """
        sent = self.send(api_key, version, body)
        await self.writer.drain()
        got, reader = await self.receive(api_key, version)
        if got != sent:
            raise ValueError(f"correlation id {got} for request {sent}")
        return reader

    def write_raw(self, data: bytes) -> None:
        """Write bytes as they are (no framing)."""
        self.writer.write(data)

    async def closed_by_peer(self, within: float = 5.0) -> bool:
        """True if the server closes the connection (EOF) within ``within`` seconds."""
        try:
            async with asyncio.timeout(within):
                while await self.reader.read(65536):
                    pass
        except TimeoutError:
            return False
        except ConnectionError:
            return True
        return True

    async def close(self) -> None:
        """Close the connection."""
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


def build_produce_v3(
    topic: str, partition: int, records: bytes | None, *, acks: int = -1, timeout_ms: int = 30_000
) -> bytes:
    """A Produce v3 body for one partition."""
    w = Writer().nullable_string(None).int16(acks).int32(timeout_ms)
    w.int32(1).string(topic).int32(1).int32(partition).nullable_bytes(records)
    return w.getvalue()


def build_fetch_v4(
    topic: str,
    partition: int,
    offset: int,
    *,
    max_wait_ms: int,
    min_bytes: int = 1,
    max_bytes: int = 1 << 20,
) -> bytes:
    """A Fetch v4 body for one partition (consumer, read uncommitted)."""
    w = Writer().int32(-1).int32(max_wait_ms).int32(min_bytes).int32(max_bytes).int8(0)
    w.int32(1).string(topic).int32(1).int32(partition).int64(offset).int32(max_bytes)
    return w.getvalue()
