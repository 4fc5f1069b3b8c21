"""One broker's requests as a replay plan: request order, watch keys, and the events in time order.

Columnar (numpy, pyarrow): a request's arrival and each acknowledgement it
waits for become events sorted by time, ties broken so that a replay is exact.
:mod:`aiopurgatory.pipeline.replay_core` drives the purgatory through the plan
and :mod:`aiopurgatory.pipeline.replay_facts` builds the facts from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .replay_model import ReplayParams

__all__: list[str] = []


_ARRIVAL = 0


_ACK = 1


@dataclass(slots=True)
class _Plan:
    """One broker's requests in replay order, and the time-sorted events to replay.

    ``times``, ``kinds`` and ``index`` are the events (Python lists: the replay
    loop reads them one by one); the arrays, indexed by request position in
    replay order, are what the facts are built from.
    """

    times: list[float]
    kinds: list[int]
    index: list[int]
    keys: list[str]
    request_ids: list[int]
    required: list[int]
    request_id: Any  # int64 array
    arrival: Any  # float64 array
    needs: Any  # int64 array: replicas required (1: completes when watched)
    key_index: Any  # int64 array into key_names
    key_names: list[str]


def _column(table: Any, name: str, dtype: str) -> Any:
    """A trace column as a numpy array of ``dtype``; nulls refused."""
    import pyarrow as pa

    column = table.column(name)
    if column.null_count:
        raise ValueError(f"requests: {name} must not be null")
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _partition_keys(table: Any, order: Any) -> tuple[Any, list[str]]:
    """Each request's watch key ``topic-partition``, as indices into the distinct keys.

    Strings are made once per distinct key, not once per request.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    topic = table.column("topic")
    if topic.null_count:
        raise ValueError("requests: topic must not be null")
    encoded = pc.dictionary_encode(topic)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.unify_dictionaries().combine_chunks()
    topics = encoded.dictionary.to_pylist()
    topic_index = encoded.indices.to_numpy(zero_copy_only=False).astype("int64")[order]
    partition = _column(table, "partition", "int64")[order]
    if not len(partition):
        return np.empty(0, dtype="int64"), []
    low = int(partition.min())
    width = int(partition.max()) - low + 1
    distinct, key_index = np.unique(topic_index * width + (partition - low), return_inverse=True)
    names = [f"{topics[code // width]}-{code % width + low}" for code in distinct.tolist()]
    return key_index.astype("int64", copy=False), names


def _delay_matrix(delays: Any, rows: Any) -> Any:
    """The ``replica_delays`` of ``rows`` as a float64 matrix, or None if ragged or null.

    Null and non-finite delays become ``inf`` (never).
    """
    import numpy as np
    import pyarrow as pa

    if isinstance(delays, pa.ChunkedArray):
        delays = delays.combine_chunks()
    if delays.null_count:
        return None
    offsets = delays.offsets.to_numpy()
    lengths = np.diff(offsets)
    if not len(lengths) or (lengths != lengths[0]).any():
        return None if len(lengths) else np.empty((0, 0))
    width = int(lengths[0])
    values = delays.flatten().to_numpy(zero_copy_only=False).astype("float64")
    matrix = values.reshape(len(lengths), width)[rows]
    matrix[~np.isfinite(matrix)] = np.inf
    return matrix


def _first_acks(
    arrival: Any, delays: Any, waiting: Any, needed: int, request_id: Any
) -> tuple[Any, Any]:
    """The ``needed`` earliest finite acknowledgement times of each waiting request.

    ``delays`` is the trace's ``replica_delays`` column in replay order.
    Returns (times, request indices), request by request, earliest first;
    requests with fewer than ``needed`` finite delays get none (they expire).

    Raises:
        ValueError: a request that gets acknowledgements has a negative delay.
    """
    import numpy as np

    matrix = _delay_matrix(delays, waiting)
    if matrix is None:
        # Ragged or null delay lists: one request at a time.
        return _first_acks_ragged(arrival, delays.to_pylist(), waiting, needed, request_id)
    if not len(waiting) or matrix.shape[1] < needed:
        return np.empty(0, dtype="float64"), np.empty(0, dtype="int64")
    matrix.sort(axis=1)
    enough = np.isfinite(matrix[:, needed - 1])
    rows = waiting[enough]
    negative = matrix[enough, 0] < 0
    if negative.any():
        i = int(rows[np.argmax(negative)])
        raise ValueError(f"requests: negative replica delay in request {request_id[i]}")
    times = (arrival[rows][:, None] + matrix[enough, :needed]).ravel()
    return times, np.repeat(rows, needed)


def _first_acks_ragged(
    arrival: Any, delays: list[Any], waiting: Any, needed: int, request_id: Any
) -> tuple[Any, Any]:
    import numpy as np

    isfinite = math.isfinite
    ack_time: list[float] = []
    ack_index: list[int] = []
    for i in waiting.tolist():
        raw = delays[i]
        if raw is None:
            continue
        finite = sorted(d for d in raw if d is not None and isfinite(d))
        if len(finite) < needed:
            continue  # can never reach min_insync: it will expire
        if finite[0] < 0:
            raise ValueError(f"requests: negative replica delay in request {request_id[i]}")
        start = arrival[i]
        for d in finite[:needed]:
            ack_time.append(start + d)
            ack_index.append(i)
    return np.asarray(ack_time, dtype="float64"), np.asarray(ack_index, dtype="int64")


def _plan(requests: Any, params: ReplayParams) -> _Plan:
    """Order requests (by arrival, then request id) and list the events in time order."""
    import numpy as np

    arrival = _column(requests, "arrival", "float64")
    request_id = _column(requests, "request_id", "int64")
    if len(arrival) and not np.isfinite(arrival).all():
        raise ValueError("requests: arrival must be finite")
    order = np.lexsort((request_id, arrival))
    arrival = arrival[order]
    request_id = request_id[order]
    acks = _column(requests, "acks", "int64")[order]
    key_index, key_names = _partition_keys(requests, order)
    n = len(order)
    needs = np.where(acks == -1, params.min_insync, 1).astype("int64")
    needed = params.min_insync - 1
    if needed > 0:
        delays = requests.column("replica_delays").take(order)
        waiting = np.flatnonzero(acks == -1)
        ack_time, ack_index = _first_acks(arrival, delays, waiting, needed, request_id)
    else:
        ack_time, ack_index = np.empty(0, dtype="float64"), np.empty(0, dtype="int64")
    times = np.concatenate([arrival, ack_time])
    kinds = np.concatenate(
        [np.full(n, _ARRIVAL, dtype="int8"), np.full(len(ack_time), _ACK, dtype="int8")]
    )
    index = np.concatenate([np.arange(n, dtype="int64"), ack_index])
    # Ties: arrivals before acks, then trace order; fixed, so replays are exact.
    sort = np.lexsort((index, kinds, times))
    return _Plan(
        times=times[sort].tolist(),
        kinds=kinds[sort].tolist(),
        index=index[sort].tolist(),
        keys=np.array(key_names, dtype=object)[key_index].tolist() if n else [],
        request_ids=request_id.tolist(),
        required=needs.tolist(),
        request_id=request_id,
        arrival=arrival,
        needs=needs,
        key_index=key_index,
        key_names=key_names,
    )
