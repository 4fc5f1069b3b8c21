"""RedisTriggersStatistics: the snapshot ``RedisTriggers.statistics()`` returns.

Its counters are kept where they are counted (the sender, the reader, the
subscriber, the connections); ``statistics()`` gathers them into one frozen value.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RedisTriggersStatistics", "SyncPublisherStatistics"]


@dataclass(frozen=True, slots=True)
class RedisTriggersStatistics:
    """A snapshot of one RedisTriggers' counters (running totals since construction).

    Attributes:
        channel: the Redis channel.
        instance: this instance's id (its messages carry it).
        purgatory: the local purgatory's name, or None for a publisher only.
        connected: the subscription is up (publisher only: the last command
            to Redis succeeded).
        reconnects: successful re-subscriptions after a lost connection.
        connection_errors: connection attempts and connections that failed.
        triggers: ``check_and_complete``/``advance`` calls on this instance.
        pending: triggers gathered and not yet sent (distinct keys); after
            ``aclose()``, those it could not send.
        published: messages published (one per partition of a batch, or per
            :data:`MAX_MESSAGE_TRIGGERS` triggers).
        publish_errors: attempts to send a batch that failed (it is kept and retried).
        received: messages from other processes (only those of the partitions
            of keys watched here reach a process).
        echoes: this instance's own messages coming back (skipped).
        malformed: messages on the channel this version cannot read (skipped).
        applied: triggers from other processes applied to the local purgatory.
        completed: operations those triggers and the resyncs completed.
        resyncs: times the stored watermarks of the watched keys were read and applied.
        last_error: the last error, as ``"Type: message"`` without any password,
            or None.
        reads: round trips that read stored watermarks (the keys watched through
            :meth:`RedisTriggers.watch` in one loop iteration, a resync, the
            fetches of one iteration: one each).
        read_errors: those that failed (each is retried; a failed fetch is the
            caller's error).
        subscribed: partition channels subscribed now (0 for a publisher only,
            or a process watching nothing).
        deaf_detected: times the subscription was found connected but not
            delivering (its canary did not come back) and renewed.
        mismatches: misconfigurations found between this instance and the
            channel's subscribers (another channel, database, ``partitions`` or
            wire version), each counted and logged once.
        last_mismatch: the last of them, in words, or None.
    """

    channel: str
    instance: str
    purgatory: str | None
    connected: bool
    reconnects: int
    connection_errors: int
    triggers: int
    pending: int
    published: int
    publish_errors: int
    received: int
    echoes: int
    malformed: int
    applied: int
    completed: int
    resyncs: int
    last_error: str | None
    reads: int = 0
    read_errors: int = 0
    subscribed: int = 0
    deaf_detected: int = 0
    mismatches: int = 0
    last_mismatch: str | None = None


@dataclass(frozen=True, slots=True)
class SyncPublisherStatistics:
    """A snapshot of one SyncPublisher's counters (running totals since construction,
    or since the fork that made this process).

    Triggers are counted per call; kept triggers are coalesced (one entry per
    key and kind), so ``delivered_late`` and ``dropped`` count entries, not calls.

    Attributes:
        channel: the Redis channel.
        instance: this publisher's id (its messages carry it).
        connected: the last attempt to reach Redis succeeded (True before any).
        sent: calls sent at once, in the caller's thread.
        kept: calls that returned with their trigger kept for delivery (Redis
            could not be reached, or earlier triggers were still kept).
        pending: triggers (distinct keys) kept now, not yet delivered.
        delivered_late: kept triggers the delivery thread has delivered.
        dropped: triggers not delivered: refused because ``max_pending`` were
            kept (the call raised), refused by Redis when sent alone, or still
            kept when ``close()`` gave up.
        errors: attempts to reach Redis that failed (the callers' and the
            delivery thread's).
        outages: times Redis could not be reached after it could (or at the
            start), each logged once.
        last_error: the last error, as ``"Type: message"`` without any
            password, or None.
        mismatches: misconfigurations found between this publisher and the
            channel's subscribers (another channel, database, ``partitions`` or
            wire version), each counted and logged once.
        last_mismatch: the last of them, in words, or None.
    """

    channel: str
    instance: str
    connected: bool
    sent: int
    kept: int
    pending: int
    delivered_late: int
    dropped: int
    errors: int
    outages: int
    last_error: str | None
    mismatches: int = 0
    last_mismatch: str | None = None
