"""Triggers and watermarks across processes and machines, through Redis.

:class:`RedisTriggers` connects a process's :class:`~aiopurgatory.Purgatory` to a
Redis channel: a trigger made in any process (``check_and_complete(key)``,
``advance(key, value)``) reaches the operations waiting in every process, and
watermarks are kept in Redis so that a process that was disconnected catches up
when it reconnects. :class:`SyncPublisher` sends the same triggers from
synchronous code (a Celery task, a Django view, a thread) with redis-py's sync
client. See the documentation page "Across processes (Redis)".

Needs the ``redis`` extra (redis-py's asyncio client, and hiredis for speed):
``pip install 'aiopurgatory[redis]'``; Redis 7 as the server (Valkey
speaks the same commands; it is not tested here).
"""

try:
    import redis.asyncio
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ImportError(
        "aiopurgatory.redis needs redis-py: pip install 'aiopurgatory[redis]'"
    ) from exc

from .._namespace import public_dir as _public_dir
from ._errors import RedisTriggersClosedError, RedisTriggersError
from ._options import DEFAULT_CHANNEL
from ._partitions import DEFAULT_PARTITIONS
from ._publisher import MAX_MESSAGE_TRIGGERS
from ._redact import describe_url
from ._statistics import RedisTriggersStatistics, SyncPublisherStatistics
from ._sync import SyncPublisher
from ._triggers import RedisTriggers

__all__ = [
    "DEFAULT_CHANNEL",
    "DEFAULT_PARTITIONS",
    "MAX_MESSAGE_TRIGGERS",
    "RedisTriggers",
    "RedisTriggersClosedError",
    "RedisTriggersError",
    "RedisTriggersStatistics",
    "SyncPublisher",
    "SyncPublisherStatistics",
    "describe_url",
]

# Errors name their public module, in tracebacks too (not the private one that
# defines them): aiopurgatory.redis.RedisTriggersError; pickle finds them there.
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type) and issubclass(_value, BaseException):
        _value.__module__ = __name__
del _name, _value, redis  # redis-py (bound by the import check above) is not our API


def __getattr__(name: str) -> object:
    # aiopurgatory.redis.testing (a test helper, not needed by every user) loads on
    # first access, as `import aiopurgatory.redis.testing` does.
    if name == "testing":
        import importlib

        return importlib.import_module(f"{__name__}.testing")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__dir__ = _public_dir(__name__, [*__all__, "testing"])
