"""The same benchmark run on two builds of aiopurgatory, in turns: what a build choice costs.

Used to measure the always-on histograms: build a copy of the package with them
compiled out, then compare (see ``docs/benchmarks.md``)::

    git archive HEAD | tar -x -C /tmp/nohist
    (cd /tmp/nohist && AIOPURGATORY_NO_HISTOGRAMS=1 python setup.py build_ext --inplace)
    python -m aiopurgatory.bench.compare_builds --other /tmp/nohist --rounds 8

Each round runs the realistic workload (:mod:`.realistic`, ``ap`` by default)
once on this build (A) and once on the other (B, first on ``PYTHONPATH``), in
alternating order, each in a fresh process; the CPU of the timed part of each
run is paired and the ratio A/B reported per round and as the median. Pairing
keeps the ratio meaningful while the machine's speed drifts.

``--workload micro`` instead times the purgatory's own path alone, where a
per-operation cost shows most: ``num`` operations watched under one key each and
completed with ``force_complete()`` (every one scheduled, so every one reads the
clock when it finishes), no tasks, on the asyncio loop; it reports the CPU per
operation of both builds and their difference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from .realistic import DEFAULTS, IMPLS

__all__ = ["main"]


_REALISTIC = """
import json, sys, aiopurgatory._histogram as h
from aiopurgatory.bench.realistic import run_realistic
spec = json.loads(sys.argv[1])
r = run_realistic(spec['impl'], spec['loop'], **spec['params'])
r['histograms'] = h.compiled_in()
print(json.dumps(r))
"""

_MICRO = """
import asyncio, json, sys, time, aiopurgatory as ap, aiopurgatory._histogram as h
num = json.loads(sys.argv[1])['params']['num']
async def main():
    p = ap.Purgatory('micro')
    ops = [ap.DelayedOperation(10.0) for _ in range(num)]
    watch = p.try_complete_else_watch
    t0 = time.process_time()
    for i, op in enumerate(ops):
        watch(op, (i,))
        if i % 1000 == 999:
            await asyncio.sleep(0)  # staged ops reach the wheel, as on a server
    for op in ops:
        op.force_complete()
    return time.process_time() - t0
cpu = asyncio.run(main())
print(json.dumps({'cpu_s': cpu, 'cpu_us_per_op': cpu / num * 1e6, 'histograms': h.compiled_in()}))
"""


def _run(pythonpath: str | None, spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    code = _MICRO if spec["impl"] == "micro" else _REALISTIC
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; prints one line per round and the median ratio, returns 0."""
    p = argparse.ArgumentParser(prog="python -m aiopurgatory.bench.compare_builds")
    p.add_argument("--other", required=True, help="directory holding the other build's package")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--impl", choices=tuple(IMPLS), default="ap")
    p.add_argument("--loop", default="asyncio")
    p.add_argument("--num", type=int, default=DEFAULTS["num"])
    p.add_argument("--completion", default="check")
    p.add_argument("--workload", choices=("realistic", "micro"), default="realistic")
    args = p.parse_args(argv)
    spec = {
        "impl": "micro" if args.workload == "micro" else args.impl,
        "loop": args.loop,
        "params": {"num": args.num, "completion": args.completion},
    }
    per_op: dict[str, list[float]] = {"A": [], "B": []}
    ratios = []
    for i in range(args.rounds):
        order = [(None, "A"), (args.other, "B")]
        if i % 2:
            order.reverse()
        cpu = {}
        for path, name in order:
            result = _run(path, spec)
            cpu[name] = result["cpu_s"]
            cpu[name + "_hist"] = result["histograms"]
            per_op[name].append(result["cpu_s"] / args.num * 1e6)
        ratio = cpu["A"] / cpu["B"]
        ratios.append(ratio)
        print(
            f"round {i + 1}: A {cpu['A']:.3f} s (histograms {cpu['A_hist']}), "
            f"B {cpu['B']:.3f} s (histograms {cpu['B_hist']}), A/B {ratio:.4f}",
            flush=True,
        )
    a, b = statistics.median(per_op["A"]), statistics.median(per_op["B"])
    print(
        f"median A/B {statistics.median(ratios):.4f} over {len(ratios)} rounds "
        f"(min {min(ratios):.4f}, max {max(ratios):.4f}); CPU per op: A {a:.3f} us, "
        f"B {b:.3f} us, A - B {a - b:+.3f} us"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
