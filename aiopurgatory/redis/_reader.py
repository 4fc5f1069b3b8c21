"""The reads of stored watermarks: coalesced per loop iteration, retried, never awaited by a watch.

A :class:`WatermarkReader` serves three kinds of read, on one :class:`~._link.Link`
of its own, from one task:

* **catch-up** (:meth:`want`): the keys of an operation that ``RedisTriggers.watch``
  just watched. Their stored watermarks are applied to the local purgatory, so
  an advance that reached this process before the watch (when nothing here kept
  it) is not missed. The watch does not wait for the read: it waits for its
  operation, which the read may complete. So a slow or hung Redis never holds a
  caller past its operation's timeout. Keys whose partition had to be subscribed
  first (:mod:`._subscriber`) are also *checked* once after the read: a plain
  trigger published before the subscription was confirmed is not state, and
  checking makes it good.
* **resync** (:meth:`request_resync`): after the subscription (re)starts, every
  watched key is read and advanced, then checked once (plain triggers are not
  state: one missed while unsubscribed is made good by checking). With nothing
  watched it is a PING (on one Redis), which opens the connection again after
  a restart, before any read needs it.
* **fetch** (:meth:`fetch`): ``RedisTriggers.fetch_watermark``, one attempt whose
  failure is the caller's.

Whatever is asked in one loop iteration leaves as one round trip: an ``MGET`` per
:data:`READ_CHUNK` keys, pipelined. A read that fails is counted, logged once per
outage (``aiopurgatory.redis.read_failed``, then ``aiopurgatory.redis.read_resumed``
at the first read that succeeds), and retried after a backoff for the keys that
are still watched (a failed resync is retried whole); a re-subscription ends the
backoff at once (Redis answers again).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Any, Final

from .._purgatory import Purgatory
from ._connections import Connections
from ._link import CONNECTION_ERRORS, CommandLink
from ._wire import Key, Value, parse_stored, wire_keys

__all__ = ["READ_CHUNK", "WatermarkReader"]

#: Keys per MGET (one round trip carries as many MGETs as needed).
READ_CHUNK: Final = 1000


class WatermarkReader:
    """Reads stored watermarks for one RedisTriggers (see the module documentation).

    Args:
        purgatory: the local purgatory (None for a publisher only: fetches only).
        link: the connection it reads on (no one else uses it).
        stored_key: the Redis key of a key's stored watermark.
        partition_of: on a Redis Cluster, a key's partition: an MGET then reads
            the keys of one partition (one slot) only, never across slots.
        connections: the owner's connections: the wait before the n-th retry
            (``backoff``), and the record of failures (``record_error``, which
            returns the failure's redacted text).
        logger: the owner's bound logger.
    """

    __slots__ = (
        "_busy",
        "_checks",
        "_connections",
        "_failures",
        "_fetches",
        "_keys",
        "_kick",
        "_link",
        "_logger",
        "_partition_of",
        "_purgatory",
        "_resync",
        "_stored_key",
        "_wakeup",
        "completed",
        "read_errors",
        "reads",
        "resyncs",
    )

    def __init__(
        self,
        purgatory: Purgatory[Any] | None,
        link: CommandLink,
        stored_key: Callable[[Key], bytes],
        *,
        partition_of: Callable[[Key], int] | None = None,
        connections: Connections,
        logger: Any,
    ) -> None:
        self._purgatory = purgatory
        self._link = link
        self._stored_key = stored_key
        self._partition_of = partition_of
        self._connections = connections
        self._logger = logger
        # What the next round trip reads (dicts as ordered sets).
        self._keys: dict[Key, None] = {}
        self._checks: dict[Key, None] = {}  # read, then checked once
        self._fetches: dict[Key, list[asyncio.Future[Value | None]]] = {}
        self._resync = False
        self._busy = False  # a round trip is in flight
        self._failures = 0  # reads failed since the last one that succeeded
        self._wakeup = asyncio.Event()  # work is waiting
        self._kick = asyncio.Event()  # end a backoff now
        self.reads = 0
        self.read_errors = 0
        self.resyncs = 0
        self.completed = 0

    # -- requests (any task of the loop) ------------------------------------------------

    def want(self, keys: Iterable[Key], *, check: bool = False) -> None:
        """Read ``keys``' stored watermarks soon and apply them (for a new watch).

        With ``check``, each key is also checked once after the read (its
        partition was subscribed just now: a plain trigger may have been missed).
        """
        (self._checks if check else self._keys).update(dict.fromkeys(keys))
        self._wakeup.set()

    def fetch(self, key: Key) -> asyncio.Future[Value | None]:
        """A future of ``key``'s stored watermark: one attempt, its failure set on the future."""
        future: asyncio.Future[Value | None] = asyncio.get_running_loop().create_future()
        self._fetches.setdefault(key, []).append(future)
        self._wakeup.set()
        self._kick.set()  # an explicit request: tried now, not after a backoff
        return future

    def request_resync(self) -> None:
        """Resync every watched key soon (the subscription has just (re)started)."""
        self._resync = True
        self._wakeup.set()
        self._kick.set()

    @property
    def idle(self) -> bool:
        """Nothing is asked for or being read."""
        return not (self._keys or self._checks or self._fetches or self._resync or self._busy)

    def cancel_resync(self) -> None:
        """Forget a resync asked for (one was just served)."""
        self._resync = False

    async def drop(self) -> None:
        """Close its connection (at close; a later read would open a new one)."""
        await self._link.drop()

    def fail_fetches(self, exc: BaseException) -> None:
        """Fail every fetch not yet answered (at close)."""
        fetches, self._fetches = self._fetches, {}
        for futures in fetches.values():
            for future in futures:
                if not future.done():
                    future.set_exception(exc)

    # -- the task ------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve requests until cancelled; failures are retried, never raised."""
        wakeup = self._wakeup
        while True:
            await wakeup.wait()
            wakeup.clear()
            while self._keys or self._checks or self._fetches or self._resync:
                keys, self._keys = self._keys, {}
                checks, self._checks = self._checks, {}
                fetches, self._fetches = self._fetches, {}
                resync, self._resync = self._resync, False
                self._kick.clear()
                self._busy = True
                try:
                    await self.serve(keys, fetches, resync=resync, checks=checks)
                except asyncio.CancelledError:
                    # Closing: the fetches in flight are failed with the others
                    # (fail_fetches), not left waiting forever.
                    for key, futures in fetches.items():
                        self._fetches.setdefault(key, []).extend(futures)
                    raise
                except Exception as exc:
                    self._failed(exc, keys, fetches, resync=resync, checks=checks)
                    await self._pause(self._connections.backoff(self._failures))
                finally:
                    self._busy = False

    async def serve(
        self,
        keys: Iterable[Key] = (),
        fetches: dict[Key, list[asyncio.Future[Value | None]]] | None = None,
        *,
        resync: bool = False,
        checks: Iterable[Key] = (),
    ) -> None:
        """One round trip for ``keys``, ``checks``, the ``fetches`` and, if ``resync``,
        every watched key; then ``checks`` (every watched key if ``resync``) are checked.

        Raises:
            Exception: the read failed (nothing was applied; fetches untouched).
        """
        purgatory = self._purgatory
        watched = wire_keys(purgatory.keys()) if resync and purgatory is not None else []
        wanted = dict.fromkeys(watched)
        wanted.update(dict.fromkeys(keys))
        checks = list(checks)
        wanted.update(dict.fromkeys(checks))
        if fetches:
            wanted.update(dict.fromkeys(fetches))
        order = list(wanted)
        values: list[Value | None] = []
        # A resync with nothing to read still makes a round trip (on one Redis):
        # the connection is opened now (one that died with a restarted Redis is
        # replaced), so the first read asked after a reconnect, such as a
        # timeout=0 watch's within catch_up_grace, is one round trip and not a
        # connect and a handshake as well.
        warm = resync and not order and self._partition_of is None
        if order or warm:
            if order:
                values = await self._read(order)
            else:
                await self._link.execute(("PING",))
            if self._failures:
                self._logger.warning("aiopurgatory.redis.read_resumed", attempts=self._failures)
                self._failures = 0
        if fetches:
            found = dict(zip(order, values, strict=True))
            for key, futures in fetches.items():
                for future in futures:
                    if not future.done():
                        future.set_result(found[key])
        if purgatory is None or purgatory.closed:
            return
        completed = 0
        advance = purgatory.advance
        for key, value in zip(order, values, strict=True):
            if value is not None:
                completed += advance(key, value)
        # Plain triggers are not state: one missed while unsubscribed is made
        # good by checking the key once.
        check = purgatory.check_and_complete
        for key in watched if resync else checks:
            completed += check(key)
        if resync:
            self.resyncs += 1
        self.completed += completed

    async def _read(self, keys: list[Key]) -> list[Value | None]:
        stored_key = self._stored_key
        partition_of = self._partition_of
        groups: list[list[Key]]
        if partition_of is None:
            groups = [keys]
        else:
            # A cluster: each MGET within one slot (a partition's keys share it).
            by_partition: dict[int, list[Key]] = {}
            for key in keys:
                by_partition.setdefault(partition_of(key), []).append(key)
            groups = list(by_partition.values())
        order: list[Key] = []
        commands = []
        for group in groups:
            order += group
            commands += [
                ("MGET", *[stored_key(key) for key in group[start : start + READ_CHUNK]])
                for start in range(0, len(group), READ_CHUNK)
            ]
        replies = await self._link.execute(*commands)
        self.reads += 1
        found: list[Value | None] = []
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
            found.extend(parse_stored(raw) for raw in reply)
        if order is keys or partition_of is None:
            return found
        value_of = dict(zip(order, found, strict=True))
        return [value_of[key] for key in keys]

    def _failed(
        self,
        exc: Exception,
        keys: dict[Key, None],
        fetches: dict[Key, list[asyncio.Future[Value | None]]],
        *,
        resync: bool,
        checks: dict[Key, None],
    ) -> None:
        self._failures += 1
        self.read_errors += 1
        text = self._connections.record_error(exc)
        if not isinstance(exc, CONNECTION_ERRORS):  # a bug: loud every time, and retried
            self._logger.error("aiopurgatory.redis.read_failed", error=text, bug=True)
        elif self._failures == 1:  # once per outage
            self._logger.warning(
                "aiopurgatory.redis.read_failed",
                error=text,
                keys=len(keys) + len(checks) + len(fetches),
                resync=resync,
            )
        for futures in fetches.values():
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
        # Retried: a resync whole; the catch-up of the keys still watched (an
        # operation that ended meanwhile needs no read).
        self._resync = self._resync or resync
        purgatory = self._purgatory
        if keys and purgatory is not None and not purgatory.closed:
            watched = set(purgatory.keys())
            retry = {key: None for key in keys if key in watched}
            retry.update(self._keys)
            self._keys = retry
            retry = {key: None for key in checks if key in watched}
            retry.update(self._checks)
            self._checks = retry

    async def _pause(self, delay: float) -> None:
        """Sleep ``delay`` seconds, or less if a resync or a fetch asks for Redis now."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._kick.wait()
