"""JSON values: validation, encoding and JSON equality.

A value is encoded once, in the caller's thread, before it goes anywhere: the encoded
text is what the actor stores, so mutating the caller's object afterwards changes
nothing, and decoding makes a fresh copy for every reader.
"""

from __future__ import annotations

import enum
import json
import math
from typing import Any, Final, TypeAlias

import orjson

from reactor.errors import InvalidValueError

__all__ = ["MISSING", "Missing", "Number", "decode", "encode", "encode_trusted", "json_equal"]

Number: TypeAlias = int | float  # what increment adds, and returns (as redis-py names it)

DEFAULT_MAX_VALUE_BYTES: Final = 16 * 1024 * 1024
DEFAULT_MAX_DEPTH: Final = 64
# orjson refuses to encode more than 254 levels; a limit above it could never be met.
MAX_DEPTH_LIMIT: Final = 250
# orjson reserves address space in proportion to its input for a moment: about 16 bytes
# per character of a string it encodes, about 12 per byte of text it decodes (a 16 MB
# value would take 200-250 MB). Under an address-space limit that is a crash, not a
# MemoryError. Above this size the standard library's json, which grows its buffers as
# it goes, does the part that is that large; below it, orjson is ten times faster.
_ORJSON_MAX: Final = 1024 * 1024


class Missing(enum.Enum):
    """The type of ``MISSING``, its only member."""

    MISSING = "MISSING"

    def __repr__(self) -> str:
        return "reactor.MISSING"


MISSING: Final = Missing.MISSING
"""Stands for "no such key" in ``compare_and_swap``."""


def encode(value: Any, *, max_depth: int, max_bytes: int) -> str:
    """Validate ``value`` as JSON and return its text.

    Raises:
        InvalidValueError: NaN or infinity, a non-``str`` dict key, a type JSON lacks,
            nesting deeper than ``max_depth`` (cycles included), an integer outside
            64 bits, a string that is not valid Unicode, or text over ``max_bytes``.
    """
    budget = [max_bytes]
    _check(value, 0, max_depth, budget)
    if budget[0] < 0:  # refused before encoding: the encoder's buffers would be huge
        raise InvalidValueError(
            f"value is more than {max_bytes:,} bytes as JSON, over the limit of {max_bytes:,}"
        )
    # What _check took from the budget bounds the longest string from above.
    data = _dumps(value, longest_string=max_bytes - budget[0])
    if len(data) > max_bytes:
        raise InvalidValueError(
            f"value is {len(data):,} bytes as JSON, over the limit of {max_bytes:,}"
        )
    return data.decode()


def encode_built(value: Any, *, max_bytes: int, parts_size: int) -> str:
    """Encode a value built from valid parts (a stored value and checked op values, whose
    texts together are ``parts_size`` long), where only the encoder's own limits and the
    size can still fail.

    Raises:
        InvalidValueError: an integer grew past 64 bits, or the text is over ``max_bytes``.
    """
    data = _dumps(value, longest_string=parts_size)
    if len(data) > max_bytes:
        raise InvalidValueError(
            f"value is {len(data):,} bytes as JSON, over the limit of {max_bytes:,}"
        )
    return data.decode()


def encode_trusted(value: Any, *, parts_size: int) -> str:
    """Encode a value known to be valid (read from the database, or cut from one),
    taken from texts ``parts_size`` long."""
    return _dumps(value, longest_string=parts_size).decode()


def encoded_size(value: Any) -> int:
    """How many bytes ``value`` (known to be valid) takes as JSON."""
    return len(_dumps(value, longest_string=_ORJSON_MAX + 1))


def decode(text: str | bytes) -> Any:
    """Return a fresh Python object for stored JSON text."""
    if len(text) > _ORJSON_MAX:
        return json.loads(text)
    return orjson.loads(text)


def _dumps(value: Any, *, longest_string: int) -> bytes:
    """``value`` as JSON; ``longest_string`` is an upper bound of its strings' lengths."""
    if longest_string > _ORJSON_MAX:
        value = _long_strings_encoded(value)
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:  # integers beyond 64 bits, lone surrogates
        raise InvalidValueError(f"value is not storable JSON: {exc}") from None


def _long_strings_encoded(value: Any) -> Any:
    """A copy of ``value`` where each string over the orjson limit is encoded by the
    standard library (an ``orjson.Fragment``, which orjson copies as it is)."""
    if isinstance(value, str):
        if len(value) <= _ORJSON_MAX:
            return value
        try:
            return orjson.Fragment(json.dumps(value, ensure_ascii=False).encode())
        except UnicodeEncodeError as exc:  # a lone surrogate, as orjson would say
            raise InvalidValueError(f"value is not storable JSON: {exc}") from None
    if isinstance(value, dict):
        return {key: _long_strings_encoded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_long_strings_encoded(item) for item in value]
    return value


def _check(  # noqa: PLR0911, PLR0912 - one branch per JSON type
    value: Any, depth: int, max_depth: int, budget: list[int]
) -> None:
    """Validate ``value``; take a lower bound of its encoded size from ``budget[0]``
    (checking stops early once the budget is spent)."""
    kind = type(value)
    if kind is str:
        budget[0] -= len(value) + 2
        return
    if kind is int or kind is bool or value is None:
        budget[0] -= 1
        return
    if kind is float:
        if not math.isfinite(value):
            raise InvalidValueError(f"{value!r} is not a JSON number")
        budget[0] -= 1
        return
    if isinstance(value, dict):
        if depth >= max_depth:
            raise _too_deep(max_depth)
        if 5 * len(value) + 1 > budget[0]:  # '"":0' and a comma per item at least
            budget[0] = -1
            return
        budget[0] -= 2
        for key, item in value.items():
            if type(key) is not str:
                raise InvalidValueError(
                    f"dict keys must be str, not {type(key).__name__} ({key!r})"
                )
            budget[0] -= len(key) + 4
            _check(item, depth + 1, max_depth, budget)
            if budget[0] < 0:
                return
        return
    if isinstance(value, list):
        if depth >= max_depth:
            raise _too_deep(max_depth)
        if 2 * len(value) + 1 > budget[0]:  # a byte and a comma per item at least
            budget[0] = -1
            return
        budget[0] -= 2
        for item in value:
            budget[0] -= 1
            _check(item, depth + 1, max_depth, budget)
            if budget[0] < 0:
                return
        return
    raise InvalidValueError(
        f"{kind.__name__} is not a JSON type (use dict, list, str, int, float, bool or None)"
    )


def _too_deep(max_depth: int) -> InvalidValueError:
    return InvalidValueError(f"value nests deeper than {max_depth} levels (or contains a cycle)")


def json_equal(left: Any, right: Any) -> bool:  # noqa: PLR0911 - one return per JSON type
    """Equality as JSON sees it: ``1 == 1.0``, but ``True != 1`` and ``0 != False``."""
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return bool(left == right)
    if isinstance(left, dict):
        if not isinstance(right, dict) or left.keys() != right.keys():
            return False
        return all(json_equal(item, right[key]) for key, item in left.items())
    if isinstance(left, list):
        if not isinstance(right, list) or len(left) != len(right):
            return False
        return all(json_equal(a, b) for a, b in zip(left, right, strict=True))
    return type(left) is type(right) and bool(left == right)
