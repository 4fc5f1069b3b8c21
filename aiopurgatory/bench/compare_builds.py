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


def _run(pythonpath: str | None, spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    code = (
        "import json, sys, aiopurgatory._histogram as h\n"
        "from aiopurgatory.bench.realistic import run_realistic\n"
        "spec = json.loads(sys.argv[1])\n"
        "r = run_realistic(spec['impl'], spec['loop'], **spec['params'])\n"
        "r['histograms'] = h.compiled_in()\n"
        "print(json.dumps(r))\n"
    )
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
    args = p.parse_args(argv)
    spec = {
        "impl": args.impl,
        "loop": args.loop,
        "params": {"num": args.num, "completion": args.completion},
    }
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
        ratio = cpu["A"] / cpu["B"]
        ratios.append(ratio)
        print(
            f"round {i + 1}: A {cpu['A']:.3f} s (histograms {cpu['A_hist']}), "
            f"B {cpu['B']:.3f} s (histograms {cpu['B_hist']}), A/B {ratio:.4f}",
            flush=True,
        )
    print(
        f"median A/B {statistics.median(ratios):.4f} over {len(ratios)} rounds "
        f"(min {min(ratios):.4f}, max {max(ratios):.4f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
