"""Transactions (SPEC §5) and snapshots."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import reactor
from reactor.testing import ManualClock, run_upkeep

from .conftest import raw_query

Opener = Callable[..., reactor.State]


def _log(db_path: Path) -> list[tuple[int, str, str, str | None]]:
    return raw_query(  # type: ignore[return-value]
        db_path, "SELECT revision, key, type, new_value FROM reactor_changes ORDER BY revision"
    )


def test_writes_commit_together(state: reactor.State, db_path: Path) -> None:
    scope = state.scope("s")
    scope.set("before", 0)
    with scope.transaction() as tx:
        n = tx.increment("n")
        tx.set("last", n)
        tx.push("items", "a", "b")
        assert tx.get("last") == 1  # the body sees its own writes
        assert tx.keys() == ["before", "items", "last", "n"]
        assert scope.name == tx.name
    assert scope.list() == {"before": 0, "items": ["a", "b"], "last": 1, "n": 1}
    log = _log(db_path)
    assert [key for _, key, _, _ in log] == ["before", "n", "last", "items"]
    assert [revision for revision, _, _, _ in log] == [1, 2, 3, 4]


def test_a_body_that_raises_commits_nothing(state: reactor.State, db_path: Path) -> None:
    scope = state.scope("s")
    scope.set("k", "kept")
    with pytest.raises(KeyError, match="boom"), scope.transaction() as tx:
        tx.set("k", "changed")
        tx.delete("k")
        tx.set("other", 1)
        raise KeyError("boom")
    assert scope.list() == {"k": "kept"}
    assert len(_log(db_path)) == 1
    scope.set("after", 1)  # the scope is free again
    assert scope.get("after") == 1


def test_a_failing_verb_inside_the_body_keeps_the_other_writes(state: reactor.State) -> None:
    scope = state.scope("s")
    with scope.transaction() as tx:
        tx.set("text", "x")
        tx.set("n", 1)
        with pytest.raises(reactor.TypeMismatchError):
            tx.increment("text")
        tx.increment("n")
    assert scope.list() == {"n": 2, "text": "x"}


def test_every_verb_works_on_tx(state: reactor.State, clock: object) -> None:
    scope = state.scope("s")
    scope.set_many({"a": 1, "b": [1, 2], "c": "x"})
    with scope.transaction() as tx:
        assert tx.get("a") == 1
        assert tx.get("zz", "default") == "default"
        assert tx.get_many(["a", "zz", "c"]) == {"a": 1, "c": "x"}
        assert tx.exists("b")
        assert tx.list() == {"a": 1, "b": [1, 2], "c": "x"}
        assert tx.set("d", {"k": 1}, ttl=50) == reactor.Change(None, {"k": 1})
        assert tx.ttl("d") == pytest.approx(50)
        assert tx.ttl("a") == -1
        assert tx.ttl("none") == -2
        assert tx.set_many({"e": 5}) == {"e": reactor.Change(None, 5)}
        assert tx.delete("e") == 5
        assert tx.expire("a", 10)
        assert tx.decrement("a") == 0
        assert tx.append("c", "y") == 2
        assert tx.compare_and_swap("c", "xy", "z")
        assert tx.push("b", 3) == 3
        assert tx.pop("b", front=True) == 1
        assert tx.length("b") == 2
        result = tx.update("d", [reactor.ops.increment("k"), reactor.ops.set("m", True)])
        assert result == reactor.UpdateResult({"k": 1}, {"k": 2, "m": True}, [])
        assert tx.keys("[ab]") == ["a", "b"]
        assert tx.clear("[bc]") == 2
        assert tx.snapshot().values == {"a": 0, "d": {"k": 2, "m": True}}
    assert scope.list() == {"a": 0, "d": {"k": 2, "m": True}}
    assert scope.ttl("a") == pytest.approx(10)
    assert scope.ttl("d") == pytest.approx(50)


def test_the_scopes_own_handle_inside_the_body_raises(state: reactor.State) -> None:
    scope = state.scope("s")
    same = state.scope("s")
    with scope.transaction() as tx:
        tx.set("k", 1)
        for call in (lambda: scope.set("k", 2), lambda: same.get("k"), scope.transaction):
            with pytest.raises(reactor.ReentrancyError):
                call()
        with pytest.raises(reactor.ReentrancyError):
            tx.transaction()
    assert scope.get("k") == 1


def test_writes_to_other_scopes_are_allowed_and_not_part_of_it(state: reactor.State) -> None:
    scope, other = state.scope("s"), state.scope("other")
    with pytest.raises(RuntimeError), scope.transaction() as tx:
        tx.set("k", 1)
        other.set("k", "outside")  # commits at once, whatever the body does next
        assert other.get("k") == "outside"
        raise RuntimeError("roll back s only")
    assert scope.get("k") is None
    assert other.get("k") == "outside"


def test_transactions_on_scopes_sharing_an_actor_do_not_block_each_other(
    open_state: Opener,
) -> None:
    state = open_state(max_actors=1)  # every scope on one actor
    first, second = state.scope("first"), state.scope("second")
    with first.transaction() as tx:
        second.set("k", 1)  # the actor serves other scopes meanwhile
        with second.transaction() as tx2:
            tx2.set("k", 2)
        tx.set("k", second.get("k"))
    assert first.get("k") == 2


def test_other_threads_wait_for_the_body(state: reactor.State) -> None:
    scope = state.scope("s")
    scope.set("n", 0)
    inside, written = threading.Event(), threading.Event()

    def writer() -> None:
        inside.wait(10)
        scope.increment("n")
        written.set()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        with scope.transaction() as tx:
            inside.set()
            assert not written.wait(0.3)  # held off by the transaction
            tx.set("n", tx.get("n") + 10)
    finally:
        thread.join(10)
    assert written.is_set()
    assert scope.get("n") == 11  # the waiting write ran after the commit, on top of it


def test_concurrent_transactions_serialize(state: reactor.State) -> None:
    scope = state.scope("s")

    def job() -> None:
        for _ in range(20):
            with scope.transaction() as tx:
                value = tx.get("n", 0)
                tx.set("n", value + 1)

    threads = [threading.Thread(target=job) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert scope.get("n") == 80


def test_a_change_from_another_process_during_the_body_is_a_conflict(
    state: reactor.State, db_path: Path
) -> None:
    scope = state.scope("s")
    scope.set("n", 1)
    with pytest.raises(reactor.ConflictError), scope.transaction() as tx:
        tx.set("n", tx.get("n") + 1)
        subprocess.run(
            [
                sys.executable,
                "-c",
                textwrap.dedent(
                    """
                    import sys, reactor
                    with reactor.open(sys.argv[1]) as state:
                        state.scope("s").set("n", 100)
                    """
                ),
                str(db_path),
            ],
            check=True,
            timeout=60,
        )
    assert scope.get("n") == 100  # the other process's write stands; ours was refused
    with scope.transaction() as tx:  # and the scope works on
        tx.increment("n")
    assert scope.get("n") == 101


def test_a_transaction_that_changes_nothing_commits_nothing(
    state: reactor.State, db_path: Path
) -> None:
    scope = state.scope("s")
    scope.set("k", 1)
    with scope.transaction() as tx:
        assert tx.get("k") == 1
        tx.set("k", 1)
    assert len(_log(db_path)) == 1


def test_a_finished_transaction_cannot_be_used(state: reactor.State) -> None:
    scope = state.scope("s")
    with scope.transaction() as tx:
        tx.set("k", 1)
    with pytest.raises(reactor.ClosedError):
        tx.get("k")
    with pytest.raises(reactor.ReentrancyError):
        tx.__enter__()


def test_an_expired_key_inside_a_transaction(state: reactor.State, clock: object) -> None:
    scope = state.scope("s")
    scope.set("k", 1, ttl=5)
    clock.advance(6)  # type: ignore[attr-defined]
    with scope.transaction() as tx:
        assert tx.get("k") is None
        tx.set("k", 2)
    assert scope.get("k") == 2
    assert state.stats()["keys_expired"] == 1


def test_snapshot(state: reactor.State, db_path: Path) -> None:
    scope = state.scope("s")
    assert scope.snapshot() == reactor.Snapshot({}, 0)
    scope.set("b", 2)
    scope.set("a", 1)
    state.scope("other").set("x", 1)
    snap = scope.snapshot()
    assert snap.values == {"a": 1, "b": 2}
    assert list(snap.values) == ["a", "b"]
    assert snap.revision == 3
    snap.values["a"] = 99
    assert scope.get("a") == 1


def test_snapshot_is_consistent_while_another_thread_writes(state: reactor.State) -> None:
    scope = state.scope("s")
    scope.set_many({"a": 0, "b": 0})
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            scope.set_many({"a": i, "b": i})  # one write: a and b always move together

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        revisions = []
        for _ in range(200):
            snap = scope.snapshot()
            assert snap.values["a"] == snap.values["b"]
            revisions.append(snap.revision)
        # Two keys per write: a consistent snapshot sits on an even revision.
        assert all(revision % 2 == 0 for revision in revisions)
        assert revisions == sorted(revisions)
    finally:
        stop.set()
        thread.join(10)


def test_a_conflict_is_seen_even_when_the_log_was_compacted_meanwhile(db_path: Path) -> None:
    import time

    clock = ManualClock(time.time())
    with reactor.open(db_path, clock=clock, log_retention_seconds=60) as state:
        scope = state.scope("s")
        scope.set("n", 1)
        with pytest.raises(reactor.ConflictError), scope.transaction() as tx:
            tx.set("n", 2)
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    (
                        "import sys, reactor\n"
                        "with reactor.open(sys.argv[1]) as s:\n"
                        "    s.scope('s').set('n', 100)\n"
                        "    s.scope('other').set('x', 1)"
                    ),
                    str(db_path),
                ],
                check=True,
                timeout=60,
            )
            clock.advance(120)
            # All but the newest record (another scope's) is gone: the log cannot tell
            # what happened to "s", and the commit must assume the worst.
            assert run_upkeep(state).log_compacted == 2
        assert scope.get("n") == 100
