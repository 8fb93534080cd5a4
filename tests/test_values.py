"""Values (SPEC §2): what is refused before anything is written, and isolation."""

from __future__ import annotations

import collections
import datetime as dt
import decimal
import enum
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import reactor

from .conftest import raw_query


class Colour(enum.Enum):
    RED = "red"


def _cycle() -> dict[str, Any]:
    value: dict[str, Any] = {}
    value["self"] = value
    return value


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


BAD_VALUES = {
    "nan": float("nan"),
    "infinity": float("inf"),
    "minus infinity": float("-inf"),
    "nan inside": {"a": [1, float("nan")]},
    "int key": {1: "a"},
    "int and str keys": {1: "a", "1": "b"},
    "tuple key": {(1, 2): "a"},
    "none key": {None: 1},
    "tuple": (1, 2),
    "set": {1, 2},
    "frozenset": frozenset(),
    "bytes": b"abc",
    "bytearray": bytearray(b"abc"),
    "object": object(),
    "datetime": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    "decimal": decimal.Decimal("1.5"),
    "uuid": uuid.uuid4(),
    "enum": Colour.RED,
    "complex": 1j,
    "function": len,
    "cycle": _cycle(),
    "too deep": _nested(65),
    "far too deep": _nested(100_000),
    "int over 64 bits": 2**64,
    "int under 64 bits": -(2**63) - 1,
    "lone surrogate": "\ud800",
    "lone surrogate key": {"\udfff": 1},
    "nested tuple": {"a": [(1,)]},
}


@pytest.mark.parametrize("value", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_bad_values_are_refused_and_nothing_is_written(
    state: reactor.State, db_path: Path, value: Any
) -> None:
    scope = state.scope("s")
    scope.set("existing", "before")
    writes: list[Callable[[], object]] = [
        lambda: scope.set("k", value),
        lambda: scope.set("existing", value),
        lambda: scope.set_many({"k": 1, "k2": value}),
        lambda: scope.push("list", 1, value),
        lambda: scope.compare_and_swap("existing", "before", value),
        lambda: scope.compare_and_swap("existing", value, "after"),
    ]
    for write in writes:
        with pytest.raises(reactor.InvalidValueError):
            write()
    assert scope.list() == {"existing": "before"}
    assert raw_query(db_path, "SELECT COUNT(*) FROM reactor_changes") == [(1,)]


GOOD_VALUES = {
    "none": None,
    "true": True,
    "false": False,
    "zero": 0,
    "int64 max": 2**63 - 1,
    "int64 min": -(2**63),
    "float": 1.5,
    "float that is whole": 2.0,
    "tiny float": 5e-324,
    "huge float": 1.7e308,
    "empty string": "",
    "unicode": "héllo ✓ 🚀 \u0000 nul inside",
    "empty list": [],
    "empty dict": {},
    "nested": {"a": [1, {"b": [None, True, 2.5, "x"]}], "": {"": []}},
    "max depth": _nested(63),
    "ordered dict": collections.OrderedDict([("b", 1), ("a", 2)]),
}


@pytest.mark.parametrize("value", GOOD_VALUES.values(), ids=GOOD_VALUES.keys())
def test_json_values_round_trip_with_their_types(state: reactor.State, value: Any) -> None:
    scope = state.scope("s")
    change = scope.set("k", value)
    stored = scope.get("k")
    assert stored == value
    assert type(stored) is (dict if isinstance(value, dict) else type(value))
    assert change.new_value == value
    if isinstance(value, float):
        assert type(change.new_value) is float


def test_bool_and_int_are_different_values(state: reactor.State) -> None:
    scope = state.scope("s")
    scope.set("flag", True)
    change = scope.set("flag", 1)
    assert change.old_value is True
    assert scope.get("flag") == 1
    assert type(scope.get("flag")) is int


def test_values_are_copied_in(state: reactor.State) -> None:
    scope = state.scope("s")
    value = {"items": [1, 2]}
    change = scope.set("k", value)
    value["items"].append(3)
    change.new_value["items"].append(4)
    assert scope.get("k") == {"items": [1, 2]}


def test_values_are_copied_out(state: reactor.State) -> None:
    scope = state.scope("s")
    scope.set("k", {"items": [1]})
    first = scope.get("k")
    first["items"].append(2)
    assert scope.get("k") == {"items": [1]}
    assert scope.get("k") is not scope.get("k")
    listed = scope.list()
    listed["k"]["items"].clear()
    assert scope.get_many(["k"]) == {"k": {"items": [1]}}


def test_the_size_limit_is_configurable(open_state: Callable[..., reactor.State]) -> None:
    scope = open_state(max_value_bytes=100).scope("s")
    scope.set("fits", "x" * 98)  # 100 bytes as JSON, with its quotes
    with pytest.raises(reactor.InvalidValueError, match="over the limit of 100"):
        scope.set("big", "x" * 99)
    scope.set("text", "x" * 90)
    with pytest.raises(reactor.InvalidValueError):
        scope.append("text", "y" * 20)
    assert scope.get("text") == "x" * 90
    assert not scope.exists("big")


def test_the_depth_limit_is_configurable(open_state: Callable[..., reactor.State]) -> None:
    scope = open_state(max_depth=3).scope("s")
    scope.set("ok", [[[1]]])
    with pytest.raises(reactor.InvalidValueError, match="deeper than 3"):
        scope.set("deep", [[[[1]]]])
    scope.set("list", [[1]])
    with pytest.raises(reactor.InvalidValueError):
        scope.push("list", [[[2]]])  # the list it would make nests 4 levels
    assert scope.get("list") == [[1]]


def test_increment_beyond_64_bits_is_refused(state: reactor.State) -> None:
    scope = state.scope("s")
    scope.set("n", 2**63 - 1)
    assert scope.increment("n") == 2**63  # still within orjson's unsigned range
    scope.set("n", 2**64 - 1)
    with pytest.raises(reactor.InvalidValueError):
        scope.increment("n")
    assert scope.get("n") == 2**64 - 1
    scope.set("f", 1e308)
    with pytest.raises(reactor.InvalidValueError):
        scope.increment("f", 1e308)
    assert scope.get("f") == 1e308


def test_an_increment_past_the_size_limit_is_refused(
    open_state: Callable[..., reactor.State],
) -> None:
    scope = open_state(max_value_bytes=4).scope("s")
    scope.set("n", 9999)
    with pytest.raises(reactor.InvalidValueError, match="over the limit of 4"):
        scope.increment("n")  # 10000: five bytes
    assert scope.get("n") == 9999


LONG_STRINGS = {  # each over a million characters: the encoders switch there
    "ascii": "x" * 1_200_000,
    "escapes": '"\\\n\t\x00\x1f' * 200_000,
    "unicode": "é😀中" * 400_000,
}


@pytest.mark.parametrize("text", list(LONG_STRINGS.values()), ids=list(LONG_STRINGS))
def test_strings_of_megabytes_round_trip_through_every_kind_of_write(
    state: reactor.State, text: str
) -> None:
    scope = state.scope("long")
    scope.set("doc", {"s": text, "n": 1})
    assert scope.get("doc") == {"s": text, "n": 1}
    scope.update("doc", [reactor.ops.append("!", path="s"), reactor.ops.increment(path="n")])
    assert scope.get("doc") == {"s": text + "!", "n": 2}
    scope.update("doc", [{"op": "copy", "from": "/s", "path": "/t"}])
    assert scope.get("doc") == {"s": text + "!", "t": text + "!", "n": 2}
    scope.set("list", [text, 1])
    assert scope.pop("list") == 1
    assert scope.get("list") == [text]


def test_a_long_string_with_a_lone_surrogate_is_refused(state: reactor.State) -> None:
    scope = state.scope("long")
    with pytest.raises(reactor.InvalidValueError, match="not storable JSON"):
        scope.set("k", "x" * 2**21 + "\ud800")
    assert scope.get("k") is None
    assert state.stats()["revision"] == 0


ADDRESS_SPACE_CHILD = """
import sys
from reactor._base.values import decode, encode

def peak_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmPeak"))

value = {"text": "é" * (8 * 2**20)}  # 16 MB as JSON
start = peak_mb()
text = encode(value, max_depth=64, max_bytes=32 * 2**20)
assert decode(text) == value
print(peak_mb() - start)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc")
def test_a_16_mb_string_takes_a_small_multiple_of_its_size_to_encode_and_decode() -> None:
    """orjson reserves ~16 bytes of address space per character (250 MB here, a crash
    under an address-space limit); reactor hands strings this long to the stdlib."""
    child = subprocess.run(
        [sys.executable, "-c", ADDRESS_SPACE_CHILD],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "MALLOC_ARENA_MAX": "1"},
    )
    assert int(child.stdout) < 100, child.stdout  # MB over the start: 16 MB in, copies out
