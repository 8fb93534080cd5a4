"""Security (SPEC §2): no pickle anywhere, stored data is JSON text only, private files,
and keys, names and patterns full of SQL metacharacters stay literal.

``tests/test_open.py`` checks the modes of the database files and of ``~/.reactor``;
``tests/test_keys.py`` a table of glob patterns and a few metacharacter keys. Here:
the source itself, every stored column read past reactor, the modes under a permissive
umask, and glob patterns checked against a model of SPEC §2's globs written
independently of reactor's, over keys and patterns drawn from SQL's metacharacters.
"""

from __future__ import annotations

import ast
import json
import os
import random
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import reactor
from reactor import ops

from .conftest import canon, raw_query, wait_for

REACTOR = Path(reactor.__file__).resolve().parent
Opener = Callable[..., reactor.State]

FORBIDDEN_MODULES = {
    "pickle",
    "_pickle",
    "cPickle",
    "pickletools",
    "marshal",
    "shelve",
    "dill",
    "cloudpickle",
    "jsonpickle",
    "joblib",
}
FORBIDDEN_CALLS = {"eval", "exec", "compile"}  # code from data
FORBIDDEN_NAMES = {"PickleType"}  # SQLAlchemy's pickling column type


# -- no pickle, no eval ------------------------------------------------------------------
def _findings(path: Path, root: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [
                f"{where} imports {alias.name}"
                for alias in node.names
                if alias.name.partition(".")[0] in FORBIDDEN_MODULES
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.partition(".")[0] in FORBIDDEN_MODULES:
                found.append(f"{where} imports from {node.module}")
            found += [
                f"{where} imports {alias.name}"
                for alias in node.names
                if alias.name in FORBIDDEN_NAMES
            ]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else None
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id in ("builtins", "__builtins__")
            ):
                name = func.attr
            if name in FORBIDDEN_CALLS:
                found.append(f"{where} calls {name}()")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_NAMES:
            found.append(f"{where} uses {node.attr}")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            found.append(f"{where} uses {node.id}")
    return found


def test_the_source_never_pickles_marshals_or_evaluates() -> None:
    sources = sorted(REACTOR.rglob("*.py"))
    assert len(sources) > 30  # the whole package, _bench included
    findings = [finding for path in sources for finding in _findings(path, REACTOR.parent)]
    assert findings == []


def test_the_scan_would_see_what_it_looks_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\nfrom marshal import loads\nimport dill.settings\n"
        "from sqlalchemy import PickleType\nimport sqlalchemy as sa\n"
        "t = sa.PickleType()\neval('1')\nbuiltins.exec('1')\n"
    )
    assert len(_findings(bad, tmp_path)) == 7


# -- what is stored is JSON text -----------------------------------------------------------
VALUES: dict[str, Any] = {
    "none": None,
    "true": True,
    "false": False,
    "int": -(2**63),
    "float": 5e-324,
    "whole float": 2.0,
    "string": "héllo ✓ 🚀 \u0000 \u2028 \"quoted\" 'single' \\ back",
    "sql": "'; DROP TABLE reactor_kv; --",
    "pickle-looking": "\x80\x04\x95cos\nsystem\n",
    "empty list": [],
    "empty object": {},
    "nested": {"a": [1, {"b": [None, True, 2.5, "x"]}], "": {"": []}},
}


def _ignore(event: reactor.ChangeEvent) -> None:
    pass


def _strict_json(text: Any) -> Any:
    """``text`` parsed as strict JSON (no NaN or Infinity, which Python's json allows)."""
    assert isinstance(text, str), f"stored as {type(text).__name__}, not text: {text!r}"

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _column_types(db: Any) -> dict[tuple[str, str], str]:
    if isinstance(db, str):
        rows = raw_query(
            db,
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema()",
        )
        return {(table, column): kind.lower() for table, column, kind in rows}
    types = {}
    for (table,) in raw_query(db, "SELECT name FROM sqlite_master WHERE type = 'table'"):
        for row in raw_query(db, f"PRAGMA table_info({table})"):
            types[(table, row[1])] = str(row[2]).lower()
    return types


def test_every_stored_value_event_and_op_is_json_text(state: reactor.State, db_path: Any) -> None:
    scope = state.scope("json")
    for name, value in VALUES.items():
        scope.set(name, value)
    scope.set_many({f"many-{name}": value for name, value in VALUES.items()}, ttl=60)
    scope.update("doc", [ops.set("a.b", [1, 2]), ops.increment("n", 2.5), ops.append("x", "l")])
    scope.update("doc", [{"op": "add", "path": "/p", "value": {"q": "'\"\\"}}])
    scope.push("list", 1, "two", [3])
    scope.increment("counter", 10)
    scope.append("text", "more")
    scope.compare_and_swap("int", -(2**63), {"swapped": True})
    scope.delete("none")
    scope.expire("string", 30)
    state.subscribe(_ignore, durable="json-check")  # a stored position
    with state.lock("json-lock", ttl=5):
        pass

    types = _column_types(db_path)
    reactor_tables = {table for table, _ in types if table.startswith("reactor_")}
    assert {"reactor_kv", "reactor_changes"} <= reactor_tables
    binary = {place: kind for place, kind in types.items() if "blob" in kind or "bytea" in kind}
    assert binary == {}, "a binary column could hold anything but JSON text"

    stored = raw_query(db_path, "SELECT key, value FROM reactor_kv WHERE scope = ?", ("json",))
    assert len(stored) == 2 * len(VALUES) - 1 + 4
    live = scope.list()
    for key, text in stored:
        assert canon(_strict_json(text)) == canon(live[key]), key

    log = raw_query(db_path, "SELECT old_value, new_value, ops FROM reactor_changes")
    assert len(log) == len(state.changes()) > len(stored)
    for row in log:
        texts = [text for text in row if text is not None]
        assert texts, row  # an event holds an old value, a new one, or both
        for text in texts:
            _strict_json(text)
    if not isinstance(db_path, str):  # SQLite stores by value: no row holds a blob
        for table, column in types:
            kinds = raw_query(db_path, f'SELECT DISTINCT typeof("{column}") FROM {table}')
            assert {kind for (kind,) in kinds} <= {"text", "integer", "real", "null"}


# -- private files -------------------------------------------------------------------------
@pytest.mark.sqlite_only("the database files")
def test_database_files_are_private_even_under_a_permissive_umask(tmp_path: Path) -> None:
    path = tmp_path / "open" / "state.db"
    previous = os.umask(0)
    try:
        with reactor.open(path) as state:
            state.scope("s").set("k", 1)
            modes = {
                suffix: stat.S_IMODE(Path(f"{path}{suffix}").stat().st_mode)
                for suffix in ("", "-wal", "-shm")
            }
    finally:
        os.umask(previous)
    assert modes == {"": 0o600, "-wal": 0o600, "-shm": 0o600}


# -- SQL metacharacters stay literal ---------------------------------------------------
def glob_model(pattern: str, text: str) -> bool:
    """SPEC §2's globs, restated plainly from Redis's ``stringmatchlen``, over the
    characters (code points) of both, where Redis reads bytes: ``*``, ``?`` (one
    character), ``\\`` escapes (a trailing one is itself), classes with ``^`` (or the
    ``[!`` extension), ``\\`` members, ranges of code points taken whenever two
    characters follow, ``]`` first closing an empty class, and an unterminated ``[``
    running to the end of the pattern."""
    return _match(pattern, text)


def _match(pattern: str, text: str) -> bool:  # noqa: PLR0911 - one return per rule
    if not pattern:
        return not text
    head = pattern[0]
    if head == "*":
        return any(_match(pattern[1:], text[i:]) for i in range(len(text) + 1))
    if not text:
        return False
    if head == "?":
        return _match(pattern[1:], text[1:])
    if head == "[":
        member, rest = _class(pattern[1:], text[0])
        return member and _match(rest, text[1:])
    if head == "\\" and len(pattern) > 1:
        return text[0] == pattern[1] and _match(pattern[2:], text[1:])
    return text[0] == head and _match(pattern[1:], text[1:])


def _class(body: str, char: str) -> tuple[bool, str]:
    """Whether ``char`` is in the class whose body (after ``[``) starts ``body``, and
    the pattern after the class."""
    negate = body[:1] in ("^", "!")
    i = 1 if negate else 0
    member = False
    while True:
        if i >= len(body):  # unterminated: the class takes the rest of the pattern
            rest = ""
            break
        if body[i] == "\\" and len(body) - i >= 2:
            i += 1
            member |= body[i] == char
        elif body[i] == "]":
            rest = body[i + 1 :]
            break
        elif len(body) - i >= 3 and body[i + 1] == "-":
            low, high = sorted((body[i], body[i + 2]))
            member |= low <= char <= high
            i += 2
        else:
            member |= body[i] == char
        i += 1
    return member != negate, rest


def test_the_glob_model_agrees_with_the_spec_table() -> None:
    from tests.test_keys import ALL_MATCHES

    for pattern, yes, no in ALL_MATCHES:
        assert all(glob_model(pattern, key) for key in yes), pattern
        assert not any(glob_model(pattern, key) for key in no), pattern


ALPHABET = "'\";-%_\\[]*?!^abA é/"
DROP = "x'; DROP TABLE reactor_kv; --"
CHOSEN_KEYS = [
    DROP,
    "%",
    "_",
    "%%",
    "a%",
    "a_",
    "ab",
    "a",
    "A",
    "\\",
    "\\%",
    "a\\",
    "'",
    "''",
    '"',
    ";",
    "--",
    "*",
    "?",
    "[",
    "]",
    "[]",
    "[a]",
    "a' OR '1'='1",
    "%' --",
    "_%_",
]
CHOSEN_PATTERNS = [
    "%",
    "_",
    "a%",
    "a_",
    "%*",
    "_*",
    "*%",
    "*_*",
    "\\%",
    "\\_",
    "a\\%*",
    "[%_]*",
    "[!%]",
    "[^_]*",
    "'*",
    "*'*",
    "x'*",
    "x'; DROP*",
    "*--",
    "*;*",
    '"*',
    "\\\\*",
    "\\**",
    "\\?",
    "\\[*",
    "[[]*",
    "[]]",
    "[\\]]*",
    "%' --",
    "a' OR '1'='1",
    "' OR 1=1 --",
    "*' OR '*",
]


def _population(rng: random.Random) -> list[str]:
    drawn = {"".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 6))) for _ in range(250)}
    return sorted(drawn | set(CHOSEN_KEYS))


def _patterns(rng: random.Random) -> list[str]:
    drawn = {"".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 6))) for _ in range(400)}
    return [*CHOSEN_PATTERNS, *sorted(drawn - set(CHOSEN_PATTERNS))]


def test_keys_with_sql_metacharacters_match_patterns_as_the_glob_model_says(
    state: reactor.State, db_path: Any
) -> None:
    rng = random.Random(20240611)
    keys = _population(rng)
    scopes = [DROP, "%", "_", "a"]  # scopes a LIKE would mix up
    for name in scopes:
        state.scope(name).set_many({key: [name, key] for key in keys})
    assert state.scopes() == sorted(scopes)

    scope = state.scope(DROP)
    assert scope.list() == {key: [DROP, key] for key in keys}
    assert scope.get(DROP) == [DROP, DROP]
    patterns = _patterns(rng)
    wrong = {}
    for pattern in patterns:
        expected = sorted(key for key in keys if glob_model(pattern, key))
        found = scope.keys(pattern)
        if found != expected:
            wrong[pattern] = (
                sorted(set(found) - set(expected)),
                sorted(set(expected) - set(found)),
            )
    assert wrong == {}, "(keys found that should not be, keys missed)"

    # The change log's filters are the same globs, over scope names too.
    events = state.changes()
    for pattern in patterns[:40]:
        expected = sorted(e.revision for e in events if glob_model(pattern, e.key))
        assert [e.revision for e in state.changes(key=pattern)] == expected, pattern
    for pattern in ["%", "_", "[%_]", "?", "x'*", "*--"]:
        expected = sorted(e.revision for e in events if glob_model(pattern, e.scope))
        assert [e.revision for e in state.changes(scope=pattern)] == expected, pattern

    # Every table is still there, holding what it should.
    assert raw_query(db_path, "SELECT COUNT(*) FROM reactor_kv") == [(len(scopes) * len(keys),)]
    assert raw_query(db_path, "SELECT COUNT(*) FROM reactor_changes") == [
        (len(scopes) * len(keys),)
    ]
    print(f"\n{len(keys)} keys x {len(patterns)} patterns checked against the glob model")


@pytest.mark.parametrize("pattern", ["%", "_", "a%", "\\%*", "[%_]*", "x'*", "*--", "*"])
def test_clear_removes_exactly_what_the_glob_model_says(state: reactor.State, pattern: str) -> None:
    keys = sorted(set(CHOSEN_KEYS) | {"a%b", "a_b", "axb", "a\\b", "%a", "_a"})
    scope = state.scope("clear")
    scope.set_many(dict.fromkeys(keys, 1))
    expected = {key for key in keys if glob_model(pattern, key)}
    assert scope.clear(pattern) == len(expected)
    assert scope.keys() == sorted(set(keys) - expected)
    assert state.scopes() == (["clear"] if set(keys) - expected else [])


def test_lock_and_durable_names_with_sql_metacharacters_stay_apart(state: reactor.State) -> None:
    names = ["%", "_", "a", "x'; DROP TABLE reactor_locks; --", "\\", "a%", "a_"]
    locks = [state.lock(name, ttl=30) for name in names]
    assert all(lock.acquire(blocking=False) for lock in locks)  # none held by another
    assert state.stats()["locks_held"] == len(names)
    assert [lock.token for lock in locks] == [1] * len(names)  # each counts on its own
    for lock in locks:
        lock.release()

    seen: dict[str, list[int]] = {}
    for name in ["%", "_", "a", "x'; DROP TABLE reactor_subscribers; --"]:
        seen[name] = []
        state.subscribe(lambda event, name=name: seen[name].append(event.revision), durable=name)
    state.scope("s").set("k", 1)

    def delivered() -> dict[str, int]:
        subscribers = state.stats()["durable_subscribers"]
        return {name: info["delivered"] for name, info in subscribers.items()}

    wait_for(lambda: delivered() == dict.fromkeys(seen, 1))
    assert all(revisions == [1] for revisions in seen.values())
