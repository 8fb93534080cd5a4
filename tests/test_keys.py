"""Keys, scope names and glob patterns (SPEC §2)."""

from __future__ import annotations

from typing import Any

import pytest

import reactor
from reactor._keys import compile_pattern

BAD_KEYS = {
    "empty": "",
    "too long": "k" * 1025,
    "int": 1,
    "none": None,
    "bytes": b"k",
    "tuple": ("k",),
    "nul": "a\x00b",
    "lone surrogate": "a\ud800",
}


@pytest.mark.parametrize("key", BAD_KEYS.values(), ids=BAD_KEYS.keys())
def test_bad_keys_are_refused_by_every_verb(state: reactor.State, key: Any) -> None:
    scope = state.scope("s")
    verbs = [
        lambda: scope.set(key, 1),
        lambda: scope.get(key),
        lambda: scope.get_many([key]),
        lambda: scope.set_many({"ok": 1, key: 2}),
        lambda: scope.exists(key),
        lambda: scope.delete(key),
        lambda: scope.ttl(key),
        lambda: scope.expire(key, 10),
        lambda: scope.increment(key),
        lambda: scope.decrement(key),
        lambda: scope.append(key, "x"),
        lambda: scope.compare_and_swap(key, reactor.MISSING, 1),
        lambda: scope.push(key, 1),
        lambda: scope.pop(key),
        lambda: scope.length(key),
    ]
    for verb in verbs:
        with pytest.raises(reactor.InvalidKeyError):
            verb()
    with pytest.raises(reactor.InvalidKeyError):
        state.scope(key)
    assert state.scopes() == []


def test_keys_may_hold_any_unicode_and_sql_metacharacters(state: reactor.State) -> None:
    scope = state.scope("weird 'scope'; DROP TABLE reactor_kv; --")
    keys = ["*", "%", "_", "'", '"', "\\", "/", ":", ".", "a.b", "ünïcödé", "🚀", "k" * 1024, " "]
    for i, key in enumerate(keys):
        scope.set(key, i)
    assert scope.list() == {key: i for i, key in enumerate(keys)}
    assert state.scopes() == [scope.name]


MATCHES = [
    ("*", ["", "a", "abc"], []),
    ("a*", ["a", "abc", "a*"], ["b", "A", "ba"]),
    ("*c", ["c", "abc"], ["ca", "C"]),
    ("a?c", ["abc", "a.c", "a*c"], ["ac", "abbc", "ABC"]),
    ("[abc]x", ["ax", "bx", "cx"], ["dx", "x", "Ax"]),
    ("[a-c]", ["a", "b", "c"], ["d", "-"]),
    ("[c-a]", ["a", "b", "c"], ["d"]),
    ("[!a]", ["b", "-"], ["a", ""]),
    ("[^a]", ["b"], ["a"]),
    ("\\*", ["*"], ["a", "\\*"]),
    ("a\\?", ["a?"], ["ab"]),
    ("[\\]]", ["]"], ["\\"]),
    ("[]a]", ["]", "a"], ["b"]),
    ("%", ["%"], ["a", "%%", ""]),
    ("_", ["_"], ["a"]),
    ("a%b_c", ["a%b_c"], ["axbyc", "a%%b_c"]),
    ("'", ["'"], ["''"]),
    ("[abc", ["[abc"], ["a"]),  # an unclosed class is literal text
    ("a\\", ["a\\"], ["a"]),  # a trailing backslash is itself
    ("ab*[0-9]", ["ab1", "abxx9"], ["ab", "abx"]),
    ("o-*", ["o-1", "o-"], ["o", "O-1"]),
]


@pytest.mark.parametrize(("pattern", "yes", "no"), MATCHES)
def test_glob_patterns_match_as_redis_keys_does(
    pattern: str, yes: list[str], no: list[str]
) -> None:
    compiled = compile_pattern(pattern)
    for key in yes:
        assert compiled.matches(key), (pattern, key)
    for key in no:
        assert not compiled.matches(key), (pattern, key)


@pytest.mark.parametrize(("pattern", "yes", "no"), MATCHES)
def test_keys_and_clear_use_glob_patterns(
    state: reactor.State, pattern: str, yes: list[str], no: list[str]
) -> None:
    scope = state.scope("s")
    present = [key for key in [*yes, *no] if key]
    for key in present:
        scope.set(key, 1)
    expected = sorted(key for key in yes if key)
    assert scope.keys(pattern) == expected
    assert scope.clear(pattern) == len(expected)
    assert scope.keys() == sorted(set(present) - set(expected))


def test_pattern_prefix_bounds_work_at_the_top_of_unicode(state: reactor.State) -> None:
    scope = state.scope("s")
    top = "\U0010ffff"
    for key in [top, top + "a", "a" + top, "\ud7ff", "\ue000"]:
        scope.set(key, 1)
    assert scope.keys(top + "*") == [top, top + "a"]
    assert scope.keys("\ud7ff*") == ["\ud7ff"]
    assert scope.keys("a*") == ["a" + top]


def test_patterns_are_case_sensitive(state: reactor.State) -> None:
    scope = state.scope("s")
    for key in ["Order", "order", "ORDER"]:
        scope.set(key, 1)
    assert scope.keys("order*") == ["order"]
    assert scope.keys("O*") == ["ORDER", "Order"]


def test_bad_patterns_are_refused(state: reactor.State) -> None:
    with pytest.raises(reactor.InvalidKeyError):
        state.scope("s").keys("")
    with pytest.raises(reactor.InvalidKeyError):
        state.scope("s").clear(None)  # type: ignore[arg-type]
