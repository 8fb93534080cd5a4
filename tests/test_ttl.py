"""TTL with an injected clock: deadlines, reads at the deadline, the sweeper."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import reactor
from reactor.testing import ManualClock, run_upkeep
from tests.conftest import wait_for

from .conftest import raw_query


@pytest.fixture
def scope(state: reactor.State) -> reactor.Scope:
    return state.scope("cache")


def _rows(db_path: Path) -> int:
    return int(raw_query(db_path, "SELECT COUNT(*) FROM reactor_kv")[0][0])


def test_ttl_reports_seconds_left_no_expiry_and_absent(
    scope: reactor.Scope, clock: ManualClock
) -> None:
    assert scope.ttl("k") == -2
    scope.set("k", 1)
    assert scope.ttl("k") == -1
    scope.set("t", 1, ttl=60)
    assert scope.ttl("t") == pytest.approx(60)
    clock.advance(15.5)
    assert scope.ttl("t") == pytest.approx(44.5)


def test_a_key_is_absent_from_its_deadline_on(scope: reactor.Scope, clock: ManualClock) -> None:
    scope.set("t", {"v": 1}, ttl=10)
    clock.advance(9.999)
    assert scope.get("t") == {"v": 1}
    clock.advance(0.001)
    assert scope.get("t") is None
    assert not scope.exists("t")
    assert scope.ttl("t") == -2
    assert scope.keys() == []
    assert scope.list() == {}
    assert scope.get_many(["t"]) == {}
    assert scope.length("t") == 0


def test_writes_treat_an_expired_key_as_absent(scope: reactor.Scope, clock: ManualClock) -> None:
    scope.set("n", 41, ttl=1)
    clock.advance(2)
    assert scope.increment("n") == 1
    assert scope.ttl("n") == -1
    scope.set("s", "x", ttl=1)
    clock.advance(2)
    assert scope.set("s", "y") == reactor.Change(None, "y")
    scope.set("c", 1, ttl=1)
    clock.advance(2)
    assert scope.compare_and_swap("c", reactor.MISSING, 2)
    assert scope.delete("c") == 2


def test_set_without_ttl_clears_it_and_keep_ttl_keeps_it(
    scope: reactor.Scope, clock: ManualClock
) -> None:
    scope.set("k", 1, ttl=30)
    scope.set("k", 2, keep_ttl=True)
    assert scope.ttl("k") == pytest.approx(30)
    scope.set("k", 3)
    assert scope.ttl("k") == -1
    scope.set("k", 3, ttl=5)  # same value, new deadline
    assert scope.ttl("k") == pytest.approx(5)
    scope.set("k", 4, ttl=50, keep_ttl=True)  # an explicit ttl wins
    assert scope.ttl("k") == pytest.approx(50)


def test_verbs_keep_the_expiry(scope: reactor.Scope, clock: ManualClock) -> None:
    scope.set("n", 1, ttl=100)
    scope.increment("n")
    scope.decrement("n")
    scope.set("s", "a", ttl=100)
    scope.append("s", "b")
    scope.set("l", [1, 2], ttl=100)
    scope.push("l", 3)
    scope.pop("l")
    scope.set("c", 1, ttl=100)
    scope.compare_and_swap("c", 1, 2)
    for key in ("n", "s", "l", "c"):
        assert scope.ttl(key) == pytest.approx(100), key


def test_expire(scope: reactor.Scope, clock: ManualClock) -> None:
    assert scope.expire("k", 10) is False
    scope.set("k", 1)
    assert scope.expire("k", 10) is True
    assert scope.ttl("k") == pytest.approx(10)
    assert scope.expire("k", None) is True
    assert scope.ttl("k") == -1  # the expiry is removed...
    clock.advance(20)
    assert scope.get("k") == 1  # ...and the key persists
    assert scope.expire("k", 0) is True
    assert not scope.exists("k")
    scope.set("k", 1)
    assert scope.expire("k", -5) is True
    assert not scope.exists("k")
    with pytest.raises(reactor.InvalidArgumentError):
        scope.expire("k", float("nan"))


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), "10", True])
def test_bad_ttls_raise_value_error(scope: reactor.Scope, ttl: object) -> None:
    with pytest.raises(ValueError, match="ttl"):
        scope.set("k", 1, ttl=ttl)  # type: ignore[arg-type]
    assert not scope.exists("k")


def test_deadlines_survive_a_restart(db_path: Path, clock: ManualClock) -> None:
    with reactor.open(db_path, clock=clock) as state:
        state.scope("s").set("k", 1, ttl=60)
    clock.advance(30)
    with reactor.open(db_path, clock=clock) as state:
        assert state.scope("s").ttl("k") == pytest.approx(30)
        clock.advance(30)
        assert state.scope("s").get("k") is None


def test_the_sweeper_removes_expired_rows(
    state: reactor.State, clock: ManualClock, db_path: Path
) -> None:
    scope = state.scope("cache")
    for i in range(50):
        scope.set(f"k{i}", i, ttl=10 if i % 2 else None)
    state.scope("other").set("t", 1, ttl=5)
    assert _rows(db_path) == 51
    clock.advance(11)
    wait_for(lambda: _rows(db_path) == 25)
    assert scope.keys() == sorted(f"k{i}" for i in range(0, 50, 2))
    assert state.stats()["keys_expired"] == 26
    expired = raw_query(db_path, "SELECT COUNT(*) FROM reactor_changes WHERE type = 'expired'")
    assert expired == [(26,)]
    assert state.scopes() == ["cache"]


def test_expired_keys_are_expired_once(
    open_state: Callable[..., reactor.State], clock: ManualClock, db_path: Path
) -> None:
    state = open_state(clock=clock)
    scope = state.scope("s")
    scope.set("k", 1, ttl=1)
    clock.advance(2)
    scope.set("k", 2)  # the write notices first...
    wait_for(lambda: state.stats()["keys_expired"] == 1)
    scope.set("k", 3, ttl=1)
    clock.advance(2)
    wait_for(lambda: _rows(db_path) == 0)  # ...then the sweeper
    kinds = [t for (t,) in raw_query(db_path, "SELECT type FROM reactor_changes ORDER BY revision")]
    assert kinds == ["created", "expired", "created", "updated", "expired"]


def test_the_change_log_is_compacted_by_count(
    open_state: Callable[..., reactor.State], db_path: Path
) -> None:
    state = open_state(log_retention=10)
    scope = state.scope("s")
    for i in range(25):
        scope.set("k", i)
    assert run_upkeep(state).log_compacted == 15
    revisions = [
        r for (r,) in raw_query(db_path, "SELECT revision FROM reactor_changes ORDER BY revision")
    ]
    assert revisions == list(range(16, 26))


def test_the_change_log_is_compacted_by_age(
    open_state: Callable[..., reactor.State], clock: ManualClock, db_path: Path
) -> None:
    state = open_state(log_retention_seconds=60, clock=clock)
    scope = state.scope("s")
    scope.set("old", 1)
    clock.advance(61)
    scope.set("new", 1)
    wait_for(lambda: _rows_in_log(db_path) == 1, timeout=10)  # the background compaction
    assert scope.list() == {"new": 1, "old": 1}  # values are not touched


def _rows_in_log(db_path: Path) -> int:
    return int(raw_query(db_path, "SELECT COUNT(*) FROM reactor_changes")[0][0])


def test_compaction_by_age_keeps_the_log_contiguous(
    open_state: Callable[..., reactor.State], clock: ManualClock, db_path: Path
) -> None:
    state = open_state(log_retention_seconds=60, clock=clock)
    scope = state.scope("s")
    scope.set("a", 1)  # revision 1, at t
    clock.advance(-30)
    scope.set("b", 1)  # revision 2, stamped earlier (a clock that stepped back)
    clock.advance(100)
    scope.set("c", 1)  # revision 3, at t + 70
    clock.advance(5)  # revision 1 is 75 s old, revision 2 105 s old, revision 3 5 s old
    run_upkeep(state)
    assert [e.revision for e in state.changes(since=2)] == [3]
    with pytest.raises(reactor.RevisionCompactedError):
        state.changes(since=1)  # no hole: what remains starts right after the cut


def test_revisions_are_never_reused_after_compaction(
    open_state: Callable[..., reactor.State], clock: ManualClock
) -> None:
    state = open_state(log_retention_seconds=60, clock=clock)
    scope = state.scope("s")
    for i in range(3):
        scope.set("k", i)
    clock.advance(120)  # every record is too old now...
    run_upkeep(state)
    assert [e.revision for e in state.changes(since=2)] == [3]  # ...but the newest stays
    scope.set("k", "after")
    assert [e.revision for e in state.changes(since=2)] == [3, 4]
