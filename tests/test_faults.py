"""Fault injection at the storage boundary: the Nth statement of a write fails.

For each operation, N = 1, 2, ... until the operation goes through: every failure
reaches the caller as a reactor error with the driver's error chained, and leaves the
stored values, the revision and the change log as they were, with no event; then the
operation succeeds once, and the scope goes on working. Runs on both backends.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import reactor
from reactor import ops
from reactor.testing import ManualClock
from tests.conftest import engine_of

from .conftest import raw_query, wait_for

MAX_STATEMENTS = 40  # more than any operation here runs
KV, LOG = "reactor_kv", "reactor_changes"


class _Counter:
    def __init__(self, fail_at: int, error: Callable[[str], Exception]) -> None:
        self.fail_at = fail_at
        self.seen = 0
        self.error = error

    def tick(self) -> None:
        self.seen += 1
        if self.seen == self.fail_at:
            raise self.error(f"injected fault at statement {self.seen}")


class FaultyCursor:
    def __init__(self, counter: _Counter, cursor: Any) -> None:
        self._counter = counter
        self._cursor = cursor

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self._counter.tick()
        return self._cursor.execute(*args, **kwargs)

    def executemany(self, *args: Any, **kwargs: Any) -> Any:
        self._counter.tick()
        return self._cursor.executemany(*args, **kwargs)

    def __enter__(self) -> FaultyCursor:
        self._cursor.__enter__()
        return self

    def __exit__(self, *exc: object) -> Any:
        return self._cursor.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class FaultyConnection:
    """A DBAPI connection (sqlite3 or psycopg) whose Nth statement fails."""

    def __init__(self, conn: Any, counter: _Counter) -> None:
        self._conn = conn
        self._counter = counter

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self._counter.tick()
        return self._conn.execute(*args, **kwargs)

    def executemany(self, *args: Any, **kwargs: Any) -> Any:
        self._counter.tick()
        return self._conn.executemany(*args, **kwargs)

    def cursor(self, *args: Any, **kwargs: Any) -> FaultyCursor:
        return FaultyCursor(self._counter, self._conn.cursor(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def _driver_error(store: Any) -> Callable[[str], Exception]:
    if type(store).__name__ == "PostgresStore":
        import psycopg

        return psycopg.OperationalError
    return sqlite3.OperationalError


def _contents(db: Any) -> list[Any]:
    return [
        raw_query(
            db, "SELECT scope, key, value, expires_at, revision FROM reactor_kv ORDER BY 1, 2"
        ),
        raw_query(
            db, "SELECT revision, scope, key, type, new_value FROM reactor_changes ORDER BY 1"
        ),
        raw_query(db, "SELECT name, owner, token FROM reactor_locks ORDER BY 1"),
    ]


def _set_up(scope: reactor.Scope) -> None:
    scope.set_many(
        {"doc": {"n": 1, "tags": ["a"]}, "count": 5, "queue": [1, 2, 3], "text": "x", "old": 0}
    )
    scope.set("short", "lived", ttl=60)


OPERATIONS: dict[str, Callable[[reactor.State], Any]] = {
    "set a new key": lambda state: state.scope("s").set("new", {"a": 1}),
    "set an existing key": lambda state: state.scope("s").set("doc", {"n": 2}),
    "set_many": lambda state: state.scope("s").set_many({"m1": 1, "m2": [2]}),
    "delete": lambda state: state.scope("s").delete("old"),
    "increment": lambda state: state.scope("s").increment("count", 3),
    "update ops": lambda state: state.scope("s").update(
        "doc", [ops.increment("n"), ops.append("b", "tags"), ops.set("ok", True)]
    ),
    "JSON Patch": lambda state: state.scope("s").update(
        "doc", [{"op": "test", "path": "/n", "value": 1}, {"op": "add", "path": "/x", "value": 9}]
    ),
    "push": lambda state: state.scope("s").push("queue", 4, 5),
    "pop": lambda state: state.scope("s").pop("queue"),
    "compare_and_swap": lambda state: state.scope("s").compare_and_swap("count", 5, 50),
    "append": lambda state: state.scope("s").append("text", "yz"),
    "clear": lambda state: state.scope("s").clear("d*"),
    "expire": lambda state: state.scope("s").expire("doc", 30),
    "transaction": lambda state: _transfer(state.scope("s")),
    "lock": lambda state: state.lock("deploy", ttl=30).acquire(blocking=False),
}


def _transfer(scope: reactor.Scope) -> None:
    with scope.transaction() as tx:
        tx.set("count", tx.get("count") - 1)
        tx.set("moved", 1)
        tx.delete("old")


@pytest.fixture
def faulty(
    open_state: Callable[..., reactor.State], clock: ManualClock
) -> Iterator[tuple[reactor.State, Callable[[int | None], None]]]:
    # No background upkeep: a compaction's statements would take the armed fault.
    state = open_state(clock=clock, sweep_interval=1_000_000)
    store = engine_of(state).store
    real = store._writer  # type: ignore[attr-defined]
    error = _driver_error(store)

    def inject(fail_at: int | None) -> None:
        writer = store._writer  # type: ignore[attr-defined]
        if isinstance(writer, FaultyConnection):
            writer = writer._conn
        if writer is None or getattr(writer, "closed", False):  # PostgreSQL drops a failed one
            writer = store.reconnect_writer()  # type: ignore[attr-defined]
        if fail_at is None:
            store._writer = writer  # type: ignore[attr-defined]
        else:
            store._writer = FaultyConnection(writer, _Counter(fail_at, error))  # type: ignore[attr-defined]

    yield state, inject
    store._writer = real  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_the_nth_statement_failing_changes_nothing_until_the_operation_succeeds(
    name: str,
    faulty: tuple[reactor.State, Callable[[int | None], None]],
    db_path: Any,
) -> None:
    state, inject = faulty
    scope = state.scope("s")
    _set_up(scope)
    events: list[tuple[int, str, str]] = []
    state.subscribe(lambda event: events.append((event.revision, event.key, event.type)))
    revision = state.stats()["revision"]
    before = _contents(db_path)
    operation = OPERATIONS[name]
    failures = 0
    for fail_at in range(1, MAX_STATEMENTS):
        inject(fail_at)
        caught: reactor.ReactorError | None = None
        try:
            result = operation(state)
        except reactor.ReactorError as exc:
            caught = exc
        inject(None)
        if caught is None:
            break
        failures += 1
        assert isinstance(caught, reactor.StorageError), repr(caught)
        assert "injected fault" in str(caught.__cause__), repr(caught.__cause__)
        assert _contents(db_path) == before, f"statement {fail_at} left a change"
        assert state.stats()["revision"] == revision
    else:
        pytest.fail(f"{name} never succeeded")
    assert failures >= 2  # every operation runs a few statements: each was tried
    # It went through once: its changes are logged once, and published once.
    after = _contents(db_path)
    assert after != before, f"{name} changed nothing"
    logged = [(rev, key, kind) for rev, _, key, kind, _ in after[1] if rev > revision]
    wait_for(lambda: len([e for e in events if e[0] > revision]) >= len(logged))
    time.sleep(0.05)  # an event too many would show up now
    assert [event for event in events if event[0] > revision] == logged
    if name == "lock":
        assert result is True
    # The scope goes on working.
    assert scope.set("after", 1).new_value == 1
    assert scope.increment("count") is not None
