"""Model-based testing: every verb of the SPEC against a plain-Python model of it.

A hypothesis ``RuleBasedStateMachine`` drives a real engine (``reactor.open`` on a real
database, with a fake clock) and, step by step, a model written here from the SPEC
alone: ``{scope: {key: (value, deadline or None)}}`` with each key's history (its
records: type, old and new value, version, time, timer), the clock's time, the lock
table (holder, fencing token, deadline per name), the pending timers, and the jobs of
a work queue (state, ready time or lease end, attempts, idempotency key, taker). Each
rule calls one verb on both and compares the answers as canonical JSON, so that ``1``,
``1.0`` and ``True`` differ; where the model predicts an error, reactor must raise that
typed error, and the invariants then show that nothing changed.

Rules: set (ttl, keep_ttl, a bad ttl), set_many, get, get_many, exists, keys(pattern),
list and snapshot, delete, clear(pattern), increment and decrement (int and float,
non-numbers and bools refused), append, compare_and_swap (``MISSING`` both ways, JSON
equality), push, pop, length, update with update ops (atomic or not) and with a JSON
Patch, expire (and ``None``), advancing the clock (by a step, or exactly to the next
deadline), locks (try-acquire, release, extend, leases running out, fencing tokens), a
transaction (committed, or a body that raises; it also schedules and cancels timers
and enqueues jobs, with its commit), invalid arguments, and closing and reopening the
database. SPEC section 13:

- versions: ``entry()`` (value, version, expires_at; its revisions against those it
  showed before: a write that changes no stored text moves neither); writes with
  ``if_revision=`` (the revision just read, one read earlier, a stale one, 0) on every
  single-key verb, in a transaction body too, and on set_many and clear (a snapshot's
  revision, now or earlier, or 0);
- history: ``history(key)`` (with ``since`` and ``limit``) record by record, its
  revisions against ``entry()``'s, and ``get(key, at_revision=R)`` at revisions of the
  key's records and of another key's (a deadline passed by then: absent);
- timers: ``schedule`` (a value, update ops or a JSON Patch; ``after``, ``at`` or one
  period; ``every``), ``cancel_timer`` (``ReentrancyError`` in a body holding its
  scope), ``timers(scope=)``; the clock fires what is due, each once, in order of due
  time, a recurring one once per advance and then at its next period after now (two
  timers of one key are never due at the same time: those fire in the order of their
  random ids, and the model's draws would differ from one run of an example to the
  next);
- the queue: put (delay, idempotency key), take (``timeout=0``, a lease), ack, nack
  (delay), extend, leases running out into attempts and dead letters, ``dead()``,
  ``retry_dead()``, and ``LockNotOwnedError`` for a lease lost.

Expiry, timers and leases are the sweeper's, on a thread of its own: when the clock
moves, the machine has the engine do at once what is due and waits for it
(``ReactorMachine.settle``); the model then applies the same (``catch_up``). Nothing
happens in the background until the clock moves again.

Invariants, after every step: every scope's ``list()`` (and its key order), the
``ttl()`` of its live keys and of an absent one, ``state.scopes()``, the keys per scope
and the held locks of ``stats()``, each lock holder's ``held()`` and ``token``, the
pending timers (``state.timers()``) and what ``stats()`` counts of them, the queue's
``stats()``; the revision never decreases.

What the machine found is kept at the end of this file as the smallest failing case.

Each example starts from an empty database: a new SQLite file; on PostgreSQL, scope,
lock and queue names of its own in the test's schema, a clock started past every
deadline of the examples before, and no timer of theirs (each cancels its own). Runs:

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
from reactor.testing import ManualClock, run_upkeep
from tests.conftest import canon, wait_for

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
QUEUE = "q"
MAX_ATTEMPTS = 2  # the queue's: a job taken twice without an ack is dead
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


Cond = tuple[int, bool]  # if_revision=, and whether it matches


def if_rev(cond: Cond | None) -> int | None:
    return None if cond is None else cond[0]


def require(cond: Cond | None) -> None:
    """A write's ``if_revision=`` that does not match: ConflictError, nothing written."""
    if cond is not None:
        event(f"if_revision: {'matches' if cond[1] else 'conflicts'}")
        if not cond[1]:
            raise Predicted(reactor.ConflictError)


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


def stored_text(value: Any) -> str:
    """The value as stored JSON text: the key order kept, ``1``, ``1.0`` and ``True``
    apart. A write changes a key (a change record, +1 to its version) iff it changes
    this text (SPEC section 13: the same value again, or a new expiry alone, does not)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@dataclass
class Record:
    """A change of one key as its history shows it; ``passed``: the deadline an
    ``expired`` record says passed (None for the other types)."""

    type: str
    old: Any
    new: Any
    version: int
    time: float
    passed: float | None = None
    timer: str | None = None


class ModelScope:
    """The keys of one scope: value and deadline (None: no expiry), and each key's
    history since the example began (its last record gives its version)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.entries: dict[str, Entry] = {}
        self.log: dict[str, list[Record]] = {}
        self.timer: str | None = None  # the timer whose write is being applied

    def copy(self) -> ModelScope:
        twin = ModelScope(self.clock)
        twin.entries = copy.deepcopy(self.entries)
        twin.log = {key: list(records) for key, records in self.log.items()}
        return twin

    def row(self, key: str, now: float) -> Entry | None:
        """The live entry of ``key``: from its deadline on, a key is absent."""
        entry = self.entries.get(key)
        if entry is not None and entry[1] is not None and entry[1] <= now:
            event("a key reached its deadline")
            self.drop(key, "expired")
            return None
        return entry

    def value(self, key: str, now: float, default: Any = None) -> Any:
        entry = self.row(key, now)
        return default if entry is None else entry[0]

    def live(self, now: float) -> dict[str, Any]:
        return {key: entry[0] for key in sorted(self.entries) if (entry := self.row(key, now))}

    def version(self, key: str) -> int:
        return self.log[key][-1].version if key in self.entries else 0

    def records(self, key: str) -> list[Record]:
        return self.log.get(key, [])

    def _record(self, key: str, record: Record) -> None:
        record.timer = self.timer
        self.log.setdefault(key, []).append(record)

    def put(self, key: str, value: Any, deadline: float | None) -> None:
        old = self.entries.get(key)
        self.entries[key] = (copy.deepcopy(value), deadline)
        if old is None:
            self._record(key, Record("created", None, value, 1, self.clock()))
        elif stored_text(old[0]) != stored_text(value):
            version = self.version(key) + 1
            self._record(key, Record("updated", old[0], value, version, self.clock()))

    def drop(self, key: str, kind: str = "deleted") -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            passed = old[1] if kind == "expired" else None
            self._record(key, Record(kind, old[0], None, 0, self.clock(), passed))


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


@dataclass
class ModelTimer:
    """A pending timer: the key it writes, when, and what: a value (``ops`` None), or
    update ops."""

    scope: str
    key: str
    due: float
    every: float | None
    value: Any
    ops: list[dict[str, Any]] | None


def next_period(due: float, every: float, now: float) -> float:
    """A recurring timer fired at ``now``: its next due time, the first of its periods
    after ``now`` (the periods it missed fire once, SPEC section 13)."""
    periods = 1
    while due + periods * every <= now:
        periods += 1
    return due + periods * every


HORIZON = 2000.0  # seconds: more than the clock moves in an example (50 steps of 30 s)


def due_times(due: float, every: float | None) -> set[float]:
    """The times a timer is due (to the horizon; times are binary fractions: exact)."""
    if every is None:
        return {due}
    return {due + period * every for period in range(int(HORIZON / every) + 1)}


@dataclass
class ModelJob:
    """A job of the queue. ``ready_at``: ready, when it may be taken; taken, when its
    lease runs out; dead, when it died. ``taker``: the take holding it (``Taken``)."""

    id: int
    item: Any
    state: str
    ready_at: float
    attempts: int
    key: str | None
    taker: int | None = None


@dataclass
class Taken:
    """A job as a take returned it (its lease), and which take that was."""

    job: reactor.Job
    number: int
    lease: float


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


COND_WRITE = st.one_of(
    st.tuples(st.just("set"), VALUES, TTLS, st.booleans()),
    st.tuples(st.just("delete")),
    st.tuples(st.just("increment"), BYS, st.just(0), st.booleans()),
    st.tuples(st.just("append"), TEXTS),
    st.tuples(st.just("push"), st.lists(VALUES, max_size=2)),
    st.tuples(st.just("pop"), st.booleans()),
    st.tuples(st.just("expire"), SECONDS),
    st.tuples(st.just("compare_and_swap"), CURRENT | VALUES, VALUES | st.just(MISSING)),
    st.tuples(st.just("update"), st.lists(UPDATE_OP, max_size=3), st.none()),
)
COND_MANY = st.one_of(
    st.tuples(
        st.just("set_many"), st.dictionaries(KEY, VALUES, max_size=3), st.sampled_from([None, 1, 5])
    ),
    st.tuples(st.just("clear"), st.sampled_from(PATTERNS)),
)
TX_OP = TX_OP | st.tuples(
    st.just("conditional"), KEY, st.sampled_from(["read", "stale", "zero"]), COND_WRITE
)
# What a timer writes: a value, update ops, or a JSON Patch (without copy: a recurring
# copy of a copy would double the value at each period); "both" is refused.
_POINTERS = st.sampled_from(STATIC_POINTERS)
TIMER_PATCH_OP = st.one_of(
    st.fixed_dictionaries({"op": st.just("add"), "path": _POINTERS, "value": VALUES}),
    st.fixed_dictionaries({"op": st.just("remove"), "path": _POINTERS}),
    st.fixed_dictionaries({"op": st.just("replace"), "path": _POINTERS, "value": VALUES}),
    st.fixed_dictionaries({"op": st.just("move"), "from": _POINTERS, "path": _POINTERS}),
    st.fixed_dictionaries({"op": st.just("test"), "path": _POINTERS, "value": VALUES}),
)
TIMER_WRITE = st.one_of(
    st.tuples(st.just("value"), VALUES),
    st.tuples(st.just("ops"), st.lists(UPDATE_OP, min_size=1, max_size=2)),
    st.tuples(st.just("ops"), st.lists(TIMER_PATCH_OP, min_size=1, max_size=1)),
    st.just(("both", 1)),
)
# When: after= seconds, at= now plus seconds (in the past: at once), or one period on.
TIMER_WHEN = st.sampled_from(
    [
        *[("after", 0.5), ("after", 1), ("after", 2), ("after", 3.5), ("after", 0)],
        *[("at", 1.5), ("at", -2), (None, None)],
    ]
)
TIMER_EVERY = st.sampled_from([None, None, 1, 2.5, 4, 0])


# The queue's verbs (the first is drawn most, the rest alike) and their arguments.
QUEUE_VERBS = ["take", "put", "finish_job", "put", "finish_job", "dead_letters"]
QUEUE_ARGS = {
    "put": st.tuples(
        VALUES,
        st.sampled_from([None, None, 0, 1, 2.5]),  # delay
        st.sampled_from([None, None, "a", "b"]),  # idempotency key
    ),
    "take": st.tuples(st.sampled_from([1, 2.5, 10]), st.sampled_from([0, 0.0])),
    "finish_job": st.tuples(
        st.sampled_from(["ack", "ack", "nack", "extend"]),
        st.integers(0, 3),  # which of the last takes
        st.sampled_from([None, 0, 1.5, 5]),  # nack's delay, extend's seconds
    ),
    "dead_letters": st.tuples(st.booleans(), st.sampled_from([None, None, 1])),
}


# In a transaction body too: timers made and cancelled, jobs enqueued, with the commit.
TX_OP = st.one_of(
    TX_OP,
    st.tuples(st.just("schedule"), KEY, TIMER_WRITE, TIMER_WHEN, TIMER_EVERY),
    st.tuples(st.just("cancel_timer"), st.integers(0, 3)),
    st.tuples(
        st.just("enqueue"), VALUES, st.sampled_from([None, 0, 1]), st.sampled_from([None, "a"])
    ),
)


def value_then(records: list[tuple[int, Record]], revision: int, time: float) -> Any:
    """What a key held at ``revision`` (committed at ``time``), from its records and
    their revisions: the value of its last change by then, unless its deadline had
    passed by ``time`` (the expiry recorded later says which deadline passed)."""
    before = [record for number, record in records if number <= revision]
    after = [record for number, record in records if number > revision]
    if not before or before[-1].type in ("deleted", "expired"):
        return DEFAULT
    passed = after[0].passed if after and after[0].type == "expired" else None
    if passed is not None and passed <= time:
        event("at_revision: a deadline passed, its expiry recorded later")
        return DEFAULT
    return before[-1].new


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
        "if_revision -1": (
            reactor.InvalidArgumentError,
            lambda _, h: h.set("k1", 1, if_revision=-1),
        ),
        "if_revision str": (
            reactor.InvalidArgumentError,
            lambda _, h: h.delete("k1", if_revision="1"),
        ),
        "at_revision -1": (reactor.InvalidArgumentError, lambda _, h: h.get("k1", at_revision=-1)),
        "history limit": (reactor.InvalidArgumentError, lambda _, h: h.history("k1", limit=-1)),
        "timer id int": (reactor.InvalidArgumentError, lambda state, _: state.cancel_timer(5)),
        "schedule every -1": (
            reactor.InvalidArgumentError,
            lambda _, h: h.schedule("k1", 1, every=-1),
        ),
        "put delay -1": (
            reactor.InvalidArgumentError,
            lambda state, _: state.queue("q").put(1, delay=-1),
        ),
        "take lease 0": (
            reactor.InvalidArgumentError,
            lambda state, _: state.queue("q").take(0, 0),
        ),
        "put nan": (
            reactor.InvalidValueError,
            lambda state, _: state.queue("q").put(float("nan")),
        ),
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
        self.clock = ManualClock(START + 1_000_000.0 * number)
        self.now = self.clock.time()
        self.state = reactor.open(self.target, clock=self.clock)
        self.handles: dict[str, reactor.Scope] = {}
        self.model = {name: ModelScope(self.model_now) for name in SCOPES}
        self.revision = 0
        # versions: what entry() showed of a key (revision, created revision, and how
        # many records its history had then), and snapshots' revisions with as much
        self.seen: dict[tuple[str, str], tuple[int, int, int]] = {}
        self.checkpoints: list[tuple[int, dict[tuple[str, str], int]]] = []
        # timers: the pending ones, those gone (fired or cancelled), and what the
        # engine's stats() count (fired, failed) since it opened
        self.timers: dict[str, ModelTimer] = {}
        self.gone_timers: list[str] = []
        self.timer_counts = [0, 0]
        # in a transaction body: what the model does at the commit, the timers it made
        self.staged: list[Callable[[], object]] | None = None
        self.tx_timers: list[str] = []
        self.tx_new_timers: list[ModelTimer] = []
        self.tx_cancelled: set[str] = set()
        # the queue: its jobs, the next id, the jobs our takes returned
        self.queue_handle: reactor.Queue | None = None
        self.jobs: dict[int, ModelJob] = {}
        self.next_job = 1
        self.takes: list[Taken] = []
        self.take_count = 0
        # locks: the table, the Lock objects of this handle, and their tokens
        self.leases: dict[str, Lease] = {}
        self.last_token: dict[str, int] = {}
        self.generation = 0
        self.lock_objects: dict[tuple[str, int], reactor.Lock] = {}
        self.holder_tokens: dict[tuple[str, int], int | None] = {}
        for name in SCOPES:
            assert self.handle(name).list() == {}

    def teardown(self) -> None:
        if self.shared_url is not None:  # a shared database: no timer fires in the next
            try:
                for timer in self.state.timers(self.prefix + "*"):
                    self.state.cancel_timer(timer.id)
            except reactor.ReactorError:
                pass  # what failed was reported already
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

    def model_now(self) -> float:
        return self.now

    def queue(self) -> reactor.Queue:
        if self.queue_handle is None:
            self.queue_handle = self.state.queue(self.real_name(QUEUE), MAX_ATTEMPTS)
        return self.queue_handle

    # -- time: what comes due when the clock moves ---------------------------------------
    def settle(self) -> None:
        """Have the engine do now what is due (expire keys, fire timers, turn back
        leases run out: ``run_upkeep``) and wait for it, rather than for its sweeper's
        next round: from here on, until the clock moves again, nothing happens in the
        background.

        The sweeper's thread may be doing the same meanwhile: each of its requests reads
        again, in its write, what it finds due, so the work is done once either way.
        """
        run_upkeep(self.state)
        # Nothing left due: a second round finds nothing to do.
        again = run_upkeep(self.state)
        left = (again.keys_expired, again.timers_fired, again.leases_turned_back)
        assert left == (0, 0, 0), f"the upkeep left work due: {again}"

    def catch_up(self) -> None:
        """The model's side of ``settle``: expiry, leases run out, then the timers due
        (in order of due time, then id), each once, as a write at the current time."""
        for m in self.model.values():
            m.live(self.now)  # records the expiry of the keys whose deadline passed
        for job in self.jobs.values():
            if job.state == "taken" and job.ready_at <= self.now:
                event("queue: a lease ran out")
                job.state = "dead" if job.attempts >= MAX_ATTEMPTS else "ready"
                job.taker = None  # ready_at stays: in line from when its lease ran out
        due = sorted((timer.due, timer_id) for timer_id, timer in self.timers.items())
        for when, timer_id in due:
            if when > self.now:
                break
            timer = self.timers[timer_id]
            m = self.model[timer.scope]
            m.timer = timer_id
            try:
                if timer.ops is None:
                    m.put(timer.key, timer.value, None)  # as set() would: no expiry
                else:
                    write, _, new, errors = self.predict_update(m, timer.key, timer.ops, None)
                    self.apply_update(m, timer.key, write, new)
                    self.timer_counts[1] += bool(errors)
                    style = "patch" if "op" in timer.ops[0] else "update ops"
                    event(f"timer: {style}, {write}, {len(errors)} error(s)")
            finally:
                m.timer = None
            self.timer_counts[0] += 1
            if timer.every is None:
                del self.timers[timer_id]
                self.gone_timers.append(timer_id)
            else:
                timer.due = next_period(timer.due, timer.every, self.now)
                missed = when + timer.every <= self.now
                event(f"timer: recurring, {'missed periods' if missed else 'on time'}")

    # -- versions and history --------------------------------------------------------------
    def check_entry(self, scope: str, key: str, e: reactor.Entry | None) -> None:
        """``entry()`` against the model; its revisions against what it showed before
        (a write that changes nothing moves neither revision; an update keeps the
        created revision)."""
        m = self.model[scope]
        row = m.row(key, self.now)
        if row is None:
            assert e is None, e
            return
        assert e is not None, (key, row)
        assert canon(e.value) == canon(row[0]), (e.value, row[0])
        assert (e.version, e.expires_at) == (m.version(key), row[1]), (e, m.records(key)[-1])
        assert (e.revision == e.created_revision) == (e.version == 1), e
        assert 0 < e.created_revision <= e.revision, e
        records = m.records(key)
        seen = self.seen.get((scope, key))
        if seen is not None:
            revision, created, count = seen
            later = records[count:]
            if not later:
                assert (e.revision, e.created_revision) == (revision, created), (e, seen)
            else:
                assert e.revision > revision, (e, seen)
                if all(record.type == "updated" for record in later):
                    assert e.created_revision == created, (e, seen)
        self.seen[scope, key] = (e.revision, e.created_revision, len(records))

    def check_history(self, scope: str, key: str) -> list[tuple[int, Record]]:
        """``history(key)`` against the model's records; each record with its revision."""
        got = self.handle(scope).history(key)
        want = self.model[scope].records(key)
        timers = [e.timer for e in got]

        assert [
            (e.type, canon(e.old_value), canon(e.new_value), e.version, timer)
            for e, timer in zip(got, timers, strict=True)
        ] == [(r.type, canon(r.old), canon(r.new), r.version, r.timer) for r in want], (scope, key)
        revisions = [e.revision for e in got]
        assert revisions == sorted(set(revisions)), revisions
        for e, record in zip(got, want, strict=True):
            assert abs(e.timestamp.timestamp() - record.time) < 1e-3, (e, record.time)
        return list(zip(revisions, want, strict=True))

    def conditional(
        self, h: Any, m: ModelScope, key: str, how: str, call: tuple[Any, ...], in_tx: bool
    ) -> None:
        """A write verb with ``if_revision=``: the key's revision as ``entry()`` reads it
        just before ("read"), one it had before, unless the key changed since ("seen"),
        a stale one, or 0 (only if absent)."""
        earlier = None if in_tx else self.seen.get((h.name[len(self.prefix) :], key))
        e = h.entry(key)
        row = m.row(key, self.now)
        if in_tx:  # the body's own view: a key it changed shows a revision below 0
            assert (e is None) == (row is None)
            if e is not None and row is not None:
                assert (canon(e.value), e.version) == (canon(row[0]), m.version(key))
        else:
            self.check_entry(h.name[len(self.prefix) :], key, e)
        if how == "seen" and earlier is not None:
            count = earlier[2]
            cond = (earlier[0], e is not None and len(m.records(key)) == count)
        elif how == "stale":  # one it never had, or not since the last change
            stale = 1 if e is None or e.revision < 1 else e.revision - 1 or 2
            cond = (stale, False)
        elif how == "zero" or (e is not None and e.revision < 0):
            cond = (0, e is None)
        else:
            cond = (0 if e is None else e.revision, True)
        kind, *args = call
        getattr(self, f"do_{kind}")(h, m, key, *args, cond=cond)

    # -- writes, shared by the rules and the transaction body ----------------------------
    # ``cond``: ``if_revision=`` and whether the model says it matches (None: no
    # condition). A condition is checked after the arguments, before the value's type.
    def do_set(
        self,
        h: Any,
        m: ModelScope,
        key: str,
        value: Any,
        ttl: Any,
        keep_ttl: bool,
        cond: Cond | None = None,
    ) -> None:
        def model() -> Any:
            if ttl is not None and not (is_number(ttl) and ttl > 0):
                raise Predicted(reactor.InvalidArgumentError)
            require(cond)
            old = m.row(key, self.now)
            if ttl is not None:
                deadline = self.now + ttl
            else:
                deadline = old[1] if keep_ttl and old is not None else None
            m.put(key, value, deadline)
            return (None if old is None else old[0], value)

        self.check(
            lambda: h.set(key, value, ttl=ttl, keep_ttl=keep_ttl, if_revision=if_rev(cond)), model
        )

    def do_set_many(
        self, h: Any, m: ModelScope, mapping: dict[str, Any], ttl: Any, cond: Cond | None = None
    ) -> None:
        def model() -> Any:
            if ttl is not None and not (is_number(ttl) and ttl > 0):
                raise Predicted(reactor.InvalidArgumentError)  # even with nothing to set
            if mapping:  # nothing to write: no condition either
                require(cond)
            changes = {}
            for key, value in mapping.items():
                changes[key] = (m.value(key, self.now), value)
                m.put(key, value, None if ttl is None else self.now + ttl)
            return changes

        self.check(lambda: h.set_many(mapping, ttl=ttl, if_revision=if_rev(cond)), model)

    def do_clear(self, h: Any, m: ModelScope, pattern: str, cond: Cond | None = None) -> None:
        def model() -> Any:
            if not pattern:
                raise Predicted(reactor.InvalidKeyError)
            require(cond)
            gone = [key for key in m.live(self.now) if glob_match(pattern, key)]
            for key in gone:
                m.drop(key)
            return len(gone)

        self.check(lambda: h.clear(pattern, if_revision=if_rev(cond)), model)

    def do_compare_and_swap(
        self, h: Any, m: ModelScope, key: str, expected: Any, new: Any, cond: Cond | None = None
    ) -> None:
        expected = self.resolve_current(expected, m.value(key, self.now))

        def model() -> Any:
            require(cond)
            old = m.row(key, self.now)
            if expected is MISSING:
                matches = old is None
            else:
                matches = old is not None and json_equal(old[0], expected)
            event(f"compare_and_swap: {'swaps' if matches else 'does not swap'}")
            if not matches:
                return False
            if new is MISSING:
                m.drop(key)
            else:
                m.put(key, new, None if old is None else old[1])  # keeps the expiry
            return True

        self.check(lambda: h.compare_and_swap(key, expected, new, if_revision=if_rev(cond)), model)

    def do_delete(self, h: Any, m: ModelScope, key: str, cond: Cond | None = None) -> None:
        def model() -> Any:
            require(cond)
            old = m.row(key, self.now)
            m.drop(key)
            return None if old is None else old[0]

        self.check(lambda: h.delete(key, if_revision=if_rev(cond)), model)

    def do_increment(
        self,
        h: Any,
        m: ModelScope,
        key: str,
        by: Any,
        default: Any,
        down: bool,
        cond: Cond | None = None,
    ) -> None:
        def model() -> Any:
            if not (is_number(by) and is_number(default)):
                raise Predicted(reactor.TypeMismatchError)
            require(cond)
            old = m.row(key, self.now)
            current = default if old is None else old[0]
            if not is_number(current):
                raise Predicted(reactor.TypeMismatchError)
            result = current - by if down else current + by
            m.put(key, result, None if old is None else old[1])
            return result

        verb = h.decrement if down else h.increment
        self.check(lambda: verb(key, by, default=default, if_revision=if_rev(cond)), model)

    def do_append(
        self, h: Any, m: ModelScope, key: str, text: Any, cond: Cond | None = None
    ) -> None:
        def model() -> Any:
            if type(text) is not str:
                raise Predicted(reactor.TypeMismatchError)
            require(cond)
            old = m.row(key, self.now)
            current = "" if old is None else old[0]
            if type(current) is not str:
                raise Predicted(reactor.TypeMismatchError)
            m.put(key, current + text, None if old is None else old[1])
            return len(current + text)

        self.check(lambda: h.append(key, text, if_revision=if_rev(cond)), model)

    def do_push(
        self, h: Any, m: ModelScope, key: str, items: list[Any], cond: Cond | None = None
    ) -> None:
        def model() -> Any:
            require(cond)
            old = m.row(key, self.now)
            current = [] if old is None else old[0]
            if type(current) is not list:
                raise Predicted(reactor.TypeMismatchError)
            if items:  # pushing nothing writes nothing (and makes no key)
                m.put(key, [*current, *items], None if old is None else old[1])
            return len(current) + len(items)

        self.check(lambda: h.push(key, *items, if_revision=if_rev(cond)), model)

    def do_pop(
        self, h: Any, m: ModelScope, key: str, front: bool, cond: Cond | None = None
    ) -> None:
        def model() -> Any:
            require(cond)
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

        self.check(lambda: h.pop(key, front=front, if_revision=if_rev(cond)), model)

    def do_expire(
        self, h: Any, m: ModelScope, key: str, seconds: Any, cond: Cond | None = None
    ) -> None:
        def model() -> Any:
            require(cond)
            old = m.row(key, self.now)
            if old is None:
                return False
            if seconds is not None and seconds <= 0:
                m.drop(key, "expired")
            else:
                m.put(key, old[0], None if seconds is None else self.now + seconds)
            return True

        self.check(lambda: h.expire(key, seconds, if_revision=if_rev(cond)), model)

    def predict_update(
        self, m: ModelScope, key: str, op_list: list[dict[str, Any]], atomic: Any
    ) -> tuple[str, Any, Any, list[tuple[int, str]]]:
        """What ``update`` does: "nothing", "delete" or "put"; the old value, the new
        one, and the errors (index, code)."""
        patch = bool(op_list) and "op" in op_list[0]
        old = m.row(key, self.now)
        old_value = None if old is None else old[0]
        if patch:
            doc, applied, errors = model_patch(old is not None, old_value, op_list)
        else:
            doc, applied, errors = model_update_ops(old is not None, old_value, op_list)
        if not applied or (errors and (patch or atomic)):
            return "nothing", old_value, old_value, errors
        if not doc.created:
            return "delete", old_value, None, errors
        return "put", old_value, doc.value, errors

    def apply_update(self, m: ModelScope, key: str, write: str, new: Any) -> None:
        if write == "delete":
            m.drop(key)
        elif write == "put":
            old = m.row(key, self.now)
            m.put(key, new, None if old is None else old[1])

    def do_update(
        self,
        h: Any,
        m: ModelScope,
        key: str,
        op_list: list[dict[str, Any]],
        atomic: Any,
        cond: Cond | None = None,
    ) -> None:
        patch = bool(op_list) and "op" in op_list[0]
        if patch:
            old = m.row(key, self.now)
            op_list = [
                {**op, "value": self.resolve_current(op["value"], self.value_at(old, op))}
                if op["op"] == "test"
                else op
                for op in op_list
            ]
        write, old_value, new, errors = self.predict_update(m, key, op_list, atomic)
        if write == "put" and len(canon(new)) > MAX_DOC:
            return  # copies of copies: keep the values small
        if cond is not None and not cond[1]:
            event("if_revision: update conflicts")
            with pytest.raises(reactor.ConflictError):
                h.update(key, op_list, atomic=atomic, if_revision=cond[0])
            return
        event(f"{'patch' if patch else 'update ops'}: {write}, {len(errors)} error(s)")
        for _, code in errors:
            event(f"{'patch' if patch else 'update ops'} error: {code}")
        result = h.update(key, op_list, atomic=atomic, if_revision=if_rev(cond))
        assert isinstance(result, reactor.UpdateResult)
        assert canon(result.old_value) == canon(old_value)
        assert canon(result.new_value) == canon(new), f"{result.new_value!r} != {new!r}"
        assert [(e["index"], e["code"]) for e in result.errors] == errors, result.errors
        for error in result.errors:
            assert canon(error["op"]) == canon(op_list[error["index"]])
            assert isinstance(error["message"], str)
            assert error["message"]
        self.apply_update(m, key, write, new)

    def value_at(self, old: Entry | None, op: dict[str, Any]) -> Any:
        """The value a patch ``test`` names in the current value (None if absent)."""
        try:
            return resolve(None if old is None else old[0], tokens(op["path"]))
        except Absent:
            return None

    def do_conditional(
        self, h: Any, m: ModelScope, key: str, how: str, call: tuple[Any, ...]
    ) -> None:
        """In a transaction body: a conflict undoes only that write."""
        self.conditional(h, m, key, how, call, in_tx=True)

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

    # A number of seconds, or to the next time something is due: a timer, a delayed job
    # or a lease, a key's deadline (exactly then: what is due at that time is due).
    @rule(
        seconds=st.sampled_from([0.5, 1, 2, 5, "timer", "job", "key", "anything"]),
        scope=SCOPE,
    )
    def advance_clock(self, seconds: float | str, scope: str) -> None:
        if isinstance(seconds, str):
            seconds = self.to_next_deadline(seconds)
        self.clock.advance(seconds)
        self.now += seconds
        assert self.clock.time() == self.now
        self.settle()
        self.catch_up()
        assert self.handle(scope).keys() == list(self.model[scope].live(self.now))

    def to_next_deadline(self, what: str) -> float:
        times = {
            "timer": [timer.due for timer in self.timers.values()],
            "job": [job.ready_at for job in self.jobs.values() if job.state != "dead"],
            "key": [
                deadline
                for m in self.model.values()
                for _, deadline in m.entries.values()
                if deadline is not None
            ],
        }
        everything = list(itertools.chain.from_iterable(times.values()))
        later = [t for t in times.get(what, everything) if t > self.now]
        event(f"advance to the next deadline: {what if later else 'none'}")
        return min(later) - self.now if later else 1.0

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
        self.checkpoint(snap.revision)

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
            ours = [timer_id for timer_id, t in self.timers.items() if t.scope == scope]
            for timer_id in ours[:1]:  # it would wait for this transaction to end
                with pytest.raises(reactor.ReentrancyError):
                    self.state.cancel_timer(timer_id)
            if elsewhere is not None:  # another scope: not part of the transaction
                self.do_set(self.handle(other), self.model[other], KEYS[0], elsewhere, None, False)
            for key in KEYS:
                assert canon(tx.get(key, DEFAULT)) == canon(working.value(key, self.now, DEFAULT))
                assert canon(tx.ttl(key)) == canon(self.ttl_of(working, key))
            committed = self.model[scope].records(KEYS[0])  # not the body's own
            assert [(e.type, e.version) for e in tx.history(KEYS[0])] == [
                (r.type, r.version) for r in committed
            ]

        self.staged, self.tx_timers, self.tx_new_timers = [], [], []
        self.tx_cancelled = set()
        try:
            if fail:
                with pytest.raises(Boom), h.transaction() as tx:
                    run(tx)
                    raise Boom
            else:
                with h.transaction() as tx:
                    run(tx)
        finally:
            staged, self.staged = self.staged, None
        if fail:
            return
        self.model[scope] = working
        for action in staged:  # timers scheduled and cancelled, jobs enqueued
            action()
        if any(timer.due <= self.now for timer in self.timers.values()):
            self.settle()  # a timer it made that is due at once
            self.catch_up()

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

    # -- rules: versions and history ----------------------------------------------------
    @rule(scope=SCOPE, key=KEY)
    def entry(self, scope: str, key: str) -> None:
        self.check_entry(scope, key, self.handle(scope).entry(key))

    @rule(
        scope=SCOPE,
        key=KEY,
        how=st.sampled_from(["read", "read", "seen", "stale", "zero"]),
        call=COND_WRITE | COND_MANY,
    )
    def conditional_write(self, scope: str, key: str, how: str, call: tuple[Any, ...]) -> None:
        if call[0] in ("set_many", "clear"):  # several keys: a snapshot's revision
            many = {"read": "snapshot", "seen": "earlier", "stale": "earlier", "zero": "zero"}
            self.conditional_many(scope, many[how], KEYS.index(key), call)
            return
        self.conditional(self.handle(scope), self.model[scope], key, how, call, in_tx=False)

    def checkpoint(self, revision: int) -> None:
        """Keep a snapshot's revision, and how many records each key had then."""
        counts = {(s, k): len(self.model[s].records(k)) for s in SCOPES for k in KEYS}
        self.checkpoints = [*self.checkpoints[-3:], (revision, counts)]

    def conditional_many(self, scope: str, how: str, pick: int, call: tuple[Any, ...]) -> None:
        """set_many and clear with ``if_revision=R``: only if none of the keys they write
        changed after R (a snapshot's: now, or earlier), or with 0, if none exists."""
        h, m = self.handle(scope), self.model[scope]
        kind, what, *rest = call
        if kind == "set_many":
            keys = list(what)
        else:
            keys = [key for key in KEYS if what and glob_match(what, key)]
        if how == "earlier" and self.checkpoints:
            revision, counts = self.checkpoints[pick % len(self.checkpoints)]
            same = all(len(m.records(key)) == counts[scope, key] for key in keys)
        else:
            revision, same = h.snapshot().revision, True
            self.checkpoint(revision)
        if how == "zero" or revision == 0:  # a snapshot of an empty database: 0 too
            cond = (0, all(m.row(key, self.now) is None for key in keys))
        else:
            cond = (revision, same)
        getattr(self, f"do_{kind}")(h, m, what, *rest, cond=cond)

    @rule(scope=SCOPE, key=KEY, other=KEY, data=st.data())
    def history(self, scope: str, key: str, other: str, data: st.DataObject) -> None:
        """``history(key)`` (with ``since`` and ``limit`` too), the key's revisions in
        ``entry()``, and ``get(key, at_revision=R)`` at revisions of its own records and
        of another key's (where a deadline passed by then makes it absent)."""
        h = self.handle(scope)
        mine = self.check_history(scope, key)
        e = h.entry(key)
        self.check_entry(scope, key, e)
        if e is not None:
            assert e.revision == mine[-1][0], (e, mine[-1])
            assert e.created_revision == [rev for rev, r in mine if r.type == "created"][-1]
        if mine:
            first = data.draw(st.integers(0, len(mine) - 1), label="since")
            limit = data.draw(st.none() | st.integers(0, 2), label="limit")
            part = h.history(key, since=mine[first][0], limit=limit)
            want = [rev for rev, _ in mine[first + 1 :]]
            assert [event.revision for event in part] == want[:limit], (part, want, limit)
        points = dict(mine)
        if other != key:
            points.update(self.check_history(scope, other))
        if points:
            revisions = data.draw(
                st.lists(st.sampled_from(sorted(points)), max_size=3, unique=True),
                label="at_revision",
            )
            for revision in [0, *revisions]:
                time = points[revision].time if revision else self.now
                want = value_then(mine, revision, time)
                got = h.get(key, DEFAULT, at_revision=revision)
                assert canon(got) == canon(want), (revision, got, want)
        with pytest.raises(reactor.InvalidArgumentError):
            h.get(key, at_revision=2**62)  # after the last revision

    # -- rules: timers -------------------------------------------------------------------
    @rule(scope=SCOPE, key=KEY, what=TIMER_WRITE, when=TIMER_WHEN, every=TIMER_EVERY)
    def schedule(
        self, scope: str, key: str, what: tuple[str, Any], when: tuple[Any, Any], every: Any
    ) -> None:
        self.do_schedule(self.handle(scope), self.model[scope], key, what, when, every)

    def after_commit(self, action: Callable[[], object]) -> None:
        """Apply ``action`` to the model now, or in a transaction body at its commit."""
        if self.staged is None:
            action()
        else:
            self.staged.append(action)

    def do_schedule(
        self,
        h: Any,
        _m: ModelScope,
        key: str,
        what: tuple[str, Any],
        when: tuple[Any, Any],
        every: Any,
    ) -> None:
        """``schedule`` (in a transaction: the timer exists from the commit on)."""
        scope = h.name[len(self.prefix) :]
        kind, payload = what
        times: dict[str, Any] = {"every": every}
        if when[0] == "after":
            times["after"] = when[1]
        elif when[0] == "at":
            times["at"] = self.now + when[1]
        if kind == "both" or every == 0 or (when[0] is None and every is None):
            with pytest.raises(reactor.InvalidArgumentError):
                h.schedule(key, payload, ops=[ops.increment("n")], **times)
            return
        # Timers due at the same time fire in the order of their ids, which are random:
        # two of one key must never tie, or the model's value, on which later draws
        # depend, would differ between runs of one example. A later start, or none.
        later = None
        for shift in [0.0] if when[0] is None else [0.0, 0.125, 0.25, 0.375]:
            due = self.now + (every if when[0] is None else when[1] + shift)
            if not self.ties(scope, key, due, every):
                later = shift
                break
        if later is None:
            event("schedule: left out, it would tie with a timer of its key")
            return
        if when[0] is not None:
            times[when[0]] += later
        if kind == "value":
            timer = h.schedule(key, payload, **times)
        else:
            timer = h.schedule(key, ops=payload, **times)
        want = (self.real_name(scope), key, due, every)
        assert (timer.scope, timer.key, timer.due, timer.every) == want, (timer, want)
        assert (timer.cron, timer.tz) == (None, None)
        value = payload if kind == "value" else None
        pending = ModelTimer(scope, key, due, every, value, payload if kind == "ops" else None)
        event(f"schedule: {kind}, {'recurring' if every else 'once'}, {when[0]}")
        self.after_commit(functools.partial(self.timers.__setitem__, timer.id, pending))
        if self.staged is not None:
            self.tx_timers.append(timer.id)
            self.tx_new_timers.append(pending)
        elif due <= self.now:  # fires at once
            self.settle()
            self.catch_up()

    def ties(self, scope: str, key: str, due: float, every: float | None) -> bool:
        """Whether a timer of ``key`` due then (and every ``every``) would ever be due
        at the same time as a pending timer of the key (within what an example lasts)."""
        times = due_times(due, every)
        others = [*self.timers.values(), *self.tx_new_timers]
        return any(
            (t.scope, t.key) == (scope, key) and not times.isdisjoint(due_times(t.due, t.every))
            for t in others
        )

    def do_cancel_timer(self, h: Any, _m: ModelScope, pick: int) -> None:
        """``tx.cancel_timer``: whether the timer is pending as the body sees it (one
        it scheduled is; one it cancelled is not: SPEC §13); it goes with the commit."""
        candidates = [*sorted(self.timers), *self.tx_timers, "no-such-timer"]
        timer_id = candidates[pick % len(candidates)]
        pending = (timer_id in self.timers or timer_id in self.tx_timers) and (
            timer_id not in self.tx_cancelled
        )
        assert h.cancel_timer(timer_id) is pending
        if pending:
            self.tx_cancelled.add(timer_id)
            self.after_commit(functools.partial(self.forget_timer, timer_id))

    def forget_timer(self, timer_id: str) -> None:
        if self.timers.pop(timer_id, None) is not None:
            self.gone_timers.append(timer_id)

    @rule(
        which=st.sampled_from(["pending", "pending", "gone", "never"]),
        pick=st.integers(0, 3),
        scope=SCOPE,
    )
    def cancel_timer(self, which: str, pick: int, scope: str) -> None:
        """Cancel a pending timer (True), one gone or none (False); then the pending
        timers of one scope, ``state.timers(scope=GLOB)``."""
        pending = sorted(self.timers)
        if which == "pending" and pending:
            timer_id = pending[pick % len(pending)]
            assert self.state.cancel_timer(timer_id) is True
            self.forget_timer(timer_id)
        else:
            gone = self.gone_timers[-3:] if which == "gone" else []
            timer_id = gone[pick % len(gone)] if gone else "no-such-timer"
            assert self.state.cancel_timer(timer_id) is False
        got = self.state.timers(self.real_name(scope))
        want = sorted((t.due, i) for i, t in self.timers.items() if t.scope == scope)
        assert [(t.due, t.id) for t in got] == want

    # -- rules: the queue ----------------------------------------------------------------
    # One rule for the verbs of the queue, a few at a time: hypothesis turns rules off at
    # random in each example, and a queue needs its puts, takes and acks together.
    @rule(
        verbs=st.lists(st.sampled_from(QUEUE_VERBS), min_size=2, max_size=6),
        data=st.data(),
    )
    def queue_steps(self, verbs: list[str], data: st.DataObject) -> None:
        for verb in verbs:
            getattr(self, verb)(*data.draw(QUEUE_ARGS[verb], label=verb))

    def put(self, item: Any, delay: Any, key: Any) -> None:
        want = self.model_put(item, delay, key)
        assert self.queue().put(item, delay=delay, key=key) == want

    def model_put(self, item: Any, delay: Any, key: Any) -> int:
        """A put: the id of the job holding ``key`` if one does, else a new job's."""
        holder = next((job.id for job in self.jobs.values() if key and job.key == key), None)
        event(f"put: {'a job holds the key' if holder else 'new'}")
        if holder is not None:
            return holder
        job_id, self.next_job = self.next_job, self.next_job + 1
        self.jobs[job_id] = ModelJob(job_id, item, "ready", self.now + (delay or 0), 0, key)
        return job_id

    def do_enqueue(self, h: Any, _m: ModelScope, item: Any, delay: Any, key: Any) -> None:
        """``tx.enqueue``: the job exists from the commit on (an outbox)."""
        assert h.enqueue(self.real_name(QUEUE), item, delay=delay, key=key) is None
        self.after_commit(functools.partial(self.model_put, item, delay, key))

    def take(self, lease: float, timeout: float) -> None:
        """A take that looks once (``timeout=0``): the job ready first, if any."""
        ready = [job for job in self.jobs.values() if job.state == "ready"]
        ready = [job for job in ready if job.ready_at <= self.now]
        taken = self.queue().take(timeout=timeout, lease=lease)
        event(f"take: {len(ready)} ready")
        if not ready:
            assert taken is None, taken
            return
        first = min(ready, key=lambda job: (job.ready_at, job.id))
        assert taken is not None
        got = (taken.id, canon(taken.item), taken.attempts)
        assert got == (first.id, canon(first.item), first.attempts + 1), (got, first)
        self.take_count += 1
        first.state, first.ready_at, first.taker = "taken", self.now + lease, self.take_count
        first.attempts += 1
        self.takes = [*self.takes[-3:], Taken(taken, self.take_count, lease)]

    def finish_job(self, verb: str, pick: int, seconds: Any) -> None:
        """ack, nack or extend a job a take returned: refused once its lease ran out
        (or it was acked or given back)."""
        if not self.takes:
            return
        taken = self.takes[pick % len(self.takes)]
        job = self.jobs.get(taken.job.id)
        mine = job is not None and job.state == "taken" and job.taker == taken.number
        event(f"{verb}: {'held' if mine else 'not held'}")
        if verb == "extend" and seconds == 0:
            with pytest.raises(reactor.InvalidArgumentError):
                taken.job.extend(seconds)
            return
        call = getattr(taken.job, verb)
        if not mine or job is None:
            with pytest.raises(reactor.LockNotOwnedError):
                call() if verb == "ack" else call(seconds)
            return
        assert job.ready_at > self.now  # a lease that ran out was turned back
        if verb == "ack":
            taken.job.ack()
            del self.jobs[job.id]
        elif verb == "nack":
            taken.job.nack(seconds)
            job.taker = None
            if job.attempts >= MAX_ATTEMPTS:
                job.state, job.ready_at = "dead", self.now
            else:
                job.state, job.ready_at = "ready", self.now + (seconds or 0)
        else:
            taken.job.extend(seconds)
            job.ready_at = self.now + (taken.lease if seconds is None else seconds)

    def dead_letters(self, retry: bool, limit: int | None) -> None:
        """``dead()`` in the order they died (``limit``), and ``retry_dead()``."""
        dead = sorted(
            (job for job in self.jobs.values() if job.state == "dead"),
            key=lambda job: (job.ready_at, job.id),
        )
        got = self.queue().dead(limit)
        dead_shown = dead[:limit]
        assert [(job.id, canon(job.item), job.attempts) for job in got] == [
            (job.id, canon(job.item), job.attempts) for job in dead_shown
        ]
        if got:
            with pytest.raises(reactor.LockNotOwnedError):
                got[0].ack()  # a dead letter holds no lease
        if retry:
            assert self.queue().retry_dead() == len(dead)
            for job in dead:
                job.state, job.ready_at, job.attempts = "ready", self.now, 0

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
        for taken in self.takes[:1]:
            with pytest.raises(reactor.ClosedError):
                taken.job.extend()
        self.state = reactor.open(self.target, clock=self.clock)
        # The leases stay in the database, held by holders this handle cannot name;
        # so do the jobs' leases, and the timers (nothing is due: the clock stood still).
        self.handles.clear()
        self.lock_objects.clear()
        self.holder_tokens.clear()
        self.generation += 1
        self.queue_handle = None
        self.takes.clear()
        self.timer_counts = [0, 0]  # stats() of the new engine

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
        self.check_timers(stats)
        if self.next_job > 1:
            self.check_queue()

    def check_timers(self, stats: dict[str, Any]) -> None:
        """``state.timers()`` of our scopes, and what ``stats()`` counts of timers."""
        if self.timers or self.gone_timers:
            want = sorted(
                (timer.due, timer_id, self.real_name(timer.scope), timer.key, timer.every)
                for timer_id, timer in self.timers.items()
            )
            got = self.state.timers(self.prefix + "*")
            assert [(t.due, t.id, t.scope, t.key, t.every) for t in got] == want
        counts = stats["timers"]
        if [counts["fired"], counts["failed"]] != self.timer_counts:
            # The sweeper counts a request's timers in a callback that may run just
            # after the request's result reached settle().
            wait_for(lambda: self.timer_stats() == self.timer_counts, timeout=2, interval=0.001)
        if self.shared_url is None:  # on PostgreSQL the database holds other examples'
            assert counts["pending"] == len(self.timers)

    def timer_stats(self) -> list[int]:
        counts = self.state.stats()["timers"]
        return [counts["fired"], counts["failed"]]

    def check_queue(self) -> None:
        jobs = list(self.jobs.values())
        want = {
            "ready": sum(job.state == "ready" and job.ready_at <= self.now for job in jobs),
            "delayed": sum(job.state == "ready" and job.ready_at > self.now for job in jobs),
            "taken": sum(job.state == "taken" for job in jobs),
            "dead": sum(job.state == "dead" for job in jobs),
            "taken_by_group": {},  # the model's jobs have no group, its queue no rate
            "rate_window": 0,
        }
        assert self.queue().stats() == want


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
