"""The library's own Redis connections (aiopurgatory.redis._link.Link), on a real redis-server."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

from aiopurgatory.redis import RedisTriggers, _link
from aiopurgatory.redis._link import Link
from aiopurgatory.redis.testing import RedisServer

pytestmark = pytest.mark.realtime


def link_to(server: RedisServer, timeout: float = 5.0) -> Link:
    """A Link made as RedisTriggers makes its own (same options), not entered."""
    return Link(RedisTriggers(None, server.url)._connections.factory("test"), timeout)


async def test_a_cancellation_at_any_point_of_a_call_is_never_swallowed(
    redis_server: RedisServer,
) -> None:
    # redis-py wraps each write in asyncio.wait_for when a socket timeout is set,
    # and Python 3.11's wait_for returns the result of a write that completes as
    # the cancellation comes, dropping the cancellation: a task cancelled by
    # aclose() then carried on, and aclose() waited for it forever. The Link's
    # connections have no socket timeout of redis-py's (the Link bounds calls).
    cancelled_mid_call = 0
    for spins in range(40):
        link = link_to(redis_server)
        call = asyncio.ensure_future(link.execute(("PING",), ("MGET", "a", "b")))
        for _ in range(spins):
            await asyncio.sleep(0)
        finished_first = call.done()
        call.cancel()
        if finished_first:
            assert (await call)[0] == b"PONG"
        else:
            with pytest.raises(asyncio.CancelledError):
                await call
            cancelled_mid_call += 1
            assert not link.connected  # a call cut short leaves no half-read connection
        await link.drop()
    assert cancelled_mid_call >= 5  # the connect, the handshake and the command were hit


async def test_an_idle_connection_that_died_with_redis_is_replaced_before_use(
    redis_server: RedisServer,
) -> None:
    link = link_to(redis_server)
    try:
        assert await link.execute(("SET", "k", "1"), ("GET", "k")) == [b"OK", b"1"]
        first = link._connection
        redis_server.kill()
        redis_server.start()
        await asyncio.sleep(0.05)  # the loop has seen the end of the old connection
        assert await link.execute(("GET", "k")) == [b"1"]  # the append-only file kept it
        assert link._connection is not first
    finally:
        await link.drop()


async def test_a_call_that_meets_a_closed_connection_it_did_not_open_is_sent_once_more(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check before use can miss a connection closed an instant before (the
    # loop has not seen the end of file yet): the call then fails on it, and is
    # sent again on a new connection rather than failed.
    link = link_to(redis_server)
    try:
        assert await link.execute(("SET", "k", "1")) == [b"OK"]
        first = link._connection
        redis_server.kill()
        redis_server.start()
        await asyncio.sleep(0.05)

        async def looks_idle(connection: aioredis.Connection) -> bool:
            return False

        monkeypatch.setattr(_link, "has_pending_input", looks_idle)
        assert await link.execute(("GET", "k")) == [b"1"]
        assert link._connection is not first
        # A new connection that fails is not retried: the caller hears of it.
        redis_server.kill()
        await link.drop()
        with pytest.raises(RedisConnectionError):
            await link.execute(("GET", "k"))
    finally:
        await link.drop()


async def test_a_call_to_a_hung_redis_ends_at_its_timeout(redis_server: RedisServer) -> None:
    link = link_to(redis_server, timeout=0.3)
    try:
        assert await link.execute(("PING",)) == [b"PONG"]
        loop = asyncio.get_running_loop()
        redis_server.pause()
        try:
            for _ in range(2):  # on the open connection, then on a new one (connect included)
                started = loop.time()
                with pytest.raises(TimeoutError, match=r"no reply from Redis within 0\.3 s"):
                    await link.execute(("PING",))
                assert loop.time() - started < 0.3 + 0.3
                assert not link.connected
        finally:
            redis_server.resume()
        assert await link.execute(("PING",)) == [b"PONG"]
    finally:
        await link.drop()


async def test_error_replies_are_returned_and_the_connection_stays_in_step(
    redis_server: RedisServer,
) -> None:
    # The one script path (EVALSHA, SCRIPT LOAD when missing, sent again) is the
    # sender's: tests/redis/test_routing.py::test_a_flushed_script_cache_is_reloaded.
    link = link_to(redis_server)
    try:
        replies = await link.execute(("SET", "k", "v"), ("INCR", "k"), ("GET", "k"))
        assert replies[0] == b"OK"
        assert "not an integer" in str(replies[1])
        assert replies[2] == b"v"  # the connection stayed in step
        (missing,) = await link.execute(("EVALSHA", hashlib.sha1(b"none").hexdigest(), 0))
        assert isinstance(missing, NoScriptError)
        assert await link.execute(("PING",)) == [b"PONG"]
    finally:
        await link.drop()


def test_commands_are_packed_as_redis_py_packs_them() -> None:
    from redis.asyncio.connection import Connection

    from aiopurgatory.redis._link import pack_commands

    commands: list[tuple[Any, ...]] = [
        ("SCRIPT LOAD", "return 1"),
        ("EVALSHA", "ab" * 20, 2, b"{x}k\x00", "ünï", 1.5, -(2**53), b"", b"ba"),
        ("PING",),
    ]
    assert pack_commands(commands) == b"".join(Connection().pack_commands(commands))
    # A bytearray is packed as its bytes (redis-py 5 refuses one; 8 accepts it).
    with_bytearray = [(*commands[1][:-1], bytearray(b"ba"))]
    assert pack_commands(with_bytearray) == pack_commands([commands[1]])
    with pytest.raises(TypeError, match="argument"):
        pack_commands([("SET", "k", None)])
