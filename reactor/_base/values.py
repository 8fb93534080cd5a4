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
    budget = _check(value, max_depth, max_bytes)
    if budget < 0:  # refused before encoding: the encoder's buffers would be huge
        raise InvalidValueError(
            f"value is more than {max_bytes:,} bytes as JSON, over the limit of {max_bytes:,}"
        )
    # What _check took from the budget bounds the longest string from above.
    if max_bytes - budget > _ORJSON_MAX:
        data = _dumps(value, longest_string=max_bytes - budget)
    else:  # _dumps inlined: every write comes here
        try:
            data = orjson.dumps(value)
        except orjson.JSONEncodeError as exc:  # integers beyond 64 bits, lone surrogates
            raise InvalidValueError(f"value is not storable JSON: {exc}") from None
    if len(data) > max_bytes:
        raise _too_big(len(data), max_bytes)
    return data.decode()


def encode_built(value: Any, *, max_bytes: int, parts_size: int) -> str:
    """Encode a value built from valid parts (a stored value and checked op values, whose
    texts together are ``parts_size`` long), where only the encoder's own limits and the
    size can still fail.

    Raises:
        InvalidValueError: an integer grew past 64 bits, or the text is over ``max_bytes``.
    """
    data = _dumps(value, longest_string=parts_size)
    return _within(data, max_bytes)


def encode_number(value: int | float, max_bytes: int) -> str:
    """A number's JSON text (a sum of numbers: ``increment``), checked as ``encode``
    would, without its walk.

    Raises:
        InvalidValueError: not finite, an integer outside 64 bits, or over ``max_bytes``.
    """
    if type(value) is float and value - value != 0.0:  # NaN or infinite
        raise InvalidValueError(f"{value!r} is not a JSON number")
    data = _dumps(value, longest_string=0)
    return _within(data, max_bytes)


def _within(data: bytes, max_bytes: int) -> str:
    """``data`` as text, if it is at most ``max_bytes`` long.

    Raises:
        InvalidValueError: it is longer.
    """
    if len(data) > max_bytes:
        raise _too_big(len(data), max_bytes)
    return data.decode()


def _too_big(size: int, max_bytes: int) -> InvalidValueError:
    return InvalidValueError(f"value is {size:,} bytes as JSON, over the limit of {max_bytes:,}")


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


def _check(value: Any, max_depth: int, budget: int) -> int:  # noqa: PLR0912
    """Validate ``value``; return ``budget`` less a lower bound of its encoded size
    (negative: over it, and checking stopped there).

    One loop over an explicit stack rather than a call per item: a scalar inside a
    container is checked where it is met, and only containers are pushed.
    """
    pending: list[tuple[Any, int]] = [(value, 0)]
    push, pop = pending.append, pending.pop
    while pending:
        item, depth = pop()
        kind = type(item)
        if kind is dict or (kind is not list and isinstance(item, dict)):
            children = item.values()
            if depth >= max_depth:
                raise _too_deep(max_depth)
            if 5 * len(item) + 1 > budget:  # '"":0' and a comma per item at least
                return -1
            for key in item:
                if type(key) is not str:
                    raise InvalidValueError(
                        f"dict keys must be str, not {type(key).__name__} ({key!r})"
                    )
            # The keys' lengths summed in C: one call per dict, not one per key.
            budget -= 2 + 4 * len(item) + sum(map(len, item))
        elif kind is list or isinstance(item, list):
            children = item
            if depth >= max_depth:
                raise _too_deep(max_depth)
            size = len(item)
            if 2 * size + 1 > budget:  # a byte and a comma per item at least
                return -1
            budget -= 2 + size
        else:
            budget = _scalar(item, kind, budget)
            continue
        depth += 1
        for child in children:
            kind = type(child)
            if kind is str:
                budget -= len(child) + 2
            elif kind is int or kind is bool or child is None:
                budget -= 1
            elif kind is float:
                if child - child != 0.0:  # NaN or infinite: inf - inf is NaN
                    raise InvalidValueError(f"{child!r} is not a JSON number")
                budget -= 1
            else:
                push((child, depth))
        if budget < 0:
            return budget
    return budget


def _scalar(value: Any, kind: type, budget: int) -> int:
    """``budget`` less the size of scalar ``value`` (one not inside a container).

    Raises:
        InvalidValueError: it is not a JSON scalar, or not a finite number.
    """
    if kind is str:
        return budget - len(value) - 2
    if kind is int or kind is bool or value is None:
        return budget - 1
    if kind is float:
        if not math.isfinite(value):
            raise InvalidValueError(f"{value!r} is not a JSON number")
        return budget - 1
    raise InvalidValueError(
        f"{kind.__name__} is not a JSON type (use dict, list, str, int, float, bool or None, "
        "or open with codec=reactor.codecs.TypedCodec() to store it as JSON)"
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
