"""Spark's hash partitioning, computed in Python: which task of a ``repartition`` a key lands in.

:func:`spark_hash_int` is Spark's ``hash()`` of an int (Murmur3 x86 32-bit, seed
42), and :func:`_task_keys` finds a key for each task, so that
:func:`~aiopurgatory.pipeline.replay.replay_spark` gives each replay group a task
of its own. :mod:`aiopurgatory.pipeline.replay` re-exports :func:`spark_hash_int`.
"""

from __future__ import annotations

__all__ = ["spark_hash_int"]


_MASK = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of an int column value (Murmur3 x86 32-bit, seed 42).

    Hash partitioning (``repartition(n, col)``) puts a row in partition
    ``pmod(hash(col), n)``; :func:`replay_spark` uses it to give each replay
    group a task of its own. (The tests check it against Spark's ``F.hash``.)
    """
    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = _rotl(k1, 15) * 0x1B873593 & _MASK
    h1 = (seed & _MASK) ^ k1
    h1 = (_rotl(h1, 13) * 5 + 0xE6546B64) & _MASK
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


def _task_keys(tasks: int) -> list[int]:
    """For each task ``t`` of a ``repartition(tasks, key)``, an int key that lands in it."""
    keys: dict[int, int] = {}
    candidate = 0
    while len(keys) < tasks:
        keys.setdefault(spark_hash_int(candidate) % tasks, candidate)
        candidate += 1
    return [keys[t] for t in range(tasks)]
