"""``python -m examples.longpoll`` as a program on uvicorn: real sockets, SIGTERM, disconnects.

Wall-clock tests (``realtime``): they wait for states with generous deadlines and
assert what the server reports, never how fast it was.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from examples.longpoll.__main__ import main
from tests.support.longpoll import ROOT, Program, wait_until

pytestmark = pytest.mark.realtime


@pytest.fixture
def program() -> Iterator[Callable[..., Program]]:
    started: list[Program] = []

    def start(*args: str) -> Program:
        started.append(Program(*args))
        return started[-1]

    yield start
    for p in started:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.communicate()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("waiter", ["purgatory", "asyncio"])
def test_sigterm_answers_every_parked_get_and_exits_0(
    program: Callable[..., Program], waiter: str, loop: str
) -> None:
    server = program("--waiter", waiter, "--loop", loop)
    assert (server.first["waiter"], server.first["loop"]) == (waiter, loop)
    assert server.get_json("/topics/t0", "POST", b"kept") == {"offset": 0}
    parked = []
    for n in range(20):
        conn = server.connection()
        conn.request("GET", f"/topics/t{n % 4}?offset=0&wait=120&min_bytes=1000")
        parked.append(conn)
    gauge = f'longpoll_parked_requests{{waiter="{waiter}"}}'
    wait_until(lambda: server.metrics()[gauge] == 20, "20 parked GETs")
    # a short wait is answered by its timeout, not before
    started = time.monotonic()
    assert server.get_json("/topics/t1?wait=0.3")["messages"] == []
    assert time.monotonic() - started >= 0.3

    server.proc.send_signal(signal.SIGTERM)
    for n, conn in enumerate(parked):
        response = conn.getresponse()
        assert response.status == 200
        body = json.loads(response.read())
        assert body["messages"] == (["kept"] if n % 4 == 0 else [])
        conn.close()
    status, lines = server.stop()
    assert status == 0
    stopping = next(line for line in lines if line["event"] == "longpoll.stopping")
    assert (stopping["signal"], stopping["released"]) == ("SIGTERM", 20)
    stopped = next(line for line in lines if line["event"] == "longpoll.stopped")
    answers = stopped["answers"]
    if waiter == "asyncio" and loop == "uvloop":
        # asyncio.wait_for on uvloop may fire up to ~1.4 ms before its time (the
        # server counts that as early; docs/longpoll.md); the purgatory never does.
        answers = {**answers, "timeout": answers["timeout"] + answers.pop("early"), "early": 0}
    assert answers == {"data": 0, "timeout": 1, "shutdown": 20, "early": 0}
    with pytest.raises(urllib.error.URLError) as refused:
        server.get_json("/healthz")
    assert isinstance(refused.value.reason, ConnectionRefusedError)


@pytest.mark.parametrize("waiter", ["purgatory", "asyncio"])
def test_a_client_that_hangs_up_withdraws_its_wait(
    program: Callable[..., Program], waiter: str
) -> None:
    server = program("--waiter", waiter)
    conns = []
    for _ in range(2):
        conn = server.connection()
        conn.request("GET", "/topics/t?wait=120")
        conns.append(conn)
    gauge = f'longpoll_parked_requests{{waiter="{waiter}"}}'
    wait_until(lambda: server.metrics()[gauge] == 2, "2 parked GETs")
    conns[0].close()
    wait_until(lambda: server.metrics()[gauge] == 1, "the hung-up GET withdrawn", 5)
    metrics = server.metrics()
    assert metrics[f'longpoll_disconnects_total{{waiter="{waiter}"}}'] == 1
    if waiter == "purgatory":
        assert metrics['aiopurgatory_pending_operations{purgatory="longpoll"}'] == 1
        assert (
            metrics['aiopurgatory_operations_total{outcome="cancelled",purgatory="longpoll"}'] == 1
        )
    conns[1].close()
    wait_until(lambda: server.metrics()[gauge] == 0, "both withdrawn", 5)
    if waiter == "purgatory":
        metrics = server.metrics()
        for name in ("pending_operations", "purgatory_size", "watch_keys"):
            assert metrics[f'aiopurgatory_{name}{{purgatory="longpoll"}}'] == 0
    status, lines = server.stop()
    assert status == 0
    stopping = next(line for line in lines if line["event"] == "longpoll.stopping")
    assert stopping["released"] == 0


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--port", "70000"]) == 2
    assert "port" in capsys.readouterr().err
    assert main(["--max-wait", "-1"]) == 2
    assert "max_wait" in capsys.readouterr().err
    assert main(["--body-timeout", "0"]) == 2
    assert "body_timeout" in capsys.readouterr().err
    assert main(["--header-timeout", "inf"]) == 2
    assert "header_timeout" in capsys.readouterr().err
    assert main(["--max-header-bytes", "0"]) == 2
    assert "max_header_bytes" in capsys.readouterr().err


def test_a_small_load_test_run_compares_both_waiters(capsys: pytest.CaptureFixture[str]) -> None:
    from examples.longpoll import loadtest

    argv = ["--parked", "200", "--topics", "10", "--seconds", "2", "--rounds", "1"]
    assert loadtest.main(argv) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    runs, summary = lines[:-1], lines[-1]
    assert [run["waiter"] for run in runs] == ["purgatory", "asyncio"]
    for run in runs:
        assert (run["parked"], run["posts"], run["exit_status"], run["errors"]) == (200, 10, 0, 0)
        assert run["post_retries"] == 0  # a healthy server answered every POST at once
        assert 0 < run["delivered"] <= 200  # 10 posts, each to the 20 GETs of its topic
        assert run["server_cpu_s"] > 0
        assert run["rss_mib"] > 0
    # the purgatory never answers early; asyncio.wait_for may on uvloop (reported)
    assert (runs[0]["early_server"], runs[0]["early_client"]) == (0, 0)
    assert summary["early_answers"]["purgatory"] == {"server": 0, "client": 0}
    assert set(summary["early_answers"]["asyncio"]) == {"server", "client"}
    assert set(summary["ratios_purgatory_to_asyncio"]) == {
        "server_cpu_s",
        "rss_mib",
        "peak_rss_mib",
        "latency_p50_ms",
        "latency_p99_ms",
    }
    assert loadtest.main(["--parked", "0"]) == 2


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


@pytest.mark.parametrize(
    "module", ["examples.longpoll.__main__", "examples.longpoll.loadtest", "examples.longpoll.soak"]
)
def test_every_option_has_help_with_its_default(module: str) -> None:
    parser: argparse.ArgumentParser = importlib.import_module(module).build_parser()
    for action in _options(parser):
        assert action.help, action.dest
        # flags, and the options a supervisor gives its workers (not for users)
        if isinstance(action, argparse._StoreTrueAction) or action.help == argparse.SUPPRESS:
            continue
        assert "(%(default)s)" in action.help or "(default: " in action.help, action.dest
    # what the load test's docstring (its --help) advertises, it accepts
    from examples.longpoll import loadtest

    advertised = set(re.findall(r"``(--[a-z-]+)", loadtest.__doc__ or ""))
    accepted = {s for a in _options(loadtest.build_parser()) for s in a.option_strings}
    assert "--json" in advertised
    assert advertised <= accepted


def test_the_docs_give_the_load_tests_defaults() -> None:
    from examples.longpoll import loadtest

    d = loadtest.build_parser().parse_args([])
    text = " ".join((ROOT / "docs" / "longpoll.md").read_text().split())
    assert f"# {d.parked:,} GETs, {d.topics} topics, {d.rounds} rounds" in text
    assert f"parks {d.parked:,} GETs" in text
    assert f"{d.parked // d.topics} per topic" in text
    assert f"posts {d.post_rate:g} messages a second" in text
    assert f"for {d.seconds:g} s" in text
    assert f"{d.short_share:.0%} of the GETs wait 1 to 5 s" in text
    assert f"the others wait {loadtest.Load().long_wait:g} s" in text
    assert {"one": 1, "two": 2, "three": 3}[re.findall(r"waiters, (\w+) each", text)[0]] == d.rounds


def test_the_load_test_prints_one_json_object_with_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from examples.longpoll import loadtest

    argv = ["--parked", "20", "--topics", "2", "--seconds", "1", "--rounds", "1"]
    assert loadtest.main([*argv, "--waiters", "purgatory", "--json"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1
    result = json.loads(out)
    assert set(result) == {"runs", "summary"}
    (run,) = result["runs"]
    assert (run["waiter"], run["parked"], run["exit_status"], run["errors"]) == (
        "purgatory",
        20,
        0,
        0,
    )
    assert result["summary"]["early_answers"] == {"purgatory": {"server": 0, "client": 0}}
