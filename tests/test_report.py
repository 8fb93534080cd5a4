"""``state.stats()["upkeep"]``: how far the upkeep is behind, and how this engine's is
getting on (``reactor serve``'s health checks read the same)."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import pytest

import reactor
from reactor.testing import ManualClock, run_upkeep
from tests.conftest import wait_for

QUIET = 1e6  # a sweep interval that never comes in a test: only run_upkeep runs rounds


def test_overdue_counts_the_seconds_the_oldest_due_chore_has_waited(
    open_state: Callable[..., reactor.State], clock: ManualClock
) -> None:
    state = open_state(clock=clock, sweep_interval=QUIET)
    assert state.stats()["upkeep"] == {
        "overdue": 0.0,
        "rounds": 0,
        "last_round_age": None,
        "busy_for": None,
        "failing": 0,
        "failing_for": None,
        "last_error": None,
        "running": True,
    }
    state.scope("s").set("k", 1, ttl=5)
    state.scope("s").schedule("t", 1, after=7)
    clock.advance(8)
    assert state.stats()["upkeep"]["overdue"] == pytest.approx(3.0, abs=0.01)
    assert state.scope("s").get("k") is None  # hidden from reads all the same
    run_upkeep(state)
    upkeep = state.stats()["upkeep"]
    assert upkeep["overdue"] == 0.0
    assert upkeep["rounds"] == 1
    assert 0 <= upkeep["last_round_age"] < 5
    assert state.scope("s").get("t") == 1


def test_a_read_only_engine_has_no_upkeep_but_sees_the_databases_lag(db_path: Any) -> None:
    with reactor.open(db_path, sweep_interval=QUIET) as writer:
        writer.scope("s").set("k", 1, ttl=0.05)
    time.sleep(0.2)
    with reactor.open(db_path, readonly=True) as reader:
        upkeep = reader.stats()["upkeep"]
    assert upkeep["running"] is False
    assert upkeep["rounds"] == 0
    assert upkeep["last_round_age"] is None
    assert upkeep["overdue"] >= 0.1


@pytest.mark.sqlite_only("removes the database file under the open engine")
def test_a_removed_database_file_stops_the_upkeep_and_says_why(db_path: Any) -> None:
    state = reactor.open(db_path, sweep_interval=0.02)
    try:
        state.scope("s").set("k", 1, ttl=0.05)
        db_path.unlink()

        def stopped() -> dict[str, Any] | None:
            try:
                upkeep = state.stats()["upkeep"]
            except reactor.StorageError:  # stats() reads the file, gone: look again
                return None
            return None if upkeep["running"] else upkeep

        upkeep = wait_for(stopped, timeout=15)
        assert "removed or replaced" in upkeep["last_error"]
        assert upkeep["failing"] >= 1
        assert upkeep["busy_for"] is None
    finally:
        with contextlib.suppress(reactor.ReactorError):
            state.close()


@pytest.mark.sqlite_only("holds SQLite's write lock from outside")
def test_rounds_that_fail_are_counted_with_their_reason_until_one_succeeds(
    open_state: Callable[..., reactor.State], db_path: Any
) -> None:
    """Another process's write lock held past the timeout: the expiry of a due key
    fails each round (the thread goes on), counted with its reason; once the lock goes,
    a round succeeds and the count is cleared."""
    state = open_state(sweep_interval=0.02, timeout=0.2)
    state.scope("s").set("k", 1, ttl=0.3)
    blocker = sqlite3.connect(db_path, timeout=10, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")

        def failing() -> dict[str, Any] | None:
            upkeep = state.stats()["upkeep"]
            return upkeep if upkeep["failing"] >= 3 else None

        upkeep = wait_for(failing, timeout=20)
        assert "expiring keys of 's' failed" in upkeep["last_error"]
        assert upkeep["failing_for"] >= 0
        assert upkeep["running"]
    finally:
        blocker.rollback()
        blocker.close()
    upkeep = wait_for(lambda: (u := state.stats()["upkeep"])["failing"] == 0 and u, timeout=20)
    assert upkeep["failing_for"] is None
    assert state.scope("s").get("k") is None
    assert "expiring keys of 's' failed" in upkeep["last_error"]  # the last one, kept
