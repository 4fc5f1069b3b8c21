"""``python -m examples.broker`` as a program: JSON logs, a real client, SIGTERM shutdown."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from examples.broker.__main__ import main

pytestmark = pytest.mark.realtime

ROOT = Path(__file__).resolve().parent.parent


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
    return body.decode()


async def _next_event(stream: asyncio.StreamReader, name: str, seen: list[dict[str, Any]]) -> Any:
    async with asyncio.timeout(20):
        while True:
            line = await stream.readline()
            if not line:
                raise AssertionError(f"{name} never logged; saw {[e.get('event') for e in seen]}")
            event = json.loads(line)
            seen.append(event)
            if event.get("event") == name:
                return event


async def test_program_serves_a_client_and_stops_on_sigterm() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "examples.broker",
        "--port",
        "0",
        "--log-format",
        "json",
        "--stats-interval",
        "0.2",
        "--topic",
        "demo:2",
        "--admin-port",
        "0",
        "--metrics-port",
        "0",
        cwd=ROOT,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    seen: list[dict[str, Any]] = []
    try:
        started = await _next_event(proc.stderr, "broker.started", seen)
        port = started["port"]
        assert port > 0
        assert started["topics"] == {"demo": 2}
        client = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", acks="all")
        await client.start()
        try:
            md = await client.send_and_wait("demo", b"hello", partition=1)
            assert (md.partition, md.offset) == (1, 0)
        finally:
            await client.stop()
        stats = await _next_event(proc.stderr, "broker.purgatory_stats", seen)
        assert stats["produce"]["pending"] == 0
        # Interval wait percentiles: numbers in ms, or None when nothing finished.
        assert set(stats["produce"]) >= {"wait_p50_ms", "wait_p99_ms", "lateness_p99_ms"}
        assert all(
            stats["produce"][k] is None or stats["produce"][k] >= 0
            for k in ("wait_p50_ms", "wait_p99_ms", "lateness_p99_ms")
        )
        assert stats["level"] == "info"

        admin_port = next(e["port"] for e in seen if e["event"] == "broker.admin_listening")
        reader, writer = await asyncio.open_connection("127.0.0.1", admin_port)
        writer.write(b"crash 2\nstate\nbogus\n")
        assert await reader.readline() == b"ok crash 2\n"
        state = json.loads((await reader.readline()).decode().removeprefix("ok "))
        assert state["followers"] == {"1": "running", "2": "crashed"}
        assert state["partitions"]["demo-1"]["isr"] == [0, 1]
        assert (await reader.readline()).startswith(b"error unknown command")
        writer.close()

        metrics_port = next(e["port"] for e in seen if e["event"] == "broker.metrics_listening")
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        text = await asyncio.to_thread(_get, url)
        assert 'aiopurgatory_operations_total{outcome="completed",purgatory="produce"} 1.0' in text
        assert (
            'aiopurgatory_operation_wait_seconds_count{outcome="completed",purgatory="produce"} 1.0'
            in text
        )
        assert 'aiopurgatory_expiry_lateness_seconds_count{purgatory="produce"}' in text
        proc.send_signal(signal.SIGTERM)
        await _next_event(proc.stderr, "broker.stopped", seen)
        async with asyncio.timeout(20):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--port", "-1", "--log-format", "json"]) == 2
    assert "port" in capsys.readouterr().err
