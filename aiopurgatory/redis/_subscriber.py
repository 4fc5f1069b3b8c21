"""Subscribing: the partitions of the watched keys, on one connection, kept alive and delivering.

A :class:`Subscriber` owns one connection (not redis-py's PubSub, whose own
retries would reconnect behind our back and skip the resync) and three tasks'
worth of work, run by :meth:`Subscriber.run`:

* **Interest.** The connection listens on the control channel, on this process's
  canary channel, and on the partition channels (:mod:`._partitions`) of the
  keys the purgatory watches, no others: a process that watches nothing
  receives no trigger. A key watched through ``RedisTriggers.watch`` is known at
  once (:meth:`Subscriber.need`); a key watched on the purgatory directly is
  found by a sweep of the purgatory's keys every ``sweep_interval`` seconds.
  Which partitions are wanted, and where each one's subscription stands, is
  :class:`~._interest.Interest`'s (sans-IO: its rules are in its module); the
  subscriber feeds it the events and carries out its actions. A key whose
  partition is not subscribed yet waits for the confirmation of its SUBSCRIBE,
  then is read *and checked* once (:meth:`WatermarkReader.want`): subscribed
  first, read next, so nothing published in between slips through. A partition
  is released (UNSUBSCRIBE) once no watched key has been in it for ``linger``
  seconds, so short-lived keys (one long poll after another on one topic) do
  not subscribe and unsubscribe each time.
* **Liveness.** After a silent health-check interval (nothing delivered; on a
  cluster, nothing delivered by some master), a PING
  goes down the connection and a *canary* (a message to this process's canary
  channel) goes out on the publishing path. If neither has come back after a
  second interval the connection is dead; if the PING came back but the canary
  did not, the connection is *deaf* (connected, not delivering: subscribed on a
  node that no longer gets the publishes, a subscription dropped by the server):
  counted in ``deaf_detected``. Either way the connection is dropped and renewed.
* **Renewal.** Any error ends the connection, never the task: it reconnects with
  exponential backoff and jitter, subscribes to every partition still wanted,
  and asks the reader for a *resync* (every watched key read and checked). A
  partition the server unsubscribes by itself is subscribed again, and resynced
  once that is confirmed.

Each message is applied in a context of its own (a new ``contextvars.Context``),
as a trigger from another process should be: nothing of the context the
instance was entered in (the application's current span, its structlog
context) is seen by what it completes. A message that carries a sampled span's
``traceparent`` (:func:`~._wire.split_sender`) is applied with that span
current, if OpenTelemetry is imported here (else nothing here can record a span).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import sys
from collections.abc import Callable, Iterable
from contextvars import Context
from typing import Any, Final

from redis.exceptions import RedisError

from .._purgatory import Purgatory
from ._connections import Connections
from ._interest import RESYNC, SEND, Action, Dropped, Interest, Read
from ._link import CONNECTION_ERRORS, CONNECTION_LOST
from ._partitions import Partitions
from ._publisher import Sender
from ._reader import WatermarkReader
from ._wire import Key, MalformedMessage, Value, decode, split_sender

__all__ = ["DeafSubscription", "Subscriber"]

#: Channels per SUBSCRIBE/UNSUBSCRIBE command (a long list is sent in parts).
_CHANNELS_PER_COMMAND: Final = 1000


class DeafSubscription(RedisError):
    """The subscription answered PING but did not deliver its own canary."""


class Subscriber:
    """The subscription of one RedisTriggers (see the module documentation).

    Args:
        purgatory: the local purgatory.
        partitions: the channel's partitions.
        new_connection: makes a new, unconnected redis-py asyncio connection.
        reader: the owner's watermark reader (catch-up, resync).
        sender: the owner's sender (it publishes the canaries).
        health_check_interval: seconds of silence before a probe; as long again
            for its answer.
        command_timeout: seconds for connecting and subscribing.
        linger: seconds a partition stays subscribed with no watched key.
        sweep_interval: seconds between sweeps of the purgatory's keys.
        connections: the owner's connections: the wait before the n-th
            reconnection (``backoff``), and the record of failures
            (``record_error`` for a lost connection, ``record_bug`` for anything
            else; each returns the failure's redacted text).
        logger: the owner's bound logger.
        config_channels: the channels that announce this subscriber's
            configuration (:mod:`._agreement`), subscribed with the others.
    """

    def __init__(
        self,
        instance: str,
        purgatory: Purgatory[Any],
        partitions: Partitions,
        new_connection: Callable[[], Any],
        reader: WatermarkReader,
        sender: Sender,
        *,
        health_check_interval: float,
        command_timeout: float,
        linger: float,
        sweep_interval: float,
        connections: Connections,
        logger: Any,
        config_channels: list[bytes] | None = None,
    ) -> None:
        self._id = instance
        self._config_channels = config_channels or []
        self._purgatory = purgatory
        self._partitions = partitions
        self._new_connection = new_connection
        self._reader = reader
        self._sender = sender
        self._health_check_interval = health_check_interval
        self._command_timeout = command_timeout
        self._linger = linger
        self._sweep_interval = sweep_interval
        self._connections = connections
        self._logger = logger
        self._advance = purgatory.advance
        self._check = purgatory.check_and_complete

        self._interest = Interest(partitions.of, linger=linger)
        self._changed = asyncio.Event()  # commands wait (the keeper sends them)

        self.connection: Any = None
        self.connected = False
        self.reconnects = 0
        self.received = 0
        self.echoes = 0
        self.malformed = 0
        self.applied = 0
        self.completed = 0
        self.deaf_detected = 0
        self._delivered = 0  # messages read on the connection (the watchdog's count)
        self._pongs = 0
        self._canary: bytes | None = None  # the canary out, not yet back
        self._failure: BaseException | None = None  # why the keeper ended the connection

    @property
    def subscribed(self) -> int:
        """Partition channels subscribed now (confirmed by Redis)."""
        return self._interest.subscribed

    def covers(self, keys: Iterable[Key]) -> bool:
        """The partitions of ``keys`` are all subscribed now (for benchmarks and tests)."""
        return self._interest.covers(keys)

    # -- interest (any task of the loop) -----------------------------------------------

    def need(self, keys: Iterable[Key]) -> None:
        """``keys`` were just watched (through ``RedisTriggers.watch``): catch them up.

        Keys whose partition is subscribed are read at once; the others after
        their partition's SUBSCRIBE is confirmed (then also checked once).
        """
        ready, send = self._interest.need(keys, asyncio.get_running_loop().time())
        if ready:
            self._reader.want(ready)
        if send:
            self._changed.set()

    def sweep(self) -> None:
        """Subscribe the partitions of keys watched directly; release the idle ones
        (:meth:`Interest.sweep <._interest.Interest.sweep>`)."""
        purgatory = self._purgatory
        if purgatory.closed:
            return
        now = asyncio.get_running_loop().time()
        actions = self._interest.sweep(set(purgatory.keys()), now)
        if actions:
            self._act(actions)

    def _act(self, actions: Iterable[Action]) -> None:
        """Carry out the interest's actions."""
        for action in actions:
            if action is SEND:
                self._changed.set()
            elif action is RESYNC:
                self._reader.request_resync()
            elif isinstance(action, Read):
                self._reader.want(action.keys, check=action.check)
            elif isinstance(action, Dropped):  # subscribed again, resynced once confirmed
                self._logger.warning(
                    "aiopurgatory.redis.unsubscribed_by_server", partition=action.partition
                )

    # -- the task ------------------------------------------------------------------------

    async def run(self, connection: Any) -> None:
        """Listen until cancelled: on ``connection`` (from :meth:`subscribe`), then on
        the connections :meth:`subscribe` makes after each loss (looked up on the
        instance each time: tests replace it to hold re-subscriptions)."""
        attempt = 0
        logged_failure: str | None = None
        sweeping = asyncio.create_task(
            self._sweep_loop(), name=f"aiopurgatory-redis-sweep-{self._id}"
        )
        try:
            while True:
                if connection is None:
                    try:
                        with CONNECTION_LOST:
                            connection = await self.subscribe()
                    except CONNECTION_ERRORS as exc:
                        attempt += 1
                        text = self._connections.record_error(exc)
                        # Once per distinct cause (refused while Redis restarts, then
                        # a wrong password...): an outage is a few lines, not one per try.
                        log = self._logger.debug if text == logged_failure else self._logger.warning
                        logged_failure = text
                        log("aiopurgatory.redis.reconnect_failed", error=text, attempt=attempt)
                        await asyncio.sleep(self._connections.backoff(attempt))
                        continue
                    self.reconnects += 1
                    self._logger.warning("aiopurgatory.redis.reconnected", attempts=attempt + 1)
                    attempt = 0
                    logged_failure = None
                try:
                    with CONNECTION_LOST:
                        await self._listen(connection)
                except CONNECTION_ERRORS as exc:
                    text = self._connections.record_error(exc)
                    self._logger.warning("aiopurgatory.redis.disconnected", error=text)
                except Exception as exc:  # a bug: log it, reconnect, never end silently
                    text = self._connections.record_bug(exc)
                    self._logger.error("aiopurgatory.redis.subscriber_failed", error=text)
                self.connected = False
                self._interest.disconnected()
                await connection.disconnect(nowait=True)
                connection = self.connection = None
                # Even the first attempt waits a little, so a restarted Redis is
                # not hit by every process at once.
                attempt = 1
                await asyncio.sleep(self._connections.backoff(attempt))
        finally:
            sweeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeping

    async def subscribe(self) -> Any:
        """A new connection subscribed to every wanted partition (confirmed), resync asked.

        Bounded by ``command_timeout``, the connect included.
        """
        connection = self._new_connection()
        partitions = self._partitions
        wanted = self._interest.reconnecting()
        channels = [partitions.control, partitions.canary]
        channels += self._config_channels  # the configuration announced (_agreement)
        channels += [partitions.channels[n] for n in wanted]
        try:
            try:
                async with asyncio.timeout(self._command_timeout):
                    await connection.connect()
                    for start in range(0, len(channels), _CHANNELS_PER_COMMAND):
                        await connection.send_command(
                            "SUBSCRIBE",
                            *channels[start : start + _CHANNELS_PER_COMMAND],
                            check_health=False,
                        )
                    confirmed = 0
                    while confirmed < len(channels):
                        reply = await connection.read_response(timeout=math.inf)
                        kind = reply[0] if isinstance(reply, list) and len(reply) == 3 else None
                        if kind == b"subscribe":
                            confirmed += 1
                        elif kind == b"message":
                            # Published after an earlier part of the SUBSCRIBE: applied.
                            self._deliver(reply[1], reply[2])
                        else:
                            raise RedisError(f"unexpected reply to SUBSCRIBE: {reply!r:.80}")
            except TimeoutError:
                raise TimeoutError(
                    f"no reply to SUBSCRIBE within {self._command_timeout:g} s"
                ) from None
        except BaseException:
            self._interest.disconnected()
            await connection.disconnect(nowait=True)
            raise
        self.connection = connection
        self.connected = True
        # Subscribed first, read next (a resync): nothing published in between is missed.
        self._act(self._interest.connected())
        return connection

    async def drop(self) -> None:
        """Close the connection (at close)."""
        connection, self.connection = self.connection, None
        self.connected = False
        self._interest.disconnected()
        if connection is not None:
            await connection.disconnect(nowait=True)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_interval)
            try:
                self.sweep()
            except Exception as exc:  # a bug: loud, and the sweeps go on
                text = self._connections.record_bug(exc)
                self._logger.error("aiopurgatory.redis.sweep_failed", error=text)

    async def _listen(self, connection: Any) -> None:
        """Apply messages until the connection fails (this only returns by raising).

        The read has no timeout (a timeout per read would cost more than the
        rest of a message's handling); the keeper task looks at the count of
        messages delivered instead, once per health-check interval.
        """
        read = connection.read_response
        deliver = self._deliver
        partition_of_channel = self._partitions.partition_of_channel
        interest = self._interest
        self._failure = None
        keeper = asyncio.create_task(self._keep(connection))
        keeper.add_done_callback(self._keeper_ended)
        try:
            while True:
                response = await read(timeout=math.inf)
                if type(response) is list and len(response) == 3:
                    kind = response[0]
                    if kind == b"message":
                        deliver(response[1], response[2])
                        continue
                    if kind == b"subscribe":
                        n = partition_of_channel(response[1])
                        if n is not None:
                            self._act(interest.subscribe_answered(n))
                        continue
                    if kind == b"unsubscribe":
                        n = partition_of_channel(response[1])
                        if n is not None:
                            self._act(interest.unsubscribe_answered(n))
                        continue
                if type(response) is list and response and response[0] == b"pong":
                    self._pongs += 1
        except asyncio.CancelledError:
            raise  # closing: never turned into a connection failure (and retried)
        except BaseException:
            failure = self._failure
            if failure is not None:
                raise failure from None
            raise
        finally:
            keeper.cancel()

    async def _keep(self, connection: Any) -> None:
        """Send the (un)subscriptions asked for, and probe the connection when silent."""
        interval = self._health_check_interval
        loop = asyncio.get_running_loop()
        changed = self._changed
        # What was delivered, per server: one count on one server; on a cluster
        # one per master, each of which must deliver (a master that stopped
        # delivering must not hide behind the others' traffic).
        activity: Callable[[], tuple[int, ...]] = getattr(
            connection, "activity", lambda: (self._delivered,)
        )
        seen = activity()
        next_tick = loop.time() + interval
        probe: int | None = None  # the PONG count when the probe went out
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_tick - loop.time())):
                    await changed.wait()
            if changed.is_set():
                changed.clear()
                # A failed send: the reader sees the broken connection too.
                with contextlib.suppress(*CONNECTION_ERRORS), CONNECTION_LOST:
                    await self._send_changes(connection)
            if loop.time() < next_tick:
                continue
            next_tick = loop.time() + interval
            now = activity()
            if all(a != b for a, b in zip(now, seen, strict=True)):
                seen = now
                probe = None
            elif probe is None:
                probe = self._pongs
                self._canary = f"{self._id}:{secrets.token_hex(4)}".encode("ascii")
                # A cluster's subscription has a canary channel per master.
                self._sender.send_canary(self._canary, getattr(connection, "canary_channels", None))
                with contextlib.suppress(*CONNECTION_ERRORS), CONNECTION_LOST:
                    await connection.send_command("PING", check_health=False)
            elif self._pongs == probe:
                self._failure = TimeoutError(
                    f"no reply to a health-check PING within {interval:g} s"
                )
                # The reader, blocked in its read, fails on the closed connection.
                await connection.disconnect(nowait=True)
                return
            else:
                self.deaf_detected += 1
                self._failure = DeafSubscription(
                    f"the subscription answered PING but its canary did not come back "
                    f"within {interval:g} s"
                )
                self._logger.warning("aiopurgatory.redis.deaf_subscription", seconds=interval)
                await connection.disconnect(nowait=True)
                return

    async def _send_changes(self, connection: Any) -> None:
        partitions = self._partitions
        leave, join = self._interest.commands()
        for command, group in (("UNSUBSCRIBE", leave), ("SUBSCRIBE", join)):
            channels = [partitions.channels[n] for n in group]
            for start in range(0, len(channels), _CHANNELS_PER_COMMAND):
                part = channels[start : start + _CHANNELS_PER_COMMAND]
                await connection.send_command(command, *part, check_health=False)

    def _keeper_ended(self, task: asyncio.Task[None]) -> None:
        # Its failures are the connection's (the reader sees them); a bug is logged.
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            text = self._connections.record_bug(exc)
            self._logger.error("aiopurgatory.redis.watchdog_failed", error=text)

    # -- messages ------------------------------------------------------------------------

    def _deliver(self, channel: bytes, data: bytes) -> None:
        self._delivered += 1
        if channel == self._partitions.canary:
            if data == self._canary:
                self._canary = None
        else:
            self._on_message(data)

    def _on_message(self, data: bytes) -> None:
        try:
            sender, checks, advances = decode(data)
        except MalformedMessage as exc:
            self.malformed += 1
            if self.malformed == 1:
                self._logger.warning("aiopurgatory.redis.malformed_message", error=str(exc))
            return
        traceparent = None
        if " " in sender:  # made in a sampled span: "<id> <traceparent>"
            sender, traceparent = split_sender(sender)
        if sender == self._id:
            self.echoes += 1
            return
        self.received += 1
        if self._purgatory.closed:
            return
        # A context of its own: not the one the instance was entered in.
        if traceparent is not None and sys.modules.get("opentelemetry.trace") is not None:
            Context().run(self._apply_traced, traceparent, checks, advances)
        else:
            Context().run(self._apply, checks, advances)

    def _apply_traced(
        self, traceparent: str, checks: list[Key], advances: list[tuple[Key, Value]]
    ) -> None:
        from ..tracing import _triggered_from  # OpenTelemetry is imported already

        with _triggered_from(traceparent):
            self._apply(checks, advances)

    def _apply(self, checks: list[Key], advances: list[tuple[Key, Value]]) -> None:
        completed = 0
        try:
            advance = self._advance
            for key, value in advances:
                completed += advance(key, value)
            check = self._check
            for key in checks:
                completed += check(key)
        except Exception as exc:  # a bug (callbacks' failures are contained by the purgatory)
            text = self._connections.record_bug(exc)
            self._logger.error("aiopurgatory.redis.apply_failed", error=text)
        self.applied += len(advances) + len(checks)
        self.completed += completed
