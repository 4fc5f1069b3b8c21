"""What a traced wait costs: ``trace_waits`` against a plain span around the ``await``.

``python -m aiopurgatory.bench.tracing`` parks ``--waits`` requests, each a task
that awaits ``purgatory.watch(op, [its key])``, then completes them all with
``check_and_complete`` of each key inside one "POST" span, and times the CPU of
that (``time.process_time``) in three variants, in turns, each round in a new
order:

* ``off``: no tracing (the floor);
* ``trace_waits``: :func:`aiopurgatory.tracing.trace_waits` on the purgatory (a
  span per wait, with its attributes and the link to the POST span);
* ``span``: the yardstick, ``tracer.start_as_current_span("wait")`` around each
  ``await purgatory.watch(...)``, no tracing of the purgatory.

Spans go to a real SDK ``TracerProvider`` with a ``SimpleSpanProcessor`` and an
exporter that drops them (what the SDK itself costs, no I/O). It prints, per
variant, the median CPU per wait over the rounds, and the extra CPU per wait of
each traced variant over ``off``; ``--json`` prints them as JSON.

Needs ``opentelemetry-sdk`` beside the ``otel`` extra (the test extra has it).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

try:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
except ImportError as exc:  # pragma: no cover - the test extra has it
    raise ImportError(
        "aiopurgatory.bench.tracing needs opentelemetry-sdk: pip install opentelemetry-sdk"
    ) from exc

import aiopurgatory as ap
from aiopurgatory.tracing import trace_waits

__all__ = ["VARIANTS", "main", "run_round"]

VARIANTS = ("off", "trace_waits", "span")


class _Dropped(SpanExporter):
    """Takes every span and keeps none: the SDK's own cost, without I/O."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class _Ready(ap.DelayedOperation):
    __slots__ = ()

    def try_complete(self) -> bool:
        return self.keys != () and self.force_complete()


async def _round(variant: str, waits: int, provider: TracerProvider) -> float:
    purgatory: ap.Purgatory[_Ready] = ap.Purgatory("bench")
    tracer = provider.get_tracer("bench")

    async def plain(key: int) -> ap.Outcome:
        return await purgatory.watch(_Ready(60.0), [key])

    async def in_span(key: int) -> ap.Outcome:
        with tracer.start_as_current_span("wait"):
            return await purgatory.watch(_Ready(60.0), [key])

    request = in_span if variant == "span" else plain
    tracing = trace_waits(purgatory, tracer_provider=provider) if variant == "trace_waits" else None
    try:
        start = time.process_time()
        tasks = [asyncio.ensure_future(request(key)) for key in range(waits)]
        await asyncio.sleep(0)  # every request parked
        with tracer.start_as_current_span("POST"):
            for key in range(waits):
                purgatory.check_and_complete(key)
        outcomes = await asyncio.gather(*tasks)
        cpu = time.process_time() - start
    finally:
        if tracing is not None:
            tracing.close()
    if outcomes.count(ap.Outcome.COMPLETED) != waits:
        raise RuntimeError(f"{variant}: not every wait completed")
    return cpu


def run_round(variant: str, waits: int, loop: str = "asyncio") -> float:
    """CPU seconds of one round of ``variant`` with ``waits`` requests, in a new loop.

    Raises:
        ValueError: an unknown ``variant`` or ``loop``; ``waits`` below 1.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    if waits < 1:
        raise ValueError(f"waits must be at least 1, got {waits}")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_Dropped()))
    if loop == "asyncio":
        runner = asyncio.Runner()
    elif loop == "uvloop":
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    else:
        raise ValueError(f"loop must be asyncio or uvloop, got {loop!r}")
    gc.collect()
    try:
        with runner:
            return runner.run(_round(variant, waits, provider))
    finally:
        provider.shutdown()


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark from the command line; returns what it printed."""
    parser = argparse.ArgumentParser(prog="python -m aiopurgatory.bench.tracing")
    parser.add_argument("--waits", type=int, default=20_000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of each variant")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.waits < 1 or args.rounds < 1:
        parser.error("--waits and --rounds must be at least 1")
    cpu: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for round_number in range(args.rounds):
        # Each round in a new order, so that no variant always runs first.
        shift = round_number % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            cpu[variant].append(run_round(variant, args.waits, args.loop))
    per_wait = {v: statistics.median(cpu[v]) / args.waits * 1e6 for v in VARIANTS}
    result: dict[str, Any] = {
        "waits": args.waits,
        "rounds": args.rounds,
        "loop": args.loop,
        "compiled": ap.COMPILED,
        "cpu_per_wait_us": per_wait,
        "extra_per_wait_us": {v: per_wait[v] - per_wait["off"] for v in ("trace_waits", "span")},
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        core = "compiled" if ap.COMPILED else "pure Python"
        print(f"{args.waits} waits x {args.rounds} rounds, {args.loop}, {core} core")
        for variant in VARIANTS:
            extra = "" if variant == "off" else f"  (+{per_wait[variant] - per_wait['off']:.2f})"
            print(f"  {variant:12} {per_wait[variant]:7.2f} us CPU per wait{extra}")
    return result


if __name__ == "__main__":
    main()
