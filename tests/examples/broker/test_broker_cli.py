"""``python -m examples.broker`` as a program: JSON logs, a real client, SIGTERM shutdown."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from examples.broker.__main__ import main

pytestmark = pytest.mark.realtime

ROOT = Path(__file__).resolve().parents[3]


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
        # HW advances counted (this line may predate the produce: a count, maybe 0).
        assert isinstance(stats["produce"]["advances"], int)
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


def test_every_option_says_what_it_does_and_its_default() -> None:
    from examples.broker.__main__ import build_parser

    for action in build_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        assert action.help, action.dest
        if not isinstance(action, argparse._StoreTrueAction):
            assert "(%(default)s)" in action.help or "(default: " in action.help, action.dest


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--port", "-1", "--log-format", "json"]) == 2
    assert "port" in capsys.readouterr().err


async def _second_broker(*args: str) -> tuple[int, str]:
    """``python -m examples.broker`` with ``args``: its exit status and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "examples.broker",
        "--log-format",
        "json",
        *args,
        cwd=ROOT,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        _, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def test_ports_taken_are_one_line_and_the_admin_port_names_its_commands() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "examples.broker",
        "--port",
        "0",
        "--log-format",
        "json",
        "--admin-port",
        "0",
        cwd=ROOT,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    seen: list[dict[str, Any]] = []
    try:
        port = (await _next_event(proc.stderr, "broker.started", seen))["port"]
        admin_port = (await _next_event(proc.stderr, "broker.admin_listening", seen))["port"]
        # A second broker on a port in use, for Kafka, admin or metrics: one line,
        # exit 1, nothing started (no log line before it).
        for args, what, taken in (
            (["--port", str(port)], "Kafka", port),
            (["--port", "0", "--admin-port", str(admin_port)], "admin", admin_port),
            (["--port", "0", "--metrics-port", str(port)], "metrics", port),
            (["--port", str(port), "--admin-port", "0", "--metrics-port", "0"], "Kafka", port),
        ):
            status, err = await _second_broker(*args)
            assert status == 1, args
            assert err.splitlines() == [
                f"error: cannot listen on 127.0.0.1:{taken} ({what}): Address already in use"
            ]
        reader, writer = await asyncio.open_connection("127.0.0.1", admin_port)
        writer.write(b"bogus 1\nstall\nlag 1 soon\nstate now\nhelp\ncrash 2\n")
        known = (
            "stall FOLLOWER, resume FOLLOWER, crash FOLLOWER, restart FOLLOWER, "
            "lag FOLLOWER SECONDS, state, stats, groups, help"
        )
        async with asyncio.timeout(20):
            replies = [(await reader.readline()).decode().rstrip("\n") for _ in range(6)]
        assert replies == [
            f"error unknown command 'bogus'; commands: {known}",
            "error usage: stall FOLLOWER",
            "error usage: lag FOLLOWER SECONDS",
            "error usage: state",
            f"ok commands: {known}",
            "ok crash 2",
        ]
        writer.close()
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def _admin_and_idempotent_producer(bootstrap: str) -> dict[str, Any]:
    """What a client's first hour does, through confluent-kafka (runs in a thread)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic("first-hour", 2, 3)]).values():
        future.result(timeout=15)
    topics = set(admin.list_topics(timeout=15).topics)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    offsets: list[tuple[int, int]] = []

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        offsets.append((msg.partition(), msg.offset()))

    for i in range(10):
        producer.produce("first-hour", f"m{i}".encode(), partition=i % 2, on_delivery=delivered)
    assert producer.flush(30) == 0
    groups = admin.list_consumer_groups().result(timeout=15)
    for future in admin.delete_topics(["first-hour"]).values():
        future.result(timeout=15)
    return {
        "topics": topics,
        "offsets": sorted(offsets),
        "groups": list(groups.valid),
        "after_delete": set(admin.list_topics(timeout=15).topics),
    }


async def test_program_serves_admin_clients_and_idempotent_producers_as_is() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "examples.broker",
        "--port",
        "0",
        "--log-format",
        "json",
        cwd=ROOT,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    seen: list[dict[str, Any]] = []
    try:
        started = await _next_event(proc.stderr, "broker.started", seen)
        result = await asyncio.to_thread(
            _admin_and_idempotent_producer, f"127.0.0.1:{started['port']}"
        )
        assert "first-hour" in result["topics"]
        assert result["offsets"] == [(p, o) for p in (0, 1) for o in range(5)]
        assert result["groups"] == []
        assert "first-hour" not in result["after_delete"]
        issued = await _next_event(proc.stderr, "broker.producer_id_issued", seen)
        assert issued["producer_id"] >= 0
        proc.send_signal(signal.SIGTERM)
        await _next_event(proc.stderr, "broker.stopped", seen)
        async with asyncio.timeout(20):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
