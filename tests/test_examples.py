"""The examples, run small on virtual time, with the outcomes each scenario must produce."""

from __future__ import annotations

import io
import json
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

import aiopurgatory as ap
from aiopurgatory.events import EventRecorder
from examples import acks_all, group_join, long_poll_fetch
from examples._kafka import Errors, LogNormal, TopicPartition, percentile

TICK = 0.001  # the default wheel tick: expiry is never early and at most one tick late


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    # The examples' main() configures structlog (they are applications); undo it.
    yield
    structlog.reset_defaults()


def small(scenario: str, **overrides: object) -> acks_all.Config:
    settings: dict[str, object] = {"scenario": scenario, "duration": 5.0, "rate": 200.0}
    settings.update(overrides)
    return acks_all.Config(**settings)  # type: ignore[arg-type]


_cache: dict[acks_all.Config, acks_all.AcksAllResult] = {}


def run_acks(config: acks_all.Config) -> acks_all.AcksAllResult:
    # Runs are deterministic, so each configuration is simulated once per session.
    if config not in _cache:
        _cache[config] = acks_all.run(config)
    return _cache[config]


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


def test_healthy_has_no_timeouts_and_no_isr_changes() -> None:
    result = run_acks(small("healthy"))
    assert_answered_exactly_once(result)
    assert result.by_outcome_error == {("completed", "NONE"): result.requests}
    assert result.isr_changes == []
    assert result.latency_percentiles()["max"] < result.config.request_timeout
    assert result.high_watermarks == result.log_end_offsets


def test_follower_crash_shrinks_the_isr_and_still_succeeds() -> None:
    result = run_acks(small("follower-crash"))
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


def test_slow_follower_leaves_and_rejoins_the_isr() -> None:
    result = run_acks(small("slow-follower"))
    assert_answered_exactly_once(result)
    assert result.outcomes == {"completed": result.requests}
    kinds = Counter(c.kind for c in result.isr_changes)
    assert kinds["shrink"] >= 1
    assert kinds["expand"] >= 1
    assert {b for c in result.isr_changes for b in set(c.before) ^ set(c.after)} == {2}
    healthy = run_acks(small("healthy"))
    assert result.latency_percentiles()["p99"] > 5 * healthy.latency_percentiles()["p99"]


def test_two_down_never_acknowledges() -> None:
    result = run_acks(small("two-down"))
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


def test_two_down_with_a_short_timeout_gives_timeouts_or_not_enough_replicas() -> None:
    result = run_acks(small("two-down", duration=3.0, ack_timeout=0.5))
    assert_answered_exactly_once(result)
    assert result.errors["REQUEST_TIMED_OUT"] > 0
    assert result.errors["NOT_ENOUGH_REPLICAS"] > 0
    assert "NONE" not in result.errors


def test_timeouts_scenario_answers_request_timed_out_never_early() -> None:
    result = run_acks(small("timeouts"))
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


def test_events_file_has_one_schema_1_line_per_request(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    config = small("timeouts", duration=1.0)
    for _ in range(2):  # the file is overwritten, not appended to
        result = acks_all.run(config, events=path)
    lines = path.read_text().splitlines()
    assert result.events_written == result.requests == len(lines)
    events = [json.loads(line) for line in lines]
    assert {e["schema"] for e in events} == {1}
    assert {e["event"] for e in events} == {"aiopurgatory.op_finished"}
    assert {e["op_type"] for e in events} == {"DelayedProduce"}
    assert {e["purgatory"] for e in events} == {"produce"}
    assert sorted(e["op_id"] for e in events) == list(range(result.requests))
    for event in events:
        assert event["outcome"] == result.request_outcomes[event["op_id"]]
        assert math.isclose(event["wait"], result.latencies[event["op_id"]], abs_tol=1e-9)
        assert (event["lateness"] is None) == (event["outcome"] == "completed")


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


@pytest.mark.realtime
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_real_time_run_answers_everything(loop: str) -> None:
    result = acks_all.run(small("healthy", duration=0.3, rate=100.0), real_time=True, loop=loop)
    assert_answered_exactly_once(result)


# -- long_poll_fetch ----------------------------------------------------------------------------


def test_fetch_completes_with_min_bytes_or_expires_with_less() -> None:
    config = long_poll_fetch.Config(duration=5.0)
    result = long_poll_fetch.run(config)
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


def test_fetch_without_producers_expires_empty_after_max_wait() -> None:
    config = long_poll_fetch.Config(rate=0, duration=2.0, fetch_max_wait=0.25)
    result = long_poll_fetch.run(config)
    assert result.outcomes == {"expired": result.fetches}
    assert result.empty_responses == result.fetches >= config.consumers * 4
    assert all(0.25 <= wait <= 0.25 + TICK + 1e-9 for _, wait, _ in result.fetch_log)


def test_lower_min_bytes_means_shorter_waits() -> None:
    eager = long_poll_fetch.run(long_poll_fetch.Config(duration=3.0, fetch_min_bytes=1))
    batched = long_poll_fetch.run(long_poll_fetch.Config(duration=3.0, fetch_min_bytes=32_000))
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


def test_late_members_are_removed_when_the_join_expires() -> None:
    config = group_join.Config(members=5, late=2, duration=8.0)
    assert config.new_member_at is not None
    result = group_join.run(config)
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


def test_join_completes_when_every_member_has_joined() -> None:
    config = group_join.Config(members=4, late=0, duration=5.0)
    assert config.new_member_at is not None
    result = group_join.run(config)
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
