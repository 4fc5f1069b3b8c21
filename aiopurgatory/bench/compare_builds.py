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

``--workload timer``, ``--workload purgatory`` and ``--workload acks`` run the ``ap``
implementation of ``bench timer``, ``bench purgatory`` and its acks=all workload (each
build's own :func:`.timer.run_timer`, :func:`.purgatory.run_purgatory` and
:func:`.acks.run_acks`; acks at its defaults, 1,000 requests pending per partition, CPU
per trigger; ``--acks-impl``, default ``advance``) with the parameters ``aiopurgatory
bench all`` gives them, one cell per invocation: ``--loop`` and, for the purgatory,
``--scenario`` (``low-timeout`` and ``high-timeout``: 200,000 requests completed with
``force_complete``; ``check`` and ``clock``: 100,000 at 20,000 req/s completed through
``check_and_complete``). How a build's core compares with another's on the figures
``make bench`` reports for aiopurgatory itself::

    python -m aiopurgatory.bench.compare_builds --other /tmp/before --workload timer --loop uvloop

Every run prints which package it imported and whether its core is compiled
(``AIOPURGATORY_NO_EXTENSIONS=1`` in the environment reaches both builds).
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

from . import acks as acks_bench
from . import purgatory as purgatory_bench
from . import timer as timer_bench
from .realistic import DEFAULTS, IMPLS

__all__ = ["main"]


# The histogram recorder of either build (named _histogram before issue 41's renames).
_IMPORT_RECORDER = """\
try:
    import aiopurgatory._duration_counts as h
except ImportError:
    import aiopurgatory._histogram as h"""

_REALISTIC = """
import json, sys
{IMPORT_RECORDER}
from aiopurgatory.bench.realistic import run_realistic
spec = json.loads(sys.argv[1])
r = run_realistic(spec['impl'], spec['loop'], **spec['params'])
r['histograms'] = h.compiled_in()
print(json.dumps(r))
""".replace("{IMPORT_RECORDER}", _IMPORT_RECORDER)

_MICRO = """
import asyncio, json, sys, time, aiopurgatory as ap
{IMPORT_RECORDER}
num = json.loads(sys.argv[1])['params']['num']
async def main():
    p = ap.Purgatory('micro')
    ops = [ap.DelayedOperation(10.0) for _ in range(num)]
    watch = p.try_complete_else_watch
    t0 = time.process_time()
    for i, op in enumerate(ops):
        watch(op, [i])
        if i % 1000 == 999:
            await asyncio.sleep(0)  # staged ops reach the wheel, as on a server
    for op in ops:
        op.force_complete()
    return time.process_time() - t0
cpu = asyncio.run(main())
print(json.dumps({'cpu_s': cpu, 'cpu_us_per_op': cpu / num * 1e6, 'histograms': h.compiled_in()}))
""".replace("{IMPORT_RECORDER}", _IMPORT_RECORDER)

# The bench suites' own ap implementations, as `aiopurgatory bench all` runs them.
_SUITE = """
import json, sys, aiopurgatory as ap
{IMPORT_RECORDER}
from aiopurgatory.bench._common import quiet_logging
from aiopurgatory.bench.acks import run_acks
from aiopurgatory.bench.purgatory import run_purgatory
from aiopurgatory.bench.timer import run_timer
quiet_logging()
spec = json.loads(sys.argv[1])
run = {'timer': run_timer, 'purgatory': run_purgatory, 'acks': run_acks}[spec['workload']]
r = run(spec.get('impl', 'ap'), spec['loop'], **spec['params'])
r.update(histograms=h.compiled_in(), package=ap.__file__, compiled=ap.COMPILED)
print(json.dumps(r))
""".replace("{IMPORT_RECORDER}", _IMPORT_RECORDER)

#: ``--scenario`` of ``--workload purgatory``: the cases of ``bench all``.
PURGATORY_CASES = ("low-timeout", "high-timeout", "check", "clock")


def _suite_params(workload: str, scenario: str, seed: int) -> dict[str, Any]:
    """The params ``aiopurgatory bench all`` runs the timer or purgatory ``ap`` cell with."""
    if workload == "timer":
        return dict(timer_bench.DEFAULTS, seed=seed)
    if workload == "acks":
        return dict(acks_bench.DEFAULTS)
    base = dict(purgatory_bench.DEFAULTS, seed=seed)
    if scenario in purgatory_bench.SCENARIOS:
        pct75, pct50 = purgatory_bench.SCENARIOS[scenario]
        return dict(base, pct75=pct75, pct50=pct50)
    # Kafka's completion (check_and_complete), as suite_purgatory.completion_cases.
    pct75, pct50 = purgatory_bench.SCENARIOS["low-timeout"]
    return dict(base, pct75=pct75, pct50=pct50, num=100_000, rate=20_000.0, completion=scenario)


def _per_op_us(workload: str, result: dict[str, Any], num: int) -> float:
    """CPU per timer, per request or per operation of one run, in microseconds."""
    if workload == "timer":
        return float(result["cpu_s"]) / int(result["n"]) * 1e6
    if workload == "purgatory":
        return float(result["cpu_us_per_request"])
    if workload == "acks":
        return float(result["cpu_us_per_trigger"])
    return float(result["cpu_s"]) / num * 1e6


def _run(pythonpath: str | None, spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    if spec.get("workload") in ("timer", "purgatory", "acks"):
        code = _SUITE
    else:
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
    p.add_argument(
        "--workload",
        choices=("realistic", "micro", "timer", "purgatory", "acks"),
        default="realistic",
    )
    p.add_argument(
        "--scenario",
        choices=PURGATORY_CASES,
        default="low-timeout",
        help="the case of --workload purgatory",
    )
    p.add_argument("--seed", type=int, default=1, help="of --workload timer and purgatory")
    p.add_argument(
        "--acks-impl",
        choices=tuple(acks_bench.IMPLS),
        default="advance",
        help="the implementation --workload acks runs (default: advance, try_complete)",
    )
    p.add_argument("--json", help="also write every run's result to this file")
    args = p.parse_args(argv)
    spec: dict[str, Any]
    if args.workload in ("timer", "purgatory", "acks"):
        spec = {
            "workload": args.workload,
            "loop": args.loop,
            "params": _suite_params(args.workload, args.scenario, args.seed),
        }
        if args.workload == "acks":
            spec["impl"] = args.acks_impl
    else:
        spec = {
            "impl": "micro" if args.workload == "micro" else args.impl,
            "loop": args.loop,
            "params": {"num": args.num, "completion": args.completion},
        }
    per_op: dict[str, list[float]] = {"A": [], "B": []}
    ratios = []
    runs: list[dict[str, Any]] = []
    packages: dict[str, str] = {}
    for i in range(args.rounds):
        order = [(None, "A"), (args.other, "B")]
        if i % 2:
            order.reverse()
        cpu = {}
        for path, name in order:
            result = _run(path, spec)
            runs.append(dict(result, build=name, round=i + 1))
            cpu[name] = result["cpu_s"]
            cpu[name + "_hist"] = result["histograms"]
            per_op[name].append(_per_op_us(args.workload, result, args.num))
            if "package" in result:
                _check_package(packages, name, result)
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"spec": spec, "ratios": ratios, "runs": runs}, f, indent=1)
            f.write("\n")
    return 0


def _check_package(packages: dict[str, str], name: str, result: dict[str, Any]) -> None:
    """Print the package build ``name`` imported the first time; stop if it changes
    or if both builds imported the same one."""
    package = result["package"]
    if name not in packages:
        packages[name] = package
        core = "compiled" if result["compiled"] else "pure Python"
        print(f"{name}: {package} ({core} core)", flush=True)
        if len(set(packages.values())) < len(packages):
            raise SystemExit(f"both builds imported {package}: is --other a built tree?")
    elif packages[name] != package:
        raise SystemExit(f"build {name} imported {package}, earlier {packages[name]}")


if __name__ == "__main__":
    sys.exit(main())
