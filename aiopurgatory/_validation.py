"""Argument checks shared by the core: numbers, seconds and keys.

One number check (:func:`as_number`) serves both kinds of number the API takes:
seconds (timeouts, delays, ticks, loop times: any real number, made a finite
float) and watermarks and thresholds (an int or a float, kept as given, so that
integer offsets compare exactly; infinities allowed). Keys are checked once, on
the way in: :func:`keys_of` for a watch's keys, :func:`thresholds_of` for a
Mapping of keys to thresholds, :func:`hashable_key` for a single key.

Each check raises ``TypeError``/``ValueError`` naming the argument, before
anything has changed. The common cases (a float, a short list of distinct
keys) are tested in place by the callers or at the top of each check, so that
the full check runs only for what is unusual or wrong.
"""

from __future__ import annotations

import numbers
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, Final

__all__ = [
    "as_number",
    "as_seconds",
    "hashable_key",
    "keys_of",
    "thresholds_of",
    "unhashable_key",
]


def as_number(value: Any, name: str, *, seconds: bool = False) -> Any:
    """``value`` checked as a number, or a TypeError/ValueError naming ``name``.

    Args:
        value: what the caller was given.
        name: the argument's name, for the error.
        seconds: check a number of seconds: any real number but a bool
            (``numbers.Real``: Fraction and numpy's too), finite, returned as a
            float. Otherwise an int or a float (subclasses too) but a bool, not
            NaN, returned as given (infinities allowed).

    Raises:
        TypeError: ``value`` is not a number of that kind, or is a bool.
        ValueError: ``value`` is NaN (or, for seconds, infinite).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real if seconds else int | float):
        kind = "a number of seconds" if seconds else "an int or a float"
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__}")
    if seconds:
        try:
            value = float(value)
        except OverflowError:
            raise ValueError(f"{name} must be finite, got {value!r}") from None
        if value - value:  # NaN and +-inf, and only they, make this non-zero (NaN is truthy)
            raise ValueError(f"{name} must be finite, got {value!r}")
    elif value != value:
        raise ValueError(f"{name} must not be NaN")
    return value


def as_seconds(value: Any, name: str) -> float:
    """Return ``value`` as a finite float number of seconds, or raise naming ``name``.

    :func:`as_number` with ``seconds=True``.

    Raises:
        TypeError: ``value`` is not a real number, or is a bool.
        ValueError: ``value`` is NaN or infinite.
    """
    if type(value) is float and not value - value:
        return value
    return as_number(value, name, seconds=True)  # type: ignore[no-any-return]


def unhashable_key(key: object, exc: TypeError) -> TypeError:
    """The error for an unhashable ``key``, from the TypeError hashing it raised."""
    return TypeError(f"key must be hashable, got {key!r} ({exc})")


def hashable_key(key: Hashable) -> None:
    """Refuse an unhashable ``key`` (:func:`unhashable_key`)."""
    try:
        hash(key)
    except TypeError as exc:
        raise unhashable_key(key, exc) from None


# A list of up to this many keys is checked in place, with no dict built.
_FEW_KEYS: Final = 8


def _distinct_and_hashable(keys: list[Hashable], n: int) -> bool:
    """True if the ``n`` keys are hashable and no two are equal as dict keys would be."""
    for i in range(n):
        key = keys[i]
        try:
            h = hash(key)
        except TypeError:
            return False
        for j in range(i):
            other = keys[j]
            if other is key or (hash(other) == h and other == key):
                return False
    return True


def _unhashable_in_keys(key: object, exc: TypeError) -> TypeError:
    return TypeError(f"keys: unhashable key {key!r} ({exc})")


def _tuple_refused(keys: tuple[Any, ...]) -> TypeError:
    return TypeError(
        f"keys must not be a tuple ({keys!r}): a tuple is ambiguous, one composite key "
        "or several keys. Pass a list: [('orders', 0)] watches the one key ('orders', 0), "
        "['orders', 0] the two keys 'orders' and 0"
    )


def keys_of(keys: Iterable[Hashable]) -> tuple[Hashable, ...]:
    """``keys`` as a tuple of distinct hashable keys, or a TypeError/ValueError naming them."""
    cls = type(keys)
    if cls is list:
        # The common case first: a short list of distinct keys, checked in place.
        n = len(keys)  # type: ignore[arg-type]
        if 0 < n <= _FEW_KEYS and _distinct_and_hashable(keys, n):  # type: ignore[arg-type]
            return tuple(keys)
        # dict.fromkeys both removes duplicates and rejects unhashable keys.
        try:
            unique = dict.fromkeys(keys)
        except TypeError:
            pass  # the slow path below names the unhashable key
        else:
            if unique:
                return tuple(unique)
    if isinstance(keys, tuple):
        raise _tuple_refused(keys)
    if isinstance(keys, str | bytes | bytearray | memoryview):
        raise TypeError(
            f"keys must be an iterable of keys, not a single {type(keys).__name__}: "
            "wrap it in a list"
        )
    try:
        items = list(keys)  # once: a generator cannot be read twice
    except TypeError:
        raise TypeError(
            f"keys must be an iterable of hashable keys, got {type(keys).__name__}"
        ) from None
    try:
        unique = dict.fromkeys(items)
    except TypeError:
        for key in items:
            try:
                hash(key)
            except TypeError as exc:
                raise _unhashable_in_keys(key, exc) from None
        raise
    if not unique:
        raise ValueError("keys must not be empty")
    return tuple(unique)


def thresholds_of(
    keys: Mapping[Hashable, float],
) -> tuple[tuple[Hashable, ...], tuple[float, ...]]:
    """A Mapping of keys to thresholds as (keys, thresholds), checked."""
    plain = type(keys) is dict  # its keys are hashable: it holds them
    # (A one-key dict of a valid threshold never gets here: the purgatory takes it.)
    watched = []
    thresholds = []
    for key, threshold in keys.items():
        if not plain:
            try:
                hash(key)
            except TypeError as exc:
                raise _unhashable_in_keys(key, exc) from None
        cls = type(threshold)
        if (cls is not int and cls is not float) or threshold != threshold:
            as_number(threshold, f"the threshold of key {key!r}")
        watched.append(key)
        thresholds.append(threshold)
    if not watched:
        raise ValueError("keys must not be empty")
    return tuple(watched), tuple(thresholds)
