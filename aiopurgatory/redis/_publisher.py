"""Publishing: the triggers of one loop iteration leave as one round trip, per partition a message.

A :class:`Sender` gathers triggers in its *pending batch* (:class:`~._wire.Batch`);
its task wakes on the next loop iteration and sends the whole batch, each
partition's (:mod:`._partitions`) triggers as one message on that partition's
channel (or several, past :data:`MAX_MESSAGE_TRIGGERS`), all in one round trip.

* On one server (or a Sentinel-managed primary), the whole batch is one call of
  :data:`BATCH_SCRIPT` (:func:`batch_command`): the script raises each advanced
  key's stored watermark (atomic max, TTL refreshed), groups the triggers by
  partition and publishes each partition's message, built from each key's JSON
  text sent with it. The publisher sends each trigger's arguments once, as it
  would for a single message, and makes no message itself: grouping and
  fan-out cost Redis a few string operations instead of costing the publisher
  a command per partition.
* On a cluster, a script call cannot span slots and each partition is a slot
  of its own: a partition's part goes through :data:`ADVANCE_SCRIPT` (the same
  atomic max, then one publish) or is a plain ``SPUBLISH`` if it holds only
  checks (:func:`publish_commands`), the commands of each master pipelined.

Triggers made where a sampled OpenTelemetry span is current gather apart, one
batch per W3C ``traceparent`` (:attr:`Sender.traced`): each leaves as messages
of its own whose sender field is ``"<instance id> <traceparent>"`` (see
:mod:`._wire`), in the same round trip as the others.

Either way a key's watermark is stored before the message that carries it is
published, in the same atomic script. A batch that fails to send is kept
(merged with what came after: triggers are idempotent, so sending one twice or
late is harmless) and retried with backoff.

The sender also carries the subscriber's canaries (:meth:`Sender.send_canary`):
a canary published on the path every trigger takes proves, when it comes back,
that the subscription delivers what is published.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable
from typing import Any, Final
from zlib import crc32

from redis.exceptions import NoScriptError

from ._connections import Connections
from ._link import CONNECTION_ERRORS, CONNECTION_LOST, CommandLink
from ._partitions import Partitions
from ._wire import (
    VERSION,
    Batch,
    Key,
    PublishMode,
    encode,
    redis_key,
    sender_field,
    stored,
    value_text,
)

__all__ = [
    "ADVANCE_SCRIPT",
    "BATCH_SCRIPT",
    "MAX_MESSAGE_TRIGGERS",
    "MAX_SCRIPT_TRIGGERS",
    "Sender",
    "batch_command",
    "publish_commands",
]

#: A batch larger than this leaves as several messages, so that no message grows
#: past what a slow subscriber's output buffer in Redis tolerates.
MAX_MESSAGE_TRIGGERS: Final = 1024

# KEYS: watermark keys (one slot). ARGV[1]: TTL in ms, ARGV[2]: the publish
# command (PUBLISH, or SPUBLISH on a cluster), ARGV[3]: channel, ARGV[4]: message,
# ARGV[4 + i]: the value for KEYS[i] (decimal text). Raises each key to at least
# its value and refreshes its TTL, then publishes: one round trip, atomic.
# Both scripts' atomic max: a watermark key raised to at least ``new`` (decimal
# text), its TTL (ms) refreshed either way.
_RAISE: Final = """
local function raise(key, new, ttl)
  local current = tonumber(redis.call('GET', key) or '')
  if current == nil or current < tonumber(new) then
    redis.call('SET', key, new, 'PX', ttl)
  else
    redis.call('PEXPIRE', key, ttl)
  end
end
"""
ADVANCE_SCRIPT: Final = (
    _RAISE
    + """
local ttl = ARGV[1]
for i, key in ipairs(KEYS) do
  raise(key, ARGV[i + 4], ttl)
end
return redis.call(ARGV[2], ARGV[3], ARGV[4])
"""
)
ADVANCE_SHA: Final = hashlib.sha1(ADVANCE_SCRIPT.encode("ascii")).hexdigest()

#: A batch larger than this leaves as several calls of :data:`BATCH_SCRIPT`
#: (pipelined), so that no call keeps Redis busy for long.
MAX_SCRIPT_TRIGGERS: Final = 4096

# One server: a whole batch in one call. KEYS: the advanced keys' watermark
# keys. ARGV[1]: TTL in ms, ARGV[2]: the publish command, ARGV[3]: the message's
# head ('[1,"<sender>",'), ARGV[4]: the length of a watermark key's partition
# stem (its prefix less ':wm:'; the partition's channel is the stem and ':t'),
# ARGV[5]: most triggers per message, ARGV[6]: c, the number of checks,
# ARGV[7 .. 6 + 2c]: per check its partition's channel and the key's JSON,
# ARGV[6 + 2c + i]: for KEYS[i], the key's JSON, a comma and its value (decimal
# text, which is JSON too; a value has no comma, so the last comma splits).
# Each key's watermark is raised to at least its value (TTL refreshed) before
# any message holding it is published; a message per partition (and per
# ARGV[5] triggers), in the format of _wire.encode. Returns the messages sent.
BATCH_SCRIPT: Final = (
    _RAISE
    + """
local ttl, publish, head = ARGV[1], ARGV[2], ARGV[3]
local stem, most, checks = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local parts, order, sent = {}, {}, 0
local function send(channel, part)
  redis.call(publish, channel, head .. '[' .. table.concat(part[1], ',') .. '],['
    .. table.concat(part[2], ',') .. ']]')
  sent = sent + 1
end
local function add(channel, which, item)
  local part = parts[channel]
  if part == nil then
    part = {{}, {}, 0}
    parts[channel] = part
    order[#order + 1] = channel
  end
  local list = part[which]
  list[#list + 1] = item
  part[3] = part[3] + 1
  if part[3] == most then
    send(channel, part)
    parts[channel] = {{}, {}, 0}
  end
end
for i = 1, checks do
  add(ARGV[5 + 2 * i], 1, ARGV[6 + 2 * i])
end
local base = 6 + 2 * checks
for i, key in ipairs(KEYS) do
  local item = ARGV[base + i]
  raise(key, string.match(item, ',([^,]*)$'), ttl)
  add(string.sub(key, 1, stem) .. ':t', 2, item)
end
for _, channel in ipairs(order) do
  local part = parts[channel]
  if part[3] > 0 then
    send(channel, part)
  end
end
return sent
"""
)
BATCH_SHA: Final = hashlib.sha1(BATCH_SCRIPT.encode("ascii")).hexdigest()
_SCRIPTS: Final = {ADVANCE_SHA: ADVANCE_SCRIPT, BATCH_SHA: BATCH_SCRIPT}

_json_text = json.encoder.encode_basestring_ascii


def key_json(key: Key) -> str:
    """``key`` as JSON text, as :func:`~._wire.encode` writes it in a message."""
    if type(key) is str:
        text: str = _json_text(key)
        return text
    if type(key) is int:
        return str(key)
    if isinstance(key, bytes):
        return '{"b":' + _json_text(key.decode("latin-1")) + "}"
    # str and int subclasses (StrEnum, IntEnum): their plain value, as encode().
    return _json_text(str.__str__(key)) if isinstance(key, str) else str(int(key))


def batch_command(
    sender: str, batch: Batch, partitions: Partitions, ttl_ms: bytes, publish: PublishMode
) -> tuple[Any, ...]:
    """The one :data:`BATCH_SCRIPT` call that sends ``batch`` (at most
    :data:`MAX_SCRIPT_TRIGGERS` triggers) on one server (``publish`` is plain there)."""
    head = f"[{VERSION}," + _json_text(sender) + ","
    stem = len(partitions.prefix(0)) - 4  # the prefix less b":wm:"
    args: list[Any] = []
    channel = partitions.channel
    for key in batch.checks:
        args.append(channel(key))
        args.append(key_json(key))
    keys = []
    items = []
    prefixes = partitions.prefixes
    count = partitions.count
    for key, value in batch.advances.items():
        # The key's bytes once: its partition's hash and its watermark key's tail.
        tail = redis_key(b"", key)
        keys.append(prefixes[crc32(tail) % count] + tail)
        items.append(key_json(key) + "," + value_text(value))
    return (
        "EVALSHA",
        BATCH_SHA,
        len(keys),
        *keys,
        ttl_ms,
        publish.value,
        head,
        stem,
        MAX_MESSAGE_TRIGGERS,
        len(batch.checks),
        *args,
        *items,
    )


def publish_commands(
    sender: str, batch: Batch, partitions: Partitions, ttl_ms: bytes, publish: PublishMode
) -> list[tuple[Any, ...]]:
    """The commands that send ``batch``: per partition (and per
    :data:`MAX_MESSAGE_TRIGGERS` triggers) one PUBLISH, or one EVALSHA of
    :data:`ADVANCE_SCRIPT` when it holds advances."""
    by_partition: dict[int, Batch] = {}
    of = partitions.of
    for key in batch.checks:
        n = of(key)
        part = by_partition.get(n)
        if part is None:
            part = by_partition[n] = Batch()
        part.checks[key] = None
    for key, value in batch.advances.items():
        n = of(key)
        part = by_partition.get(n)
        if part is None:
            part = by_partition[n] = Batch()
        part.advances[key] = value
    commands: list[tuple[Any, ...]] = []
    command = publish.value
    for n, whole in by_partition.items():
        channel = partitions.channels[n]
        prefix = partitions.prefix(n)
        for part in whole.split(MAX_MESSAGE_TRIGGERS):
            message = encode(sender, part)
            if part.advances:
                keys = [redis_key(prefix, key) for key in part.advances]
                commands.append(
                    (
                        "EVALSHA",
                        ADVANCE_SHA,
                        len(keys),
                        *keys,
                        ttl_ms,
                        command,
                        channel,
                        message,
                        *map(stored, part.advances.values()),
                    )
                )
            else:
                commands.append((command, channel, message))
    return commands


class Sender:
    """The pending batch and the task that sends it, on a :class:`~._link.Link` of its own.

    Args:
        instance: the owner's instance id (carried by every message).
        link: the connection it sends on (no one else uses it): a
            :class:`~._link.Link`, or on a cluster a :class:`~._cluster.ClusterLink`.
        partitions: the channel's partitions.
        ttl_ms: stored watermarks' TTL, milliseconds as decimal bytes.
        publish: plain, or sharded on a cluster.
        connections: the owner's connections: the wait before the n-th retry
            (``backoff``), and the record of failures (``record_error`` for a
            lost connection, ``record_bug`` for anything else; each returns
            the failure's redacted text).
        logger: the owner's bound logger.
    """

    def __init__(
        self,
        instance: str,
        link: CommandLink,
        partitions: Partitions,
        *,
        ttl_ms: bytes,
        publish: PublishMode,
        connections: Connections,
        logger: Any,
    ) -> None:
        self._id = instance
        self.link = link
        self._partitions = partitions
        self._ttl_ms = ttl_ms
        self._publish = publish
        self._connections = connections
        self._logger = logger
        self.pending = Batch()
        # Triggers made in sampled spans, a batch per traceparent (empty while
        # nothing is traced): a message carries one trace context at most.
        self.traced: dict[str, Batch] = {}
        self._pending_waiters: list[asyncio.Future[None]] = []
        self._inflight_waiters: list[asyncio.Future[None]] = []
        self.inflight = 0
        self._canaries: list[tuple[bytes, bytes]] = []  # (channel, message) to publish
        # Commands of others' (the configuration check's), with their replies' futures.
        self._probes: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self.wakeup = asyncio.Event()
        self.published = 0
        self.publish_errors = 0
        # The last send succeeded (a publisher only shows it as ``connected``);
        # set by the owner once its first command succeeded.
        self.connected = False

    # -- requests (any task of the loop) ------------------------------------------------

    def send_canary(self, message: bytes, channels: Iterable[bytes] | None = None) -> None:
        """Publish ``message`` on this process's canary channel (on a cluster, on
        ``channels``: one per master) with the next round trip."""
        for channel in [self._partitions.canary] if channels is None else channels:
            self._canaries.append((channel, message))
        self.wakeup.set()

    def probe(self, command: tuple[Any, ...]) -> asyncio.Future[Any]:
        """Send ``command`` with the next round trip; a future of its reply (an
        error reply or a lost connection set as its exception)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._probes.append((command, future))
        self.wakeup.set()
        return future

    def traced_batch(self, traceparent: str | None) -> Batch:
        """The pending batch of the triggers made in the span of ``traceparent``
        (the plain one for None)."""
        if traceparent is None:
            return self.pending
        batch = self.traced.get(traceparent)
        if batch is None:
            batch = self.traced[traceparent] = Batch()
        return batch

    def wait_sent(self) -> asyncio.Future[None]:
        """A future set when every trigger gathered so far has been sent."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        pending = self.pending or self.traced
        (self._pending_waiters if pending else self._inflight_waiters).append(waiter)
        return waiter

    def fail_waiters(self, exc: BaseException) -> None:
        """Fail every ``wait_sent`` future not yet set (at close)."""
        for waiter in (*self._inflight_waiters, *self._pending_waiters):
            if not waiter.done():
                waiter.set_exception(exc)
        self._inflight_waiters = []
        self._pending_waiters = []

    def __len__(self) -> int:
        """Triggers gathered and not yet sent (distinct keys)."""
        traced = sum(map(len, self.traced.values())) if self.traced else 0
        return len(self.pending) + traced + self.inflight

    # -- the task ------------------------------------------------------------------------

    async def run(self) -> None:
        """Send batches until cancelled; failures are retried, never raised."""
        wakeup = self.wakeup
        failures = 0
        while True:
            await wakeup.wait()
            wakeup.clear()
            if self._canaries:
                canaries, self._canaries = self._canaries, []
                try:
                    with CONNECTION_LOST:
                        await self.link.execute(
                            *[(self._publish.value, channel, m) for channel, m in canaries]
                        )
                except CONNECTION_ERRORS:
                    pass  # a canary that is not sent is not received: the watchdog sees it
            if self._probes:
                probes, self._probes = self._probes, []
                await self._run_probes(probes)
            while self.pending or self.traced:
                batch, self.pending = self.pending, Batch()
                traced, self.traced = self.traced, {}
                waiters, self._pending_waiters = self._pending_waiters, []
                self.inflight = count = len(batch) + sum(map(len, traced.values()))
                self._inflight_waiters = waiters
                try:
                    with CONNECTION_LOST:
                        await self._send(batch, traced)
                except CONNECTION_ERRORS as exc:
                    failures += 1
                    self.publish_errors += 1
                    text = self._connections.record_error(exc)
                    self.connected = False
                    if failures == 1:
                        self._logger.warning(
                            "aiopurgatory.redis.publish_failed", error=text, triggers=count
                        )
                    # Keep the batches, ahead of what came since; retry after a backoff.
                    batch.merge(self.pending)
                    self.pending = batch
                    for traceparent, newer in self.traced.items():
                        older = traced.setdefault(traceparent, newer)
                        if older is not newer:
                            older.merge(newer)
                    self.traced = traced
                    self._pending_waiters = self._inflight_waiters + self._pending_waiters
                    self.inflight = 0
                    self._inflight_waiters = []
                    await asyncio.sleep(self._connections.backoff(failures))
                    continue
                except Exception as exc:  # a bug: never end the sender silently
                    self.publish_errors += 1
                    self._logger.error(
                        "aiopurgatory.redis.send_failed",
                        error=self._connections.record_bug(exc),
                        triggers=count,
                    )
                if failures:
                    self._logger.warning("aiopurgatory.redis.publish_resumed", attempts=failures)
                    failures = 0
                self.connected = True
                self.inflight = 0
                self._inflight_waiters = []
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)

    async def _run_probes(self, probes: list[tuple[tuple[Any, ...], asyncio.Future[Any]]]) -> None:
        replies: list[Any]
        try:
            with CONNECTION_LOST:
                replies = await self.link.execute(*[command for command, _ in probes])
        except CONNECTION_ERRORS as exc:
            replies = [exc] * len(probes)
        for (_, future), reply in zip(probes, replies, strict=True):
            if future.done():
                continue
            if isinstance(reply, BaseException):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def _commands(self, batch: Batch, traced: dict[str, Batch]) -> list[tuple[Any, ...]]:
        groups = [(self._id, batch)] if batch else []
        if traced:
            groups += [(sender_field(self._id, tp), part) for tp, part in traced.items()]
        commands: list[tuple[Any, ...]] = []
        for sender, whole in groups:
            if self._publish is PublishMode.PLAIN:
                commands += [
                    batch_command(sender, part, self._partitions, self._ttl_ms, self._publish)
                    for part in whole.split(MAX_SCRIPT_TRIGGERS)
                ]
            else:
                commands += publish_commands(
                    sender, whole, self._partitions, self._ttl_ms, self._publish
                )
        return commands

    async def _send(self, batch: Batch, traced: dict[str, Batch]) -> None:
        commands = self._commands(batch, traced)
        replies = await self.link.execute(*commands)
        missing = [
            command
            for command, reply in zip(commands, replies, strict=True)
            if isinstance(reply, NoScriptError)
        ]
        if missing:
            # Redis does not have the script yet (new, restarted, SCRIPT FLUSH):
            # load it and send those again.
            for sha in dict.fromkeys(command[1] for command in missing):
                await self.link.execute(("SCRIPT", "LOAD", _SCRIPTS[sha]))
            again = iter(await self.link.execute(*missing))
            replies = [
                next(again) if isinstance(reply, NoScriptError) else reply for reply in replies
            ]
        sent = 0
        for command, reply in zip(commands, replies, strict=True):
            if isinstance(reply, Exception):
                # An error reply (READONLY from a primary demoted by a failover,
                # LOADING from one restarting...): the next attempt takes a new
                # connection, which a Sentinel-managed pool points at the
                # current primary.
                await self.link.drop()
                raise reply
            # A batch script says how many messages it published; others publish one.
            sent += reply if command[1] == BATCH_SHA else 1
        self.published += sent
