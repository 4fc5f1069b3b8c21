"""End-to-end demo: gen-trace -> replay (a timeout sweep) -> analyze a live event log -> reports.

Run with ``python -m aiopurgatory.pipeline.demo [--out DIR] [--requests N] [--master M]``
(``make pipeline``). Steps:

1. generate a synthetic trace (``gen-trace``);
2. replay it on Spark through the real purgatory for three timeouts (``replay``);
3. record a real op event log by running a purgatory on virtual time with an
   :class:`~aiopurgatory.events.EventRecorder` (plus two deliberately broken
   lines), then ``analyze`` it;
4. print where the reports are.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path

__all__ = ["main", "write_sample_event_log"]


def write_sample_event_log(path: Path, *, ops: int = 2000, seed: int = 0) -> int:
    """Write a real event log: ``ops`` produce-like ops in a purgatory on virtual time.

    Ops wait for a random number of acknowledgements arriving at log-normal delays;
    some never get enough and expire. Two malformed lines are appended on purpose
    (the analysis must count and locate them). Returns the number of events written.
    """
    from .. import simulation
    from .._purgatory import Purgatory
    from ..events import EventRecorder
    from .replay_core import ReplayedProduce, _quiet_logger

    rng = random.Random(seed)

    async def run() -> int:
        loop = asyncio.get_running_loop()
        with EventRecorder(path, clock=loop.time) as recorder:
            purgatory: Purgatory[ReplayedProduce] = Purgatory(
                "demo-produce", logger=_quiet_logger()
            )
            recorder.attach(purgatory)
            for i in range(ops):
                await asyncio.sleep(rng.expovariate(500.0))
                key = f"topic-{rng.randrange(3)}-{int(rng.paretovariate(1.2)) % 8}"
                op = ReplayedProduce(0.1, i, required=2)
                purgatory.try_complete_else_watch(op, [key])
                delay = rng.lognormvariate(-4.5, 1.2)

                def ack(op: ReplayedProduce = op, key: str = key) -> None:
                    op.acked += 1
                    purgatory.check_and_complete(key)

                if rng.random() > 0.02:
                    loop.call_later(delay, ack)
            await asyncio.sleep(1.0)
            purgatory.close()
            return recorder.events

    events = simulation.run(run())
    with path.open("a", encoding="utf-8") as file:
        file.write("this line is not JSON\n")
        file.write('{"schema": 1, "event": "aiopurgatory.op_finished", "outcome": "completed"}\n')
    return events


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the exit status."""
    from .._clitools import Parser

    parser = Parser(
        prog="python -m aiopurgatory.pipeline.demo",
        description="gen-trace -> replay (three timeouts) -> record an event log -> analyze.",
    )
    parser.add_argument(
        "--out", default="pipeline-demo", help="output directory (its runs are replaced)"
    )
    parser.add_argument("--requests", type=int, default=100_000, help="requests in the trace")
    parser.add_argument("--master", default="local[*]", help="Spark master")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    from . import analyze, replay, trace

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    trace_path = out / "trace.parquet"
    steps = [
        (
            "gen-trace",
            trace.main,
            ["--out", str(trace_path), "--requests", str(args.requests), "--brokers", "3"],
        ),
        (
            "replay",
            replay.main,
            [
                str(trace_path),
                "--out",
                str(out / "replay"),
                "--timeout",
                "0.05,0.2,1",
                "--master",
                args.master,
                "--overwrite",
            ],
        ),
    ]
    for name, run, step_args in steps:
        print(f"== aiopurgatory {name} {' '.join(step_args)}", file=sys.stderr)
        status = run(step_args)
        if status:
            return status
    events_path = out / "events" / "demo.jsonl"
    events_path.parent.mkdir(parents=True, exist_ok=True)
    events_path.unlink(missing_ok=True)
    count = write_sample_event_log(events_path)
    print(f"== wrote {count} events (+2 malformed lines) to {events_path}", file=sys.stderr)
    analyze_args = [
        str(events_path.parent),
        "--out",
        str(out / "analysis"),
        "--master",
        args.master,
    ]
    analyze_args += ["--interval", "0.5", "--overwrite"]
    print(f"== aiopurgatory analyze {' '.join(analyze_args)}", file=sys.stderr)
    status = analyze.main(analyze_args)
    if status:
        return status
    print(
        f"== done in {time.perf_counter() - started:.1f} s: reports "
        f"{out / 'replay' / 'report.md'} and {out / 'analysis' / 'report.md'}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
