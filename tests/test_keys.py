"""Keys, scope names and glob patterns (SPEC §2)."""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import strategies as st

import reactor
import reactor.aio
from reactor.testing import ManualClock, run_upkeep
from tests.conftest import wait_for

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


# -- the scopes of reactor's own events: queue:NAME, run:WORKFLOW (SPEC §2) ------------
RESERVED = ["queue:x", "run:x", "queue:", "run:", "queue:queue:x", "run:orders/o-1"]
# Only the exact prefixes: not a look-alike, another case, or the word elsewhere.
NOT_RESERVED = ["queue", "run", "queues:x", "Queue:x", "RUN:x", " queue:x", "x:queue:", "runs:x"]
WHY = "scope names beginning with 'queue:' or 'run:' are reserved for the events of queues"
READ_VERBS = {"entry", "exists", "get", "get_many", "history", "keys", "length", "list", "name"}
READ_VERBS |= {"snapshot", "ttl", "wait_for"}


def write_verbs(scope: Any) -> dict[str, Callable[[], Any]]:
    """A call of every write verb of ``scope`` (a ``Scope``, a ``Transaction`` or an
    ``AsyncScope``), with arguments it takes on any other scope."""
    return {
        "set": lambda: scope.set("k", 1),
        "set_many": lambda: scope.set_many({"k": 1}),
        "update": lambda: scope.update("k", [reactor.ops.increment("n", 1)]),
        "delete": lambda: scope.delete("k"),
        "clear": scope.clear,
        "expire": lambda: scope.expire("k", 10),
        "increment": lambda: scope.increment("k"),
        "decrement": lambda: scope.decrement("k"),
        "append": lambda: scope.append("k", "x"),
        "compare_and_swap": lambda: scope.compare_and_swap("k", reactor.MISSING, 1),
        "push": lambda: scope.push("k", 1),
        "pop": lambda: scope.pop("k"),
        "schedule": lambda: scope.schedule("k", 1, after=10),
        "transaction": scope.transaction,
    }


def test_every_verb_is_a_read_or_a_write_refused_on_a_scope_of_events(
    state: reactor.State,
) -> None:
    verbs = {name for name in dir(reactor.Scope) if not name.startswith("_")}
    assert verbs - READ_VERBS == set(write_verbs(state.scope("s")))
    assert {name for name in dir(reactor.aio.AsyncScope) if not name.startswith("_")} == verbs


def assert_untouched(state: reactor.State) -> None:
    assert state.changes() == []
    assert state.scopes() == []
    assert state.timers() == []


@pytest.mark.parametrize("name", RESERVED)
def test_writes_to_a_scope_of_events_are_refused(state: reactor.State, name: str) -> None:
    scope = state.scope(name)  # the handle exists: its reads show the events
    writes = write_verbs(scope)
    writes["set_many of nothing"] = lambda: scope.set_many({})
    writes["set with a bad value"] = lambda: scope.set("k", float("nan"))  # refused first
    writes["several scopes"] = lambda: state.transaction("orders", name)
    writes["one scope"] = lambda: state.transaction(name)
    for verb, write in writes.items():
        with pytest.raises(reactor.InvalidKeyError, match=WHY):
            write()
            pytest.fail(f"{verb} wrote to {name!r}")
    # Nor through another scope's transaction.
    with state.transaction("orders") as tx, pytest.raises(reactor.InvalidKeyError, match=WHY):
        tx[name]
    assert_untouched(state)
    assert scope.get("k") is None
    assert scope.keys() == []
    assert scope.list() == {}
    assert scope.history("k") == []
    assert not scope.exists("k")
    assert scope.ttl("k") == -2
    assert scope.snapshot().values == {}


@pytest.mark.parametrize("name", NOT_RESERVED)
def test_only_the_exact_prefixes_are_reserved(state: reactor.State, name: str) -> None:
    scope = state.scope(name)
    scope.set("k", 1)
    with scope.transaction() as tx:
        tx.increment("k")
    with state.transaction(name, "orders") as tx:
        tx[name].push("list", 1)
    assert scope.list() == {"k": 2, "list": [1]}


@pytest.mark.parametrize("name", ["queue:x", "run:x"])
async def test_async_writes_to_a_scope_of_events_are_refused(db_path: Any, name: str) -> None:
    async with reactor.aio.open(db_path) as state:
        scope = state.scope(name)
        writes = write_verbs(scope)
        writes["set_many of nothing"] = lambda: scope.set_many({})
        writes["several scopes"] = lambda: state.transaction("orders", name)
        for verb, write in writes.items():
            with pytest.raises(reactor.InvalidKeyError, match=WHY):
                called = write()
                if inspect.isawaitable(called):
                    await called
                pytest.fail(f"{verb} wrote to {name!r}")
        assert await scope.get("k") is None
        assert await scope.list() == {}
        assert await state.changes() == []
        assert await state.timers() == []


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
# again by tests/test_redis_differential.py when redis-server is installed). ASCII only,
# where Redis's bytes and reactor's characters agree; keys are non-empty.
REDIS_CORNERS = [
    # "]" right after "[" (or "[^") closes the class: "[]" matches nothing, "[^]" any byte
    ("[]a]", [], ["]", "a", "]a]", "a]"]),
    ("[]", [], ["[]", "]", "a"]),
    ("[^]", ["a", "]", "^"], ["aa"]),
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
    ("?*?", ["ab", "abc"], ["a"]),
    # SQL stays literal
    ("%_'", ["%_'"], ["abc", "%%'"]),
]

# Characters, not bytes (SPEC §2): "?" and a class match one code point, where Redis
# would match one byte of its UTF-8 form. No normalization: "e\u0301" (e and a
# combining acute accent) is two characters, and not the one of "é".
CHARACTERS = [
    ("?", ["a", "é", "ÿ", "€", "日", "😀", "\U0010ffff"], ["ab", "e\u0301", "日本"]),
    ("??", ["ab", "e\u0301", "日本", "😀a", "😀😀"], ["é", "€", "😀", "a"]),
    ("???", ["日本語", "abc"], ["€", "😀", "日本"]),
    ("?*?", ["ab", "é😀", "e\u0301"], ["é", "😀"]),
    ("e?", ["e\u0301", "ee"], ["é", "e"]),
    ("é", ["é"], ["e\u0301", "e"]),
    ("é?", ["éa", "éé"], ["é", "éab"]),
    ("é*", ["é", "éé", "é€"], ["e", "èé", "e\u0301"]),
    ("*日*", ["日", "日本", "今日は"], ["本"]),
    ("?本", ["日本"], ["本", "日日本"]),
    ("😀?", ["😀a", "😀😀"], ["😀", "a😀"]),
    # classes hold code points; a range holds every code point between its ends
    ("[é]", ["é"], ["e", "e\u0301", "éé"]),
    ("[é][é]", ["éé"], ["é"]),
    ("[éa]x", ["éx", "ax"], ["ex", "x"]),
    ("[日本]", ["日", "本"], ["日本", "語"]),
    ("[😀]", ["😀"], ["😁", "a"]),
    ("[β-ω]", ["β", "λ", "ω"], ["b", "ά", "Ω", "ϊ"]),  # U+03B2 to U+03C9
    ("[ω-β]", ["β", "λ", "ω"], ["Ω", "ϊ"]),  # reversed ends are swapped, as in Redis
    ("[a-é]", ["a", "b", "z", "ß", "é"], ["A", "!", "ê", "ÿ", "Ā"]),  # U+0061 to U+00E9
    ("[😀-😂]", ["😀", "😁", "😂"], ["😃", "a", "😀😀"]),
    ("[0-9β-ω]", ["5", "λ"], ["a", "Ω"]),
    ("[-β]", ["-", "β"], ["λ"]),
    ("[β-]", ["β", "]", "a", "é"], ["-", "ω"]),  # the range from "]" to "β", left open
    ("[β-]x]", ["]", "β", "x", "^", "Ā"], ["-", "]x]"]),
    # negated classes match any other character, a non-ASCII one included
    ("[^é]", ["a", "e", "€", "😀"], ["é", "aé"]),
    ("[!é]", ["a", "😀"], ["é"]),
    ("[^a]", ["é", "日", "😀"], ["a", "éé"]),
    ("[^β-ω]", ["a", "Ω", "😀"], ["β", "λ", "ω"]),
    ("[^]", ["é", "😀"], ["éé"]),
    ("x[^a]y", ["x日y", "xéy"], ["xay", "xe\u0301y"]),
    # escapes of non-ASCII characters, outside a class and inside one
    ("\\é", ["é"], ["\\é", "e"]),
    ("\\😀*", ["😀", "😀a"], ["a😀"]),
    ("[\\é]", ["é"], ["\\"]),
    ("[\\日-]", ["日", "-"], ["本", "\\"]),  # an escaped character never starts a range
    ("[é\\]]", ["é", "]"], ["\\", "é]"]),
    ("é\\", ["é\\"], ["é"]),  # a trailing backslash is itself
]
ALL_MATCHES = [*MATCHES, *REDIS_CORNERS, *CHARACTERS]


def test_the_redis_corner_table_is_ascii() -> None:
    # tests/test_redis_differential.py asks Redis about these: bytes and characters
    # agree on ASCII only.
    for pattern, yes, no in [*MATCHES, *REDIS_CORNERS]:
        assert all(text.isascii() for text in [pattern, *yes, *no]), pattern


def reference_match(pattern: str, key: str) -> bool:
    """Redis's ``stringmatchlen`` (7.0.15 with its security fixes), line for line, on the
    characters of ``pattern`` and ``key`` where Redis reads bytes, and with ``[!`` read
    as ``[^``: SPEC §2's patterns, written without the compiler under test.

    Exponential on some patterns (as the C is but for its guards): for short inputs.
    An empty key matches nothing here, as in Redis; reactor keys are never empty.
    """
    end = len(pattern)
    gave_up = False  # Redis's skipLongerMatches

    def match(p: int, s: int, nesting: int) -> bool:  # noqa: PLR0911, PLR0912 - as the C
        nonlocal gave_up
        if nesting > 1000:  # CVE-2024-31228
            return False
        while p < end and s < len(key):
            char = pattern[p]
            if char == "*":
                while p + 1 < end and pattern[p + 1] == "*":
                    p += 1
                if p + 1 == end:
                    return True
                while s < len(key):
                    if match(p + 1, s, nesting + 1):
                        return True
                    if gave_up:
                        return False
                    s += 1
                gave_up = True
                return False
            if char == "[":
                found, p = _reference_class(pattern, p + 1, key[s])
                if not found:
                    return False
            elif char != "?":
                if char == "\\" and end - p >= 2:
                    p += 1
                if pattern[p] != key[s]:
                    return False
            s += 1
            p += 1
            if s == len(key):
                while p < end and pattern[p] == "*":
                    p += 1
                break
        return p == end and s == len(key)

    return match(0, 0, 0)


def _reference_class(pattern: str, p: int, char: str) -> tuple[bool, int]:
    """Whether ``char`` is in the class whose body starts at ``p``, and the index of the
    class's last character (its ``]``, or the pattern's last character)."""
    end = len(pattern)
    negate = p < end and pattern[p] in "^!"
    if negate:
        p += 1
    found = False
    while True:
        if p < end and pattern[p] == "\\" and end - p >= 2:
            p += 1
            found = found or pattern[p] == char
        elif p < end and pattern[p] == "]":
            break
        elif p == end:  # unterminated: the class ends with the pattern
            p -= 1
            break
        elif end - p >= 3 and pattern[p + 1] == "-":
            low, high = sorted((pattern[p], pattern[p + 2]))
            p += 2
            found = found or low <= char <= high
        else:
            found = found or pattern[p] == char
        p += 1
    return found != negate, p


def test_the_reference_agrees_with_the_tables() -> None:
    for pattern, yes, no in ALL_MATCHES:
        assert all(reference_match(pattern, key) for key in yes if key), pattern
        assert not any(reference_match(pattern, key) for key in no), pattern


# Every character a pattern reads specially, and a few plain ones; then characters of
# two, three and four UTF-8 bytes, a combining accent, and range ends on both sides.
ASCII_GLOB_ALPHABET = ["a", "b", "c", "z", "-", "^", "!", "[", "]", "\\", "*", "?"]
ASCII_KEY_ALPHABET = ["a", "b", "c", "z", "A", "-", "^", "!", "[", "]", "\\", "*", "?"]
NON_ASCII = ["é", "e", "\u0301", "ÿ", "Ā", "β", "λ", "ω", "€", "日", "😀", "😂"]
GLOB_ALPHABET = [*ASCII_GLOB_ALPHABET, *NON_ASCII]
KEY_ALPHABET = [*ASCII_KEY_ALPHABET, *NON_ASCII]


def globs(alphabet: list[str]) -> st.SearchStrategy[str]:
    return st.text(st.sampled_from(alphabet), min_size=1, max_size=10)


def keys(alphabet: list[str]) -> st.SearchStrategy[str]:
    return st.text(st.sampled_from(alphabet), min_size=1, max_size=6)


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


NEAR_NON_ASCII_PREFIXES = [
    *("e", "ez", "e\u0301", "é", "éa", "éz", "é😀", "é\U0010ffff", "ê", "êa", "f"),
    *("日", "日本", "日本語", "日本\U0010ffff", "日札", "日杭", "本"),
    *("😀", "😀a", "😁", "\U0010ffff", "\U0010ffffa"),
]


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
    assert queue.stats() == {
        "ready": 1,
        "delayed": 0,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
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
def test_timers_of_long_scopes_and_keys(
    state: reactor.State, clock: ManualClock, kind: str
) -> None:
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
    run_upkeep(state)
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
