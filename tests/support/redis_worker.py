"""A process with a purgatory shared through Redis, driven by tests/support/redis.Worker.

``python -m tests.support.redis_worker URL CHANNEL asyncio|uvloop [OPTIONS_JSON]``. Reads
JSON commands on stdin, one per line, and writes JSON events on stdout:

* ``{"cmd": "watch", "id": ..., "keys": [key...] | "thresholds": [[key, t], ...],
  "timeout": s}``: watch an operation that completes when checked while *armed*
  (plain keys) or when every threshold is reached (``watermark(key) >= t``).
  Event ``{"event": "done", "id": ..., "outcome": ...}`` when it finishes.
* ``{"cmd": "arm", "id": ...}``: from now on the operation's condition holds.
* ``{"cmd": "check", "key": key}`` / ``{"cmd": "advance", "key": key, "value": v}``:
  trigger through the RedisTriggers; event with the local completions. With
  ``"span": name`` (and ``"sampled": false`` for a trace its sampler drops), made
  inside an OpenTelemetry span of that name (the SDK, imported then only); the
  event has its ``trace_id`` and ``span_id`` (hex).
* ``{"cmd": "flush"}``, ``{"cmd": "stats"}``, ``{"cmd": "exit"}``.

Keys are ``["s", str]``, ``["i", int]`` or ``["b", hex]`` (tests.support.redis.encode_key).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import aiopurgatory as ap
from aiopurgatory.redis import RedisTriggers
from tests.support.redis import decode_key


class Waiting(ap.DelayedOperation):
    def __init__(
        self, timeout: float, purgatory: ap.Purgatory[Any], thresholds: dict[Any, float]
    ) -> None:
        super().__init__(timeout)
        self.armed = False
        self.purgatory = purgatory
        self.wanted = thresholds

    def try_complete(self) -> bool:
        if self.wanted:
            for key, threshold in self.wanted.items():
                value = self.purgatory.watermark(key)
                if value is None or value < threshold:
                    return False
            return self.force_complete()
        return self.force_complete() if self.armed else False


async def routed(triggers: RedisTriggers, keys: list[Any]) -> None:
    """Wait (up to 10 s) until the partitions of ``keys`` are subscribed."""
    subscriber = triggers._subscriber
    assert subscriber is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not subscriber.covers(keys):
        if loop.time() > deadline:
            raise TimeoutError(f"the partitions of {keys!r} were not subscribed in 10 s")
        await asyncio.sleep(0.005)


_tracers: dict[bool, Any] = {}


def in_span(command: dict[str, Any], trigger: Callable[[], int]) -> dict[str, Any]:
    """Run ``trigger`` (in the span the command names, if any); the event's fields."""
    name = command.get("span")
    if name is None:
        return {"completed": trigger()}
    sampled = bool(command.get("sampled", True))
    tracer = _tracers.get(sampled)
    if tracer is None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

        provider = TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF)
        tracer = _tracers[sampled] = provider.get_tracer("worker")
    with tracer.start_as_current_span(name) as span:
        completed = trigger()
    where = span.get_span_context()
    return {
        "completed": completed,
        "trace_id": format(where.trace_id, "032x"),
        "span_id": format(where.span_id, "016x"),
    }


def emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def main(url: str, channel: str, options: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    purgatory: ap.Purgatory[Waiting] = ap.Purgatory("worker")
    ops: dict[str, Waiting] = {}
    tasks: set[asyncio.Task[None]] = set()
    if "reconnect_delay" in options:
        options["reconnect_delay"] = tuple(options["reconnect_delay"])

    async def wait(name: str, op: Waiting, keys: Any) -> None:
        outcome = await purgatory.watch(op, keys)
        emit(event="done", id=name, outcome=outcome.name)

    async with RedisTriggers(purgatory, url, channel=channel, **options) as triggers:
        emit(event="ready", instance=triggers.instance)
        while line := await reader.readline():
            command = json.loads(line)
            cmd = command["cmd"]
            if cmd == "watch":
                thresholds = {decode_key(k): t for k, t in command.get("thresholds", [])}
                op = Waiting(command.get("timeout", 30), purgatory, thresholds)
                ops[command["id"]] = op
                keys: Any = thresholds or [decode_key(k) for k in command["keys"]]
                task = asyncio.create_task(wait(command["id"], op, keys))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                await asyncio.sleep(0)  # watched before the reply
                # ... and its keys' partitions subscribed (found by the sweep of the
                # purgatory's keys), so that what the test publishes next is received.
                await routed(triggers, list(thresholds or keys))
                emit(event="watch", id=command["id"])
            elif cmd == "arm":
                ops[command["id"]].armed = True
                emit(event="arm", id=command["id"])
            elif cmd == "check":
                check = functools.partial(triggers.check_and_complete, decode_key(command["key"]))
                emit(event="check", **in_span(command, check))
            elif cmd == "advance":
                advance = functools.partial(
                    triggers.advance, decode_key(command["key"]), command["value"]
                )
                emit(event="advance", **in_span(command, advance))
            elif cmd == "flush":
                await triggers.flush()
                emit(event="flush")
            elif cmd == "stats":
                emit(event="stats", **dataclasses.asdict(triggers.statistics()))
            elif cmd == "exit":
                break
    purgatory.close()
    await asyncio.gather(*tasks, return_exceptions=True)
    emit(event="closed")


if __name__ == "__main__":
    url, channel, loop_name = sys.argv[1:4]
    options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    if loop_name == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main(url, channel, options))
