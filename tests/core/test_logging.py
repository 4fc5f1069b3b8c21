"""The library is quiet by default: stdlib logging unless the application set up structlog."""

from __future__ import annotations

import asyncio
import gc
import logging
import subprocess
import sys
import textwrap

import pytest
import structlog
from structlog.testing import capture_logs

import aiopurgatory as ap
from aiopurgatory import simulation


class Boom(Exception):
    pass


class FailingOp(ap.DelayedOperation):
    def on_complete(self) -> None:
        raise Boom("on_complete failed")


async def _routine_and_failing_work() -> None:
    """Completion, expiry, a failing callback, timer lag and close: every event kind."""
    loop = asyncio.get_running_loop()
    purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("quiet")
    ok = ap.DelayedOperation(1.0)
    purgatory.try_complete_else_watch(ok, ["k"])
    ok.force_complete()
    assert await purgatory.watch(ap.DelayedOperation(0.01), ["k"]) is ap.Outcome.EXPIRED
    failing = FailingOp(1.0)
    purgatory.try_complete_else_watch(failing, ["k"])
    failing.force_complete()
    del failing  # its failure reached nobody: logged once it is collected
    await asyncio.sleep(0)  # (the timer lets go of it on its next flush)
    gc.collect()
    timer = ap.Timer()
    timer.call_later(0.001, lambda: None)
    await asyncio.sleep(0)
    if isinstance(loop, simulation.VirtualTimeLoop):
        loop.advance(1.0)  # the timer wakes up a second late: timer_lag
    await asyncio.sleep(0.01)
    purgatory.close()


def _run_script(body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_a_program_that_only_uses_the_library_prints_nothing() -> None:
    result = _run_script(
        """
        import asyncio, time
        import aiopurgatory as ap

        async def main():
            async with ap.Purgatory("quiet") as purgatory:
                ok = ap.DelayedOperation(1.0)
                purgatory.try_complete_else_watch(ok, ["k"])
                ok.force_complete()
                await purgatory.watch(ap.DelayedOperation(0.01), ["k"])
                timer = ap.Timer()
                timer.call_later(0.001, lambda: None)
                await asyncio.sleep(0)
                time.sleep(0.1)  # block the loop: the timer wakes up late (timer_lag)
                await asyncio.sleep(0.01)

        asyncio.run(main())
        """
    )
    assert (result.stdout, result.stderr) == ("", "")


def test_callback_failures_stay_visible_without_any_logging_set_up() -> None:
    result = _run_script(
        """
        import asyncio
        import aiopurgatory as ap

        class Failing(ap.DelayedOperation):
            def on_complete(self):
                raise RuntimeError("on_complete failed")

        async def main():
            purgatory = ap.Purgatory("quiet")
            op = Failing(1.0)
            purgatory.try_complete_else_watch(op, ["k"])
            op.force_complete()
            purgatory.close()

        asyncio.run(main())
        """
    )
    assert result.stdout == ""
    # Python's last-resort handler: WARNING and above on stderr, with the traceback.
    assert "aiopurgatory.callback_failed" in result.stderr
    assert "RuntimeError: on_complete failed" in result.stderr
    assert "purgatory_closed" not in result.stderr


def test_without_structlog_set_up_events_go_to_the_stdlib_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    structlog.reset_defaults()
    caplog.set_level(logging.DEBUG, logger="aiopurgatory")
    simulation.run(_routine_and_failing_work())
    records = [r for r in caplog.records if r.name == "aiopurgatory"]
    events = {r.aiopurgatory["event"]: r for r in records}  # type: ignore[attr-defined]
    assert set(events) == {
        "aiopurgatory.callback_failed",
        "aiopurgatory.timer_lag",
        "aiopurgatory.purgatory_closed",
    }
    failed = events["aiopurgatory.callback_failed"]
    assert failed.levelno == logging.ERROR
    assert failed.exc_info is not None
    assert isinstance(failed.exc_info[1], Boom)
    assert failed.aiopurgatory["purgatory"] == "quiet"  # type: ignore[attr-defined]
    assert failed.aiopurgatory["callback"] == "on_complete"  # type: ignore[attr-defined]
    assert failed.getMessage().startswith("aiopurgatory.callback_failed ")
    assert "callback='on_complete'" in failed.getMessage()
    assert events["aiopurgatory.purgatory_closed"].levelno == logging.DEBUG
    assert events["aiopurgatory.timer_lag"].levelno == logging.DEBUG


def test_the_stdlib_default_threshold_hides_routine_events(
    caplog: pytest.LogCaptureFixture,
) -> None:
    structlog.reset_defaults()
    caplog.set_level(logging.WARNING, logger="aiopurgatory")
    simulation.run(_routine_and_failing_work())
    events = [r.aiopurgatory["event"] for r in caplog.records if r.name == "aiopurgatory"]  # type: ignore[attr-defined]
    assert events == ["aiopurgatory.callback_failed"]


def test_with_structlog_set_up_events_go_to_structlog(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="aiopurgatory")
    with capture_logs() as logs:  # configures structlog
        simulation.run(_routine_and_failing_work())
    assert [r for r in caplog.records if r.name == "aiopurgatory"] == []
    by_event = {entry["event"]: entry for entry in logs}
    assert set(by_event) == {
        "aiopurgatory.callback_failed",
        "aiopurgatory.timer_lag",
        "aiopurgatory.purgatory_closed",
    }
    assert by_event["aiopurgatory.callback_failed"]["log_level"] == "error"
    assert by_event["aiopurgatory.callback_failed"]["purgatory"] == "quiet"
    assert by_event["aiopurgatory.purgatory_closed"]["log_level"] == "debug"


def test_structlog_set_up_after_the_purgatory_was_made_is_followed() -> None:
    structlog.reset_defaults()

    async def main() -> None:
        purgatory: ap.Purgatory[ap.DelayedOperation] = ap.Purgatory("late")
        with capture_logs() as logs:
            op = FailingOp(1.0)
            purgatory.try_complete_else_watch(op, ["k"])
            op.force_complete()
            del op
            await asyncio.sleep(0)
            gc.collect()
            await asyncio.sleep(0)
        assert [entry["event"] for entry in logs] == ["aiopurgatory.callback_failed"]

    simulation.run(main())
