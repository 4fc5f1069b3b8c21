"""An HTTP long-poll server on Starlette + uvicorn whose waiting GETs are delayed operations.

``python -m examples.longpoll --port 8080`` serves:

* ``POST /topics/{name}``: append the request body (UTF-8 text) as one message;
  answers ``{"offset": N}``.
* ``GET /topics/{name}?offset=N&wait=S&min_bytes=B``: answers
  ``{"offset": K, "messages": [...], "next_offset": M}`` as soon as the topic holds
  at least B bytes from offset N, or after S seconds with what there is. Each
  waiting GET is one :class:`~aiopurgatory.DelayedOperation` watched under its
  topic; a POST calls ``check_and_complete(topic)``.
* ``GET /metrics`` (Prometheus), ``GET /healthz`` and a small page at ``/``.

Careless and hostile clients are bounded: a request's head has a deadline and a
size (:mod:`examples.longpoll.protocol`, on uvicorn's httptools protocol), a POST
body a deadline and a size; a client hanging up is counted, never logged as an error.

``--waiter asyncio`` serves the same protocol with the waiting written the way
asyncio users write it today (``asyncio.wait_for`` on a per-request future);
:mod:`examples.longpoll.loadtest` measures the two side by side. See
``docs/longpoll.md``.
"""

from .feed import Feed, FeedError, Fetched, Settings
from .waiters import AsyncioWaiter, PurgatoryWaiter, Waiter, make_waiter

__all__ = [
    "AsyncioWaiter",
    "Feed",
    "FeedError",
    "Fetched",
    "PurgatoryWaiter",
    "Settings",
    "Waiter",
    "make_waiter",
]
