"""The examples, run small on virtual time, with the outcomes each scenario must produce.

The examples' bodies are anyio code: the scenario checks run on asyncio's virtual
time and on trio's (``--loop trio``: ``simulation.run_trio``, a seeded autojumping
``MockClock``), and a trio run must give what the asyncio run of the same scenario
and seed gives. Where two tasks are woken at the same instant, asyncio resumes them
in FIFO order and trio in its own (seeded, shuffled) order; the tests below name
the few results whose *order* depends on that and compare those as multisets.
A few short runs on the wall clock (``realtime``) cover asyncio, uvloop and trio.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import structlog

import aiopurgatory as ap
from aiopurgatory.events import EventRecorder
from examples import acks_all, group_join, long_poll_fetch
from examples._kafka import Errors, LogNormal, TopicPartition, percentile

TICK = 0.001  # the default wheel tick: expiry is never early and at most one tick late
VIRTUAL = ("asyncio", "trio")  # the loops with a virtual clock (--loop without --real-time)

R = TypeVar("R")


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    # The examples' main() configures structlog (they are applications); undo it.
    yield
    structlog.reset_defaults()


def small(scenario: str, **overrides: object) -> acks_all.Config:
    settings: dict[str, object] = {"scenario": scenario, "duration": 5.0, "rate": 200.0}
    settings.update(overrides)
    return acks_all.Config(**settings)  # type: ignore[arg-type]


_cache: dict[tuple[object, str], Any] = {}


def cached(run: Callable[..., R], config: object, loop: str) -> R:
    # Virtual-time runs are deterministic, so each (config, loop) is simulated once
    # per session: the scenario checks and the cross-backend comparisons share it.
    key = (config, loop)
    if key not in _cache:
        _cache[key] = run(config, loop=loop)
    result: R = _cache[key]
    return result


def run_acks(config: acks_all.Config, loop: str = "asyncio") -> acks_all.AcksAllResult:
    return cached(acks_all.run, config, loop)


def assert_same_run(expected: object, actual: object, *, unordered: tuple[str, ...] = ()) -> None:
    """Every field of two results equal; those named in ``unordered`` as multisets.

    Exact equality, floats included: both virtual clocks land exactly on each deadline.
    """
    assert dataclasses.is_dataclass(expected)
    assert dataclasses.is_dataclass(actual)
    names = [f.name for f in dataclasses.fields(expected)]
    assert set(unordered) <= set(names)
    for name in names:
        want, got = getattr(expected, name), getattr(actual, name)
        if name in unordered:
            assert Counter(map(repr, got)) == Counter(map(repr, want)), name
        else:
            assert got == want, name


def without_wall_time(text: str) -> str:
    # "... simulated in 0.42 s": the only part of a summary that is not simulated.
    return re.sub(r"simulated in \d+\.\d+ s", "simulated in WALL s", text)


def assert_answered_exactly_once(result: acks_all.AcksAllResult) -> None:
    assert result.requests > 0
    assert sorted(result.answers) == list(range(result.requests))
    assert Counter(result.answers.values()) == {1: result.requests}
    assert sum(result.outcomes.values()) == result.requests
    stats = result.statistics
    assert stats.completed + stats.expired == result.requests
    assert (stats.pending, stats.watched, stats.delayed, stats.cancelled, stats.failed) == (
        0,
        0,
        0,
        0,
        0,
    )


# -- acks_all: the Kafka model -----------------------------------------------------------------


def test_partition_high_watermark_is_min_log_end_offset_over_isr() -> None:
    tp = TopicPartition("t", 0)
    p = acks_all.Partition(tp, [0, 1, 2], min_insync_replicas=2, now=0.0)
    assert p.append(10) == 10
    assert p.high_watermark == 0
    assert p.update_follower_fetch_state(1, 10, now=0.1) == (False, False)
    assert p.high_watermark == 0  # follower 2 is in the ISR at offset 0
    assert p.update_follower_fetch_state(2, 4, now=0.1) == (True, False)
    assert p.high_watermark == 4
    assert p.check_enough_replicas_reach_offset(10) == (False, Errors.NONE)
    assert p.check_enough_replicas_reach_offset(4) == (True, Errors.NONE)
    # Follower 2 stops fetching: out of sync once it lagged more than lag.time.max.
    assert p.out_of_sync_followers(now=1.0, lag_time_max=1.0) == []
    assert p.out_of_sync_followers(now=1.2, lag_time_max=1.0) == [2]
    p.isr.discard(2)
    assert p.maybe_increment_high_watermark()
    assert p.high_watermark == 10
    p.isr.discard(1)
    assert p.append(5) == 15
    assert p.high_watermark == 15  # the leader alone: HW follows the log at once
    assert p.check_enough_replicas_reach_offset(15) == (
        True,
        Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    )
    # Follower 1 rejoins once it reaches the high watermark.
    assert p.update_follower_fetch_state(1, 14, now=2.0) == (False, False)
    assert p.update_follower_fetch_state(1, 15, now=2.1) == (False, True)
    assert p.isr == {0, 1}


def test_follower_caught_up_as_of_previous_fetch() -> None:
    p = acks_all.Partition(TopicPartition("t", 0), [0, 1], 1, now=0.0)
    p.append(10)
    p.update_follower_fetch_state(1, 0, now=0.5)  # behind: not caught up at 0.5
    p.append(10)
    # It asks for what the leader had at its previous fetch: caught up as of 0.5.
    p.update_follower_fetch_state(1, 10, now=0.9)
    assert p.out_of_sync_followers(now=1.4, lag_time_max=1.0) == []
    assert p.out_of_sync_followers(now=1.6, lag_time_max=1.0) == [1]


@pytest.mark.parametrize("loop", VIRTUAL)
def test_healthy_has_no_timeouts_and_no_isr_changes(loop: str) -> None:
    result = run_acks(small("healthy"), loop)
    assert_answered_exactly_once(result)
    assert result.by_outcome_error == {("completed", "NONE"): result.requests}
    assert result.isr_changes == []
    assert result.latency_percentiles()["max"] < result.config.request_timeout
    assert result.high_watermarks == result.log_end_offsets


def test_produces_and_follower_fetches_complete_through_watermark_advances() -> None:
    result = run_acks(small("healthy"))
    # Every produce parks (the followers have not fetched its batch yet) and is
    # completed by an advance of its partitions' high watermarks; the followers'
    # parked fetches by advances of the log end offset (appends).
    produce, fetch = result.statistics, result.fetch_statistics
    assert produce.completed == result.requests
    assert produce.advances > 0
    assert fetch.advances > 0
    assert fetch.completed > 0


@pytest.mark.parametrize("loop", VIRTUAL)
def test_follower_crash_shrinks_the_isr_and_still_succeeds(loop: str) -> None:
    result = run_acks(small("follower-crash"), loop)
    assert_answered_exactly_once(result)
    assert result.errors == {"NONE": sum(result.errors.values())}
    assert result.follower_events == [(1.0, 2, "crash"), (3.0, 2, "restart")]
    shrinks = [c for c in result.isr_changes if c.kind == "shrink"]
    expands = [c for c in result.isr_changes if c.kind == "expand"]
    assert len(shrinks) == len(expands) == result.config.partitions
    for change in shrinks:
        assert change.before == (0, 1, 2)
        assert change.after == (0, 1)
        # Out of sync once replica.lag.time.max passed since it last caught up (a fetch
        # before the crash), found by the check every lag/2; before the restart.
        lag = result.config.replica_lag_time_max
        assert 1.0 + lag - 0.1 < change.time <= 1.0 + 1.5 * lag
        assert change.time < 3.0
    for change in expands:
        assert change.after == (0, 1, 2)
        assert change.time > 3.0
    # Requests waiting for the dead follower waited at most until the shrink.
    assert result.latency_percentiles()["max"] < 1.5 + 0.1


@pytest.mark.parametrize("loop", VIRTUAL)
def test_slow_follower_leaves_and_rejoins_the_isr(loop: str) -> None:
    result = run_acks(small("slow-follower"), loop)
    assert_answered_exactly_once(result)
    assert result.outcomes == {"completed": result.requests}
    kinds = Counter(c.kind for c in result.isr_changes)
    assert kinds["shrink"] >= 1
    assert kinds["expand"] >= 1
    assert {b for c in result.isr_changes for b in set(c.before) ^ set(c.after)} == {2}
    healthy = run_acks(small("healthy"), loop)
    assert result.latency_percentiles()["p99"] > 5 * healthy.latency_percentiles()["p99"]


@pytest.mark.parametrize("loop", VIRTUAL)
def test_two_down_never_acknowledges(loop: str) -> None:
    result = run_acks(small("two-down"), loop)
    assert_answered_exactly_once(result)
    assert "NONE" not in result.errors
    assert set(result.errors) <= {
        "NOT_ENOUGH_REPLICAS",
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        "REQUEST_TIMED_OUT",
    }
    assert result.errors["NOT_ENOUGH_REPLICAS"] > result.requests / 2
    # Appends before the shrink complete with ..._AFTER_APPEND when the ISR shrinks;
    # appends after it are refused at once.
    shrink_at = min(c.time for c in result.isr_changes)
    assert all(c.after == (0,) for c in result.isr_changes)
    assert result.latency_percentiles()["max"] <= shrink_at
    refused = [
        lat
        for lat, err in zip(result.latencies, result.request_errors, strict=True)
        if err == "NOT_ENOUGH_REPLICAS"
    ]
    assert refused
    assert max(refused) == 0.0


@pytest.mark.parametrize("loop", VIRTUAL)
def test_two_down_with_a_short_timeout_gives_timeouts_or_not_enough_replicas(loop: str) -> None:
    result = run_acks(small("two-down", duration=3.0, ack_timeout=0.5), loop)
    assert_answered_exactly_once(result)
    assert result.errors["REQUEST_TIMED_OUT"] > 0
    assert result.errors["NOT_ENOUGH_REPLICAS"] > 0
    assert "NONE" not in result.errors


@pytest.mark.parametrize("loop", VIRTUAL)
def test_timeouts_scenario_answers_request_timed_out_never_early(loop: str) -> None:
    result = run_acks(small("timeouts"), loop)
    assert_answered_exactly_once(result)
    timeout = result.config.request_timeout
    assert result.outcomes["expired"] > 0
    assert result.outcomes["completed"] > 0
    assert result.by_outcome_error[("expired", "REQUEST_TIMED_OUT")] > 0
    for latency, outcome, error in zip(
        result.latencies, result.request_outcomes, result.request_errors, strict=True
    ):
        if outcome == "expired":
            assert "REQUEST_TIMED_OUT" in error
            assert timeout <= latency <= timeout + TICK + 1e-9
        else:
            assert error == "NONE"
            assert latency <= timeout + TICK


@pytest.mark.parametrize("scenario", acks_all.SCENARIOS)
def test_acks_all_on_trio_virtual_time_equals_asyncio(scenario: str) -> None:
    config = small(scenario)
    # Exactly the same requests, latencies, ISR changes and statistics on both clocks.
    # One difference of order: in two-down both followers are down from the start, so
    # their timeouts at 0 wake both tasks at the same instant, and each appends its
    # "crash" line when it runs: asyncio runs tasks woken together in FIFO (broker)
    # order, trio in its seeded shuffled order, so the two lines may come swapped.
    unordered = ("follower_events",) if scenario == "two-down" else ()
    assert_same_run(run_acks(config), run_acks(config, "trio"), unordered=unordered)


def test_acks_all_on_trio_same_seed_same_run_ties_included() -> None:
    # Seeded, trio's scheduler shuffles tasks woken together the same way every run.
    config = small("two-down", duration=1.0, seed=3)
    first, second = acks_all.run(config, loop="trio"), acks_all.run(config, loop="trio")
    assert first == second
    assert [when for when, _, _ in first.follower_events] == [0.0, 0.0]


def test_same_seed_same_result_and_seed_matters() -> None:
    config = small("follower-crash", duration=3.0, seed=7)
    first, second = acks_all.run(config), acks_all.run(config)
    assert first.latencies == second.latencies
    assert first.by_outcome_error == second.by_outcome_error
    assert first.isr_changes == second.isr_changes
    assert first.statistics == second.statistics
    other = acks_all.run(small("follower-crash", duration=3.0, seed=8))
    assert other.latencies != first.latencies


def test_replication_factor_and_min_isr_are_configurable() -> None:
    # RF 1: the leader alone, min.insync 1: acks=all answers at once.
    alone = acks_all.run(
        small("healthy", duration=1.0, replication_factor=1, min_insync_replicas=1)
    )
    assert_answered_exactly_once(alone)
    assert alone.errors.keys() == {"NONE"}
    assert max(alone.latencies) == 0.0
    # min.insync above RF: every append is refused, as Kafka does.
    refused = acks_all.run(
        small("healthy", duration=1.0, replication_factor=2, min_insync_replicas=3)
    )
    assert refused.errors.keys() == {"NOT_ENOUGH_REPLICAS"}


def test_events_file_has_one_schema_2_line_per_request(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    config = small("timeouts", duration=1.0)
    for _ in range(2):  # the file is overwritten, not appended to
        result = acks_all.run(config, events=path)
    lines = path.read_text().splitlines()
    assert result.events_written == result.requests == len(lines)
    events = [json.loads(line) for line in lines]
    assert {e["schema"] for e in events} == {2}
    assert {e["event"] for e in events} == {"aiopurgatory.op_finished"}
    assert {e["op_type"] for e in events} == {"DelayedProduce"}
    assert {e["purgatory"] for e in events} == {"produce"}
    assert sorted(e["op_id"] for e in events) == list(range(result.requests))
    for event in events:
        assert event["outcome"] == result.request_outcomes[event["op_id"]]
        assert math.isclose(event["wait"], result.latencies[event["op_id"]], abs_tol=1e-9)
        assert (event["lateness"] is None) == (event["outcome"] == "completed")
        # The answer travels with the event: expired requests answered REQUEST_TIMED_OUT.
        label = result.request_errors[event["op_id"]]
        assert event["error"] == (None if label == "NONE" else label.replace("NONE+", ""))
    assert {e["error"] for e in events if e["outcome"] == "expired"} == {"REQUEST_TIMED_OUT"}


def test_events_file_carries_the_error_answers_of_the_cli_run(tmp_path: Path) -> None:
    """``--scenario two-down`` answers NOT_ENOUGH_REPLICAS*: no event may read as a success."""
    path = tmp_path / "F.jsonl"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.acks_all",
            "--scenario",
            "two-down",
            "--events",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert run.returncode == 0, run.stderr
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert events
    assert {e["schema"] for e in events} == {2}
    assert {e["outcome"] for e in events} == {"completed"}
    errors = Counter(e["error"] for e in events)
    assert set(errors) == {"NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND"}, errors


def test_events_file_on_trio_is_the_asyncio_file(tmp_path: Path) -> None:
    # The recorder's clock is the running backend's: virtual times, byte for byte.
    config = small("timeouts", duration=1.0)
    on_asyncio, on_trio = tmp_path / "asyncio.jsonl", tmp_path / "trio.jsonl"
    result = acks_all.run(config, events=on_asyncio)
    assert acks_all.run(config, events=on_trio, loop="trio").events_written == result.requests
    assert on_trio.read_text() == on_asyncio.read_text()
    assert len(on_trio.read_text().splitlines()) == result.requests > 0


def test_config_rejects_bad_values_naming_the_field() -> None:
    with pytest.raises(ValueError, match="scenario"):
        acks_all.Config(scenario="nope")
    with pytest.raises(ValueError, match="partitions"):
        acks_all.Config(partitions=0)
    with pytest.raises(ValueError, match="rate"):
        acks_all.Config(rate=float("nan"))
    with pytest.raises(ValueError, match="p99"):
        LogNormal(0.01, 0.001)


def test_cli_prints_the_summary_and_writes_a_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "latency.png"
    argv = ["--scenario", "follower-crash", "--duration", "5", "--rate", "100"]
    assert acks_all.main([*argv, "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "Produce requests by outcome and error code" in out
    assert "ISR changes" in out
    assert "shrink" in out
    assert "Purgatory statistics" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["--scenario", "bogus"],
        ["--rate", "-1"],
        ["--duration", "abc"],
        ["--fetch-p50", "0.5", "--fetch-p99", "0.1"],
        ["--loop", "uvloop"],  # real time only
        ["--no-such-flag"],
    ],
)
def test_cli_bad_flags_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        acks_all.main(argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("main", "argv"),
    [
        (acks_all.main, ["--scenario", "follower-crash", "--duration", "2", "--rate", "100"]),
        (long_poll_fetch.main, ["--duration", "2", "--seed", "3"]),
        (group_join.main, ["--members", "3", "--late", "1", "--duration", "6"]),
    ],
    ids=["acks_all", "long_poll_fetch", "group_join"],
)
def test_cli_loop_trio_prints_what_asyncio_prints(
    main: Callable[[list[str]], int], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 0
    on_asyncio = capsys.readouterr().out
    assert main([*argv, "--loop", "trio"]) == 0
    on_trio = capsys.readouterr().out
    assert "simulated in" in on_trio
    assert without_wall_time(on_trio) == without_wall_time(on_asyncio)


@pytest.mark.parametrize(
    "main",
    [acks_all.main, long_poll_fetch.main, group_join.main],
    ids=["acks_all", "long_poll_fetch", "group_join"],
)
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--loop", "bogus"], "argument --loop: invalid choice: 'bogus'"),
        (["--loop", "Trio"], "argument --loop: invalid choice: 'Trio'"),
        (["--loop", "uvloop"], "--loop uvloop needs --real-time"),
    ],
)
def test_cli_bad_loop_is_a_usage_error(
    main: Callable[[list[str]], int],
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err
    assert message in err


def test_run_rejects_a_bad_loop() -> None:
    config = long_poll_fetch.Config(duration=0.1)
    with pytest.raises(ValueError, match="loop must be one of asyncio, uvloop, trio"):
        long_poll_fetch.run(config, loop="bogus")
    with pytest.raises(ValueError, match="uvloop runs on real time only"):
        long_poll_fetch.run(config, loop="uvloop")


@pytest.mark.realtime
@pytest.mark.parametrize("loop", ["asyncio", "uvloop", "trio"])
def test_real_time_run_answers_everything(loop: str) -> None:
    result = acks_all.run(small("healthy", duration=0.3, rate=100.0), real_time=True, loop=loop)
    assert_answered_exactly_once(result)


# -- long_poll_fetch ----------------------------------------------------------------------------


def run_fetch(config: long_poll_fetch.Config, loop: str = "asyncio") -> long_poll_fetch.FetchResult:
    return cached(long_poll_fetch.run, config, loop)


@pytest.mark.parametrize("loop", VIRTUAL)
def test_fetch_completes_with_min_bytes_or_expires_with_less(loop: str) -> None:
    config = long_poll_fetch.Config(duration=5.0)
    result = run_fetch(config, loop)
    assert Counter(result.answers.values()) == {1: result.fetches}
    assert result.outcomes["completed"] > 0
    assert result.outcomes["expired"] > 0
    for outcome, wait, size in result.fetch_log:
        if outcome == "completed":
            assert size >= config.fetch_min_bytes
            assert wait < config.fetch_max_wait
        else:
            assert size < config.fetch_min_bytes
            assert config.fetch_max_wait <= wait <= config.fetch_max_wait + TICK + 1e-9
    # Every record reaches its consumer exactly once.
    assert result.records_consumed == result.records_produced > 0
    assert result.bytes_consumed == result.bytes_produced
    assert result.duplicates == result.gaps == 0
    assert result.statistics.pending == 0


@pytest.mark.parametrize("loop", VIRTUAL)
def test_fetch_without_producers_expires_empty_after_max_wait(loop: str) -> None:
    config = long_poll_fetch.Config(rate=0, duration=2.0, fetch_max_wait=0.25)
    result = run_fetch(config, loop)
    assert result.outcomes == {"expired": result.fetches}
    assert result.empty_responses == result.fetches >= config.consumers * 4
    assert all(0.25 <= wait <= 0.25 + TICK + 1e-9 for _, wait, _ in result.fetch_log)


@pytest.mark.parametrize("loop", VIRTUAL)
def test_lower_min_bytes_means_shorter_waits(loop: str) -> None:
    eager = run_fetch(long_poll_fetch.Config(duration=3.0, fetch_min_bytes=1), loop)
    batched = run_fetch(long_poll_fetch.Config(duration=3.0, fetch_min_bytes=32_000), loop)
    assert eager.fetches > 5 * batched.fetches
    assert eager.wait_percentiles("completed")["p50"] < batched.wait_percentiles("completed")["p50"]
    assert eager.records_consumed == eager.records_produced
    assert percentile(sorted(eager.delivery_latencies), 50) < percentile(
        sorted(batched.delivery_latencies), 50
    )


def test_fetch_max_bytes_caps_responses() -> None:
    config = long_poll_fetch.Config(
        duration=2.0, rate=2000, fetch_min_bytes=1500, fetch_max_bytes=2000
    )
    result = long_poll_fetch.run(config)
    assert max(size for _, _, size in result.fetch_log) <= 2000
    assert result.records_consumed == result.records_produced
    assert result.duplicates == result.gaps == 0


@pytest.mark.parametrize(
    "config",
    [
        long_poll_fetch.Config(duration=5.0),
        long_poll_fetch.Config(rate=0, duration=2.0, fetch_max_wait=0.25),
        long_poll_fetch.Config(duration=3.0, fetch_min_bytes=1),
        long_poll_fetch.Config(duration=3.0, fetch_min_bytes=32_000),
    ],
    ids=["default", "no-producer", "min-bytes-1", "min-bytes-32000"],
)
def test_long_poll_fetch_on_trio_virtual_time_equals_asyncio(
    config: long_poll_fetch.Config,
) -> None:
    # The same fetches (outcome, wait, size), records, deliveries and statistics on
    # both clocks. Only the order of two lists can differ: consumers that send at the
    # same instant (all of them at the start; and after fetches sent together expire
    # in the same timer tick) take fetch ids in the order they run, FIFO on asyncio
    # and seeded-shuffled on trio; fetch_log is in fetch id order and
    # delivery_latencies in delivery order, so they hold the same entries in another order.
    assert_same_run(
        run_fetch(config),
        run_fetch(config, "trio"),
        unordered=("fetch_log", "delivery_latencies"),
    )


@pytest.mark.realtime
@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_long_poll_fetch_real_time(loop: str) -> None:
    config = long_poll_fetch.Config(
        duration=0.3, rate=400, fetch_min_bytes=8 * 1024, fetch_max_wait=0.1
    )
    result = long_poll_fetch.run(config, real_time=True, loop=loop)
    assert result.fetches > 0
    assert Counter(result.answers.values()) == {1: result.fetches}
    for outcome, wait, size in result.fetch_log:
        if outcome == "completed":
            assert size >= config.fetch_min_bytes
        else:
            assert size < config.fetch_min_bytes
            assert wait >= config.fetch_max_wait  # never early, by the loop's own clock
    assert result.records_consumed == result.records_produced > 0
    assert result.duplicates == result.gaps == 0
    assert result.statistics.pending == 0
    assert result.elapsed >= config.duration


@pytest.mark.realtime
def test_long_poll_fetch_cli_real_time_on_trio(capsys: pytest.CaptureFixture[str]) -> None:
    # The exit status is 0 only if every fetch was answered once, with no record lost.
    argv = ["--real-time", "--loop", "trio", "--duration", "0.2", "--fetch-max-wait", "0.05"]
    assert long_poll_fetch.main(argv) == 0
    assert "fetches:" in capsys.readouterr().out


def test_long_poll_fetch_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert long_poll_fetch.main(["--duration", "1", "--seed", "3"]) == 0
    assert "fetches:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        long_poll_fetch.main(["--fetch-min-bytes", "0"])
    assert exc.value.code == 2
    first = long_poll_fetch.run(long_poll_fetch.Config(duration=1.0, seed=5))
    second = long_poll_fetch.run(long_poll_fetch.Config(duration=1.0, seed=5))
    assert first.fetch_log == second.fetch_log


# -- group_join --------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", VIRTUAL)
def test_late_members_are_removed_when_the_join_expires(loop: str) -> None:
    config = group_join.Config(members=5, late=2, duration=8.0)
    assert config.new_member_at is not None
    result = group_join.run(config, loop=loop)
    first, second, third = result.rebalances
    assert (first.generation, first.op_type, first.outcome) == (1, "InitialDelayedJoin", "expired")
    assert len(first.members) == 5
    assert first.finished - first.started >= config.initial_rebalance_delay
    # The new member's join starts a rebalance that expires after the rebalance timeout...
    assert (second.op_type, second.outcome) == ("DelayedJoin", "expired")
    assert second.started == config.new_member_at
    expiry = config.new_member_at + config.rebalance_timeout
    assert expiry <= second.finished <= expiry + TICK + 1e-9
    # ... removing exactly the late members from generation 2.
    assert len(second.removed) == 2
    assert not set(second.removed) & set(second.members)
    assert len(second.members) == 5 + 1 - 2
    # They come back as new members (after UNKNOWN_MEMBER_ID): generation 3 completes
    # as soon as everyone has joined, well before its timeout.
    assert result.join_errors["UNKNOWN_MEMBER_ID"] == 2
    assert (third.outcome, len(third.members)) == ("completed", 6)
    assert third.finished - third.started < config.rebalance_timeout
    assert (result.generation, result.state, len(result.members)) == (3, "Stable", 6)
    assert result.join_requests == result.join_responses
    assert result.statistics.pending == 0


@pytest.mark.parametrize("loop", VIRTUAL)
def test_join_completes_when_every_member_has_joined(loop: str) -> None:
    config = group_join.Config(members=4, late=0, duration=5.0)
    assert config.new_member_at is not None
    result = group_join.run(config, loop=loop)
    assert [r.outcome for r in result.rebalances] == ["expired", "completed"]
    second = result.rebalances[1]
    assert second.removed == ()
    assert len(second.members) == 5
    assert second.finished < config.new_member_at + config.rebalance_timeout
    assert result.join_errors == {"NONE": result.join_requests}


def test_group_join_cli_and_determinism(capsys: pytest.CaptureFixture[str]) -> None:
    assert group_join.main(["--members", "3", "--late", "1", "--duration", "6"]) == 0
    out = capsys.readouterr().out
    assert "generation 2: DelayedJoin expired" in out
    with pytest.raises(SystemExit) as exc:
        group_join.main(["--members", "2", "--late", "3"])
    assert exc.value.code == 2
    config = group_join.Config(seed=4)
    assert group_join.run(config).rebalances == group_join.run(config).rebalances


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_group_join_on_trio_virtual_time_equals_asyncio(seed: int) -> None:
    # Exactly equal, order included. Members are woken together (a completed join
    # answers all of them, then they heartbeat in step) and trio runs them in another
    # order than asyncio, but nothing they do then depends on it: a heartbeat only
    # reads the group's state, and each member draws from its own random generator.
    # (Member ids would: see the next test.)
    config = group_join.Config(seed=seed)
    assert group_join.run(config, loop="trio") == group_join.run(config)


def test_group_join_members_joining_together_may_get_other_ids_on_trio() -> None:
    # With no initial delay every member starts, and sends its first JoinGroup, at 0;
    # member ids are handed out in arrival order, which for tasks woken together is
    # FIFO on asyncio and a seeded shuffle on trio. Same timeline, other names.
    def timeline(result: group_join.GroupResult) -> list[tuple[object, ...]]:
        return [
            (r.generation, r.op_type, r.outcome, r.started, r.finished, len(r.members))
            for r in result.rebalances
        ]

    renamed = 0
    for seed in (1, 2, 3, 4):
        config = group_join.Config(members=8, late=3, initial_rebalance_delay=0.0, seed=seed)
        on_asyncio, on_trio = group_join.run(config), group_join.run(config, loop="trio")
        assert timeline(on_trio) == timeline(on_asyncio)
        assert [len(r.removed) for r in on_trio.rebalances] == [0, 3, 0]
        assert on_trio.join_errors == on_asyncio.join_errors
        assert on_trio.statistics == on_asyncio.statistics
        renamed += on_trio.rebalances[1].removed != on_asyncio.rebalances[1].removed
    # The late members are the same consumers, but they do not keep their ids.
    assert renamed > 0


@pytest.mark.parametrize("loop", VIRTUAL)
def test_group_join_default_run_prints_what_the_page_shows(loop: str) -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "examples" / "group_join.md"
    shown = re.search(r"```text\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)
    assert shown is not None
    result = group_join.run(group_join.Config(), loop=loop)
    summary = [line.strip() for line in group_join.format_summary(result, 0.0).splitlines()]
    for line in shown[1].splitlines():
        assert line in summary


@pytest.mark.realtime
@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_group_join_real_time(loop: str) -> None:
    # The default timeline scaled down about tenfold: generation 1 forms by about
    # 0.07 s, the new member joins at 0.15 s, members rejoin within about 0.15 s of
    # the rebalance (well inside its 0.3 s timeout) but the late one only after it,
    # and generation 3 completes by about 0.7 s. The run lasts twice that: nothing
    # follows generation 3 (members leave no session to time out), and a loaded
    # machine stretches the timeline.
    config = group_join.Config(
        members=3,
        late=1,
        new_member_at=0.15,
        rebalance_timeout=0.3,
        initial_rebalance_delay=0.03,
        heartbeat_interval=0.02,
        rejoin_delay=LogNormal(0.06, 0.12),
        duration=1.6,
    )
    result = group_join.run(config, real_time=True, loop=loop)
    first, second, third = result.rebalances
    assert (first.op_type, first.outcome, len(first.members)) == (
        "InitialDelayedJoin",
        "expired",
        3,
    )
    assert (second.op_type, second.outcome, len(second.removed)) == ("DelayedJoin", "expired", 1)
    assert second.finished - second.started >= config.rebalance_timeout  # never early
    assert (third.outcome, len(third.members)) == ("completed", 4)
    assert result.join_errors["UNKNOWN_MEMBER_ID"] == 1
    assert (result.generation, result.state) == (3, "Stable")
    assert result.statistics.pending == 0


# -- core issue found while writing the examples ----------------------------------------------


@pytest.mark.virtual_time
async def test_event_recorder_file_ignores_global_structlog_level() -> None:
    # An application that filters its own logs at WARNING must still get its event log.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    sink = io.StringIO()
    recorder = EventRecorder(sink)
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("p")
    recorder.attach(purgatory)
    await purgatory.watch(ap.DelayedOperation(0.01), ["k"])
    assert recorder.events == 1
    assert len(sink.getvalue().splitlines()) == 1
