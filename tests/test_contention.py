"""Contention (SPEC §3, §5, §8): 4 processes x mixed verbs on shared keys of two scopes.

Each worker process loops over a random mix of verbs on keys all four share:
``increment`` on counters (in both scopes), ``push`` of unique items to a list, update
ops (increment a field and append a unique id to a list field, in one ``update``) on a
document, ``compare_and_swap`` retry loops on one key, ``set_many`` of two keys to one
unique value, transactions that move an amount between two accounts and log a unique id,
and delete/set cycles on one key. It counts its successes, keeps the ids of what
succeeded and of what failed, and reports every exception it saw by module and name.

The end state is exactly what the successes imply: counters equal the increments that
succeeded, the list and the document hold the ids of the pushes and updates that
succeeded and no other, the CAS key counts the successful swaps, the two ``set_many``
keys agree, the accounts keep their total and hold what the logged transfers moved, and
the change log of the cycled key counts its sets and deletes. Every exception a worker
saw is a ``reactor.ReactorError`` (no sqlite3, SQLAlchemy, psycopg or pykka error ever
reaches a caller), and every failed write left nothing behind.

Two runs: with the default timeout, where the only expected error is ``ConflictError``
(a transaction whose scope another process changed; the worker runs it again); and with
a 0.1 s timeout while the test process holds the database's write lock for 0.3 s at a
time, so that writers get ``BusyError`` (nothing applied). A write that ends in
``OperationTimeout`` may or may not have committed (SPEC: "one already running may
still commit"): its id is allowed either way, and counters get a range.

Last, a BusyError must leave the engine working once the lock is released (a short,
deterministic sequence of steps).
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import reactor

from .conftest import raw_postgres, raw_query

WORKERS = 4
TOTAL = 1000  # the two accounts' sum
OPS = {"sqlite": 1000, "postgresql": 300}  # operations per worker, default timeout
BUSY_SECONDS = 4.0  # how long the workers go on while the write lock is taken and given

WORKER = textwrap.dedent(
    """
    import json, random, sys, time, traceback
    import reactor
    from reactor import ops

    path, wid, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    seconds, timeout = float(sys.argv[4]), float(sys.argv[5])
    rng = random.Random(wid)
    ok, failed, uncertain = {}, {}, {}  # op -> ids (or amounts), or counts
    errors, foreign, samples = {}, [], {}
    done = {"ops": 0, "attempts": 0}

    def note(table, op, item=None):
        if item is None:
            table[op] = table.get(op, 0) + 1
        else:
            table.setdefault(op, []).append(item)

    def attempt(op, call, item=None):
        # One call: (True, result) on success; (False, None) when it failed, which
        # must leave nothing behind; (None, None) when its outcome is unknown
        # (OperationTimeout: it may still commit).
        done["attempts"] += 1
        try:
            result = call()
        except BaseException as exc:  # every exception is reported, none kills us
            kind = type(exc)
            name = kind.__module__ + "." + kind.__qualname__
            errors[name] = errors.get(name, 0) + 1
            if len(samples.setdefault(name, [])) < 3:
                cause = exc.__cause__
                samples[name].append(f"{op}: {exc} (cause: {type(cause).__name__}: {cause})")
            if not isinstance(exc, reactor.ReactorError):
                foreign.append("".join(traceback.format_exception(exc))[-2000:])
                return False, None
            if isinstance(exc, reactor.OperationTimeout):
                note(uncertain, op, item)
                return None, None
            note(failed, op, item)
            return False, None
        note(ok, op, item)
        return True, result

    state = reactor.open(path, timeout=timeout)
    shared, bank, other = state.scope("shared"), state.scope("bank"), state.scope("other")
    print("ready", flush=True)
    sys.stdin.readline()  # "go": all four start together
    deadline = time.monotonic() + seconds
    for i in range(count):
        if time.monotonic() > deadline:
            break
        done["ops"] += 1
        uid = f"w{wid}-{i}"
        r = rng.randrange(9)
        if r == 0:
            attempt("incr", lambda: shared.increment("hits"))
        elif r == 1:
            attempt("incr_other", lambda: other.increment("hits", 2))
        elif r == 2:
            attempt("push", lambda: shared.push("events", uid), uid)
        elif r == 3:
            attempt(
                "doc",
                lambda: shared.update("doc", [ops.increment("n"), ops.append(uid, "ids")]),
                uid,
            )
        elif r == 4:
            for tries in range(200):  # a CAS retry loop
                read, current = attempt("read", lambda: shared.get("cas", 0))
                if not read:
                    continue
                swapped, result = attempt(
                    "cas_try", lambda: shared.compare_and_swap("cas", current, current + 1)
                )
                if swapped is None:
                    note(uncertain, "cas")
                    break
                if swapped and result:
                    note(ok, "cas")
                    break
        elif r == 5:
            attempt("set_many", lambda: shared.set_many({"sm-a": uid, "sm-b": uid}), uid)
        elif r == 6:
            amount = rng.randint(-50, 50)
            for tries in range(200):  # run again after a conflict
                tid = f"{uid}-{tries}"

                def transfer():
                    with bank.transaction() as tx:
                        tx.increment("x", -amount)
                        tx.increment("y", amount)
                        tx.push("log", tid)

                applied, _ = attempt("transfer", transfer, [tid, amount])
                if applied is not False:
                    break
        elif r == 7:
            attempt("cycle_set", lambda: shared.set("cycle", uid), uid)
        else:
            removed, old = attempt("cycle_delete", lambda: shared.delete("cycle"))
            if removed and old is not None:
                note(ok, "cycle_removed")
            elif removed is None:
                note(uncertain, "cycle_removed")
    try:
        state.close()
    except BaseException as exc:
        foreign.append("close: " + repr(exc))
    report = dict(
        ok=ok, failed=failed, uncertain=uncertain, errors=errors, foreign=foreign, samples=samples
    )
    print(json.dumps({**report, **done}), flush=True)
    """
)


@contextmanager
def _workers(db: Any, count: int, seconds: float, timeout: float) -> Iterator[list[Any]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(db), str(w), str(count), str(seconds), str(timeout)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(WORKERS)
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


def _run(db: Any, count: int, seconds: float, timeout: float, blocker: Any = None) -> list[Any]:
    """Start the workers, let them go together, return their reports."""
    with _workers(db, count, seconds, timeout) as procs:
        for proc in procs:
            assert proc.stdout is not None
            readable, _, _ = select.select([proc.stdout], [], [], 60)
            assert readable, "a worker did not open the database within 60 s"
            line = proc.stdout.readline()
            assert line.strip() == "ready", proc.communicate(timeout=30)[1][-3000:]
        stop = threading.Event()
        thread = None
        if blocker is not None:
            thread = threading.Thread(target=blocker, args=(db, stop), daemon=True)
            thread.start()
        try:
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            reports = []
            for proc in procs:
                out, err = proc.communicate(timeout=120)
                assert proc.returncode == 0, err[-3000:]
                reports.append(json.loads(out.splitlines()[-1]))
        finally:
            stop.set()
            if thread is not None:
                thread.join(timeout=30)
    return reports


@contextmanager
def _write_lock(db: Any) -> Iterator[None]:
    """The database's write lock, taken from outside reactor for the ``with`` block:
    SQLite's (``BEGIN IMMEDIATE``), or on PostgreSQL a lock on the table of values
    that lets readers through and holds writers back."""
    if isinstance(db, str) and db.startswith("postgresql"):
        with raw_postgres(db) as conn, conn.transaction():
            conn.execute("LOCK TABLE reactor_kv IN EXCLUSIVE MODE")
            yield
        return
    import sqlite3

    conn = sqlite3.connect(db, isolation_level=None, timeout=10)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
    finally:
        conn.close()


def _hold_write_lock(db: Any, stop: threading.Event) -> None:
    """Take the write lock 0.3 s at a time, with 0.2 s between, until ``stop``."""
    while not stop.is_set():
        with _write_lock(db):
            stop.wait(0.3)
        stop.wait(0.2)


def _merge(reports: list[Any], part: str) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for report in reports:
        for op, value in report[part].items():
            if isinstance(value, list):
                merged.setdefault(op, []).extend(value)
            else:
                merged[op] = merged.get(op, 0) + value
    return merged


def _check(db: Any, reports: list[Any]) -> Counter[str]:
    """The end state is what the successes imply; return the errors seen, by type."""
    errors: Counter[str] = Counter()
    for report in reports:
        errors.update(report["errors"])
        assert report["foreign"] == [], "an error that is not a reactor error:\n" + "\n".join(
            report["foreign"]
        )
    assert all(name.startswith("reactor.") for name in errors), errors
    ok, failed, maybe = (
        _merge(reports, "ok"),
        _merge(reports, "failed"),
        _merge(reports, "uncertain"),
    )

    def number(table: dict[str, Any], op: str) -> int:
        found = table.get(op, 0)
        return len(found) if isinstance(found, list) else int(found)

    def counted(op: str, got: int, by: int = 1) -> None:
        low, high = number(ok, op) * by, (number(ok, op) + number(maybe, op)) * by
        assert low <= got <= high, f"{op}: {got}, from {low} acknowledged (up to {high})"

    def ids(op: str, got: list[Any]) -> None:
        assert len(got) == len(set(got)), f"{op}: an id applied twice"
        done, lost = set(ok.get(op, [])), set(failed.get(op, []))
        assert done <= set(got), f"{op}: acknowledged but missing: {sorted(done - set(got))[:5]}"
        assert not lost & set(got), f"{op}: failed but applied: {sorted(lost & set(got))[:5]}"
        assert set(got) <= done | set(maybe.get(op, [])), f"{op}: ids nobody wrote"

    with reactor.open(db) as state:
        shared, bank, other = state.scope("shared"), state.scope("bank"), state.scope("other")
        counted("incr", shared.get("hits", 0))
        counted("incr_other", other.get("hits", 0), by=2)
        counted("cas", shared.get("cas", 0))  # each success moved it by one
        ids("push", shared.get("events", []))
        doc = shared.get("doc", {"n": 0, "ids": []})
        ids("doc", doc["ids"])
        assert doc["n"] == len(doc["ids"]), f"an update applied in part: {doc['n']}"

        a, b = shared.get("sm-a"), shared.get("sm-b")
        assert a == b, f"set_many applied in part: {a!r} != {b!r}"
        if a is not None:
            assert a in set(ok.get("set_many", [])) | set(maybe.get("set_many", [])), a

        accounts = bank.get_many(["x", "y"])
        log = bank.get("log", [])
        amounts = dict(ok.get("transfer", []) + maybe.get("transfer", []))
        for table in (ok, failed, maybe):  # [id, amount] pairs -> ids
            table["transfer"] = [tid for tid, _ in table.get("transfer", [])]
        ids("transfer", log)
        moved = sum(amounts[tid] for tid in log)
        assert accounts["x"] + accounts["y"] == TOTAL, f"the total moved: {accounts}"
        assert accounts["y"] == moved, f"{accounts} after transfers of {moved} to y"

        cycle = shared.get("cycle")
        if cycle is not None:
            assert cycle not in set(failed.get("cycle_set", [])), f"a failed set applied: {cycle}"
            assert cycle in set(ok.get("cycle_set", [])) | set(maybe.get("cycle_set", []))
    events = dict(
        raw_query(
            db,
            "SELECT type, COUNT(*) FROM reactor_changes WHERE scope = 'shared' "
            "AND key = 'cycle' GROUP BY type",
        )
    )
    counted("cycle_set", events.get("created", 0) + events.get("updated", 0))
    counted("cycle_removed", events.get("deleted", 0))
    return errors


def _figures(label: str, reports: list[Any], errors: Counter[str], seconds: float) -> None:
    def sizes(part: str) -> dict[str, int]:
        merged = _merge(reports, part)
        return {op: len(v) if isinstance(v, list) else v for op, v in sorted(merged.items())}

    print(
        f"\ncontention ({label}): {WORKERS} processes, ops per worker "
        f"{[report['ops'] for report in reports]}, "
        f"{sum(report['attempts'] for report in reports)} calls; successes {sizes('ok')}; "
        f"failed {sizes('failed')}; outcome unknown {sizes('uncertain')}; "
        f"errors {dict(errors)}; {seconds:.1f} s"
    )


def _only(reports: list[Any], errors: Counter[str], expected: set[str]) -> None:
    """Only the errors this run can expect; else the first of each other kind."""
    unexpected = set(errors) - {f"reactor.errors.{name}" for name in expected}
    samples = [
        text
        for report in reports
        for name, texts in report["samples"].items()
        if name in unexpected
        for text in texts[:1]
    ]
    assert not unexpected, f"unexpected errors {dict(errors)}:\n" + "\n".join(samples)


def test_4_processes_mixed_verbs_on_shared_keys_end_exact(
    db_path: Any, request: pytest.FixtureRequest
) -> None:
    ops = OPS[request.config.getoption("backend")]
    with reactor.open(db_path) as state:
        state.scope("bank").set_many({"x": TOTAL, "y": 0})
        state.scope("shared").set("cas", 0)
    started = time.monotonic()
    reports = _run(db_path, ops, 60.0, 30.0)
    errors = _check(db_path, reports)
    _figures("default timeout", reports, errors, time.monotonic() - started)
    _only(reports, errors, {"ConflictError"})
    assert all(report["ops"] == ops for report in reports)


def test_4_processes_under_a_held_write_lock_get_busy_errors_and_apply_nothing(
    db_path: Any,
) -> None:
    with reactor.open(db_path) as state:
        state.scope("bank").set_many({"x": TOTAL, "y": 0})
        state.scope("shared").set("cas", 0)
    started = time.monotonic()
    reports = _run(db_path, 100_000, BUSY_SECONDS, 0.1, blocker=_hold_write_lock)
    errors = _check(db_path, reports)
    _figures("write lock held, 0.1 s timeout", reports, errors, time.monotonic() - started)
    _only(reports, errors, {"BusyError", "ConflictError", "OperationTimeout"})
    assert errors["reactor.errors.BusyError"] > 0, f"the held write lock went unnoticed: {errors}"
    ok = _merge(reports, "ok")
    assert sum(len(v) if isinstance(v, list) else v for v in ok.values()) > 0


def test_busy_errors_are_transient_writes_work_once_the_lock_is_released(db_path: Any) -> None:
    """A BusyError leaves the engine as it was: once the lock is gone, writes go through.

    The steps before the held lock matter on PostgreSQL: a write that failed in its
    work (here a TypeMismatchError, rolled back), then a write that succeeded, then
    writes that time out while the lock is held (the fifth statement of a kind is where
    the driver starts preparing it)."""
    with reactor.open(db_path) as state:
        state.scope("s").set("text", "abc")
    with reactor.open(db_path, timeout=0.05) as state:
        scope = state.scope("s")
        with pytest.raises(reactor.TypeMismatchError):
            scope.increment("text")
        scope.set("k", 0)
        with _write_lock(db_path):
            for i in range(8):
                with pytest.raises(reactor.BusyError):
                    scope.set("k", i + 1)
        for i in range(3):
            scope.set("k", f"after {i}")  # StorageError here: the engine stayed broken
        assert scope.get("k") == "after 2"
        assert scope.increment("n") == 1


_FROZEN_WRITER = """
    import sys, reactor
    with reactor.open(sys.argv[1], timeout=60) as state:
        print("open", flush=True)
        sys.stdin.readline()
        state.scope("s").set("k", "from the writer frozen in its transaction")
"""


@pytest.mark.postgresql_only
def test_a_writer_stopped_inside_its_transaction_loses_its_locks_after_its_timeout(
    db_path: Any,
) -> None:
    """A process stopped (SIGSTOP) between the two round trips of its write, holding
    the scope's lock, idle in its transaction: another process waiting for that lock
    past its timeout ends the frozen writer's session, and its write goes through,
    where it would fail (BusyError) for as long as the writer stays stopped. (The
    server's ``idle_in_transaction_session_timeout`` alone misses it whenever psycopg
    ended the round trip with a flush request after its sync.)"""
    import os
    import signal

    with reactor.open(db_path, timeout=3) as state:
        state.scope("s").set("k", "before")
        child = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_FROZEN_WRITER), str(db_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None
        assert child.stdout is not None
        try:
            assert child.stdout.readline().strip() == "open"
            with raw_postgres(db_path) as locker, raw_postgres(db_path) as watcher:
                with locker.transaction():
                    # The writer's first round trip (the scope's lock, then its rows)
                    # waits for this; it is stopped there, and its rows come after.
                    locker.execute("LOCK TABLE reactor_kv IN ACCESS EXCLUSIVE MODE")
                    child.stdin.write("go\n")
                    child.stdin.flush()
                    # The writer's read of its rows (not the upkeep's reads, say).
                    waiting = (
                        "SELECT a.pid FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid) "
                        "WHERE NOT l.granted AND a.query LIKE '%%unnest%%reactor_kv%%'"
                    )
                    deadline = time.monotonic() + 20
                    while not (found := watcher.execute(waiting).fetchall()):
                        assert time.monotonic() < deadline, "the writer never began"
                        time.sleep(0.01)
                    os.kill(child.pid, signal.SIGSTOP)
                idle = (
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE state = 'idle in transaction' AND pid = %s"
                )
                while watcher.execute(idle, found[0]).fetchone()[0] == 0:
                    assert time.monotonic() < deadline, "the writer never held its lock idle"
                    time.sleep(0.01)
            start = time.monotonic()
            state.scope("s").set("k", "after")  # waits for the scope's lock
            waited = time.monotonic() - start
        finally:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.communicate(timeout=30)  # and closes its pipes
        assert waited < 10  # this process's timeout, then the frozen writer is ended
        assert state.scope("s").get("k") == "after"
