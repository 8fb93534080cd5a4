"""Fixtures shared by the suite: real SQLite files, an injectable clock, clean-up."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import reactor
from reactor import _engine


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self._lock = threading.Lock()

    def time(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


def canon(value: Any) -> str:
    """Canonical JSON: tells ``1`` from ``1.0`` and ``True``, ignores key order."""
    return json.dumps(value, sort_keys=True)


def wait_for(predicate: Callable[[], Any], timeout: float = 5.0, interval: float = 0.01) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(interval)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture
def open_state(db_path: Path) -> Iterator[Callable[..., reactor.State]]:
    """Open handles (on the test's database file by default); all closed afterwards."""
    handles: list[reactor.State] = []

    def opener(target: Any = None, **options: Any) -> reactor.State:
        handle = reactor.open(db_path if target is None else target, **options)
        handles.append(handle)
        return handle

    yield opener
    for handle in handles:
        handle.close()


@pytest.fixture
def state(open_state: Callable[..., reactor.State], clock: FakeClock) -> reactor.State:
    """A handle on a fresh database file, with the fake clock."""
    return open_state(clock=clock)


@pytest.fixture(autouse=True)
def _no_engine_left_behind() -> Iterator[None]:
    yield
    leftovers = list(_engine._live_engines)
    for engine in leftovers:
        engine.close()
    assert not leftovers, f"a test left engines open: {[e.key for e in leftovers]}"
