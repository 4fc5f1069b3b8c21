"""The broker's settings (:class:`BrokerConfig`), and config entries DescribeConfigs reports."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

from .admin_messages import (
    ConfigEntry,
    ConfigType,
)

__all__ = [
    "MAX_PARTITIONS_PER_TOPIC",
    "TOPIC_NAME",
    "BrokerConfig",
    "max_message_bytes_entry",
    "min_insync_replicas_entry",
]


TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


#: Most partitions a CreateTopics may ask for (beyond, INVALID_PARTITIONS): every
#: partition costs memory and a slot in each follower's fetch.
MAX_PARTITIONS_PER_TOPIC = 10_000


@dataclass
class BrokerConfig:
    """Broker settings (durations in seconds, sizes in bytes).

    Attributes:
        host: interface to listen on.
        port: TCP port; 0 picks a free one (see :attr:`Broker.port`).
        advertised_host: host name put in Metadata; defaults to ``host``
            (``127.0.0.1`` when listening on all interfaces).
        followers: in-process follower replicas; replication factor is this + 1.
        follower_lag: seconds each follower waits before counting fetched
            batches as replicated.
        min_insync_replicas: smallest ISR that accepts ``acks=all``.
        replica_lag_time_max: a follower not caught up for this long leaves the ISR.
        replica_fetch_max_wait: how long a follower fetch waits for data.
        topics: topics to create at start, name -> number of partitions.
        auto_create_topics: create unknown topics named in Metadata requests.
        default_partitions: partitions of auto-created topics.
        max_frame_bytes: larger request frames close the connection.
        max_message_bytes: larger records fields get MESSAGE_TOO_LARGE.
        verify_crc: check the CRC-32C of produced batches (pure Python, costs CPU).
        stats_interval: seconds between purgatory statistics log lines; 0 = off.
        shutdown_grace: seconds :meth:`Broker.close` lets answered requests flush.
        group_min_session_timeout: smallest consumer session timeout accepted
            (Kafka's ``group.min.session.timeout.ms``).
        group_max_session_timeout: largest one (``group.max.session.timeout.ms``).
        group_initial_rebalance_delay: how long an empty group waits for more
            members before its first generation (``group.initial.rebalance.delay.ms``).
    """

    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str | None = None
    followers: int = 2
    follower_lag: float = 0.0
    min_insync_replicas: int = 2
    replica_lag_time_max: float = 30.0
    replica_fetch_max_wait: float = 0.5
    topics: dict[str, int] = field(default_factory=dict)
    auto_create_topics: bool = True
    default_partitions: int = 3
    max_frame_bytes: int = 100 * 1024 * 1024
    max_message_bytes: int = 1024 * 1024 + 12
    verify_crc: bool = True
    stats_interval: float = 10.0
    shutdown_grace: float = 2.0
    group_min_session_timeout: float = 6.0
    group_max_session_timeout: float = 1800.0
    group_initial_rebalance_delay: float = 3.0

    def __post_init__(self) -> None:
        ints = {
            "port": (0, 65535),
            "followers": (0, 16),
            "min_insync_replicas": (1, 17),
            "default_partitions": (1, 10_000),
            "max_frame_bytes": (64, 2**31 - 1),
            "max_message_bytes": (61, 2**31 - 1),
        }
        for name, (lo, hi) in ints.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if not lo <= value <= hi:
                raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
        for name in (
            "follower_lag",
            "replica_lag_time_max",
            "replica_fetch_max_wait",
            "stats_interval",
            "shutdown_grace",
            "group_min_session_timeout",
            "group_max_session_timeout",
            "group_initial_rebalance_delay",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
            if not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if self.replica_lag_time_max <= 0 or self.replica_fetch_max_wait <= 0:
            raise ValueError("replica_lag_time_max and replica_fetch_max_wait must be > 0")
        if self.group_min_session_timeout > self.group_max_session_timeout:
            raise ValueError(
                "group_min_session_timeout must not exceed group_max_session_timeout, got "
                f"{self.group_min_session_timeout} > {self.group_max_session_timeout}"
            )
        for name in ("host", "advertised_host"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        if not isinstance(self.topics, dict):
            raise TypeError(f"topics must be a dict, got {type(self.topics).__name__}")
        for topic, count in self.topics.items():
            if not isinstance(topic, str) or not TOPIC_NAME.match(topic):
                raise ValueError(f"topics: invalid topic name {topic!r}")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"topics: {topic!r} needs a positive partition count")

    @classmethod
    def field_names(cls) -> list[str]:
        """The setting names, for command-line parsing."""
        return [f.name for f in fields(cls)]


def min_insync_replicas_entry(cfg: BrokerConfig) -> ConfigEntry:
    return ConfigEntry(
        "min.insync.replicas",
        str(cfg.min_insync_replicas),
        ConfigType.INT,
        "Smallest ISR that accepts acks=all.",
    )


def max_message_bytes_entry(name: str, cfg: BrokerConfig) -> ConfigEntry:
    return ConfigEntry(
        name,
        str(cfg.max_message_bytes),
        ConfigType.INT,
        "Largest records field of one partition in a produce.",
    )
