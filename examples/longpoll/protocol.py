"""uvicorn's httptools protocol with bounds on a request's head (request line and headers).

uvicorn bounds the idle time between requests on a keep-alive connection
(``timeout_keep_alive``) but neither the time a client takes to send a request's
head nor, with httptools, its size: a connection that never sends a byte, or sends
its headers a byte at a time, is held as long as the client likes, and a 64 MiB
header is read into memory. This subclass adds both bounds:

* **a deadline for the head**: it must arrive whole within ``header_timeout``
  seconds of the connection opening, or of the first byte of the request on a
  kept-alive connection. Past it, a connection on which part of a head arrived
  gets a 408 and is closed; one on which nothing arrived is closed (as uvicorn
  closes an idle keep-alive connection: a browser's speculative connection must
  not show an error).
* **a size for the head**: over ``max_header_bytes`` (counted as received, so a
  pipelined request before it in the same read may add to it), a 431 and the
  connection is closed.

Each is counted in ``refused`` by reason (:data:`REFUSED_HEAD_REASONS`). The body
has its own deadline in the application (``Settings.body_timeout``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["REFUSED_HEAD_REASONS", "BoundedHttpToolsProtocol", "bounded_protocol"]

#: Why a connection was refused before its request's head was whole: nothing
#: arrived in time (``idle``), part of a head did (``timeout``, 408), or the head
#: was too large (``too_large``, 431).
REFUSED_HEAD_REASONS = ("idle", "timeout", "too_large")

_REASON_PHRASES = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """:class:`~uvicorn.protocols.http.httptools_impl.HttpToolsProtocol` with a deadline
    and a size for each request's head; configure with :func:`bounded_protocol`."""

    header_timeout: ClassVar[float] = 10.0
    max_header_bytes: ClassVar[int] = 16 * 1024
    refused: ClassVar[dict[str, int]] = dict.fromkeys(REFUSED_HEAD_REASONS, 0)

    # The head timer runs exactly while a head is awaited: from connection_made or
    # on_message_begin to on_headers_complete (or the connection's end).
    _head_timer: asyncio.TimerHandle | None = None
    _head_started = False  # a byte of the awaited head arrived
    _head_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_started and self._head_timer is not None and not self.transport.is_closing():
            # Still inside a head after this read: all of it was head (but for
            # the end of a pipelined request before it).
            self._head_bytes += len(data)
            if self._head_bytes > self.max_header_bytes:
                self._refuse(
                    "too_large", 431, f"the request head is over {self.max_header_bytes} bytes"
                )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_started = True
        if self._head_timer is None:
            self._await_head()

    def on_headers_complete(self) -> None:
        self._stop_head_timer()
        super().on_headers_complete()

    def _await_head(self) -> None:
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_too_slow)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._head_started = False
        self._head_bytes = 0

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A request pipelined behind one still being answered (a parked GET):
            # the connection is busy, not idle; look again later.
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_too_slow)
            return
        if not self._head_started:
            self.refused["idle"] += 1
            self.transport.close()
            return
        self._refuse(
            "timeout",
            408,
            f"the request head did not arrive within {self.header_timeout:g} seconds",
        )

    def _refuse(self, reason: str, status: int, message: str) -> None:
        self.refused[reason] += 1
        self._stop_head_timer()
        body = json.dumps({"error": message}).encode()
        head = [b"HTTP/1.1 %d %s\r\n" % (status, _REASON_PHRASES[status])]
        for name, value in self.server_state.default_headers:
            head.append(name + b": " + value + b"\r\n")
        head.append(
            b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % len(body)
        )
        self.transport.write(b"".join(head) + body)
        self.transport.close()


def bounded_protocol(
    header_timeout: float, max_header_bytes: int, refused: dict[str, int]
) -> type[BoundedHttpToolsProtocol]:
    """A :class:`BoundedHttpToolsProtocol` class for uvicorn's ``Config(http=...)``.

    Args:
        header_timeout: seconds for a request's head to arrive whole (> 0).
        max_header_bytes: the largest head accepted (>= 1).
        refused: counts refused heads by reason (updated in place).

    Raises:
        ValueError: a bound out of range.
    """
    if not 0 < header_timeout < float("inf"):
        raise ValueError(f"header_timeout must be finite and > 0, got {header_timeout!r}")
    if max_header_bytes < 1:
        raise ValueError(f"max_header_bytes must be >= 1, got {max_header_bytes}")
    namespace: dict[str, Any] = {
        "header_timeout": header_timeout,
        "max_header_bytes": max_header_bytes,
        "refused": refused,
    }
    return type("BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,), namespace)
