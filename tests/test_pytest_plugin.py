"""The shipped pytest plugin: opt-in virtual time for users' async tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

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
    page = (Path(__file__).resolve().parent.parent / "docs" / "howto" / "testing.md").read_text()
    match = re.search(rf"<!-- pytest: {name} -->\n```python\n(.*?)^```$", page, re.S | re.M)
    assert match is not None, f"no snippet {name} in testing.md"
    return match[1]


@pytest.mark.parametrize(("snippet", "tests"), [("testing-howto", 3), ("testing-howto-fixture", 1)])
def test_the_how_to_pages_tests_pass_as_shown(
    pytester: pytest.Pytester, snippet: str, tests: int
) -> None:
    # As in a user's project: its own configuration file, pytest-asyncio in its
    # default (strict) mode, nothing passed on the command line but -W error.
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
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
