"""A process with a purgatory and a PostgresTriggers, driven by JSON lines (tests' Worker).

Commands (stdin): ``{"cmd": "watch", "id": ..., "key": ..., "threshold": ...,
"timeout": ...}`` parks an op (thresholded watch on ``key``) and reports
``{"event": "done", "id", "outcome", "elapsed"}`` when it ends (``"watching"``
once watched); ``advance``/``check`` trigger; ``stats`` reports the statistics;
``exit`` closes. ``advance``, ``check`` and ``advance_in`` (on a connection of
its own, in a transaction) take ``"span": name`` (and ``"sampled": false`` for a
trace its sampler drops): the trigger is made inside an OpenTelemetry span of
that name (the SDK imported then only), and the event has its ``trace_id`` and
``span_id`` (hex). Events go to stdout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

import aiopurgatory as ap
from aiopurgatory.postgres import PostgresTriggers

_tracers: dict[bool, Any] = {}


async def in_span(
    command: dict[str, Any], trigger: Callable[[], Awaitable[None]]
) -> dict[str, Any]:
    """Run ``trigger`` (in the span the command names, if any); the event's fields."""
    name = command.get("span")
    if name is None:
        await trigger()
        return {}
    sampled = bool(command.get("sampled", True))
    tracer = _tracers.get(sampled)
    if tracer is None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

        provider = TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF)
        tracer = _tracers[sampled] = provider.get_tracer("worker")
    with tracer.start_as_current_span(name) as span:
        await trigger()
    where = span.get_span_context()
    return {"trace_id": format(where.trace_id, "032x"), "span_id": format(where.span_id, "016x")}


def emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def main(dsn: str, channel: str, options: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("worker")
    tasks: set[asyncio.Task[None]] = set()
    async with PostgresTriggers(purgatory, dsn, channel=channel, **options) as triggers:

        async def watch(command: dict[str, Any]) -> None:
            op = ap.WatermarkOperation(command["timeout"])
            start = time.perf_counter()
            watching = triggers.watch(op, {command["key"]: command["threshold"]})
            task = asyncio.ensure_future(watching)
            await asyncio.sleep(0)
            emit(event="watching", id=command["id"])
            outcome = await task
            emit(
                event="done",
                id=command["id"],
                outcome=outcome.name,
                elapsed=time.perf_counter() - start,
                wall=time.time(),
            )

        emit(event="ready", instance=triggers.instance)
        while line := await reader.readline():
            command = json.loads(line)
            cmd = command["cmd"]
            if cmd == "exit":
                break
            if cmd == "watch":
                task = asyncio.create_task(watch(command))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            elif cmd in ("advance", "check", "advance_in"):

                async def trigger(command: dict[str, Any] = command) -> None:
                    if command["cmd"] == "advance":
                        triggers.advance(command["key"], command["value"])
                    elif command["cmd"] == "check":
                        triggers.check_and_complete(command["key"])
                    else:
                        connection = await asyncpg.connect(dsn)
                        try:
                            async with connection.transaction():
                                await triggers.advance_in(
                                    connection, command["key"], command["value"]
                                )
                        finally:
                            await connection.close()
                    await triggers.flush()

                emit(event=cmd, wall=time.time(), **await in_span(command, trigger))
            elif cmd == "covers":
                listener = triggers._listener
                assert listener is not None
                emit(event="covers", covers=listener.covers([command["key"]]))
            elif cmd == "stats":
                emit(event="stats", **dataclasses.asdict(triggers.statistics()))
    emit(event="closed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))
