"""The wire format of aiopurgatory.redis (sans-IO: no Redis needed)."""

from __future__ import annotations

import enum
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiopurgatory.redis._wire import (
    Batch,
    MalformedMessage,
    check_key,
    check_value,
    decode,
    encode,
    parse_stored,
    redis_key,
    stored,
    watermark_prefix,
    wire_keys,
)

keys = st.one_of(st.text(), st.binary(), st.integers())
values = st.one_of(
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
)


@given(st.lists(keys), st.lists(st.tuples(keys, values)))
def test_a_batch_survives_the_wire_with_its_types(
    checks: list[str | bytes | int], advances: list[tuple[str | bytes | int, int | float]]
) -> None:
    batch = Batch()
    expected: dict[str | bytes | int, int | float] = {}
    for key in checks:
        batch.check(key)
    for key, value in advances:
        batch.advance(key, value)
        expected[key] = max(expected.get(key, value), value)
    sender, got_checks, got_advances = decode(encode("me", batch))
    assert sender == "me"
    assert got_checks == list(dict.fromkeys(checks))
    assert dict(got_advances) == expected
    for (key, value), (got_key, got_value) in zip(expected.items(), got_advances, strict=True):
        assert type(got_key) is type(key)
        assert type(got_value) is type(value)
        assert got_key == key


def test_str_int_and_bytes_keys_stay_distinct() -> None:
    batch = Batch()
    for key in ("1", 1, b"1"):
        batch.check(key)
        batch.advance(key, 5)
    _, checks, advances = decode(encode("me", batch))
    assert [type(key) for key in checks] == [str, int, bytes]
    assert [type(key) for key, _ in advances] == [str, int, bytes]
    prefix = watermark_prefix("c")
    assert {redis_key(prefix, key) for key in ("1", 1, b"1")} == {
        b"{c}:wm:s1",
        b"{c}:wm:i1",
        b"{c}:wm:b1",
    }


def test_enum_keys_travel_as_their_plain_value() -> None:
    class Topic(enum.StrEnum):
        ORDERS = "orders"

    class Partition(enum.IntEnum):
        FIRST = 0

    batch = Batch()
    batch.check(check_key(Topic.ORDERS))
    batch.check(check_key(Partition.FIRST))
    _, checks, _ = decode(encode("me", batch))
    assert checks == ["orders", 0]
    assert [type(key) for key in checks] == [str, int]
    assert redis_key(b"p:", Topic.ORDERS) == b"p:sorders"


def test_coalescing_keeps_the_highest_value_and_one_check_per_key() -> None:
    batch = Batch()
    for value in (3, 9, 1, 9.5, 2):
        batch.advance("k", value)
    batch.check("a")
    batch.check("a")
    assert batch.advances == {"k": 9.5}
    assert list(batch.checks) == ["a"]
    assert len(batch) == 2
    newer = Batch()
    newer.advance("k", 4)
    newer.advance("j", 1)
    newer.check("b")
    batch.merge(newer)
    assert batch.advances == {"k": 9.5, "j": 1}
    assert list(batch.checks) == ["a", "b"]


def test_a_large_batch_splits_without_losing_a_trigger() -> None:
    batch = Batch()
    for i in range(5):
        batch.check(i)
    for i in range(6):
        batch.advance(f"k{i}", i)
    parts = batch.split(4)
    assert [len(part) for part in parts] == [4, 4, 3]
    assert [key for part in parts for key in part.checks] == list(range(5))
    merged = {key: value for part in parts for key, value in part.advances.items()}
    assert merged == {f"k{i}": i for i in range(6)}
    assert batch.split(100) == [batch]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"{}",
        b"[]",
        b'[2, "s", [], []]',
        b"[1, 5, [], []]",
        b'[1, "s", {}, []]',
        b'[1, "s", [], ["k"]]',
        b'[1, "s", [1.5], []]',
        b'[1, "s", [true], []]',
        b'[1, "s", [null], []]',
        b'[1, "s", [{"x": "y"}], []]',
        b'[1, "s", [{"b": "\\u0100"}], []]',
        b'[1, "s", [], ["k", "v"]]',
        b'[1, "s", [], ["k", true]]',
        b'[1, "s", [], ["k", 1]',
        b"\xff\xfe",
    ],
)
def test_malformed_messages_are_refused_whole(data: bytes) -> None:
    with pytest.raises(MalformedMessage):
        decode(data)


def test_a_message_is_compact_json() -> None:
    batch = Batch()
    batch.check("a")
    batch.advance(b"\x00\xff", 2.5)
    message = encode("id", batch)
    assert message == b'[1,"id",["a"],[{"b":"\\u0000\\u00ff"},2.5]]'
    assert json.loads(message)[3][1] == 2.5


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (True, TypeError),
        ("1", TypeError),
        (None, TypeError),
        (1j, TypeError),
        (float("nan"), ValueError),
        (float("-inf"), ValueError),
        (2**53 + 1, ValueError),
        (-(2**53) - 1, ValueError),
    ],
)
def test_values_that_cannot_be_stored_are_refused(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="value"):
        check_value(value)


@pytest.mark.parametrize("key", [True, 1.0, None, ("a", 1), frozenset(), bytearray(b"x")])
def test_keys_that_cannot_travel_are_refused(key: object) -> None:
    with pytest.raises(TypeError, match="key must be a str, bytes or int"):
        check_key(key)


def test_wire_keys_skips_what_cannot_travel() -> None:
    assert wire_keys(["a", 1, b"b", True, ("t", 1), 2.0]) == ["a", 1, b"b"]


@given(values)
def test_stored_values_read_back_exactly(value: int | float) -> None:
    back = parse_stored(stored(value))
    assert back == value
    assert type(back) is type(value)


def test_garbled_stored_values_read_as_absent() -> None:
    assert parse_stored(None) is None
    assert parse_stored(b"abc") is None
    assert parse_stored(b"nan") is None
    assert parse_stored("12") == 12
