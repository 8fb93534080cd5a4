"""Adversarial campaign against the PostgreSQL write protocol (SPEC §7, §8, §13 queues).

What is under attack (``reactor/_storage/postgres.py``: ``_Statements``, ``PostgresStore.
_begin_write``, ``reconnect_writer``, ``drop_writer``; ``SQLStore._write_once``;
``SQLJobs``):

1. the writer prepares statements on the server (psycopg ``prepare_threshold=1``), except
   statements of more than 8 rows; a writer on which a statement failed is dropped;
2. a transaction that reads nothing ahead sends its BEGIN and advisory locks with its
   first answered statement, and reconnects once if the connection was dead by then;
3. the writes of work queues are pending until the next answered statement (or the
   commit's pipeline), where their errors surface;
4. the flush's arrays go in binary.

Each test drives those paths through the public API, breaks the connection or the
server underneath (``pg_terminate_backend``, advisory locks held by another session,
faults injected on the client and errors raised by the server itself), and checks the
database afterwards with a connection of its own: what was acknowledged is there once,
what failed with a plain ``StorageError`` is not there at all, and the writer's
prepared statements stay in step with the server's.

It found two bugs, fixed: a dropped connection stayed in the store's list until the
store closed (one for every refused statement), and a thread writing jobs in a loop
led the process's commits again and again, so other threads' writes timed out
(``Combiner`` now lets the first in line lead).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

import reactor
import reactor.aio
from reactor.testing import ManualClock
from tests import test_storage as pg_suite
from tests.test_faults import FaultyConnection, _Counter

from .conftest import PostgresSchemas, wait_for

pytestmark = pytest.mark.postgresql_only

# The fixtures of the PostgreSQL suite: fresh schemas, and an administrator's connection
# (another session: it kills backends and holds advisory locks).
schemas = pg_suite.schemas
admin = pg_suite.admin

Admin = psycopg.Connection[Any]
TABLES = ("reactor_kv", "reactor_changes", "reactor_jobs", "reactor_queues", "reactor_timers")

# No background upkeep while faults are armed: a compaction's statements would take them.
QUIET = 1_000_000.0


# -- helpers ---------------------------------------------------------------------------
def _store(state: Any) -> Any:
    """The PostgreSQL store behind a handle (sync or asyncio)."""
    link = getattr(state, "_link", None)  # an AsyncState's: its synchronous State
    sync = state if link is None else link.state
    return pg_suite._store(sync)


def _schema(url: str) -> str:
    """The schema a test URL points at (its ``search_path``)."""
    options = sa.make_url(url).query["options"]
    assert isinstance(options, str)
    return options.split("=", 1)[1]


def _contents(admin: Admin, schema: str) -> list[list[tuple[Any, ...]]]:
    """Every row of reactor's tables of ``schema``, in a fixed order."""
    return [
        [tuple(row) for row in admin.execute(f"SELECT * FROM {schema}.{table} ORDER BY 1, 2")]
        for table in TABLES
    ]


def _kill(admin: Admin, conn: Any) -> int:
    """Terminate ``conn``'s server process and wait (bounded) until it is gone."""
    pid = pg_suite._backend_pid(conn)
    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    wait_for(lambda: pg_suite._server_gone(admin, [pid]), timeout=5)
    return pid


def _prepared_in_step(store: Any) -> list[str]:
    """Check that every statement psycopg believes prepared on the writer connection is
    prepared on the server (a statement psycopg would run by a name the server does not
    know fails with "prepared statement does not exist"); their texts."""
    assert store._gate.take(10)  # between writes
    try:
        conn = store._writer
        if conn is None or conn.closed:
            return []
        server = dict(
            conn.execute("SELECT name, statement FROM pg_prepared_statements", prepare=False)
        )
        client = {name.decode() for name in conn._prepared._names.values()}
    finally:
        store._gate.give_back()
    assert client <= set(server), (
        f"psycopg's prepared statements the server lacks: {client - set(server)}"
    )
    return [server[name] for name in client]


FLUSH = "INSERT INTO reactor_changes"  # in the commit's statement (CHANGES)


@contextlib.contextmanager
def _locked(admin: Admin, store: Any, key: int) -> Iterator[None]:
    """Hold advisory lock ``key`` in another session (as another process's writer);
    before letting go, wait until no write of ``store`` is in flight (one its caller
    stopped waiting for may still be waiting for the lock: it must fail, not commit)."""
    admin.execute("SELECT pg_advisory_lock(%s)", (key,))
    try:
        yield
        assert store._gate.take(10)
        store._gate.give_back()
    finally:
        admin.execute("SELECT pg_advisory_unlock(%s)", (key,))


def _inject(store: Any, fail_at: int | None, error: Callable[[str], Exception]) -> None:
    """Make the writer's ``fail_at``-th statement from now raise ``error`` (None: no
    fault), as ``tests/test_faults.py`` does."""
    writer = store._writer
    if isinstance(writer, FaultyConnection):
        writer = writer._conn
    if writer is None or writer.closed:  # a failed statement dropped it
        writer = store.reconnect_writer()
    store._writer = (
        writer if fail_at is None else FaultyConnection(writer, _Counter(fail_at, error))
    )


def _jobs(admin: Admin, schema: str, queue: str) -> list[tuple[Any, ...]]:
    return [
        tuple(row)
        for row in admin.execute(
            f"SELECT id, item, state, attempts FROM {schema}.reactor_jobs WHERE queue = %s "
            "ORDER BY id",
            (queue,),
        )
    ]


# -- 1. the writer killed at random moments ---------------------------------------------
STORM_SECONDS = 4.0
STORM_PROGRESS = 10  # acknowledged writes of each kind before the storm may end
STORM_LONGEST = 60.0  # seconds past STORM_SECONDS the storm may run to get them


class _Ledger:
    """What the threads of the storm were told, by operation."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.errors: collections.Counter[tuple[str, str]] = collections.Counter()
        self.untyped: list[str] = []
        self.puts: dict[str, list[str]] = {}  # item -> outcome of each attempt
        self.put_ids: dict[str, int] = {}  # item -> id of its acknowledged put
        self.taken: collections.Counter[int] = collections.Counter()  # job id -> takes
        self.acked: collections.Counter[int] = collections.Counter()  # job id -> acks
        self.increments = collections.Counter[str]()
        self.sets: dict[str, str] = {}  # key -> outcome

    def progress(self) -> dict[str, int]:
        """How many writes of each kind were acknowledged."""
        with self.lock:
            return {
                "puts": len(self.put_ids),
                "acks": sum(self.acked.values()),
                "increments": self.increments["ok"],
                "sets": list(self.sets.values()).count("ok"),
            }

    def failed(self, verb: str, exc: BaseException) -> str:
        with self.lock:
            self.errors[(verb, type(exc).__name__)] += 1
            if not isinstance(exc, reactor.StorageError):
                self.untyped.append(f"{verb}: {exc!r}")
        return "unknown" if isinstance(exc, reactor.OutcomeUnknownError) else "failed"


def test_the_writer_killed_at_random_moments_loses_no_acknowledged_write_and_repeats_none(
    schemas: PostgresSchemas, admin: Admin
) -> None:
    """Two producers put (with an idempotency key, retrying until acknowledged), two
    workers take and ack, one thread increments and sets keys, while a killer thread
    terminates the writer's server process every few milliseconds. Afterwards, read
    past reactor: every acknowledged put is a job exactly once (none lost, no
    duplicate), every acknowledged ack removed its job, no job was taken twice, the
    queue's id counter is exact, increments and sets count exactly what was
    acknowledged (plain ``StorageError``: not applied; ``OutcomeUnknownError``: either),
    the change log has no gap and every revision reached a subscriber once; every
    error is a typed ``StorageError``; the same engine works on."""
    url = schemas.create()
    schema = _schema(url)
    ledger = _Ledger()
    stop = threading.Event()
    producing = threading.Event()
    kills = [0]
    heard: list[int] = []
    rng = random.Random(20240611)
    with reactor.open(url, timeout=5) as state:
        store = _store(state)
        queue = state.queue("work")
        keys = state.scope("keys")
        state.subscribe(lambda event: heard.append(event.revision))

        def killer() -> None:
            while not stop.is_set():
                stop.wait(rng.uniform(0.005, 0.04))
                writer = store._writer
                if writer is None or writer.closed:
                    continue
                try:
                    pid = writer.info.backend_pid
                except psycopg.Error:
                    continue
                if pid:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    kills[0] += 1

        deadline = time.monotonic() + STORM_SECONDS

        def storm_over() -> bool:
            # The storm lasts until every kind of write got through often enough to
            # prove something: on a loaded machine the kills leave fewer through.
            now = time.monotonic()
            return now > deadline + STORM_LONGEST or (
                now > deadline and min(ledger.progress().values()) >= STORM_PROGRESS
            )

        def producer(name: str) -> None:
            for i in range(20_000):
                if storm_over():
                    break
                item = f"{name}-{i}"
                outcomes: list[str] = []
                for _ in range(30):
                    try:
                        job_id = queue.put({"item": item}, key=item)
                    except Exception as exc:
                        outcomes.append(ledger.failed("put", exc))
                        continue
                    outcomes.append("ok")
                    with ledger.lock:
                        ledger.put_ids[item] = job_id
                    break
                with ledger.lock:
                    ledger.puts[item] = outcomes
                time.sleep(0.004)  # the kills, not the puts, are what this test attacks

        def worker() -> None:
            while producing.is_set() or not stop.is_set():
                try:
                    job = queue.take(timeout=0.05, lease=120)
                except Exception as exc:
                    ledger.failed("take", exc)
                    continue
                if job is None:
                    if not producing.is_set():
                        return
                    continue
                with ledger.lock:
                    ledger.taken[job.id] += 1
                try:
                    job.ack()
                except Exception as exc:
                    ledger.failed("ack", exc)
                    continue
                with ledger.lock:
                    ledger.acked[job.id] += 1

        def writer_of_keys() -> None:
            i = 0
            while producing.is_set():
                try:
                    keys.increment("n")
                    ledger.increments["ok"] += 1
                except Exception as exc:
                    ledger.increments[ledger.failed("increment", exc)] += 1
                try:
                    keys.set(f"k{i}", i)
                    ledger.sets[f"k{i}"] = "ok"
                except Exception as exc:
                    ledger.sets[f"k{i}"] = ledger.failed("set", exc)
                i += 1
                time.sleep(0.002)

        producing.set()
        producers = [threading.Thread(target=producer, args=(f"p{n}",)) for n in range(2)]
        others = [threading.Thread(target=worker) for _ in range(2)]
        others.append(threading.Thread(target=writer_of_keys))
        kill_thread = threading.Thread(target=killer)
        for thread in [*producers, *others, kill_thread]:
            thread.start()
        try:
            for thread in producers:
                thread.join(30)
            assert not any(thread.is_alive() for thread in producers), "producers stuck"
        finally:
            stop.set()
            kill_thread.join(10)
            producing.clear()
            for thread in others:
                thread.join(30)
        assert not any(thread.is_alive() for thread in [*others, kill_thread])

        # The same engine, not reopened, works on.
        assert keys.set("after", 1).new_value == 1
        after_id = queue.put({"item": "after"})
        assert ledger.untyped == [], ledger.untyped
        assert kills[0] >= 20, f"only {kills[0]} kills: the storm proves little"
        progress = ledger.progress()
        assert min(progress.values()) >= STORM_PROGRESS, f"a kind of write hardly ran: {progress}"
        print(
            f"{kills[0]} kills; {len(ledger.puts)} puts, {sum(ledger.taken.values())} takes, "
            f"{sum(ledger.acked.values())} acks, {dict(ledger.increments)} increments, "
            f"{len(ledger.sets)} sets; errors: {dict(ledger.errors)}"
        )

        # -- the jobs, read past reactor --------------------------------------------
        log = [
            (int(key), kind, json.loads(new) if new else None)
            for key, kind, new in admin.execute(
                f"SELECT key, type, new_value FROM {schema}.reactor_changes "
                "WHERE scope = 'queue:work' ORDER BY revision"
            )
        ]
        created = collections.Counter(job_id for job_id, kind, _ in log if kind == "created")
        deleted = collections.Counter(job_id for job_id, kind, _ in log if kind == "deleted")
        item_of = {job_id: new["item"]["item"] for job_id, kind, new in log if kind == "created"}
        rows = {job_id: (item, st) for job_id, item, st, _ in _jobs(admin, schema, "work")}
        assert all(count == 1 for count in created.values()), "a job id was created twice"
        assert all(count == 1 for count in deleted.values()), "a job was deleted twice"
        assert set(rows) == set(created) - set(deleted), "the jobs table and the log disagree"
        assert all(st in ("ready", "taken") for _, st in rows.values())
        # The queue's counter: ids 1.. handed out once each, the next one stored.
        (next_id,) = admin.execute(
            f"SELECT next_id FROM {schema}.reactor_queues WHERE name = 'work'"
        ).fetchone()
        assert set(created) == set(range(1, next_id)), "ids skipped or reused"
        assert after_id == next_id - 1

        by_item = collections.Counter(item_of.values())
        for item, outcomes in ledger.puts.items():
            assert outcomes[-1] == "ok", f"{item} was never acknowledged: {outcomes}"
            assert item_of.get(ledger.put_ids[item]) == item, f"{item}: its id is another's"
            # Retried with its key: one job, or two if an attempt of unknown outcome
            # was applied and its job acknowledged before the retry (the key then free).
            most = 2 if "unknown" in outcomes else 1
            assert 1 <= by_item[item] <= most, f"{item}: {by_item[item]} jobs ({outcomes})"
        for job_id, count in ledger.taken.items():
            assert count == 1, f"job {job_id} was taken {count} times within its lease"
        for job_id in ledger.acked:
            assert ledger.acked[job_id] == 1
            assert deleted[job_id] == 1, f"ack of {job_id} lost"
            assert job_id not in rows, f"ack of {job_id} lost"

        # -- the keys --------------------------------------------------------------
        counted = int(keys.get("n", 0))
        ok, unknown = ledger.increments["ok"], ledger.increments["unknown"]
        assert ok <= counted <= ok + unknown, (counted, dict(ledger.increments))
        n_log = [
            json.loads(new)
            for (new,) in admin.execute(
                f"SELECT new_value FROM {schema}.reactor_changes "
                "WHERE scope = 'keys' AND key = 'n' ORDER BY revision"
            )
        ]
        assert n_log == list(range(1, counted + 1)), "an increment lost or repeated"
        present = set(keys.keys("k*"))
        for key, outcome in ledger.sets.items():
            if outcome == "ok":
                assert key in present, f"acknowledged set of {key} lost"
            elif outcome == "failed":
                assert key not in present, f"{key}: said not applied, but it was"

        # -- the log and its events ------------------------------------------------
        revisions = [r for (r,) in admin.execute(f"SELECT revision FROM {schema}.reactor_changes")]
        assert sorted(revisions) == list(range(1, len(revisions) + 1)), "a gap in the log"
        wait_for(lambda: len(heard) >= len(revisions), timeout=10)
        time.sleep(0.1)
        assert sorted(heard) == sorted(revisions), "an event lost or published twice"
        _prepared_in_step(store)


def _later(held: dict[str, Any], name: str, verb: str, *args: Any) -> Callable[[], Any]:
    """Call ``verb`` of the job held as ``name`` when the time comes (a step before
    takes it)."""
    return lambda: getattr(held[name], verb)(*args)


# -- 2. a writer the server dropped while idle -------------------------------------------
def _idle_kill_operations(
    state: reactor.State, held: dict[str, Any]
) -> list[tuple[str, Callable[[], Any], int]]:
    """Operations of every kind, in an order that sets each up, with how many change
    records each commits."""
    scope, other = state.scope("s"), state.scope("o")
    queue, once = state.queue("q"), state.queue("once", max_attempts=1)

    def take(q: reactor.Queue, name: str) -> None:
        job = q.take(timeout=0)
        assert job is not None
        held[name] = job

    def enqueue_and_schedule() -> None:
        with scope.transaction() as tx:  # reads nothing
            tx.enqueue("q", "from a transaction")
            tx.schedule("t", value=1, after=600)

    def across_scopes() -> None:
        with state.transaction("s", "o") as tx:
            tx["s"].set("m", 1)
            tx["o"].increment("n")
            tx.enqueue("q", "from two scopes", key="multi")

    def lock() -> None:
        lease = state.lock("L", ttl=30)
        assert lease.acquire(blocking=False)
        lease.release()

    return [
        ("set", lambda: scope.set("a", 1), 1),
        ("set_many (10 keys)", lambda: scope.set_many({f"b{i}": i for i in range(10)}), 10),
        ("increment", lambda: scope.increment("n"), 1),
        ("delete", lambda: scope.delete("b0"), 1),
        ("clear", lambda: scope.clear("b1*"), 1),
        ("schedule", lambda: scope.schedule("t", value=2, after=600), 0),
        ("transaction: enqueue and schedule only", enqueue_and_schedule, 1),
        ("transaction over two scopes", across_scopes, 3),
        ("put", lambda: queue.put("p"), 1),
        ("put with a key", lambda: queue.put("k", key="k"), 1),
        ("put with a held key", lambda: queue.put("k", key="k"), 0),
        ("take", lambda: take(queue, "job"), 1),
        ("extend", _later(held, "job", "extend", 60), 1),
        ("ack", _later(held, "job", "ack"), 1),
        ("take again", lambda: take(queue, "job"), 1),
        ("nack", _later(held, "job", "nack"), 1),
        ("put (max_attempts=1)", lambda: once.put("dies"), 1),
        ("take (max_attempts=1)", lambda: take(once, "dying"), 1),
        ("nack to the dead letters", _later(held, "dying", "nack"), 1),
        ("retry_dead", once.retry_dead, 1),
        ("cancel_timer", lambda: state.cancel_timer(state.timers()[0].id), 0),
        ("lock", lock, 0),
        ("write to another scope", lambda: other.set("x", 1), 1),
    ]


def test_every_operation_on_a_writer_the_server_dropped_while_idle_succeeds_once(
    schemas: PostgresSchemas, admin: Admin
) -> None:
    """Before each operation the writer's server process is terminated (and gone):
    nothing was sent on it yet, so every operation (those that read ahead, those that
    read nothing, queue verbs whose BEGIN waits for their first answered statement)
    reconnects and succeeds, with no error, and commits exactly its own changes."""
    url = schemas.create()
    with reactor.open(url) as state:
        store = _store(state)
        held: dict[str, Any] = {}
        failures: dict[str, str] = {}
        for name, operation, records in _idle_kill_operations(state, held):
            killed = _kill(admin, store._writer or store.reconnect_writer())
            before = state.stats()["revision"]
            try:
                operation()
            except Exception as exc:
                failures[name] = repr(exc)
                continue
            if store._writer_pid == killed:
                failures[name] = "the writer did not reconnect"
            elif (done := state.stats()["revision"] - before) != records:
                failures[name] = f"{done} change records, not {records}"
        assert failures == {}
        assert _prepared_in_step(store)


def test_a_transaction_that_only_enqueues_and_schedules_survives_a_dropped_writer(
    schemas: PostgresSchemas, admin: Admin
) -> None:
    """A transaction body with no reads that only enqueues (two queues, one job with an
    idempotency key) and schedules a timer, committed on a writer connection the server
    dropped just before: it succeeds on a new connection, and is applied once (two
    jobs, one timer, two change records, each event once), ten times in a row."""
    url = schemas.create()
    schema = _schema(url)
    heard: list[tuple[str, str, str]] = []
    with reactor.open(url) as state:
        state.subscribe(lambda event: heard.append((event.scope, event.key, event.type)))
        store = _store(state)
        scope = state.scope("s")
        scope.set("warm", 1)
        pids = set()
        for round_ in range(10):
            pids.add(_kill(admin, store._writer))
            with scope.transaction() as tx:
                tx.enqueue("mail", {"round": round_})
                tx.enqueue("audit", {"round": round_}, key=f"r{round_}")
                tx.schedule("due", value=round_, after=600)
            assert store._writer_pid not in pids
        mail = _jobs(admin, schema, "mail")
        audit = _jobs(admin, schema, "audit")
        assert [json.loads(item)["round"] for _, item, _, _ in mail] == list(range(10))
        assert [json.loads(item)["round"] for _, item, _, _ in audit] == list(range(10))
        timers = admin.execute(f"SELECT key, value FROM {schema}.reactor_timers").fetchall()
        assert sorted(json.loads(value) for _, value in timers) == list(range(10))
        log = admin.execute(
            f"SELECT scope, type FROM {schema}.reactor_changes WHERE scope LIKE %s",
            ("queue:%",),
        ).fetchall()
        assert collections.Counter(log) == {
            ("queue:mail", "created"): 10,
            ("queue:audit", "created"): 10,
        }
        queues = dict(admin.execute(f"SELECT name, next_id FROM {schema}.reactor_queues"))
        assert queues == {"mail": 11, "audit": 11}
        wait_for(lambda: len(heard) >= 21, timeout=5)
        time.sleep(0.1)
        assert len(heard) == 21  # "warm" and twenty jobs, each once


def test_a_writer_killed_while_it_waits_for_a_scope_lock_reconnects_and_commits_once(
    schemas: PostgresSchemas, admin: Admin
) -> None:
    """Another session holds a scope's (or a queue's) advisory lock; a write waits for
    it in its first round trip (the BEGIN and the lock, pending, went with its first
    statement), and the server terminates the writer meanwhile. Nothing was applied on
    that connection, so the write must not say the outcome is unknown: it reconnects,
    waits again, and commits once the lock is free."""
    url = schemas.create()
    schema = _schema(url)
    with reactor.open(url, timeout=5) as state:
        store = _store(state)
        scope, queue = state.scope("s"), state.queue("q")
        scope.set("a", 0)
        queue.put("first")

        def enqueue_only() -> None:
            with scope.transaction() as tx:
                tx.enqueue("q", "tx")

        cases: list[tuple[str, str, Callable[[], Any]]] = [
            ("put", "queue:q", lambda: queue.put("second")),
            ("set (reads ahead)", "s", lambda: scope.set("a", 1)),
            ("set_many", "s", lambda: scope.set_many({"b": 1, "c": 2})),
            ("transaction that only enqueues", "s", enqueue_only),
        ]
        for name, locked, operation in cases:
            key = store._scope_keys(locked)
            admin.execute("SELECT pg_advisory_lock(%s)", (key,))
            outcome: dict[str, Any] = {}

            def run(
                operation: Callable[[], Any] = operation, outcome: dict[str, Any] = outcome
            ) -> None:
                try:
                    operation()
                    outcome["ok"] = True
                except Exception as exc:
                    outcome["error"] = exc

            thread = threading.Thread(target=run)
            thread.start()
            try:
                writer = wait_for(
                    lambda: (
                        store._writer
                        if store._writer is not None
                        and admin.execute(
                            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                            (pg_suite._backend_pid(store._writer),),
                        ).fetchall()
                        == [("Lock",)]
                        else None
                    ),
                    timeout=5,
                )
                _kill(admin, writer)
                time.sleep(0.1)
            finally:
                admin.execute("SELECT pg_advisory_unlock(%s)", (key,))
            thread.join(10)
            assert outcome == {"ok": True}, f"{name}: {outcome}"
        assert scope.get("a") == 1
        assert scope.get_many(["b", "c"]) == {"b": 1, "c": 2}
        items = [json.loads(item) for _, item, _, _ in _jobs(admin, schema, "q")]
        assert items == ["first", "second", "tx"]


# -- 3. faults at each statement ------------------------------------------------------
def _queue_steps(
    state: reactor.State, held: dict[str, Any]
) -> list[tuple[str, Callable[[], Any], bool]]:
    """Queue verbs and transactions that enqueue, each a step that the next ones build
    on, one write each (whose statements the fault loops try one by one); with whether
    it writes a row (a put with a held key only reads)."""
    scope = state.scope("s")
    queue, once = state.queue("q"), state.queue("once", max_attempts=1)

    def take(q: reactor.Queue, name: str) -> None:
        job = q.take(timeout=0, lease=600)
        assert job is not None
        held[name] = job

    def only_enqueues() -> None:
        with scope.transaction() as tx:
            tx.enqueue("q", {"tx": 1})
            tx.enqueue("other", {"tx": 1}, key="outbox-1")

    def enqueues_writes_and_schedules() -> None:
        with scope.transaction() as tx:
            tx.set("a", {"v": 1})
            tx.enqueue("q", {"tx": 2}, delay=5)
            tx.schedule("t", value=1, after=600)
            tx.increment("n")

    def across_scopes() -> None:
        with state.transaction("s", "t") as tx:
            tx["s"].increment("n")
            tx.enqueue("q", {"tx": 3})
            tx["t"].set("x", [1, 2])
            tx.enqueue("other", {"tx": 3})

    return [
        ("put", lambda: queue.put({"n": 1}), True),
        ("put with a key", lambda: queue.put("keyed", key="k1"), True),
        ("put with a held key", lambda: queue.put("again", key="k1"), False),
        ("put with a delay", lambda: queue.put("later", delay=30), True),
        ("take", lambda: take(queue, "job"), True),
        ("extend", _later(held, "job", "extend", 300), True),
        ("nack", _later(held, "job", "nack"), True),
        ("take again", lambda: take(queue, "job"), True),
        ("ack", _later(held, "job", "ack"), True),
        # Saves the new max_attempts (a pending write) with the take.
        ("take saving max_attempts", lambda: take(state.queue("q", max_attempts=4), "next"), True),
        ("ack of that one", _later(held, "next", "ack"), True),
        ("transaction that only enqueues", only_enqueues, True),
        ("transaction that enqueues, writes and schedules", enqueues_writes_and_schedules, True),
        ("transaction over two scopes that enqueues", across_scopes, True),
        ("put (max_attempts=1)", lambda: once.put("dies"), True),
        ("take (max_attempts=1)", lambda: take(once, "dying"), True),
        ("nack to the dead letters", _later(held, "dying", "nack"), True),
        ("retry_dead", once.retry_dead, True),
    ]


def _normalized(admin: Admin, schema: str) -> list[list[tuple[Any, ...]]]:
    """The tables without what differs between two runs of the same steps: job owners
    (random tokens) and timer ids (random)."""
    kv, changes, _, queues, _ = _contents(admin, schema)
    jobs = admin.execute(
        "SELECT queue, id, item, state, ready_at, attempts, key, created_at "
        f"FROM {schema}.reactor_jobs ORDER BY 1, 2"
    ).fetchall()
    timers = admin.execute(
        f"SELECT scope, key, due, every, value, ops, created_at FROM {schema}.reactor_timers "
        "ORDER BY 1, 2, 3"
    ).fetchall()
    return [kv, changes, [tuple(row) for row in jobs], queues, [tuple(row) for row in timers]]


def _run_steps_with_faults(
    state: reactor.State,
    admin: Admin,
    schema: str,
    arm: Callable[[int | None], None],
    *,
    server_refused: bool,
) -> dict[str, tuple[bool, int]]:
    """Run the steps; before each attempt ``arm(n)`` makes the n-th statement fail, for
    n = 1, 2, ... until the step succeeds. Each failure must be a ``StorageError`` that
    changed nothing (and, when the server refused a statement, not an
    ``OutcomeUnknownError``: the connection was fine). Whether each step writes, and how
    many failures it saw."""
    held: dict[str, Any] = {}
    failures: dict[str, tuple[bool, int]] = {}
    for name, step, writes in _queue_steps(state, held):
        before = _contents(admin, schema)
        failures[name] = (writes, 0)
        for n in range(1, 60):
            arm(n)
            caught: reactor.ReactorError | None = None
            try:
                step()
            except reactor.ReactorError as exc:
                caught = exc
            arm(None)
            if caught is None:
                break
            where = f"{name}, statement {n}: {caught!r}"
            assert isinstance(caught, reactor.StorageError), where
            assert "injected" in f"{caught} {caught.__cause__}", where
            if server_refused:
                assert not isinstance(caught, reactor.OutcomeUnknownError), where
            assert _contents(admin, schema) == before, f"{where} left a change"
            failures[name] = (writes, failures[name][1] + 1)
        else:
            pytest.fail(f"{name} never succeeded")
    print({name: count for name, (_, count) in failures.items()})
    return failures


def _reference(schemas: PostgresSchemas, admin: Admin) -> list[list[tuple[Any, ...]]]:
    """The tables after the steps ran once with no fault, on the same clock."""
    url = schemas.create()
    with reactor.open(url, clock=ManualClock()) as state:
        held: dict[str, Any] = {}
        for _, step, _ in _queue_steps(state, held):
            step()
        return _normalized(admin, _schema(url))


def _many_more_writes(state: reactor.State, rounds: int = 40) -> None:
    """Writes that run the same statement texts again and again, prepared by now."""
    scope, queue = state.scope("after"), state.queue("after")
    for i in range(rounds):
        scope.set("k", i)
        scope.increment("n")
        queue.put(i)
        job = queue.take(timeout=0)
        assert job is not None
        job.ack()
        with scope.transaction() as tx:
            tx.enqueue("after-tx", i)
    assert scope.get("n") == rounds
    assert queue.stats()["ready"] == 0
    assert state.queue("after-tx").stats()["ready"] == rounds


@pytest.mark.parametrize(
    "error",
    [psycopg.OperationalError, psycopg.DataError],
    ids=["connection-error", "refused-statement"],
)
def test_a_fault_at_any_statement_of_a_queue_write_changes_nothing_until_it_succeeds(
    schemas: PostgresSchemas, admin: Admin, error: Callable[[str], Exception]
) -> None:
    """The writer's n-th statement raises (on the client: before it is sent, or while
    earlier ones of its pipeline are already queued), for every n of every queue verb
    and transaction that enqueues: nothing is half-applied (keys, log, jobs, queues,
    timers unchanged), the step then succeeds, and the end state equals that of the
    same steps run once without faults. The writer's prepared statements stay in step
    and many more writes go through."""
    url = schemas.create()
    schema = _schema(url)
    with reactor.open(url, clock=ManualClock(), sweep_interval=QUIET) as state:
        store = _store(state)

        def arm(n: int | None) -> None:
            _inject(store, n, error)

        failures = _run_steps_with_faults(
            state, admin, schema, arm, server_refused=error is psycopg.DataError
        )
        assert all(count >= 2 for _, count in failures.values()), failures
        assert _normalized(admin, schema) == _reference(schemas, admin)
        _prepared_in_step(store)
        _many_more_writes(state)
        assert any(FLUSH in statement for statement in _prepared_in_step(store))


def _install_server_faults(admin: Admin, schema: str) -> Callable[[int | None], None]:
    """Statement triggers on reactor's tables that raise at the n-th write statement
    the server runs (a sequence counts them, outside any transaction); arm(n) sets n
    (None: never)."""
    admin.execute(f"CREATE TABLE {schema}.fault_at (n bigint NOT NULL)")
    admin.execute(f"INSERT INTO {schema}.fault_at VALUES (0)")
    admin.execute(f"CREATE SEQUENCE {schema}.fault_seq")
    admin.execute(
        f"CREATE FUNCTION {schema}.fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"IF nextval('{schema}.fault_seq') = (SELECT n FROM {schema}.fault_at) THEN "
        "RAISE EXCEPTION 'injected server fault: % of %', TG_OP, TG_TABLE_NAME; "
        "END IF; RETURN NULL; END $$"
    )
    for table in TABLES:
        admin.execute(
            f"CREATE TRIGGER fault AFTER INSERT OR UPDATE OR DELETE ON {schema}.{table} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {schema}.fault()"
        )

    def arm(n: int | None) -> None:
        admin.execute(f"SELECT setval('{schema}.fault_seq', 1, false)")
        admin.execute(f"UPDATE {schema}.fault_at SET n = %s", (n or 0,))

    return arm


def test_a_server_error_in_any_pending_queue_write_surfaces_and_changes_nothing(
    schemas: PostgresSchemas, admin: Admin
) -> None:
    """The server itself refuses the n-th write statement (a trigger raises), for every
    n of every queue verb and enqueueing transaction: the writes of queues are pending
    and go with a later statement or the commit's pipeline, so the error surfaces
    there. It must still be a plain ``StorageError`` (the connection is fine: not an
    unknown outcome), change nothing, and leave a writer whose prepared statements are
    in step; each step then succeeds, ending as a run without faults."""
    url = schemas.create()
    schema = _schema(url)
    with reactor.open(url, clock=ManualClock(), sweep_interval=QUIET) as state:
        store = _store(state)
        arm = _install_server_faults(admin, schema)
        failures = _run_steps_with_faults(state, admin, schema, arm, server_refused=True)
        # Every step that writes saw each of its write statements refused.
        assert all(count >= 3 for writes, count in failures.values() if writes), failures
        assert _normalized(admin, schema) == _reference(schemas, admin)
        _prepared_in_step(store)
        _many_more_writes(state)
        assert any(FLUSH in statement for statement in _prepared_in_step(store))


# -- 4. lock timeouts, again and again -------------------------------------------------
ROUNDS = 6


def test_lock_timeouts_interleaved_with_writes_never_confuse_prepared_statements(
    schemas: PostgresSchemas, admin: Admin
) -> None:
    """Another session holds, in turn, a queue's lock (the pending BEGIN's lock fails
    with the first statement), a scope's lock, and the order lock (the commit's
    pipeline fails after the pending job writes); each time the same statements then
    run again and succeed. Over many rounds: every failure is a ``BusyError`` that
    applied nothing, no error ever mentions a prepared statement, every success is
    applied once, and psycopg's prepared statements match the server's."""
    url = schemas.create()
    schema = _schema(url)
    # The timeout is every lock's wait, and also every successful write's: after a
    # failure drops the writer, the next write reconnects and prepares again, which took
    # more than 0.1 s in a fresh clone's CI run (an OperationTimeout on a write that was
    # to succeed). 0.5 s: 30 lock timeouts cost 15 s.
    with reactor.open(url, timeout=0.5) as state:
        store = _store(state)
        scope, queue = state.scope("s"), state.queue("q")
        scope.set("n", 0)
        queue.put("warm")
        held = queue.take(timeout=0, lease=600)
        assert held is not None
        busy: collections.Counter[str] = collections.Counter()

        def fails(name: str, key: int, operation: Callable[[], Any]) -> None:
            before = _contents(admin, schema)
            # A request a scope's actor runs may instead time out waiting for the actor
            # (OperationTimeout, the same timeout): its write, still waiting for the
            # lock, fails when the lock times out (``_locked`` waits for that).
            with (
                _locked(admin, store, key),
                pytest.raises((reactor.BusyError, reactor.OperationTimeout)) as caught,
            ):
                operation()
            assert "prepared statement" not in str(caught.value)
            assert _contents(admin, schema) == before, f"{name} applied something"
            busy[name] += 1

        def enqueue(item: int) -> None:
            with scope.transaction() as tx:
                tx.enqueue("q", item)

        queue_lock, scope_lock = store._scope_keys("queue:q"), store._scope_keys("s")
        order_lock = store.lock_key
        prepared: set[str] = set()
        # After each failure (which drops the writer) the same verb runs twice: on the
        # new connection its statements are prepared at their second run, then the
        # next failure hits statements being prepared in its pipeline.
        for i in range(ROUNDS):
            fails("put, queue lock", queue_lock, lambda i=i: queue.put(i))
            queue.put(i)
            queue.put(i)
            fails("put, order lock", order_lock, lambda i=i: queue.put(i))
            queue.put(i)
            queue.put(i)
            prepared.update(_prepared_in_step(store))
            fails("increment, scope lock", scope_lock, lambda: scope.increment("n"))
            scope.increment("n")
            scope.increment("n")
            fails("transaction, scope lock", scope_lock, lambda i=i: enqueue(i))
            enqueue(i)
            enqueue(i)
            prepared.update(_prepared_in_step(store))
            fails("extend, order lock", order_lock, lambda: held.extend(600))
            held.extend(600)
            scope.set_many({f"m{j}": i for j in range(20)})  # 20 rows: not prepared
            held.extend(600)
            prepared.update(_prepared_in_step(store))
        assert set(busy.values()) == {ROUNDS}
        assert scope.get("n") == 2 * ROUNDS
        items = [json.loads(item) for _, item, _, _ in _jobs(admin, schema, "q")]
        assert items == ["warm"] + [i for i in range(ROUNDS) for _ in range(6)]
        # The statements of those writes did run prepared between the failures.
        for text in (FLUSH, "FROM reactor_queues", "INSERT INTO reactor_jobs", "SET state"):
            assert any(text in statement for statement in prepared), text


# -- 5. big batches and single writes, prepared and not --------------------------------
def test_big_batches_and_single_writes_alternate_across_failures(
    schemas: PostgresSchemas, admin: Admin
) -> None:
    """asyncio: 100 tasks writing at once (one batch of ~100 rows: the flush is not
    prepared), set_many of 500 keys (not prepared), single writes and small batches
    (prepared), 100 tasks putting jobs, a transaction enqueuing 50 jobs, with the
    writer killed and a lock timeout now and then in between. Every value and job is
    there once, in order, and the log is gap-free."""
    url = schemas.create()
    schema = _schema(url)
    rounds = 6

    async def main() -> None:
        async with reactor.aio.open(url, timeout=1) as state:
            scope, queue = state.scope("s"), state.queue("q")
            for r in range(rounds):
                await asyncio.gather(*(scope.set(f"k{i}", r) for i in range(100)))
                await scope.set("single", r)
                await scope.set_many({f"m{i}": {"r": r, "i": i} for i in range(500)})
                await scope.set_many({"a": r, "b": [r]})
                await asyncio.gather(*(queue.put({"r": r, "i": i}) for i in range(100)))
                async with scope.transaction() as tx:
                    for i in range(50):
                        await tx.enqueue("q", {"r": r, "tx": i})
                await scope.increment("n")
                await scope.increment("n")
                store = _store(state)
                prepared.update(_prepared_in_step(store))
                if r != 3:
                    _kill(admin, store._writer)
                else:
                    with (
                        _locked(admin, store, store._scope_keys("s")),
                        pytest.raises((reactor.BusyError, reactor.OperationTimeout)),
                    ):
                        await scope.set("single", "never")
            assert await scope.get_many([f"k{i}" for i in range(100)]) == {
                f"k{i}": rounds - 1 for i in range(100)
            }
            assert await scope.get("m499") == {"r": rounds - 1, "i": 499}
            assert await scope.get("single") == rounds - 1
            assert await scope.get("n") == 2 * rounds

    prepared: set[str] = set()
    asyncio.run(main())
    assert any(FLUSH in statement for statement in prepared), "no flush ran prepared"
    jobs = _jobs(admin, schema, "q")
    assert len(jobs) == rounds * 150
    per_round = collections.Counter(json.loads(item)["r"] for _, item, _, _ in jobs)
    assert per_round == dict.fromkeys(range(rounds), 150)
    assert [row[0] for row in jobs] == list(range(1, rounds * 150 + 1))
    revisions = [r for (r,) in admin.execute(f"SELECT revision FROM {schema}.reactor_changes")]
    assert sorted(revisions) == list(range(1, len(revisions) + 1))
    # Per round: 100 + 1 + 500 + 2 keys, 150 jobs, 2 increments.
    assert len(revisions) == rounds * (100 + 1 + 500 + 2 + 150 + 2)


# -- 6. bugs -------------------------------------------------------------------------------
def test_dropped_writer_connections_are_not_kept_alive(
    schemas: PostgresSchemas, admin: Admin
) -> None:
    url = schemas.create()
    with reactor.open(url, timeout=0.05) as state:
        store = _store(state)
        queue = state.queue("q")
        queue.put(0)
        key = store._scope_keys("queue:q")

        def connections() -> int:
            gc.collect()
            return sum(isinstance(o, psycopg.Connection) for o in gc.get_objects())

        start = connections()
        for i in range(30):
            admin.execute("SELECT pg_advisory_lock(%s)", (key,))
            try:
                with pytest.raises(reactor.BusyError):
                    queue.put(i)
            finally:
                admin.execute("SELECT pg_advisory_unlock(%s)", (key,))
            queue.put(i)
        grown = connections() - start
        assert grown <= 5, f"{grown} more psycopg connections alive after 30 dropped writers"


def test_a_thread_looping_on_queue_puts_does_not_starve_key_writes(
    schemas: PostgresSchemas,
) -> None:
    url = schemas.create()
    with reactor.open(url, timeout=0.5) as state:
        scope, queue = state.scope("s"), state.queue("q")
        stop = threading.Event()
        puts = [0]

        def putter() -> None:
            while not stop.is_set():
                with contextlib.suppress(reactor.ReactorError):
                    queue.put(1)
                    puts[0] += 1

        thread = threading.Thread(target=putter)
        thread.start()
        errors: list[str] = []
        try:
            wait_for(lambda: puts[0] > 10, timeout=5)
            for _ in range(3):
                try:
                    scope.increment("n")
                except reactor.ReactorError as exc:
                    errors.append(repr(exc))
        finally:
            stop.set()
            thread.join(10)
        assert errors == [], f"{len(errors)} of 3 increments failed while puts ran: {errors[0]}"
