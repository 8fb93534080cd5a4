"""Fixtures shared by the suite: a real database for each test, a manual clock,
clean-up, and the one door to reactor's insides for the tests that need them: an
engine's (``engine_of``, to inject faults into its store or mailboxes, and what its hub
holds), the registry's, and the dashboard's server in a thread (``dashboard_thread``).

The suite runs on SQLite files by default; ``--backend=postgresql`` runs it again on
the PostgreSQL server named by ``REACTOR_TEST_POSTGRES_URL``, each test in a schema of
its own (dropped afterwards). Tests of what only SQLite has (its files, pragmas, WAL)
are marked ``sqlite_only`` and skip there, saying why; tests that use no database
under test run in the SQLite pass only, and tests of the PostgreSQL server itself
(``postgresql_only``) in the PostgreSQL pass only.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import reactor
from reactor._engine.port import EnginePort
from reactor._handles import registry as _registry
from reactor._handles import takers as _takers
from reactor._handles import waiting as _waiting
from reactor._handles.binding import engine_of as _engine_of
from reactor.testing import ManualClock

POSTGRES_ENV = "REACTOR_TEST_POSTGRES_URL"


# The command line as a user runs it: a subprocess with a wide terminal, no REACTOR_DB.
CLI_ENV = {**os.environ, "COLUMNS": "200"}
CLI_ENV.pop("REACTOR_DB", None)


def run_reactor(
    *args: str, cwd: Path, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m reactor ARGS`` in ``cwd``; its status and output (within 60 s)."""
    return subprocess.run(
        [sys.executable, "-m", "reactor", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=CLI_ENV if env is None else env,
        input=stdin,
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        choices=("sqlite", "postgresql"),
        default="sqlite",
        help=f"the database the suite runs on (postgresql: the server in ${POSTGRES_ENV})",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("backend") != "postgresql":
        return
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        raise pytest.UsageError(f"--backend=postgresql needs ${POSTGRES_ENV} (a server URL)")
    try:
        PostgresSchemas(url).drop_all()  # connects: fail now if the server does not answer
    except Exception as exc:
        raise pytest.UsageError(
            f"the PostgreSQL server at ${POSTGRES_ENV} does not answer: {exc}"
        ) from exc


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" not in config.getoption("markexpr"):
        for item in items:
            if item.get_closest_marker("slow") is not None:
                item.add_marker(pytest.mark.skip(reason="a long campaign: run it with -m slow"))
    if config.getoption("backend") != "postgresql":
        for item in items:
            if item.get_closest_marker("postgresql_only") is not None:
                item.add_marker(pytest.mark.skip(reason=ON_POSTGRESQL_ONLY))
        return
    for item in items:
        marker = item.get_closest_marker("sqlite_only")
        if marker is not None:
            why = marker.args[0] if marker.args else "it tests SQLite itself"
            item.add_marker(pytest.mark.skip(reason=f"SQLite only: {why}"))
        elif not _uses_the_backend(item):
            item.add_marker(pytest.mark.skip(reason=NOT_ON_THE_BACKEND))


# The PostgreSQL pass runs what a database under test could change: a test that opens
# none (the glob matcher, the docs, the packaging) would only run the SQLite pass again.
ON_POSTGRESQL_ONLY = "PostgreSQL only: it runs in the pass with --backend=postgresql"
NOT_ON_THE_BACKEND = "uses no database under test: the SQLite pass runs it"
# The command line of a feature, over the verbs the library's tests run on both backends:
# tests/test_cli.py runs the command line itself on PostgreSQL.
CLI_ON_SQLITE = "the command line over verbs tested on both backends (test_cli runs it on both)"


def _uses_the_backend(item: pytest.Item) -> bool:
    """Whether ``item`` runs on the backend under test: through ``db_path`` or
    ``fresh_db`` (and every fixture built on them), or marked as using it another way."""
    return (
        not {"db_path", "fresh_db"}.isdisjoint(getattr(item, "fixturenames", ()))
        or item.get_closest_marker("uses_backend") is not None
        or item.get_closest_marker("postgresql_only") is not None
    )


def postgres_url() -> str:
    """The test server's URL, or a skip saying how to give one."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"PostgreSQL tests need ${POSTGRES_ENV} (e.g. postgresql+psycopg://...)")
    return url


class PostgresSchemas:
    """Fresh schemas on the test server, each a reactor database of its own."""

    def __init__(self, url: str) -> None:
        self.url = sa.make_url(url)
        admin = self.url.set(drivername="postgresql").render_as_string(hide_password=False)
        import psycopg

        self._admin = psycopg.connect(admin, autocommit=True, connect_timeout=10)
        self._created: list[str] = []

    def create(self) -> str:
        """A new, empty schema; the URL of a reactor database in it."""
        name = f"t_{uuid.uuid4().hex[:16]}"
        self._admin.execute(f"CREATE SCHEMA {name}")
        self._created.append(name)
        options = {"options": f"-csearch_path={name}"}
        return self.url.update_query_dict(options).render_as_string(hide_password=False)

    def drop_all(self) -> None:
        self._admin.execute("SET lock_timeout = '10s'")
        for name in self._created:
            self._admin.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        self._created.clear()
        self._admin.close()


def backend(config: pytest.Config) -> str:
    return str(config.getoption("backend"))


def raw_postgres(url: str) -> Any:
    """A psycopg connection (autocommit) to the schema of a test database's URL, past
    reactor."""
    import psycopg

    parsed = sa.make_url(url).set(drivername="postgresql")
    options = parsed.query.get("options")
    conninfo = parsed.set(query={}).render_as_string(hide_password=False)
    return psycopg.connect(conninfo, options=options, autocommit=True)


def raw_query(db: Any, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` (``?`` placeholders) read straight from a test database, SQLite
    file or PostgreSQL URL, past reactor."""
    if isinstance(db, str) and db.startswith("postgresql"):
        with raw_postgres(db) as conn:
            cursor = conn.execute(sql.replace("?", "%s"), params)
            return [] if cursor.description is None else [tuple(row) for row in cursor]
    import sqlite3

    with sqlite3.connect(db) as conn:
        rows = conn.execute(sql, params).fetchall()
    conn.close()
    return rows


def engine_of(state: reactor.State) -> EnginePort:
    """The engine behind ``state``: the tests' one door to its insides (its store,
    mailboxes and hub), for those that inject faults there or look at what only the
    engine knows (a request deferred for a transaction, the hub's listeners). Every
    other test uses the public API and ``reactor.testing`` (see ``tests/README.md``).
    """
    return _engine_of(state)


def waiters(engine: EnginePort) -> list[Any]:
    """The ``wait_for`` calls waiting on ``engine``'s changes (listeners of its hub)."""
    return [found for found in engine.hub.listeners() if isinstance(found, _waiting.Waiter)]


def take_lines(engine: EnginePort) -> list[Any]:
    """The queues' lines of waiting takes that listen on ``engine``'s hub (each has
    its ``scope``, ``queue:NAME``, and its ``len``, the takes waiting)."""
    return [found for found in engine.hub.listeners() if isinstance(found, _takers.Line)]


def engines_registered() -> list[str]:
    """The keys of the engines the registry holds (running, opening or closing): empty
    once every handle is closed."""
    return sorted({*_registry._engines, *_registry._opening, *_registry._closing})


@contextlib.contextmanager
def dashboard_thread(
    db: Any, *, write: bool = False, hosts: list[str] | None = None, ping: float = 0.2
) -> Iterator[str]:
    """The dashboard of ``db`` under uvicorn in a thread, on a free port: its URL.

    Stopped (and the thread joined) afterwards; a stop that hangs fails the test. (The
    dashboard's server is reactor's, private: this is the tests' door to it.)
    """
    from reactor._ui import app, server

    hosts = hosts or server.allowed_hosts("127.0.0.1")
    with asgi_thread(app.create_app(db, write=write, hosts=hosts, ping=ping)) as url:
        yield url


@contextlib.contextmanager
def asgi_thread(asgi: Any) -> Iterator[str]:
    """The ASGI app ``asgi`` under uvicorn in a thread, as the dashboard's server runs
    it, on a free port of 127.0.0.1: its URL. Stopped and joined afterwards."""
    import uvicorn  # the dashboard's: imported by the tests that start one only

    from reactor._ui import server

    listener = server.listen("127.0.0.1", 0)
    running = uvicorn.Server(server.app_config(asgi, listener))
    thread = threading.Thread(
        target=running.run, kwargs={"sockets": [listener]}, name="test-dashboard"
    )
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while not running.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                pytest.fail("the dashboard did not start")
            time.sleep(0.01)
        yield server.url_of(listener)
    finally:
        running.should_exit = True
        thread.join(server.GRACE + 10)
        listener.close()
        assert not thread.is_alive(), "the dashboard did not stop"


def canon(value: Any) -> str:
    """Canonical JSON: tells ``1`` from ``1.0`` and ``True``, ignores key order."""
    return json.dumps(value, sort_keys=True)


@contextlib.contextmanager
def held_elsewhere(*turns: Any) -> Iterator[None]:
    """Hold ``turns`` (a store's ``_gate``, a mailbox's ``_running``) in another thread
    for the body, as a write running there would."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        for turn in turns:
            assert turn.take(10)
        taken.set()
        done.wait(60)
        for turn in reversed(turns):
            turn.give_back()

    holder = threading.Thread(target=hold, name="holder")
    holder.start()
    try:
        assert taken.wait(10)
        yield
    finally:
        done.set()
        holder.join(10)


def crowding() -> float:
    """How many times over the machine's cores are asked for (the last minute's load
    average over their count), at least 1: a bound of "within a second" that a test
    holds a burst of work to is that times longer on a machine this crowded (CI beside
    two CPU burners and a second test run: 2 to 3), and just that on a quiet one."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


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
def clock() -> ManualClock:
    return ManualClock()


def _new_database(request: pytest.FixtureRequest, tmp_path: Path, name: str) -> Iterator[Any]:
    """A new database of the backend under test: the SQLite file ``name`` in
    ``tmp_path``, or the URL of a fresh PostgreSQL schema (dropped afterwards, once the
    engines left open on it are closed). Either goes to ``reactor.open`` as it is."""
    if backend(request.config) != "postgresql":
        yield tmp_path / name
        return
    schemas = PostgresSchemas(postgres_url())
    try:
        yield schemas.create()
    finally:
        for engine in list(_registry._live_engines):
            engine.close()
        schemas.drop_all()


@pytest.fixture
def db_path(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The test's database: a SQLite file, or (``--backend=postgresql``) a schema."""
    yield from _new_database(request, tmp_path, "state.db")


@pytest.fixture
def fresh_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A second, empty database on the same backend as ``db_path``."""
    yield from _new_database(request, tmp_path, "fresh.db")


@pytest.fixture(params=["database", "named memory"])
def target(request: pytest.FixtureRequest, db_path: Any) -> Any:
    """The test's database, or an in-memory database shared in this process by name
    (each test runs once with either)."""
    return db_path if request.param == "database" else f":memory:race-{uuid.uuid4().hex}"


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    """A directory for export targets, apart from the database file."""
    path = tmp_path / "out"
    path.mkdir()
    return path


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
def state(open_state: Callable[..., reactor.State], clock: ManualClock) -> reactor.State:
    """A handle on a fresh database file, with the manual clock."""
    return open_state(clock=clock)


def close_every_engine() -> list[str]:
    """Close every engine still running in this process (handles or not); the keys of
    those there were."""
    leftovers = list(_registry._live_engines)
    for engine in leftovers:
        engine.close()
    return [engine.key for engine in leftovers]


@pytest.fixture(autouse=True)
def _no_engine_left_behind() -> Iterator[None]:
    yield
    leftovers = close_every_engine()
    assert not leftovers, f"a test left engines open: {leftovers}"
