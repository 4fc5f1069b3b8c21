"""The options both publishers take, checked: the channel, durations, the instance id.

:class:`~aiopurgatory.redis.RedisTriggers` and
:class:`~aiopurgatory.redis.SyncPublisher` check them alike, so that one channel,
one TTL and one message format serve both (the partition count is checked by
:func:`._partitions.check_partitions`).
"""

from __future__ import annotations

import math
import os
import secrets
from typing import Final

from .._validation import as_seconds

__all__ = ["DEFAULT_CHANNEL", "check_channel", "new_instance", "positive_seconds"]

#: The channel used when none is given.
DEFAULT_CHANNEL: Final = "aiopurgatory"


def check_channel(channel: object) -> str:
    """``channel``, or :data:`DEFAULT_CHANNEL` for None; TypeError/ValueError otherwise."""
    if channel is None:
        return DEFAULT_CHANNEL
    if not isinstance(channel, str):
        raise TypeError(f"channel must be a str or None, got {type(channel).__name__}")
    if not channel:
        raise ValueError("channel must not be empty")
    return channel


def positive_seconds(value: object, argument: str) -> float:
    """:func:`as_seconds`, above zero: the timeouts and intervals of this package."""
    try:
        seconds = as_seconds(value, argument)
    except ValueError:
        seconds = math.nan  # NaN or infinite: the one message below
    if not seconds > 0:
        raise ValueError(f"{argument} must be positive and finite, got {value!r}")
    return seconds


def new_instance() -> str:
    """A new publisher's id, ``<pid>-<random hex>``: its messages carry it."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"
