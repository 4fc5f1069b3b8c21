"""Topics, their messages and the long-poll fetch, independent of HTTP.

A :class:`Feed` holds named topics (append-only logs of UTF-8 messages) and
answers fetches: at once when enough bytes are readable from the requested
offset, else after parking the fetch with a :class:`~examples.longpoll.waiters.Waiter`
until a post makes it answerable, its wait passes, or the server shuts down.
The waiter is the only part that differs between ``--waiter purgatory`` and
``--waiter asyncio``; everything the load test compares runs through this class.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .waiters import Waiter

__all__ = [
    "REASONS",
    "Appended",
    "Feed",
    "FeedError",
    "Fetched",
    "Settings",
    "TopicLog",
    "answer_reason",
    "check_idempotency_key",
]

#: Topic names: what fits in a URL path segment unescaped, but not dots only
#: (``.`` and ``..`` are path segments that clients and proxies resolve).
TOPIC_NAME = re.compile(r"(?!\.*$)[A-Za-z0-9._-]{1,100}")

#: Why a parked fetch was answered: enough data, its wait passed, the server is
#: shutting down, or (a bug, counted so the load test can show it is 0) before its
#: wait passed without enough data.
REASONS = ("data", "timeout", "shutdown", "early")

#: An ``Idempotency-Key`` (draft-ietf-httpapi-idempotency-key-header): a structured-field
#: string (``"..."``, printable ASCII) or, as many clients send it, the bare text.
_IDEMPOTENCY_KEY = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"|([\x21\x23-\x7e]*)')
_MAX_IDEMPOTENCY_KEY = 255


@dataclass(frozen=True)
class Settings:
    """Limits of a feed (seconds, bytes, counts).

    Raises:
        TypeError: a field has the wrong type.
        ValueError: a field is out of range (the message names it).
    """

    #: ``wait`` when a GET gives none.
    default_wait: float = 30.0
    #: The largest ``wait`` accepted; larger ones get a 400.
    max_wait: float = 300.0
    #: The largest POST body; larger ones get a 413.
    max_body_bytes: int = 64 * 1024
    #: A response carries messages up to this many bytes (always at least one).
    max_response_bytes: int = 1024 * 1024
    #: Messages kept per topic (at least this many, at most twice as many).
    retain: int = 10_000
    #: Topics a feed holds; a POST creating one more gets a 409.
    max_topics: int = 10_000
    #: GETs parked at once; one more gets a 503.
    max_parked: int = 100_000
    #: A POST body must arrive whole within this many seconds of the end of its
    #: headers; else a 408 and the connection is closed.
    body_timeout: float = 10.0
    #: Seconds a POST's ``Idempotency-Key`` is remembered: a retry with the same key
    #: within this time gets the first POST's offset instead of storing a copy.
    idempotency_ttl: float = 86_400.0

    def __post_init__(self) -> None:
        for name in ("default_wait", "max_wait", "body_timeout", "idempotency_ttl"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
            if not 0 <= value < math.inf:
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        for name in ("body_timeout", "idempotency_ttl"):
            if getattr(self, name) == 0:
                raise ValueError(f"{name} must be > 0, got 0")
        if self.default_wait > self.max_wait:
            raise ValueError(
                f"default_wait must not exceed max_wait, got {self.default_wait} > {self.max_wait}"
            )
        for name in ("max_body_bytes", "max_response_bytes", "retain", "max_topics", "max_parked"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")


class FeedError(Exception):
    """A request the feed refuses: ``status`` is the HTTP status, the message says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Fetched:
    """A fetch's answer: ``messages`` hold offsets ``[offset, next_offset)``."""

    offset: int
    messages: list[str]
    next_offset: int

    def as_dict(self) -> dict[str, object]:
        """The JSON body of the response."""
        return {"offset": self.offset, "messages": self.messages, "next_offset": self.next_offset}


@dataclass(frozen=True)
class Appended:
    """A POST's answer: the message's offset; ``replayed``: a retry of a POST already
    stored under the same ``Idempotency-Key``, answered with that POST's offset."""

    offset: int
    replayed: bool = False


def check_idempotency_key(value: str) -> str:
    """The key of an ``Idempotency-Key`` header: ``"text"`` (a structured-field string,
    escapes undone) or bare ``text``; 1 to 255 printable ASCII characters.

    Raises:
        FeedError: 400, saying what is wrong.
    """
    match = _IDEMPOTENCY_KEY.fullmatch(value.strip(" \t"))
    key = None
    if match is not None:
        quoted, bare = match.groups()
        key = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
    if not key or len(key) > _MAX_IDEMPOTENCY_KEY:
        raise FeedError(
            400,
            f"Idempotency-Key must be 1 to {_MAX_IDEMPOTENCY_KEY} printable ASCII characters, "
            'bare or as a quoted string ("...")',
        )
    return key


def body_digest(body: bytes) -> str:
    """What an idempotency record keeps of a POST's body, to refuse a key reused for another."""
    return hashlib.sha1(body, usedforsecurity=False).hexdigest()


class TopicLog:
    """An append-only log of messages with O(1) "bytes readable from offset N".

    Retention drops the oldest messages in chunks: at least ``retain`` stay.
    """

    def __init__(self, retain: int) -> None:
        self._retain = retain
        self._start = 0  # offset of _messages[0]
        self._messages: list[str] = []
        self._sizes: list[int] = []
        # _ends[i]: bytes appended up to and including message start + i (running total).
        self._ends: list[int] = []
        self._total = 0

    @property
    def start_offset(self) -> int:
        """The offset of the oldest retained message."""
        return self._start

    @property
    def end_offset(self) -> int:
        """The offset the next message gets."""
        return self._start + len(self._messages)

    def append(self, message: str, size: int) -> int:
        """Append a message of ``size`` UTF-8 bytes; return its offset."""
        offset = self.end_offset
        self._messages.append(message)
        self._sizes.append(size)
        self._total += size
        self._ends.append(self._total)
        if len(self._messages) >= 2 * self._retain:
            drop = len(self._messages) - self._retain
            del self._messages[:drop], self._sizes[:drop], self._ends[:drop]
            self._start += drop
        return offset

    def bytes_from(self, offset: int) -> int:
        """UTF-8 bytes readable from ``offset`` (or the oldest retained message) to the end."""
        index = max(offset, self._start) - self._start
        if index >= len(self._messages):
            return 0
        return self._total - self._ends[index] + self._sizes[index]

    def read(self, offset: int, max_bytes: int) -> Fetched:
        """Messages from ``offset`` (or the oldest retained), up to ``max_bytes`` (at least one)."""
        first = max(offset, self._start)
        index = first - self._start
        taken: list[str] = []
        size = 0
        for message, message_size in zip(self._messages[index:], self._sizes[index:], strict=True):
            if taken and size + message_size > max_bytes:
                break
            taken.append(message)
            size += message_size
        return Fetched(first, taken, first + len(taken))


class Feed:
    """Topics and long-poll fetches, with the waiting done by ``waiter``.

    Args:
        settings: limits.
        waiter: parks fetches (see :mod:`examples.longpoll.waiters`).
    """

    def __init__(self, settings: Settings, waiter: Waiter) -> None:
        self.settings = settings
        self.waiter = waiter
        self.topics: dict[str, TopicLog] = {}
        #: Parked fetches per topic name (names may not be topics yet).
        self.parked_by_topic: dict[str, int] = {}
        self.parked = 0
        #: Parked fetches answered, by reason (see :data:`REASONS`).
        self.answers = dict.fromkeys(REASONS, 0)
        #: Parked fetches whose client went away first.
        self.disconnected = 0
        self.messages_posted = 0
        #: POSTs answered from an idempotency record (a retry), not stored again.
        self.replayed = 0
        self.closing = False
        # (topic, Idempotency-Key) -> (offset, body digest, expiry in loop time), in
        # the order made: with one TTL for all, also the order they expire in.
        self._idempotent: dict[tuple[str, str], tuple[int, str, float]] = {}

    # -- posting ---------------------------------------------------------------------------

    def post(self, name: str, body: bytes) -> int:
        """Append ``body`` to topic ``name`` (created on first post); return its offset.

        Raises:
            FeedError: a bad name, an empty, oversized or non-UTF-8 body, or one topic too many.
        """
        text = self.check_body(name, body)
        topic = self.topics.get(name)
        if topic is None:
            if len(self.topics) >= self.settings.max_topics:
                raise FeedError(409, f"the feed already holds {self.settings.max_topics} topics")
            topic = self.topics[name] = TopicLog(self.settings.retain)
        offset = topic.append(text, len(body))
        self.messages_posted += 1
        if name in self.parked_by_topic and not self.closing:
            self.waiter.notify(name)
        return offset

    async def append(
        self, name: str, body: bytes, *, idempotency_key: str | None = None
    ) -> Appended:
        """:meth:`post`, as the application calls it (a feed kept elsewhere awaits its store).

        With ``idempotency_key``, a POST to ``name`` that repeats a key seen within
        ``Settings.idempotency_ttl`` is not stored again: it is answered with the
        first one's offset (``replayed``).

        Raises:
            FeedError: see :meth:`post`; 422 for a key already used with another body.
        """
        if idempotency_key is None:
            return Appended(self.post(name, body))
        now = asyncio.get_running_loop().time()
        records = self._idempotent
        while records:
            oldest = next(iter(records))
            if records[oldest][2] > now:
                break
            del records[oldest]
        digest = body_digest(body)
        record = records.get((name, idempotency_key))
        if record is not None:
            if record[1] != digest:
                raise FeedError(422, "this Idempotency-Key was used for another body")
            self.replayed += 1
            return Appended(record[0], replayed=True)
        offset = self.post(name, body)
        records[(name, idempotency_key)] = (offset, digest, now + self.settings.idempotency_ttl)
        return Appended(offset)

    def check_body(self, name: str, body: bytes) -> str:
        """The text of a post to ``name``, or FeedError (400 or 413) saying what is wrong."""
        check_topic(name)
        if not body:
            raise FeedError(400, "the body must not be empty")
        if len(body) > self.settings.max_body_bytes:
            raise FeedError(413, f"the body is over {self.settings.max_body_bytes} bytes")
        try:
            return body.decode()
        except UnicodeDecodeError:
            raise FeedError(400, "the body must be UTF-8 text") from None

    # -- fetching --------------------------------------------------------------------------

    def readable(self, name: str, offset: int) -> int:
        """Bytes readable from ``offset`` in topic ``name`` (0 for a topic not posted to yet)."""
        topic = self.topics.get(name)
        return 0 if topic is None else topic.bytes_from(offset)

    def check_fetch(self, name: str, offset: int) -> None:
        """Refuse a fetch of a bad topic name or past the end of the topic.

        Raises:
            FeedError: 400.
        """
        check_topic(name)
        topic = self.topics.get(name)
        end = 0 if topic is None else topic.end_offset
        if offset > end:
            raise FeedError(400, f"offset {offset} is past the end of topic {name} ({end})")

    def read(self, name: str, offset: int) -> Fetched:
        """What topic ``name`` holds from ``offset`` now (possibly nothing)."""
        topic = self.topics.get(name)
        if topic is None:
            return Fetched(offset, [], offset)
        return topic.read(offset, self.settings.max_response_bytes)

    def answerable(self, name: str, offset: int, wait: float, min_bytes: int) -> bool:
        """True if a fetch is answered without parking."""
        return self.closing or wait == 0 or self.readable(name, offset) >= min_bytes

    async def wait(self, name: str, offset: int, wait: float, min_bytes: int) -> None:
        """Park a fetch until ``min_bytes`` are readable from ``offset``, ``wait`` passes or
        :meth:`shutdown`; count why it ended. Cancelling the caller withdraws it.

        Raises:
            FeedError: 503 when ``max_parked`` fetches are parked already.
        """

        def ready() -> bool:
            return self.readable(name, offset) >= min_bytes

        loop = asyncio.get_running_loop()
        start = loop.time()
        with self.parking(name):
            await self.waiter.wait(name, ready, wait)
        self.answers[answer_reason(ready(), self.closing, loop.time(), start + wait)] += 1

    @contextlib.contextmanager
    def parking(self, name: str) -> Iterator[None]:
        """Count a fetch parked on topic ``name`` while the block runs (``parked``,
        ``parked_by_topic``, and ``disconnected`` when the block is cancelled: its
        client went away). Every kind of feed parks through here.

        Raises:
            FeedError: 503 when ``max_parked`` fetches are parked already (nothing counted).
        """
        if self.parked >= self.settings.max_parked:
            raise FeedError(503, f"{self.settings.max_parked} requests are waiting already")
        self.parked += 1
        self.parked_by_topic[name] = self.parked_by_topic.get(name, 0) + 1
        try:
            yield
        except asyncio.CancelledError:
            self.disconnected += 1
            raise
        finally:
            self.parked -= 1
            left = self.parked_by_topic[name] - 1
            if left:
                self.parked_by_topic[name] = left
            else:
                del self.parked_by_topic[name]

    async def fetch(
        self,
        name: str,
        offset: int,
        wait: float,
        min_bytes: int,
        park: Callable[[Awaitable[None]], Awaitable[bool]] | None = None,
    ) -> Fetched | None:
        """Answer a fetch: at once if it is answerable, else after parking it.

        ``park``, when given, awaits the wait on the caller's terms (the application
        watches for the client going away) and returns False if the client went
        away; the fetch then returns None.

        Raises:
            FeedError: see :meth:`check_fetch` and :meth:`wait`.
        """
        self.check_fetch(name, offset)
        if not self.answerable(name, offset, wait, min_bytes):
            waiting = self.wait(name, offset, wait, min_bytes)
            if park is None:
                await waiting
            elif not await park(waiting):
                return None
        return self.read(name, offset)

    def topic_count(self) -> int:
        """Topics held."""
        return len(self.topics)

    def metric_families(self) -> list[Any]:
        """Prometheus families of this kind of feed beyond the common ones (none here)."""
        return []

    def health(self) -> tuple[int, dict[str, object]]:
        """``/healthz``: the status code and the JSON body."""
        if self.closing:
            return 503, {"status": "stopping", "waiter": self.waiter.name}
        return 200, {"status": "ok", "waiter": self.waiter.name}

    def shutdown(self) -> int:
        """Answer every parked fetch now and park no more; return how many were parked."""
        self.closing = True
        parked = self.parked
        for name in list(self.parked_by_topic):
            self.waiter.release(name)
        return parked


def answer_reason(enough: bool, closing: bool, now: float, due: float) -> str:
    """Why a parked fetch is answered (:data:`REASONS`), judged on the answer itself:
    ``enough`` data in it, the server stopping, or its wait passed (``now >= due``,
    as timers judge due times); anything else is early."""
    if enough:
        return "data"
    if closing:
        return "shutdown"
    return "timeout" if now >= due else "early"


def check_topic(name: str) -> None:
    """Raise FeedError(400) unless ``name`` is a valid topic name."""
    if not TOPIC_NAME.fullmatch(name):
        raise FeedError(400, "a topic name is 1 to 100 of A-Z a-z 0-9 . _ -, not dots only")
