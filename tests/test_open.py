"""Opening engines: targets, sharing, closing, options and the schema (SPEC §1)."""

from __future__ import annotations

import os
import random
import stat
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import reactor
from tests.conftest import engine_of

from .conftest import postgres_url, raw_query

Opener = Callable[..., reactor.State]


def test_a_file_path_creates_the_file_and_its_folders(open_state: Opener, tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "state.db"
    state = open_state(path)
    state.scope("s").set("k", 1)
    assert path.exists()
    assert state.location == str(path)


def test_state_survives_closing_and_reopening(open_state: Opener, db_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("s").set("k", {"v": [1, 2]})
    with reactor.open(str(db_path)) as state:
        assert state.scope("s").get("k") == {"v": [1, 2]}


def test_sqlite_urls(open_state: Opener, tmp_path: Path) -> None:
    path = tmp_path / "url.db"
    with reactor.open(f"sqlite:///{path}") as state:
        state.scope("s").set("k", "via url")
    with reactor.open(path) as state:
        assert state.scope("s").get("k") == "via url"


def test_private_memory_engines_share_nothing(open_state: Opener) -> None:
    first, second = open_state(":memory:"), open_state(":memory:")
    first.scope("s").set("k", 1)
    assert second.scope("s").get("k") is None
    assert open_state("sqlite://").scope("s").get("k") is None


def test_named_memory_engines_are_shared_in_process(open_state: Opener) -> None:
    first, second = open_state(":memory:jobs"), open_state(":memory:jobs")
    first.scope("s").set("k", 1)
    assert second.scope("s").get("k") == 1
    assert open_state(":memory:other").scope("s").get("k") is None


def test_a_named_memory_engine_forgets_when_its_last_handle_closes() -> None:
    with reactor.open(":memory:temp") as state:
        state.scope("s").set("k", 1)
    with reactor.open(":memory:temp") as state:
        assert state.scope("s").get("k") is None


def test_memory_durability_keeps_nothing_on_disk(open_state: Opener, tmp_path: Path) -> None:
    path = tmp_path / "never.db"
    state = open_state(path, durability="memory")
    state.scope("s").set("k", 1)
    assert open_state(path, durability="memory").scope("s").get("k") == 1
    assert not path.exists()


def test_default_database_is_reactor_db_then_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("REACTOR_DB", str(tmp_path / "env.db"))
    with reactor.open() as state:
        state.scope("s").set("k", 1)
    assert (tmp_path / "env.db").exists()

    monkeypatch.delenv("REACTOR_DB")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with reactor.open() as state:
        state.scope("s").set("k", 2)
    home_db = tmp_path / "home" / ".reactor" / "state.db"
    assert home_db.exists()
    assert stat.S_IMODE(home_db.parent.stat().st_mode) == 0o700


def test_handles_to_one_database_share_one_engine(open_state: Opener, db_path: Any) -> None:
    first = open_state()
    # The same file by another spelling (a URL is taken as it is).
    same = db_path if isinstance(db_path, str) else str(db_path.parent / "." / db_path.name)
    second = open_state(same)
    assert engine_of(first) is engine_of(second)
    first.close()
    second.scope("s").set("still", "open")  # the engine lives while a handle does
    assert second.scope("s").get("still") == "open"


def test_closed_handles_and_their_scopes_raise(open_state: Opener) -> None:
    state = open_state()
    scope = state.scope("s")
    state.close()
    state.close()  # idempotent
    assert state.closed
    with pytest.raises(reactor.ClosedError):
        scope.get("k")
    with pytest.raises(reactor.ClosedError):
        scope.set("k", 1)
    with pytest.raises(reactor.ClosedError):
        state.scope("s")
    with pytest.raises(reactor.ClosedError):
        state.scopes()


def test_context_manager_closes(db_path: Path) -> None:
    with reactor.open(db_path) as state:
        scope = state.scope("s")
    with pytest.raises(reactor.ClosedError):
        scope.get("k")


def test_close_stops_every_thread_the_engine_started(db_path: Path) -> None:
    before = set(threading.enumerate())
    state = reactor.open(db_path)
    for i in range(20):
        state.scope(f"scope-{i}").set("k", i)
    assert len(set(threading.enumerate()) - before) > 1
    state.close()
    assert set(threading.enumerate()) - before == set()


def test_options_are_checked(open_state: Opener) -> None:
    with pytest.raises(reactor.InvalidArgumentError):
        open_state(durability="sometimes")
    with pytest.raises(reactor.InvalidArgumentError):
        open_state(max_depth=0)
    with pytest.raises(reactor.InvalidArgumentError):
        open_state(max_actors=-1)
    with pytest.raises(reactor.InvalidArgumentError):
        open_state(timeout=float("nan"))
    with pytest.raises(reactor.InvalidArgumentError):
        open_state("postgres-ish://x")


def test_conflicting_options_for_a_running_engine_are_refused(open_state: Opener) -> None:
    open_state(max_depth=10)
    assert open_state(max_depth=10) is not None
    assert open_state() is not None  # no options: join whatever runs
    with pytest.raises(reactor.InvalidArgumentError, match="max_depth=10"):
        open_state(max_depth=11)


@pytest.mark.sqlite_only("SQLite's journal mode and synchronous pragma")
@pytest.mark.parametrize(("durability", "synchronous"), [("normal", 1), ("full", 2)])
def test_durability_sets_wal_and_synchronous(
    open_state: Opener, durability: str, synchronous: int
) -> None:
    state = open_state(durability=durability)
    store = engine_of(state).store
    with store._reading() as conn:  # type: ignore[attr-defined]
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == synchronous


@pytest.mark.sqlite_only("the database files")
def test_database_files_are_private(open_state: Opener, db_path: Path) -> None:
    open_state().scope("s").set("k", 1)
    for suffix in ("", "-wal", "-shm"):
        path = Path(f"{db_path}{suffix}")
        assert path.exists(), path
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def _raw_version(db: Any) -> int:
    return int(raw_query(db, "SELECT value FROM reactor_meta WHERE name = 'schema_version'")[0][0])


def _sqlalchemy_url(db: Any) -> str:
    return db if isinstance(db, str) else f"sqlite:///{db}"


def _contents(db: Any) -> list[Any]:
    """Everything a database holds, for a before/after comparison."""
    if not isinstance(db, str):
        return [db.read_bytes()]
    return [
        raw_query(db, f"SELECT * FROM {table} ORDER BY 1")
        for table in ("reactor_meta", "reactor_kv", "reactor_changes")
    ]


def test_a_newer_database_raises_schema_error_and_stays_untouched(db_path: Any) -> None:
    with reactor.open(db_path) as state:
        state.scope("s").set("k", 1)
    raw_query(db_path, "UPDATE reactor_meta SET value = 99 WHERE name = 'schema_version'")
    before = _contents(db_path)
    with pytest.raises(reactor.SchemaError, match="99"):
        reactor.open(db_path)
    assert _contents(db_path) == before
    assert _raw_version(db_path) == 99


def test_a_file_that_is_no_database_is_named_in_the_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database; " * 10)
    with pytest.raises(reactor.StorageError) as raised:
        reactor.open(path)
    message = str(raised.value)
    assert str(path) in message
    assert "not a SQLite database, or it is damaged" in message
    assert path.read_bytes() == b"these are my notes, not a database; " * 10  # untouched


@pytest.mark.postgresql_only
def test_a_missing_postgresql_schema_says_how_to_create_it() -> None:
    url = postgres_url()
    missing = url + ("&" if "?" in url else "?") + "options=-csearch_path%3Dreactor_no_such_schema"
    with pytest.raises(reactor.StorageError) as raised:
        reactor.open(missing)
    message = str(raised.value)
    assert "reactor_no_such_schema" in message or missing in message
    assert "CREATE SCHEMA" in message
    assert "CREATE TABLE" not in message


# -- errors after open name the database -------------------------------------------
@pytest.mark.sqlite_only("a damaged file")
def test_a_file_damaged_after_open_is_named_in_the_errors(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with reactor.open(path) as state:  # closing checkpoints it: the values are in the file
        state.scope("s").set_many({f"k{i}": "x" * 2000 for i in range(300)})
    with reactor.open(path) as state:
        scope = state.scope("s")
        assert scope.get("k1") == "x" * 2000
        with path.open("r+b") as file:  # every page past the first two, overwritten
            file.seek(8192)
            file.write(random.Random(28).randbytes(path.stat().st_size - 8192))
        for call in (lambda: scope.get("k250"), scope.keys, lambda: scope.set("k1", 1)):
            with pytest.raises(reactor.StorageError) as raised:
                call()
            assert str(raised.value).startswith(f"the database {path} is damaged: ")


@pytest.mark.sqlite_only("the database files")
@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="root: its file modes bind only at open, so files are made immutable (chattr +i)",
)
def test_a_file_made_unwritable_after_open_is_named_in_the_error(tmp_path: Path) -> None:
    folder = tmp_path / "db"
    path = folder / "state.db"
    with reactor.open(path) as state:
        scope = state.scope("s")
        scope.set("k", 1)
        # Not the -shm file: SQLite maps it into memory, where a refused write is a SIGBUS.
        frozen = [str(path), f"{path}-wal", str(folder)]
        try:
            subprocess.run(["chattr", "+i", *frozen], check=True, capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError) as exc:
            pytest.skip(f"chattr +i is not available here: {exc}")
        try:
            with pytest.raises(reactor.StorageError) as raised:
                scope.set("k", 2)
            assert scope.get("k") == 1
        finally:
            subprocess.run(["chattr", "-i", *frozen], check=False, capture_output=True, timeout=10)
    assert str(raised.value).startswith(f"the database {path} failed: ")


@pytest.mark.postgresql_only
def test_a_postgresql_error_after_open_names_the_url_without_its_password(db_path: str) -> None:
    # The test server trusts its clients: a password in the URL is sent, and ignored.
    url = sa.make_url(db_path).set(password="hunter2")  # noqa: S106 - a test's
    with reactor.open(url.render_as_string(hide_password=False)) as state:
        scope = state.scope("s")
        scope.set("k", 1)
        raw_query(db_path, "DROP TABLE reactor_kv CASCADE")  # the database went bad
        with pytest.raises(reactor.StorageError) as raised:
            scope.keys()
    message = str(raised.value)
    assert message.startswith(f"the database {url.render_as_string(hide_password=True)} ")
    assert "***" in message
    assert "hunter2" not in message
    assert "reactor_kv" in message  # the server's own words follow
