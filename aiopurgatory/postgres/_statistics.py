"""PostgresTriggersStatistics: the snapshot ``PostgresTriggers.statistics()`` returns."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PostgresTriggersStatistics", "SyncPublisherStatistics"]


@dataclass(frozen=True, slots=True)
class PostgresTriggersStatistics:
    """A snapshot of one PostgresTriggers' counters (running totals since construction).

    It satisfies :class:`aiopurgatory.TriggersStatistics`.

    Attributes:
        channel: the channel (it names the table and the NOTIFY channels).
        instance: this instance's id (its payloads carry it).
        purgatory: the local purgatory's name, or None for a publisher only.
        connected: the listener's connection is up (publisher only: the last
            publish succeeded).
        triggers: ``check_and_complete``/``advance`` calls on this instance.
        pending: triggers gathered and not yet sent (distinct keys); after
            ``aclose()``, those it could not send.
        completed: local operations completed by other processes' triggers and
            by catch-up reads and resyncs.
        reconnects: successful reconnections of the listener after a loss.
        connection_errors: failed connections, statements and health checks.
        published: notifications committed (one per partition of a batch, more
            when a partition's triggers exceed one payload).
        publish_errors: attempts to send a batch that failed (kept and retried).
        received: payloads from other processes (and from transactions,
            ``advance_in``) on the partitions listened to.
        echoes: this instance's own payloads coming back (skipped).
        malformed: payloads this version cannot read (skipped).
        applied: triggers from payloads applied to the local purgatory.
        resyncs: times every watched key was read, advanced and checked.
        reads: statements that read stored watermarks.
        read_errors: those that failed (retried; a failed fetch is the caller's).
        listening: partition channels LISTENed to now.
        deaf_detected: times the listener's canary did not come back (renewed).
        health_check_failures: health checks that failed or did not answer in
            time (a paused server, a lost network; the connection is renewed).
        queue_usage: ``pg_notification_queue_usage()`` at the last health
            check (0 to 1; at 1 PostgreSQL refuses every NOTIFY), or None.
        last_error: the last error as ``"Type: message"`` (no password), or None.
    """

    channel: str
    instance: str
    purgatory: str | None
    connected: bool
    triggers: int
    pending: int
    completed: int
    reconnects: int
    connection_errors: int
    published: int
    publish_errors: int
    received: int
    echoes: int
    malformed: int
    applied: int
    resyncs: int
    reads: int
    read_errors: int
    listening: int
    deaf_detected: int
    health_check_failures: int
    queue_usage: float | None
    last_error: str | None


@dataclass(frozen=True, slots=True)
class SyncPublisherStatistics:
    """A snapshot of one PostgreSQL SyncPublisher's counters (running totals since
    construction, or since the fork that made this process).

    Kept triggers are coalesced (one entry per key and kind), so ``delivered_late``
    and ``dropped`` count entries, not calls.

    Attributes:
        channel: the channel.
        instance: this publisher's id (its payloads carry it).
        connected: the last attempt to reach the server succeeded (True before any).
        sent: calls committed at once, in the caller's thread.
        kept: calls that returned with their trigger kept for delivery (the
            server could not be reached, or earlier triggers were still kept).
        pending: triggers (distinct keys) kept now, not yet delivered.
        delivered_late: kept triggers the delivery thread has committed.
        dropped: triggers not delivered: refused because ``max_pending`` were
            kept (the call raised), refused by the server when sent alone, or
            still kept when ``close()`` gave up.
        errors: attempts to reach the server that failed (the callers' and the
            delivery thread's).
        outages: times the server could not be reached after it could (or at the
            start), each logged once.
        last_error: the last error, as ``"Type: message"`` (no password), or None.
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
