"""The shipped pytest plugin: opt-in virtual time for users' async tests."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _users_runs_without_hypothesis(monkeypatch: pytest.MonkeyPatch) -> None:
    # The users' pytest runs below load every installed plugin, as a user's do,
    # but Hypothesis's: its plugin imports Hypothesis whole, more than half of
    # each run's start-up here (1.3 of 2.5 CPU seconds), and no test here uses it.
    given = os.environ.get("PYTEST_ADDOPTS", "")
    monkeypatch.setenv("PYTEST_ADDOPTS", f"{given} -p no:hypothesispytest".strip())


AUTO = ("-o", "asyncio_mode=auto", "-o", "asyncio_default_fixture_loop_scope=function")
STRICT = ("-o", "asyncio_mode=strict", "-o", "asyncio_default_fixture_loop_scope=function")

USERS_TEST = """
import asyncio

import pytest

import aiopurgatory as ap
from aiopurgatory.simulation import VirtualTimeLoop


class Request(ap.DelayedOperation):
    pass


@pytest.mark.virtual_time
async def test_a_30_second_timeout_in_no_time():
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop)
    purgatory = ap.Purgatory("requests")
    outcome = await purgatory.watch(Request(timeout=30.0), ["topic-0"])
    assert outcome is ap.Outcome.EXPIRED
    assert loop.time() == 30.0


@pytest.mark.virtual_time
async def test_ap_timeout_cancels_at_exactly_its_deadline():
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        async with ap.timeout(30):
            await asyncio.sleep(3600)
    assert loop.time() == 30.0


@pytest.mark.virtual_time(start=100.0)
async def test_start():
    assert asyncio.get_running_loop().time() == 100.0


async def test_the_fixture_implies_virtual_time(virtual_loop):
    assert asyncio.get_running_loop() is virtual_loop
    virtual_loop.advance_to(5.0)
    await asyncio.sleep(1)
    assert virtual_loop.time() == 6.0


async def test_unmarked_tests_keep_the_real_loop():
    assert not isinstance(asyncio.get_running_loop(), VirtualTimeLoop)
"""

STRICT_PREFIX = """
import pytest
pytestmark = pytest.mark.asyncio
"""


def test_marked_tests_run_on_virtual_time_in_auto_mode(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_users=USERS_TEST)
    result = pytester.runpytest_subprocess(*AUTO, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5)


def test_marked_tests_run_on_virtual_time_in_strict_mode(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_users=STRICT_PREFIX + USERS_TEST)
    result = pytester.runpytest_subprocess(*STRICT, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5)


def test_a_virtual_time_test_with_threads_tears_down_under_w_error(
    pytester: pytest.Pytester,
) -> None:
    # pytest-asyncio closes the test's loop with asyncio.Runner.close(), which shuts
    # the default executor down: on 3.13 with a timeout on the loop's clock, which
    # jumped over it while the join thread ran (a RuntimeWarning, an error here).
    pytester.makepyfile(
        test_threads="""
        import asyncio
        import time

        import pytest


        @pytest.mark.virtual_time
        async def test_threads():
            loop = asyncio.get_running_loop()
            loop.run_in_executor(None, time.sleep, 0.2)  # still at work at teardown
            async with asyncio.timeout(1):
                await asyncio.to_thread(time.sleep, 0.05)
            assert loop.time() == 0.0
            await asyncio.sleep(2)
            assert loop.time() == 2.0
        """
    )
    result = pytester.runpytest_subprocess(*AUTO, "-p", "no:cacheprovider", "-W", "error")
    result.assert_outcomes(passed=1)


def test_in_strict_mode_the_marker_or_the_fixture_is_enough(pytester: pytest.Pytester) -> None:
    # Issue 30: pytest-asyncio's default mode is strict; virtual_time alone must do.
    pytester.makepyfile(
        test_users="""
        import asyncio

        import pytest

        from aiopurgatory.simulation import VirtualTimeLoop


        @pytest.mark.virtual_time
        async def test_marked():
            assert isinstance(asyncio.get_running_loop(), VirtualTimeLoop)


        async def test_fixture_only(virtual_loop):
            assert asyncio.get_running_loop() is virtual_loop


        @pytest.mark.virtual_time
        class TestMarkedClass:
            async def test_method(self):
                await asyncio.sleep(5)
                assert asyncio.get_running_loop().time() == 5.0


        @pytest.mark.virtual_time
        @pytest.mark.asyncio(loop_scope="function")
        async def test_own_asyncio_marker_kept():
            assert isinstance(asyncio.get_running_loop(), VirtualTimeLoop)
        """
    )
    result = pytester.runpytest_subprocess(*STRICT, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)


def test_a_sync_test_marked_for_virtual_time_says_what_is_missing(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_users="""
        import pytest

        @pytest.mark.virtual_time
        def test_not_async():
            pass
        """
    )
    result = pytester.runpytest_subprocess(*STRICT, "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*virtual time applies to async tests*"])


def test_a_projects_loop_matrix_is_overridden_only_for_virtual_tests(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        """
        import asyncio

        def pytest_asyncio_loop_factories(config, item):
            return {"one": asyncio.new_event_loop, "two": asyncio.new_event_loop}
        """
    )
    pytester.makepyfile(
        test_users="""
        import asyncio
        import pytest
        from aiopurgatory.simulation import VirtualTimeLoop

        @pytest.fixture
        async def loop_of_fixture():
            return asyncio.get_running_loop()

        @pytest.mark.virtual_time
        async def test_virtual(loop_of_fixture):
            loop = asyncio.get_running_loop()
            assert isinstance(loop, VirtualTimeLoop)
            assert loop_of_fixture is loop  # async fixtures share the virtual loop

        async def test_matrix():
            assert not isinstance(asyncio.get_running_loop(), VirtualTimeLoop)
        """
    )
    result = pytester.runpytest_subprocess(*AUTO, "-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*test_matrix?one? PASSED*", "*test_matrix?two? PASSED*"])
    result.stdout.no_fnmatch_line("*test_virtual?one?*")


def test_bad_marker_arguments_are_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_users="""
        import pytest

        @pytest.mark.virtual_time(start="soon")
        async def test_bad_start():
            pass
        """
    )
    result = pytester.runpytest_subprocess(*AUTO, "-p", "no:cacheprovider")
    assert result.ret != 0
    assert "virtual_time: start must be a number of seconds, got str" in (
        result.stdout.str() + result.stderr.str()
    )


def _docs_test_file(name: str) -> str:
    """The ```python block marked ``<!-- pytest: NAME -->`` in docs/howto/testing.md."""
    return _docs_block("pytest", name, "python")


def _docs_block(kind: str, name: str, language: str) -> str:
    """The ```LANGUAGE block marked ``<!-- KIND: NAME -->`` in docs/howto/testing.md."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "howto" / "testing.md").read_text()
    pattern = rf"<!-- {kind}: {name} -->\n```{language}\n(.*?)^```$"
    match = re.search(pattern, page, re.S | re.M)
    assert match is not None, f"no {kind} block {name} in testing.md"
    return match[1]


@pytest.mark.parametrize(
    ("snippet", "tests"),
    [("testing-howto", 3), ("testing-howto-fixture", 1), ("testing-howto-triggers", 2)],
)
def test_the_how_to_pages_tests_pass_as_shown(
    pytester: pytest.Pytester, snippet: str, tests: int
) -> None:
    # As in a user's project: the configuration the page gives, pytest-asyncio in
    # its default (strict) mode, nothing passed on the command line but -W error.
    pytester.makepyprojecttoml(_docs_block("pytest-config", "testing-howto", "toml"))
    pytester.makepyfile(test_from_docs=_docs_test_file(snippet))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error")
    result.assert_outcomes(passed=tests)
    result.stdout.fnmatch_lines(["*asyncio: mode=Mode.STRICT*"])


def test_the_how_to_pages_tests_pass_with_an_empty_configuration(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_from_docs=_docs_test_file("testing-howto"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


PLAIN_ASYNC_FIXTURES = """
import asyncio

import pytest

import aiopurgatory as ap
from aiopurgatory.simulation import VirtualTimeLoop

TORN_DOWN = []


@pytest.fixture
async def purgatory():
    async with ap.Purgatory("fixture") as purgatory:
        yield purgatory
    TORN_DOWN.append(asyncio.get_running_loop().time())


@pytest.fixture
async def fixture_loop():
    await asyncio.sleep(2)  # virtual: the test starts at t=2
    return asyncio.get_running_loop()


@pytest.fixture
async def derived(fixture_loop, purgatory):
    return fixture_loop, purgatory


@pytest.mark.virtual_time
async def test_plain_async_fixtures(purgatory, fixture_loop):
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop)
    assert fixture_loop is loop
    assert loop.time() == 2.0
    assert await purgatory.watch(ap.DelayedOperation(30.0), ["k"]) is ap.Outcome.EXPIRED
    assert loop.time() == 32.0


@pytest.mark.virtual_time(start=50.0)
async def test_fixtures_that_use_fixtures(derived):
    fixture_loop, purgatory = derived
    assert fixture_loop is asyncio.get_running_loop()
    assert fixture_loop.time() == 52.0
    assert isinstance(purgatory, ap.Purgatory)


async def test_fixture_only_with_a_plain_fixture(virtual_loop, fixture_loop):
    assert fixture_loop is virtual_loop


@pytest.mark.virtual_time
class TestInAClass:
    @pytest.fixture
    async def method_fixture(self):
        return asyncio.get_running_loop()

    async def test_method(self, method_fixture):
        assert method_fixture is asyncio.get_running_loop()


def test_teardowns_ran_on_virtual_time():
    # After the tests above: the async generator fixture's teardown ran, on the
    # virtual loop of its test (its clock at the test's end).
    assert TORN_DOWN == [32.0, 52.0]
"""


@pytest.mark.parametrize("mode", ["strict", "auto"])
def test_plain_async_fixtures_run_on_virtual_time_in_both_modes(
    pytester: pytest.Pytester, mode: str
) -> None:
    # Issue 39: the how-to says the marker runs the test "and its async fixtures";
    # with plain @pytest.fixture, pytest-asyncio's strict mode left them to pytest,
    # which refuses async fixtures.
    pytester.makeini(
        f"[pytest]\nasyncio_mode = {mode}\nasyncio_default_fixture_loop_scope = function\n"
    )
    pytester.makepyfile(test_users=PLAIN_ASYNC_FIXTURES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error", "-v")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines([f"*asyncio: mode=Mode.{mode.upper()}*"])


def test_the_fixture_is_handed_over_only_for_virtual_time_tests(pytester: pytest.Pytester) -> None:
    # Strict mode leaves plain async fixtures to other plugins (pytest-trio, say):
    # the plugin hands one to pytest-asyncio while a virtual-time test runs, and
    # takes it back afterwards.
    pytester.makeini(
        "[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n"
    )
    pytester.makepyfile(
        test_users="""
        import asyncio

        import pytest

        async def _answer():
            return asyncio.get_running_loop().time()

        answer = pytest.fixture(name="answer")(_answer)
        DURING = []

        @pytest.fixture
        def flag_now():
            return lambda: getattr(_answer, "_force_asyncio_fixture", False)

        @pytest.mark.virtual_time(start=7.0)
        async def test_virtual(answer, flag_now):
            assert answer == 7.0
            DURING.append(flag_now())

        def test_afterwards():
            assert DURING == [True]
            assert not hasattr(_answer, "_force_asyncio_fixture")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error")
    result.assert_outcomes(passed=2)
