"""Keys, scope names and glob patterns (SPEC §2)."""

from __future__ import annotations

import time
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
    ("%", ["%"], ["a", "%%", ""]),
    ("_", ["_"], ["a"]),
    ("a%b_c", ["a%b_c"], ["axbyc", "a%%b_c"]),
    ("'", ["'"], ["''"]),
    ("a\\", ["a\\"], ["a"]),  # a trailing backslash is itself
    ("ab*[0-9]", ["ab1", "abxx9"], ["ab", "abx"]),
    ("o-*", ["o-1", "o-"], ["o", "O-1"]),
]

# The corners of Redis's stringmatchlen, each checked against redis-server 7.0.15 (and
# again by tests/test_redis_differential.py when redis-server is installed). Keys are
# non-empty: Redis and reactor both match bytes, so "é" is the two bytes c3 a9.
REDIS_CORNERS = [
    # "]" right after "[" (or "[^") closes the class: "[]" matches nothing, "[^]" any byte
    ("[]a]", [], ["]", "a", "]a]", "a]"]),
    ("[]", [], ["[]", "]", "a"]),
    ("[^]", ["a", "]", "^"], ["aa", "é"]),
    ("[!]", ["a", "!"], ["aa"]),  # reactor's extension: Redis reads [^]
    ("[^]]", ["a]", "]]"], ["]", "a"]),
    # an unterminated "[" is a class running to the end of the pattern
    ("[abc", ["a", "b", "c"], ["[abc", "[", "d"]),
    ("[", [], ["[", "a"]),
    ("x[", [], ["x[", "x", "xa"]),
    ("[^", ["a", "["], ["", "ab"]),
    ("[\\", ["\\"], ["[\\", "a"]),  # "\" last in a class is itself
    ("[\\]", ["]"], ["\\", "[\\]"]),  # "\]" escapes the "]": the class stays open
    # "-" makes a range whenever two more bytes follow the start, even "]" or "\"
    ("[a-]", ["]", "^", "_", "`", "a"], ["-", "b", "[a-]"]),
    ("[a-]x]", ["]", "a", "x"], ["-", "b", "]x]", "ax"]),
    ("[a-\\]", ["\\", "]", "a"], ["b", "-", "["]),
    ("[a-\\]]", ["\\]", "a]"], ["]", "\\", "b]"]),
    ("[-a]", ["-", "a"], ["b"]),
    ("[a-c-e]", ["a", "c", "-", "e"], ["d"]),
    ("[a--]", ["-", ".", "a", "A"], ["b", "+"]),
    # an escaped byte is a member, never the start of a range
    ("[\\a-c]", ["a", "-", "c"], ["b"]),
    ("[\\-a]", ["-", "a"], ["\\", "b"]),
    ("[x\\]]", ["x", "]"], ["\\", "x]"]),
    ("[\\!a]", ["!", "a"], ["b"]),
    # reversed ranges are swapped
    ("[z-a]", ["a", "m", "z"], ["A", "-"]),
    ("[9-0]x", ["0x", "5x"], ["ax"]),
    # negation: "^" (Redis) or "!" (reactor) right after "[" only
    ("[^a-c]", ["d", "-"], ["a", "b", "c"]),
    ("[a^]", ["a", "^"], ["b"]),
    ("[a!]", ["a", "!"], ["b"]),
    ("[^!]", ["a"], ["!"]),
    ("[!^]", ["a"], ["^"]),
    # escapes outside a class; a trailing "\" is itself
    ("\\a", ["a"], ["\\a"]),
    ("\\\\", ["\\"], ["\\\\"]),
    ("\\[a]", ["[a]"], ["a"]),
    ("a\\", ["a\\"], ["a"]),
    # stars
    ("**a**", ["a", "ba", "ab"], ["b"]),
    ("a*b*c", ["abc", "aXbYc", "abbc", "acbc"], ["acb", "ab"]),
    ("*?", ["a", "ab"], []),
    ("?*?", ["ab", "é"], ["a"]),
    # bytes, not characters: "?" and a class match one byte of "é" (c3 a9)
    ("?", ["a"], ["é", "€"]),
    ("??", ["é", "ab"], ["€", "a"]),
    ("???", ["€"], ["é"]),
    ("????", ["🚀"], ["€"]),
    ("[é]", [], ["é"]),
    ("[é][é]", ["é"], ["ée"]),
    ("é?", ["éa"], ["é", "éé"]),
    ("é*", ["é", "éé", "é€"], ["e", "èé"]),
    ("[^é]", ["a"], ["é"]),
    # a range compares bytes as signed chars (x86-64): [a-é] is [a-\xc3]\xa9], whose range
    # holds the bytes up to "a" and from c3 up, not "b"; it matches one byte, so not "é"
    ("[a-é]", ["a", "A", "!"], ["b", "z", "é", "ÿ"]),
    ("[a-é]?", ["é", "ß", "ÿ", "Ā", "a!"], ["ba", "zz", "¢"]),  # ¢ is c2 a2
    # SQL stays literal
    ("%_'", ["%_'"], ["abc", "%%'"]),
]
ALL_MATCHES = [*MATCHES, *REDIS_CORNERS]


@pytest.mark.parametrize(("pattern", "yes", "no"), ALL_MATCHES)
def test_glob_patterns_match_as_redis_keys_does(
    pattern: str, yes: list[str], no: list[str]
) -> None:
    compiled = compile_pattern(pattern)
    for key in yes:
        assert compiled.matches(key), (pattern, key)
    for key in no:
        assert not compiled.matches(key), (pattern, key)


@pytest.mark.parametrize(("pattern", "yes", "no"), ALL_MATCHES)
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


def test_an_unhashable_pattern_is_refused_as_a_bad_pattern(state: reactor.State) -> None:
    with pytest.raises(reactor.InvalidKeyError):
        state.scope("s").keys(["a*"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pattern", "prefix", "exact"),
    [
        ("order-1", "order-1", True),
        ("o\\*1", "o*1", True),
        ("o-*", "o-", False),
        ("é?", "é", False),
        ("\\é*", "é", False),  # the escape takes the first byte of é, the rest follows
        ("a\ud800*", "a", False),  # a lone surrogate (no key holds one) ends the prefix
        ("a\ud800", "a", False),
        ("[a]b", "", False),
        ("*", "", False),
    ],
)
def test_the_literal_prefix_is_whole_characters(pattern: str, prefix: str, exact: bool) -> None:
    compiled = compile_pattern(pattern)
    assert (compiled.prefix, compiled.exact) == (prefix, exact)
    assert (compiled.bounds() or ("",))[0] == prefix


def test_a_pattern_with_a_lone_surrogate_matches_no_key(state: reactor.State) -> None:
    scope = state.scope("s")
    scope.set_many({"a": 1, "ab": 2, "a\ufffd": 3})
    assert scope.keys("a\ud800*") == []
    assert scope.keys("a*") == ["a", "ab", "a\ufffd"]


def test_abusive_patterns_match_in_linear_time() -> None:
    key = "a" * 1024
    for pattern in ["*a*a*a*a*a*a*a*b", "*a?*a[a-b]*a*" * 40 + "b", "*" + "?*" * 500 + "b"]:
        compiled = compile_pattern(pattern)
        started = time.perf_counter()
        for _ in range(10):
            assert not compiled.matches(key)
        # Under a millisecond; backtracking would take far longer than the margin
        # left for a stall of a loaded machine.
        assert time.perf_counter() - started < 2, pattern
