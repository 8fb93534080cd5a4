"""Storage, tested on purpose (``reactor._storage``): the statements both SQL backends
share, with every name they look up in brackets, which PostgreSQL turns into the form its
indexes hold; group commit across scopes, on an in-memory SQLite store with a leader
held inside its transaction so that the others queue behind it deterministically; and
what only the PostgreSQL backend does (URLs, its write lock, notifications, lost
connections: those tests need ``REACTOR_TEST_POSTGRES_URL`` and skip without it)."""

from __future__ import annotations

import hashlib
import io
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import psycopg.sql
import pytest
import sqlalchemy as sa

import reactor
from reactor._backup import exchange as _exchange
from reactor._backup.export import ExportView
from reactor._base.keys import compile_pattern
from reactor._handles import registry as _registry
from reactor._handles.binding import engine_of
from reactor._storage import postgres_statements as _pg_statements
from reactor._storage import postgres_text as _postgres
from reactor._storage import schema as _schema
from reactor._storage import sql_text as _sql
from reactor._storage.combine import Combiner
from reactor._storage.schema import NAME_INDEXED
from reactor._storage.sqlite import SQLiteStore
from reactor._storage.txn import WriteTxn
from reactor._work import jobs as _jobs
from reactor.errors import BusyError, StorageError, TypeMismatchError
from reactor.testing import run_upkeep

from .conftest import PostgresSchemas, backend, postgres_url, raw_postgres, raw_query, wait_for

# -- the statements both SQL backends share --------------------------------------------

# A name column compared, or named as unique, without brackets; "name = '...'" is the
# name of a row of reactor_meta, not a user's name.
_BARE = re.compile(r"(?<![\[\w.])(?:\w+\.)?(scope|key|name|queue)\s*(=(?! ')|>=|<=|<|>|IN\b)")
_BARE_RIGHT = re.compile(r"(?:=|>=|<=|<|>)\s*(?:\w+\.)?(scope|key|name|queue)\b")
_BARE_CONFLICT = re.compile(r"ON CONFLICT \([^)]*(?<!\[)\b(scope|key|name)\b(?!\])")

STATEMENTS = {
    name: value
    for name, value in vars(_sql).items()
    if name.isupper() and isinstance(value, str) and "reactor_" in value
}


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_every_name_a_statement_looks_up_is_in_brackets(name: str) -> None:
    sql = STATEMENTS[name]
    assert not _BARE.search(sql), sql
    assert not _BARE_RIGHT.search(sql), sql
    assert not _BARE_CONFLICT.search(sql), sql
    converted = _postgres.pg(sql)
    assert not re.search(r"\[\w", converted), converted


def test_the_statements_of_postgresql_alone_compare_names_as_indexed() -> None:
    for sql, compared in (
        (_postgres.CHANGES, "reactor_name(k.key)"),
        (_postgres.ROWS_ONLY, "reactor_name(k.key)"),
        (_postgres.READ_AHEAD, "reactor_name(r.key) = reactor_name(w.key)"),
        (_postgres.RESERVE_IDS, "reactor_name(j.key) = reactor_name(w.key)"),
    ):
        assert not re.search(r"\[\w", sql), sql
        assert compared in sql


def test_names_compared_with_placeholders_take_their_indexed_form() -> None:
    assert _postgres.pg("SELECT 1 FROM t WHERE [scope] = ? AND [key] IN (?, ?)") == (
        "SELECT 1 FROM t WHERE reactor_name(scope) = reactor_name(%s) "
        "AND reactor_name(key) IN (reactor_name(%s), reactor_name(%s))"
    )
    # A bound is compared as it is: ranged() gives none longer than NAME_INDEXED.
    assert _postgres.pg("WHERE [key] >= ? AND [key] < ?") == (
        "WHERE reactor_name(key) >= %s AND reactor_name(key) < %s"
    )
    assert _postgres.pg("WHERE j.[queue] = q.[name] ON CONFLICT ([name], revision)") == (
        "WHERE reactor_name(j.queue) = reactor_name(q.name) "
        "ON CONFLICT (reactor_name(name), revision)"
    )


LONG_LOW = "a" * 600
CUT = "a" * NAME_INDEXED


@pytest.mark.parametrize(
    ("bounds", "params"),
    [
        (None, ()),
        (("a", "b"), ("a", "b")),
        ((CUT, CUT[:-1] + "b"), (CUT, CUT[:-1] + "b")),
        ((LONG_LOW, LONG_LOW[:-1] + "b"), (CUT, CUT[:-1] + "b")),  # a wider range
        (("\U0010ffff" * 600, None), ("\U0010ffff" * NAME_INDEXED,)),
    ],
)
def test_ranges_of_long_prefixes_widen_to_their_indexed_characters(
    bounds: tuple[str, str | None] | None, params: tuple[str, ...]
) -> None:
    sql, given = _sql.ranged(_sql.KEYS, "s", bounds, 1.0)
    assert given == ("s", 1.0, *params)
    assert sql == _sql.KEYS + (_sql.RANGE if params else "") + (
        _sql.RANGE_END if len(params) == 2 else ""
    )


# -- group commit across scopes -----------------------------------------------------


class Counted:
    """A store whose transactions are counted, and whose next one can be held open."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.store = SQLiteStore(None, durability="normal", timeout=timeout)
        self.transactions = 0
        self.records: list[list[Any]] = []
        real = self.store._write_once

        def counting(
            work: Any, now: float, on_commit: Any = None, scopes: Any = None, reads: Any = ()
        ) -> Any:
            self.transactions += 1
            return real(work, now, on_commit, scopes, reads)

        self.store._combiner = Combiner(counting, timeout)

    def queued(self) -> int:
        return len(self.store._combiner._queue)


@pytest.fixture
def counted() -> Iterator[Counted]:
    made = Counted()
    yield made
    made.store.close()


def setting(scope: str, key: str, text: str) -> Callable[[WriteTxn], str]:
    def work(txn: WriteTxn) -> str:
        txn.write(scope, key, txn.live_row(scope, key), text, None)
        return f"{scope}/{key}"

    return work


def holding(entered: threading.Event, release: threading.Event) -> Callable[[WriteTxn], str]:
    def work(txn: WriteTxn) -> str:
        entered.set()
        assert release.wait(10)
        txn.write("held", "k", txn.live_row("held", "k"), "0", None)
        return "held"

    return work


def in_thread(call: Callable[[], Any], results: dict[str, Any], name: str) -> threading.Thread:
    def run() -> None:
        try:
            results[name] = call()
        except BaseException as exc:
            results[name] = exc

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


def wait_until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def _held_leader(counted: Counted, results: dict[str, Any]) -> tuple[threading.Event, Any]:
    entered, release = threading.Event(), threading.Event()
    leader = in_thread(
        lambda: counted.store.write(holding(entered, release), 1.0, None, shared=True),
        results,
        "leader",
    )
    assert entered.wait(10)
    return release, leader


def test_writes_queued_behind_a_transaction_commit_together(counted: Counted) -> None:
    results: dict[str, Any] = {}
    committed: list[int] = []

    def hook(records: list[Any]) -> None:  # one hook, as every actor of an engine has
        committed.extend(record.revision for record in records)

    release, leader = _held_leader(counted, results)
    threads = [
        in_thread(
            lambda n=n: counted.store.write(setting(f"s{n}", "k", str(n)), 1.0, hook, shared=True),
            results,
            f"w{n}",
        )
        for n in range(6)
    ]
    wait_until(lambda: counted.queued() == 6)
    release.set()
    for thread in [leader, *threads]:
        thread.join(10)
    assert counted.transactions == 2  # the held one, then the six together
    assert results["leader"][0] == "held"
    for n in range(6):
        result, records = results[f"w{n}"]
        assert result == f"s{n}/k"
        assert len(records) == 6  # the records of the transaction it committed in
    assert committed == sorted(committed)  # in revision order
    assert len(committed) == 6
    assert [counted.store.get(f"s{n}", "k", 1.0) for n in range(6)] == [str(n) for n in range(6)]


def test_a_rollback_keeps_what_was_staged_before_its_savepoint(counted: Counted) -> None:
    """What a write replaced is kept from the first savepoint on (a lone write keeps
    none): rolling back undoes exactly the writes after the mark, a key written on
    both sides of it included."""

    def work(txn: WriteTxn) -> None:
        txn.write("s", "before", None, "1", None)
        txn.write("s", "both", None, "1", None)
        mark = txn.savepoint()
        txn.write("s", "both", txn.live_row("s", "both"), "2", None)
        txn.write("s", "after", None, "2", None)
        inner = txn.savepoint()
        txn.write("s", "inner", None, "3", None)
        txn.rollback_to(inner)
        assert txn.live_row("s", "inner") is None
        assert txn.live_row("s", "both") is not None
        txn.rollback_to(mark)

    _, records = counted.store.write(work, 1.0)
    assert [(record.key, record.type) for record in records] == [
        ("before", "created"),
        ("both", "created"),
    ]
    assert [counted.store.get("s", key, 1.0) for key in ("before", "both", "after", "inner")] == [
        "1",
        "1",
        None,
        None,
    ]


def test_a_piece_that_fails_is_undone_alone(counted: Counted) -> None:
    results: dict[str, Any] = {}

    def failing(txn: WriteTxn) -> None:
        txn.write("bad", "k", None, "1", None)
        raise TypeMismatchError("this piece does not apply")

    release, leader = _held_leader(counted, results)
    threads = [
        in_thread(
            lambda: counted.store.write(setting("a", "k", "1"), 1.0, shared=True), results, "a"
        ),
        in_thread(lambda: counted.store.write(failing, 1.0, shared=True), results, "bad"),
        in_thread(
            lambda: counted.store.write(setting("b", "k", "2"), 1.0, shared=True), results, "b"
        ),
    ]
    wait_until(lambda: counted.queued() == 3)
    release.set()
    for thread in [leader, *threads]:
        thread.join(10)
    assert counted.transactions == 2
    assert isinstance(results["bad"], TypeMismatchError)
    assert counted.store.get("bad", "k", 1.0) is None
    assert counted.store.get("a", "k", 1.0) == "1"
    assert counted.store.get("b", "k", 1.0) == "2"


def test_a_piece_that_fails_after_its_statements_has_every_piece_tried_alone(
    counted: Counted,
) -> None:
    """A savepoint's rollback takes back staged writes, not statements that ran (a
    job's insert): a piece that fails after some aborts the batch, and each piece then
    commits, or fails with its own error, alone; nothing of the failed piece remains."""
    results: dict[str, Any] = {}

    def failing(txn: WriteTxn) -> None:
        _jobs.enqueue(txn, "q", [_jobs.Put("1")])
        txn.write("bad", "k", None, "1", None)
        raise TypeMismatchError("this piece does not apply")

    release, leader = _held_leader(counted, results)
    threads = [
        in_thread(
            lambda: counted.store.write(setting("a", "k", "1"), 1.0, shared=True), results, "a"
        ),
        in_thread(lambda: counted.store.write(failing, 1.0, shared=True), results, "bad"),
        in_thread(
            lambda: counted.store.write(setting("b", "k", "2"), 1.0, shared=True), results, "b"
        ),
    ]
    wait_until(lambda: counted.queued() == 3)
    release.set()
    for thread in [leader, *threads]:
        thread.join(10)
    assert counted.transactions == 5  # the held one, the batch (aborted), each alone
    assert isinstance(results["bad"], TypeMismatchError)
    assert results["a"][0] == "a/k"
    assert results["b"][0] == "b/k"
    assert counted.store.get("bad", "k", 1.0) is None
    assert counted.store.get("a", "k", 1.0) == "1"
    found, _ = counted.store.write(lambda txn: txn.statements.jobs().job("q", 1), 1.0)
    assert found is None


def test_a_rollback_says_whether_statements_ran_since_its_mark(counted: Counted) -> None:
    def work(txn: WriteTxn) -> tuple[bool, bool]:
        staged = txn.savepoint()
        txn.write("s", "k", None, "1", None)
        clean = txn.rollback_to(staged)
        ran = txn.savepoint()
        _jobs.enqueue(txn, "q", [_jobs.Put("1")])
        return clean, txn.rollback_to(ran)

    (clean, after_statements), _ = counted.store.write(work, 1.0)
    assert clean is True
    assert after_statements is False


def test_a_failed_commit_fails_every_piece_with_its_own_error(
    counted: Counted, monkeypatch: pytest.MonkeyPatch
) -> None:
    results: dict[str, Any] = {}
    release, leader = _held_leader(counted, results)
    threads = [
        in_thread(
            lambda n=n: counted.store.write(setting(f"s{n}", "k", "1"), 1.0, shared=True),
            results,
            f"w{n}",
        )
        for n in range(3)
    ]
    wait_until(lambda: counted.queued() == 3)

    def broken(
        work: Any, now: float, on_commit: Any = None, scopes: Any = None, reads: Any = ()
    ) -> Any:
        raise StorageError("injected: the disk is full")

    counted.store._combiner._write_once = broken  # for the next transaction: the three
    release.set()
    for thread in [leader, *threads]:
        thread.join(10)
    errors = [results[f"w{n}"] for n in range(3)]
    assert all(isinstance(error, StorageError) for error in errors)
    assert len({id(error) for error in errors}) == 3
    assert all(counted.store.get(f"s{n}", "k", 1.0) is None for n in range(3))


def test_work_that_is_not_shared_runs_alone(counted: Counted) -> None:
    results: dict[str, Any] = {}
    release, leader = _held_leader(counted, results)
    threads = [
        in_thread(
            lambda: counted.store.write(setting("a", "k", "1"), 1.0, shared=True), results, "a"
        ),
        in_thread(lambda: counted.store.write(setting("solo", "k", "1"), 1.0), results, "solo"),
        in_thread(
            lambda: counted.store.write(setting("b", "k", "1"), 1.0, shared=True), results, "b"
        ),
    ]
    wait_until(lambda: counted.queued() == 3)
    release.set()
    for thread in [leader, *threads]:
        thread.join(10)
    # held; then the solo alone and the two shared together, in some order
    assert counted.transactions == 3
    assert all(not isinstance(results[name], BaseException) for name in ("a", "solo", "b"))


def test_a_wait_behind_a_stuck_writer_times_out_and_withdraws() -> None:
    counted = Counted(timeout=0.3)
    try:
        results: dict[str, Any] = {}
        release, leader = _held_leader(counted, results)
        with pytest.raises(BusyError):
            counted.store.write(setting("late", "k", "1"), 1.0, shared=True)
        assert counted.queued() == 0  # withdrawn: it will not commit later
        release.set()
        leader.join(10)
        assert counted.store.get("late", "k", 1.0) is None
    finally:
        counted.store.close()


def test_threads_writing_to_their_own_scopes_share_commits_and_keep_order(
    open_state: Callable[..., reactor.State],
) -> None:
    # Both backends' stores combine (SQLite's since issue 24): their own combiner, as
    # opened, counted by the engine's own counter of committed transactions.
    state = open_state()
    before = state.stats()["transactions"]
    seen: dict[str, list[int]] = {}
    state.subscribe(lambda event: seen.setdefault(event.scope, []).append(event.new_value))
    writes = 300

    def writer(n: int) -> None:
        scope = state.scope(f"w{n}")
        for i in range(writes):
            scope.set("k", i)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    wait_until(lambda: sum(len(values) for values in seen.values()) == 4 * writes)
    assert all(seen[f"w{n}"] == list(range(writes)) for n in range(4))
    transactions = state.stats()["transactions"] - before
    print(f"{4 * writes} writes from 4 threads in {transactions} transactions")
    assert transactions <= 4 * writes


def test_a_lead_dropped_by_an_interrupt_is_taken_by_the_first_in_line(
    counted: Counted, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader interrupted after it gave the lead up (its ``finally``'s first store)
    but before it handed it on: the first in line finds nobody leading within a slice,
    and leads. Nobody waits out the timeout (5 s here), and nothing is lost."""
    results: dict[str, Any] = {}
    release, leader = _held_leader(counted, results)
    waiter = in_thread(
        lambda: counted.store.write(setting("w", "k", "1"), 1.0, shared=True), results, "w"
    )
    wait_until(lambda: counted.queued() == 1)
    monkeypatch.setattr(counted.store._combiner, "_hand_over", lambda: None)  # the interrupt
    started = time.monotonic()
    release.set()
    leader.join(10)
    waiter.join(10)
    assert time.monotonic() - started < 2.0  # a slice (0.25 s), not the timeout
    assert results["leader"][0] == "held"
    assert results["w"][0] == "w/k"
    assert counted.store.get("w", "k", 1.0) == "1"
    assert counted.transactions == 2


def test_a_write_alone_commits_without_waiting_or_queueing(counted: Counted) -> None:
    assert counted.store.write(setting("a", "k", "1"), 1.0, shared=True)[0] == "a/k"
    assert counted.store.write(setting("b", "k", "2"), 1.0)[0] == "b/k"
    assert counted.transactions == 2
    assert counted.queued() == 0
    assert not counted.store._combiner._leading


# -- what only the PostgreSQL backend does ---------------------------------------------


@pytest.fixture
def schemas() -> Iterator[PostgresSchemas]:
    made = PostgresSchemas(postgres_url())
    yield made
    for engine in list(_registry._live_engines):
        engine.close()
    made.drop_all()


@pytest.fixture
def admin() -> Iterator[psycopg.Connection[Any]]:
    url = sa.make_url(postgres_url()).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as conn:
        yield conn


def _store(state: reactor.State) -> Any:
    return engine_of(state).store


def _backend_pid(conn: Any) -> int:
    return int(conn.info.backend_pid)


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
@pytest.mark.postgresql_only
def test_plain_postgresql_urls_use_psycopg(schemas: PostgresSchemas, scheme: str) -> None:
    url = schemas.create().replace("postgresql+psycopg://", f"{scheme}://")
    with reactor.open(url) as state:
        state.scope("s").set("k", 1)
        assert state.stats()["database"].startswith("postgresql+psycopg://")
        assert state.scope("s").get("k") == 1


@pytest.mark.postgresql_only
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


def _generic_plan(state: reactor.State, text: str, params: tuple[Any, ...]) -> str:
    """The plan the writer connection runs its prepared statement ``text`` (its start)
    with now (``EXPLAIN EXECUTE``: the generic plan, once PostgreSQL chose it)."""
    store = _store(state)
    assert store._gate.take(10)  # between writes
    try:
        conn = store._writer
        start = text.split("%s", maxsplit=1)[0].encode()  # psycopg keeps it with $1, $2...
        (name,) = [n for key, n in conn._prepared._names.items() if key[0].startswith(start)]
        name = name.decode()
        values = psycopg.sql.SQL(", ").join(psycopg.sql.Literal(value) for value in params)
        explain = psycopg.sql.SQL("EXPLAIN EXECUTE {}({})").format(
            psycopg.sql.Identifier(name), values
        )
        rows = conn.execute(explain, prepare=False)
        return "\n".join(row[0] for row in rows)
    finally:
        store._gate.give_back()


@pytest.mark.postgresql_only
def test_prepared_reads_of_a_write_seek_their_keys_however_the_table_grew(
    schemas: PostgresSchemas,
) -> None:
    """The writer prepares the statements of a write while the tables are new and
    small; PostgreSQL keeps their plan. Read ahead by the hash of a whole scope (or a
    queue's jobs for a key), each write read all the rows of the scope: the longer a
    new database ran, the slower every start (a run's start read every run)."""
    with reactor.open(schemas.create()) as state:

        @state.workflow("w")
        def w(run: reactor.Run, x: int) -> int:
            return x

        for n in range(12):  # prepared, then planned generically, on small tables
            state.start("w", n, id=f"small-{n}")
        state.scope("big").set_many({f"k{n}": n for n in range(3000)})
        for n in range(3000):
            state.start("w", n, id=f"many-{n}")
        ahead = _generic_plan(state, _postgres.READ_AHEAD, (["run:w"], ["some-id"]))
        assert "Hash" not in ahead, ahead
        assert "reactor_name(w.key)" in ahead, ahead
        reserve = _generic_plan(
            state, _postgres.RESERVE_IDS_UNLESS, (1, "run:w", "run:w", "an-id", 1, ["an-id"])
        )
        assert "Hash" not in reserve, reserve
        assert "reactor_name(w.key)" in reserve, reserve


@pytest.mark.postgresql_only
def test_a_start_reserves_its_job_s_id_with_its_begin_two_round_trips_in_all(
    schemas: PostgresSchemas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The begin (locks, the rows read ahead, the job's id) and the commit: no round
    trip between them. A start of an id that has a run reserves nothing."""
    with reactor.open(schemas.create()) as state:

        @state.workflow("w")
        def w(run: reactor.Run, x: int) -> int:
            return x

        state.start("w", 0, id="first")  # the queue's row: made by a plain start
        trips: list[str] = []  # a pipeline, or a statement outside one: a round trip
        pipeline, execute = psycopg.Connection.pipeline, psycopg.Connection.execute

        def trip(conn: psycopg.Connection[Any]) -> None:
            if threading.current_thread() is threading.main_thread():
                trips.append(str(conn.info.parameter_status("application_name")))

        def piped(conn: psycopg.Connection[Any]) -> Any:
            trip(conn)
            return pipeline(conn)

        def executed(conn: psycopg.Connection[Any], *args: Any, **kwargs: Any) -> Any:
            if conn.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF:
                trip(conn)
            return execute(conn, *args, **kwargs)

        monkeypatch.setattr(psycopg.Connection, "pipeline", piped)
        monkeypatch.setattr(psycopg.Connection, "execute", executed)
        for n in range(1, 4):
            state.start("w", n, id=f"run-{n}")
        state.start("w", 9, id="run-1")  # has a run: nothing written
        monkeypatch.undo()
        assert trips == ["reactor writer"] * 8
        state.start("w", 4, id="run-4")
        queue = state.queue("run:w")
        found = [queue.job(n) for n in range(1, 7)]
        items = [None if job is None else job.item["id"] for job in found]
        assert items == ["first", "run-1", "run-2", "run-3", "run-4", None]  # no id unused
        assert state.run("run-1").status() == "pending"
        assert state.run_info("run-1").input == 1


@pytest.mark.parametrize(("durability", "setting"), [("normal", "on"), ("memory", "off")])
@pytest.mark.postgresql_only
def test_durability_sets_synchronous_commit(
    schemas: PostgresSchemas, durability: str, setting: str
) -> None:
    with reactor.open(schemas.create(), durability=durability) as state:
        assert _store(state)._query("SHOW synchronous_commit", ()) == [(setting,)]


@pytest.mark.postgresql_only
def test_a_writer_waits_for_another_holder_of_the_write_lock_then_busy_error(
    schemas: PostgresSchemas, admin: psycopg.Connection[Any]
) -> None:
    url = schemas.create()
    with reactor.open(url, timeout=1) as state:
        scope = state.scope("s")
        scope.set("k", 1)
        key = _store(state).lock_key
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


@pytest.mark.postgresql_only
def test_a_scope_held_by_another_process_holds_up_only_that_scope(
    schemas: PostgresSchemas, admin: psycopg.Connection[Any]
) -> None:
    """Writes take their scope's lock as they begin: another process writing scope "a"
    keeps this one's writes to "a" waiting (then BusyError, nothing applied), while its
    writes to "b" go on at once."""
    url = schemas.create()
    with reactor.open(url, timeout=1) as state:
        a, b = state.scope("a"), state.scope("b")
        a.set("k", 1)
        key = _store(state)._scope_keys("a")
        admin.execute("SELECT pg_advisory_lock(%s)", (key,))  # as another process's writer
        try:
            started = time.monotonic()
            assert b.set("k", 1).new_value == 1
            assert b.increment("n") == 1
            assert time.monotonic() - started < 0.9  # not held up
            with pytest.raises(reactor.BusyError):
                a.set("k", 2)
            assert time.monotonic() - started >= 0.9
        finally:
            admin.execute("SELECT pg_advisory_unlock(%s)", (key,))
        assert a.get("k") == 1  # nothing applied
        assert a.set("k", 3).old_value == 1
    log = raw_query(url, "SELECT scope, key, new_value, revision FROM reactor_changes")
    assert sorted(log, key=lambda row: row[3]) == [
        ("a", "k", "1", 1),
        ("b", "k", "1", 2),
        ("b", "n", "1", 3),
        ("a", "k", "3", 4),
    ]


@pytest.mark.postgresql_only
def test_a_commit_waits_for_the_order_lock_and_applies_nothing_without_it(
    schemas: PostgresSchemas, admin: psycopg.Connection[Any]
) -> None:
    """The order lock is taken at commit: while another process holds it, a write gets
    its scope, reads, and then waits to commit; past the timeout, nothing is applied,
    no revision is used up, and no event is delivered."""
    url = schemas.create()
    with reactor.open(url, timeout=1) as state:
        scope = state.scope("s")
        heard: list[int] = []
        state.subscribe(lambda event: heard.append(event.revision))
        scope.set("k", 1)
        wait_for(lambda: heard == [1])
        admin.execute("SELECT pg_advisory_lock(%s)", (_store(state).lock_key,))
        try:
            with pytest.raises(reactor.BusyError):
                scope.increment("n")
        finally:
            admin.execute("SELECT pg_advisory_unlock(%s)", (_store(state).lock_key,))
        assert scope.get("n") is None
        assert scope.set("k", 2).old_value == 1
        wait_for(lambda: heard == [1, 2])  # revision 2 went to the next change
        assert state.stats()["revision"] == 2


@pytest.mark.postgresql_only
def test_an_import_takes_the_locks_of_the_scopes_it_writes(
    schemas: PostgresSchemas, admin: psycopg.Connection[Any]
) -> None:
    """An import writes many scopes in one transaction: it waits for another process's
    write to a scope it imports into (or that write's reads would go stale), then
    applies nothing if it cannot have it in time."""
    url = schemas.create()
    lines = ['{"scope": "a", "key": "k", "value": 1}', '{"scope": "b", "key": "k", "value": 2}']
    with reactor.open(url, timeout=1) as state:
        key = _store(state)._scope_keys("b")
        admin.execute("SELECT pg_advisory_lock(%s)", (key,))
        try:
            with pytest.raises(reactor.BusyError):
                _exchange.load(state, lines)
        finally:
            admin.execute("SELECT pg_advisory_unlock(%s)", (key,))
        assert state.scopes() == []
        assert _exchange.load(state, lines).keys == 2
        assert state.scope("b").get("k") == 2


@pytest.mark.postgresql_only
def test_processes_writing_many_scopes_in_any_order_never_deadlock(
    schemas: PostgresSchemas,
) -> None:
    """Threads of two processes write overlapping sets of scopes, in opposite orders,
    so that each process's batches (group commit) hold several scopes at once: the
    scope locks are taken in one order, so no write fails with a deadlock, and every
    increment counts (no update is lost across processes)."""
    url = schemas.create()
    script = f"""
import sys, threading, reactor
state = reactor.open({url!r}, timeout=30)
order = [f"s{{n}}" for n in range(6)]
if sys.argv[1] == "1":
    order.reverse()
errors = []
def run(offset):
    for i in range(120):
        name = order[(i + offset) % len(order)]
        try:
            state.scope(name).increment("n")
        except Exception as exc:
            errors.append(repr(exc))
threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
for t in threads: t.start()
for t in threads: t.join(120)
state.close()
print(len(errors), errors[:3])
"""
    children = [
        subprocess.Popen([sys.executable, "-c", script, str(n)], stdout=subprocess.PIPE, text=True)
        for n in (0, 1)
    ]
    outputs = [child.communicate(timeout=150)[0] for child in children]
    assert [child.returncode for child in children] == [0, 0], outputs
    assert all(out.startswith("0 ") for out in outputs), outputs
    with reactor.open(url) as state:
        total = sum(state.scope(f"s{n}").get("n", 0) for n in range(6))
        assert total == 2 * 4 * 120
        revisions = [row[0] for row in raw_query(url, "SELECT revision FROM reactor_changes")]
        assert sorted(revisions) == list(range(1, 2 * 4 * 120 + 1))


@pytest.mark.postgresql_only
def test_notifications_carry_only_the_revision(
    schemas: PostgresSchemas, admin: psycopg.Connection[Any]
) -> None:
    with reactor.open(schemas.create()) as state:
        admin.execute(f"LISTEN {_store(state).channel}")
        state.scope("s").set("k", {"big": "x" * 100_000})
        state.scope("s").set_many({"a": 1, "b": 2})
        payloads = [note.payload for note in admin.notifies(timeout=2, stop_after=2)]
    assert payloads == ["1", "3"]  # the last revision of each commit, nothing else


@pytest.mark.postgresql_only
def test_a_failed_write_sends_no_notification(
    schemas: PostgresSchemas, admin: psycopg.Connection[Any]
) -> None:
    with reactor.open(schemas.create()) as state:
        admin.execute(f"LISTEN {_store(state).channel}")
        scope = state.scope("s")
        scope.set("text", "not a number")
        with pytest.raises(reactor.TypeMismatchError):
            scope.increment("text")
        payloads = [note.payload for note in admin.notifies(timeout=0.5)]
    assert payloads == ["1"]


@pytest.mark.postgresql_only
def test_a_listener_that_loses_its_connection_catches_up(
    schemas: PostgresSchemas, admin: psycopg.Connection[Any]
) -> None:
    url = schemas.create()
    with reactor.open(url) as watcher_state, reactor.open(url + "&application_name=w") as writer:
        # Two engines on one database in this process, as two processes would be.
        assert engine_of(watcher_state) is not engine_of(writer)
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


@pytest.mark.postgresql_only
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


@pytest.mark.postgresql_only
def test_an_export_survives_dropped_connections_and_its_own_dropping(
    schemas: PostgresSchemas, admin: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export begins on a new connection when the idle ones are gone (a server
    restart); one whose own connection drops midway is a StorageError that leaves the
    store as it was: the next export works, and no connection is left behind."""
    # No upkeep: its reads would open connections of their own meanwhile.
    with reactor.open(schemas.create(), sweep_interval=1e6) as state:
        state.scope("s").set_many({f"k{n:04}": n for n in range(1_000)})
        store = _store(state)
        expected = io.StringIO()
        _exchange.dump(state, expected)
        pids = [_backend_pid(c) for c in store._idle]
        assert pids
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        wait_for(lambda: _server_gone(admin, pids))
        again = io.StringIO()
        _exchange.dump(state, again)
        assert again.getvalue() == expected.getvalue()
        opened = len(store._opened)

        real = ExportView.key_lines
        dropped: list[Any] = []

        def cut_off(view: ExportView) -> Any:
            for n, line in enumerate(real(view)):
                if n == 300:
                    dropped.append(view._reads._conn)
                    pid = view._reads._conn.info.backend_pid
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                yield line

        monkeypatch.setattr(ExportView, "key_lines", cut_off)
        with pytest.raises(reactor.StorageError):
            _exchange.dump(state, io.StringIO())
        monkeypatch.undo()
        last = io.StringIO()
        _exchange.dump(state, last)
        assert last.getvalue() == expected.getvalue()
        assert dropped
        assert all(proxy.dbapi_connection is not dropped[0] for proxy in store._opened)
        # The export's connection went with it; meanwhile the change follower and a
        # reader may each have opened one (CI, loaded, saw opened + 2 once).
        assert len(store._opened) <= opened + 2


def _server_gone(admin: psycopg.Connection[Any], pids: list[int]) -> bool:
    alive = admin.execute(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
    ).fetchall()
    return bool(alive[0][0] == 0)


@pytest.mark.postgresql_only
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


@pytest.mark.postgresql_only
def test_other_drivers_are_refused() -> None:
    with pytest.raises(reactor.InvalidArgumentError, match="psycopg"):
        reactor.open("postgresql+psycopg2://u@localhost/db")
    with pytest.raises(reactor.InvalidArgumentError, match="psycopg"):
        reactor.open("postgresql+asyncpg://u@localhost/db")


@pytest.mark.postgresql_only
def test_a_server_that_does_not_answer_is_a_storage_error() -> None:
    with pytest.raises(reactor.StorageError):
        reactor.open("postgresql+psycopg://postgres@127.0.0.1:1/test?connect_timeout=2")


@pytest.mark.postgresql_only
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


# -- names of any length: PostgreSQL indexes reactor_name(name) --------------------------
def _connect(url: str) -> psycopg.Connection[Any]:
    connection: psycopg.Connection[Any] = raw_postgres(url)
    return connection


def _indexed_form(name: str) -> str:
    if len(name) <= _schema.NAME_INDEXED:
        return name
    return name[: _schema.NAME_INDEXED] + hashlib.sha256(name.encode()).hexdigest()


@pytest.mark.postgresql_only
def test_an_index_holds_a_short_name_whole_and_a_long_one_as_its_start_and_sha256(
    schemas: PostgresSchemas,
) -> None:
    url = schemas.create()
    reactor.open(url).close()
    names = ["k", "日" * 256, "日" * 257, "😀" * 1024, "\\" * 300, "\\101" * 100, "a'b" * 200]
    with _connect(url) as conn:
        for name in names:
            found = conn.execute("SELECT reactor_name(%s)", (name,)).fetchall()
            assert found == [(_indexed_form(name),)], name


def _plan(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...]) -> str:
    rows = conn.execute("EXPLAIN " + sql, params).fetchall()
    return "\n".join(str(row[0]) for row in rows)


@pytest.mark.postgresql_only
def test_every_statement_that_looks_up_a_name_can_seek_an_index(
    schemas: PostgresSchemas,
) -> None:
    url = schemas.create()
    long = "😀" * 1024
    with reactor.open(url) as state:
        state.scope("s").set_many({"k": 1, long: 2})
        state.queue("q").put(1, key="i")
        state.lock("l", ttl=30).acquire(blocking=False)
    now = time.time()
    ins = "?, ?"
    statements: list[tuple[str, tuple[Any, ...]]] = [
        (_sql.GET, ("s", "k", now)),
        (_sql.GET_ENTRY, ("s", long, now)),
        (_sql.LIVE_ROW, ("s", "k", now)),
        (_sql.ROWS + _sql.RANGE + _sql.RANGE_END, ("s", "a", "b")),
        (_sql.ITEMS + f" AND [key] IN ({ins})", ("s", now, "k", long)),
        (_sql.KEYS + _sql.RANGE + _sql.RANGE_END + " ORDER BY key", ("s", now, "a", "b")),
        (_sql.DELETE, ("s", "k")),
        (_sql.CHANGED_SINCE, (0, "s")),
        (_sql.SCOPE_CHANGES_SINCE, (0, "s")),
        (_sql.HISTORY, ("s", "k", 10)),
        (_sql.KEY_HISTORY, ("s", "k", 0, 10)),
        (_sql.VALUE_AT, ("s", "k", 1, "s", "k", 1)),
        (_sql.SCOPE_CHANGED_KEYS + _sql.RANGE, ("s", 0, "a")),
        (_sql.KEYS_CHANGED_SINCE.format(ins), ("s", "k", long, 0)),
        (_sql.POSITION, ("d",)),
        (_sql.LOCK, ("l",)),
        (_sql.QUEUE, ("q",)),
        (_sql.SET_QUEUE, (5, 2, None, None, None, None, None, None, "q")),
        (_sql.JOB, ("q", 1)),
        (_sql.JOB_INFO, ("q", 1)),
        (_sql.FIRST_READY, ("q", now)),
        (_sql.FIRST_PRIORITY, ("q", now)),
        (_sql.FIRST_READY_NOT_FULL, ("q", now, "q", now, 1)),
        (_sql.FIRST_PRIORITY_NOT_FULL, ("q", now, "q", now, 1)),
        (_sql.TAKEN_COUNT, ("q", now)),
        (_sql.TAKEN_BY_GROUP, ("q", now)),
        (_sql.NEXT_TIMES_AFTER, ("q", now, "q", now)),
        (_sql.LATER_JOBS, ("q", "ready", now, 10)),
        (_sql.TAKES_SINCE, ("q", now)),
        (_sql.NTH_LAST_TAKE, ("q", 4)),
        (_sql.PRUNE_TAKES, ("q", now)),
        (_sql.CLAMP_TAKES, (now, "q", now)),
        (_sql.REPLACE_JOB, ("1", now, 0, None, "q", 1)),
        (_sql.DELETE_JOBS.format(ins), ("q", 1, 2)),
        (_sql.DUE_JOBS, ("q", "taken", now, 10)),
        (_sql.JOBS_IN_STATE, ("q", "dead", 10)),
        (_sql.NEXT_TIMES, ("q", "q")),
        (_sql.QUEUE_JOBS, ("q",)),
        (_sql.JOBS_BY_KEY.format(ins), ("q", "i", long)),
        (_sql.SET_JOB, ("taken", now, 1, "o", None, None, "q", 1)),
        (_sql.SET_JOB_STATES.format(ins), ("dead", "q", 1, 2)),
        (_sql.REVIVE_JOBS.format(ins), (now, "q", 1, 2)),
        (_sql.DELETE_JOB, ("q", 1)),
        (_sql.JOB_COUNTS, ("q", now) * 3 + ("q", now, 5) * 2 + ("q",)),
        (_sql.QUEUES_DUE, (now,)),  # one seek of the jobs a queue
        (_sql.FIRST_LEASE_END, ()),  # the same
        (_sql.FIRST_EXPIRED, (now,)),
        (_sql.FIRST_DUE_TIMER, (now,)),
        (_postgres.READ_AHEAD, (["s", "s"], ["k", long])),
        (_postgres.RESERVE_IDS, (1, "q", 1, ["i", long])),
        (_pg_statements._TAKE_VIEW, ("q", "taken", now, 10, "q", now, "q", now)),
    ]
    upserts: list[tuple[str, tuple[Any, ...], str]] = [
        (_sql.UPSERT, ("s", "k", "1", None, 1, 1, 1), "reactor_kv_name"),
        (_sql.SAVE_POSITION, ("d", 1, 0, 0, now), "reactor_subscribers_name"),
        (_sql.RECORD_FAILURE, ("d", 1, "e", now), "reactor_failures_name"),
        (_sql.SAVE_LOCK, ("l", None, 1, None), "reactor_locks_name"),
    ]
    scanned = re.compile(r"Seq Scan on (reactor_\w+)")
    with _connect(url) as conn:
        conn.execute("SET enable_seqscan = off")  # a plan that can seek an index does
        for sql, params in statements:
            converted = sql if "%s" in sql else _postgres.pg(sql)
            plan = _plan(conn, converted, params)
            tables = set(scanned.findall(plan)) - {"reactor_meta", "reactor_queues"}
            assert not tables, f"{sql}\n{plan}"
            assert "Index" in plan, f"{sql}\n{plan}"
        for sql, params, index in upserts:
            plan = _plan(conn, _postgres.pg(sql), params)
            assert f"Conflict Arbiter Indexes: {index}" in plan, plan
        # The flush of a commit: rows found through the index, records appended.
        flush = (
            ["s"], ["k"], ["updated"], ["1"], ["2"], [None], [now], [2], [None], [None],
            ["s"], [long],
            ["s"], ["k"], ["2"], [None], [-1], [1], [2],
            "reactor_x", 1,
        )  # fmt: skip
        plan = _plan(conn, _postgres.CHANGES, flush)
        assert "Conflict Arbiter Indexes: reactor_kv_name" in plan, plan
        assert "Index Scan using reactor_kv_name" in plan, plan
        assert "Seq Scan on reactor_kv" not in plan, plan


@pytest.mark.postgresql_only
def test_a_database_of_version_5_gets_the_indexes_of_names(schemas: PostgresSchemas) -> None:
    url = schemas.create()
    engine = sa.create_engine(sa.make_url(url).set(drivername="postgresql+psycopg"))
    _schema.migrate(engine, target=5)
    with engine.begin() as conn:
        for statement in (
            (
                "INSERT INTO reactor_kv (scope, key, value, expires_at, revision, "
                "created_revision, version) VALUES ('s', 'k', '1', NULL, 1, 1, 1)"
            ),
            (
                "INSERT INTO reactor_changes (revision, scope, key, type, old_value, new_value, "
                "timestamp, version) VALUES (1, 's', 'k', 'created', NULL, '1', 0, 1)"
            ),
            (
                "INSERT INTO reactor_locks (name, owner, token, expires_at) "
                "VALUES ('l', NULL, 7, NULL)"
            ),
            "INSERT INTO reactor_queues (name, max_attempts, next_id) VALUES ('q', 5, 2)",
            (
                "INSERT INTO reactor_jobs (queue, id, item, state, ready_at, attempts, owner, key, "
                "created_at) VALUES ('q', 1, '\"job\"', 'ready', 0, 0, NULL, 'i', 0)"
            ),
        ):
            conn.exec_driver_sql(statement)
    engine.dispose()
    long = "😀" * 1024
    with reactor.open(url) as state:
        scope = state.scope("s")
        assert scope.get("k") == 1
        scope.set("k", 2)  # the row of version 5, found through the new index
        scope.set(long, 3)
        assert scope.list() == {"k": 2, long: 3}
        assert [e.new_value for e in scope.history("k")] == [1, 2]
        lock = state.lock("l", ttl=30)
        assert lock.acquire(blocking=False)
        assert lock.token == 8
        queue = state.queue("q")
        assert queue.put("again", key="i") == 1  # the key of the job of version 5
        assert queue.put("new") == 2
    constraints = raw_query(
        url,
        "SELECT conrelid::regclass::text, conname FROM pg_constraint "
        "WHERE contype = 'p' AND connamespace = current_schema()::regnamespace",
    )
    assert sorted(constraints) == [
        ("reactor_changes", "reactor_changes_pkey"),
        ("reactor_meta", "reactor_meta_pkey"),
        ("reactor_timers", "reactor_timers_pkey"),
    ]
    indexes = raw_query(
        url, "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
    )
    by_name = dict(indexes)
    for name in ("reactor_kv_name", "reactor_changes_key", "reactor_jobs_key"):
        assert "reactor_name(" in by_name[name], by_name[name]
    # Version 9: a key's index is not unique (a debounced put beside a taken job of its
    # key); the partial index of priorities and the takes' index hold reactor_name too.
    assert "UNIQUE" not in by_name["reactor_jobs_key"], by_name["reactor_jobs_key"]
    for name in ("reactor_jobs_priority", "reactor_takes_at"):
        assert "reactor_name((queue)" in by_name[name], by_name[name]
    assert "reactor_changes_scope" not in by_name  # version 7 dropped it
    columns = raw_query(
        url,
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = 'reactor_timers'",
    )
    assert {("cron",), ("tz",)} <= set(columns)  # version 8 added them
    assert _schema.SCHEMA_VERSION == 9


# -- the change log's indexes (schema version 7) ----------------------------------------
def _indexes_of_the_log(request: pytest.FixtureRequest, db: Any) -> set[str]:
    if backend(request.config) == "postgresql":
        found = raw_query(
            db,
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = 'reactor_changes'",
        )
    else:
        found = raw_query(
            db,
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'reactor_changes'",
        )
    return {name for (name,) in found}


def _plan_of(request: pytest.FixtureRequest, db: Any, sql: str, params: tuple[Any, ...]) -> str:
    """The plan of ``sql``; on PostgreSQL the one it takes where a scan of the whole
    table costs more than any index (as it does for a long log: a small one it scans)."""
    if backend(request.config) == "postgresql":
        with _connect(db) as conn:
            conn.execute("SET enable_seqscan = off")
            return _plan(conn, _postgres.pg(sql), params)
    rows = raw_query(db, "EXPLAIN QUERY PLAN " + sql, params)
    return "\n".join(str(row[-1]) for row in rows)


def test_a_scopes_change_since_a_revision_is_read_off_the_revisions_after_it(
    open_state: Callable[..., reactor.State], db_path: Any, request: pytest.FixtureRequest
) -> None:
    """The log has no index by scope (a page less for every write): whether a scope
    changed after revision R (a transaction's commit asks) is read off the records after
    R, on the primary key, however long the log and the scope's history."""
    state = open_state()
    busy, quiet = state.scope("busy"), state.scope("quiet")
    for round_ in range(5):
        busy.set_many({f"k{n}": round_ for n in range(400)})
    quiet.set("q", 1)
    base = engine_of(state).store.revision()
    assert _indexes_of_the_log(request, db_path) == (
        {"reactor_changes_key", "reactor_changes_pkey"}
        if backend(request.config) == "postgresql"
        else {"reactor_changes_key"}
    )
    for sql, params in (
        (_sql.CHANGED_SINCE, (base - 1, "quiet")),
        (_sql.SCOPE_CHANGES_SINCE, (base - 1, "quiet")),
    ):
        plan = _plan_of(request, db_path, sql, params)
        assert "reactor_changes_key" not in plan, plan
        assert "reactor_changes_pkey" in plan or "INTEGER PRIMARY KEY" in plan, plan
    statements = engine_of(state).store.reader()
    assert statements.changed_since("quiet", base - 1)
    assert not statements.changed_since("quiet", base)
    assert not statements.changed_since("other", 0)
    busy.set("k0", "late")
    assert statements.changed_since("busy", base)
    assert not statements.changed_since("quiet", base)
    # A pattern's condition (if_revision= on a write of keys by pattern) asks the same.
    assert statements.keys_matching_changed_since("quiet", compile_pattern("*"), base - 1)
    assert not statements.keys_matching_changed_since("quiet", compile_pattern("*"), base)
    assert statements.keys_matching_changed_since("busy", compile_pattern("*0"), base)
    assert not statements.keys_matching_changed_since("busy", compile_pattern("*1"), base)


@pytest.mark.sqlite_only("SQLite files of an older version")
def test_version_7_drops_the_logs_index_by_scope_and_keeps_the_history(tmp_path: Any) -> None:
    path = tmp_path / "v6.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    _schema.migrate(engine, target=6)
    engine.dispose()
    with reactor.open(path) as state:  # migrated to the current version
        scope = state.scope("s")
        for n in range(3):
            scope.set("k", n)
        assert [change.new_value for change in scope.history("k")] == [0, 1, 2]
    names = raw_query(path, "SELECT name FROM sqlite_master WHERE type = 'index'")
    assert ("reactor_changes_scope",) not in names
    assert ("reactor_changes_key",) in names
    version = "SELECT value FROM reactor_meta WHERE name = 'schema_version'"
    assert raw_query(path, version) == [(_schema.SCHEMA_VERSION,)]


# -- the upkeep's lag (stats()["upkeep"], reactor serve's health) ----------------------
def test_overdue_is_when_the_oldest_undone_chore_fell_due(
    state: reactor.State, clock: Any, db_path: Any, request: pytest.FixtureRequest
) -> None:
    store = engine_of(state).store
    start = clock.time()
    assert store.overdue(start) is None  # nothing at all
    state.scope("s").set("k", 1, ttl=30)
    state.scope("s").schedule("t", "due", after=20)
    jobs = state.queue("q")
    jobs.put("job")
    assert jobs.take(timeout=0, lease=10) is not None
    assert store.overdue(start + 5) is None  # nothing is due yet
    assert store.overdue(start + 10) == pytest.approx(start + 10)  # the lease ran out
    assert store.overdue(start + 25) == pytest.approx(start + 10)  # the earliest
    jobs.put("other")
    assert store.overdue(start + 100) == pytest.approx(start + 10)
    clock.advance(100)
    run_upkeep(state)
    assert store.overdue(start + 100) is None  # all of it done
    for sql, params in (
        (_sql.FIRST_EXPIRED, (start,)),
        (_sql.FIRST_DUE_TIMER, (start,)),
        (_sql.FIRST_LEASE_END, ()),
    ):
        plan = _plan_of(request, db_path, sql, params)
        assert "Index" in plan or "INDEX" in plan, plan


# -- PostgreSQL: a commit's WAL flush waits outside the order lock -----------------------
_PLAIN_ROLE = "reactor_test_plain"


@pytest.fixture
def plain_role_database() -> Iterator[tuple[str, psycopg.Connection[Any]]]:
    """A database of its own on the test server, written by a role that is no superuser
    (privileges hold for it): the URL reactor opens as that role, and a superuser's
    connection to that database."""
    server = sa.make_url(postgres_url())
    name = f"reactor_flush_{hashlib.blake2b(str(time.time_ns()).encode()).hexdigest()[:12]}"
    with raw_postgres(server.render_as_string(hide_password=False)) as admin:
        admin.execute(
            f"DO $$ BEGIN CREATE ROLE {_PLAIN_ROLE} LOGIN; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
        admin.execute(f"CREATE DATABASE {name}")
    try:
        own = server.set(database=name)
        with raw_postgres(own.render_as_string(hide_password=False)) as conn:
            conn.execute(f"GRANT ALL ON SCHEMA public TO {_PLAIN_ROLE}")
            yield own.set(username=_PLAIN_ROLE).render_as_string(hide_password=False), conn
            for engine in list(_registry._live_engines):
                engine.close()
    finally:
        with raw_postgres(server.render_as_string(hide_password=False)) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


_REVOKE = "REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) FROM PUBLIC"


@pytest.mark.postgresql_only
def test_a_role_that_may_not_wait_for_the_flush_alone_flushes_under_the_order_lock(
    plain_role_database: tuple[str, psycopg.Connection[Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, admin = plain_role_database
    admin.execute(_REVOKE)
    with caplog.at_level("INFO", logger="reactor"), reactor.open(url) as state:
        scope = state.scope("s")
        for n in range(3):
            scope.set("k", n)
        assert scope.get("k") == 2
        assert [e.revision for e in state.changes()] == [1, 2, 3]
    assert any("flush under the order lock" in r.getMessage() for r in caplog.records)


@pytest.mark.postgresql_only
def test_a_commit_whose_flush_fails_after_it_says_its_outcome_is_unknown(
    plain_role_database: tuple[str, psycopg.Connection[Any]],
) -> None:
    """The commit went through, visible; only the transaction that waits for its flush
    failed (its privilege revoked meanwhile): the write is not said to have failed
    (a retry would repeat it) but to have an unknown outcome, and its event comes
    once, from the log."""
    url, admin = plain_role_database
    with reactor.open(url) as state:
        scope = state.scope("s")
        scope.set("k", 1)
        seen: list[tuple[int, Any]] = []
        state.subscribe(lambda e: seen.append((e.revision, e.new_value)), scope="s")
        admin.execute(_REVOKE)
        with pytest.raises(reactor.OutcomeUnknownError):
            scope.set("k", 2)
        assert scope.get("k") == 2
        wait_for(lambda: seen == [(2, 2)])
        time.sleep(0.2)
        assert seen == [(2, 2)]
