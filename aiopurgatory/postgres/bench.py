"""Wake latency across processes: PostgresTriggers and RedisTriggers, same machine, same run.

``python -m aiopurgatory.postgres.bench [--wakes N] [--interval S] [--durable] [--output FILE]``

``python -m aiopurgatory.postgres.bench --writers 1,4,16 [--seconds S] [--durable]``
measures instead what ``NOTIFY``'s commit lock costs concurrent writers
(:func:`_writers`): PostgreSQL serialises the commits of transactions that
notified, so their throughput is compared with the same upserts without a
notification.

Starts a throwaway PostgreSQL (:mod:`aiopurgatory.postgres.testing`) and, if
``redis-server`` and the ``redis`` extra are there, a throwaway Redis
(:mod:`aiopurgatory.redis.testing`). For each transport a *waiter* process parks
``--wakes`` operations on one key, thresholds 1..N, and reports when each
completed; this process then advances the key to 1, 2, ... N, one advance every
``--interval`` seconds (``await flush()`` after each), noting when each was made.
A wake's latency is the completion time in the waiter minus the advance's time
here (``time.monotonic()``, one clock for every process of the machine): the
publisher's send, the server, the delivery and the waiter's handling.

``python -m aiopurgatory.postgres.bench --throughput [--triggers N] [--rounds R]
[--durable]`` measures instead trigger throughput and CPU per trigger
(:func:`_throughput`): a publisher makes ``N`` advances as fast as it can, each of
its own key (so none is coalesced with another), one at a time and yielding to
the loop after each, as request handlers do (the transport batches what piles up
meanwhile), while a *sink* process has an operation parked on each key;
throughput is ``N`` over the time from the first advance to the sink's last
completion. CPU seconds per trigger are
read for the publisher (``time.process_time``), the sink, and the server: the sum
of ``utime + stime`` in ``/proc/<pid>/stat`` over the server's processes (the
postmaster and its backends, or ``redis-server``), from before the first advance
to the sink's completion. Rounds alternate the transports' order, so that a
machine loaded by others weighs on both, and the ratios PostgreSQL / Redis are
reported per round.

``python -m aiopurgatory.postgres.bench --job-trigger [--jobs N] [--rounds R]``
measures what the trigger of :mod:`aiopurgatory.jobs.procrastinate` adds to
Procrastinate's ``procrastinate_finish_job`` (:func:`_job_trigger`; needs the
``procrastinate`` extra): the server's time per call inside one transaction of
``N`` calls (``clock_timestamp()``, no round trips), the trigger enabled and
disabled in alternating rounds, and the time of its CRC-32 function per job key.

By default both servers run without durability (PostgreSQL ``fsync=off``,
``synchronous_commit=off``; Redis ``appendfsync no``); ``--durable`` runs them as
in production (PostgreSQL's defaults, Redis ``appendfsync always``), where a
PostgreSQL commit waits for its WAL flush. Prints p50/p90/p99 per transport and,
with ``--output``, writes them as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import aiopurgatory as ap

__all__ = ["main"]

_KEY = "bench-latency"


class _Timed(ap.WatermarkOperation):
    __slots__ = ("completed_at",)

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.completed_at = 0.0

    def on_complete(self) -> None:
        self.completed_at = time.monotonic()


def _triggers(transport: str, url: str, purgatory: ap.Purgatory[Any] | None) -> Any:
    if transport == "postgres":
        from . import PostgresTriggers

        return PostgresTriggers(purgatory, url)
    from ..redis import RedisTriggers

    return RedisTriggers(purgatory, url)


async def _waiter(transport: str, url: str, wakes: int) -> None:
    purgatory: ap.Purgatory[_Timed] = ap.Purgatory("bench")
    async with _triggers(transport, url, purgatory) as triggers:
        ops = [_Timed(600) for _ in range(wakes)]
        waits = [
            asyncio.ensure_future(triggers.watch(op, {_KEY: i + 1})) for i, op in enumerate(ops)
        ]
        part = triggers._listener if transport == "postgres" else triggers._subscriber
        for _ in range(3000):  # listening or subscribed within 30 s
            if part.covers([_KEY]):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the catch-up reads of the watches are done
        print("ready", flush=True)
        await asyncio.gather(*waits)
        print(json.dumps([op.completed_at for op in ops]), flush=True)


async def _publish(transport: str, url: str, wakes: int, interval: float) -> list[float]:
    sent: list[float] = []
    async with _triggers(transport, url, None) as triggers:
        triggers.advance("warm-up", 1)  # the connection and the statement are ready
        await triggers.flush()
        for i in range(1, wakes + 1):
            sent.append(time.monotonic())
            triggers.advance(_KEY, i)
            await triggers.flush()
            await asyncio.sleep(interval)
    return sent


def _measure(transport: str, url: str, wakes: int, interval: float) -> dict[str, Any]:
    waiter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aiopurgatory.postgres.bench",
            "--role",
            "waiter",
            transport,
            url,
            str(wakes),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert waiter.stdout is not None
    try:
        if waiter.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {transport} waiter did not start")
        sent = asyncio.run(_publish(transport, url, wakes, interval))
        done = json.loads(waiter.stdout.readline())
    finally:
        waiter.wait(30)
    latencies = sorted((d - s) * 1000 for d, s in zip(done, sent, strict=True))
    quantiles = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "transport": transport,
        "wakes": wakes,
        "p50_ms": round(statistics.median(latencies), 3),
        "p90_ms": round(quantiles[89], 3),
        "p99_ms": round(quantiles[98], 3),
        "max_ms": round(latencies[-1], 3),
    }


async def _write(dsn: str, writers: int, seconds: float, *, notify: bool) -> int:
    """Commits made by ``writers`` connections in ``seconds``: each one statement,
    the publish of one advance (its own key per writer), with or without its NOTIFY."""
    import asyncpg

    from ._sender import statement_arguments
    from ._sql import publish_sql
    from ._wire import Batch

    statement = publish_sql("aiopurgatory")
    connections = [await asyncpg.connect(dsn) for _ in range(writers)]
    counts = [0] * writers
    stop = time.monotonic() + seconds

    async def write(n: int) -> None:
        conn = connections[n]
        value = 0
        while time.monotonic() < stop:
            value += 1
            batch = Batch()
            batch.advance(f"writer-{n}", value)
            keys, values, channels, payloads = statement_arguments(
                "bench", batch, "aiopurgatory", 64
            )
            if not notify:
                channels, payloads = [], []
            await conn.fetchval(statement, keys, values, channels, payloads)
            counts[n] += 1

    try:
        await asyncio.gather(*(write(n) for n in range(writers)))
    finally:
        for conn in connections:
            await conn.close()
    return sum(counts)


def _writers(dsn: str, counts: list[int], seconds: float) -> list[dict[str, Any]]:
    from . import schema_sql

    async def run() -> list[dict[str, Any]]:
        import asyncpg

        conn = await asyncpg.connect(dsn)
        await conn.execute(schema_sql("aiopurgatory"))
        await conn.close()
        rows = []
        for writers in counts:
            row: dict[str, Any] = {"writers": writers}
            for notify in (False, True):
                commits = await _write(dsn, writers, seconds, notify=notify)
                row["notify" if notify else "plain"] = round(commits / seconds)
            rows.append(row)
        return rows

    return asyncio.run(run())


def _cpu_seconds(pids: Sequence[int]) -> dict[int, float]:
    """User + system CPU seconds of each of ``pids`` so far (all its threads; gone: left out)."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime (14, 15)
    return found


def _cpu_since(before: dict[int, float], pids: Sequence[int]) -> float:
    """CPU seconds ``pids`` used since ``before`` (a process started since: all of its)."""
    return sum(now - before.get(pid, 0.0) for pid, now in _cpu_seconds(pids).items())


async def _sink(transport: str, url: str, prefix: str, keys: int) -> None:
    """The throughput's waiter: one operation per key, completed by the key's advance;
    its connections kept until a line on stdin (their backends' CPU is measured)."""
    purgatory: ap.Purgatory[_Timed] = ap.Purgatory("bench")
    async with _triggers(transport, url, purgatory) as triggers:
        names = [f"{prefix}-{k}" for k in range(keys)]
        ops = [_Timed(600) for _ in names]
        waits = [
            asyncio.ensure_future(triggers.watch(op, {name: 1}))
            for op, name in zip(ops, names, strict=True)
        ]
        part = triggers._listener if transport == "postgres" else triggers._subscriber
        for _ in range(3000):
            if part.covers(names):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        cpu = time.process_time()
        print("ready", flush=True)
        outcomes = await asyncio.gather(*waits)
        if any(outcome is not ap.Outcome.COMPLETED for outcome in outcomes):
            raise RuntimeError("a sink operation did not complete")
        done = max(op.completed_at for op in ops)
        cpu = time.process_time() - cpu
        received = triggers.statistics().received
        print(json.dumps({"done": done, "cpu": cpu, "received": received}), flush=True)
        await asyncio.to_thread(sys.stdin.readline)


async def _flood(
    transport: str,
    url: str,
    prefix: str,
    triggers_count: int,
    sink: Any,
    server_pids: Any,
) -> dict[str, Any]:
    names = [f"{prefix}-{k}" for k in range(triggers_count)]
    async with _triggers(transport, url, None) as triggers:
        triggers.advance("warm-up", 1)
        await triggers.flush()
        before = _cpu_seconds(server_pids())
        cpu = time.process_time()
        started = time.monotonic()
        for i in range(triggers_count):
            triggers.advance(names[i], 1)
            await asyncio.sleep(0)
        await triggers.flush()
        publisher_cpu = time.process_time() - cpu
        line = await asyncio.to_thread(sink.stdout.readline)
        # While every connection is open: their backends' CPU counts.
        server_cpu = _cpu_since(before, server_pids())
        sink.stdin.write("exit\n")
        sink.stdin.flush()
    report = json.loads(line)
    seconds = report["done"] - started
    return {
        "transport": transport,
        "triggers": triggers_count,
        "seconds": round(seconds, 4),
        "triggers_per_s": round(triggers_count / seconds),
        # Microseconds of CPU per trigger.
        "publisher_us": round(publisher_cpu / triggers_count * 1e6, 2),
        "server_us": round(server_cpu / triggers_count * 1e6, 2),
        "sink_us": round(report["cpu"] / triggers_count * 1e6, 2),
        # Messages the sink received: a PostgreSQL notification carries a batch.
        "messages": report["received"],
    }


def _throughput_round(
    transport: str, url: str, triggers_count: int, server_pids: Any
) -> dict[str, Any]:
    prefix = f"bench-flood-{secrets.token_hex(4)}"  # fresh keys: no stored watermark
    sink = subprocess.Popen(
        [
            *(sys.executable, "-m", "aiopurgatory.postgres.bench", "--role", "sink"),
            *(transport, url, f"{prefix},{triggers_count}"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sink.stdout is not None
    try:
        if sink.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {transport} sink did not start")
        return asyncio.run(_flood(transport, url, prefix, triggers_count, sink, server_pids))
    finally:
        sink.wait(60)


def _throughput(args: argparse.Namespace, settings: dict[str, str]) -> int:
    from .testing import PostgresServer

    rounds: list[list[dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as directory, PostgresServer(**settings) as postgres:
        from ..redis.testing import RedisServer

        redis_server = RedisServer(directory, appendfsync="always" if args.durable else "no")
        redis_server.start()
        try:
            assert redis_server.process is not None
            redis_pid = redis_server.process.pid
            servers = {
                "postgres": (postgres.dsn, postgres.pids),
                "redis": (redis_server.url, lambda: [redis_pid]),
            }
            for n in range(args.rounds):
                order = ["postgres", "redis"] if n % 2 == 0 else ["redis", "postgres"]
                rows = {}
                for transport in order:
                    url, pids = servers[transport]
                    rows[transport] = _throughput_round(transport, url, args.triggers, pids)
                rounds.append([rows["postgres"], rows["redis"]])
        finally:
            redis_server.kill()
    ratios = []
    for n, (pg, redis) in enumerate(rounds, 1):
        ratio = {
            name: round(pg[name] / redis[name], 2) if redis[name] else None
            for name in ("triggers_per_s", "publisher_us", "server_us", "sink_us")
        }
        ratios.append(ratio)
        for row in (pg, redis):
            print(
                f"round {n} {row['transport']:>8}: {row['triggers_per_s']:>7} triggers/s  "
                f"CPU per trigger: publisher {row['publisher_us']:.1f} us, "
                f"server {row['server_us']:.1f} us, sink {row['sink_us']:.1f} us "
                f"({row['messages']} messages)"
            )
        print(
            f"round {n} postgres / redis: throughput {ratio['triggers_per_s']}, CPU "
            f"publisher {ratio['publisher_us']}, server {ratio['server_us']}, "
            f"sink {ratio['sink_us']}"
        )
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            json.dump({"durable": args.durable, "rounds": rounds, "ratios": ratios}, out, indent=2)
    return 0


_FINISH_ALL = """
DO $bench$
DECLARE t0 timestamptz; r record;
BEGIN
    t0 := clock_timestamp();
    FOR r IN SELECT id FROM procrastinate_jobs WHERE status = 'todo' ORDER BY id LOOP
        PERFORM procrastinate_finish_job_v1(r.id, 'succeeded', false);
    END LOOP;
    RAISE NOTICE 'elapsed %', extract(epoch FROM clock_timestamp() - t0);
END $bench$;
"""

_CRC_ALL = """
DO $bench$
DECLARE t0 timestamptz; x bigint;
BEGIN
    t0 := clock_timestamp();
    FOR i IN 1 .. {jobs} LOOP
        x := "aiopurgatory_crc32"(convert_to('sjob:procrastinate:' || i::text, 'UTF8'));
    END LOOP;
    RAISE NOTICE 'elapsed %', extract(epoch FROM clock_timestamp() - t0);
END $bench$;
"""


async def _job_trigger_rounds(dsn: str, jobs: int, rounds: int) -> dict[str, Any]:
    import asyncpg
    import procrastinate

    from ..jobs.procrastinate import install

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        await install(app)
    conn = await asyncpg.connect(dsn)
    elapsed: list[float] = []
    conn.add_log_listener(lambda _conn, message: elapsed.append(float(str(message).split()[-1])))

    async def timed(statement: str) -> float:
        # The NOTICE arrives with the statement's answer; its handler runs soon after.
        count = len(elapsed)
        await conn.execute(statement)
        for _ in range(100):
            if len(elapsed) > count:
                break
            await asyncio.sleep(0.01)
        return elapsed[-1] / jobs * 1e6

    try:
        crc_us = await timed(_CRC_ALL.format(jobs=jobs))
        rows = []
        for n in range(rounds):
            row: dict[str, Any] = {}
            for on in (True, False) if n % 2 == 0 else (False, True):
                switch = "ENABLE" if on else "DISABLE"
                trigger = '"aiopurgatory_procrastinate_ends"'
                await conn.execute(f"ALTER TABLE procrastinate_jobs {switch} TRIGGER {trigger}")
                await conn.execute(
                    "INSERT INTO procrastinate_jobs (queue_name, task_name) "
                    "SELECT 'bench', 'bench' FROM generate_series(1, $1)",
                    jobs,
                )
                row["with_us" if on else "without_us"] = round(await timed(_FINISH_ALL), 1)
            rows.append(row)
    finally:
        await conn.close()
    return {"jobs": jobs, "crc32_us": round(crc_us, 1), "rounds": rows}


def _job_trigger(args: argparse.Namespace, settings: dict[str, str]) -> int:
    from .testing import PostgresServer

    with PostgresServer(**settings) as postgres:
        report = asyncio.run(_job_trigger_rounds(postgres.dsn, args.jobs, args.rounds))
    print(f"CRC-32 of a job key: {report['crc32_us']} us")
    for n, row in enumerate(report["rounds"], 1):
        print(
            f"round {n}: procrastinate_finish_job {row['with_us']} us with the trigger, "
            f"{row['without_us']} us without (+{row['with_us'] - row['without_us']:.1f} us)"
        )
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            json.dump({"durable": args.durable, **report}, out, indent=2)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (see the module documentation); 0 on success."""
    parser = argparse.ArgumentParser(prog="python -m aiopurgatory.postgres.bench")
    parser.add_argument("--wakes", type=int, default=500, help="advances per transport")
    parser.add_argument("--interval", type=float, default=0.005, help="seconds between them")
    parser.add_argument("--durable", action="store_true", help="servers as in production")
    parser.add_argument("--output", help="write the results here as JSON")
    parser.add_argument("--writers", help="measure NOTIFY under N concurrent writers: 1,4,16")
    parser.add_argument("--seconds", type=float, default=3.0, help="per --writers measurement")
    parser.add_argument("--throughput", action="store_true", help="throughput and CPU")
    parser.add_argument("--triggers", type=int, default=20000, help="per --throughput round")
    parser.add_argument("--rounds", type=int, default=4, help="--throughput, --job-trigger rounds")
    parser.add_argument("--job-trigger", action="store_true", help="the job-end trigger's cost")
    parser.add_argument("--jobs", type=int, default=3000, help="per --job-trigger round")
    parser.add_argument("--role", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role:
        role, transport, url, size = args.role
        if role == "sink":
            prefix, keys = size.split(",")
            asyncio.run(_sink(transport, url, prefix, int(keys)))
        else:
            asyncio.run(_waiter(transport, url, int(size)))
        return 0
    from .testing import PostgresServer

    settings = {"fsync": "on", "synchronous_commit": "on"} if args.durable else {}
    if args.job_trigger:
        if args.jobs <= 0 or args.rounds <= 0:
            parser.error("--jobs and --rounds must be positive")
        return _job_trigger(args, settings)
    if args.throughput:
        if args.triggers <= 0 or args.rounds <= 0:
            parser.error("--triggers and --rounds must be positive")
        return _throughput(args, settings)
    if args.writers:
        counts = [int(n) for n in args.writers.split(",")]
        with PostgresServer(max_connections="100", **settings) as postgres:
            rows = _writers(postgres.dsn, counts, args.seconds)
        for row in rows:
            print(
                f"{row['writers']:>3} writers: {row['plain']:>7} commits/s without NOTIFY, "
                f"{row['notify']:>7} with ({row['notify'] / row['plain']:.2f})"
            )
        if args.output:
            with open(args.output, "w", encoding="utf-8") as out:
                json.dump({"durable": args.durable, "writers": rows}, out, indent=2)
        return 0
    results = []
    with tempfile.TemporaryDirectory() as directory, PostgresServer(**settings) as postgres:
        urls = {"postgres": postgres.dsn}
        redis_server = None
        try:
            from ..redis.testing import RedisServer, RedisServerMissing

            redis_server = RedisServer(directory, appendfsync="always" if args.durable else "no")
            redis_server.start()
            urls["redis"] = redis_server.url
        except (ImportError, RedisServerMissing) as exc:
            print(f"redis skipped: {exc}", file=sys.stderr)
        try:
            for transport, url in urls.items():
                results.append(_measure(transport, url, args.wakes, args.interval))
        finally:
            if redis_server is not None:
                redis_server.kill()
    for row in results:
        print(
            f"{row['transport']:>8}: p50 {row['p50_ms']:.3f} ms  p90 {row['p90_ms']:.3f} ms  "
            f"p99 {row['p99_ms']:.3f} ms  max {row['max_ms']:.3f} ms  ({row['wakes']} wakes)"
        )
    if len(results) == 2:
        ratio = results[0]["p50_ms"] / results[1]["p50_ms"]
        print(f"postgres p50 / redis p50: {ratio:.2f}")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            json.dump({"durable": args.durable, "results": results}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
