"""Update ops (``"type"``, ``reactor.ops``) through ``scope.update``: SPEC §4.

Each op on objects, lists, strings, numbers and the root; paths; the error codes;
partial (default) and ``atomic=True`` semantics; a missing key; validation, expiry,
copies and the change log. Last, a property test against a small reference model of
the SPEC's rules, written here independently of the implementation.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import reactor
from reactor import ops
from tests.conftest import canon

from .conftest import raw_query

pytestmark = pytest.mark.sqlite_only(
    "update ops are applied in Python before the write; PostgreSQL's pass writes them "
    "in test_processes, test_transactions and test_model"
)

KEY = "k"


@pytest.fixture
def scope(state: reactor.State) -> reactor.Scope:
    return state.scope("updates")


def codes(result: reactor.UpdateResult) -> list[tuple[int, str]]:
    return [(error["index"], error["code"]) for error in result.errors]


def log(db_path: Path, key: str = KEY) -> list[tuple[str, Any]]:
    """The change-log rows of ``key``: (type, decoded ops)."""
    rows = raw_query(
        db_path, "SELECT type, ops FROM reactor_changes WHERE key = ? ORDER BY revision", (key,)
    )
    return [(kind, None if ops is None else json.loads(ops)) for kind, ops in rows]


def run(scope: reactor.Scope, start: Any, op_list: list[dict[str, Any]]) -> reactor.UpdateResult:
    """Set ``KEY`` to ``start``, apply ``op_list``, check the result matches the store."""
    scope.set(KEY, start)
    result = scope.update(KEY, op_list)
    assert canon(result.old_value) == canon(start)
    assert canon(result.new_value) == canon(scope.get(KEY))
    return result


# -- the builders ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("built", "by_hand"),
    [
        (ops.set("a.b", 1), {"type": "set", "path": "a.b", "value": 1}),
        (ops.set(["a.b", 0], [1]), {"type": "set", "path": ["a.b", 0], "value": [1]}),
        (ops.set("", None), {"type": "set", "path": "", "value": None}),
        (ops.merge({"x": 1}), {"type": "merge", "value": {"x": 1}}),
        (ops.merge({"x": 1}, path="a"), {"type": "merge", "path": "a", "value": {"x": 1}}),
        (ops.merge({}, path=[]), {"type": "merge", "path": [], "value": {}}),
        (ops.increment("n"), {"type": "increment", "path": "n", "by": 1}),
        (ops.increment("n", by=2.5), {"type": "increment", "path": "n", "by": 2.5}),
        (ops.increment(["l", 0], -3), {"type": "increment", "path": ["l", 0], "by": -3}),
        (ops.decrement("n"), {"type": "decrement", "path": "n", "by": 1}),
        (ops.decrement("n", by=4), {"type": "decrement", "path": "n", "by": 4}),
        (ops.append("x"), {"type": "append", "value": "x"}),
        (ops.append({"e": 1}, path="h"), {"type": "append", "path": "h", "value": {"e": 1}}),
        (ops.remove("a.b"), {"type": "remove", "path": "a.b"}),
        (ops.remove(""), {"type": "remove", "path": ""}),
        (ops.remove([]), {"type": "remove", "path": []}),
    ],
)
def test_the_builders_make_the_documented_dicts(
    built: dict[str, Any], by_hand: dict[str, Any]
) -> None:
    assert built == by_hand


def test_builders_and_hand_written_dicts_do_the_same(scope: reactor.Scope) -> None:
    start = {"n": 1, "s": "a", "l": [1], "o": {"x": 1}}
    built = [
        ops.set("o.y", 2),
        ops.merge({"z": 3}, path="o"),
        ops.increment("n", 5),
        ops.decrement("n", 2),
        ops.append("b", path="s"),
        ops.append(2, path="l"),
        ops.remove("o.x"),
        ops.merge({"top": True}),
    ]
    by_hand: list[dict[str, Any]] = [
        {"type": "set", "path": "o.y", "value": 2},
        {"type": "merge", "path": "o", "value": {"z": 3}},
        {"type": "increment", "path": "n", "by": 5},
        {"type": "decrement", "path": "n", "by": 2},
        {"type": "append", "path": "s", "value": "b"},
        {"type": "append", "path": "l", "value": 2},
        {"type": "remove", "path": "o.x"},
        {"type": "merge", "path": None, "value": {"top": True}},  # no path: the root
    ]
    expected = {"n": 4, "s": "ab", "l": [1, 2], "o": {"y": 2, "z": 3}, "top": True}
    assert run(scope, start, built) == reactor.UpdateResult(start, expected, [])
    assert run(scope, start, by_hand) == reactor.UpdateResult(start, expected, [])


# -- set -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("start", "op", "expected"),
    [
        pytest.param({"a": 1}, ops.set("a", 2), {"a": 2}, id="replace a field"),
        pytest.param({}, ops.set("a", [1, {"b": None}]), {"a": [1, {"b": None}]}, id="new"),
        pytest.param({}, ops.set("a.b.c", 1), {"a": {"b": {"c": 1}}}, id="creates parents"),
        pytest.param(
            {"a": {"x": 0}}, ops.set("a.b.c", 1), {"a": {"x": 0, "b": {"c": 1}}}, id="some exist"
        ),
        pytest.param({"l": [1, 2]}, ops.set("l.1", 5), {"l": [1, 5]}, id="digit segment index"),
        pytest.param({"l": [1, 2]}, ops.set(["l", 0], 5), {"l": [5, 2]}, id="int segment index"),
        pytest.param(
            {"l": [{"a": 1}]}, ops.set("l.0.b", 2), {"l": [{"a": 1, "b": 2}]}, id="through a list"
        ),
        pytest.param({"a.b": [0]}, ops.set(["a.b", 0], 1), {"a.b": [1]}, id="a name with a dot"),
        pytest.param({}, ops.set(["a.b", "c"], 1), {"a.b": {"c": 1}}, id="dotted name created"),
        pytest.param(
            {"a": {"b": 1}}, ops.set(["a", "b"], 2), {"a": {"b": 2}}, id="list path, no dots"
        ),
        pytest.param({"a": 1}, ops.set("", [1]), [1], id="root, empty str"),
        pytest.param({"a": 1}, ops.set([], "s"), "s", id="root, empty list"),
        pytest.param("text", ops.set("", None), None, id="root to null"),
        pytest.param({"a": 1}, ops.set("a", 1.0), {"a": 1.0}, id="a float stays a float"),
        pytest.param({"a": 1}, ops.set("a", True), {"a": True}, id="a bool stays a bool"),
    ],
)
def test_set(scope: reactor.Scope, start: Any, op: dict[str, Any], expected: Any) -> None:
    result = run(scope, start, [op])
    assert result.errors == []
    assert canon(scope.get(KEY)) == canon(expected)


# -- the errors of each op, and an op that fails changes nothing ------------------------
@pytest.mark.parametrize(
    ("start", "op", "code"),
    [
        # set
        pytest.param({"l": [1]}, ops.set("l.1", 2), "path_not_found", id="set past a list"),
        pytest.param({"l": []}, ops.set("l.0", 2), "path_not_found", id="set in an empty list"),
        pytest.param({"l": [1]}, ops.set(["l", 5], 2), "path_not_found", id="set int past end"),
        pytest.param({"l": [[1]]}, ops.set("l.3.0", 2), "path_not_found", id="set under past"),
        pytest.param({"l": [1]}, ops.set("l.x", 2), "path_not_found", id="set non-index"),
        pytest.param({"l": [1, 2]}, ops.set("l.01", 2), "path_not_found", id="set index 01"),
        pytest.param({"l": [1]}, ops.set(["l", -1], 2), "path_not_found", id="set index -1"),
        pytest.param({"a": 1}, ops.set("a.b", 2), "type_mismatch", id="set under a number"),
        pytest.param({"s": "ab"}, ops.set("s.0", "x"), "type_mismatch", id="set under a str"),
        pytest.param({"a": None}, ops.set("a.b", 2), "type_mismatch", id="set under null"),
        pytest.param(5, ops.set("a", 2), "type_mismatch", id="set a field of a number"),
        pytest.param([1], ops.set("a", 2), "path_not_found", id="set a name in a list"),
        # merge
        pytest.param({"a": [1]}, ops.merge({"x": 1}, "a"), "type_mismatch", id="merge list"),
        pytest.param({"a": "s"}, ops.merge({"x": 1}, "a"), "type_mismatch", id="merge str"),
        pytest.param({"a": 0}, ops.merge({"x": 1}, "a"), "type_mismatch", id="merge number"),
        pytest.param({"a": False}, ops.merge({"x": 1}, "a"), "type_mismatch", id="merge false"),
        pytest.param([1], ops.merge({"x": 1}), "type_mismatch", id="merge into a list root"),
        pytest.param(3, ops.merge({"x": 1}, ""), "type_mismatch", id="merge into a num root"),
        pytest.param({}, {"type": "merge", "value": [1]}, "invalid_op", id="merge a list"),
        pytest.param({}, {"type": "merge", "value": None}, "invalid_op", id="merge null"),
        pytest.param({}, {"type": "merge", "path": "a"}, "invalid_op", id="merge no value"),
        # increment / decrement
        pytest.param({"n": "1"}, ops.increment("n"), "type_mismatch", id="increment a str"),
        pytest.param({"n": True}, ops.increment("n"), "type_mismatch", id="increment a bool"),
        pytest.param({"n": None}, ops.increment("n"), "type_mismatch", id="increment null"),
        pytest.param({"n": [1]}, ops.increment("n"), "type_mismatch", id="increment a list"),
        pytest.param({"n": {}}, ops.decrement("n"), "type_mismatch", id="decrement an object"),
        pytest.param("x", ops.increment(""), "type_mismatch", id="increment a str root"),
        pytest.param({"l": []}, ops.increment("l.0"), "path_not_found", id="increment past end"),
        pytest.param(
            {"n": 1}, {"type": "increment", "path": "n", "by": "2"}, "invalid_op", id="by a str"
        ),
        pytest.param(
            {"n": 1}, {"type": "increment", "path": "n", "by": None}, "invalid_op", id="by null"
        ),
        pytest.param(
            {"n": 1}, {"type": "increment", "path": "n", "by": True}, "invalid_op", id="by true"
        ),
        pytest.param(
            {"n": 1}, {"type": "decrement", "path": "n", "by": [1]}, "invalid_op", id="by a list"
        ),
        pytest.param(
            {}, {"type": "increment", "path": "x.y", "by": "2"}, "invalid_op", id="by str, new"
        ),
        # append
        pytest.param({"s": "a"}, ops.append(1, "s"), "type_mismatch", id="append num to str"),
        pytest.param({"s": "a"}, ops.append(["b"], "s"), "type_mismatch", id="append list str"),
        pytest.param({"s": "a"}, ops.append(None, "s"), "type_mismatch", id="append null str"),
        pytest.param({"n": 1}, ops.append(1, "n"), "type_mismatch", id="append to a number"),
        pytest.param({"o": {}}, ops.append(1, "o"), "type_mismatch", id="append to an object"),
        pytest.param({"b": True}, ops.append(1, "b"), "type_mismatch", id="append to a bool"),
        pytest.param({"l": []}, ops.append(1, "l.0"), "path_not_found", id="append past end"),
        pytest.param({"a": 1}, ops.append(1, "a.b"), "type_mismatch", id="append under num"),
        pytest.param({"l": []}, {"type": "append", "path": "l"}, "invalid_op", id="append no v"),
        # malformed ops
        pytest.param({}, {"type": "bogus", "path": "a", "value": 1}, "invalid_op", id="type"),
        pytest.param({}, {"type": None, "path": "a", "value": 1}, "invalid_op", id="type null"),
        pytest.param({}, {"type": 1, "path": "a", "value": 1}, "invalid_op", id="type int"),
        pytest.param({}, {"path": "a", "value": 1}, "invalid_op", id="no type"),
        pytest.param({}, {"type": "set", "value": 1}, "invalid_op", id="set without path"),
        pytest.param({}, {"type": "set", "path": "a"}, "invalid_op", id="set without value"),
        pytest.param({}, {"type": "increment"}, "invalid_op", id="increment without path"),
        pytest.param({}, {"type": "decrement"}, "invalid_op", id="decrement without path"),
        pytest.param({}, {"type": "remove"}, "invalid_op", id="remove without path"),
        pytest.param({}, {"type": "remove", "path": None}, "invalid_op", id="remove path null"),
        pytest.param({}, ops.set("a..b", 1), "invalid_op", id="empty segment"),
        pytest.param({}, ops.set(".a", 1), "invalid_op", id="leading dot"),
        pytest.param({}, ops.set("a.", 1), "invalid_op", id="trailing dot"),
        pytest.param({}, {"type": "set", "path": 5, "value": 1}, "invalid_op", id="path int"),
        pytest.param({}, {"type": "set", "path": {}, "value": 1}, "invalid_op", id="path dict"),
        pytest.param(
            {}, {"type": "set", "path": ["a", 1.5], "value": 1}, "invalid_op", id="float segment"
        ),
        pytest.param(
            {}, {"type": "set", "path": ["a", None], "value": 1}, "invalid_op", id="null segment"
        ),
        pytest.param({}, ops.set(["a", True], 1), "invalid_op", id="bool segment"),
        pytest.param(
            {}, {"type": "set", "path": ["a", ["b"]], "value": 1}, "invalid_op", id="list segment"
        ),
        pytest.param({}, ops.set("a." * 100 + "a", 1), "invalid_op", id="path past max depth"),
    ],
)
def test_an_op_that_cannot_apply_is_reported_and_changes_nothing(
    scope: reactor.Scope, db_path: Path, start: Any, op: dict[str, Any], code: str
) -> None:
    for atomic in (None, False, True):
        scope.set(KEY, start)
        result = scope.update(KEY, [op], atomic=atomic)
        assert len(result.errors) == 1
        error = result.errors[0]
        assert set(error) == {"index", "op", "code", "message"}
        assert (error["index"], error["code"]) == (0, code), error
        assert error["op"] == op
        assert isinstance(error["message"], str)
        assert error["message"]
        assert canon(result.old_value) == canon(start)
        assert canon(result.new_value) == canon(start)
        assert canon(scope.get(KEY)) == canon(start)
    assert log(db_path) == [("created", None)]


def test_a_path_100000_segments_deep_is_an_invalid_op_entry(scope: reactor.Scope) -> None:
    scope.set(KEY, {"a": {"a": 1}})
    paths: list[str | list[str | int]] = [
        ".".join(["a"] * 100_000),
        ["a"] * 100_000,
        ["l", *([0] * 100_000)],
    ]
    for path in paths:
        result = scope.update(KEY, [ops.set(path, 1), ops.remove(path), ops.increment(path)])
        assert codes(result) == [(0, "invalid_op"), (1, "invalid_op"), (2, "invalid_op")]
    assert scope.get(KEY) == {"a": {"a": 1}}


# -- merge -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("start", "op", "expected"),
    [
        pytest.param({"a": 1}, ops.merge({"b": 2}), {"a": 1, "b": 2}, id="root"),
        pytest.param({"a": 1}, ops.merge({"a": 3}, path=""), {"a": 3}, id="root, empty str"),
        pytest.param({"a": 1}, ops.merge({"a": None}, path=[]), {"a": None}, id="root, []"),
        pytest.param(None, ops.merge({"a": 1}), {"a": 1}, id="null root"),
        pytest.param(
            {"o": {"x": 1, "y": 2}},
            ops.merge({"y": 3, "z": 4}, path="o"),
            {"o": {"x": 1, "y": 3, "z": 4}},
            id="into a field",
        ),
        pytest.param(
            {"o": {"n": {"x": 1}}},
            ops.merge({"n": {"y": 2}}, path="o"),
            {"o": {"n": {"y": 2}}},
            id="shallow",
        ),
        pytest.param({}, ops.merge({"x": 1}, path="a.b"), {"a": {"b": {"x": 1}}}, id="missing"),
        pytest.param({"a": None}, ops.merge({"x": 1}, path="a"), {"a": {"x": 1}}, id="null"),
        pytest.param(
            {"l": [{"x": 1}]}, ops.merge({"y": 2}, path="l.0"), {"l": [{"x": 1, "y": 2}]}, id="l"
        ),
        pytest.param({"a": {"x": 1}}, ops.merge({}, path="a"), {"a": {"x": 1}}, id="empty"),
    ],
)
def test_merge(scope: reactor.Scope, start: Any, op: dict[str, Any], expected: Any) -> None:
    result = run(scope, start, [op])
    assert result.errors == []
    assert canon(scope.get(KEY)) == canon(expected)


def test_merge_does_not_share_the_merged_object(scope: reactor.Scope) -> None:
    scope.set(KEY, {})
    result = scope.update(KEY, [ops.merge({"x": [1]}, path="a"), ops.append(2, path="a.x")])
    assert result.errors == []
    assert scope.get(KEY) == {"a": {"x": [1, 2]}}


# -- increment and decrement -----------------------------------------------------------
@pytest.mark.parametrize(
    ("start", "op", "expected"),
    [
        pytest.param({"n": 1}, ops.increment("n"), {"n": 2}, id="by 1"),
        pytest.param({"n": 1}, ops.increment("n", 10), {"n": 11}, id="by 10"),
        pytest.param({"n": 1}, ops.increment("n", -3), {"n": -2}, id="by -3"),
        pytest.param({"n": 1}, ops.increment("n", 0.5), {"n": 1.5}, id="by a float"),
        pytest.param({"n": 1.5}, ops.increment("n", 1), {"n": 2.5}, id="a float"),
        pytest.param({"n": 1}, ops.decrement("n"), {"n": 0}, id="decrement"),
        pytest.param({"n": 1}, ops.decrement("n", 5), {"n": -4}, id="decrement by 5"),
        pytest.param({"n": 1}, ops.decrement("n", -5), {"n": 6}, id="decrement by -5"),
        pytest.param({}, ops.increment("n"), {"n": 1}, id="missing counts as 0"),
        pytest.param({}, ops.decrement("n", 2), {"n": -2}, id="decrement missing"),
        pytest.param({}, ops.increment("a.b.n", 3), {"a": {"b": {"n": 3}}}, id="missing parents"),
        pytest.param({"l": [1, 2]}, ops.increment("l.1"), {"l": [1, 3]}, id="list element"),
        pytest.param({"l": [1, 2]}, ops.increment(["l", 0], 2), {"l": [3, 2]}, id="int index"),
        pytest.param(41, ops.increment(""), 42, id="root"),
        pytest.param(41, ops.decrement([]), 40, id="root, []"),
        pytest.param({"a.b": 1}, ops.increment(["a.b"]), {"a.b": 2}, id="a name with a dot"),
    ],
)
def test_increment_and_decrement(
    scope: reactor.Scope, start: Any, op: dict[str, Any], expected: Any
) -> None:
    result = run(scope, start, [op])
    assert result.errors == []
    assert canon(scope.get(KEY)) == canon(expected)


def test_increment_keeps_ints_ints(scope: reactor.Scope) -> None:
    scope.set(KEY, {"n": 1})
    scope.update(KEY, [ops.increment("n", 2)])
    assert type(scope.get(KEY)["n"]) is int
    scope.update(KEY, [ops.increment("n", 0.0)])
    assert type(scope.get(KEY)["n"]) is float


# -- append ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("start", "op", "expected"),
    [
        pytest.param({"l": [1]}, ops.append(2, "l"), {"l": [1, 2]}, id="to a list"),
        pytest.param({"l": [1]}, ops.append([2, 3], "l"), {"l": [1, [2, 3]]}, id="not flattened"),
        pytest.param({"l": []}, ops.append({"a": 1}, "l"), {"l": [{"a": 1}]}, id="an object"),
        pytest.param({"l": []}, ops.append(None, "l"), {"l": [None]}, id="null"),
        pytest.param({"s": "ab"}, ops.append("cd", "s"), {"s": "abcd"}, id="concatenate"),
        pytest.param({"s": ""}, ops.append("🚀", "s"), {"s": "🚀"}, id="to an empty string"),
        pytest.param({}, ops.append(1, "l"), {"l": [1]}, id="missing becomes [v]"),
        pytest.param({}, ops.append("s", "t"), {"t": ["s"]}, id="missing, a str, becomes [v]"),
        pytest.param({}, ops.append(1, "a.b"), {"a": {"b": [1]}}, id="missing parents"),
        pytest.param({"l": [[1]]}, ops.append(2, "l.0"), {"l": [[1, 2]]}, id="nested list"),
        pytest.param([1], ops.append(2), [1, 2], id="root list"),
        pytest.param("ab", ops.append("c"), "abc", id="root string"),
        pytest.param([1], ops.append(2, path=""), [1, 2], id="root, empty str"),
        pytest.param("ab", ops.append("c", path=[]), "abc", id="root, []"),
    ],
)
def test_append(scope: reactor.Scope, start: Any, op: dict[str, Any], expected: Any) -> None:
    result = run(scope, start, [op])
    assert result.errors == []
    assert canon(scope.get(KEY)) == canon(expected)


def test_many_appends_to_a_string_build_it_in_order(scope: reactor.Scope) -> None:
    pieces = [f"{i}," for i in range(10_000)]
    result = run(scope, {"s": "start:", "n": 1}, [ops.append(piece, "s") for piece in pieces])
    assert result.errors == []
    assert scope.get(KEY) == {"s": "start:" + "".join(pieces), "n": 1}
    assert result.new_value == scope.get(KEY)


@pytest.mark.parametrize(
    ("start", "op_list", "expected", "errors"),
    [
        pytest.param(
            {"s": "a"},
            [ops.append("b", "s"), ops.increment("s"), ops.append(1, "s"), ops.append("c", "s")],
            {"s": "abc"},
            [(1, "type_mismatch"), (2, "type_mismatch")],
            id="other ops on a string being appended to",
        ),
        pytest.param(
            {"l": ["a", "b"]},
            [ops.append("x", "l.1"), ops.remove("l.0"), ops.append("y", "l.0")],
            {"l": ["bxy"]},
            [],
            id="the list holding it shifts",
        ),
        pytest.param(
            {"s": "a"},
            [ops.append("b", "s"), ops.set("t", "?"), ops.set("s", "new"), ops.append("!", "s")],
            {"s": "new!", "t": "?"},
            [],
            id="replaced, then appended to again",
        ),
        pytest.param(
            {"s": "a"},
            [ops.append("b", "s"), ops.append("c", "s.x")],
            {"s": "ab"},
            [(1, "type_mismatch")],
            id="a path through it",
        ),
        pytest.param("a", [ops.append("b"), ops.append("c")], "abc", [], id="the root"),
    ],
)
def test_appends_to_a_string_mix_with_other_ops(
    scope: reactor.Scope,
    start: Any,
    op_list: list[dict[str, Any]],
    expected: Any,
    errors: list[tuple[int, str]],
) -> None:
    result = run(scope, start, op_list)
    assert codes(result) == errors
    assert all("str" in error["message"] for error in result.errors), result.errors
    assert canon(scope.get(KEY)) == canon(expected)


def test_appends_past_the_size_limit_stop_at_the_first_one_over(
    open_state: Callable[..., reactor.State], db_path: Path
) -> None:
    scope = open_state(max_value_bytes=100_000).scope("limits")
    scope.set(KEY, "x" * 99_000)
    with pytest.raises(reactor.InvalidValueError, match="over the value size limit"):
        scope.update(KEY, [ops.append("x")] * 2_000)  # the 999th passes the limit
    with pytest.raises(reactor.InvalidValueError):
        scope.update(KEY, [ops.append("y" * 600, "")] * 2, atomic=True)
    assert scope.get(KEY) == "x" * 99_000
    assert log(db_path) == [("created", None)]
    assert scope.update(KEY, [ops.append("y")] * 900).errors == []
    assert scope.get(KEY) == "x" * 99_000 + "y" * 900


# -- remove ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("start", "op", "expected"),
    [
        pytest.param({"a": 1, "b": 2}, ops.remove("a"), {"b": 2}, id="a field"),
        pytest.param({"a": {"b": 1, "c": 2}}, ops.remove("a.b"), {"a": {"c": 2}}, id="nested"),
        pytest.param({"l": [1, 2, 3]}, ops.remove("l.0"), {"l": [2, 3]}, id="list element"),
        pytest.param({"l": [1, 2, 3]}, ops.remove(["l", 2]), {"l": [1, 2]}, id="int index"),
        pytest.param({"a.b": 1, "a": {"b": 2}}, ops.remove(["a.b"]), {"a": {"b": 2}}, id="dot"),
        pytest.param({"a.b": 1, "a": {"b": 2}}, ops.remove("a.b"), {"a.b": 1, "a": {}}, id="."),
        pytest.param({"a": 1}, ops.remove("b"), {"a": 1}, id="missing field"),
        pytest.param({"a": 1}, ops.remove("x.y.z"), {"a": 1}, id="missing parents"),
        pytest.param({"l": [1]}, ops.remove("l.5"), {"l": [1]}, id="missing index"),
        pytest.param({"a": 1}, ops.remove("a.b"), {"a": 1}, id="under a number"),
    ],
)
def test_remove(scope: reactor.Scope, start: Any, op: dict[str, Any], expected: Any) -> None:
    result = run(scope, start, [op])
    assert result.errors == []
    assert canon(scope.get(KEY)) == canon(expected)


@pytest.mark.parametrize("path", ["", []])
def test_remove_with_the_empty_path_deletes_the_key(
    scope: reactor.Scope, db_path: Path, path: str | list[str | int]
) -> None:
    scope.set(KEY, {"a": 1})
    result = scope.update(KEY, [ops.remove(path)])
    assert result == reactor.UpdateResult({"a": 1}, None, [])
    assert not scope.exists(KEY)
    assert log(db_path) == [("created", None), ("deleted", [ops.remove(path)])]
    # and on a missing key, it is nothing to remove
    assert scope.update(KEY, [ops.remove(path)]) == reactor.UpdateResult(None, None, [])
    assert len(log(db_path)) == 2


def test_remove_of_the_key_then_ops_with_a_path_start_a_new_object(scope: reactor.Scope) -> None:
    scope.set(KEY, [1, 2])
    result = scope.update(KEY, [ops.remove(""), ops.set("a", 1)])
    assert result == reactor.UpdateResult([1, 2], {"a": 1}, [])


# -- partial (default) and atomic ------------------------------------------------------
MIXED = [
    ops.set("a", 1),  # applies
    ops.increment("s"),  # type_mismatch
    ops.append(2, "l"),  # applies
    ops.set("l.9", 0),  # path_not_found
    {"type": "nope"},  # invalid_op
    ops.increment("n", 5),  # applies
]
MIXED_START = {"s": "text", "l": [1]}


def test_by_default_failing_ops_are_skipped_and_the_rest_kept(
    scope: reactor.Scope, db_path: Path
) -> None:
    for atomic in (None, False):
        scope.set(KEY, MIXED_START)
        result = scope.update(KEY, MIXED, atomic=atomic)
        expected = {"s": "text", "l": [1, 2], "a": 1, "n": 5}
        assert result.new_value == expected
        assert scope.get(KEY) == expected
        assert codes(result) == [(1, "type_mismatch"), (3, "path_not_found"), (4, "invalid_op")]
        assert [error["op"] for error in result.errors] == [MIXED[1], MIXED[3], MIXED[4]]
    # the change log holds only the ops that applied
    applied = [MIXED[0], MIXED[2], MIXED[5]]
    assert log(db_path) == [
        ("created", None),
        ("updated", applied),
        ("updated", None),  # the second set
        ("updated", applied),
    ]


def test_atomic_applies_nothing_when_an_op_fails(scope: reactor.Scope, db_path: Path) -> None:
    scope.set(KEY, MIXED_START)
    result = scope.update(KEY, MIXED, atomic=True)
    assert result.old_value == MIXED_START
    assert result.new_value == MIXED_START
    assert scope.get(KEY) == MIXED_START
    assert result.errors
    assert codes(result)[0] == (1, "type_mismatch")
    assert log(db_path) == [("created", None)]


def test_atomic_reports_every_op_that_cannot_apply(scope: reactor.Scope) -> None:
    scope.set(KEY, MIXED_START)
    result = scope.update(KEY, MIXED, atomic=True)
    assert codes(result) == [(1, "type_mismatch"), (3, "path_not_found"), (4, "invalid_op")]
    assert scope.get(KEY) == MIXED_START


def test_atomic_without_errors_applies_everything(scope: reactor.Scope, db_path: Path) -> None:
    scope.set(KEY, {"n": 1})
    batch = [ops.increment("n"), ops.set("m", [1]), ops.append(2, "m")]
    result = scope.update(KEY, batch, atomic=True)
    assert result == reactor.UpdateResult({"n": 1}, {"n": 2, "m": [1, 2]}, [])
    assert log(db_path) == [("created", None), ("updated", batch)]


def test_a_later_op_sees_the_earlier_ones_and_not_the_skipped_ones(scope: reactor.Scope) -> None:
    scope.set(KEY, {})
    result = scope.update(
        KEY,
        [
            ops.set("l", []),
            ops.set("l.0", "x"),  # path_not_found: the list is empty
            ops.append("y", "l"),
            ops.set("l.0", "z"),  # the list has one item now
            ops.increment("c"),
            ops.increment("c"),
        ],
    )
    assert codes(result) == [(1, "path_not_found")]
    assert scope.get(KEY) == {"l": ["z"], "c": 2}


@pytest.mark.parametrize(
    "failing",
    [
        pytest.param({"type": "increment", "path": "x.y", "by": "1"}, id="bad by"),
        pytest.param({"type": "merge", "path": "x.y", "value": 5}, id="merge a number"),
        pytest.param({"type": "append", "path": "x.y"}, id="append without value"),
    ],
)
def test_a_skipped_op_leaves_nothing_behind(scope: reactor.Scope, failing: dict[str, Any]) -> None:
    scope.set(KEY, {})
    result = scope.update(KEY, [failing, ops.set("z", 1)])
    assert codes(result) == [(0, "invalid_op")]
    assert scope.get(KEY) == {"z": 1}


def test_a_failed_root_op_does_not_create_the_key(scope: reactor.Scope, db_path: Path) -> None:
    assert scope.update(KEY, [ops.set("a", 1), ops.remove("a")]).new_value is None
    assert not scope.exists(KEY)
    result = scope.update(KEY, [ops.set("a", 1), ops.remove("a"), ops.increment("")])
    assert codes(result) == [(2, "type_mismatch")]
    assert result.new_value is None
    assert not scope.exists(KEY)
    assert log(db_path) == []


# -- a missing key ---------------------------------------------------------------------
def test_a_missing_key_starts_as_an_object_when_the_first_op_has_a_path(
    scope: reactor.Scope, db_path: Path
) -> None:
    result = scope.update(KEY, [ops.increment("n")])
    assert result == reactor.UpdateResult(None, {"n": 1}, [])
    assert scope.get(KEY) == {"n": 1}
    assert log(db_path) == [("created", [ops.increment("n")])]
    result = scope.update("other", [ops.set(["a.b", "c"], 1), ops.append(1, "l")])
    assert result == reactor.UpdateResult(None, {"a.b": {"c": 1}, "l": [1]}, [])


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        pytest.param(ops.set("", [1]), [1], id="set"),
        pytest.param(ops.set([], None), None, id="set null"),
        pytest.param(ops.merge({"a": 1}), {"a": 1}, id="merge"),
        pytest.param(ops.merge({}), {}, id="merge {}"),
        pytest.param(ops.increment(""), 1, id="increment"),
        pytest.param(ops.decrement("", 2), -2, id="decrement"),
        pytest.param(ops.append("x"), ["x"], id="append"),
    ],
)
def test_a_missing_key_and_a_root_op(
    scope: reactor.Scope, op: dict[str, Any], expected: Any
) -> None:
    result = scope.update(KEY, [op])
    assert result.errors == []
    assert canon(result.new_value) == canon(expected)
    assert scope.exists(KEY)
    assert canon(scope.get(KEY)) == canon(expected)


@pytest.mark.parametrize(
    "op_list",
    [
        pytest.param([], id="no ops"),
        pytest.param([ops.remove("a")], id="remove a field"),
        pytest.param([ops.remove("")], id="remove the key"),
        pytest.param([{"type": "increment", "path": "n", "by": "x"}], id="invalid op"),
        pytest.param([{"type": "set", "path": [1.5]}, {"type": "nope"}], id="failing ops"),
        pytest.param([{"type": "merge", "value": 5}], id="merge a number"),
    ],
)
def test_an_update_where_no_op_applies_creates_nothing(
    scope: reactor.Scope, db_path: Path, op_list: list[dict[str, Any]]
) -> None:
    result = scope.update(KEY, op_list)
    assert result.old_value is None
    assert result.new_value is None
    assert not scope.exists(KEY)
    assert log(db_path) == []
    assert scope.update(KEY, op_list, atomic=True).new_value is None
    assert not scope.exists(KEY)


def test_a_failing_atomic_update_on_a_missing_key_creates_nothing(
    scope: reactor.Scope, db_path: Path
) -> None:
    result = scope.update(KEY, [ops.increment("n"), ops.append(1, "n")], atomic=True)
    assert codes(result) == [(1, "type_mismatch")]
    assert result.new_value is None
    assert not scope.exists(KEY)
    assert log(db_path) == []


# -- validation ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "op_list",
    [
        pytest.param([ops.set("x", math.nan)], id="nan"),
        pytest.param([ops.set("x", math.inf)], id="inf"),
        pytest.param([ops.append(-math.inf, "l")], id="-inf appended"),
        pytest.param([ops.merge({"x": {1: 2}})], id="a non-str key"),
        pytest.param([ops.set("x", (1, 2))], id="a tuple"),
        pytest.param([ops.set("x", {1, 2})], id="a set"),
        pytest.param([ops.set("x", b"bytes")], id="bytes"),
        pytest.param([ops.set("x", object())], id="an object"),
        pytest.param([ops.set("a", 1), ops.increment("n", math.nan)], id="by nan"),
        pytest.param(
            [ops.increment("n", 1e308), ops.increment("n", 1e308)], id="increment overflows"
        ),
        pytest.param([ops.decrement("n", 1e308), ops.decrement("n", 1e308)], id="underflows"),
    ],
)
def test_what_is_not_storable_raises_and_writes_nothing(
    scope: reactor.Scope, db_path: Path, op_list: list[dict[str, Any]]
) -> None:
    scope.set(KEY, {"n": 0, "l": []})
    for atomic in (None, True):
        with pytest.raises(reactor.InvalidValueError):
            scope.update(KEY, op_list, atomic=atomic)
    assert scope.get(KEY) == {"n": 0, "l": []}
    with pytest.raises(reactor.InvalidValueError):
        scope.update("missing", op_list)
    assert not scope.exists("missing")
    assert log(db_path) == [("created", None)]


def test_a_result_nesting_past_max_depth_raises(scope: reactor.Scope) -> None:
    scope.set(KEY, {})
    deep: Any = 1
    for _ in range(60):
        deep = [deep]
    with pytest.raises(reactor.InvalidValueError):
        scope.update(KEY, [ops.set("a.b.c.d.e.f", deep)])
    assert scope.get(KEY) == {}


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(ops.set("a", 1), id="a dict"),
        pytest.param((ops.set("a", 1),), id="a tuple"),
        pytest.param(None, id="None"),
        pytest.param("set", id="a str"),
        pytest.param([ops.set("a", 1), "set"], id="a list with a str"),
        pytest.param([None], id="a list with None"),
        pytest.param([ops.set("a", 1), {"op": "add", "path": "/b", "value": 1}], id="mixed"),
    ],
)
def test_ops_not_a_list_of_dicts_or_mixed_raise_invalid_op_error(
    scope: reactor.Scope, bad: Any
) -> None:
    scope.set(KEY, {"a": 0})
    with pytest.raises(reactor.InvalidOpError):
        scope.update(KEY, bad)
    assert scope.get(KEY) == {"a": 0}


# -- expiry, copies, the change log ----------------------------------------------------
def test_update_keeps_the_expiry(scope: reactor.Scope) -> None:
    scope.set(KEY, {"n": 1}, ttl=100)
    scope.update(KEY, [ops.increment("n")])
    assert scope.ttl(KEY) == pytest.approx(100)
    scope.update(KEY, [ops.increment("n"), ops.append(1, "n")])  # partly applies
    assert scope.ttl(KEY) == pytest.approx(100)
    scope.update(KEY, [ops.append(1, "n")])  # fails
    assert scope.ttl(KEY) == pytest.approx(100)
    scope.update(KEY, [ops.set("", [1])])
    assert scope.ttl(KEY) == pytest.approx(100)
    assert scope.get(KEY) == [1]
    scope.set("plain", 1)
    scope.update("plain", [ops.increment("")])
    assert scope.ttl("plain") == -1


def test_the_returned_values_are_copies(scope: reactor.Scope) -> None:
    scope.set(KEY, {"l": [1], "o": {"x": 1}})
    result = scope.update(KEY, [ops.append(2, "l")])
    result.old_value["l"].append("old")
    result.new_value["l"].append("new")
    result.new_value["o"]["x"] = "changed"
    assert scope.get(KEY) == {"l": [1, 2], "o": {"x": 1}}
    failed = scope.update(KEY, [ops.increment("l")])
    failed.new_value["l"].clear()
    assert scope.get(KEY) == {"l": [1, 2], "o": {"x": 1}}


def test_the_ops_passed_are_not_changed_nor_shared(scope: reactor.Scope) -> None:
    value: dict[str, list[Any]] = {"x": [1]}
    op_list = [ops.set("a", value), ops.merge({"m": value}), ops.append(2, "a.x")]
    snapshot = copy.deepcopy(op_list)
    scope.set(KEY, {})
    scope.update(KEY, op_list)
    assert op_list == snapshot
    value["x"].append("later")
    assert scope.get(KEY) == {"a": {"x": [1, 2]}, "m": {"x": [1]}}


def test_one_update_is_one_change(scope: reactor.Scope, db_path: Path) -> None:
    scope.set(KEY, {"n": 0})
    batch = [ops.increment("n"), ops.set("s", "a"), ops.append("b", "s"), ops.remove("n")]
    result = scope.update(KEY, batch)
    assert result == reactor.UpdateResult({"n": 0}, {"s": "ab"}, [])
    assert log(db_path) == [("created", None), ("updated", batch)]
    # an update that changes nothing records nothing
    scope.update(KEY, [ops.set("s", "ab"), ops.remove("missing")])
    assert len(log(db_path)) == 2


# -- a reference model, and a property test against it ---------------------------------
class OpFailed(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class Doc:
    """A value as the model sees it during one update."""

    exists: bool
    value: Any
    # The value is the {} a missing key started as when an op named a field in it,
    # changed since by field ops only: if it is still {} at the end, nothing was created.
    implicit: bool = False


def model_segments(path: Any) -> list[str | int]:
    if path is None or path in ("", []):
        return []
    if isinstance(path, str):
        parts: list[str | int] = list(path.split("."))
        if "" in parts:
            raise OpFailed("invalid_op")
        return parts
    return list(path)


def model_index(segment: str | int, items: list[Any]) -> int | None:
    """The list index a segment names, if it names an existing one."""
    if isinstance(segment, int):
        index = segment
    elif segment.isdigit() and (segment == "0" or not segment.startswith("0")):
        index = int(segment)
    else:
        return None
    return index if 0 <= index < len(items) else None


def is_number(value: Any) -> bool:
    return type(value) in (int, float)


def model_combine(kind: str, present: bool, current: Any, op: dict[str, Any]) -> Any:
    """The new value of a merge, increment, decrement or append target."""
    if kind == "merge":
        if current is None:  # missing or null
            return copy.deepcopy(op["value"])
        if not isinstance(current, dict):
            raise OpFailed("type_mismatch")
        return {**current, **copy.deepcopy(op["value"])}
    if kind in ("increment", "decrement"):
        number = current if present else 0
        if not is_number(number):
            raise OpFailed("type_mismatch")
        return number + op["by"] if kind == "increment" else number - op["by"]
    # append
    item = copy.deepcopy(op["value"])
    if current is None:
        return [item]
    if isinstance(current, list):
        return [*current, item]
    if isinstance(current, str) and isinstance(item, str):
        return current + item
    raise OpFailed("type_mismatch")


def model_locate(root: Any, path: list[str | int], create: bool) -> tuple[Any, Any]:
    """The object or list holding the path's last segment, and its key or index there.

    Missing objects on the way are created when ``create``; a missing list index, or a
    path through a number, string, bool or null, fails.
    """
    node = root
    for segment in path[:-1]:
        if isinstance(node, dict):
            name = str(segment)
            if name not in node:
                if not create:
                    raise OpFailed("path_not_found")
                node[name] = {}
            node = node[name]
        elif isinstance(node, list):
            index = model_index(segment, node)
            if index is None:
                raise OpFailed("path_not_found")
            node = node[index]
        else:
            raise OpFailed("type_mismatch")
    if isinstance(node, dict):
        return node, str(path[-1])
    if isinstance(node, list):
        index = model_index(path[-1], node)
        if index is None:
            raise OpFailed("path_not_found")
        return node, index
    raise OpFailed("type_mismatch")


def model_field_op(root: Any, kind: str, path: list[str | int], op: dict[str, Any]) -> Any:
    """Apply a field op to ``root`` (a private copy, dropped if the op fails)."""
    if kind == "remove":
        try:
            container, key = model_locate(root, path, create=False)
        except OpFailed:
            return root  # removing what is not there is not an error
        if isinstance(container, dict):
            container.pop(key, None)
        else:
            del container[key]
        return root
    container, key = model_locate(root, path, create=True)
    if kind == "set":
        container[key] = copy.deepcopy(op["value"])
    else:
        present = isinstance(container, list) or key in container
        current = container[key] if present else None
        container[key] = model_combine(kind, present, current, op)
    return root


def model_apply(doc: Doc, op: dict[str, Any]) -> Doc:
    """One op on a copy of ``doc``; raise OpFailed, leaving ``doc`` as it was."""
    kind = op["type"]
    path = model_segments(op.get("path"))
    if not path:
        if kind == "remove":
            return Doc(False, None)
        if kind == "set":
            return Doc(True, copy.deepcopy(op["value"]))
        return Doc(True, model_combine(kind, doc.exists, copy.deepcopy(doc.value), op))
    if not doc.exists:  # a missing value starts as {} for an op naming a field in it
        doc = Doc(True, {}, implicit=True)
    value = model_field_op(copy.deepcopy(doc.value), kind, path, op)
    return Doc(True, value, doc.implicit)


@dataclass
class Expected:
    exists: bool
    value: Any
    errors: list[tuple[int, str]]
    # A root op failed on the {} a missing key started as, and the value ended as that
    # {}: reactor then stores {} (see test_a_failed_root_op_does_not_create_the_key).
    known_divergence: bool = False


def model_update(exists: bool, value: Any, op_list: list[dict[str, Any]]) -> Expected:
    """The value and errors after the ops, with the default (partial) semantics."""
    doc = Doc(exists, value)
    errors = []
    failed_root_op_on_start = False
    for index, op in enumerate(op_list):
        try:
            doc = model_apply(doc, op)
        except OpFailed as failure:
            errors.append((index, failure.code))
            if doc.implicit and op.get("path") in (None, "", []):
                failed_root_op_on_start = True
    if doc.implicit and doc.value == {}:  # only the untouched start: nothing to store
        return Expected(False, None, errors, known_divergence=failed_root_op_on_start)
    return Expected(doc.exists, doc.value, errors)


# the strategies
NAMES = st.sampled_from(["a", "b", "l", "0"])
SCALARS = st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "x", "yz"])


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3)


VALUES = st.recursive(SCALARS, _containers, max_leaves=6)
OBJECTS = st.dictionaries(NAMES, VALUES, max_size=3)
PATHS: st.SearchStrategy[Any] = st.sampled_from(
    ["a", "b", "a.b", "a.b.c", "l", "l.0", "l.1", "l.0.a", ["a.b"], ["l", 0], ["l", 1], "0"]
)
ROOT = st.sampled_from(["", []])
BY = st.integers(-3, 3) | st.sampled_from([0.5, -1.5])
OPS = st.one_of(
    st.builds(ops.set, PATHS | ROOT, VALUES),
    st.builds(ops.merge, OBJECTS, st.none() | PATHS | ROOT),
    st.builds(ops.increment, PATHS | ROOT, BY),
    st.builds(ops.decrement, PATHS | ROOT, BY),
    st.builds(ops.append, VALUES, st.none() | PATHS | ROOT),
    st.builds(ops.remove, PATHS | ROOT),
)
MISSING = object()
STARTS = st.one_of(
    st.just(MISSING),
    OBJECTS,
    st.fixed_dictionaries({"a": VALUES, "l": st.lists(VALUES, max_size=3)}),
    VALUES,
)
_keys = itertools.count()


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(start=STARTS, op_list=st.lists(OPS, max_size=6))
def test_update_ops_match_the_reference_model(
    scope: reactor.Scope, start: Any, op_list: list[dict[str, Any]]
) -> None:
    exists = start is not MISSING
    value = start if exists else None
    want = model_update(exists, copy.deepcopy(value), op_list)
    assume(not want.known_divergence)
    want_exists, want_value, want_errors = want.exists, want.value, want.errors

    # default semantics: the failing ops are skipped
    key = f"partial-{next(_keys)}"
    if exists:
        scope.set(key, value)
    result = scope.update(key, op_list)
    assert codes(result) == want_errors
    assert scope.exists(key) == want_exists
    assert canon(scope.get(key)) == canon(want_value)
    assert canon(result.new_value) == canon(want_value)
    assert canon(result.old_value) == canon(value)

    # atomic: all the ops, or the value as it was
    key = f"atomic-{next(_keys)}"
    if exists:
        scope.set(key, value)
    result = scope.update(key, op_list, atomic=True)
    got = codes(result)
    if want_errors:
        assert got
        # the first error is the first op that fails (whether the later ones are
        # reported too is tested by test_atomic_reports_every_op_that_cannot_apply)
        assert got == want_errors[: len(got)]
        want_exists, want_value = exists, value
    else:
        assert got == []
    assert scope.exists(key) == want_exists
    assert canon(scope.get(key)) == canon(want_value)
    assert canon(result.new_value) == canon(want_value)
