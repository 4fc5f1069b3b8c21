"""Kept triggers: what a SyncPublisher could not send at once, delivered when Redis is back.

The outbox itself is transport-neutral (:mod:`aiopurgatory._outbox`, shared with
the PostgreSQL SyncPublisher); this module gives it Redis's judgement of failures
(:func:`failure_kind`), errors and event names. A
:class:`~aiopurgatory.redis.SyncPublisher` sends each call in the caller's
thread, one round trip, while Redis answers. When a send meets a *transient*
failure (:func:`failure_kind`: the connection refused, reset or timed out, a
server ``LOADING`` its data, a former primary answering ``READONLY`` after a
failover...), the trigger goes into an :class:`Outbox` instead of failing the
caller:

* **Bounded and coalesced.** The outbox is a :class:`~._wire.Batch` (checks as an
  ordered set, the highest value per advanced key), holding at most
  ``max_pending`` triggers (distinct keys). A trigger that does not fit is
  refused (the caller gets the error, ``dropped`` counts it); an advance of a key
  already kept only raises the kept value, so a job publishing its progress
  during an outage keeps one entry, however many calls it makes.
* **Delivered by one thread.** A daemon thread, started with the first kept
  trigger and ended when the outbox is empty, sends the whole outbox with the
  publisher's batch path (same scripts, same messages as ``RedisTriggers``),
  retrying with jittered exponential backoff (``reconnect_delay``). Only it
  talks to Redis during an outage: callers do not each wait for a timeout.
* **No overtaking.** While anything is kept, later calls join the outbox rather
  than going straight to Redis, so nothing sent later lands before what was
  kept earlier. During an outage they return at once; while the thread is
  delivering (Redis answers again) they wait for the delivery of the batch they
  joined (a round trip), so a call still returns once Redis has its trigger.
  Receivers apply a message's advances before its checks, so coalescing never
  shows a check an older watermark than the caller had set.
* **Loud, once.** An outage is logged when it starts
  (``aiopurgatory.redis.publisher_outage``, with the error and how many are
  kept) and when it ends (``aiopurgatory.redis.publisher_recovered``, with how
  many were delivered late and after how long), never per call; every count is
  in :meth:`Outbox.counters`.
* **Fork-safe.** A process forked from one holding publishers (a Celery prefork
  child, a gunicorn worker) starts with empty outboxes, new locks and no thread
  (:func:`os.register_at_fork`): the parent delivers what it kept.
* **Not silent at exit.** At interpreter exit, what is still kept gets up to
  the publisher's ``close_timeout`` to be delivered; what is left is logged
  (``aiopurgatory.redis.publisher_dropped``).

Failures that retrying cannot mend are not kept (:func:`failure_kind`): an
authentication failure before the publisher ever reached Redis (a wrong
password or URL, seen at the first call), and a command Redis refuses (an ACL
without the command, a value of the wrong type under a watermark key). They are
raised to the caller; met by the thread, the refused triggers are tried one by
one, and those Redis refuses alone are dropped and logged
(``aiopurgatory.redis.publisher_refused``). An authentication failure after the
publisher worked (a rotated password) is an outage like any other: kept and
retried, logged at error level.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    AuthorizationError,
    DataError,
    NoPermissionError,
    ResponseError,
)

from .._outbox import Kind
from .._outbox import Outbox as _Outbox
from ._errors import RedisTriggersClosedError, RedisTriggersError
from ._wire import Batch

__all__ = ["DEFAULT_MAX_PENDING", "Outbox", "failure_kind"]

#: Triggers (distinct keys) a SyncPublisher keeps at most while Redis is away.
DEFAULT_MAX_PENDING: Final = 10_000

# Error replies that say "not now" (retrying later succeeds), wherever Redis
# puts them in the text (a script's error carries the inner command's code).
_TRANSIENT_REPLY: Final = re.compile(
    r"\b(LOADING|READONLY|MASTERDOWN|TRYAGAIN|CLUSTERDOWN|BUSY|OOM|NOREPLICAS|MOVED|ASK|UNBLOCKED)\b"
)
_AUTH_REPLY: Final = re.compile(r"\b(WRONGPASS|NOAUTH|NOPERM)\b|invalid password")


def failure_kind(exc: BaseException) -> Kind:
    """Whether retrying ``exc``'s call later can succeed.

    ``"auth"``: the credentials or the ACL refused (retried only after the
    publisher once worked); ``"refused"``: Redis refused this command for
    good (a wrong type, a script error, bad data); ``"transient"``: anything
    else (unreachable, timed out, reset, loading, read-only, cluster moving).
    """
    text = str(exc)
    if isinstance(
        exc,
        AuthenticationError
        | AuthorizationError
        | NoPermissionError
        | AuthenticationWrongNumberOfArgsError,
    ) or _AUTH_REPLY.search(text):
        return "auth"
    if isinstance(exc, DataError):
        return "refused"
    if isinstance(exc, ResponseError) and not _TRANSIENT_REPLY.search(text):
        return "refused"
    return "transient"


class Outbox(_Outbox):
    """The kept triggers of one Redis SyncPublisher and the thread that delivers them.

    :class:`aiopurgatory._outbox.Outbox` with Redis's :func:`failure_kind`,
    :class:`RedisTriggersError` and :class:`RedisTriggersClosedError`, and the
    ``aiopurgatory.redis.publisher_*`` events. Thread-safe.

    Args:
        send: sends a batch to Redis (in the delivery thread); raises on failure.
        error_text: an exception's text without any password (for logs and
            ``last_error``).
        raise_for: makes the :class:`RedisTriggersError` a caller gets for an
            exception that is not kept.
        max_pending, reconnect_delay, wait_bound, close_timeout, name, logger:
            as :class:`aiopurgatory._outbox.Outbox`.
    """

    __slots__ = ()

    def __init__(
        self,
        send: Callable[[Batch], None],
        *,
        error_text: Callable[[BaseException], str],
        raise_for: Callable[[BaseException], RedisTriggersError],
        max_pending: int,
        reconnect_delay: tuple[float, float],
        wait_bound: float,
        close_timeout: float,
        name: str,
        logger: Any,
    ) -> None:
        super().__init__(
            send,
            classify=failure_kind,
            error_text=error_text,
            raise_for=raise_for,
            closed=RedisTriggersClosedError,
            full=RedisTriggersError,
            server="Redis",
            events="aiopurgatory.redis",
            max_pending=max_pending,
            reconnect_delay=reconnect_delay,
            wait_bound=wait_bound,
            close_timeout=close_timeout,
            name=name,
            logger=logger,
        )
