"""Every verb of SPEC §3: results, errors, and that a failing verb changes nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import reactor
from reactor import MISSING, Change

from .conftest import raw_query


@pytest.fixture
def scope(state: reactor.State) -> reactor.Scope:
    return state.scope("orders")


def _log(db_path: Path) -> list[tuple[str, str, str | None, str | None]]:
    return raw_query(  # type: ignore[return-value]
        db_path, "SELECT key, type, old_value, new_value FROM reactor_changes ORDER BY revision"
    )


def test_scope_name_and_repr(scope: reactor.Scope) -> None:
    assert scope.name == "orders"
    assert "orders" in repr(scope)


def test_set_returns_old_and_new(scope: reactor.Scope) -> None:
    assert scope.set("k", {"a": 1}) == Change(None, {"a": 1})
    old, new = scope.set("k", [1, 2])
    assert (old, new) == ({"a": 1}, [1, 2])
    assert scope.get("k") == [1, 2]


def test_get_with_default(scope: reactor.Scope) -> None:
    assert scope.get("missing") is None
    assert scope.get("missing", "dark") == "dark"
    scope.set("none", None)
    assert scope.get("none", "dark") is None  # a stored null is a value
    assert scope.exists("none")


def test_set_many_and_get_many(scope: reactor.Scope) -> None:
    scope.set("a", 0)
    changes = scope.set_many({"a": 1, "b": [2]})
    assert changes == {"a": Change(0, 1), "b": Change(None, [2])}
    assert scope.get_many(["b", "nope", "a"]) == {"b": [2], "a": 1}
    assert list(scope.get_many(["b", "a"])) == ["b", "a"]
    assert scope.get_many([]) == {}
    assert scope.set_many({}) == {}
    with pytest.raises(reactor.InvalidArgumentError):
        scope.get_many("ab")
    with pytest.raises(reactor.InvalidArgumentError):
        scope.set_many([("a", 1)])  # type: ignore[arg-type]


def test_get_many_with_many_keys(scope: reactor.Scope) -> None:
    scope.set_many({f"k{i}": i for i in range(1200)})
    found = scope.get_many([f"k{i}" for i in range(0, 1300, 2)])
    assert found == {f"k{i}": i for i in range(0, 1200, 2)}


def test_set_many_is_all_or_nothing(scope: reactor.Scope) -> None:
    scope.set("a", 1)
    with pytest.raises(reactor.InvalidValueError):
        scope.set_many({"a": 2, "b": float("nan")})
    with pytest.raises(reactor.InvalidArgumentError):
        scope.set_many({"a": 2}, ttl=0)
    assert scope.list() == {"a": 1}


def test_exists_and_delete(scope: reactor.Scope) -> None:
    assert not scope.exists("k")
    scope.set("k", "v")
    assert scope.exists("k")
    assert scope.delete("k") == "v"
    assert scope.delete("k") is None
    assert not scope.exists("k")


def test_list_keys_and_clear(scope: reactor.Scope) -> None:
    scope.set_many({"o-2": 2, "o-1": 1, "x": 0})
    assert scope.list() == {"o-1": 1, "o-2": 2, "x": 0}
    assert list(scope.list()) == ["o-1", "o-2", "x"]
    assert scope.keys() == ["o-1", "o-2", "x"]
    assert scope.keys("o-*") == ["o-1", "o-2"]
    assert scope.clear("o-*") == 2
    assert scope.clear("o-*") == 0
    assert scope.clear() == 1
    assert scope.list() == {}


def test_scopes_are_independent_and_listed(state: reactor.State) -> None:
    a, b = state.scope("a"), state.scope("b")
    a.set("k", 1)
    b.set("k", 2)
    state.scope("empty")
    assert (a.get("k"), b.get("k")) == (1, 2)
    assert state.scopes() == ["a", "b"]
    b.delete("k")
    assert state.scopes() == ["a"]


def test_increment_and_decrement(scope: reactor.Scope) -> None:
    assert scope.increment("n") == 1
    assert scope.increment("n", 5) == 6
    assert scope.decrement("n") == 5
    assert scope.decrement("n", 10) == -5
    assert scope.increment("f", 0.5) == 0.5
    assert scope.increment("n", 0.5) == -4.5
    assert scope.increment("d", default=100) == 101
    assert scope.decrement("e", 2, default=10) == 8
    assert type(scope.increment("i")) is int


@pytest.mark.parametrize("value", [True, "1", [1], {"n": 1}, None])
def test_increment_of_a_non_number_raises_and_changes_nothing(
    scope: reactor.Scope, value: object
) -> None:
    scope.set("k", value)
    with pytest.raises(reactor.TypeMismatchError):
        scope.increment("k")
    with pytest.raises(reactor.TypeMismatchError):
        scope.decrement("k")
    assert scope.get("k") == value
    assert type(scope.get("k")) is type(value)


def test_increment_arguments_must_be_numbers(scope: reactor.Scope) -> None:
    for bad in (True, "1", None):
        with pytest.raises(reactor.TypeMismatchError):
            scope.increment("k", bad)  # type: ignore[arg-type]
        with pytest.raises(reactor.TypeMismatchError):
            scope.increment("k", 1, default=bad)  # type: ignore[arg-type]
    with pytest.raises(reactor.InvalidArgumentError):
        scope.increment("k", float("inf"))
    assert not scope.exists("k")


def test_append(scope: reactor.Scope) -> None:
    assert scope.append("log", "start") == 5
    assert scope.append("log", " -> 🚀") == 10
    assert scope.get("log") == "start -> 🚀"
    scope.set("n", 1)
    with pytest.raises(reactor.TypeMismatchError):
        scope.append("n", "x")
    with pytest.raises(reactor.TypeMismatchError):
        scope.append("log", 1)  # type: ignore[arg-type]
    assert scope.get("n") == 1


def test_compare_and_swap(scope: reactor.Scope) -> None:
    assert scope.compare_and_swap("v", MISSING, 1) is True
    assert scope.compare_and_swap("v", MISSING, 2) is False
    assert scope.compare_and_swap("v", 1.0, 2) is True  # 1 == 1.0 as JSON
    assert scope.compare_and_swap("v", 3, 4) is False
    assert scope.get("v") == 2
    assert scope.compare_and_swap("v", 2, MISSING) is True
    assert not scope.exists("v")
    assert scope.compare_and_swap("v", None, 1) is False  # absent is not null


def test_compare_and_swap_uses_json_equality(scope: reactor.Scope) -> None:
    scope.set("flag", True)
    assert scope.compare_and_swap("flag", 1, False) is False  # True != 1
    scope.set("n", 0)
    assert scope.compare_and_swap("n", False, 1) is False
    scope.set("doc", {"a": [1, {"b": 2.0}]})
    assert scope.compare_and_swap("doc", {"a": [1.0, {"b": 2}]}, "swapped") is True
    scope.set("doc2", {"a": [True]})
    assert scope.compare_and_swap("doc2", {"a": [1]}, "no") is False


def test_push_pop_length(scope: reactor.Scope) -> None:
    assert scope.length("q") == 0
    assert scope.pop("q") is None
    assert scope.push("q", {"app": "a"}) == 1
    assert scope.push("q", 2, 3) == 3
    assert scope.push("q") == 3
    assert scope.length("q") == 3
    assert scope.pop("q") == 3
    assert scope.pop("q", front=True) == {"app": "a"}
    assert scope.pop("q") == 2
    assert scope.get("q") == []  # the last pop leaves an empty list
    assert scope.pop("q") is None
    assert scope.push("empty") == 0
    assert not scope.exists("empty")


def test_list_verbs_on_a_non_list_raise(scope: reactor.Scope) -> None:
    scope.set("s", "text")
    for verb in (lambda: scope.push("s", 1), lambda: scope.pop("s"), lambda: scope.length("s")):
        with pytest.raises(reactor.TypeMismatchError):
            verb()
    assert scope.get("s") == "text"


def test_writes_that_change_nothing_log_nothing(scope: reactor.Scope, db_path: Path) -> None:
    scope.set("k", {"a": 1})
    scope.set("k", {"a": 1})
    scope.clear("nothing*")
    scope.delete("absent")
    scope.push("k2")
    scope.compare_and_swap("k", {"a": 2}, 3)
    scope.set("k", 1.0)  # a float is a new value, not the same as 1
    scope.set("k", 1)
    assert [(key, kind) for key, kind, _, _ in _log(db_path)] == [
        ("k", "created"),
        ("k", "updated"),
        ("k", "updated"),
    ]


def test_every_change_is_logged_with_old_and_new(scope: reactor.Scope, db_path: Path) -> None:
    scope.set("a", 1)
    scope.increment("a")
    scope.delete("a")
    scope.set_many({"b": [1], "c": "x"})
    scope.pop("b")
    scope.clear()
    assert _log(db_path) == [
        ("a", "created", None, "1"),
        ("a", "updated", "1", "2"),
        ("a", "deleted", "2", None),
        ("b", "created", None, "[1]"),
        ("c", "created", None, '"x"'),
        ("b", "updated", "[1]", "[]"),
        ("b", "deleted", "[]", None),
        ("c", "deleted", '"x"', None),
    ]


def test_revisions_increase_strictly_across_scopes(state: reactor.State, db_path: Path) -> None:
    for i in range(10):
        state.scope(f"s{i % 3}").set("k", i)
    log = raw_query(db_path, "SELECT revision, scope, new_value FROM reactor_changes")
    assert sorted(log) == [(i + 1, f"s{i % 3}", str(i)) for i in range(10)]


def test_stats(state: reactor.State) -> None:
    scope = state.scope("s")
    scope.set("a", 1)
    scope.set("b", 2, ttl=10)
    scope.get("a")
    scope.increment("a")
    state.scope("t").set("x", 1)
    stats = state.stats()
    assert stats["scopes"] == {"s": 2, "t": 1}
    assert stats["keys"] == 3
    assert stats["operations"]["set"] == 3
    assert stats["operations"]["get"] == 1
    assert stats["operations"]["increment"] == 1
    assert set(stats["events"]) == {"published", "delivered", "failed", "dropped"}
    assert stats["keys_expired"] == 0
    assert stats["locks_held"] == 0
    assert stats["database_bytes"] > 0
    latency = stats["latency_ms"]["set"]
    assert latency["samples"] == 3
    assert 0 < latency["p50"] <= latency["p99"]


def test_stats_time_each_threads_first_calls_then_one_in_eight(state: reactor.State) -> None:
    """``operations`` counts every call; ``latency_ms`` times a sample: each thread's
    first 64 calls of a verb, then every 8th (two clock reads cost a get a tenth)."""
    scope = state.scope("s")
    for n in range(64 + 80):
        scope.set("k", n)

    def another_thread() -> None:
        for n in range(10):
            scope.set("k", n)

    thread = threading.Thread(target=another_thread)
    thread.start()
    thread.join(10)
    stats = state.stats()
    assert stats["operations"]["set"] == 64 + 80 + 10
    assert stats["latency_ms"]["set"]["samples"] == 64 + 80 // 8 + 10


def test_stats_count_the_write_transactions_committed(
    open_state: Callable[..., reactor.State],
) -> None:
    # No upkeep during the test: its compaction of the change log commits too.
    state = open_state(sweep_interval=1_000_000)
    scope = state.scope("s")
    before = state.stats()["transactions"]
    scope.set("a", 1)
    scope.increment("n")
    with scope.transaction() as tx:  # one commit, however many writes
        tx.set("b", 2)
        tx.set("c", 3)
    assert state.stats()["transactions"] == before + 3
    scope.get("a")  # reads commit nothing, nor do writes refused before the database
    with pytest.raises(reactor.InvalidArgumentError):
        scope.set("a", 1, ttl=-1)
    assert state.stats()["transactions"] == before + 3
