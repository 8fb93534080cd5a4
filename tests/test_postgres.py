"""What only the PostgreSQL backend does: URLs, its write lock, notifications, lost
connections. Needs ``REACTOR_TEST_POSTGRES_URL``; skips without it (in either pass)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

import reactor
from reactor import _engine, _schema

from .conftest import PostgresSchemas, postgres_url, raw_query, wait_for


@pytest.fixture
def schemas() -> Iterator[PostgresSchemas]:
    made = PostgresSchemas(postgres_url())
    yield made
    for engine in list(_engine._live_engines):
        engine.close()
    made.drop_all()


@pytest.fixture
def admin() -> Iterator[psycopg.Connection[Any]]:
    url = sa.make_url(postgres_url()).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as conn:
        yield conn


def _store(state: reactor.State) -> Any:
    return state._engine_or_raise().store


def _backend_pid(conn: Any) -> int:
    return int(conn.info.backend_pid)


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_plain_postgresql_urls_use_psycopg(schemas: PostgresSchemas, scheme: str) -> None:
    url = schemas.create().replace("postgresql+psycopg://", f"{scheme}://")
    with reactor.open(url) as state:
        state.scope("s").set("k", 1)
        assert state.stats()["database"].startswith("postgresql+psycopg://")
        assert state.scope("s").get("k") == 1


def test_each_schema_is_a_database_of_its_own(schemas: PostgresSchemas) -> None:
    with reactor.open(schemas.create()) as first, reactor.open(schemas.create()) as second:
        heard: list[str] = []
        second.subscribe(lambda event: heard.append(event.key))
        first.scope("s").set("only-in-first", 1)
        second.scope("s").set("only-in-second", 2)
        wait_for(lambda: heard == ["only-in-second"])
        time.sleep(0.2)  # a notification from the other schema would have arrived
        assert heard == ["only-in-second"]
        assert first.scope("s").keys() == ["only-in-first"]
        assert second.scope("s").keys() == ["only-in-second"]


@pytest.mark.parametrize(("durability", "setting"), [("normal", "on"), ("memory", "off")])
def test_durability_sets_synchronous_commit(
    schemas: PostgresSchemas, durability: str, setting: str
) -> None:
    with reactor.open(schemas.create(), durability=durability) as state:
        assert _store(state)._query("SHOW synchronous_commit", ()) == [(setting,)]


def test_a_writer_waits_for_another_holder_of_the_write_lock_then_busy_error(
    schemas: PostgresSchemas, admin: psycopg.Connection[Any]
) -> None:
    url = schemas.create()
    with reactor.open(url, timeout=1) as state:
        scope = state.scope("s")
        scope.set("k", 1)
        key = _store(state)._lock_key
        admin.execute("SELECT pg_advisory_lock(%s)", (key,))  # as another process's writer
        try:
            started = time.monotonic()
            with pytest.raises(reactor.BusyError) as caught:
                scope.set("k", 2)
            assert time.monotonic() - started >= 0.9
            assert isinstance(caught.value.__cause__, psycopg.Error)
        finally:
            admin.execute("SELECT pg_advisory_unlock(%s)", (key,))
        assert scope.get("k") == 1  # nothing applied
        assert scope.set("k", 3).old_value == 1  # and the scope works again
    log = raw_query(url, "SELECT key, new_value FROM reactor_changes ORDER BY revision")
    assert log == [("k", "1"), ("k", "3")]


def test_notifications_carry_only_the_revision(
    schemas: PostgresSchemas, admin: psycopg.Connection[Any]
) -> None:
    with reactor.open(schemas.create()) as state:
        admin.execute(f"LISTEN {_store(state)._channel}")
        state.scope("s").set("k", {"big": "x" * 100_000})
        state.scope("s").set_many({"a": 1, "b": 2})
        payloads = [note.payload for note in admin.notifies(timeout=2, stop_after=2)]
    assert payloads == ["1", "3"]  # the last revision of each commit, nothing else


def test_a_failed_write_sends_no_notification(
    schemas: PostgresSchemas, admin: psycopg.Connection[Any]
) -> None:
    with reactor.open(schemas.create()) as state:
        admin.execute(f"LISTEN {_store(state)._channel}")
        scope = state.scope("s")
        scope.set("text", "not a number")
        with pytest.raises(reactor.TypeMismatchError):
            scope.increment("text")
        payloads = [note.payload for note in admin.notifies(timeout=0.5)]
    assert payloads == ["1"]


def test_a_listener_that_loses_its_connection_catches_up(
    schemas: PostgresSchemas, admin: psycopg.Connection[Any]
) -> None:
    url = schemas.create()
    with reactor.open(url) as watcher_state, reactor.open(url + "&application_name=w") as writer:
        # Two engines on one database in this process, as two processes would be.
        assert watcher_state._engine_or_raise() is not writer._engine_or_raise()
        seen: list[int] = []
        watcher_state.subscribe(lambda event: seen.append(event.new_value))
        scope = writer.scope("s")
        scope.set("k", 0)
        wait_for(lambda: seen == [0])
        listener = _store(watcher_state)._listener
        for i in range(1, 40):
            if i % 10 == 0:  # the server drops the listener's connection, again and again
                admin.execute("SELECT pg_terminate_backend(%s)", (_backend_pid(listener),))
            scope.set("k", i)
        wait_for(lambda: len(seen) >= 40, timeout=10)
        time.sleep(0.2)
        assert seen == list(range(40))  # nothing lost, nothing repeated, in order
        assert _store(watcher_state)._listener is not listener


def test_writes_and_reads_survive_dropped_connections(
    schemas: PostgresSchemas, admin: psycopg.Connection[Any]
) -> None:
    with reactor.open(schemas.create()) as state:
        scope = state.scope("s")
        scope.set("k", 1)
        assert scope.get("k") == 1
        store = _store(state)
        pids = [_backend_pid(store._writer)] + [_backend_pid(c) for c in store._idle]
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        wait_for(lambda: store._writer.closed or _server_gone(admin, pids))
        assert scope.get("k") == 1  # a read tries once more, on a new connection
        assert scope.increment("n") == 1  # the writer reconnects before its next write
        assert scope.get("n") == 1


def _server_gone(admin: psycopg.Connection[Any], pids: list[int]) -> bool:
    alive = admin.execute(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
    ).fetchall()
    return bool(alive[0][0] == 0)


def test_opening_a_new_database_from_many_threads_at_once_migrates_it_once(
    schemas: PostgresSchemas,
) -> None:
    url = schemas.create()
    errors: list[BaseException] = []
    states: list[reactor.State] = []
    lock = threading.Lock()

    def open_one(n: int) -> None:
        try:
            # A query option makes each URL (and so each engine) distinct.
            state = reactor.open(f"{url}&application_name=t{n}")
            with lock:
                states.append(state)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        assert errors == []
        assert len(states) == 4
        version = raw_query(url, "SELECT value FROM reactor_meta WHERE name = 'schema_version'")
        assert version == [(_schema.SCHEMA_VERSION,)]
    finally:
        for state in states:
            state.close()


def test_other_drivers_are_refused() -> None:
    with pytest.raises(reactor.InvalidArgumentError, match="psycopg"):
        reactor.open("postgresql+psycopg2://u@localhost/db")
    with pytest.raises(reactor.InvalidArgumentError, match="psycopg"):
        reactor.open("postgresql+asyncpg://u@localhost/db")


def test_a_server_that_does_not_answer_is_a_storage_error() -> None:
    with pytest.raises(reactor.StorageError):
        reactor.open("postgresql+psycopg://postgres@127.0.0.1:1/test?connect_timeout=2")


def test_a_write_cut_off_during_its_commit_says_the_outcome_is_unknown(
    schemas: PostgresSchemas, admin: psycopg.Connection[Any]
) -> None:
    """A killer thread terminates the writer's connection again and again while writes
    go on. A write that succeeded is there; one that failed with a plain StorageError
    (nothing applied) is not; one that failed with OutcomeUnknownError may be either."""
    url = schemas.create()
    outcomes: dict[int, str] = {}
    stop = threading.Event()
    with reactor.open(url) as state:
        scope = state.scope("s")
        store = _store(state)
        heard: list[str] = []
        state.subscribe(lambda event: heard.append(event.key))

        def killer() -> None:
            while not stop.is_set():
                writer = store._writer
                if writer is not None and not writer.closed:
                    admin.execute("SELECT pg_terminate_backend(%s)", (_backend_pid(writer),))
                stop.wait(0.003)

        thread = threading.Thread(target=killer)
        thread.start()
        try:
            for i in range(400):
                try:
                    scope.set(f"k{i}", i)
                    outcomes[i] = "ok"
                except reactor.OutcomeUnknownError:
                    outcomes[i] = "unknown"
                except reactor.StorageError:
                    outcomes[i] = "failed"
        finally:
            stop.set()
            thread.join(10)
        present = set(scope.keys())
        kinds = {kind: [i for i, k in outcomes.items() if k == kind] for kind in outcomes.values()}
        assert all(f"k{i}" in present for i in kinds.get("ok", []))
        wrongly_failed = [i for i in kinds.get("failed", []) if f"k{i}" in present]
        assert wrongly_failed == [], "a write said nothing was applied, but it was"
        unknown = kinds.get("unknown", [])
        applied = sum(f"k{i}" in present for i in unknown)
        print(
            f"{len(kinds.get('ok', []))} ok, {len(kinds.get('failed', []))} failed before "
            f"the commit, {len(unknown)} unknown ({applied} of them applied)"
        )
        assert unknown, "the killer never hit a commit: the test proves nothing"
        # Every write that committed is delivered, those of unknown outcome included.
        wait_for(lambda: set(heard) == present, timeout=10)
