"""``state.stats()["upkeep"]``: how far the upkeep is behind, and how this engine's is
getting on (``reactor serve``'s health checks read the same)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

import reactor
from reactor.testing import ManualClock, run_upkeep

QUIET = 1e6  # a sweep interval that never comes in a test: only run_upkeep runs rounds


def test_overdue_counts_the_seconds_the_oldest_due_chore_has_waited(
    open_state: Callable[..., reactor.State], clock: ManualClock
) -> None:
    state = open_state(clock=clock, sweep_interval=QUIET)
    assert state.stats()["upkeep"] == {
        "overdue": 0.0,
        "rounds": 0,
        "last_round_age": None,
        "failing": 0,
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
