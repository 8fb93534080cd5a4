"""JSON Patch (RFC 6902, pointers of RFC 6901) through ``scope.update``: SPEC §4.

The tables are written from the RFC's text: every example of its Appendix A, and every
error its sections 4 and 5 (and RFC 6901 section 4) name. A patch is all or nothing: a
failing patch reports exactly one error (the op that failed, by index) and leaves the
stored value, and the change log, as they were.

Codes: ``test_failed`` for a ``test`` op that does not hold (its target absent
included), ``path_not_found`` for any other op whose target or ``from`` location does
not exist, ``invalid_op`` for a malformed op (unknown or missing ``op``, a missing
member, a pointer that is not RFC 6901 syntax, a ``move`` into its own child).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import reactor
from tests.conftest import canon

from .conftest import raw_query

pytestmark = pytest.mark.sqlite_only(
    "a patch is applied in Python before the write; PostgreSQL's pass writes patches "
    "in test_model, test_campaign_workflow and test_cli"
)

KEY = "doc"


@pytest.fixture
def scope(state: reactor.State) -> reactor.Scope:
    return state.scope("patches")


def log(db_path: Path, key: str = KEY) -> list[tuple[str, Any]]:
    """The change-log rows of ``key``: (type, decoded ops)."""
    rows = raw_query(
        db_path, "SELECT type, ops FROM reactor_changes WHERE key = ? ORDER BY revision", (key,)
    )
    return [(kind, None if ops is None else json.loads(ops)) for kind, ops in rows]


# -- patches that apply ----------------------------------------------------------------
# (document, patch, expected document)
RFC_6901_DOC: dict[str, Any] = {
    "foo": ["bar", "baz"],
    "": 0,
    "a/b": 1,
    "c%d": 2,
    "e^f": 3,
    "g|h": 4,
    "i\\j": 5,
    'k"l': 6,
    " ": 7,
    "m~n": 8,
}

SUCCESS = [
    # Appendix A
    pytest.param(
        {"foo": "bar"},
        [{"op": "add", "path": "/baz", "value": "qux"}],
        {"baz": "qux", "foo": "bar"},
        id="A.1 adding an object member",
    ),
    pytest.param(
        {"foo": ["bar", "baz"]},
        [{"op": "add", "path": "/foo/1", "value": "qux"}],
        {"foo": ["bar", "qux", "baz"]},
        id="A.2 adding an array element",
    ),
    pytest.param(
        {"baz": "qux", "foo": "bar"},
        [{"op": "remove", "path": "/baz"}],
        {"foo": "bar"},
        id="A.3 removing an object member",
    ),
    pytest.param(
        {"foo": ["bar", "qux", "baz"]},
        [{"op": "remove", "path": "/foo/1"}],
        {"foo": ["bar", "baz"]},
        id="A.4 removing an array element",
    ),
    pytest.param(
        {"baz": "qux", "foo": "bar"},
        [{"op": "replace", "path": "/baz", "value": "boo"}],
        {"baz": "boo", "foo": "bar"},
        id="A.5 replacing a value",
    ),
    pytest.param(
        {"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
        [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}],
        {"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}},
        id="A.6 moving a value",
    ),
    pytest.param(
        {"foo": ["all", "grass", "cows", "eat"]},
        [{"op": "move", "from": "/foo/1", "path": "/foo/3"}],
        {"foo": ["all", "cows", "eat", "grass"]},
        id="A.7 moving an array element",
    ),
    pytest.param(
        {"baz": "qux", "foo": ["a", 2, "c"]},
        [
            {"op": "test", "path": "/baz", "value": "qux"},
            {"op": "test", "path": "/foo/1", "value": 2},
        ],
        {"baz": "qux", "foo": ["a", 2, "c"]},
        id="A.8 testing a value: success",
    ),
    pytest.param(
        {"foo": "bar"},
        [{"op": "add", "path": "/child", "value": {"grandchild": {}}}],
        {"foo": "bar", "child": {"grandchild": {}}},
        id="A.10 adding a nested member object",
    ),
    pytest.param(
        {"foo": "bar"},
        [{"op": "add", "path": "/baz", "value": "qux", "xyz": 123}],
        {"foo": "bar", "baz": "qux"},
        id="A.11 ignoring unrecognized elements",
    ),
    pytest.param(
        {"/": 9, "~1": 10},
        [{"op": "test", "path": "/~01", "value": 10}],
        {"/": 9, "~1": 10},
        id="A.14 ~ escape ordering",
    ),
    pytest.param(
        {"foo": ["bar"]},
        [{"op": "add", "path": "/foo/-", "value": ["abc", "def"]}],
        {"foo": ["bar", ["abc", "def"]]},
        id="A.16 adding an array value",
    ),
    # add (4.1)
    pytest.param({}, [], {}, id="empty patch"),
    pytest.param(
        {"foo": None},
        [{"op": "add", "path": "/foo", "value": 1}],
        {"foo": 1},
        id="add replaces an existing member",
    ),
    pytest.param(
        {"foo": "bar"},
        [{"op": "add", "path": "", "value": {"baz": "qux"}}],
        {"baz": "qux"},
        id="add at the root replaces the document",
    ),
    pytest.param({}, [{"op": "add", "path": "", "value": []}], [], id="add root object to array"),
    pytest.param({"a": 1}, [{"op": "add", "path": "", "value": None}], None, id="add root null"),
    pytest.param({}, [{"op": "add", "path": "/", "value": 1}], {"": 1}, id="add / is key ''"),
    pytest.param(
        {"foo": {}},
        [{"op": "add", "path": "/foo/", "value": 1}],
        {"foo": {"": 1}},
        id="add with a trailing slash is key ''",
    ),
    pytest.param(
        {"foo": 1},
        [{"op": "add", "path": "/0", "value": "bar"}],
        {"foo": 1, "0": "bar"},
        id="add a digit member to an object",
    ),
    pytest.param(
        {"foo": "bar"},
        [{"op": "add", "path": "/FOO", "value": "BAR"}],
        {"foo": "bar", "FOO": "BAR"},
        id="member names are case sensitive",
    ),
    pytest.param([], [{"op": "add", "path": "/0", "value": "foo"}], ["foo"], id="add top array"),
    pytest.param(
        ["foo", "sil"],
        [{"op": "add", "path": "/0", "value": "bar"}],
        ["bar", "foo", "sil"],
        id="add at index 0 shifts",
    ),
    pytest.param(
        ["foo", "sil"],
        [{"op": "add", "path": "/2", "value": "bar"}],
        ["foo", "sil", "bar"],
        id="add at index == length appends",
    ),
    pytest.param([], [{"op": "add", "path": "/-", "value": "hi"}], ["hi"], id="add /- on root"),
    pytest.param(
        [1, 2, [3, [4, 5]]],
        [{"op": "add", "path": "/2/1/-", "value": {"foo": ["bar", "baz"]}}],
        [1, 2, [3, [4, 5, {"foo": ["bar", "baz"]}]]],
        id="add - appends n levels down",
    ),
    pytest.param(
        ["foo", "sil"],
        [{"op": "add", "path": "/1", "value": ["bar", "baz"]}],
        ["foo", ["bar", "baz"], "sil"],
        id="add an array value is not flattened",
    ),
    pytest.param(
        {"foo": 1, "baz": [{"qux": "hello"}]},
        [{"op": "add", "path": "/baz/0/foo", "value": "world"}],
        {"foo": 1, "baz": [{"qux": "hello", "foo": "world"}]},
        id="add into an object inside an array",
    ),
    pytest.param(
        {"a": 1},
        [{"op": "add", "path": "/b", "value": [True, False, None, 1.5, "x"]}],
        {"a": 1, "b": [True, False, None, 1.5, "x"]},
        id="add keeps literal types",
    ),
    # remove (4.2)
    pytest.param(
        {"foo": 1, "baz": [{"qux": "hello"}]},
        [{"op": "remove", "path": "/baz/0/qux"}],
        {"foo": 1, "baz": [{}]},
        id="remove a nested member",
    ),
    pytest.param(
        [1, 2, 3, 4],
        [{"op": "remove", "path": "/1"}, {"op": "remove", "path": "/2"}],
        [1, 3],
        id="remove shifts the elements after it",
    ),
    pytest.param({"foo": None}, [{"op": "remove", "path": "/foo"}], {}, id="remove a null"),
    pytest.param(
        {"a": 1},
        [{"op": "remove", "path": "/a", "value": 5}],
        {},
        id="remove ignores a value member",
    ),
    # replace (4.3)
    pytest.param(
        {"foo": "bar"},
        [{"op": "replace", "path": "", "value": {"baz": "qux"}}],
        {"baz": "qux"},
        id="replace the whole document",
    ),
    pytest.param("foo", [{"op": "replace", "path": "", "value": "bar"}], "bar", id="replace str"),
    pytest.param([""], [{"op": "replace", "path": "/0", "value": 0}], [0], id="replace element"),
    pytest.param(
        ["foo", "sil"],
        [{"op": "replace", "path": "/1", "value": ["bar", "baz"]}],
        ["foo", ["bar", "baz"]],
        id="replace with an array is not flattened",
    ),
    pytest.param(
        {"foo": None},
        [{"op": "replace", "path": "/foo", "value": "truthy"}],
        {"foo": "truthy"},
        id="replace a null",
    ),
    pytest.param(
        {"foo": "bar"},
        [{"op": "replace", "path": "/foo", "value": None}],
        {"foo": None},
        id="replace with null",
    ),
    # move (4.4)
    pytest.param(
        {"foo": 1},
        [{"op": "move", "from": "/foo", "path": "/foo"}],
        {"foo": 1},
        id="move to the same location changes nothing",
    ),
    pytest.param(
        {"foo": None},
        [{"op": "move", "from": "/foo", "path": "/bar"}],
        {"bar": None},
        id="move a null",
    ),
    pytest.param(
        {"baz": [{"qux": "hello"}], "bar": 1},
        [{"op": "move", "from": "/baz/0/qux", "path": "/baz/1"}],
        {"baz": [{}, "hello"], "bar": 1},
        id="move a member into an array",
    ),
    pytest.param(
        {"a": [1, 2, 3]},
        [{"op": "move", "from": "/a/0", "path": "/a/-"}],
        {"a": [2, 3, 1]},
        id="move an element to the end",
    ),
    pytest.param(
        {"a": {"b": 1}},
        [{"op": "move", "from": "/a", "path": ""}],
        {"b": 1},
        id="move a member to the root",
    ),
    # copy (4.5)
    pytest.param(
        {"baz": [{"qux": "hello"}], "bar": 1},
        [{"op": "copy", "from": "/baz/0", "path": "/boo"}],
        {"baz": [{"qux": "hello"}], "bar": 1, "boo": {"qux": "hello"}},
        id="copy an element to a member",
    ),
    pytest.param(
        {"foo": None},
        [{"op": "copy", "from": "/foo", "path": "/bar"}],
        {"foo": None, "bar": None},
        id="copy a null",
    ),
    pytest.param(
        {"a": [1, 2]},
        [{"op": "copy", "from": "/a/0", "path": "/a/-"}],
        {"a": [1, 2, 1]},
        id="copy an element to the end",
    ),
    pytest.param(
        {"a": {"b": 1}},
        [
            {"op": "copy", "from": "/a", "path": "/c"},
            {"op": "add", "path": "/c/x", "value": 1},
        ],
        {"a": {"b": 1}, "c": {"b": 1, "x": 1}},
        id="copy is a deep copy",
    ),
    pytest.param(
        {"a": 1},
        [{"op": "copy", "from": "", "path": "/b"}],
        {"a": 1, "b": {"a": 1}},
        id="copy the root into a member",
    ),
    # test (4.6)
    pytest.param(
        {"a": 1}, [{"op": "test", "path": "/a", "value": 1.0}], {"a": 1}, id="test 1 == 1.0"
    ),
    pytest.param(
        {"a": 1.0}, [{"op": "test", "path": "/a", "value": 1}], {"a": 1.0}, id="test 1.0 == 1"
    ),
    pytest.param(
        {"a": [1, {"b": 2.0}]},
        [{"op": "test", "path": "/a", "value": [1.0, {"b": 2}]}],
        {"a": [1, {"b": 2.0}]},
        id="test nested numbers compare numerically",
    ),
    pytest.param(
        {"foo": {"foo": 1, "bar": 2}},
        [{"op": "test", "path": "/foo", "value": {"bar": 2, "foo": 1}}],
        {"foo": {"foo": 1, "bar": 2}},
        id="test objects ignore member order",
    ),
    pytest.param(
        {"foo": [{"foo": 1, "bar": 2}]},
        [{"op": "test", "path": "/foo", "value": [{"bar": 2, "foo": 1}]}],
        {"foo": [{"foo": 1, "bar": 2}]},
        id="test nested objects ignore member order",
    ),
    pytest.param(
        {"a": None, "t": True, "f": False},
        [
            {"op": "test", "path": "/a", "value": None},
            {"op": "test", "path": "/t", "value": True},
            {"op": "test", "path": "/f", "value": False},
        ],
        {"a": None, "t": True, "f": False},
        id="test literals",
    ),
    pytest.param(
        {"a": "é 🚀"},
        [{"op": "test", "path": "/a", "value": "é 🚀"}],
        {"a": "é 🚀"},
        id="test equal strings",
    ),
    pytest.param(
        {"foo": 1},
        [{"op": "test", "path": "", "value": {"foo": 1.0}}],
        {"foo": 1},
        id="test the whole document",
    ),
    pytest.param(
        {"foo": 1},
        [{"op": "test", "path": "/foo", "value": 1, "spurious": 1}],
        {"foo": 1},
        id="test ignores unrecognized members",
    ),
    pytest.param(
        {"1e0": "foo"},
        [{"op": "test", "path": "/1e0", "value": "foo"}],
        {"1e0": "foo"},
        id="test a member named like a number",
    ),
    pytest.param(
        RFC_6901_DOC,
        [
            {"op": "test", "path": "", "value": RFC_6901_DOC},
            {"op": "test", "path": "/foo", "value": ["bar", "baz"]},
            {"op": "test", "path": "/foo/0", "value": "bar"},
            {"op": "test", "path": "/", "value": 0},
            {"op": "test", "path": "/a~1b", "value": 1},
            {"op": "test", "path": "/c%d", "value": 2},
            {"op": "test", "path": "/e^f", "value": 3},
            {"op": "test", "path": "/g|h", "value": 4},
            {"op": "test", "path": "/i\\j", "value": 5},
            {"op": "test", "path": '/k"l', "value": 6},
            {"op": "test", "path": "/ ", "value": 7},
            {"op": "test", "path": "/m~0n", "value": 8},
        ],
        RFC_6901_DOC,
        id="RFC 6901 section 5 pointers",
    ),
    pytest.param(
        {},
        [
            {"op": "add", "path": "/a~1b", "value": 1},
            {"op": "add", "path": "/m~0n", "value": 2},
            {"op": "add", "path": "/~01", "value": 3},
        ],
        {"a/b": 1, "m~n": 2, "~1": 3},
        id="escaped ~1 and ~0 in add",
    ),
    # sequences
    pytest.param(
        {"x": 0},
        [
            {"op": "add", "path": "/a", "value": 1},
            {"op": "test", "path": "/a", "value": 1},
            {"op": "copy", "from": "/a", "path": "/b"},
            {"op": "move", "from": "/a", "path": "/c"},
            {"op": "replace", "path": "/x", "value": [0]},
            {"op": "add", "path": "/x/-", "value": 1},
            {"op": "remove", "path": "/x/0"},
            {"op": "test", "path": "", "value": {"x": [1], "b": 1, "c": 1}},
        ],
        {"x": [1], "b": 1, "c": 1},
        id="each op sees the result of the ones before",
    ),
]


@pytest.mark.parametrize(("document", "patch", "expected"), SUCCESS)
def test_patch_applies(
    scope: reactor.Scope, db_path: Path, document: Any, patch: list[dict[str, Any]], expected: Any
) -> None:
    scope.set(KEY, document)
    result = scope.update(KEY, patch)
    assert result.errors == []
    assert canon(result.old_value) == canon(document)
    assert canon(result.new_value) == canon(expected)
    assert scope.exists(KEY)
    assert canon(scope.get(KEY)) == canon(expected)
    if canon(expected) == canon(document):
        assert log(db_path) == [("created", None)]
    else:  # one update, one change, carrying the patch
        assert log(db_path) == [("created", None), ("updated", patch)]


# -- patches that fail -----------------------------------------------------------------
# (document, patch, index of the failing op, code)

FAILURE = [
    # Appendix A
    pytest.param(
        {"baz": "qux"},
        [{"op": "test", "path": "/baz", "value": "bar"}],
        0,
        "test_failed",
        id="A.9 testing a value: error",
    ),
    pytest.param(
        {"foo": "bar"},
        [{"op": "add", "path": "/baz/bat", "value": "qux"}],
        0,
        "path_not_found",
        id="A.12 adding to a nonexistent target",
    ),
    pytest.param(
        {"foo": "bar"},
        [{"op": "spam", "path": "/baz", "value": "qux"}],
        0,
        "invalid_op",
        id="A.13 invalid document: unknown op",
    ),
    pytest.param(
        {"foo": "bar"},
        [{"op": "add", "value": "qux"}],
        0,
        "invalid_op",
        id="A.13 invalid document: missing path",
    ),
    pytest.param(
        {"foo": "bar"},
        [{"op": "add", "path": "/baz", "value": "qux"}, {"path": "/foo"}],
        1,
        "invalid_op",
        id="A.13 invalid document: missing op",
    ),
    pytest.param(
        {"foo": "bar"},
        [{"op": 1, "path": "/foo", "value": "qux"}],
        0,
        "invalid_op",
        id="A.13 invalid document: op not a string",
    ),
    pytest.param(
        {"/": 9, "~1": 10},
        [{"op": "test", "path": "/~01", "value": "10"}],
        0,
        "test_failed",
        id="A.15 comparing strings and numbers",
    ),
    # missing members (4)
    pytest.param([1], [{"op": "add", "path": "/-"}], 0, "invalid_op", id="add without value"),
    pytest.param([1], [{"op": "replace", "path": "/0"}], 0, "invalid_op", id="replace no value"),
    pytest.param([None], [{"op": "test", "path": "/0"}], 0, "invalid_op", id="test no value"),
    pytest.param(
        [False], [{"op": "test", "path": "/0"}], 0, "invalid_op", id="test no value, false"
    ),
    pytest.param([1], [{"op": "copy", "path": "/-"}], 0, "invalid_op", id="copy without from"),
    pytest.param({"foo": 1}, [{"op": "move", "path": ""}], 0, "invalid_op", id="move no from"),
    pytest.param(
        {"a": 1}, [{"op": "add", "path": None, "value": 1}], 0, "invalid_op", id="path null"
    ),
    pytest.param(
        {"a": 1}, [{"op": "add", "path": 5, "value": 1}], 0, "invalid_op", id="path not a str"
    ),
    pytest.param(
        {"a": 1}, [{"op": "move", "from": 5, "path": "/b"}], 0, "invalid_op", id="from not a str"
    ),
    # pointer syntax (RFC 6901 3 and 4)
    pytest.param(
        {"a": 1},
        [{"op": "add", "path": "a", "value": 1}],
        0,
        "invalid_op",
        id="path without leading slash",
    ),
    pytest.param(
        {"a": 1},
        [{"op": "test", "path": "a", "value": 1}],
        0,
        "invalid_op",
        id="test path without leading slash",
    ),
    pytest.param(
        {"a": 1}, [{"op": "add", "path": "/~2", "value": 1}], 0, "invalid_op", id="escape ~2"
    ),
    pytest.param(
        {"a": 1}, [{"op": "remove", "path": "/a~"}], 0, "invalid_op", id="lone ~ in a pointer"
    ),
    pytest.param(
        {"a": 1},
        [{"op": "copy", "from": "a", "path": "/b"}],
        0,
        "invalid_op",
        id="from without leading slash",
    ),
    pytest.param(
        {"a": 1},
        [{"op": "move", "from": "/~2", "path": "/b"}],
        0,
        "invalid_op",
        id="from with escape ~2",
    ),
    # add (4.1)
    pytest.param(
        {"bar": [1, 2]},
        [{"op": "add", "path": "/bar/8", "value": "5"}],
        0,
        "path_not_found",
        id="add index out of bounds (upper)",
    ),
    pytest.param(
        ["foo", "sil"],
        [{"op": "add", "path": "/3", "value": "bar"}],
        0,
        "path_not_found",
        id="add index > length",
    ),
    pytest.param(
        {"bar": [1, 2]},
        [{"op": "add", "path": "/bar/-1", "value": "5"}],
        0,
        "path_not_found",
        id="add index out of bounds (lower)",
    ),
    pytest.param(
        ["foo", "sil"],
        [{"op": "add", "path": "/1e0", "value": "bar"}],
        0,
        "path_not_found",
        id="add index not a number",
    ),
    pytest.param(
        ["foo", "sil"],
        [{"op": "add", "path": "/01", "value": "bar"}],
        0,
        "path_not_found",
        id="add index with a leading zero",
    ),
    pytest.param(
        ["foo", "sil"],
        [{"op": "add", "path": "/bar", "value": 42}],
        0,
        "path_not_found",
        id="add a member to an array",
    ),
    pytest.param(
        {"a": 1},
        [{"op": "add", "path": "/a/b", "value": 1}],
        0,
        "path_not_found",
        id="add into a number",
    ),
    pytest.param(
        {"a": "str"},
        [{"op": "add", "path": "/a/0", "value": "x"}],
        0,
        "path_not_found",
        id="add into a string",
    ),
    # remove (4.2)
    pytest.param(
        {"foo": "bar"},
        [{"op": "remove", "path": "/baz"}],
        0,
        "path_not_found",
        id="remove a missing member",
    ),
    pytest.param(
        {"foo": "bar"},
        [{"op": "remove", "path": "/missing1/missing2"}],
        0,
        "path_not_found",
        id="remove under a missing member",
    ),
    pytest.param(
        ["foo", "bar"],
        [{"op": "remove", "path": "/2"}],
        0,
        "path_not_found",
        id="remove a missing index",
    ),
    pytest.param(
        [1, 2, 3, 4],
        [{"op": "remove", "path": "/1e0"}],
        0,
        "path_not_found",
        id="remove index not a number",
    ),
    pytest.param(
        {"foo": 1, "baz": [{"qux": "hello"}]},
        [{"op": "remove", "path": "/baz/1e0/qux"}],
        0,
        "path_not_found",
        id="remove under an index not a number",
    ),
    pytest.param(
        [1, 2], [{"op": "remove", "path": "/-"}], 0, "path_not_found", id="remove - (past end)"
    ),
    pytest.param(
        [1, 2], [{"op": "remove", "path": "/01"}], 0, "path_not_found", id="remove leading zero"
    ),
    # replace (4.3)
    pytest.param(
        {"a": 1},
        [{"op": "replace", "path": "/b", "value": 1}],
        0,
        "path_not_found",
        id="replace a missing member",
    ),
    pytest.param(
        {"bar": "baz"},
        [{"op": "replace", "path": "/foo/bar", "value": False}],
        0,
        "path_not_found",
        id="replace under a missing member",
    ),
    pytest.param(
        {"a": [1, 2]},
        [{"op": "replace", "path": "/a/2", "value": 1}],
        0,
        "path_not_found",
        id="replace index == length",
    ),
    pytest.param(
        [""],
        [{"op": "replace", "path": "/1e0", "value": False}],
        0,
        "path_not_found",
        id="replace index not a number",
    ),
    pytest.param(
        {"a": [1, 2]},
        [{"op": "replace", "path": "/a/-", "value": 3}],
        0,
        "path_not_found",
        id="replace - (past end)",
    ),
    # move (4.4)
    pytest.param(
        {"a": 1},
        [{"op": "move", "from": "/x", "path": "/b"}],
        0,
        "path_not_found",
        id="move from a missing member",
    ),
    pytest.param(
        {"foo": 1, "baz": [1, 2, 3, 4]},
        [{"op": "move", "from": "/baz/1e0", "path": "/foo"}],
        0,
        "path_not_found",
        id="move from index not a number",
    ),
    pytest.param(
        {"a": 1},
        [{"op": "move", "from": "/a", "path": "/x/y"}],
        0,
        "path_not_found",
        id="move to a missing parent",
    ),
    pytest.param(
        {"a": {"b": 1}},
        [{"op": "move", "from": "/a", "path": "/a/c"}],
        0,
        "invalid_op",
        id="move into its own child",
    ),
    pytest.param(
        {"a": {"b": {"c": 1}}},
        [{"op": "move", "from": "/a", "path": "/a/b/c"}],
        0,
        "invalid_op",
        id="move into its own grandchild",
    ),
    pytest.param(
        {"a": [1]},
        [{"op": "move", "from": "/a", "path": "/a/0"}],
        0,
        "invalid_op",
        id="move an array into itself",
    ),
    pytest.param(
        {"a": 1},
        [{"op": "move", "from": "", "path": "/a"}],
        0,
        "invalid_op",
        id="move the root into a member",
    ),
    # copy (4.5)
    pytest.param(
        {"a": 1},
        [{"op": "copy", "from": "/x", "path": "/b"}],
        0,
        "path_not_found",
        id="copy from a missing member",
    ),
    pytest.param(
        {"baz": [1, 2, 3], "bar": 1},
        [{"op": "copy", "from": "/baz/1e0", "path": "/boo"}],
        0,
        "path_not_found",
        id="copy from index not a number",
    ),
    pytest.param(
        {"a": 1},
        [{"op": "copy", "from": "/a", "path": "/x/y"}],
        0,
        "path_not_found",
        id="copy to a missing parent",
    ),
    pytest.param(
        {"a": [1]},
        [{"op": "copy", "from": "/a/0", "path": "/a/5"}],
        0,
        "path_not_found",
        id="copy to index > length",
    ),
    # test (4.6): a target that is not there fails the test
    pytest.param(
        {"a": 1}, [{"op": "test", "path": "/b", "value": None}], 0, "test_failed", id="test absent"
    ),
    pytest.param(
        ["foo", "bar"],
        [{"op": "test", "path": "/1e0", "value": "bar"}],
        0,
        "test_failed",
        id="test index not a number",
    ),
    pytest.param(
        ["foo", "bar"],
        [{"op": "test", "path": "/00", "value": "foo"}],
        0,
        "test_failed",
        id="test index 00",
    ),
    pytest.param(
        ["foo", "bar"],
        [{"op": "test", "path": "/01", "value": "bar"}],
        0,
        "test_failed",
        id="test index 01",
    ),
    pytest.param(
        {"a": [1, 2]},
        [{"op": "test", "path": "/a/-", "value": 3}],
        0,
        "test_failed",
        id="test - (past end)",
    ),
    pytest.param(
        {"foo": "bar"},
        [{"op": "test", "path": "/foo/0", "value": "b"}],
        0,
        "test_failed",
        id="test into a string",
    ),
    # test (4.6): values that are not equal
    pytest.param(
        {"foo": {"bar": [1, 2, 5, 4]}},
        [{"op": "test", "path": "/foo", "value": [1, 2]}],
        0,
        "test_failed",
        id="test object vs array",
    ),
    pytest.param(
        {"a": [1, 2]},
        [{"op": "test", "path": "/a", "value": [2, 1]}],
        0,
        "test_failed",
        id="test arrays: order matters",
    ),
    pytest.param(
        {"a": [1, 2]},
        [{"op": "test", "path": "/a", "value": [1, 2, 3]}],
        0,
        "test_failed",
        id="test arrays: length matters",
    ),
    pytest.param(
        {"a": {"x": 1}},
        [{"op": "test", "path": "/a", "value": {"x": 1, "y": None}}],
        0,
        "test_failed",
        id="test objects: a null member is a member",
    ),
    pytest.param(
        {"a": True}, [{"op": "test", "path": "/a", "value": 1}], 0, "test_failed", id="true vs 1"
    ),
    pytest.param(
        {"a": 1}, [{"op": "test", "path": "/a", "value": True}], 0, "test_failed", id="1 vs true"
    ),
    pytest.param(
        {"a": 0}, [{"op": "test", "path": "/a", "value": False}], 0, "test_failed", id="0 vs false"
    ),
    pytest.param(
        {"a": None},
        [{"op": "test", "path": "/a", "value": False}],
        0,
        "test_failed",
        id="null vs false",
    ),
    pytest.param(
        {"a": 0}, [{"op": "test", "path": "/a", "value": None}], 0, "test_failed", id="0 vs null"
    ),
    pytest.param(
        {"a": ""}, [{"op": "test", "path": "/a", "value": None}], 0, "test_failed", id="'' vs null"
    ),
    pytest.param(
        {"a": [1]},
        [{"op": "test", "path": "/a", "value": [True]}],
        0,
        "test_failed",
        id="[1] vs [true]",
    ),
    pytest.param(
        {"a": {"b": 1}},
        [{"op": "test", "path": "/a", "value": {"b": True}}],
        0,
        "test_failed",
        id="nested 1 vs true",
    ),
    pytest.param(
        {"a": "\u00e9"},
        [{"op": "test", "path": "/a", "value": "e\u0301"}],
        0,
        "test_failed",
        id="strings compare code points",
    ),
    pytest.param(
        {"foo": 1},
        [{"op": "test", "path": "", "value": {"foo": 1, "bar": 2}}],
        0,
        "test_failed",
        id="test the whole document fails",
    ),
    # all or nothing (5): the ops before the failing one are not applied
    pytest.param(
        {"a": 1},
        [
            {"op": "add", "path": "/b", "value": 2},
            {"op": "replace", "path": "/a", "value": 3},
            {"op": "test", "path": "/a", "value": 1},
        ],
        2,
        "test_failed",
        id="a failing test undoes the ops before it",
    ),
    pytest.param(
        {"a": 1},
        [
            {"op": "remove", "path": "/a"},
            {"op": "remove", "path": "/a"},
        ],
        1,
        "path_not_found",
        id="the second remove of a member fails",
    ),
    pytest.param(
        [1, 2],
        [
            {"op": "add", "path": "/-", "value": 3},
            {"op": "copy", "from": "/2", "path": "/-"},
            {"op": "remove", "path": "/4"},
        ],
        2,
        "path_not_found",
        id="an array grown by earlier ops still has bounds",
    ),
    pytest.param(
        {"a": 1},
        [
            {"op": "add", "path": "", "value": [1]},
            {"op": "add", "path": "/x", "value": 1},
        ],
        1,
        "path_not_found",
        id="a root replaced by an array takes no member",
    ),
]


def _check_failure(
    scope: reactor.Scope,
    db_path: Path,
    document: Any,
    patch: list[dict[str, Any]],
    index: int,
    code: str,
) -> None:
    scope.set(KEY, document)
    result = scope.update(KEY, patch)
    assert len(result.errors) == 1, result.errors
    error = result.errors[0]
    assert set(error) == {"index", "op", "code", "message"}
    assert (error["index"], error["code"]) == (index, code), error
    assert error["op"] == patch[index]
    assert isinstance(error["message"], str)
    assert error["message"]
    # all or nothing: the value is as it was, and nothing was recorded
    assert canon(result.old_value) == canon(document)
    assert canon(result.new_value) == canon(document)
    assert canon(scope.get(KEY)) == canon(document)
    assert log(db_path) == [("created", None)]


@pytest.mark.parametrize(("document", "patch", "index", "code"), FAILURE)
def test_patch_fails_and_changes_nothing(
    scope: reactor.Scope,
    db_path: Path,
    document: Any,
    patch: list[dict[str, Any]],
    index: int,
    code: str,
) -> None:
    _check_failure(scope, db_path, document, patch, index, code)


ON_OBJECTS = [case for case in FAILURE if isinstance(case.values[0], dict)]


@pytest.mark.parametrize(("document", "patch", "index", "code"), ON_OBJECTS)
def test_patch_fails_after_ops_that_applied(
    scope: reactor.Scope,
    db_path: Path,
    document: Any,
    patch: list[dict[str, Any]],
    index: int,
    code: str,
) -> None:
    """The same failures, after two ops that would apply: those are undone too."""
    before: list[dict[str, Any]] = [
        {"op": "add", "path": "/zz-added", "value": {"n": 1}},
        {"op": "replace", "path": "/zz-added/n", "value": 2},
    ]
    _check_failure(scope, db_path, document, before + patch, index + len(before), code)


def test_a_patch_on_an_array_document_is_all_or_nothing(scope: reactor.Scope) -> None:
    scope.set(KEY, [1, 2, 3])
    result = scope.update(
        KEY,
        [
            {"op": "remove", "path": "/0"},
            {"op": "add", "path": "/-", "value": 4},
            {"op": "test", "path": "/0", "value": 1},
        ],
    )
    assert [(e["index"], e["code"]) for e in result.errors] == [(2, "test_failed")]
    assert scope.get(KEY) == [1, 2, 3]


# -- the arguments ---------------------------------------------------------------------
def test_atomic_false_is_refused_for_a_patch(scope: reactor.Scope, db_path: Path) -> None:
    scope.set(KEY, {"a": 1})
    with pytest.raises(reactor.InvalidArgumentError):
        scope.update(KEY, [{"op": "add", "path": "/b", "value": 2}], atomic=False)
    assert scope.get(KEY) == {"a": 1}
    result = scope.update(KEY, [{"op": "add", "path": "/b", "value": 2}], atomic=True)
    assert result.errors == []
    assert scope.get(KEY) == {"a": 1, "b": 2}


@pytest.mark.parametrize(
    "ops",
    [
        pytest.param(
            [{"op": "add", "path": "/b", "value": 1}, {"type": "set", "path": "b", "value": 1}],
            id="an op of each style",
        ),
        pytest.param(
            [{"type": "set", "path": "b", "value": 1}, {"op": "add", "path": "/b", "value": 1}],
            id="update op first",
        ),
        pytest.param(
            [{"op": "add", "type": "set", "path": "/b", "value": 1}], id="both keys in one op"
        ),
    ],
)
def test_mixing_styles_raises(scope: reactor.Scope, ops: list[dict[str, Any]]) -> None:
    scope.set(KEY, {"a": 1})
    with pytest.raises(reactor.InvalidOpError):
        scope.update(KEY, ops)
    assert scope.get(KEY) == {"a": 1}


@pytest.mark.parametrize(
    "ops",
    [
        pytest.param({"op": "add", "path": "/b", "value": 1}, id="a dict"),
        pytest.param(({"op": "add", "path": "/b", "value": 1},), id="a tuple"),
        pytest.param('[{"op": "add", "path": "/b", "value": 1}]', id="a str"),
        pytest.param(None, id="None"),
        pytest.param([{"op": "add", "path": "/b", "value": 1}, 1], id="a list with an int"),
        pytest.param([[{"op": "add", "path": "/b", "value": 1}]], id="a list of lists"),
        pytest.param(["add"], id="a list of str"),
    ],
)
def test_ops_that_are_not_a_list_of_dicts_raise(scope: reactor.Scope, ops: Any) -> None:
    scope.set(KEY, {"a": 1})
    with pytest.raises(reactor.InvalidOpError):
        scope.update(KEY, ops)
    assert scope.get(KEY) == {"a": 1}


def test_a_value_in_a_patch_must_be_storable(scope: reactor.Scope, db_path: Path) -> None:
    scope.set(KEY, {"a": 1})
    for bad in (float("nan"), float("inf"), {1: 2}, (1, 2), {1, 2}, b"x"):
        with pytest.raises(reactor.InvalidValueError):
            scope.update(KEY, [{"op": "add", "path": "/b", "value": bad}])
    assert scope.get(KEY) == {"a": 1}
    assert log(db_path) == [("created", None)]


# -- limits ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("document", "op"),
    [
        pytest.param({"a": ["x" * 1000]}, {"op": "copy", "from": "/a", "path": "/a/-"}, id="/a"),
        pytest.param(["x" * 1000], {"op": "copy", "from": "", "path": "/-"}, id="root"),
    ],
)
def test_copies_that_double_the_value_stop_at_the_size_limit(
    open_state: Callable[..., reactor.State],
    db_path: Path,
    document: Any,
    op: dict[str, Any],
) -> None:
    scope = open_state(max_value_bytes=100_000).scope("limits")
    scope.set(KEY, document)
    started = time.monotonic()
    with pytest.raises(reactor.InvalidValueError):
        scope.update(KEY, [op] * 40)  # 2**40 KB, were it allowed
    assert time.monotonic() - started < 2
    assert scope.get(KEY) == document
    assert log(db_path) == [("created", None)]
    # a few copies stay within the limit and apply
    result = scope.update(KEY, [op] * 3)
    assert result.errors == []
    assert len(json.dumps(scope.get(KEY))) > 8000


def test_copies_are_charged_for_their_objects_not_only_their_json(
    open_state: Callable[..., reactor.State], db_path: Path
) -> None:
    """{} is 2 bytes of JSON but some 64 in memory: copies of many tiny objects stop at
    the limit before they fill memory, even while their JSON is still small."""
    scope = open_state(max_value_bytes=100_000).scope("limits")
    document = {"a": [{} for _ in range(1_000)]}  # 3 KB of JSON, 1,001 containers
    scope.set(KEY, document)
    assert scope.update(KEY, [{"op": "copy", "from": "/a", "path": "/b"}]).errors == []
    with pytest.raises(reactor.InvalidValueError, match="size limit"):
        scope.update(KEY, [{"op": "copy", "from": "/a", "path": f"/c{i}"} for i in range(2)])
    assert scope.get(KEY) == {"a": document["a"], "b": document["a"]}
    assert [kind for kind, _ in log(db_path)] == ["created", "updated"]


def _nest(levels: int) -> Any:
    """``levels`` objects nested in one another: {"n": {"n": ... {} }}."""
    value: Any = {}
    for _ in range(levels - 1):
        value = {"n": value}
    return value


def test_a_copy_nesting_past_max_depth_raises(
    open_state: Callable[..., reactor.State], db_path: Path
) -> None:
    scope = open_state(max_depth=10).scope("limits")
    document: dict[str, Any] = {"a": {}}
    scope.set(KEY, document)
    with pytest.raises(reactor.InvalidValueError):  # the root copied into itself, 10 times
        scope.update(KEY, [{"op": "copy", "from": "", "path": "/a/x"}] * 10)
    assert scope.get(KEY) == document
    # up to the limit is fine: {"a": {"x": <8 levels>}} is 10 levels
    scope.set("edge", {"a": {}, "s": _nest(8)})
    result = scope.update("edge", [{"op": "copy", "from": "/s", "path": "/a/x"}])
    assert result.errors == []
    with pytest.raises(reactor.InvalidValueError):
        scope.update("edge", [{"op": "copy", "from": "/s", "path": "/a/x/n/y"}])
    assert scope.get("edge") == {"a": {"x": _nest(8)}, "s": _nest(8)}
    assert [kind for kind, _ in log(db_path, "edge")] == ["created", "updated"]


def test_a_move_nesting_past_max_depth_raises(
    open_state: Callable[..., reactor.State], db_path: Path
) -> None:
    scope = open_state(max_depth=10).scope("limits")
    document = {"deep": _nest(8), "x": {"y": {}}}  # 9 levels
    scope.set(KEY, document)
    with pytest.raises(reactor.InvalidValueError):  # 3 + 8 = 11 levels
        scope.update(KEY, [{"op": "move", "from": "/deep", "path": "/x/y/z"}])
    assert scope.get(KEY) == document
    result = scope.update(KEY, [{"op": "move", "from": "/deep", "path": "/x/z"}])  # 10
    assert result.errors == []
    assert scope.get(KEY) == {"x": {"y": {}, "z": _nest(8)}}
    assert [kind for kind, _ in log(db_path)] == ["created", "updated"]


DEEP = "/a" * 100_000
DEEP_INDEXES = "/l" + "/0" * 100_000


@pytest.mark.parametrize("pointer", [DEEP, DEEP_INDEXES], ids=["members", "indexes"])
@pytest.mark.parametrize(
    ("op", "code"),
    [
        pytest.param({"op": "add", "path": "P", "value": 1}, "path_not_found", id="add"),
        pytest.param({"op": "remove", "path": "P"}, "path_not_found", id="remove"),
        pytest.param({"op": "replace", "path": "P", "value": 1}, "path_not_found", id="replace"),
        pytest.param({"op": "test", "path": "P", "value": 1}, "test_failed", id="test"),
        pytest.param({"op": "move", "from": "P", "path": "/z"}, "path_not_found", id="move-from"),
        pytest.param({"op": "copy", "from": "P", "path": "/z"}, "path_not_found", id="copy-from"),
        pytest.param(
            {"op": "move", "from": "/b", "path": "P"},
            "path_not_found",
            id="move-to",
        ),
        pytest.param(
            {"op": "copy", "from": "/a", "path": "P"},
            "path_not_found",
            id="copy-to",
        ),
    ],
)
def test_a_pointer_100000_segments_deep_is_an_error_entry(
    scope: reactor.Scope, pointer: str, op: dict[str, Any], code: str
) -> None:
    document = {"a": {"b": 1}, "b": 2, "l": [[1]]}
    scope.set(KEY, document)
    op = {name: pointer if value == "P" else value for name, value in op.items()}
    started = time.monotonic()
    result = scope.update(KEY, [op])
    assert time.monotonic() - started < 5  # ~0.1 s; a quadratic walk would take minutes
    assert [(e["index"], e["code"]) for e in result.errors] == [(0, code)]
    assert scope.get(KEY) == document


# -- a missing key ---------------------------------------------------------------------
def test_a_patch_on_a_missing_key_starts_from_an_object(
    scope: reactor.Scope, db_path: Path
) -> None:
    patch: list[dict[str, Any]] = [
        {"op": "add", "path": "/a", "value": 1},
        {"op": "add", "path": "/b", "value": [2]},
    ]
    result = scope.update(KEY, patch)
    assert result == reactor.UpdateResult(None, {"a": 1, "b": [2]}, [])
    assert scope.get(KEY) == {"a": 1, "b": [2]}
    assert log(db_path) == [("created", patch)]


@pytest.mark.parametrize("value", [{"x": 1}, [1], "s", 0, None, {}])
def test_add_at_the_root_creates_a_missing_key(
    scope: reactor.Scope, db_path: Path, value: Any
) -> None:
    patch = [{"op": "add", "path": "", "value": value}]
    result = scope.update(KEY, patch)
    assert result.errors == []
    assert canon(result.new_value) == canon(value)
    assert scope.exists(KEY)
    assert canon(scope.get(KEY)) == canon(value)
    assert log(db_path) == [("created", patch)]


@pytest.mark.parametrize(
    ("patch", "code"),
    [
        pytest.param(
            [{"op": "add", "path": "/a", "value": 1}, {"op": "test", "path": "/a", "value": 2}],
            "test_failed",
            id="failed test",
        ),
        pytest.param([{"op": "remove", "path": "/a"}], "path_not_found", id="remove"),
        pytest.param([{"op": "replace", "path": "/a", "value": 1}], "path_not_found", id="replace"),
        pytest.param([{"op": "test", "path": "/a", "value": 1}], "test_failed", id="test"),
        pytest.param(
            [{"op": "add", "path": "", "value": 1}, {"op": "add", "path": "/x", "value": 1}],
            "path_not_found",
            id="add root then member",
        ),
    ],
)
def test_a_failing_patch_on_a_missing_key_creates_nothing(
    scope: reactor.Scope, db_path: Path, patch: list[dict[str, Any]], code: str
) -> None:
    result = scope.update(KEY, patch)
    assert [(e["index"], e["code"]) for e in result.errors] == [(len(patch) - 1, code)]
    assert result.old_value is None
    assert result.new_value is None
    assert not scope.exists(KEY)
    assert log(db_path) == []


def test_a_patch_that_changes_nothing_on_a_missing_key_creates_nothing(
    scope: reactor.Scope, db_path: Path
) -> None:
    assert scope.update(KEY, []) == reactor.UpdateResult(None, None, [])
    # the first op has the empty path: the value starts as null
    result = scope.update(KEY, [{"op": "test", "path": "", "value": None}])
    assert result == reactor.UpdateResult(None, None, [])
    assert not scope.exists(KEY)
    assert log(db_path) == []


# -- expiry and the change log ---------------------------------------------------------
def test_a_patch_keeps_the_expiry(scope: reactor.Scope) -> None:
    scope.set(KEY, {"a": 1}, ttl=100)
    result = scope.update(KEY, [{"op": "add", "path": "/b", "value": 2}])
    assert result.errors == []
    assert scope.ttl(KEY) == pytest.approx(100)
    scope.update(KEY, [{"op": "test", "path": "/a", "value": 2}])  # fails
    assert scope.ttl(KEY) == pytest.approx(100)
    scope.update(KEY, [{"op": "replace", "path": "", "value": [1]}])
    assert scope.ttl(KEY) == pytest.approx(100)
    assert scope.get(KEY) == [1]


def test_one_patch_is_one_change_carrying_the_patch(scope: reactor.Scope, db_path: Path) -> None:
    scope.set(KEY, {"n": 0, "l": []})
    patch: list[dict[str, Any]] = [
        {"op": "replace", "path": "/n", "value": 1},
        {"op": "add", "path": "/l/-", "value": "a"},
        {"op": "add", "path": "/l/-", "value": "b"},
        {"op": "copy", "from": "/l", "path": "/m"},
        {"op": "test", "path": "/m/1", "value": "b"},
    ]
    result = scope.update(KEY, patch)
    assert result.errors == []
    assert scope.get(KEY) == {"n": 1, "l": ["a", "b"], "m": ["a", "b"]}
    assert log(db_path) == [("created", None), ("updated", patch)]
    [(old, new)] = raw_query(
        db_path, "SELECT old_value, new_value FROM reactor_changes WHERE type = 'updated'"
    )
    assert json.loads(old) == {"n": 0, "l": []}
    assert json.loads(new) == {"n": 1, "l": ["a", "b"], "m": ["a", "b"]}


def test_a_patch_removing_the_root_of_a_document_by_move_keeps_the_key(
    scope: reactor.Scope,
) -> None:
    scope.set(KEY, {"a": {"b": [1]}})
    result = scope.update(KEY, [{"op": "move", "from": "/a/b", "path": ""}])
    assert result == reactor.UpdateResult({"a": {"b": [1]}}, [1], [])
    assert scope.get(KEY) == [1]


def test_the_returned_values_are_copies(scope: reactor.Scope) -> None:
    scope.set(KEY, {"a": [1]})
    result = scope.update(KEY, [{"op": "add", "path": "/a/-", "value": 2}])
    result.old_value["a"].append("old")
    result.new_value["a"].append("new")
    assert scope.get(KEY) == {"a": [1, 2]}
