"""A process with a purgatory and a PostgresTriggers, driven by JSON lines (tests' Worker).

Commands (stdin): ``{"cmd": "watch", "id": ..., "key": ..., "threshold": ...,
"timeout": ...}`` parks an op (thresholded watch on ``key``) and reports
``{"event": "done", "id", "outcome", "elapsed"}`` when it ends (``"watching"``
once watched); ``advance``/``check`` trigger; ``stats`` reports the statistics;
``exit`` closes. Events go to stdout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from typing import Any

import aiopurgatory as ap
from aiopurgatory.postgres import PostgresTriggers


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
            elif cmd == "advance":
                triggers.advance(command["key"], command["value"])
                await triggers.flush()
                emit(event="advance", wall=time.time())
            elif cmd == "covers":
                listener = triggers._listener
                assert listener is not None
                emit(event="covers", covers=listener.covers([command["key"]]))
            elif cmd == "stats":
                emit(event="stats", **dataclasses.asdict(triggers.statistics()))
    emit(event="closed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))
