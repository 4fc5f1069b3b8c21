"""Test configuration: every async test runs on each event loop of the matrix.

* By default: the standard asyncio loop and uvloop (real time; assert with tolerances).
* Tests marked ``@pytest.mark.virtual_time`` (or asking for ``virtual_loop``) run on
  aiopurgatory's virtual-time loop only (exact time assertions; ``loop.time()``
  starts at 0): the package's own pytest plugin (``aiopurgatory.pytest_plugin``,
  loaded by its ``pytest11`` entry point) overrides the matrix for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import structlog

# Real Redis for the tests of aiopurgatory.redis (and the examples using it).
from tests.support.redis import (  # noqa: F401
    redis_client,
    redis_server,
    redis_server_factory,
)

try:
    import uvloop

    _uvloop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
except ImportError:  # pragma: no cover - uvloop is part of the test install
    _uvloop_factory = None


@pytest.fixture(autouse=True)
def _structlog_isolation() -> Iterator[None]:
    # Applications under test (examples, the broker, CLIs) configure structlog
    # globally; give every test structlog's defaults back afterwards.
    yield
    structlog.reset_defaults()


# -- which tests each pass of `make test` runs (docs/pythons.md) ------------------------
#
# `library`: the tests of the library itself, what a user's install runs. They run on
# every Python of the matrix, on the compiled core (the pure-Python passes run the
# folders of them that test what differs between the cores: the Makefile's
# PURE_TESTS). Every test is one, unless its module is listed here as exercising
# something built on the library (and needing that something's extras, which the
# other Pythons' venvs do not install):
NOT_LIBRARY = (
    "tests/pipeline/",  # the Spark pipeline (pyspark, Java): the spark extra
    "tests/examples/",  # the examples: the Kafka broker (Kafka clients), the long-poll
    # feed under real servers (web servers), the others, and how they are installed
    "tests/jobs/",  # the job systems' integrations (Celery, RQ...): their extras
    "tests/postgres/",  # the PostgreSQL transport: the postgres extra (asyncpg, psycopg)
    # and a server; run once, on 3.11, to keep CI's time (docs/postgres.md)
)
# They run once, on 3.11 and the compiled core: the library they use is checked on
# both cores by the core's tests. A module of their kind, named otherwise, says so
# with `pytestmark = pytest.mark.not_library`. `--library-only` (the Makefile's
# library passes) does not even collect the modules above, whose imports need those
# extras.
#
# `packaging`: builds and installs the distribution (marked where it is). `slow`: the
# Spark tests, and the tests listed here, which took more than ~10 s each in
# `pytest --durations=40` on this 2-core machine (2026-11, shared, so loaded);
# `make test-fast` leaves both kinds out.
SLOW = (
    "tests/cli/test_cli_user.py::test_bench_all_quick_is_a_smoke_run_that_shows_progress",
    "tests/bench/test_bench.py::test_cli_acks_only_reports_ratios_targets_and_a_plot",
    "tests/redis/test_redis.py::test_a_missing_redis_server_fails_the_tests_and_says_how_to_install",
    "tests/docs/test_web_howto.py::test_the_job_service_across_processes_through_a_hung_and_a_restarted_redis",
    "tests/redis/test_redis.py::test_the_benchmark_command_measures_every_side",
    "tests/redis/test_redis_wire.py::test_a_batch_survives_the_wire_with_its_types",
    "tests/core/test_wheel_stateful.py::TestWheelAgainstHeap",
    "tests/core/test_thresholds_stateful.py::TestThresholdIndexAgainstSortedList",
    "tests/examples/longpoll/test_longpoll_soak.py::test_a_short_soak_with_every_fault_keeps_the_ledger",
    "tests/examples/longpoll/test_longpoll_soak.py::test_a_hung_redis_resuming_under_parked_gets_is_measured_and_the_bound_kept",
    "tests/examples/longpoll/test_longpoll_program.py::test_a_small_load_test_run_compares_both_waiters",
    "tests/pipeline/test_cli_user.py::test_an_unusable_out_is_refused_before_spark",
    "tests/jobs/test_bench_jobs.py::test_a_small_run_answers_every_wait_in_both_modes",
    "tests/jobs/test_bench_jobs_arq.py::test_a_small_arq_run_answers_every_wait_in_both_modes",
    *(
        f"tests/examples/longpoll/test_longpoll_redis.py::{name}"
        for name in (
            "test_a_small_crossbench_run",
            "test_a_worker_restarted_while_redis_is_down_says_so_in_json_and_comes_back",
            "test_redis_killed_and_restarted_mid_traffic",
            "test_racing_posts_on_three_servers_get_distinct_dense_offsets",
            "test_a_post_on_any_server_answers_gets_parked_on_every_server",
            "test_a_wrong_password_exits_at_once_naming_the_cause",
            "test_an_idempotency_key_holds_across_processes_for_its_ttl",
            "test_a_worker_that_dies_is_restarted_and_the_port_keeps_serving",
            "test_sigterm_with_redis_answers_every_parked_get",
        )
    ),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--library-only",
        action="store_true",
        help="run only the library's tests (not the pipeline, broker, long-poll and "
        "examples modules, which are not even collected): docs/pythons.md",
    )


def _relative(path: Path, config: pytest.Config) -> str:
    try:
        relative = path.relative_to(config.rootpath).as_posix()
    except ValueError:  # not in this project (pytester's directories)
        return path.as_posix()
    return relative + "/" if path.is_dir() else relative


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("--library-only") and _relative(collection_path, config).startswith(
        NOT_LIBRARY
    ):
        return True
    return None


def _is_library_test(item: pytest.Item) -> bool:
    if item.get_closest_marker("not_library") is not None:
        return False
    return not _relative(item.path, item.config).startswith(NOT_LIBRARY)


def _start_order(item: pytest.Item) -> int:
    # The longest first, so that the two xdist workers finish together: Spark (when
    # in the same run), then packaging, then the other slow tests.
    for rank, marker in enumerate(("spark", "packaging", "slow")):
        if item.get_closest_marker(marker) is not None:
            return rank
    return 3


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deselected = []
    for item in items:
        if _is_library_test(item):
            item.add_marker(pytest.mark.library)
        elif config.getoption("--library-only"):
            deselected.append(item)
        if item.get_closest_marker("spark") is not None or item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        gone = set(map(id, deselected))
        items[:] = [item for item in items if id(item) not in gone]
    items.sort(key=_start_order)  # stable: the collection order otherwise


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]] | None:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    # The job systems' tests drive real workers for seconds each: the default loop
    # only (what they test is the job systems' side; the loops are tests/redis's).
    if _relative(item.path, config).startswith("tests/jobs/"):
        return factories
    if _uvloop_factory is not None:
        factories["uvloop"] = _uvloop_factory
    return factories
