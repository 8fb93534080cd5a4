"""Keys, scope names and glob patterns (SPEC §2)."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

import reactor
from reactor._engine import engine_of
from reactor._keys import compile_pattern
from tests.conftest import FakeClock, wait_for

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


# -- names at the limit: 1,024 characters of any Unicode, on every backend ---------------
# Each kind of name is stored and indexed whole: a key, a scope, a queue, an idempotency
# key, a lock, a durable subscriber, a timer's scope and key. The random names are
# incompressible (PostgreSQL compresses a long index entry before it measures it, so a
# name of one repeated emoji fits where 1,024 different ones, 4 KB, did not).
def _random_name(low: int, high: int, seed: int, length: int = 1024) -> str:
    rng = random.Random(seed)
    return "".join(chr(rng.randrange(low, high)) for _ in range(length))


def _names(kind: str, seed: int) -> str:
    """A name of 1,024 characters: one emoji repeated, 4-byte characters, or CJK."""
    if kind == "emoji":
        return chr(0x1F600 + seed) * 1024
    if kind == "astral":  # 4 bytes each in UTF-8: 4 KB
        return _random_name(0x10000, 0x110000, seed)
    return _random_name(0x4E00, 0xA000, seed)  # CJK: 3 bytes each


LONG = ["emoji", "astral", "cjk"]


@pytest.mark.parametrize("kind", LONG)
def test_keys_and_scope_names_of_1024_characters_work_everywhere(
    state: reactor.State, kind: str
) -> None:
    name, key = _names(kind, 1), _names(kind, 2)
    scope = state.scope(name)
    scope.set(key, 1)
    scope.set("short", 2)
    assert scope.get(key) == 1
    assert scope.exists(key)
    assert scope.increment(key) == 2
    entry = scope.entry(key)
    assert entry is not None
    assert (entry.value, entry.version) == (2, 2)
    assert scope.get_many([key, "short", "absent"]) == {key: 2, "short": 2}
    assert scope.keys() == sorted([key, "short"])
    assert scope.keys(key[:300] + "*") == [key]  # a prefix longer than the index's
    assert scope.keys(key[:100] + "*") == [key]
    assert scope.keys(key) == [key]
    assert scope.list() == {key: 2, "short": 2}
    assert scope.snapshot().values == {key: 2, "short": 2}
    assert [e.new_value for e in scope.history(key)] == [1, 2]
    assert scope.get(key, at_revision=entry.created_revision) == 1
    assert state.scopes() == [name]
    assert [e.key for e in state.changes(scope=name, key=key)] == [key, key]
    with state.transaction(name) as tx:
        assert tx[name].get(key) == 2
        tx[name].set(key, 3)
    assert scope.get(key) == 3
    assert scope.delete(key)
    assert scope.get(key) is None
    scope.set_many({key: 4, key[:-1]: 5})
    assert scope.clear(key[:500] + "*") == 2
    assert scope.keys() == ["short"]


def test_a_scope_and_a_key_of_1024_four_byte_characters_each(state: reactor.State) -> None:
    name, key = _names("astral", 3), _names("astral", 4)  # 8 KB of names together
    scope = state.scope(name)
    scope.set(key, {"a": 1})
    scope.update(key, [reactor.ops.increment("a", 1)])
    assert scope.get(key) == {"a": 2}
    assert scope.keys(key[:1000] + "*") == [key]
    assert [e.type for e in scope.history(key)] == ["created", "updated"]
    assert scope.delete(key)
    assert scope.keys() == []


def test_long_keys_that_share_a_long_prefix_stay_apart_and_in_order(
    state: reactor.State,
) -> None:
    prefix = _names("astral", 5)[:600]
    keys = [prefix + tail for tail in ["b", "a", "c" * 424, "ab", ""]]
    scope = state.scope("s")
    for i, key in enumerate(keys):
        scope.set(key, i)
    assert scope.keys() == sorted(keys)
    assert scope.keys(prefix + "a*") == [prefix + "a", prefix + "ab"]
    assert scope.keys(prefix + "?") == [prefix + "a", prefix + "b"]
    assert scope.list() == {key: i for i, key in enumerate(keys)}
    assert scope.get(prefix + "a") == 1
    assert scope.get(prefix + "d") is None


@pytest.mark.parametrize("kind", LONG)
def test_queue_names_and_idempotency_keys_at_the_limit(state: reactor.State, kind: str) -> None:
    name, key = _names(kind, 6)[:1018], _names(kind, 7)  # "queue:" + name is a scope
    queue = state.queue(name)
    first = queue.put({"n": 1}, key=key)
    assert queue.put({"n": 2}, key=key) == first  # the same key: the same job
    other = queue.put({"n": 3}, key=key[:-1])
    assert other != first
    assert name in state.queues()
    job = queue.take(timeout=0)
    assert job is not None
    assert (job.id, job.item) == (first, {"n": 1})
    job.ack()
    job = queue.take(timeout=0)
    assert job is not None
    assert job.id == other
    job.nack()
    assert queue.stats() == {"ready": 1, "delayed": 0, "taken": 0, "dead": 0}
    assert [e.key for e in state.changes(scope="queue:" + name)][:1] == [str(first)]


@pytest.mark.parametrize("kind", LONG)
def test_lock_names_at_the_limit(state: reactor.State, kind: str) -> None:
    name = _names(kind, 8)
    lock = state.lock(name, ttl=30)
    assert lock.acquire(blocking=False)
    assert not state.lock(name, ttl=30).acquire(blocking=False)
    assert state.lock(name[:-1], ttl=30).acquire(blocking=False)  # another name
    lock.extend(30)
    first = lock.token
    lock.release()
    with state.lock(name, ttl=30, timeout=5) as again:
        assert again.token is not None
        assert first is not None
        assert again.token > first


@pytest.mark.parametrize("kind", LONG)
def test_durable_subscriber_names_at_the_limit(db_path: Any, kind: str) -> None:
    name = _names(kind, 9)
    with reactor.open(db_path) as state:
        seen: list[str] = []

        def record(event: reactor.ChangeEvent) -> None:
            if event.key == "poison":
                raise ValueError("cannot take this")
            seen.append(event.key)

        state.subscribe(record, durable=name, since=0, max_retries=0)
        state.subscribe(lambda _: None, durable=name[:-1], since=0)
        state.scope("s").set("poison", 1)
        state.scope("s").set("a", 1)
        wait_for(lambda: seen == ["a"])
        wait_for(lambda: state.stats()["durable_subscribers"][name]["position"] == 2)
        assert state.stats()["durable_subscribers"][name]["failed"] == 1
    with reactor.open(db_path) as state:
        state.scope("s").set("b", 1)
        resumed: list[str] = []
        state.subscribe(lambda e: resumed.append(e.key), durable=name)
        wait_for(lambda: resumed == ["b"])


@pytest.mark.parametrize("kind", LONG)
def test_timers_of_long_scopes_and_keys(state: reactor.State, clock: FakeClock, kind: str) -> None:
    name, key = _names(kind, 10), _names(kind, 11)
    scope = state.scope(name)
    timer = scope.schedule(key, 1, after=10)
    dropped = scope.schedule(key[:-1], 2, after=10)
    assert state.timers(scope=name) == [timer, dropped] or state.timers(scope=name) == [
        dropped,
        timer,
    ]
    assert state.cancel_timer(dropped.id)
    clock.advance(11)
    engine_of(state).sweeper.fire_timers()
    wait_for(lambda: scope.get(key) == 1)
    assert scope.keys() == [key]
    assert [e.timer for e in scope.history(key)] == [timer.id]


def test_names_of_1025_characters_are_refused(state: reactor.State) -> None:
    long = "😀" * 1025
    refusals = [
        lambda: state.scope(long),
        lambda: state.scope("s").set(long, 1),
        lambda: state.queue(long[:1019]),
        lambda: state.queue("q").put(1, key=long),
        lambda: state.lock(long, ttl=30),
        lambda: state.subscribe(lambda _: None, durable=long),
        lambda: state.scope("s").schedule(long, 1, after=10),
    ]
    for refused in refusals:
        with pytest.raises(reactor.InvalidKeyError):
            refused()
    assert state.scopes() == []
    assert state.queues() == []


def test_long_keys_that_differ_only_in_backslashes_and_digits_stay_apart(
    state: reactor.State,
) -> None:
    # Escapes that a careless conversion of text to bytes would read: "\101" is "A".
    prefix = "p" * 300
    keys = [prefix + tail for tail in ["A", "\\101", "\\\\101", "\\x41", "\\"]]
    scope = state.scope("s")
    for i, key in enumerate(keys):
        scope.set(key, i)
    assert scope.list() == {key: i for i, key in enumerate(keys)}
    assert scope.get_many(keys) == {key: i for i, key in enumerate(keys)}
    assert scope.keys(prefix + "\\\\*") == sorted(keys[1:])
