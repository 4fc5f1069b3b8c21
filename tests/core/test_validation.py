"""The core's argument checks (aiopurgatory._validation): one number check, keys, a key."""

from __future__ import annotations

import fractions
import math
from typing import Any

import pytest

from aiopurgatory._validation import (
    as_number,
    as_seconds,
    hashable_key,
    keys_of,
    thresholds_of,
    unhashable_key,
)


class Offset(int):
    pass


@pytest.mark.parametrize("value", [0, 7, -3, 2.5, math.inf, -math.inf, Offset(4)])
def test_a_watermark_number_is_kept_as_given(value: Any) -> None:
    assert as_number(value, "value") is value


@pytest.mark.parametrize("value", [True, "1", None, fractions.Fraction(1, 2), 1j])
def test_a_watermark_number_is_an_int_or_a_float(value: Any) -> None:
    with pytest.raises(TypeError, match=r"^value must be an int or a float, got "):
        as_number(value, "value")


def test_a_watermark_number_is_not_nan() -> None:
    with pytest.raises(ValueError, match=r"^value must not be NaN$"):
        as_number(math.nan, "value")


@pytest.mark.parametrize(
    ("value", "seconds"), [(1, 1.0), (0.25, 0.25), (fractions.Fraction(1, 4), 0.25), (-2, -2.0)]
)
def test_seconds_are_any_real_number_made_a_float(value: Any, seconds: float) -> None:
    for check in (as_seconds, lambda v, n: as_number(v, n, seconds=True)):
        result = check(value, "delay")
        assert type(result) is float
        assert result == seconds


@pytest.mark.parametrize("value", [True, "1", None, 1j])
def test_seconds_refuse_what_is_not_a_real_number(value: Any) -> None:
    with pytest.raises(TypeError, match=r"^delay must be a number of seconds, got "):
        as_seconds(value, "delay")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**400])
def test_seconds_are_finite(value: Any) -> None:
    with pytest.raises(ValueError, match=r"^delay must be finite, got "):
        as_seconds(value, "delay")


def test_keys_are_distinct_hashable_and_in_order() -> None:
    assert keys_of(["a", "b", "a", 0]) == ("a", "b", 0)
    assert keys_of(iter([("t", 0), ("t", 1)])) == (("t", 0), ("t", 1))
    with pytest.raises(TypeError, match="tuple is ambiguous"):
        keys_of(("t", 0))
    with pytest.raises(TypeError, match="not a single str"):
        keys_of("abc")
    with pytest.raises(TypeError, match=r"^keys: unhashable key \[1\]"):
        keys_of(["a", [1]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"^keys must not be empty$"):
        keys_of([])


def test_thresholds_are_checked_numbers_under_hashable_keys() -> None:
    assert thresholds_of({"a": 1, "b": 2.5}) == (("a", "b"), (1, 2.5))
    with pytest.raises(TypeError, match=r"^the threshold of key 'a' must be an int or a float"):
        thresholds_of({"a": "1"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"^the threshold of key 'a' must not be NaN$"):
        thresholds_of({"a": math.nan})
    with pytest.raises(ValueError, match=r"^keys must not be empty$"):
        thresholds_of({})


def test_one_error_for_an_unhashable_key() -> None:
    hashable_key(("t", 0))
    with pytest.raises(TypeError, match=r"^key must be hashable, got \[1\] \(") as caught:
        hashable_key([1])  # type: ignore[arg-type]
    with pytest.raises(TypeError) as hashing:
        hash([1])
    assert str(unhashable_key([1], hashing.value)) == str(caught.value)
