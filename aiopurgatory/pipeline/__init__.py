"""The data pipeline on Apache Spark (extra: ``spark``): event analytics and trace replay.

* ``aiopurgatory analyze EVENTS... --out DIR`` (:mod:`.analyze`): op event logs
  (:mod:`aiopurgatory.events`, schema 2 or 1) -> Parquet facts, rollups, hot keys,
  a Markdown report with plots.
* ``aiopurgatory replay TRACE --out DIR`` (:mod:`.replay`): a request trace replayed
  through the real :class:`~aiopurgatory.Purgatory` on virtual time inside Spark
  tasks, with what-if sweeps; the same fact table and report.
* ``aiopurgatory gen-trace`` (:mod:`.trace`): a synthetic trace.
* ``python -m aiopurgatory.pipeline.demo``: all three, end to end.

Importing this package imports nothing heavy; pyspark, pandas, pyarrow,
matplotlib and rich load inside the functions that need them. See
``docs/pipeline.md``.
"""

from __future__ import annotations

__all__: list[str] = []
