"""Kept triggers: what a sync publisher could not send at once, delivered when its server is back.

Transport-neutral: :class:`aiopurgatory.redis.SyncPublisher` and
:class:`aiopurgatory.postgres.SyncPublisher` each send a call in the caller's
thread, one round trip, while the server answers. When a send meets a
*transient* failure (the transport's ``classify`` says which: the connection
refused, reset or timed out, a server starting up or failing over...), the
trigger goes into an :class:`Outbox` instead of failing the caller:

* **Bounded and coalesced.** The outbox is a :class:`~aiopurgatory._transport.Batch`
  (checks as an ordered set, the highest value per advanced key), holding at most
  ``max_pending`` triggers (distinct keys). A trigger that does not fit is
  refused (the caller gets the error, ``dropped`` counts it); an advance of a key
  already kept only raises the kept value, so a job publishing its progress
  during an outage keeps one entry, however many calls it makes.
* **Delivered by one thread.** A daemon thread, started with the first kept
  trigger and ended when the outbox is empty, sends the whole outbox with the
  publisher's batch path, retrying with jittered exponential backoff
  (``reconnect_delay``). Only it talks to the server during an outage: callers do
  not each wait for a timeout.
* **No overtaking.** While anything is kept, later calls join the outbox rather
  than going straight to the server, so nothing sent later lands before what was
  kept earlier. During an outage they return at once; while the thread is
  delivering (the server answers again) they wait for the delivery of the batch
  they joined (a round trip), so a call still returns once the server has its
  trigger. Receivers apply a message's advances before its checks, so coalescing
  never shows a check an older watermark than the caller had set.
* **Loud, once.** An outage is logged when it starts (``<events>.publisher_outage``,
  with the error and how many are kept) and when it ends
  (``<events>.publisher_recovered``, with how many were delivered late and after
  how long), never per call.
* **Fork-safe.** A process forked from one holding publishers (a Celery prefork
  child, a gunicorn worker) starts with empty outboxes, new locks and no thread
  (:func:`os.register_at_fork`): the parent delivers what it kept.
* **Not silent at exit.** At interpreter exit, what is still kept gets up to
  the publisher's ``close_timeout`` to be delivered; what is left is logged
  (``<events>.publisher_dropped``).

Failures that retrying cannot mend (``classify`` says ``"refused"``, or ``"auth"``
before the publisher ever reached its server) are raised to the caller; met by
the thread, the refused triggers are tried one by one, and those the server
refuses alone are dropped and logged (``<events>.publisher_refused``).
"""

from __future__ import annotations

import atexit
import os
import random
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Literal

from ._transport import Batch, Key, Value

__all__ = ["Kind", "Outbox"]

#: Whether retrying a failed send later can succeed: ``"transient"`` (yes),
#: ``"auth"`` (the credentials: only once the publisher has worked) or
#: ``"refused"`` (never: this command, for good).
Kind = Literal["transient", "auth", "refused"]


# A log line decided under the lock and emitted after it: a slow log handler
# never holds the callers of the publisher.
_Log = tuple[Callable[..., Any], str, dict[str, Any]]


def _emit(log: _Log | None) -> None:
    if log is not None:
        method, event, fields = log
        method(event, **fields)


# Every live outbox, for the fork and exit hooks (weakly: a publisher dropped
# without close() is not kept alive by them).
_LIVE: weakref.WeakSet[Outbox] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for outbox in list(_LIVE):
        outbox.reset_after_fork()


def _at_exit() -> None:
    for outbox in list(_LIVE):
        if outbox.pending:
            outbox.close(outbox.close_timeout, reason="exit")


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)


class Outbox:
    """The kept triggers of one SyncPublisher and the thread that delivers them.

    Thread-safe: every method may be called from any thread.

    Args:
        send: sends a batch to the server (in the delivery thread); raises on failure.
        classify: whether retrying an exception's call later can succeed
            (:data:`Kind`): the transport's own judgement.
        error_text: an exception's text without any password (for logs and
            ``last_error``).
        raise_for: makes the error a caller gets for an exception that is not kept.
        closed: makes the error raised once the publisher is closing (from its message).
        full: makes the error raised for a trigger that does not fit (from its message).
        server: the server's name in messages (such as ``"PostgreSQL"``).
        events: the prefix of the log events (such as ``"aiopurgatory.postgres"``).
        max_pending: the most triggers (distinct keys) kept at once.
        reconnect_delay: the first and the longest wait between two delivery
            attempts, in seconds (each drawn between half and all of
            ``min(longest, first * 2**attempt)``).
        wait_bound: seconds a call that joined a batch being delivered waits
            for it at most (the delivery's own failure ends the wait sooner).
        close_timeout: seconds delivery may take at interpreter exit.
        name: the delivery thread's name.
        logger: the owner's bound logger.
    """

    __slots__ = (
        "__weakref__",
        "_batch",
        "_classify",
        "_closed_error",
        "_cond",
        "_delivered_generation",
        "_down_since",
        "_error_text",
        "_events",
        "_first",
        "_full_error",
        "_generation",
        "_inflight",
        "_kick",
        "_logger",
        "_longest",
        "_name",
        "_outage_delivered",
        "_raise_for",
        "_send",
        "_server",
        "_stopping",
        "_thread",
        "_wait_bound",
        "close_timeout",
        "connected",
        "delivered_late",
        "dropped",
        "errors",
        "ever_sent",
        "kept",
        "last_error",
        "max_pending",
        "outages",
        "sent",
    )

    def __init__(
        self,
        send: Callable[[Batch], None],
        *,
        classify: Callable[[BaseException], Kind],
        error_text: Callable[[BaseException], str],
        raise_for: Callable[[BaseException], Exception],
        closed: Callable[[str], Exception],
        full: Callable[[str], Exception],
        server: str,
        events: str,
        max_pending: int,
        reconnect_delay: tuple[float, float],
        wait_bound: float,
        close_timeout: float,
        name: str,
        logger: Any,
    ) -> None:
        self._send = send
        self._classify = classify
        self._error_text = error_text
        self._raise_for = raise_for
        self._closed_error = closed
        self._full_error = full
        self._server = server
        self._events = events
        self.max_pending = max_pending
        self._first, self._longest = reconnect_delay
        self._wait_bound = wait_bound
        self.close_timeout = close_timeout
        self._name = name
        self._logger = logger
        self._fresh_state()
        self.ever_sent = False
        _LIVE.add(self)

    def _fresh_state(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._batch = Batch()  # kept, not yet taken by the thread
        self._inflight = 0  # triggers the thread is sending now
        self._generation = 0  # batches the thread has taken
        self._delivered_generation = 0  # the last of them it delivered
        self._thread: threading.Thread | None = None
        self._kick = False  # retry now (flush, close)
        self._stopping = False
        self._down_since: float | None = None  # monotonic start of the outage
        self._outage_delivered = 0
        self.connected = True  # the last attempt succeeded (or none was made)
        self.sent = 0
        self.kept = 0
        self.delivered_late = 0
        self.dropped = 0
        self.errors = 0
        self.outages = 0
        self.last_error: str | None = None

    # -- callers' side -------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Triggers kept and not yet delivered (distinct keys; those in flight included)."""
        return len(self._batch) + self._inflight

    def join(self, key: Key, value: Value | None) -> bool:
        """Keep the trigger (an advance, or a check if ``value`` is None) if
        something is kept already (no overtaking).

        Returns False when nothing is kept: the caller sends at once. When the
        thread is delivering (the server answers), waits until the batch joined is
        delivered or the delivery fails (then it stays kept).

        Raises:
            Exception: ``closed``'s error, the publisher is closing; ``full``'s,
                ``max_pending`` triggers are kept already.
        """
        with self._cond:
            if self._stopping:
                raise self._closed_error("SyncPublisher is closed")
            if not self._batch and not self._inflight:
                return False
            self._add(key, value, None)
            if not self.connected:  # the last attempt failed: the server is away
                return True
            generation = self._generation + 1  # the batch the thread takes next
            deadline = time.monotonic() + self._wait_bound
            while (
                self._delivered_generation < generation and self.connected and not self._closing()
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return True

    def sent_now(self) -> None:
        """A call was sent at once (in the caller's thread)."""
        log = None
        with self._cond:
            self.sent += 1
            self.ever_sent = True
            self.connected = True
            if self._down_since is not None and not self._batch and not self._inflight:
                log = self._end_outage()
        _emit(log)

    def keep(self, exc: BaseException, key: Key, value: Value | None) -> None:
        """The caller's send of a trigger (an advance, or a check if ``value`` is
        None) failed with ``exc``: keep the trigger, or raise.

        Raises:
            Exception: ``raise_for(exc)``, ``exc`` is not worth retrying
                (``classify``); ``full``'s error, ``max_pending`` triggers are kept
                already; ``closed``'s, the publisher is closing.
        """
        kind = self._classify(exc)
        text = self._error_text(exc)
        log = None
        with self._cond:
            self.errors += 1
            self.last_error = text
            if kind == "refused" or (kind == "auth" and not self.ever_sent):
                raise self._raise_for(exc)
            if self._stopping:
                raise self._closed_error("SyncPublisher is closed")
            self.connected = False
            self._add(key, value, exc)
            log = self._start_outage(text, kind)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        _emit(log)

    def flush(self, timeout: float | None) -> int:
        """Wait until nothing is kept (or ``timeout`` seconds); how many are still kept.

        Asks the thread to try at once rather than after its backoff.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if self.pending:
                self._kick = True
                self._cond.notify_all()
            while self.pending and self._thread is not None:
                if deadline is None:
                    self._cond.wait()
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            return self.pending

    def close(self, timeout: float, *, reason: str = "close") -> int:
        """Deliver within ``timeout`` seconds, then stop; how many triggers were not delivered.

        Those are counted in ``dropped`` and logged (``publisher_dropped``).
        Later calls raise ``closed``'s error.
        """
        self.flush(timeout)
        with self._cond:
            self._stopping = True
            left = self.pending
            self._batch = Batch()
            self._inflight = 0
            self.dropped += left
            self._cond.notify_all()
        _LIVE.discard(self)
        if left:
            self._logger.warning(
                f"{self._events}.publisher_dropped",
                triggers=left,
                reason=reason,
                error=self.last_error,
            )
        return left

    def reset_after_fork(self) -> None:
        """In a forked child: no thread, new locks, nothing kept (the parent delivers
        its own), counters from zero."""
        ever_sent = self.ever_sent
        self._fresh_state()
        self.ever_sent = ever_sent

    # -- the delivery thread -------------------------------------------------------------

    def _run(self) -> None:
        failures = 1  # started by a failure: wait a little first
        while True:
            with self._cond:
                delay = self._backoff(failures) if failures else 0.0
                deadline = time.monotonic() + delay
                while not self._kick and not self._stopping:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                self._kick = False
                if self._stopping or not self._batch:
                    self._thread = None
                    self._cond.notify_all()
                    return
                batch, self._batch = self._batch, Batch()
                self._inflight = len(batch)
                self._generation += 1
                generation = self._generation
            failure: BaseException | None = None
            try:
                self._send(batch)
            except Exception as exc:
                failure = exc
            if failure is not None and self._classify(failure) == "refused":
                batch, failure = self._one_by_one(batch)
            log = None
            with self._cond:
                if self._closing():  # close() counted the batch as not delivered
                    self._thread = None
                    self._cond.notify_all()
                    return
                self._inflight = 0
                if failure is None:
                    failures = 0
                    self.delivered_late += len(batch)
                    self._outage_delivered += len(batch)
                    self.ever_sent = True
                    self.connected = True
                    self._delivered_generation = generation
                    if self._down_since is not None and not self._batch:
                        log = self._end_outage()
                else:
                    failures += 1
                    self.errors += 1
                    self.last_error = self._error_text(failure)
                    self.connected = False
                    batch.merge(self._batch)  # ahead of what came since
                    self._batch = batch
                    log = self._start_outage(self.last_error, self._classify(failure))
                self._cond.notify_all()
            _emit(log)

    def _one_by_one(self, batch: Batch) -> tuple[Batch, BaseException | None]:
        """``batch`` refused as a whole: each trigger alone. Those refused alone are
        dropped (logged); those that failed otherwise are returned, to keep, with
        the last such failure (None if every trigger was delivered or dropped)."""
        rest = Batch()
        refused: list[str] = []
        failure: BaseException | None = None
        singles: list[Batch] = []
        for key in batch.checks:
            single = Batch()
            single.check(key)
            singles.append(single)
        for key, value in batch.advances.items():
            single = Batch()
            single.advance(key, value)
            singles.append(single)
        delivered = 0
        for single in singles:
            try:
                self._send(single)
            except Exception as exc:
                if self._classify(exc) == "refused":
                    refused.append(self._error_text(exc))
                else:
                    failure = exc
                    rest.merge(single)
                continue
            delivered += 1
        with self._cond:
            self.dropped += len(refused)
            self.delivered_late += delivered
            self._outage_delivered += delivered
            self.errors += len(refused)
            if refused:
                self.last_error = refused[-1]
        if refused:
            self._logger.error(
                f"{self._events}.publisher_refused", triggers=len(refused), error=refused[-1]
            )
        return rest, failure

    # -- helpers (under the lock) --------------------------------------------------------

    def _add(self, key: Key, value: Value | None, exc: BaseException | None) -> None:
        batch = self._batch
        new = key not in (batch.checks if value is None else batch.advances)
        if new and self.pending >= self.max_pending:
            self.dropped += 1
            raise self._full_error(
                f"SyncPublisher: {self.max_pending} triggers are kept for delivery already "
                f"(max_pending) and {self._server} has not taken them yet"
                + ("" if exc is None else f" ({self._error_text(exc)})")
            )
        if value is None:
            batch.check(key)
        else:
            batch.advance(key, value)
        self.kept += 1

    def _closing(self) -> bool:
        # A method, not the attribute: it changes while the thread sends.
        return self._stopping

    def _start_outage(self, text: str, kind: Kind) -> _Log | None:
        """Mark an outage's start; the log line to emit (outside the lock), if it is new."""
        if self._down_since is not None:
            return None
        self._down_since = time.monotonic()
        self._outage_delivered = 0
        self.outages += 1
        # Credentials refused after they worked: someone must act, so an error.
        log = self._logger.error if kind == "auth" else self._logger.warning
        return log, f"{self._events}.publisher_outage", {"error": text, "kept": self.pending}

    def _end_outage(self) -> _Log:
        """Mark the outage's end; the log line to emit (outside the lock)."""
        since, self._down_since = self._down_since, None
        assert since is not None
        fields = {
            "delivered": self._outage_delivered,
            "seconds": round(time.monotonic() - since, 3),
        }
        return self._logger.warning, f"{self._events}.publisher_recovered", fields

    def _backoff(self, attempt: int) -> float:
        ceiling = min(self._longest, self._first * 2 ** min(attempt - 1, 30))
        return random.uniform(ceiling / 2, ceiling)
