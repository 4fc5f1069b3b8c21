"""The RQ worker of ``aiopurgatory bench jobs``: ``python -m`` this module ``URL``.

A ``SimpleWorker`` (jobs in its own process, no fork per job) on queue ``bench``:
the library's ``PublishingSimpleWorker`` in mode ``triggers``, RQ's own in mode
``poll``.
"""

from __future__ import annotations

import os
import sys

import redis
from rq import Queue
from rq.worker import SimpleWorker


def main() -> None:
    connection = redis.Redis.from_url(sys.argv[1])
    worker_class: type[SimpleWorker] = SimpleWorker
    if os.environ.get("AIOPURGATORY_BENCH_MODE", "triggers") == "triggers":
        from ..jobs.rq import PublishingSimpleWorker

        worker_class = PublishingSimpleWorker
    worker_class([Queue("bench", connection=connection)], connection=connection).work()


if __name__ == "__main__":
    main()
