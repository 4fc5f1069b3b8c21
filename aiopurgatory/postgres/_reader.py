"""Reads of stored watermarks: coalesced per loop iteration, retried, never awaited by a watch.

A :class:`WatermarkReader` serves, on a :class:`~._connections.Link` of its own,
from one task:

* **catch-up** (:meth:`want`): the keys an operation was just watched under. Their
  stored watermarks are applied to the local purgatory (a purgatory keeps
  watermarks of watched keys only, so an advance committed before the watch left
  nothing here). Keys whose partition had just to be LISTENed to are also
  *checked* once: a plain trigger sent before the LISTEN is not state.
* **resync** (:meth:`request_resync`): after the listener (re)connects, every
  watched key is read, advanced and checked once.
* **fetch** (:meth:`fetch`): ``fetch_watermark`` and the read a short watch
  makes before watching; one attempt, whose failure is the caller's.

What is asked in one loop iteration is one statement (``key = ANY($1)``). A read
that fails is counted, logged once per outage, and retried after a backoff for
the keys still watched (a resync whole); a reconnection ends the backoff at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Iterable
from typing import Any

from .._purgatory import Purgatory
from .._transport import Key, Value
from ._connections import CONNECTION_ERRORS, Link, Source
from ._wire import key_from_stored, stored_key, wire_keys

__all__ = ["WatermarkReader"]


class WatermarkReader:
    """Reads stored watermarks for one PostgresTriggers (see the module documentation)."""

    def __init__(
        self,
        purgatory: Purgatory[Any] | None,
        link: Link,
        source: Source,
        *,
        statement: str,
        logger: Any,
    ) -> None:
        self._purgatory = purgatory
        self.link = link
        self._source = source
        self._statement = statement
        self._logger = logger
        self._keys: dict[Key, None] = {}
        self._checks: dict[Key, None] = {}
        self._fetches: dict[Key, list[asyncio.Future[Value | None]]] = {}
        self._resync = False
        self._failures = 0
        self._busy = False  # a read is in flight
        self._wakeup = asyncio.Event()
        self._kick = asyncio.Event()
        self.reads = 0
        self.read_errors = 0
        self.resyncs = 0
        self.completed = 0

    def want(self, keys: Iterable[Key], *, check: bool = False) -> None:
        """Read ``keys``' stored watermarks soon and apply them (and check them, with ``check``)."""
        (self._checks if check else self._keys).update(dict.fromkeys(keys))
        self._wakeup.set()

    def fetch(self, key: Key) -> asyncio.Future[Value | None]:
        """A future of ``key``'s stored watermark (one attempt; its failure set on the future)."""
        future: asyncio.Future[Value | None] = asyncio.get_running_loop().create_future()
        self._fetches.setdefault(key, []).append(future)
        self._wakeup.set()
        self._kick.set()
        return future

    def request_resync(self) -> None:
        """Resync every watched key soon (the listener has just (re)connected)."""
        self._resync = True
        self._wakeup.set()
        self._kick.set()

    @property
    def idle(self) -> bool:
        """Nothing is asked for or being read (for tests and benchmarks)."""
        return not (self._keys or self._checks or self._fetches or self._resync or self._busy)

    def cancel_resync(self) -> None:
        """Forget a resync asked for (one was just served)."""
        self._resync = False

    def fail_fetches(self, exc: BaseException) -> None:
        """Fail every fetch not yet answered (at close)."""
        fetches, self._fetches = self._fetches, {}
        for futures in fetches.values():
            for future in futures:
                if not future.done():
                    future.set_exception(exc)

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
                    for key, futures in fetches.items():
                        self._fetches.setdefault(key, []).extend(futures)
                    raise
                except Exception as exc:
                    self._failed(exc, keys, fetches, resync=resync, checks=checks)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self._source.backoff(self._failures)):
                            await self._kick.wait()
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
        """One statement for ``keys``, ``checks``, ``fetches`` and (``resync``) every
        watched key; then ``checks`` (every watched key if ``resync``) are checked.

        Raises:
            Exception: the read failed (nothing applied; the fetches untouched).
        """
        purgatory = self._purgatory
        watched = wire_keys(purgatory.keys()) if resync and purgatory is not None else []
        wanted = dict.fromkeys(watched)
        wanted.update(dict.fromkeys(keys))
        checks = list(checks)
        wanted.update(dict.fromkeys(checks))
        if fetches:
            wanted.update(dict.fromkeys(fetches))
        found: dict[Key, Value] = {}
        if wanted:
            found = await self.read(list(wanted))
            if self._failures:
                self._logger.warning("aiopurgatory.postgres.read_resumed", attempts=self._failures)
                self._failures = 0
        if fetches:
            for key, futures in fetches.items():
                for future in futures:
                    if not future.done():
                        future.set_result(found.get(key))
        if purgatory is None or purgatory.closed:
            return
        # Applied in a context of its own, as the listener applies a notification:
        # what completes is not done in the span or the context variables of
        # whoever asked (the code that entered the triggers, for the first resync).
        completed: int = contextvars.Context().run(
            _apply, purgatory, found, watched if resync else checks
        )
        if resync:
            self.resyncs += 1
        self.completed += completed

    async def read(self, keys: list[Key]) -> dict[Key, Value]:
        """The stored watermarks of ``keys`` (absent keys left out), in one statement."""
        statement = self._statement
        stored = [stored_key(key) for key in keys]

        async def select(connection: Any) -> list[Any]:
            rows: list[Any] = await connection.fetch(statement, stored)
            return rows

        rows = await self.link.call(select)
        self.reads += 1
        by_stored = dict(zip(stored, keys, strict=True))
        found: dict[Key, Value] = {}
        for raw, value in rows:
            key = by_stored.get(bytes(raw))
            if key is None:
                key = key_from_stored(bytes(raw))
            if key is not None:
                found[key] = value
        return found

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
        text = self._source.record_error(exc)
        if not isinstance(exc, CONNECTION_ERRORS):
            self._logger.error("aiopurgatory.postgres.read_failed", error=text, bug=True)
        elif self._failures == 1:
            self._logger.warning(
                "aiopurgatory.postgres.read_failed",
                error=text,
                keys=len(keys) + len(checks) + len(fetches),
                resync=resync,
            )
        for futures in fetches.values():
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
        self._resync = self._resync or resync
        purgatory = self._purgatory
        if purgatory is not None and not purgatory.closed and (keys or checks):
            watched = set(purgatory.keys())
            retry = {key: None for key in keys if key in watched}
            retry.update(self._keys)
            self._keys = retry
            retry = {key: None for key in checks if key in watched}
            retry.update(self._checks)
            self._checks = retry


def _apply(purgatory: Purgatory[Any], found: dict[Key, Value], checks: Iterable[Key]) -> int:
    """Advance ``purgatory`` to ``found`` and check ``checks``; how many operations completed."""
    completed = 0
    advance = purgatory.advance
    for key, value in found.items():
        completed += advance(key, value)
    check = purgatory.check_and_complete
    for key in checks:
        completed += check(key)
    return completed
