"""Model-based testing: every verb of the SPEC against a plain-Python model of it.

A hypothesis ``RuleBasedStateMachine`` drives a real engine (``reactor.open`` on a real
database, with a fake clock) and, step by step, a model written here from the SPEC
alone: ``{scope: {key: (value, deadline or None)}}``, the clock's time, and the lock
table (holder, fencing token, deadline per name). Each rule calls one verb on both and
compares the answers as canonical JSON, so that ``1``, ``1.0`` and ``True`` differ;
where the model predicts an error, reactor must raise that typed error, and the
invariants then show that nothing changed.

Rules: set (ttl, keep_ttl, a bad ttl), set_many, get, get_many, exists, keys(pattern),
list and snapshot, delete, clear(pattern), increment and decrement (int and float,
non-numbers and bools refused), append, compare_and_swap (``MISSING`` both ways, JSON
equality), push, pop, length, update with update ops (atomic or not) and with a JSON
Patch, expire (and ``None``), advancing the clock, locks (try-acquire, release, extend,
leases running out, fencing tokens), a transaction (committed, or a body that raises),
invalid arguments, and closing and reopening the database.

Invariants, after every step: every scope's ``list()`` (and its key order), the
``ttl()`` of its live keys and of an absent one, ``state.scopes()``, the keys per scope
and the held locks of ``stats()``, each lock holder's ``held()`` and ``token``; the
revision never decreases.

What the machine found is kept at the end of this file as the smallest failing case.

Each example starts from an empty database: a new SQLite file; on PostgreSQL, scope
and lock names of its own in the test's schema, and a clock started past every
deadline of the examples before. Runs:

    .venv/bin/python -m pytest tests/test_model.py                 # 200 examples x 50 steps
    .venv/bin/python -m pytest -m slow tests/test_model.py         # 2,000 examples x 50 steps
    REACTOR_TEST_POSTGRES_URL=postgresql+psycopg://... \\
        .venv/bin/python -m pytest --backend=postgresql tests/test_model.py
        # 50 examples on PostgreSQL (a write there takes 1-2 ms); 500 with -m slow

``REACTOR_MODEL_EXAMPLES=N`` sets the number of examples of whichever test runs.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

import reactor
from reactor import MISSING, ops
from tests.conftest import FakeClock, canon

SCOPES = ("s1", "s2")
# Code-point order: "X" < "k*" < "k1" < "k2" (a locale collation would differ).
KEYS = ("k1", "k2", "k*", "X")
PATTERNS = (
    "*",
    "k?",
    "k*",
    "k\\*",
    "k[12]",
    "k[!1]",
    "[A-Z]",
    "[a-k]?",
    "?",
    "*2",
    "x*",
    "",  # not a pattern: InvalidKeyError
)
LOCKS = ("L1", "L2")
HOLDER_TTLS = (10, 30.0)  # the lease of holder 0 and of holder 1 of each lock name
START = 1_700_000_000.0
DEFAULT = "<default>"
MAX_DOC = 2000  # update results past this many characters of JSON are not sent
STEPS = 50


# -- the model: JSON ---------------------------------------------------------------------
class Predicted(Exception):
    """The model's answer: this typed error, and nothing changed."""

    def __init__(self, error: type[Exception]) -> None:
        super().__init__(error.__name__)
        self.error = error


def is_number(value: Any) -> bool:
    return type(value) in (int, float)  # bool is not a number


def json_equal(left: Any, right: Any) -> bool:
    """Equality as JSON sees it: ``1 == 1.0``; ``True`` is neither ``1`` nor ``1.0``."""
    if is_number(left) and is_number(right):
        return bool(left == right)
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(json_equal(left[k], right[k]) for k in left)
    if isinstance(left, list):
        return len(left) == len(right) and all(map(json_equal, left, right))
    return bool(left == right)


def lookalike(value: Any, how: str) -> Any:
    """``value`` with every int a float (``"floats"``: JSON-equal, not the same JSON), or
    with bools and 0/1 swapped (``"bools"``: equal in Python, not as JSON)."""
    if how == "floats" and type(value) is int:
        return float(value)
    if how == "bools" and type(value) is bool:
        return int(value)
    if how == "bools" and type(value) in (int, float) and value in (0, 1):
        return bool(value)
    if isinstance(value, list):
        return [lookalike(item, how) for item in value]
    if isinstance(value, dict):
        return {name: lookalike(item, how) for name, item in value.items()}
    return value


def glob_match(pattern: str, text: str) -> bool:
    """Redis ``KEYS`` globbing (``*``, ``?``, ``[ab]``, ``[a-z]``, ``[!a]``, ``\\``)."""
    if not pattern:
        return not text
    head = pattern[0]
    if head == "*":
        return any(glob_match(pattern[1:], text[skip:]) for skip in range(len(text) + 1))
    if not text:
        return False
    if head == "?":
        return glob_match(pattern[1:], text[1:])
    if head == "[":
        end = pattern.index("]", 2)
        body, negate = pattern[1:end], pattern[1] == "!"
        members = body[1:] if negate else body
        hit, i = False, 0
        while i < len(members):
            if i + 2 < len(members) and members[i + 1] == "-":
                hit |= members[i] <= text[0] <= members[i + 2]
                i += 3
            else:
                hit |= members[i] == text[0]
                i += 1
        return hit != negate and glob_match(pattern[end + 1 :], text[1:])
    if head == "\\":
        pattern = pattern[1:]
    return text[0] == pattern[0] and glob_match(pattern[1:], text[1:])


# -- the model: update ops (SPEC section 4) ----------------------------------------------
class OpFailed(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class Doc:
    """A value during one ``update``: whether it exists, and whether it is only the {}
    a missing key started as for an op naming a field (then, left {}, nothing is made)."""

    exists: bool
    value: Any
    implicit: bool = False

    @property
    def created(self) -> bool:
        return self.exists and not (self.implicit and self.value == {})


UPDATE_KINDS = frozenset({"set", "merge", "increment", "decrement", "append", "remove"})
INDEX = re.compile(r"0|[1-9][0-9]*")


def op_path(op: dict[str, Any]) -> list[str | int]:
    path = op.get("path")
    if path is None or path in ("", []):
        return []
    return list(path.split(".")) if isinstance(path, str) else list(path)


def list_index(segment: str | int, items: list[Any]) -> int:
    """The existing index ``segment`` names in ``items``, else path_not_found."""
    if isinstance(segment, int):
        index = segment
    elif segment.isascii() and INDEX.fullmatch(segment):
        index = int(segment)
    else:
        raise OpFailed("path_not_found")
    if not 0 <= index < len(items):
        raise OpFailed("path_not_found")
    return index


def locate(root: Any, path: list[str | int], create: bool) -> tuple[Any, Any]:
    """The object or list holding the last segment of ``path``, and the slot in it.

    Missing objects on the way are made when ``create``; a missing list index is
    path_not_found; a path through a number, string, bool or null is type_mismatch.
    """
    node, last = root, len(path) - 1
    for depth, segment in enumerate(path):
        if isinstance(node, dict):
            name = str(segment)
            if depth == last:
                return node, name
            if name not in node:
                if not create:
                    raise OpFailed("path_not_found")
                node[name] = {}
            node = node[name]
        elif isinstance(node, list):
            index = list_index(segment, node)
            if depth == last:
                return node, index
            node = node[index]
        else:
            raise OpFailed("type_mismatch")
    raise AssertionError("unreachable: the path is not empty")


def check_fields(kind: str, op: dict[str, Any]) -> None:
    if kind in ("set", "append") and "value" not in op:
        raise OpFailed("invalid_op")
    if kind == "merge" and not isinstance(op.get("value"), dict):
        raise OpFailed("invalid_op")
    if kind in ("increment", "decrement") and not is_number(op.get("by", 1)):
        raise OpFailed("invalid_op")


def combine(kind: str, present: bool, current: Any, op: dict[str, Any]) -> Any:
    """The new value at the target of a merge, increment, decrement or append."""
    if kind == "merge":
        if current is None:  # missing or null: becomes the object
            return copy.deepcopy(op["value"])
        if not isinstance(current, dict):
            raise OpFailed("type_mismatch")
        return {**current, **copy.deepcopy(op["value"])}
    if kind in ("increment", "decrement"):
        number = current if present else 0
        if not is_number(number):
            raise OpFailed("type_mismatch")
        by = op.get("by", 1)
        return number + by if kind == "increment" else number - by
    item = copy.deepcopy(op["value"])  # append
    if current is None:
        return [item]
    if isinstance(current, list):
        return [*current, item]
    if isinstance(current, str) and isinstance(item, str):
        return current + item
    raise OpFailed("type_mismatch")


def apply_update_op(doc: Doc, op: dict[str, Any]) -> None:
    """Apply one update op to ``doc`` (a copy, dropped if it fails)."""
    kind = op.get("type")
    if kind not in UPDATE_KINDS:
        raise OpFailed("invalid_op")
    if kind in ("set", "increment", "decrement", "remove") and op.get("path") is None:
        raise OpFailed("invalid_op")
    path = op_path(op)
    if not path:  # the whole value
        if kind == "remove":
            doc.exists, doc.value, doc.implicit = False, None, False
            return
        check_fields(kind, op)
        if kind == "set":
            value = copy.deepcopy(op["value"])
        else:
            value = combine(kind, doc.exists, doc.value if doc.exists else None, op)
        doc.exists, doc.value, doc.implicit = True, value, False
        return
    if kind == "remove":
        try:
            container, slot = locate(doc.value, path, create=False)
        except OpFailed:
            return  # removing what is not there is not an error
        if isinstance(container, dict):
            container.pop(slot, None)
        else:
            del container[slot]
        return
    check_fields(kind, op)
    container, slot = locate(doc.value, path, create=True)
    if kind == "set":
        container[slot] = copy.deepcopy(op["value"])
        return
    present = isinstance(container, list) or slot in container
    container[slot] = combine(kind, present, container[slot] if present else None, op)


def model_update_ops(
    exists: bool, value: Any, op_list: list[dict[str, Any]]
) -> tuple[Doc, list[int], list[tuple[int, str]]]:
    """The value after the ops that apply, their indexes, and the errors of the others."""
    doc = Doc(exists, copy.deepcopy(value) if exists else None)
    applied: list[int] = []
    errors: list[tuple[int, str]] = []
    for index, op in enumerate(op_list):
        if op.get("type") in UPDATE_KINDS and op_path(op) and not doc.exists:
            doc = Doc(True, {}, implicit=True)  # a missing value starts as {} for a field op
        trial = copy.deepcopy(doc)
        try:
            apply_update_op(trial, op)
        except OpFailed as failure:
            errors.append((index, failure.code))
            continue
        doc = trial
        applied.append(index)
    return doc, applied, errors


# -- the model: JSON Patch (RFC 6902, pointers of RFC 6901) ------------------------------
class Absent(Exception):
    """A pointer names no existing location."""


def tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    return [part.replace("~1", "/").replace("~0", "~") for part in pointer.split("/")[1:]]


def resolve(doc: Any, parts: list[str]) -> Any:
    node = doc
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and INDEX.fullmatch(part) and int(part) < len(node):
            node = node[int(part)]
        else:
            raise Absent
    return node


def patch_add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent, last = resolve(doc, parts[:-1]), parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list) and last == "-":
        parent.append(value)
    elif isinstance(parent, list) and INDEX.fullmatch(last) and int(last) <= len(parent):
        parent.insert(int(last), value)
    else:
        raise Absent
    return doc


def patch_remove(doc: Any, parts: list[str]) -> Any:
    if not parts:
        raise Absent  # the whole document cannot be removed (RFC 6902 says nothing)
    resolve(doc, parts)
    parent, last = resolve(doc, parts[:-1]), parts[-1]
    del parent[int(last) if isinstance(parent, list) else last]
    return doc


def patch_replace(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    resolve(doc, parts)
    parent, last = resolve(doc, parts[:-1]), parts[-1]
    parent[int(last) if isinstance(parent, list) else last] = value
    return doc


def apply_patch_op(doc: Any, op: dict[str, Any]) -> Any:  # noqa: PLR0911 - one per op
    """One JSON Patch op on ``doc`` (a copy); the document after it."""
    kind, parts = op["op"], tokens(op["path"])
    try:
        if kind == "add":
            return patch_add(doc, parts, copy.deepcopy(op["value"]))
        if kind == "remove":
            return patch_remove(doc, parts)
        if kind == "replace":
            return patch_replace(doc, parts, copy.deepcopy(op["value"]))
        if kind == "copy":
            return patch_add(doc, parts, copy.deepcopy(resolve(doc, tokens(op["from"]))))
        if kind == "move":
            source = tokens(op["from"])
            if len(source) < len(parts) and parts[: len(source)] == source:
                raise OpFailed("invalid_op")  # into its own child (RFC 6902 4.4)
            value = resolve(doc, source)
            if source == parts:
                return doc
            return patch_add(patch_remove(doc, source), parts, value)
    except Absent:
        raise OpFailed("path_not_found") from None
    assert kind == "test"
    try:
        found = resolve(doc, parts)
    except Absent:
        raise OpFailed("test_failed") from None
    if not json_equal(found, op["value"]):
        raise OpFailed("test_failed")
    return doc


def model_patch(
    exists: bool, value: Any, patch: list[dict[str, Any]]
) -> tuple[Doc, list[int], list[tuple[int, str]]]:
    """A patch is all or nothing: the first op that fails is the one error."""
    doc = Doc(exists, copy.deepcopy(value) if exists else None)
    for index, op in enumerate(patch):
        if op["path"] != "" and not doc.exists:
            doc = Doc(True, {}, implicit=True)
        try:
            doc.value = apply_patch_op(doc.value, op)
        except OpFailed as failure:
            return doc, list(range(index)), [(index, failure.code)]
        if op["path"] == "" and op["op"] in ("add", "replace", "copy", "move"):
            doc.exists, doc.implicit = True, False  # the op wrote the whole value
    return doc, list(range(len(patch))), []


# -- the model: a scope ------------------------------------------------------------------
Entry = tuple[Any, float | None]  # value, deadline


class ModelScope:
    """The keys of one scope: value and deadline (None: no expiry)."""

    def __init__(self, entries: dict[str, Entry] | None = None) -> None:
        self.entries: dict[str, Entry] = entries or {}

    def copy(self) -> ModelScope:
        return ModelScope(copy.deepcopy(self.entries))

    def row(self, key: str, now: float) -> Entry | None:
        """The live entry of ``key``: from its deadline on, a key is absent."""
        entry = self.entries.get(key)
        if entry is not None and entry[1] is not None and entry[1] <= now:
            event("a key reached its deadline")
            del self.entries[key]
            return None
        return entry

    def value(self, key: str, now: float, default: Any = None) -> Any:
        entry = self.row(key, now)
        return default if entry is None else entry[0]

    def live(self, now: float) -> dict[str, Any]:
        return {key: entry[0] for key in sorted(self.entries) if (entry := self.row(key, now))}

    def put(self, key: str, value: Any, deadline: float | None) -> None:
        self.entries[key] = (copy.deepcopy(value), deadline)


@dataclass(frozen=True)
class Current:
    """Stands, in a drawn argument, for the value the model holds there now, as it is
    or a ``lookalike`` of it: a compare_and_swap or a patch ``test`` that can succeed,
    or fail only because JSON's equality is not Python's."""

    how: str


@dataclass
class Lease:
    owner: str | None
    token: int
    deadline: float | None


class Boom(Exception):
    """Raised by a transaction body that must apply nothing."""


# -- strategies --------------------------------------------------------------------------
SCOPE = st.sampled_from(SCOPES)
KEY = st.sampled_from(KEYS)
NAMES = st.sampled_from(["a", "b", "l"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-2, 3)
    | st.sampled_from([0.5, 1.0, -1.5, 2.0])
    | st.sampled_from(["", "a", "bc"])
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=5,
)
OBJECTS = st.dictionaries(NAMES, VALUES, max_size=2)
TTLS = st.sampled_from([None, None, None, 0.5, 1, 2, 5.0, 10, 0, -1])
SECONDS = st.sampled_from([None, None, -1, 0, 0.5, 1, 2.5, 5, 10, 30])
BYS = st.sampled_from([1, 1, -1, 2, 0.5, -1.5, True])
TEXTS = st.sampled_from(["", "a", "xy", "é", 5])
HOLDERS = st.sampled_from([0, 1, "the holder"])
CURRENT = st.builds(Current, st.sampled_from(["as is", "floats", "bools"]))

STATIC_PATHS: list[Any] = [
    "a",
    "b",
    "a.b",
    "l",
    "l.0",
    "l.1",
    "0",
    "a.0",
    ["l", 0],
    ["a.b"],
    ["l", 1, "a"],
]
STATIC_POINTERS = ["", "/a", "/b", "/a/b", "/l", "/l/0", "/l/1", "/l/-", "/0", "/-", "/a/0"]
ROOTS = st.sampled_from(["", []])
OP_BY = st.sampled_from([1, -1, 2, 0.5, -1.5])
BAD_UPDATE_OPS = st.sampled_from(
    [
        {"type": "bogus"},
        {"type": "increment", "path": "a", "by": "x"},
        {"type": "increment", "path": "b", "by": True},
        {"type": "merge", "path": "a", "value": 5},
        {"type": "merge", "value": [1]},
        {"type": "set", "path": "b"},
        {"type": "append", "path": "l"},
    ]
)


def locations(value: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every location inside ``value`` (its root excluded), as segments."""
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return []
    found: list[tuple[str | int, ...]] = []
    for name, item in items:
        found.append((*prefix, name))
        found.extend(locations(item, (*prefix, name)))
    return found


def pointer(segments: tuple[str | int, ...]) -> str:
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in segments)


def update_op_strategy(value: Any) -> st.SearchStrategy[dict[str, Any]]:
    """Update ops on paths of a few fixed shapes and of what ``value`` holds."""
    derived: list[Any] = []
    for place in locations(value):
        if all(isinstance(part, str) and "." not in part and part for part in place):
            derived.append(".".join(str(part) for part in place))
        derived.append(list(place))
    return _update_ops(json.dumps(derived))


@functools.lru_cache(maxsize=1024)
def _update_ops(derived_json: str) -> st.SearchStrategy[dict[str, Any]]:
    derived = json.loads(derived_json)
    paths = st.sampled_from(STATIC_PATHS)
    if derived:
        paths = st.sampled_from(derived) | paths
    return st.one_of(
        st.builds(ops.set, paths | ROOTS, VALUES),
        st.builds(ops.merge, OBJECTS, st.none() | paths | ROOTS),
        st.builds(ops.increment, paths | ROOTS, OP_BY),
        st.builds(ops.decrement, paths | ROOTS, OP_BY),
        st.builds(ops.append, VALUES, st.none() | paths | ROOTS),
        st.builds(ops.remove, paths | ROOTS),
        BAD_UPDATE_OPS,
    )


def patch_op_strategy(value: Any) -> st.SearchStrategy[dict[str, Any]]:
    """JSON Patch ops on pointers of a few fixed shapes (a third of the time) or of what
    ``value`` holds: its locations, the end of its lists, a new member of its objects."""
    places = [(), *locations(value)]
    new = []
    for place in places:
        node = resolve(value, [str(part) for part in place])
        if isinstance(node, list):
            new.append(pointer((*place, "-")))
        elif isinstance(node, dict):
            new.append(pointer((*place, "new")))
    return _patch_ops(tuple(map(pointer, places)), tuple(new))


@functools.lru_cache(maxsize=1024)
def _patch_ops(here: tuple[str, ...], new: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    static = st.sampled_from(STATIC_POINTERS)
    existing = st.one_of(st.sampled_from(here), st.sampled_from(here), static)
    targets = st.one_of(st.sampled_from(here + new), st.sampled_from(here + new), static)
    froms = st.one_of(st.sampled_from(here), st.sampled_from(new or here), static)
    return st.one_of(
        st.fixed_dictionaries({"op": st.just("add"), "path": targets, "value": VALUES}),
        st.fixed_dictionaries({"op": st.just("remove"), "path": existing}),
        st.fixed_dictionaries({"op": st.just("replace"), "path": existing, "value": VALUES}),
        st.fixed_dictionaries({"op": st.just("move"), "from": froms, "path": targets}),
        st.fixed_dictionaries({"op": st.just("copy"), "from": froms, "path": targets}),
        st.fixed_dictionaries(
            {
                "op": st.just("test"),
                "path": existing,
                "value": CURRENT | VALUES,
            }
        ),
    )


UPDATE_OP = update_op_strategy(None)
TX_OP = st.one_of(
    st.tuples(st.just("set"), KEY, VALUES, TTLS, st.booleans()),
    st.tuples(st.just("delete"), KEY),
    st.tuples(st.just("increment"), KEY, BYS, st.just(0), st.booleans()),
    st.tuples(st.just("append"), KEY, TEXTS),
    st.tuples(st.just("push"), KEY, st.lists(VALUES, max_size=2)),
    st.tuples(st.just("pop"), KEY, st.booleans()),
    st.tuples(st.just("expire"), KEY, SECONDS),
    st.tuples(st.just("update"), KEY, st.lists(UPDATE_OP, max_size=3), st.just(None)),
    st.tuples(st.just("set_many"), st.dictionaries(KEY, VALUES, max_size=2), TTLS),
    st.tuples(st.just("clear"), st.sampled_from(PATTERNS)),
    st.tuples(st.just("compare_and_swap"), KEY, CURRENT | VALUES, VALUES | st.just(MISSING)),
)


def _invalid_calls() -> dict[str, tuple[type[Exception], Callable[[Any, Any], Any]]]:
    """Calls that must raise this typed error and change nothing: (state, scope) -> call."""
    patch_add = {"op": "add", "path": "/a", "value": 1}
    return {
        "empty key": (reactor.InvalidKeyError, lambda _, h: h.set("", 1)),
        "int key": (reactor.InvalidKeyError, lambda _, h: h.get(5)),
        "long key": (reactor.InvalidKeyError, lambda _, h: h.set("k" * 1025, 1)),
        "empty scope name": (reactor.InvalidKeyError, lambda state, _: state.scope("")),
        "nan": (reactor.InvalidValueError, lambda _, h: h.set("k1", [1, float("nan")])),
        "tuple": (reactor.InvalidValueError, lambda _, h: h.set("k1", (1, 2))),
        "int dict key": (reactor.InvalidValueError, lambda _, h: h.set("k1", {1: 2})),
        "nan in set_many": (
            reactor.InvalidValueError,
            lambda _, h: h.set_many({"k1": 1, "k2": float("inf")}),
        ),
        "ttl str": (reactor.InvalidArgumentError, lambda _, h: h.set("k1", 1, ttl="10")),
        "ttl bool": (reactor.InvalidArgumentError, lambda _, h: h.set("k1", 1, ttl=True)),
        "expire nan": (reactor.InvalidArgumentError, lambda _, h: h.expire("k1", float("nan"))),
        "default bool": (reactor.TypeMismatchError, lambda _, h: h.increment("k1", default=True)),
        "get_many str": (reactor.InvalidArgumentError, lambda _, h: h.get_many("k1")),
        "ops mixed": (
            reactor.InvalidOpError,
            lambda _, h: h.update("k1", [ops.set("a", 1), patch_add]),
        ),
        "ops not a list": (reactor.InvalidOpError, lambda _, h: h.update("k1", ops.set("a", 1))),
        "patch not atomic": (
            reactor.InvalidArgumentError,
            lambda _, h: h.update("k1", [patch_add], atomic=False),
        ),
        "nan in an op": (
            reactor.InvalidValueError,
            lambda _, h: h.update("k1", [ops.set("a", float("nan"))]),
        ),
        "lock ttl 0": (reactor.InvalidArgumentError, lambda state, _: state.lock("L", ttl=0)),
        "lock name": (reactor.InvalidKeyError, lambda state, _: state.lock("", ttl=1)),
    }


INVALID_CALLS = _invalid_calls()
_examples = itertools.count()


# -- the machine -------------------------------------------------------------------------
class Closer:
    """Closes the engine of each finished example, and removes its SQLite file.

    Closing takes some 30 ms (threads to stop, the WAL to checkpoint): on SQLite, where
    each example has a file of its own, it runs in the background while the next
    example starts; ``finish`` waits for them all and raises what any close raised.
    """

    def __init__(self, background: bool) -> None:
        self.background = background
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def close(self, state: reactor.State, folder: str | None) -> None:
        def run() -> None:
            try:
                state.close()
            except BaseException as exc:
                self.errors.append(exc)
            finally:
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)

        if not self.background:
            run()
            return
        self.threads = [thread for thread in self.threads if thread.is_alive()]
        thread = threading.Thread(target=run, name="reactor-model-close", daemon=True)
        thread.start()
        self.threads.append(thread)

    def finish(self) -> None:
        for thread in self.threads:
            thread.join()
        if self.errors:
            raise self.errors[0]


class ReactorMachine(RuleBasedStateMachine):
    """reactor on a real database, step by step against the model.

    A campaign runs a subclass that sets ``shared_url`` (PostgreSQL: the test's
    database; None: a new SQLite file per example) and ``closer``.
    """

    shared_url: str | None = None
    closer: Closer

    def __init__(self) -> None:
        super().__init__()
        number = next(_examples)
        self.folder: str | None = None
        if self.shared_url is None:
            self.folder = tempfile.mkdtemp(prefix="reactor-model-")
            self.target: Any = os.path.join(self.folder, "state.db")
        else:
            self.target = self.shared_url
        self.prefix = f"m{number}-"
        self.clock = FakeClock(START + 1_000_000.0 * number)
        self.now = self.clock.now
        self.state = reactor.open(self.target, clock=self.clock)
        self.handles: dict[str, reactor.Scope] = {}
        self.model = {name: ModelScope() for name in SCOPES}
        self.revision = 0
        # locks: the table, the Lock objects of this handle, and their tokens
        self.leases: dict[str, Lease] = {}
        self.last_token: dict[str, int] = {}
        self.generation = 0
        self.lock_objects: dict[tuple[str, int], reactor.Lock] = {}
        self.holder_tokens: dict[tuple[str, int], int | None] = {}
        for name in SCOPES:
            assert self.handle(name).list() == {}

    def teardown(self) -> None:
        self.closer.close(self.state, self.folder)

    # -- helpers -------------------------------------------------------------------------
    def real_name(self, name: str) -> str:
        return self.prefix + name

    def handle(self, name: str) -> reactor.Scope:
        if name not in self.handles:
            self.handles[name] = self.state.scope(self.real_name(name))
        return self.handles[name]

    def check(self, real: Callable[[], Any], model: Callable[[], Any]) -> None:
        """Run the model (which changes itself only if it succeeds), then reactor; the
        same answer as canonical JSON, or the same typed error."""
        try:
            want = model()
        except Predicted as predicted:
            event(f"predicted {predicted.error.__name__}")
            with pytest.raises(predicted.error):
                real()
            return
        got = real()
        assert canon(got) == canon(want), f"reactor: {got!r}; model: {want!r}"

    def ttl_of(self, m: ModelScope, key: str) -> float:
        entry = m.row(key, self.now)
        return -2.0 if entry is None else -1.0 if entry[1] is None else entry[1] - self.now

    def resolve_current(self, marker: Any, value: Any) -> Any:
        if not isinstance(marker, Current):
            return marker
        return lookalike(copy.deepcopy(value), marker.how)

    # -- writes, shared by the rules and the transaction body ----------------------------
    def do_set(self, h: Any, m: ModelScope, key: str, value: Any, ttl: Any, keep_ttl: bool) -> None:
        def model() -> Any:
            if ttl is not None and not (is_number(ttl) and ttl > 0):
                raise Predicted(reactor.InvalidArgumentError)
            old = m.row(key, self.now)
            if ttl is not None:
                deadline = self.now + ttl
            else:
                deadline = old[1] if keep_ttl and old is not None else None
            m.put(key, value, deadline)
            return (None if old is None else old[0], value)

        self.check(lambda: h.set(key, value, ttl=ttl, keep_ttl=keep_ttl), model)

    def do_set_many(self, h: Any, m: ModelScope, mapping: dict[str, Any], ttl: Any) -> None:
        def model() -> Any:
            if ttl is not None and not (is_number(ttl) and ttl > 0):
                raise Predicted(reactor.InvalidArgumentError)  # even with nothing to set
            changes = {}
            for key, value in mapping.items():
                changes[key] = (m.value(key, self.now), value)
                m.put(key, value, None if ttl is None else self.now + ttl)
            return changes

        self.check(lambda: h.set_many(mapping, ttl=ttl), model)

    def do_clear(self, h: Any, m: ModelScope, pattern: str) -> None:
        def model() -> Any:
            if not pattern:
                raise Predicted(reactor.InvalidKeyError)
            gone = [key for key in m.live(self.now) if glob_match(pattern, key)]
            for key in gone:
                del m.entries[key]
            return len(gone)

        self.check(lambda: h.clear(pattern), model)

    def do_compare_and_swap(self, h: Any, m: ModelScope, key: str, expected: Any, new: Any) -> None:
        expected = self.resolve_current(expected, m.value(key, self.now))

        def model() -> Any:
            old = m.row(key, self.now)
            if expected is MISSING:
                matches = old is None
            else:
                matches = old is not None and json_equal(old[0], expected)
            event(f"compare_and_swap: {'swaps' if matches else 'does not swap'}")
            if not matches:
                return False
            if new is MISSING:
                m.entries.pop(key, None)
            else:
                m.put(key, new, None if old is None else old[1])  # keeps the expiry
            return True

        self.check(lambda: h.compare_and_swap(key, expected, new), model)

    def do_delete(self, h: Any, m: ModelScope, key: str) -> None:
        def model() -> Any:
            old = m.row(key, self.now)
            m.entries.pop(key, None)
            return None if old is None else old[0]

        self.check(lambda: h.delete(key), model)

    def do_increment(
        self, h: Any, m: ModelScope, key: str, by: Any, default: Any, down: bool
    ) -> None:
        def model() -> Any:
            if not (is_number(by) and is_number(default)):
                raise Predicted(reactor.TypeMismatchError)
            old = m.row(key, self.now)
            current = default if old is None else old[0]
            if not is_number(current):
                raise Predicted(reactor.TypeMismatchError)
            result = current - by if down else current + by
            m.put(key, result, None if old is None else old[1])
            return result

        verb = h.decrement if down else h.increment
        self.check(lambda: verb(key, by, default=default), model)

    def do_append(self, h: Any, m: ModelScope, key: str, text: Any) -> None:
        def model() -> Any:
            if type(text) is not str:
                raise Predicted(reactor.TypeMismatchError)
            old = m.row(key, self.now)
            current = "" if old is None else old[0]
            if type(current) is not str:
                raise Predicted(reactor.TypeMismatchError)
            m.put(key, current + text, None if old is None else old[1])
            return len(current + text)

        self.check(lambda: h.append(key, text), model)

    def do_push(self, h: Any, m: ModelScope, key: str, items: list[Any]) -> None:
        def model() -> Any:
            old = m.row(key, self.now)
            current = [] if old is None else old[0]
            if type(current) is not list:
                raise Predicted(reactor.TypeMismatchError)
            if items:  # pushing nothing writes nothing (and makes no key)
                m.put(key, [*current, *items], None if old is None else old[1])
            return len(current) + len(items)

        self.check(lambda: h.push(key, *items), model)

    def do_pop(self, h: Any, m: ModelScope, key: str, front: bool) -> None:
        def model() -> Any:
            old = m.row(key, self.now)
            if old is None:
                return None
            if type(old[0]) is not list:
                raise Predicted(reactor.TypeMismatchError)
            if not old[0]:
                return None  # the empty list stays
            items = copy.deepcopy(old[0])
            item = items.pop(0 if front else -1)
            m.put(key, items, old[1])
            return item

        self.check(lambda: h.pop(key, front=front), model)

    def do_expire(self, h: Any, m: ModelScope, key: str, seconds: Any) -> None:
        def model() -> Any:
            old = m.row(key, self.now)
            if old is None:
                return False
            if seconds is not None and seconds <= 0:
                del m.entries[key]
            else:
                m.put(key, old[0], None if seconds is None else self.now + seconds)
            return True

        self.check(lambda: h.expire(key, seconds), model)

    def do_update(
        self, h: Any, m: ModelScope, key: str, op_list: list[dict[str, Any]], atomic: Any
    ) -> None:
        patch = bool(op_list) and "op" in op_list[0]
        old = m.row(key, self.now)
        old_value = None if old is None else old[0]
        if patch:
            op_list = [
                {**op, "value": self.resolve_current(op["value"], self.value_at(old, op))}
                if op["op"] == "test"
                else op
                for op in op_list
            ]
            doc, applied, errors = model_patch(old is not None, old_value, op_list)
        else:
            doc, applied, errors = model_update_ops(old is not None, old_value, op_list)
        if not applied or (errors and (patch or atomic)):
            write, new = "nothing", old_value
        elif not doc.created:
            write, new = "delete", None
        else:
            write, new = "put", doc.value
            if len(canon(new)) > MAX_DOC:
                return  # copies of copies: keep the values small
        event(f"{'patch' if patch else 'update ops'}: {write}, {len(errors)} error(s)")
        for _, code in errors:
            event(f"{'patch' if patch else 'update ops'} error: {code}")
        result = h.update(key, op_list, atomic=atomic)
        assert isinstance(result, reactor.UpdateResult)
        assert canon(result.old_value) == canon(old_value)
        assert canon(result.new_value) == canon(new), f"{result.new_value!r} != {new!r}"
        assert [(e["index"], e["code"]) for e in result.errors] == errors, result.errors
        for error in result.errors:
            assert canon(error["op"]) == canon(op_list[error["index"]])
            assert isinstance(error["message"], str)
            assert error["message"]
        if write == "delete":
            m.entries.pop(key, None)
        elif write == "put":
            m.put(key, new, None if old is None else old[1])

    def value_at(self, old: Entry | None, op: dict[str, Any]) -> Any:
        """The value a patch ``test`` names in the current value (None if absent)."""
        try:
            return resolve(None if old is None else old[0], tokens(op["path"]))
        except Absent:
            return None

    # -- rules: writes -------------------------------------------------------------------
    # Hypothesis draws the first of its rules (those with the fewest arguments first,
    # then by name) two or three times as often as the others: ``set``, taking its
    # arguments as one tuple, is that rule, so that the scopes hold something.
    @rule(call=st.tuples(SCOPE, KEY, VALUES, TTLS, st.booleans()))
    def set(self, call: tuple[str, str, Any, Any, bool]) -> None:
        scope, key, value, ttl, keep_ttl = call
        self.do_set(self.handle(scope), self.model[scope], key, value, ttl, keep_ttl)

    @rule(
        scope=SCOPE,
        mapping=st.dictionaries(KEY, VALUES, max_size=3),
        ttl=st.sampled_from([None, 1, 5]),
    )
    def set_many(self, scope: str, mapping: dict[str, Any], ttl: Any) -> None:
        self.do_set_many(self.handle(scope), self.model[scope], mapping, ttl)

    @rule(scope=SCOPE, key=KEY)
    def delete(self, scope: str, key: str) -> None:
        self.do_delete(self.handle(scope), self.model[scope], key)

    @rule(scope=SCOPE, pattern=st.sampled_from(PATTERNS))
    def clear(self, scope: str, pattern: str) -> None:
        self.do_clear(self.handle(scope), self.model[scope], pattern)

    @rule(
        scope=SCOPE,
        key=KEY,
        by=BYS,
        default=st.sampled_from([0, 0, 10, 2.5]),
        down=st.booleans(),
    )
    def increment(self, scope: str, key: str, by: Any, default: Any, down: bool) -> None:
        self.do_increment(self.handle(scope), self.model[scope], key, by, default, down)

    @rule(scope=SCOPE, key=KEY, text=TEXTS)
    def append(self, scope: str, key: str, text: Any) -> None:
        self.do_append(self.handle(scope), self.model[scope], key, text)

    @rule(
        scope=SCOPE,
        key=KEY,
        expected=st.just(MISSING) | CURRENT | VALUES,
        new=st.one_of(VALUES, VALUES, st.just(MISSING)),
    )
    def compare_and_swap(self, scope: str, key: str, expected: Any, new: Any) -> None:
        self.do_compare_and_swap(self.handle(scope), self.model[scope], key, expected, new)

    @rule(scope=SCOPE, key=KEY, items=st.lists(VALUES, max_size=3))
    def push(self, scope: str, key: str, items: list[Any]) -> None:
        self.do_push(self.handle(scope), self.model[scope], key, items)

    @rule(scope=SCOPE, key=KEY, front=st.booleans())
    def pop(self, scope: str, key: str, front: bool) -> None:
        self.do_pop(self.handle(scope), self.model[scope], key, front)

    # The ops of these two are drawn knowing the value, so that their paths often name
    # what is there (then ops apply, and fail further in).
    @rule(scope=SCOPE, key=KEY, atomic=st.sampled_from([None, False, True]), data=st.data())
    def update_ops(self, scope: str, key: str, atomic: Any, data: st.DataObject) -> None:
        m = self.model[scope]
        strategy = update_op_strategy(m.value(key, self.now))
        op_list = data.draw(st.lists(strategy, max_size=4), label="ops")
        self.do_update(self.handle(scope), m, key, op_list, atomic)

    @rule(scope=SCOPE, key=KEY, atomic=st.sampled_from([None, True]), data=st.data())
    def json_patch(self, scope: str, key: str, atomic: Any, data: st.DataObject) -> None:
        m = self.model[scope]
        strategy = patch_op_strategy(m.value(key, self.now))
        patch = data.draw(st.lists(strategy, min_size=1, max_size=3), label="patch")
        self.do_update(self.handle(scope), m, key, patch, atomic)

    @rule(scope=SCOPE, key=KEY, seconds=SECONDS)
    def expire(self, scope: str, key: str, seconds: Any) -> None:
        self.do_expire(self.handle(scope), self.model[scope], key, seconds)

    @rule(seconds=st.sampled_from([0.5, 1, 2, 5]), scope=SCOPE)
    def advance_clock(self, seconds: float, scope: str) -> None:
        self.clock.advance(seconds)
        self.now += seconds
        assert self.clock.time() == self.now
        assert self.handle(scope).keys() == list(self.model[scope].live(self.now))

    # -- rules: reads --------------------------------------------------------------------
    @rule(scope=SCOPE, key=KEY)
    def get(self, scope: str, key: str) -> None:
        h, m = self.handle(scope), self.model[scope]
        self.check(lambda: h.get(key, DEFAULT), lambda: m.value(key, self.now, DEFAULT))
        self.check(lambda: h.exists(key), lambda: m.row(key, self.now) is not None)

    @rule(scope=SCOPE, keys=st.lists(KEY, max_size=5))
    def get_many(self, scope: str, keys: list[str]) -> None:
        m = self.model[scope]
        want = {key: entry[0] for key in keys if (entry := m.row(key, self.now))}
        got = self.handle(scope).get_many(keys)
        assert canon(got) == canon(want)
        assert list(got) == list(want)  # in the order asked

    @rule(scope=SCOPE, pattern=st.sampled_from(PATTERNS))
    def keys(self, scope: str, pattern: str) -> None:
        m = self.model[scope]

        def model() -> Any:
            if not pattern:
                raise Predicted(reactor.InvalidKeyError)
            return sorted(key for key in m.live(self.now) if glob_match(pattern, key))

        def real() -> Any:
            got = self.handle(scope).keys(pattern)
            assert type(got) is list
            return got

        self.check(real, model)

    @rule(scope=SCOPE, key=KEY)
    def length(self, scope: str, key: str) -> None:
        m = self.model[scope]

        def model() -> Any:
            value = m.value(key, self.now, [])
            if type(value) is not list:
                raise Predicted(reactor.TypeMismatchError)
            return len(value)

        self.check(lambda: self.handle(scope).length(key), model)

    @rule(scope=SCOPE)
    def snapshot(self, scope: str) -> None:
        snap = self.handle(scope).snapshot()
        assert canon(snap.values) == canon(self.model[scope].live(self.now))
        assert self.revision <= snap.revision <= self.state.stats()["revision"]

    # -- rules: transactions -------------------------------------------------------------
    @rule(
        scope=SCOPE,
        body=st.lists(TX_OP, min_size=1, max_size=4),
        fail=st.booleans(),
        elsewhere=st.none() | VALUES,
    )
    def transaction(
        self, scope: str, body: list[tuple[Any, ...]], fail: bool, elsewhere: Any
    ) -> None:
        h = self.handle(scope)
        other = SCOPES[1] if scope == SCOPES[0] else SCOPES[0]
        working = self.model[scope].copy()

        def run(tx: reactor.Transaction) -> None:
            for kind, *args in body:
                getattr(self, f"do_{kind}")(tx, working, *args)
                assert canon(tx.list()) == canon(working.live(self.now))  # its own writes
            with pytest.raises(reactor.ReentrancyError):
                h.get(KEYS[0])
            if elsewhere is not None:  # another scope: not part of the transaction
                self.do_set(self.handle(other), self.model[other], KEYS[0], elsewhere, None, False)
            for key in KEYS:
                assert canon(tx.get(key, DEFAULT)) == canon(working.value(key, self.now, DEFAULT))
                assert canon(tx.ttl(key)) == canon(self.ttl_of(working, key))

        if fail:
            with pytest.raises(Boom), h.transaction() as tx:
                run(tx)
                raise Boom
        else:
            with h.transaction() as tx:
                run(tx)
            self.model[scope] = working

    # -- rules: locks --------------------------------------------------------------------
    def lock(self, name: str, holder: int) -> reactor.Lock:
        if (name, holder) not in self.lock_objects:
            lock = self.state.lock(self.real_name(name), ttl=HOLDER_TTLS[holder])
            self.lock_objects[name, holder] = lock
            self.holder_tokens[name, holder] = None
        return self.lock_objects[name, holder]

    def owner(self, holder: int) -> str:
        return f"{self.generation}/{holder}"

    def who(self, name: str, holder: int | str) -> int:
        """``holder``, or for "the holder" the one of ours holding ``name`` (else 0)."""
        if isinstance(holder, int):
            return holder
        return next((i for i in (0, 1) if self.holder_of(name) == self.owner(i)), 0)

    def holder_of(self, name: str) -> str | None:
        lease = self.leases.get(name)
        if lease is None or lease.owner is None or lease.deadline is None:
            return None
        return lease.owner if lease.deadline > self.now else None

    @rule(name=st.sampled_from(LOCKS), holder=HOLDERS)
    def acquire(self, name: str, holder: int | str) -> None:
        holder = self.who(name, holder)
        lock = self.lock(name, holder)
        current = self.holder_of(name)
        event(f"acquire: {'mine' if current == self.owner(holder) else current and 'taken'}")
        if current == self.owner(holder):
            with pytest.raises(reactor.ReentrancyError):
                lock.acquire(blocking=False)
            return
        if current is not None:
            assert lock.acquire(blocking=False) is False
            self.holder_tokens[name, holder] = None
            return
        lease = self.leases.get(name)
        token = 1 if lease is None else lease.token + 1
        assert lock.acquire(blocking=False) is True
        assert lock.token == token
        assert token > self.last_token.get(name, 0)  # fencing tokens strictly increase
        self.last_token[name] = token
        self.leases[name] = Lease(self.owner(holder), token, self.now + HOLDER_TTLS[holder])
        self.holder_tokens[name, holder] = token

    @rule(name=st.sampled_from(LOCKS), holder=HOLDERS)
    def release(self, name: str, holder: int | str) -> None:
        holder = self.who(name, holder)
        lock = self.lock(name, holder)
        self.holder_tokens[name, holder] = None
        event(f"release: {'mine' if self.holder_of(name) == self.owner(holder) else 'not mine'}")
        if self.holder_of(name) != self.owner(holder):
            with pytest.raises(reactor.LockNotOwnedError):
                lock.release()
            return
        lock.release()
        self.leases[name] = Lease(None, self.leases[name].token, None)

    @rule(
        name=st.sampled_from(LOCKS),
        holder=HOLDERS,
        ttl=st.sampled_from([None, 1, 12.5]),
    )
    def extend(self, name: str, holder: int | str, ttl: Any) -> None:
        holder = self.who(name, holder)
        lock = self.lock(name, holder)
        if self.holder_of(name) != self.owner(holder):
            with pytest.raises(reactor.LockNotOwnedError):
                lock.extend(ttl)
            return
        lock.extend(ttl)
        self.leases[name].deadline = self.now + (HOLDER_TTLS[holder] if ttl is None else ttl)

    # -- rules: errors, closing ----------------------------------------------------------
    @rule(scope=SCOPE, case=st.sampled_from(sorted(INVALID_CALLS)))
    def invalid_call(self, scope: str, case: str) -> None:
        error, call = INVALID_CALLS[case]
        with pytest.raises(error):
            call(self.state, self.handle(scope))

    # (Its arguments also keep it from the head of hypothesis' rule list, which rules
    # without arguments take and which is drawn far more often than the rest.)
    @rule(scope=SCOPE, key=KEY)
    def close_and_reopen(self, scope: str, key: str) -> None:
        handle = self.handle(scope)
        locks = list(self.lock_objects.values())
        self.state.close()
        with pytest.raises(reactor.ClosedError):
            handle.get(key)
        for lock in locks[:1]:
            with pytest.raises(reactor.ClosedError):
                lock.held()
        self.state = reactor.open(self.target, clock=self.clock)
        # The leases stay in the database, held by holders this handle cannot name.
        self.handles.clear()
        self.lock_objects.clear()
        self.holder_tokens.clear()
        self.generation += 1

    # -- invariants ----------------------------------------------------------------------
    @invariant()
    def the_database_matches_the_model(self) -> None:
        stats = self.state.stats()
        assert stats["revision"] >= self.revision, "the revision went back"
        self.revision = stats["revision"]
        live = {name: self.model[name].live(self.now) for name in SCOPES}
        for name in SCOPES:
            h, m = self.handle(name), self.model[name]
            got = h.list()
            assert canon(got) == canon(live[name]), f"{name}: {got!r} != {live[name]!r}"
            assert list(got) == sorted(live[name])
            # ttl() of each live key, and of one absent key (-2): list() showed the rest.
            absent = [key for key in KEYS if key not in live[name]]
            for key in [*live[name], *absent[:1]]:
                assert canon(h.ttl(key)) == canon(self.ttl_of(m, key)), (name, key)
        ours = {self.real_name(name): name for name in SCOPES}
        counts = {ours[scope]: n for scope, n in stats["scopes"].items() if scope in ours}
        assert counts == {name: len(values) for name, values in live.items() if values}
        listed = [scope for scope in self.state.scopes() if scope in ours]
        assert listed == sorted(self.real_name(name) for name, values in live.items() if values)
        held = [name for name in LOCKS if self.holder_of(name) is not None]
        assert stats["locks_held"] == len(held)
        for (name, holder), lock in self.lock_objects.items():
            assert lock.held() == (self.holder_of(name) == self.owner(holder)), (name, holder)
            assert lock.token == self.holder_tokens[name, holder], (name, holder)


# -- the tests ---------------------------------------------------------------------------
def _postgresql(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("backend") == "postgresql")


def _campaign(request: pytest.FixtureRequest, db_path: Any, sqlite: int, postgresql: int) -> None:
    shared = str(db_path) if _postgresql(request) else None
    examples = int(
        os.environ.get("REACTOR_MODEL_EXAMPLES", postgresql if shared is not None else sqlite)
    )
    closer = Closer(background=shared is None)
    machine = type("ReactorMachine", (ReactorMachine,), {"shared_url": shared, "closer": closer})
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=STEPS,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
                print_blob=True,
            ),
        )
    finally:
        closer.finish()


@pytest.mark.timeout(600)
def test_reactor_matches_the_model(request: pytest.FixtureRequest, db_path: Any) -> None:
    _campaign(request, db_path, sqlite=200, postgresql=50)


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_reactor_matches_the_model_long_campaign(
    request: pytest.FixtureRequest, db_path: Any
) -> None:
    if "slow" not in request.config.getoption("markexpr"):
        pytest.skip("a long campaign: run it with -m slow")
    _campaign(request, db_path, sqlite=2000, postgresql=500)


# -- what the machine found, each as its smallest case -----------------------------------
@pytest.mark.parametrize(
    ("document", "patch"),
    [
        pytest.param([1, 2], [{"op": "copy", "from": "/-", "path": "/0"}], id="root array"),
        pytest.param({"l": [1]}, [{"op": "copy", "from": "/l/-", "path": "/m"}], id="member"),
    ],
)
def test_a_patch_copying_from_the_end_of_an_array_is_path_not_found(
    state: reactor.State, document: Any, patch: list[dict[str, Any]]
) -> None:
    """RFC 6901: ``-`` names the element after the last one, which does not exist; a
    ``copy`` from it has nothing to copy and fails as path_not_found, as a ``move`` from
    it does. Found by the machine (``copy`` from ``/-`` of ``[]``): ``update`` raised a
    bare ``TypeError: Type is not JSON serializable: EndOfList`` instead."""
    scope = state.scope("patches")
    scope.set("doc", document)
    result = scope.update("doc", patch)
    assert [(e["index"], e["code"]) for e in result.errors] == [(0, "path_not_found")]
    assert result.new_value == document
    assert scope.get("doc") == document
