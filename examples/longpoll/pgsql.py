"""The SQL of the long-poll feed kept in PostgreSQL (``--postgres DSN``): its tables, the
append function and the read. Text only; :mod:`examples.longpoll.pgfeed` runs it.

Per feed (``prefix``, default ``longpoll``):

* ``<prefix>_topics``: a row per topic: ``start`` (the oldest retained offset),
  ``next`` (the offset the next message gets), ``bytes`` (the UTF-8 bytes ever
  appended: the topic's watermark);
* ``<prefix>_messages``: a row per retained message: its topic and offset (``seq``),
  ``ends`` (the topic's bytes up to and including it), ``size`` and ``body``;
* ``<prefix>_idempotency``: a POST's token (the client's ``Idempotency-Key``, else
  the server's own), the offset it got, a digest of its body and when it expires;
* ``<prefix>_append(...)``: the append, one call (the counterpart of the Redis
  feed's Lua script): it locks the topic's row, so appends to one topic are
  serialised and their offsets dense, creates the topic (``max_topics``, under an
  advisory lock), answers a token already stored with its first offset, appends,
  trims to ``retain`` and records the token.

The wake-up is not here: the feed calls ``PostgresTriggers.advance_in`` in the same
transaction, after the append, so the topic's row, the message and the watermark
commit together, and the waiters wake at that commit, never on a rollback.
"""

from __future__ import annotations

import re

__all__ = ["PREFIX", "append_sql", "count_sql", "read_sql", "schema_sql"]

#: A feed's prefix: a lower-case SQL identifier short enough for its names.
PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,29}")

#: What the append function answers in ``status``.
STORED, REPLAYED, KEY_REUSED, TOO_MANY_TOPICS = 0, 1, 2, 3


def check_prefix(prefix: str) -> str:
    """``prefix`` if it names a feed's tables, else ValueError saying what it must be."""
    if not isinstance(prefix, str) or not PREFIX.fullmatch(prefix):
        raise ValueError(
            "the PostgreSQL prefix must be 1 to 30 of a-z 0-9 _, not starting with a "
            f"digit, got {prefix!r}"
        )
    return prefix


def schema_sql(prefix: str) -> str:
    """The feed's tables and its append function (idempotent: ``IF NOT EXISTS``,
    ``CREATE OR REPLACE``), to run in one transaction."""
    p = check_prefix(prefix)
    return f"""
SELECT pg_advisory_xact_lock(hashtext('examples.longpoll:{p}'));
CREATE TABLE IF NOT EXISTS {p}_topics (
    name text PRIMARY KEY,
    start bigint NOT NULL DEFAULT 0,
    next bigint NOT NULL DEFAULT 0,
    bytes bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS {p}_messages (
    topic text NOT NULL,
    seq bigint NOT NULL,
    ends bigint NOT NULL,
    size integer NOT NULL,
    body text NOT NULL,
    PRIMARY KEY (topic, seq)
);
CREATE TABLE IF NOT EXISTS {p}_idempotency (
    topic text NOT NULL,
    token text NOT NULL,
    seq bigint NOT NULL,
    digest text NOT NULL,
    expires timestamptz NOT NULL,
    PRIMARY KEY (topic, token)
);
CREATE INDEX IF NOT EXISTS {p}_idempotency_expires ON {p}_idempotency (topic, expires);
CREATE OR REPLACE FUNCTION {p}_append(
    p_topic text, p_body text, p_size integer, p_retain integer, p_token text,
    p_ttl_ms bigint, p_digest text, p_max_topics integer,
    OUT out_offset bigint, OUT out_bytes bigint, OUT out_status integer
) LANGUAGE plpgsql AS $fn$
DECLARE
    t {p}_topics%ROWTYPE;
    seen {p}_idempotency%ROWTYPE;
BEGIN
    -- The topic's row, locked: appends to one topic run one at a time.
    SELECT * INTO t FROM {p}_topics WHERE name = p_topic FOR UPDATE;
    IF NOT FOUND THEN
        -- A new topic: one creation at a time, so the count below is exact.
        PERFORM pg_advisory_xact_lock(hashtext('examples.longpoll:{p}_topics'));
        SELECT * INTO t FROM {p}_topics WHERE name = p_topic FOR UPDATE;
        IF NOT FOUND THEN
            IF (SELECT count(*) FROM {p}_topics) >= p_max_topics THEN
                out_offset := -1; out_bytes := 0; out_status := {TOO_MANY_TOPICS};
                RETURN;
            END IF;
            INSERT INTO {p}_topics (name) VALUES (p_topic) RETURNING * INTO t;
        END IF;
    END IF;
    IF p_token <> '' THEN
        SELECT * INTO seen FROM {p}_idempotency
        WHERE topic = p_topic AND token = p_token AND expires > clock_timestamp();
        IF FOUND THEN
            IF seen.digest <> p_digest THEN
                out_offset := -2; out_bytes := 0; out_status := {KEY_REUSED};
            ELSE
                out_offset := seen.seq; out_bytes := t.bytes; out_status := {REPLAYED};
            END IF;
            RETURN;
        END IF;
    END IF;
    out_offset := t.next;
    UPDATE {p}_topics SET next = next + 1, bytes = bytes + p_size
    WHERE name = p_topic RETURNING * INTO t;
    INSERT INTO {p}_messages (topic, seq, ends, size, body)
    VALUES (p_topic, out_offset, t.bytes, p_size, p_body);
    IF t.next - t.start >= 2 * p_retain THEN
        DELETE FROM {p}_messages WHERE topic = p_topic AND seq < t.next - p_retain;
        UPDATE {p}_topics SET start = t.next - p_retain WHERE name = p_topic;
    END IF;
    IF p_token <> '' THEN
        -- This topic's expired records go as it is written to (its row is ours now).
        DELETE FROM {p}_idempotency WHERE topic = p_topic AND expires <= clock_timestamp();
        INSERT INTO {p}_idempotency (topic, token, seq, digest, expires)
        VALUES (p_topic, p_token, out_offset, p_digest,
                clock_timestamp() + p_ttl_ms * interval '1 millisecond');
    END IF;
    out_bytes := t.bytes; out_status := {STORED};
END
$fn$;
"""


def append_sql(prefix: str) -> str:
    """``(offset, bytes, status)`` of an append: ``$1`` topic, ``$2`` body, ``$3`` its
    UTF-8 size, ``$4`` retain, ``$5`` token ("" for none), ``$6`` the token's TTL in
    ms, ``$7`` the body's digest, ``$8`` max_topics."""
    p = check_prefix(prefix)
    return f"SELECT * FROM {p}_append($1, $2, $3, $4, $5, $6, $7, $8)"


def read_sql(prefix: str) -> str:
    """One snapshot of a topic from offset ``$2``, up to ``$3`` bytes (at least one
    message): rows ``(start, next, bytes, position, seq, body)``, one per message
    (``seq`` NULL when there is none); no row for a topic never posted to.
    ``position``: the bytes before the first message (NULL when there is none)."""
    p = check_prefix(prefix)
    return f"""
SELECT t.start, t.next, t.bytes, f.ends - f.size AS position, m.seq, m.body
FROM {p}_topics t
LEFT JOIN {p}_messages f ON f.topic = t.name AND f.seq = GREATEST($2::bigint, t.start)
LEFT JOIN LATERAL (
    SELECT x.seq, x.body FROM {p}_messages x
    WHERE x.topic = t.name AND x.seq >= f.seq
      AND (x.seq = f.seq OR x.ends - (f.ends - f.size) <= $3::bigint)
) m ON true
WHERE t.name = $1
ORDER BY m.seq
"""


def count_sql(prefix: str) -> str:
    """The number of topics (the health monitor's probe)."""
    return f"SELECT count(*) FROM {check_prefix(prefix)}_topics"
