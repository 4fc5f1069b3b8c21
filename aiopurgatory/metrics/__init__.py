"""Metrics adapters: export purgatory statistics to Prometheus or OpenTelemetry.

Both adapters read :meth:`Purgatory.statistics() <aiopurgatory.Purgatory.statistics>`
of the purgatories registered with them *when metrics are collected* (at scrape
or export time). Nothing runs on the purgatory's hot path and nothing is
counted twice: the purgatory's own integer counters are the source of truth.

* :mod:`aiopurgatory.metrics.prometheus`: a ``prometheus_client`` collector
  (extra ``aiopurgatory[prometheus]``).
* :mod:`aiopurgatory.metrics.otel`: OpenTelemetry observable instruments,
  depending only on ``opentelemetry-api`` (extra ``aiopurgatory[otel]``).

Importing this package imports neither client library; each submodule imports
its own on first import, and names the extra to install if it is missing.

Metrics, each labelled with the purgatory's name (label/attribute ``purgatory``),
as Prometheus name / OpenTelemetry name:

* ``aiopurgatory_purgatory_size`` / ``aiopurgatory.purgatory.size`` (gauge):
  entries in all watch lists (``watched``, Kafka's ``PurgatorySize``).
* ``aiopurgatory_pending_operations`` / ``aiopurgatory.pending_operations``
  (gauge): operations watched and not finished, all in the timer (``pending``,
  Kafka's ``NumDelayedOperations``; what ``max_pending`` limits).
* ``aiopurgatory_watch_keys`` / ``aiopurgatory.watch_keys`` (gauge): keys with
  a non-empty watch list.
* ``aiopurgatory_operations_total`` / ``aiopurgatory.operations`` (counter, extra
  label ``outcome``): running totals of finished operations by outcome
  (``completed``, ``expired``, ``cancelled``, ``failed``).
"""

from .._namespace import public_dir as _public_dir

# The submodules are reachable as attributes, but star-imports export nothing:
# each needs its own optional dependency.
__all__: list[str] = []

_SUBMODULES = frozenset({"otel", "prometheus"})


def __getattr__(name: str) -> object:
    # Load a submodule (and with it its client library) only when asked for.
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__dir__ = _public_dir(__name__, _SUBMODULES)
