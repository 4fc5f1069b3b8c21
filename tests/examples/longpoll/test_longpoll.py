"""The long-poll example's protocol, on virtual time, for both waiters.

The ASGI application is called in-process (``tests/support/longpoll.py``), so
parking, timeouts and disconnects run on the virtual-time loop and times are
asserted exactly. ``tests/examples/longpoll/test_longpoll_program.py`` runs the real program.
"""

from __future__ import annotations

import asyncio
import json

import pytest

import aiopurgatory as ap
from examples.longpoll import AsyncioWaiter, PurgatoryWaiter, Settings
from examples.longpoll.feed import TopicLog
from tests.support.longpoll import Call, feed_of, request, running, settle

TICK = 0.001  # the purgatory's wheel tick: an expiry is never early, at most a tick late


@pytest.fixture(params=["purgatory", "asyncio"])
def waiter(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def purgatory_of(app: object) -> ap.Purgatory[ap.DelayedOperation] | None:
    waiter = feed_of(app).waiter  # type: ignore[arg-type]
    return waiter.purgatory if isinstance(waiter, PurgatoryWaiter) else None  # type: ignore[return-value]


def assert_nothing_parked(app: object) -> None:
    """No GET waits: the feed's count, and the waiter's own tables or purgatory."""
    feed = feed_of(app)  # type: ignore[arg-type]
    assert feed.parked == 0
    assert feed.parked_by_topic == {}
    purgatory = purgatory_of(app)
    if purgatory is not None:
        stats = purgatory.statistics()
        assert (stats.watched, stats.delayed, stats.keys) == (0, 0, 0)
    else:
        assert isinstance(feed.waiter, AsyncioWaiter)
        assert feed.waiter.waiting == 0


@pytest.mark.virtual_time
async def test_a_get_parks_until_a_post_answers_it(waiter: str) -> None:
    async with running(waiter) as app:
        loop = asyncio.get_running_loop()
        get = Call(app, "GET", "/topics/news", "offset=0&wait=30")
        await asyncio.sleep(5)
        assert not get.task.done()
        assert feed_of(app).parked == 1
        assert await request(app, "POST", "/topics/news", body=b"hello") == (200, {"offset": 0})
        assert await get.result() == (200, {"offset": 0, "messages": ["hello"], "next_offset": 1})
        assert loop.time() == 5.0  # answered by the post, at once
        assert feed_of(app).answers["data"] == 1
        assert_nothing_parked(app)


@pytest.mark.virtual_time
async def test_a_get_times_out_with_what_there_is_never_early(waiter: str) -> None:
    async with running(waiter) as app:
        loop = asyncio.get_running_loop()
        await request(app, "POST", "/topics/t", body=b"old")
        get = Call(app, "GET", "/topics/t", "offset=1&wait=7.5")
        status, body = await get.result()
        assert (status, body) == (200, {"offset": 1, "messages": [], "next_offset": 1})
        assert 7.5 <= loop.time() <= 7.5 + TICK
        assert feed_of(app).answers == {"data": 0, "timeout": 1, "shutdown": 0, "early": 0}
        assert_nothing_parked(app)


@pytest.mark.virtual_time
async def test_the_default_wait_is_the_settings_one(waiter: str) -> None:
    async with running(waiter, Settings(default_wait=12)) as app:
        loop = asyncio.get_running_loop()
        assert await request(app, "GET", "/topics/t") == (
            200,
            {"offset": 0, "messages": [], "next_offset": 0},
        )
        assert 12 <= loop.time() <= 12 + TICK


@pytest.mark.virtual_time
async def test_min_bytes_counts_bytes_from_the_offset(waiter: str) -> None:
    async with running(waiter) as app:
        loop = asyncio.get_running_loop()
        assert await request(app, "POST", "/topics/t", body=b"skip") == (200, {"offset": 0})
        get = Call(app, "GET", "/topics/t", "offset=1&wait=60&min_bytes=10")
        await asyncio.sleep(1)
        await request(app, "POST", "/topics/t", body="héllo".encode())  # 6 bytes
        await asyncio.sleep(1)
        assert not get.task.done()
        await request(app, "POST", "/topics/t", body=b"four")  # 10 bytes from offset 1
        status, body = await get.result()
        assert (status, body) == (
            200,
            {"offset": 1, "messages": ["héllo", "four"], "next_offset": 3},
        )
        assert loop.time() == 2.0


@pytest.mark.virtual_time
async def test_answerable_gets_answer_at_once_without_parking(waiter: str) -> None:
    async with running(waiter) as app:
        loop = asyncio.get_running_loop()
        await request(app, "POST", "/topics/t", body=b"a")
        await request(app, "POST", "/topics/t", body=b"b")
        assert await request(app, "GET", "/topics/t", "offset=0&wait=30") == (
            200,
            {"offset": 0, "messages": ["a", "b"], "next_offset": 2},
        )
        # wait=0 and min_bytes=0 never park, whatever the topic holds
        assert await request(app, "GET", "/topics/t", "offset=2&wait=0") == (
            200,
            {"offset": 2, "messages": [], "next_offset": 2},
        )
        assert await request(app, "GET", "/topics/empty", "min_bytes=0") == (
            200,
            {"offset": 0, "messages": [], "next_offset": 0},
        )
        assert loop.time() == 0.0
        purgatory = purgatory_of(app)
        if purgatory is not None:
            stats = purgatory.statistics()
            assert (stats.completed, stats.expired, stats.cancelled) == (0, 0, 0)


@pytest.mark.virtual_time
async def test_one_post_answers_every_get_waiting_on_its_topic_only(waiter: str) -> None:
    async with running(waiter) as app:
        here = [Call(app, "GET", "/topics/here", "offset=0&wait=30") for _ in range(20)]
        there = Call(app, "GET", "/topics/there", "offset=0&wait=30")
        await asyncio.sleep(1)
        await request(app, "POST", "/topics/here", body=b"x")
        for get in here:
            assert await get.result() == (200, {"offset": 0, "messages": ["x"], "next_offset": 1})
        assert not there.task.done()
        status, body = await there.result()  # then it times out, with nothing
        assert (status, body["messages"]) == (200, [])
        purgatory = purgatory_of(app)
        if purgatory is not None:
            stats = purgatory.statistics()
            assert (stats.completed, stats.expired) == (20, 1)


@pytest.mark.virtual_time
async def test_a_disconnect_withdraws_the_wait_at_once(waiter: str) -> None:
    async with running(waiter) as app:
        loop = asyncio.get_running_loop()
        stays = Call(app, "GET", "/topics/t", "offset=0&wait=60")
        leaves = Call(app, "GET", "/topics/t", "offset=0&wait=60")
        await asyncio.sleep(3)
        feed = feed_of(app)
        assert feed.parked == 2
        purgatory = purgatory_of(app)
        if purgatory is not None:
            assert (purgatory.watched, purgatory.delayed) == (2, 2)
        leaves.disconnect()
        await settle()
        assert leaves.task.done()
        assert leaves.task.exception() is None
        assert loop.time() == 3.0  # no time passed: withdrawn at once, not at expiry
        assert feed.parked == 1
        assert feed.disconnected == 1
        if purgatory is not None:
            assert (purgatory.watched, purgatory.delayed) == (1, 1)
            assert purgatory.statistics().cancelled == 1
        stays.disconnect()
        await settle()
        assert_nothing_parked(app)
        assert feed.disconnected == 2
        if purgatory is not None:
            stats = purgatory.statistics()
            assert (stats.cancelled, stats.completed, stats.expired) == (2, 0, 0)
        assert feed.answers == dict.fromkeys(feed.answers, 0)
        # a post to the topic now finds nobody to answer
        await request(app, "POST", "/topics/t", body=b"late")
        assert loop.time() == 3.0


@pytest.mark.virtual_time
async def test_shutdown_answers_every_parked_get_with_what_it_has(waiter: str) -> None:
    async with running(waiter) as app:
        loop = asyncio.get_running_loop()
        await request(app, "POST", "/topics/t0", body=b"some")
        gets = [
            Call(app, "GET", f"/topics/t{n % 5}", "offset=0&wait=300&min_bytes=100")
            for n in range(50)
        ]
        await asyncio.sleep(2)
        feed = feed_of(app)
        assert feed.parked == 50
        assert feed.shutdown() == 50
        for n, get in enumerate(gets):
            expected = ["some"] if n % 5 == 0 else []
            status, body = await get.result()
            assert (status, body["messages"]) == (200, expected)
        assert loop.time() == 2.0
        assert feed.answers["shutdown"] == 50
        assert_nothing_parked(app)
        # from now on a GET is answered at once, and /healthz says the server is stopping
        assert await request(app, "GET", "/topics/t1", "wait=300") == (
            200,
            {"offset": 0, "messages": [], "next_offset": 0},
        )
        assert await request(app, "GET", "/healthz") == (
            503,
            {"status": "stopping", "waiter": waiter, "loop_lag_s": 0.0, "loop_lag_max_s": 0.0},
        )
        assert loop.time() == 2.0


BAD_REQUESTS = [
    # (method, path, query, body, status, words in the error)
    ("GET", "/topics/t", "offset=-1", b"", 400, "offset"),
    ("GET", "/topics/t", "offset=abc", b"", 400, "offset"),
    ("GET", "/topics/t", "offset=1.5", b"", 400, "offset"),
    ("GET", "/topics/t", "offset=", b"", 400, "offset"),
    ("GET", "/topics/t", "offset=5", b"", 400, "past the end"),
    ("GET", "/topics/t", "wait=-1", b"", 400, "wait"),
    ("GET", "/topics/t", "wait=soon", b"", 400, "wait"),
    ("GET", "/topics/t", "wait=nan", b"", 400, "wait"),
    ("GET", "/topics/t", "wait=inf", b"", 400, "wait"),
    ("GET", "/topics/t", "wait=1e3", b"", 400, "wait"),
    ("GET", "/topics/t", "wait=300.5", b"", 400, "at most 300"),
    ("GET", "/topics/t", "min_bytes=-5", b"", 400, "min_bytes"),
    ("GET", "/topics/t", "min_bytes=2.5", b"", 400, "min_bytes"),
    ("GET", "/topics/t", "timeout=5", b"", 400, "unknown parameter"),
    ("GET", "/topics/t", "wait=1&wait=2", b"", 400, "twice"),
    ("GET", "/topics/" + "x" * 101, "", b"", 400, "topic name"),
    ("GET", "/topics/a,b", "", b"", 400, "topic name"),
    ("GET", "/topics/..", "", b"", 400, "not dots only"),
    ("POST", "/topics/.", "", b"x", 400, "not dots only"),
    ("POST", "/topics/...", "", b"x", 400, "not dots only"),
    ("GET", "/topics/t", "wait=1e999", b"", 400, "at most 300"),
    ("GET", "/topics/t", "wait=-0.5", b"", 400, "finite non-negative number"),
    ("GET", "/topics/t", "wait=1_0", b"", 400, "finite non-negative number"),
    ("GET", "/topics/t", "wait=.", b"", 400, "finite non-negative number"),
    ("GET", "/topics/t", "wait=" + "0" * 40 + "1", b"", 400, "finite non-negative number"),
    ("POST", "/topics/t", "", b"", 400, "empty"),
    ("POST", "/topics/t", "", b"\xff\xfe", 400, "utf-8"),
    ("POST", "/topics/t", "", b"x" * 101, 413, "100 bytes"),
    ("POST", "/topics/t%20u", "", b"x", 400, "topic name"),
    ("GET", "/nowhere", "", b"", 404, "not found"),
    ("GET", "/topics/t/more", "", b"", 404, "not found"),
    ("DELETE", "/topics/t", "", b"", 405, "method not allowed"),
    ("PUT", "/metrics", "", b"", 405, "method not allowed"),
]


@pytest.mark.virtual_time
@pytest.mark.parametrize(("method", "path", "query", "body", "status", "words"), BAD_REQUESTS)
async def test_bad_input_gets_a_4xx_with_a_one_line_json_error(
    waiter: str, method: str, path: str, query: str, body: bytes, status: int, words: str
) -> None:
    async with running(waiter, Settings(max_body_bytes=100)) as app:
        await request(app, "POST", "/topics/t", body=b"one")
        call = Call(app, method, path, query, body)
        got_status, got_body = await call.result()
        assert got_status == status
        assert "\n" not in call.text
        assert list(got_body) == ["error"]
        assert words in got_body["error"].lower()
        # and nothing changed: the topic holds its one message, nothing is parked
        feed = feed_of(app)
        assert list(feed.topics) == ["t"]
        assert feed.topics["t"].end_offset == 1
        assert_nothing_parked(app)


@pytest.mark.virtual_time
async def test_limits_on_topics_and_parked_gets(waiter: str) -> None:
    async with running(waiter, Settings(max_topics=2, max_parked=3)) as app:
        assert (await request(app, "POST", "/topics/a", body=b"1"))[0] == 200
        assert (await request(app, "POST", "/topics/b", body=b"1"))[0] == 200
        status, body = await request(app, "POST", "/topics/c", body=b"1")
        assert (status, body) == (409, {"error": "the feed already holds 2 topics"})
        assert (await request(app, "POST", "/topics/a", body=b"2"))[0] == 200
        gets = [Call(app, "GET", "/topics/a", "offset=2&wait=10") for _ in range(3)]
        await asyncio.sleep(1)
        status, body = await request(app, "GET", "/topics/a", "offset=2&wait=10")
        assert status == 503
        assert "waiting already" in body["error"]
        for get in gets:
            assert (await get.result())[0] == 200


@pytest.mark.virtual_time
async def test_metrics_and_healthz(waiter: str) -> None:
    async with running(waiter) as app:
        get = Call(app, "GET", "/topics/t", "wait=30")
        await asyncio.sleep(1)
        metrics = Call(app, "GET", "/metrics")
        await metrics.task
        text = metrics.text
        assert metrics.status == 200
        assert f'longpoll_parked_requests{{waiter="{waiter}"}} 1.0' in text
        assert f'longpoll_answers_total{{reason="early",waiter="{waiter}"}} 0.0' in text
        if waiter == "purgatory":
            assert 'aiopurgatory_pending_operations{purgatory="longpoll"} 1.0' in text
            assert 'aiopurgatory_operations_total{outcome="expired",purgatory="longpoll"}' in text
        else:
            assert "aiopurgatory_" not in text
        # The loop's lag is measured (on virtual time, probes fire on time: 0).
        assert await request(app, "GET", "/healthz") == (
            200,
            {"status": "ok", "waiter": waiter, "loop_lag_s": 0.0, "loop_lag_max_s": 0.0},
        )
        assert "longpoll_loop_lag_max_seconds 0.0" in text
        get.disconnect()


@pytest.mark.virtual_time
async def test_the_page_is_served() -> None:
    async with running("purgatory") as app:
        page = Call(app, "GET", "/")
        await page.task
        assert page.status == 200
        assert "<title>aiopurgatory long-poll</title>" in page.text
        assert 'fetch(topicUrl + "?offset="' in page.text


# -- the parts without HTTP ----------------------------------------------------------------


def test_topic_log_counts_bytes_and_keeps_what_retention_allows() -> None:
    log = TopicLog(retain=3)
    for n in range(5):
        assert log.append(f"m{n}", 2) == n
    assert (log.start_offset, log.end_offset) == (0, 5)
    assert log.bytes_from(0) == 10
    assert log.bytes_from(3) == 4
    assert log.bytes_from(5) == 0
    log.append("m5", 2)  # six messages: the oldest three go
    assert (log.start_offset, log.end_offset) == (3, 6)
    # an offset retention dropped reads from the oldest kept message
    assert log.bytes_from(0) == 6
    fetched = log.read(1, max_bytes=4)
    assert (fetched.offset, fetched.messages, fetched.next_offset) == (3, ["m3", "m4"], 5)
    # a response carries at least one message, however small max_bytes is
    assert log.read(4, max_bytes=1).messages == ["m4"]


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("default_wait", -1.0, ValueError),
        ("max_wait", float("inf"), ValueError),
        ("max_wait", "30", TypeError),
        ("default_wait", True, TypeError),
        ("retain", 0, ValueError),
        ("max_parked", 1.5, TypeError),
        ("body_timeout", 0, ValueError),
        ("body_timeout", float("nan"), ValueError),
        ("body_timeout", "10", TypeError),
        ("idempotency_ttl", 0, ValueError),
        ("idempotency_ttl", float("inf"), ValueError),
    ],
)
def test_settings_refuse_bad_values(field: str, value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=field):
        Settings(**{field: value})  # type: ignore[arg-type]


def test_settings_refuse_a_default_wait_over_the_maximum() -> None:
    with pytest.raises(ValueError, match="default_wait must not exceed max_wait"):
        Settings(default_wait=400)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 30.0), ("2.5", 2.5), (".5", 0.5), ("5.", 5.0), ("5e-1", 0.5), ("0.25E+1", 2.5)],
)
def test_wait_takes_decimal_numbers_as_people_write_them(text: str, seconds: float) -> None:
    from examples.longpoll.app import parse_fetch

    assert parse_fetch([("wait", text)], Settings()) == (0, seconds, 1)


@pytest.mark.virtual_time
async def test_names_with_dots_and_more_are_topics(waiter: str) -> None:
    async with running(waiter) as app:
        for name in (".a", "a.", "a..b", "-", "_"):
            assert await request(app, "POST", f"/topics/{name}", body=b"m") == (200, {"offset": 0})
        assert sorted(feed_of(app).topics) == sorted((".a", "a.", "a..b", "-", "_"))


def test_error_bodies_are_one_json_line() -> None:
    from examples.longpoll.app import error

    response = error(400, "bad")
    assert json.loads(bytes(response.body)) == {"error": "bad"}
    assert b"\n" not in response.body


@pytest.mark.virtual_time
async def test_a_retried_post_with_an_idempotency_key_is_stored_once(waiter: str) -> None:
    settings = Settings(idempotency_ttl=60)
    async with running(waiter, settings) as app:
        loop = asyncio.get_running_loop()
        key = [(b"idempotency-key", b'"order-17"')]
        get = Call(app, "GET", "/topics/orders", "offset=0&wait=30")
        first = Call(app, "POST", "/topics/orders", body=b"pay 17", headers=key)
        assert await first.result() == (200, {"offset": 0})
        assert "idempotent-replayed" not in first.headers
        assert await get.result() == (200, {"offset": 0, "messages": ["pay 17"], "next_offset": 1})
        assert loop.time() == 0  # answered by the first post
        await asyncio.sleep(59)
        again = Call(app, "POST", "/topics/orders", body=b"pay 17", headers=key)
        assert await again.result() == (200, {"offset": 0})  # the first one's offset
        assert again.headers["idempotent-replayed"] == "true"
        bare = [(b"idempotency-key", b"order-17")]  # the same key, sent unquoted
        assert await request_with(app, b"pay 17", bare) == (200, {"offset": 0})
        # the same key on another body: refused, nothing stored
        assert await request_with(app, b"pay 18", key) == (
            422,
            {"error": "this Idempotency-Key was used for another body"},
        )
        # another topic is another resource: the key is its own there
        assert await request_with(app, b"pay 17", key, "/topics/other") == (200, {"offset": 0})
        feed = feed_of(app)
        assert (feed.messages_posted, feed.replayed) == (2, 2)
        await asyncio.sleep(1)  # 60 s after the first: the key is forgotten
        assert await request_with(app, b"pay 17", key) == (200, {"offset": 1})
        _, body = await request(app, "GET", "/topics/orders", "offset=0&wait=0")
        assert body["messages"] == ["pay 17", "pay 17"]


async def request_with(
    app: object, body: bytes, headers: list[tuple[bytes, bytes]], path: str = "/topics/orders"
) -> tuple[int, object]:
    return await Call(app, "POST", path, body=body, headers=headers).result()  # type: ignore[arg-type]


@pytest.mark.virtual_time
@pytest.mark.parametrize(
    "headers",
    [
        [(b"idempotency-key", b"")],
        [(b"idempotency-key", b'"unclosed')],
        [(b"idempotency-key", b"two words")],
        [(b"idempotency-key", b"x" * 256)],
        [(b"idempotency-key", b"caf\xc3\xa9")],
        [(b"idempotency-key", b"a"), (b"idempotency-key", b"b")],
    ],
)
async def test_a_bad_idempotency_key_is_a_400_and_stores_nothing(
    headers: list[tuple[bytes, bytes]],
) -> None:
    async with running("purgatory") as app:
        status, body = await request_with(app, b"m", headers)
        assert status == 400
        assert "Idempotency-Key" in body["error"]  # type: ignore[index]
        assert feed_of(app).topics == {}


def test_idempotency_keys_as_the_draft_writes_them() -> None:
    from examples.longpoll.feed import check_idempotency_key

    assert check_idempotency_key('"8e03978e-40d5-43e8-bc93-6894a57f9324"') == (
        "8e03978e-40d5-43e8-bc93-6894a57f9324"
    )
    assert check_idempotency_key(r'"a \"quoted\" key"') == 'a "quoted" key'
    assert check_idempotency_key("bare-key") == "bare-key"
    assert check_idempotency_key("x" * 255) == "x" * 255
