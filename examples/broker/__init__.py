"""A small Kafka-protocol broker whose waits are aiopurgatory delayed operations.

Real, unmodified Kafka clients (aiokafka) produce with ``acks=all`` and consume
from it: an ``acks=all`` produce parks a :class:`DelayedProduce` until in-process
follower replicas have fetched its batches and the high watermark passes them; a
consumer's long-poll fetch parks a :class:`DelayedFetch` until ``min_bytes`` are
readable or ``max_wait_ms`` passes. Consumer groups (``group_id`` set) are
coordinated by a :class:`GroupCoordinator` whose join phases (:class:`DelayedJoin`)
and member sessions (:class:`DelayedHeartbeat`) are delayed operations too.
Admin clients create, describe and delete topics and groups, and idempotent
producers get producer ids; their retried batches are recognised by sequence
number (:mod:`examples.broker.idempotence`) and never appended twice.
Run it with ``python -m examples.broker``; see ``docs/broker.md``.
"""

from __future__ import annotations

from .coordinator import DelayedHeartbeat, DelayedJoin, DelayedSync, GroupCoordinator
from .operations import DelayedFetch, DelayedProduce
from .partition import TopicPartition
from .server import Broker, BrokerConfig

__all__ = [
    "Broker",
    "BrokerConfig",
    "DelayedFetch",
    "DelayedHeartbeat",
    "DelayedJoin",
    "DelayedProduce",
    "DelayedSync",
    "GroupCoordinator",
    "TopicPartition",
]
