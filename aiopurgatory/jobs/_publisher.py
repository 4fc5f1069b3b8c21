"""The worker side: publish a job's progress and end for the waiters of every process.

One :class:`JobPublisher` per job system integration and worker process. It
writes through anything with ``advance(key, value)``: a
:class:`aiopurgatory.redis.SyncPublisher` in the sync workers (Celery, RQ,
Dramatiq), a :class:`aiopurgatory.Triggers` in the async ones (arq, saq). Given a
URL or a factory, it makes its publisher lazily in each process that publishes:
prefork and fork workers (Celery's prefork pool, RQ's work horse) must not share
a client made before the fork.

A failed publish never fails the job: the job system has stored the outcome
already, and a waiter that misses the end reads the job system when its own
timeout comes (the last look of :meth:`JobWaiter.wait`). The failure is logged
(``aiopurgatory.jobs.publish_failed``), never dropped in silence.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

from .._logging import LazyLogger
from .._transport import Key, Value
from ._layout import END, JobEnd, check_job_id, check_namespace, check_progress, job_key

__all__ = ["Advancer", "JobPublisher", "current_context", "within"]

_log = LazyLogger()


def current_context() -> Any:
    """OpenTelemetry's current context if a span or baggage was ever attached in it, else None.

    Imports nothing: None where OpenTelemetry's API is not imported (nothing
    there could have made a span).
    """
    context = sys.modules.get("opentelemetry.context")
    if context is None:
        return None
    current = context.get_current()
    return current if current else None


@contextlib.contextmanager
def within(saved: Any) -> Iterator[None]:
    """Make ``saved`` (from :func:`current_context`) current meanwhile, if not None:
    what is published meanwhile carries its span (the publisher reads the current one)."""
    context = sys.modules.get("opentelemetry.context")
    if saved is None or context is None:
        yield
        return
    token = context.attach(saved)
    try:
        yield
    finally:
        context.detach(token)


@runtime_checkable
class Advancer(Protocol):
    """What a :class:`JobPublisher` writes through: ``SyncPublisher``, any ``Triggers``."""

    def advance(self, key: Key, value: Value) -> Any:
        """Raise ``key``'s watermark to ``value`` in every process."""
        ...


class JobPublisher:
    """Publishes jobs' progress and ends under one namespace (the worker side).

    Args:
        publisher: a Redis URL (a :class:`~aiopurgatory.redis.SyncPublisher` is
            made from it in each process, on first use), a zero-argument
            callable returning an :class:`Advancer` (called once per process),
            or an :class:`Advancer` to use as it is (a ``SyncPublisher``, a
            ``RedisTriggers``, a ``LocalTriggers``; not closed by :meth:`close`).
        namespace: the jobs' key namespace; the waiters use the same (each
            integration defaults to its system's name).
        channel: the Redis channel, for a URL (default ``"aiopurgatory"``).

    Raises:
        TypeError: ``publisher`` is none of those; ``namespace`` is not a str.
        ValueError: ``namespace`` is empty.
    """

    __slots__ = ("_factory", "_lock", "_made", "_namespace", "_pid", "_publisher")

    def __init__(
        self,
        publisher: str | Callable[[], Advancer] | Advancer,
        *,
        namespace: str,
        channel: str | None = None,
    ) -> None:
        namespace = check_namespace(namespace)
        self._factory: Callable[[], Advancer] | None
        self._publisher: Advancer | None
        if isinstance(publisher, str):
            url = publisher

            def factory() -> Advancer:
                from ..redis import SyncPublisher

                return SyncPublisher(url, channel=channel)

            self._factory, self._publisher = factory, None
        elif isinstance(publisher, Advancer):
            self._factory, self._publisher = None, publisher
        elif callable(publisher):
            self._factory, self._publisher = publisher, None
        else:
            raise TypeError(
                "publisher must be a Redis URL, a SyncPublisher or Triggers, or a callable "
                f"returning one, got {type(publisher).__name__}"
            )
        self._namespace = namespace
        self._pid = os.getpid()
        self._made = False  # the publisher is ours (made by the factory): close it
        self._lock = threading.Lock()

    @property
    def namespace(self) -> str:
        """The jobs' key namespace."""
        return self._namespace

    def key(self, job_id: str) -> Key:
        """The watermark key of ``job_id``."""
        return job_key(self._namespace, check_job_id(job_id))

    def publisher(self) -> Advancer:
        """This process's publisher, made on first use (again after a fork)."""
        pid = os.getpid()
        publisher = self._publisher
        if publisher is not None and (pid == self._pid or not self._made):
            return publisher
        with self._lock:
            if self._publisher is None or (self._made and self._pid != pid):
                # After a fork the parent's client is the parent's: never closed
                # here (that would close its sockets under the parent), replaced.
                assert self._factory is not None
                self._publisher = self._factory()
                self._made = True
                self._pid = pid
            return self._publisher

    def progress(self, job_id: str, value: float) -> bool:
        """Publish ``job_id``'s progress ``value`` (from 0 to below 2**52).

        Returns:
            True if the publisher took it; False if it failed (logged as
            ``aiopurgatory.jobs.publish_failed``): progress never fails the job.

        Raises:
            TypeError, ValueError: ``job_id`` or ``value`` is unusable.
        """
        key = self.key(job_id)
        return self._advance(key, check_progress(value, "value"), job_id, "progress")

    def ended(self, job_id: str, end: JobEnd) -> bool:
        """Publish that ``job_id`` ended as ``end`` (after the job system stored it).

        Returns:
            True if the publisher took it; False if it failed (logged).

        Raises:
            TypeError: ``job_id`` is not a str or ``end`` not a :class:`JobEnd`.
        """
        if not isinstance(end, JobEnd):
            raise TypeError(f"end must be a JobEnd, got {type(end).__name__}")
        key = self.key(job_id)
        return self._advance(key, END + end.value, job_id, end.name.lower())

    def _advance(self, key: Key, value: float, job_id: str, what: str) -> bool:
        try:
            self.publisher().advance(key, value)
        except Exception as exc:
            _log.warning(
                "aiopurgatory.jobs.publish_failed",
                namespace=self._namespace,
                job_id=job_id,
                what=what,
                error=f"{type(exc).__name__}: {exc}",
            )
            return False
        return True

    def flush(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for kept advances to be delivered (if the
        publisher keeps any: the SyncPublisher of a URL does through a Redis outage)."""
        publisher = self._publisher
        flush = getattr(publisher, "flush", None)
        if publisher is None or not self._made or self._pid != os.getpid() or flush is None:
            return
        if inspect.iscoroutinefunction(flush):  # a Triggers: its owner's loop flushes it
            return
        try:
            flush(timeout)
        except Exception as exc:
            _log.warning(
                "aiopurgatory.jobs.flush_failed",
                namespace=self._namespace,
                error=f"{type(exc).__name__}: {exc}",
            )

    def close(self) -> None:
        """Close the publisher this process made (one passed in is left open). Idempotent."""
        with self._lock:
            publisher = self._publisher
            if publisher is None or not self._made or self._pid != os.getpid():
                return
            self._publisher = None
            self._made = False
        close = getattr(publisher, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        return f"<JobPublisher namespace={self._namespace!r}>"
