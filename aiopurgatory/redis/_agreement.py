"""Loud misconfiguration: publishers and subscribers of one channel that disagree, found and named.

A publisher and its subscribers must agree on the channel, the Redis database
(pub/sub ignores it, the stored watermarks do not), the number of partitions
and the wire format. Each of these mistakes is silent by itself: a publisher on
another channel wakes nobody; one on another database wakes the waits parked
before its advance (pub/sub reaches them) but not those made after it (their
catch-up read looks in the other database); another ``partitions`` publishes on
channels nobody listens to.

So every subscriber *announces* its configuration by subscribing, besides its
partitions, to a configuration channel (:func:`config_channel`,
``<channel>:cfg:v<wire version>:p<partitions>:d<database>``; nothing is ever
published there), and every publisher (a ``RedisTriggers``, whose subscriber
checks too, and a ``SyncPublisher``) checks every ``config_check_interval``
seconds with one ``PUBSUB NUMSUB`` of two channels: the channel's control
channel (every subscriber of the channel listens to it, whatever its
configuration) and its own configuration channel (the subscribers that agree
with it). Two numbers, O(1) for Redis. Only when they differ (and differ
otherwise than at the last scan), or when nobody subscribes to the channel on
two checks in a row (then about once a minute), a ``PUBSUB CHANNELS`` with a
pattern lists the configuration channels to say what differs (Redis walks its
channels for that). Each mismatch is reported once.

:class:`Agreement` is the sans-IO part: it says which command to send next and
turns the replies into findings; the publishers carry the commands out (the
async sender's connection, or a short-lived thread of the sync publisher). A
finding is logged once per kind (``aiopurgatory.redis.misconfigured``, warning,
with ``kind``: ``channel``, ``database``, ``partitions`` or ``version``) and
counted (``mismatches``, ``last_mismatch`` in ``statistics()``). A Redis whose
ACL refuses ``PUBSUB`` ends the checks (logged once at info level).

On a Redis Cluster plain pub/sub is counted per node, so the announcing
channels are shard channels of one slot (:func:`announced`: the channel's name
as a hash tag): ``{<channel>}:cfg`` counts every subscriber of the channel and
``{<channel>}:cfg:v..:p..:d0`` those that agree, both with ``PUBSUB
SHARDNUMSUB`` on that slot's master. An older version's subscriber is not
counted there, and the look for other channels covers one node.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, NamedTuple

from redis.exceptions import ResponseError

from ._link import CONNECTION_ERRORS
from ._wire import VERSION

__all__ = [
    "DEFAULT_CHECK_INTERVAL",
    "Agreement",
    "Config",
    "announced",
    "check_once",
    "cluster_prefix",
    "config_channel",
    "keep_checking",
]

#: Seconds between two checks of the subscribers' configuration.
DEFAULT_CHECK_INTERVAL: Final = 5.0

_CONFIG: Final = re.compile(rb"^(.*):cfg:v(\d+):p(\d+):d(\d+)$", re.S)


class Config(NamedTuple):
    """What a publisher and its subscribers must agree on (besides the channel)."""

    version: int
    partitions: int
    db: int


def config_channel(control: bytes, config: Config) -> bytes:
    """The channel a subscriber of ``control`` with ``config`` announces itself on."""
    return control + b":cfg:v%d:p%d:d%d" % config


def cluster_prefix(control: bytes) -> bytes:
    """On a cluster, the prefix of the announcing channels: the channel's name as a
    hash tag, so that they are shard channels of one slot (one node counts them)."""
    return b"{" + control + b"}"


def announced(control: bytes, config: Config, *, cluster: bool) -> list[bytes]:
    """The channels a subscriber subscribes to, besides its partitions, to announce
    ``config``: its configuration channel; on a cluster also the channel every
    subscriber of the channel subscribes to (the control channel is a plain,
    node-local channel there)."""
    if not cluster:
        return [config_channel(control, config)]
    prefix = cluster_prefix(control)
    return [prefix + b":cfg", config_channel(prefix, config)]


def _glob_escape(name: bytes) -> bytes:
    return re.sub(rb"([*?\[\]\\])", rb"\\\1", name)


def _unbraced(name: bytes) -> bytes:
    """A channel's name from its announcing prefix (a cluster's is a hash tag)."""
    return name[1:-1] if name.startswith(b"{") and name.endswith(b"}") else name


def _counts(reply: Any) -> list[int]:
    """The counts of a ``PUBSUB NUMSUB`` reply (flat, or redis-py's pairs)."""
    if reply and isinstance(reply[0], list | tuple):
        return [int(count) for _, count in reply]
    return [int(count) for count in reply[1::2]]


class Agreement:
    """The check of one publisher's configuration against its channel's subscribers.

    Use: send :meth:`probe`; feed its reply to :meth:`counted`, which returns a
    command to send (or None); feed that one's reply to :meth:`scanned`, which
    returns the new findings (each ``(kind, message)``) to log.

    Args:
        channel: the channel's name (as the user gave it).
        control: the channel's control channel.
        cluster: the subscribers are on a Redis Cluster (sharded pub/sub: the
            counts and the scans go to the node of one slot).
        mine: this publisher's configuration.
        role: ``"publisher"`` or ``"subscriber"``, for the messages.
    """

    __slots__ = (
        "_channel",
        "_cluster",
        "_control",
        "_everyone",
        "_mine",
        "_others",
        "_own",
        "_role",
        "_scanned",
        "_scanning",
        "_silent",
        "last_mismatch",
        "mismatches",
        "reported",
    )

    def __init__(
        self, channel: str, control: bytes, mine: Config, *, role: str, cluster: bool = False
    ) -> None:
        self._channel = channel
        self._cluster = cluster
        # The announcing channels' prefix, and the channel counting everyone.
        self._control = cluster_prefix(control) if cluster else control
        self._everyone = self._control + b":cfg" if cluster else control
        self._mine = mine
        self._own = config_channel(self._control, mine)
        self._role = role
        self._silent = 0  # checks in a row that found nobody on the channel
        self._others = 0  # subscribers that do not agree, at the last probe
        self._scanning = ""  # what the scan asked for looks for
        self._scanned: tuple[int, int] | None = None  # the counts the last scan explained
        self.reported: set[str] = set()
        self.mismatches = 0
        self.last_mismatch: str | None = None

    def probe(self) -> tuple[Any, ...]:
        """The check's first command: the channel's subscribers, and those that agree."""
        if self._cluster:
            return ("PUBSUB", "SHARDNUMSUB", self._everyone, self._own)
        return ("PUBSUB", "NUMSUB", self._everyone, self._own)

    def counted(self, reply: Any) -> tuple[Any, ...] | None:
        """The probe's reply: the scan to send next, or None (all agree, or reported)."""
        everyone, agreeing = _counts(reply)
        # A scan walks every channel of the server: made when the counts say
        # something is wrong and they changed since the last scan (nobody on the
        # channel: on the second check in a row, then once a minute or so).
        if everyone == 0:
            self._silent += 1
            if (
                self._silent >= 2
                and (self._silent - 2) % 12 == 0
                and "channel" not in self.reported
            ):
                self._scanning = "channel"
                # On a cluster, one node's shard channels only: a partial look.
                return ("PUBSUB", "SHARDCHANNELS" if self._cluster else "CHANNELS", b"*:cfg:v*")
            return None
        self._silent = 0
        self._others = everyone - agreeing
        if (
            agreeing < everyone
            and (everyone, agreeing) != self._scanned
            and not {"database", "partitions", "version"} <= self.reported
        ):
            self._scanned = (everyone, agreeing)
            self._scanning = "mine"
            if self._cluster:
                return ("PUBSUB", "SHARDCHANNELS", _glob_escape(self._control) + b":cfg:*")
            return ("PUBSUB", "CHANNELS", _glob_escape(self._control) + b":cfg:*")
        return None

    def scanned(self, reply: Sequence[bytes | str]) -> list[tuple[str, str]]:
        """The scan's reply (configuration channels): the new findings."""
        # A client passed in may decode replies: names back to bytes.
        names = [n.encode("utf-8", "surrogatepass") if isinstance(n, str) else n for n in reply]
        found: list[tuple[str, str]] = []
        if self._scanning == "channel":
            others = sorted(
                {
                    _unbraced(match.group(1)).decode("utf-8", "replace")
                    for name in names
                    if (match := _CONFIG.match(name)) is not None
                }
            )
            if others:
                found.append(
                    (
                        "channel",
                        f"nobody subscribes to channel {self._channel!r} on this Redis, but "
                        f"subscribers listen on {', '.join(map(repr, others[:5]))}: every "
                        "trigger published here is lost; check the channel= of both sides",
                    )
                )
        else:
            theirs = [
                Config(int(m.group(2)), int(m.group(3)), int(m.group(4)))
                for name in names
                if (m := _CONFIG.match(name)) is not None and m.group(1) == self._control
            ]
            found += self._differences([c for c in theirs if c != self._mine])
            if not found and self._others > 0:
                found.append(
                    (
                        "version",
                        f"{self._others} subscriber(s) of channel {self._channel!r} do not "
                        "announce their configuration (an older aiopurgatory, or another "
                        "client): their wire version may differ; upgrade every process of "
                        "the channel together",
                    )
                )
        self._scanning = ""
        new = [(kind, text) for kind, text in found if kind not in self.reported]
        for kind, text in new:
            self.reported.add(kind)
            self.mismatches += 1
            self.last_mismatch = text
        return new

    def _differences(self, theirs: list[Config]) -> list[tuple[str, str]]:
        mine = self._mine
        channel = self._channel
        role = self._role
        found = []
        dbs = sorted({c.db for c in theirs if c.db != mine.db})
        if dbs:
            found.append(
                (
                    "database",
                    f"subscribers of channel {channel!r} use Redis database "
                    f"{', '.join(map(str, dbs))} and this {role} database {mine.db}: "
                    "triggers reach them (pub/sub ignores the database) but stored "
                    "watermarks do not, so a wait made after an advance misses it; "
                    "use one database on both sides",
                )
            )
        counts = sorted({c.partitions for c in theirs if c.partitions != mine.partitions})
        if counts:
            found.append(
                (
                    "partitions",
                    f"subscribers of channel {channel!r} use partitions="
                    f"{', '.join(map(str, counts))} and this {role} partitions="
                    f"{mine.partitions}: their keys' triggers go to channels they do not "
                    "listen to; use the same partitions= on both sides",
                )
            )
        versions = sorted({c.version for c in theirs if c.version != mine.version})
        if versions:
            found.append(
                (
                    "version",
                    f"subscribers of channel {channel!r} speak wire version "
                    f"{', '.join(map(str, versions))} and this {role} version {VERSION}: "
                    "they cannot read each other's messages; upgrade every process of "
                    "the channel together",
                )
            )
        return found


def check_once(
    agreement: Agreement, execute: Callable[[tuple[Any, ...]], Any], logger: Any
) -> bool:
    """One check, its commands run by ``execute`` (blocking: the sync publisher's).

    Returns:
        False if Redis refuses ``PUBSUB`` (an ACL): no more checks (logged once).

    Raises:
        Exception: Redis could not be reached (the caller tries at the next check).
    """
    try:
        command = agreement.counted(execute(agreement.probe()))
        if command is not None:
            _report(agreement.scanned(execute(command)), logger)
    except ResponseError as exc:
        logger.info("aiopurgatory.redis.config_check_unavailable", error=str(exc))
        return False
    return True


async def keep_checking(
    agreement: Agreement,
    probe: Callable[[tuple[Any, ...]], Awaitable[Any]],
    *,
    interval: float,
    bound: float,
    logger: Any,
) -> None:
    """Check every ``interval`` seconds (the first after at most one second) until
    cancelled, each check's commands sent by ``probe``, a check bounded by
    ``bound`` seconds."""
    await asyncio.sleep(min(1.0, interval))
    while True:
        try:
            async with asyncio.timeout(bound):
                command = agreement.counted(await probe(agreement.probe()))
                if command is not None:
                    _report(agreement.scanned(await probe(command)), logger)
        except ResponseError as exc:  # PUBSUB refused (an ACL): no checks
            logger.info("aiopurgatory.redis.config_check_unavailable", error=str(exc))
            await asyncio.Future()  # until cancelled: a task that ends is taken for a bug
        except (TimeoutError, *CONNECTION_ERRORS):
            pass  # Redis is away: its own logs say so; the next check will tell
        await asyncio.sleep(interval)


def _report(findings: list[tuple[str, str]], logger: Any) -> None:
    for kind, text in findings:
        logger.warning("aiopurgatory.redis.misconfigured", kind=kind, detail=text)
