"""What differs between the redis-py versions the library runs on.

:mod:`aiopurgatory.redis` runs on redis-py 5.3 and later on one server and
behind Sentinel (so that it installs beside job systems that pin redis-py below
6, such as arq 0.28), and on redis-py 8.0 and later on a Redis Cluster, whose
asyncio sharded pub/sub (``SSUBSCRIBE`` through ``redis.asyncio.cluster``) and
node connections the library needs first appeared there. The differences are
kept here, each behind one name:

* :func:`has_pending_input`: whether an idle connection holds bytes or is at end
  of file (redis-py 8 calls it ``Connection.can_read``, redis-py 5 and 6
  ``can_read_destructive``, deprecated since 8.0);
* :func:`require_cluster_support`: the clear refusal of a cluster on a redis-py
  older than 8.0.
"""

from __future__ import annotations

import re
from typing import Any, Final

import redis
from redis.asyncio.connection import Connection

__all__ = [
    "CLUSTER_MIN_VERSION",
    "REDIS_PY_VERSION",
    "has_pending_input",
    "require_cluster_support",
]


def _version(text: str) -> tuple[int, ...]:
    """``"5.3.1"`` -> ``(5, 3, 1)``; a pre-release's suffix is ignored."""
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


#: The installed redis-py, as numbers: ``(8, 1, 0)``.
REDIS_PY_VERSION: Final = _version(redis.__version__)

#: The oldest redis-py a Redis Cluster needs (see the module documentation).
CLUSTER_MIN_VERSION: Final = (8, 0)

# Looked up once: redis-py 8 added can_read and deprecated the older name (calling
# that one there emits a DeprecationWarning on every use).
_CAN_READ: Final = "can_read" if hasattr(Connection, "can_read") else "can_read_destructive"


async def has_pending_input(connection: Any) -> bool:
    """Whether an idle ``redis.asyncio`` connection has bytes to read or is at end of file.

    Raises:
        redis.exceptions.ConnectionError: the socket failed while checking (the
            connection is then disconnected).
    """
    result: bool = await getattr(connection, _CAN_READ)()
    return result


def require_cluster_support() -> None:
    """Refuse a Redis Cluster on a redis-py too old for it.

    Raises:
        RuntimeError: the installed redis-py is older than 8.0; the message names
            the version needed and the installed one.
    """
    if REDIS_PY_VERSION < CLUSTER_MIN_VERSION:
        raise RuntimeError(
            "aiopurgatory.redis needs redis-py >= 8.0 for a Redis Cluster (its asyncio "
            f"sharded pub/sub); redis-py {redis.__version__} is installed: "
            "pip install 'redis>=8.1' (one server and Sentinel work on redis-py >= 5.3)"
        )
