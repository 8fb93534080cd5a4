"""reactor against a live Redis: glob patterns (SPEC §2) and the verbs both share (§3).

A module fixture starts a private ``redis-server`` on a free loopback port, with no
persistence, and stops it at the end; the module skips when ``redis-server`` is not
installed. Hypothesis generates the inputs; every difference the spec defines is mapped
explicitly below, with a comment saying which sentence of the spec it comes from.
"""

from __future__ import annotations

import itertools
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

import reactor
from tests.test_internals import glob_matches
from tests.test_keys import reference_match

redis = pytest.importorskip("redis")

REDIS_SERVER = shutil.which("redis-server")
STARTUP_TIMEOUT = 10.0

pytestmark = pytest.mark.skipif(
    REDIS_SERVER is None, reason="redis-server is not installed (the reference for KEYS)"
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def redis_client() -> Iterator[Any]:
    """A client of a private redis-server, stopped (by its PID) after the module."""
    assert REDIS_SERVER is not None
    for _attempt in range(3):  # another process may take the free port first
        port = _free_port()
        server = subprocess.Popen(
            [
                *(REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--daemonize", "no"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while server.poll() is None and time.monotonic() < deadline:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            client.close()
            server.terminate()
            server.wait(timeout=STARTUP_TIMEOUT)
            continue
        try:
            yield client
        finally:
            client.close()
            server.terminate()
            try:
                server.wait(timeout=STARTUP_TIMEOUT)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=STARTUP_TIMEOUT)
        return
    pytest.fail(f"redis-server did not answer within {STARTUP_TIMEOUT} s, three times")


_scope_names = (f"s{n}" for n in itertools.count())


def fresh(state: reactor.State, client: Any) -> reactor.Scope:
    """An empty scope, and an empty Redis database: one pair per hypothesis example."""
    client.flushdb()
    return state.scope(next(_scope_names))


# Hypothesis runs several examples on one function-scoped database: each takes a fresh
# scope (and flushes Redis), so nothing carries over between examples.
EXAMPLES = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
MANY_EXAMPLES = settings(EXAMPLES, max_examples=3000)
VERB_EXAMPLES = settings(EXAMPLES, max_examples=200)


# ---------------------------------------------------------------------------------------
# Glob patterns

# Every character Redis reads specially and a few plain ones; then characters of two,
# three and four UTF-8 bytes, a combining accent and range ends on both sides of them.
ASCII_ALPHABET = ["a", "b", "c", "z", "-", "^", "!", "[", "]", "\\", "*", "?"]
NON_ASCII = ["é", "e", "\u0301", "ÿ", "Ā", "λ", "ω", "€", "日", "🚀", "😀"]
ALPHABET = [*ASCII_ALPHABET, *NON_ASCII]

ascii_patterns = st.text(st.sampled_from(ASCII_ALPHABET), min_size=1, max_size=10)
ascii_key_sets = st.sets(
    st.text(st.sampled_from(ASCII_ALPHABET), min_size=1, max_size=5), max_size=12
)
patterns = st.text(st.sampled_from(ALPHABET), min_size=1, max_size=10)
key_sets = st.sets(st.text(st.sampled_from(ALPHABET), min_size=1, max_size=5), max_size=12)


def redis_equivalent(pattern: str) -> bytes:
    """The pattern Redis must be asked for the same answer: ``[!`` opening a class is
    reactor's extension (SPEC §2: "[!a] negates like [^a]"), so it becomes ``[^``.

    The class is skipped as Redis reads it, so a ``[!`` inside a class or after a ``\\``
    stays as it is.
    """
    data = pattern.encode()
    out = bytearray()
    i, n = 0, len(data)
    while i < n:
        if data[i : i + 1] == b"\\" and i + 1 < n:
            out += data[i : i + 2]
            i += 2
        elif data[i : i + 1] == b"[":
            out += b"["
            i += 1
            if data[i : i + 1] in (b"!", b"^"):
                out += b"^"
                i += 1
            while i < n:
                if data[i : i + 1] == b"\\" and i + 1 < n:
                    step = 2
                elif data[i : i + 1] == b"]":
                    out += b"]"
                    i += 1
                    break
                elif i + 2 < n and data[i + 1 : i + 2] == b"-":
                    step = 3
                else:
                    step = 1
                out += data[i : i + step]
                i += step
        else:
            out += data[i : i + 1]
            i += 1
    return bytes(out)


def test_redis_equivalent_only_rewrites_class_openers() -> None:
    assert redis_equivalent("[!a]") == b"[^a]"
    assert redis_equivalent("\\[!a]") == b"\\[!a]"
    assert redis_equivalent("[a[!]x") == b"[a[!]x"
    assert redis_equivalent("[^!]") == b"[^!]"
    assert redis_equivalent("[]![!a]") == b"[]![^a]"


def expected_matches(client: Any, keys: set[str], glob: str) -> list[str]:
    """The keys ``glob`` matches, sorted.

    SPEC §2: a pattern works on characters where Redis works on bytes, and on ASCII the
    two agree exactly. So Redis answers for an ASCII glob on the ASCII keys; elsewhere
    (a non-ASCII glob, or a non-ASCII key) it would match bytes and is not asked: the
    reference matcher of tests/test_keys.py answers, checked here against Redis on every
    ASCII key of a short glob (it recurses once for each star).
    """
    short = len(glob) <= 100
    by_reference = {key for key in keys if short and reference_match(glob, key)}
    if not glob.isascii():
        assert short, glob
        note_event("glob: reference only")
        return sorted(by_reference)
    ascii_keys = {key for key in keys if key.isascii()}
    by_redis = {key.decode() for key in client.keys(redis_equivalent(glob))} & ascii_keys
    if short:
        assert by_reference & ascii_keys == by_redis, glob
    else:
        assert ascii_keys == keys, glob
    note_event("glob: Redis" if ascii_keys == keys else "glob: Redis and the reference")
    return sorted(by_redis | (by_reference - ascii_keys))


def note_event(text: str) -> None:
    """Counted by --hypothesis-show-statistics; the table tests run outside hypothesis."""
    if currently_in_test_context():
        event(text)


def check_globs(state: reactor.State, client: Any, keys: set[str], globs: list[str]) -> None:
    scope = fresh(state, client)
    for key in keys:
        scope.set(key, 1)
        client.set(key.encode(), b"1")
    for glob in globs:
        expected = expected_matches(client, keys, glob)
        assert sorted(k for k in keys if glob_matches(glob, k)) == expected, glob
        assert scope.keys(glob) == expected, glob
    # clear: Redis has no such verb; its count is that of the keys the glob matches.
    glob = globs[0]
    doomed = expected_matches(client, keys, glob)
    assert scope.clear(glob) == len(doomed), glob
    if doomed:
        client.delete(*(key.encode() for key in doomed))
    assert scope.keys() == sorted(k.decode() for k in client.keys(b"*"))


@EXAMPLES
@given(keys=ascii_key_sets, globs=st.lists(ascii_patterns, min_size=1, max_size=6))
def test_globs_match_what_redis_keys_lists(
    state: reactor.State, redis_client: Any, keys: set[str], globs: list[str]
) -> None:
    check_globs(state, redis_client, keys, globs)


@EXAMPLES
@given(keys=key_sets, globs=st.lists(patterns, min_size=1, max_size=6))
def test_globs_match_on_characters(
    state: reactor.State, redis_client: Any, keys: set[str], globs: list[str]
) -> None:
    check_globs(state, redis_client, keys, globs)


@pytest.mark.slow
@MANY_EXAMPLES
@given(keys=ascii_key_sets, globs=st.lists(ascii_patterns, min_size=1, max_size=6))
def test_globs_match_what_redis_keys_lists_at_length(
    state: reactor.State, redis_client: Any, keys: set[str], globs: list[str]
) -> None:
    check_globs(state, redis_client, keys, globs)


@pytest.mark.slow
@MANY_EXAMPLES
@given(keys=key_sets, globs=st.lists(patterns, min_size=1, max_size=6))
def test_globs_match_on_characters_at_length(
    state: reactor.State, redis_client: Any, keys: set[str], globs: list[str]
) -> None:
    check_globs(state, redis_client, keys, globs)


def key_and_derived_glob(alphabet: list[str], range_end: str) -> st.SearchStrategy[tuple[str, str]]:
    """A key, and a glob made from it by swapping some characters for wildcards,
    classes and escapes, so that most globs match something."""

    @st.composite
    def draw_pair(draw: st.DrawFn) -> tuple[str, str]:
        key = draw(st.text(st.sampled_from(alphabet), min_size=1, max_size=8))
        wildcards = ["?", "*", "\\{}", "[{}]", "[!{}]", "[a-{}]", "[{}-" + range_end + "]"]
        parts = [draw(st.sampled_from([char, char, *wildcards])).format(char) for char in key]
        return key, "".join(parts)

    return draw_pair()


@EXAMPLES
@given(pairs=st.lists(key_and_derived_glob(ASCII_ALPHABET, "z"), min_size=1, max_size=6))
def test_globs_derived_from_keys_match_as_in_redis(
    state: reactor.State, redis_client: Any, pairs: list[tuple[str, str]]
) -> None:
    keys = {key for key, _ in pairs}
    check_globs(state, redis_client, keys, [glob for _, glob in pairs])


@EXAMPLES
@given(pairs=st.lists(key_and_derived_glob(ALPHABET, "λ"), min_size=1, max_size=6))
def test_globs_derived_from_keys_match_on_characters(
    state: reactor.State, redis_client: Any, pairs: list[tuple[str, str]]
) -> None:
    keys = {key for key, _ in pairs}
    check_globs(state, redis_client, keys, [glob for _, glob in pairs])


def test_corner_cases_of_the_glob_table_agree_with_redis(
    state: reactor.State, redis_client: Any
) -> None:
    from tests.test_keys import ALL_MATCHES

    for glob, yes, no in ALL_MATCHES:
        check_globs(state, redis_client, {key for key in [*yes, *no] if key}, [glob])


def test_redis_matches_bytes_where_reactor_matches_characters(
    state: reactor.State, redis_client: Any
) -> None:
    # Why non-ASCII globs are not sent to Redis: there, "?" is one byte of "é".
    keys = {"é", "ab", "日"}
    for key in keys:
        redis_client.set(key.encode(), b"1")
    assert sorted(redis_client.keys(b"??")) == sorted([b"ab", "é".encode()])
    assert redis_client.keys(b"?") == []
    assert sorted(k for k in keys if glob_matches("??", k)) == ["ab"]
    assert sorted(k for k in keys if glob_matches("?", k)) == ["é", "日"]
    redis_client.flushdb()


@pytest.mark.parametrize(
    ("glob", "matches"),
    [("*a" * 1000 + "*", True), ("*a" * 1001, False), ("*a" * 1001 + "*", False)],
    ids=["1001 runs, the last at the end", "1001 runs", "1002 runs"],
)
def test_a_glob_of_more_than_1000_stars_gives_up_as_redis_does(
    state: reactor.State, redis_client: Any, glob: str, matches: bool
) -> None:
    # Redis (upstream since 7.2.6/7.4.1, and Debian's 7.0.15 with its security fixes)
    # answers "no match" where a star would nest deeper than 1,000 (CVE-2024-31228);
    # the stock 7.0.15 source has no such limit. reactor follows the live server.
    key = "a" * 1024
    check_globs(state, redis_client, {key, "a" * 999}, [glob])
    assert glob_matches(glob, key) is matches


# ---------------------------------------------------------------------------------------
# Verbs shared with Redis
#
# Differences the spec defines, each mapped where the operation runs:
#
# - Values are JSON (§2). reactor keeps ints and floats as numbers; Redis keeps strings.
#   A reactor number is compared with the Redis string that holds it. Text values are
#   drawn from letters only, so no text looks like a number to Redis.
# - `delete` returns the old value (§3); DEL returns how many keys it removed.
# - `pop` of the last item leaves `[]` (§3); Redis deletes the emptied list. The test
#   checks the `[]` and then deletes it in reactor too, so both go on from one state.
# - `increment` takes any JSON number (§3): on a key holding a fraction Redis's INCRBY
#   refuses ("not an integer"), and the equivalent Redis call is INCRBYFLOAT.
# - `append` on a number raises TypeMismatchError (§3, wrong type); Redis appends to the
#   number's digits. Not sent to Redis.
# - `expire(key, None)` returns whether the key exists (§3); PERSIST returns whether it
#   had an expiry.
# - `ttl` returns float seconds on reactor's clock (a fake one here: it never moves) and
#   TTL whole seconds on Redis's real clock: only the classes -2, -1 and "> 0" compare.
#   TTLs are at least 100 s, so none runs out during a test.
# - `get` reads any value (§3); GET refuses a list (WRONGTYPE): a list is read with
#   LRANGE.

KEY_SPACE = ["k1", "k2", "k3"]
keys_st = st.sampled_from(KEY_SPACE)
texts = st.text(st.sampled_from("abcxyz"), max_size=6)
ints = st.integers(min_value=-1000, max_value=1000)
fractions = st.sampled_from([0.5, -0.25, 1.5, 2.0, -3.75])
ttls = st.sampled_from([100, 500, 1000])

operations = st.one_of(
    st.tuples(st.just("set"), keys_st, st.one_of(texts, ints), st.none() | ttls, st.booleans()),
    st.tuples(st.just("get"), keys_st),
    st.tuples(st.just("delete"), keys_st),
    st.tuples(st.just("exists"), keys_st),
    st.tuples(st.just("increment"), keys_st, ints),
    st.tuples(st.just("decrement"), keys_st, ints),
    st.tuples(st.just("increment_float"), keys_st, fractions),
    st.tuples(st.just("append"), keys_st, texts),
    st.tuples(st.just("push"), keys_st, st.lists(texts, min_size=1, max_size=3)),
    st.tuples(st.just("pop"), keys_st, st.booleans()),
    st.tuples(st.just("length"), keys_st),
    st.tuples(st.just("expire"), keys_st, st.sampled_from([None, -1, 0, 100, 1000])),
    st.tuples(st.just("ttl"), keys_st),
    st.tuples(st.just("keys"), st.sampled_from(["*", "k?", "k[12]", "k[!1]", "x*"])),
)


@dataclass
class Pair:
    """One reactor scope and one Redis database, driven side by side."""

    scope: reactor.Scope
    client: Any

    def redis_value(self, key: str) -> Any:
        """The key's value in Redis: bytes, a list of bytes, or None."""
        kind = self.client.type(key)
        if kind == b"string":
            return self.client.get(key)
        if kind == b"list":
            return self.client.lrange(key, 0, -1)
        assert kind == b"none", kind
        return None

    def check_same_state(self) -> None:
        assert self.scope.keys() == sorted(k.decode() for k in self.client.keys(b"*"))
        for key in KEY_SPACE:
            assert as_redis(self.scope.get(key)) == self.redis_value(key), key
            assert ttl_class(self.scope.ttl(key)) == ttl_class(self.client.ttl(key)), key


def as_redis(value: Any) -> Any:
    """A reactor value as Redis would hold it."""
    if value is None:
        return None
    if isinstance(value, list):
        return [as_redis(item) for item in value]
    if isinstance(value, str):
        return value.encode()
    assert isinstance(value, int | float), value
    assert not isinstance(value, bool), value
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # Redis prints 2.0 as "2"
    return str(value).encode()


def ttl_class(seconds: float) -> float:
    return seconds if seconds in (-1, -2) else 1


def is_redis_type_error(exc: Exception) -> bool:
    message = str(exc)
    return (
        message.startswith("WRONGTYPE")
        or "not an integer" in message
        or "not a valid float" in message
    )


def run(pair: Pair, operation: tuple[Any, ...]) -> None:
    scope, client = pair.scope, pair.client
    verb, key, *args = operation
    before = pair.scope.get(key) if verb != "keys" else None
    event(f"{verb} on {type(before).__name__}")  # shown by --hypothesis-show-statistics
    if verb == "set":
        value, ttl, keep_ttl = args
        change = scope.set(key, value, ttl=ttl, keep_ttl=keep_ttl and ttl is None)
        client.set(key, as_redis(value), ex=ttl, keepttl=keep_ttl and ttl is None)
        assert change.new_value == value
        assert change.old_value == before
    elif verb == "get":
        assert as_redis(scope.get(key)) == pair.redis_value(key)
    elif verb == "delete":
        redis_before = pair.redis_value(key)
        old = scope.delete(key)
        assert as_redis(old) == redis_before  # reactor: the old value; Redis: a count
        assert client.delete(key) == (0 if old is None else 1)
    elif verb == "exists":
        assert scope.exists(key) == bool(client.exists(key))
    elif verb in ("increment", "decrement", "increment_float"):
        run_increment(pair, verb, key, args[0], before)
    elif verb in ("append", "push", "pop", "length"):
        run_sequence_verb(pair, verb, key, args, before)
    elif verb in ("expire", "ttl"):
        run_expiry_verb(pair, verb, key, args)
    elif verb == "keys":
        glob = key
        assert scope.keys(glob) == sorted(k.decode() for k in client.keys(redis_equivalent(glob)))
    else:  # pragma: no cover - the strategy draws only the verbs above
        raise AssertionError(verb)


def run_sequence_verb(pair: Pair, verb: str, key: str, args: list[Any], before: Any) -> None:
    scope, client = pair.scope, pair.client
    if verb == "append":
        (text,) = args
        if isinstance(before, int | float):
            # §2/§3: a number is not text in reactor; Redis would append to its digits.
            with pytest.raises(reactor.TypeMismatchError):
                scope.append(key, text)
            return
        same_outcome(lambda: scope.append(key, text), lambda: client.append(key, text))
    elif verb == "push":
        (items,) = args
        same_outcome(lambda: scope.push(key, *items), lambda: client.rpush(key, *items))
    elif verb == "pop":
        (front,) = args
        popped = same_outcome(
            lambda: as_redis(scope.pop(key, front=front)),
            lambda: (client.lpop if front else client.rpop)(key),
        )
        if popped is not None and scope.get(key) == []:
            # §3: popping the last item leaves [] where Redis deletes the list. Delete it
            # in reactor too, so that the two go on from the same state.
            assert not client.exists(key)
            scope.delete(key)
    elif verb == "length":
        same_outcome(lambda: scope.length(key), lambda: client.llen(key))


def run_expiry_verb(pair: Pair, verb: str, key: str, args: list[Any]) -> None:
    scope, client = pair.scope, pair.client
    if verb == "expire":
        (seconds,) = args
        if seconds is None:
            # §3: expire(key, None) says whether the key exists; PERSIST whether it had
            # an expiry.
            existed = bool(client.exists(key))
            client.persist(key)
            assert scope.expire(key, None) == existed
        else:
            assert scope.expire(key, seconds) == bool(client.expire(key, seconds))
    elif verb == "ttl":
        assert ttl_class(scope.ttl(key)) == ttl_class(client.ttl(key))


def run_increment(pair: Pair, verb: str, key: str, by: float, before: Any) -> None:
    scope, client = pair.scope, pair.client
    reactor_call = scope.decrement if verb == "decrement" else scope.increment
    if verb == "increment_float" or (
        isinstance(before, float) and not before.is_integer() and verb != "increment_float"
    ):
        # §3: increment takes any JSON number; for a fraction Redis needs INCRBYFLOAT.
        signed = -by if verb == "decrement" else by
        same_outcome(lambda: reactor_call(key, by), lambda: client.incrbyfloat(key, signed))
        return
    redis_call = client.decrby if verb == "decrement" else client.incrby
    same_outcome(lambda: reactor_call(key, int(by)), lambda: redis_call(key, int(by)))


def same_outcome(on_reactor: Any, on_redis: Any) -> Any:
    """Run both; the same result, or a type error on both sides (TypeMismatchError and
    Redis's WRONGTYPE or "not an integer"). Returns reactor's result."""
    try:
        ours = on_reactor()
    except reactor.TypeMismatchError:
        ours = TYPE_ERROR
    if ours is not TYPE_ERROR:
        assert ours == on_redis()
        return ours
    with pytest.raises(redis.ResponseError) as theirs:
        on_redis()
    assert is_redis_type_error(theirs.value), theirs.value
    event("a type error on both sides")
    return None


TYPE_ERROR = object()


def check_verbs(state: reactor.State, client: Any, ops: list[tuple[Any, ...]]) -> None:
    pair = Pair(fresh(state, client), client)
    for operation in ops:
        run(pair, operation)
        pair.check_same_state()


@VERB_EXAMPLES
@given(ops=st.lists(operations, max_size=30))
def test_verbs_agree_with_redis(
    state: reactor.State, redis_client: Any, ops: list[tuple[Any, ...]]
) -> None:
    check_verbs(state, redis_client, ops)


@pytest.mark.slow
@MANY_EXAMPLES
@given(ops=st.lists(operations, max_size=60))
def test_verbs_agree_with_redis_at_length(
    state: reactor.State, redis_client: Any, ops: list[tuple[Any, ...]]
) -> None:
    check_verbs(state, redis_client, ops)
