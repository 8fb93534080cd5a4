"""Lifecycle under attack (SPEC §1, §8): ``open()`` racing the close of the last handle,
``close()`` racing every verb, a slow open, file descriptors running out, interpreter
exit in the middle of everything.

The promises: an ``open()`` always returns a working handle (or a typed error), even
while the last handle of the same database closes; a handle closed under a running
verb raises ``ClosedError``, never a driver error, and never hangs; nothing
acknowledged is lost; once every handle is closed, no thread is left.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import reactor
from tests.conftest import engine_of, engines_registered

ROOT = Path(__file__).resolve().parent.parent
JOIN = 20.0  # seconds any thread of a test may take to finish: far beyond need


def _works(state: reactor.State) -> None:
    """A write and a read through ``state`` succeed."""
    token = uuid.uuid4().hex
    scope = state.scope("lifecycle")
    scope.set("probe", token)
    assert scope.get("probe") == token


def _join_all(threads: list[threading.Thread], timeout: float = JOIN) -> None:
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [thread.name for thread in threads if thread.is_alive()]
    assert not hung, f"threads still running after {timeout} s: {hung}"


def _reactor_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name.startswith("reactor")}


@pytest.fixture
def preemptive() -> Iterator[None]:
    """Switch threads every few microseconds: races that need bad luck get it."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(previous)


# -- open() racing the close of the last handle ------------------------------------------
def test_open_after_a_direct_close_of_the_engine_starts_a_new_one(target: Any) -> None:
    """An engine closed as a whole (as at interpreter exit) is not joined by open()."""
    first = reactor.open(target)
    first_engine = engine_of(first)
    first_engine.close()
    second = reactor.open(target)
    try:
        _works(second)
        assert engine_of(second) is not first_engine
    finally:
        first.close()
        second.close()


@pytest.mark.usefixtures("preemptive")
def test_threads_opening_and_closing_one_database_always_get_working_handles(
    target: Any,
) -> None:
    """6 threads, 40 rounds each, in step: open, write, read, close. Every open()
    returns a handle that works; the last close leaves no thread behind."""
    _storm(target, rounds=40, workers=6)


@pytest.mark.slow
@pytest.mark.usefixtures("preemptive")
def test_open_close_storm_long(target: Any) -> None:
    """The same, 8 threads and 600 rounds each."""
    _storm(target, rounds=600, workers=8)


def _storm(target: Any, *, rounds: int, workers: int) -> None:
    before = _reactor_threads()
    step = threading.Barrier(workers, timeout=JOIN)
    failures: list[str] = []

    def worker(i: int) -> None:
        for n in range(rounds):
            step.wait()
            try:
                state = reactor.open(target)
            except Exception as exc:
                failures.append(f"open: {exc!r}")
                continue
            try:
                scope = state.scope(f"w{i}")
                scope.set("n", n)
                if scope.get("n") != n:
                    failures.append(f"worker {i} read back {scope.get('n')!r}, not {n}")
            except Exception as exc:
                failures.append(f"use: {exc!r}")
            finally:
                state.close()

    threads = [threading.Thread(target=worker, args=(i,), name=f"w{i}") for i in range(workers)]
    for thread in threads:
        thread.start()
    _join_all(threads, JOIN + rounds * 0.25)  # a round may start an engine: ~30 ms
    assert failures == []
    assert _reactor_threads() - before == set()
    assert engines_registered() == []


@pytest.mark.usefixtures("preemptive")
def test_open_from_one_thread_while_another_closes_the_last_handle(target: Any) -> None:
    """One thread keeps a handle open and closes it, over and over; the other opens a
    handle each time just as that happens. 100 rounds, each one checked."""
    failures: list[str] = []
    go = threading.Barrier(2, timeout=JOIN)
    rounds = 100

    def closer() -> None:
        for _ in range(rounds):
            state = reactor.open(target)
            go.wait()
            state.close()
            go.wait()

    thread = threading.Thread(target=closer, name="closer")
    thread.start()
    try:
        for n in range(rounds):
            go.wait()
            try:
                state = reactor.open(target)
            except Exception as exc:
                failures.append(f"round {n}: open raised {exc!r}")
                go.wait()
                continue
            try:
                _works(state)
            except Exception as exc:
                failures.append(f"round {n}: {exc!r}")
            finally:
                go.wait()
                state.close()
    except BaseException:
        go.abort()  # the closer must not wait for a partner that is gone
        raise
    finally:
        _join_all([thread])
    assert failures == []


# -- close() racing what runs on the engine -----------------------------------------------
def _ignore(event: reactor.ChangeEvent) -> None:
    pass


def _hammer(
    name: str, state: reactor.State, stop: threading.Event, log: Callable[..., None]
) -> None:
    """Run one kind of operation on ``state`` until it is closed under it."""
    scope = state.scope(f"h-{name}")
    n = 0
    while not stop.is_set():
        n += 1
        try:
            if name == "set":
                scope.set("k", n)
                log("acked", n)
            elif name == "update":
                scope.update("doc", [reactor.ops.increment("n")])
            elif name == "transaction":
                with scope.transaction() as tx:
                    tx.increment("n")
            elif name == "subscribe":
                state.subscribe(_ignore, scope="h-*").close()
            elif name == "watch":
                state.watch(since=0, scope="h-set").close()
            elif name == "lock":
                lock = state.lock("h-lock", ttl=5)
                if lock.acquire(timeout=1):
                    lock.release()
            elif name == "reads":
                scope.get("k")
                state.scopes()
                state.changes(limit=5)
                state.stats()
        except reactor.ClosedError:
            return
        except BaseException as exc:
            log("error", f"{name}: {exc!r}")
            return


KINDS = ("set", "update", "transaction", "subscribe", "watch", "lock", "reads")


@pytest.mark.usefixtures("preemptive")
def test_close_racing_every_kind_of_operation_raises_closed_error_only(db_path: Any) -> None:
    """Threads write, update, run transactions, subscribe, watch, take locks and read
    while the handle closes under them: each stops on ClosedError (no other error, no
    hang), and every acknowledged write is in the database afterwards. 12 rounds."""
    errors: list[str] = []
    acked: dict[int, int] = {}
    for round_ in range(12):
        state = reactor.open(db_path)
        stop = threading.Event()

        def log(what: str, value: Any, round_: int = round_) -> None:
            if what == "acked":
                acked[round_] = value
            else:
                errors.append(value)

        threads = [
            threading.Thread(target=_hammer, args=(kind, state, stop, log), name=f"h-{kind}")
            for kind in KINDS
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.03)
        started = time.monotonic()
        state.close()
        closing_took = time.monotonic() - started
        stop.set()
        _join_all(threads)
        assert closing_took < 6, f"close() took {closing_took:.1f} s"
        with reactor.open(db_path) as check:
            stored = check.scope("h-set").get("k")
        if round_ in acked:
            assert stored == acked[round_], (round_, stored, acked[round_])
    assert errors == []


def test_close_from_many_threads_at_once_closes_once(target: Any) -> None:
    """Every handle of an engine closed at the same moment, each from its own thread."""
    before = _reactor_threads()
    handles = [reactor.open(target) for _ in range(8)]
    _works(handles[0])
    go = threading.Barrier(len(handles), timeout=JOIN)
    errors: list[BaseException] = []

    def close(state: reactor.State) -> None:
        go.wait()
        try:
            state.close()
            state.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=close, args=(handle,)) for handle in handles]
    for thread in threads:
        thread.start()
    _join_all(threads)
    assert errors == []
    assert all(handle.closed for handle in handles)
    assert _reactor_threads() - before == set()


# -- a slow open holds up no one else -------------------------------------------------------
@pytest.mark.sqlite_only("holds SQLite's write lock with the sqlite3 module")
def test_an_open_stuck_on_a_locked_database_does_not_hold_up_other_databases(
    tmp_path: Path,
) -> None:
    """Opening runs the schema check in a write transaction; while another connection
    holds the write lock it waits (up to its timeout). Meanwhile opening and closing
    other databases goes on; before the fix, every open() in the process waited."""
    import sqlite3

    locked = tmp_path / "locked.db"
    with reactor.open(locked) as state:
        state.scope("s").set("k", 1)
    holder = sqlite3.connect(locked, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    outcome: list[BaseException | reactor.State] = []

    def open_locked() -> None:
        try:
            outcome.append(reactor.open(locked, timeout=4))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=open_locked, name="open-locked")
    thread.start()
    try:
        time.sleep(0.2)  # it is waiting for the lock now
        started = time.monotonic()
        with reactor.open(tmp_path / "other.db") as other:
            _works(other)
        # Held up, it would have waited for the stuck open's 4 s; the margin is for a
        # stall of a loaded machine (it was 1.0 s of a 1.5 s timeout).
        assert time.monotonic() - started < 3.0
    finally:
        _join_all([thread])
        holder.execute("ROLLBACK")
        holder.close()
    assert len(outcome) == 1
    assert isinstance(outcome[0], reactor.BusyError), outcome


# -- file descriptors run out ---------------------------------------------------------------
SHORT_OF_DESCRIPTORS = """
    import json, resource, sys, threading
    import psutil, reactor

    target, other = sys.argv[1], sys.argv[2]
    seen = []

    def keep(exc):
        seen.append([type(exc).__module__, type(exc).__name__, str(exc)])

    def readers(state, count=24):
        def read():
            try:
                for _ in range(20):
                    state.scope("s").get("k")
                    state.scope("s").keys()
            except BaseException as exc:
                keep(exc)
        threads = [threading.Thread(target=read) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)

    state = reactor.open(target)
    state.scope("s").set("k", 0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (psutil.Process().num_fds(), hard))
    readers(state)  # each thread that finds no idle connection opens one
    try:
        reactor.open(other).close()  # a new engine needs descriptors too
    except BaseException as exc:
        keep(exc)
    try:
        state.scope("s").set("k", 1)
    except BaseException as exc:
        keep(exc)
    short = seen[:]
    seen.clear()

    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    readers(state)
    state.scope("s").set("k", 2)
    with reactor.open(other) as again:
        again.scope("s").set("k", "other")
    assert state.scope("s").get("k") == 2
    state.close()
    print(json.dumps({"short": short, "after": seen}))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE is POSIX")
def test_running_out_of_file_descriptors_raises_storage_error_then_recovers(
    db_path: Any, tmp_path: Path
) -> None:
    """With no descriptor left, reader threads that need a connection, and opening
    another database, fail with StorageError (before the fix: sqlite3.OperationalError);
    once descriptors are back, everything works again."""
    run = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-c",
            textwrap.dedent(SHORT_OF_DESCRIPTORS),
            str(db_path),
            str(tmp_path / "other.db"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout)
    assert found["short"], "the limit was never hit"
    if not isinstance(db_path, str):  # SQLite names the cause; psycopg says too little
        assert any("no file descriptor left" in text for _, _, text in found["short"]), found
    assert {(module, name) for module, name, _ in found["short"]} <= {
        ("reactor.errors", "StorageError")
    }, found["short"]
    assert found["after"] == []


# -- interpreter exit ------------------------------------------------------------------------
LEFT_RUNNING = """
    import sys, threading, time, reactor

    target = sys.argv[1]
    state = reactor.open(target)
    other = reactor.open(target)  # a second handle, also never closed
    state.subscribe(lambda event: time.sleep(3600), scope="stuck")  # never returns
    state.scope("stuck").set("k", 1)
    assert state.lock("held", ttl=60).acquire(blocking=False)

    def wait_for_lock():
        try:
            other.lock("held", ttl=60).acquire(timeout=600)
        except reactor.ReactorError:
            pass

    def watch():
        try:
            for _ in state.watch(scope="nothing-ever"):
                pass
        except reactor.ReactorError:
            pass

    def write():
        scope = other.scope("w")
        n = 0
        while True:
            n += 1
            try:
                scope.set("k", n)
            except reactor.ClosedError:
                return
            print(n, flush=True)

    for job in (wait_for_lock, watch, write):
        threading.Thread(target=job, daemon=True).start()
    time.sleep(0.3)
    # exit now: the engine open, a subscriber stuck, a waiter, a watcher, a writer
"""


def test_interpreter_exit_in_the_middle_of_everything_neither_hangs_nor_loses(
    db_path: Any,
) -> None:
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LEFT_RUNNING), str(db_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    took = time.monotonic() - started
    assert run.returncode == 0, run.stderr[-3000:]
    assert took < 15, f"exit took {took:.1f} s"  # 5 s of it: the stuck subscriber's share
    acknowledged = [int(line) for line in run.stdout.split()]
    assert acknowledged, run.stderr
    with reactor.open(db_path) as state:
        assert state.scope("w").get("k") == acknowledged[-1]
        assert state.scope("stuck").get("k") == 1


READERS_DURING_CLOSE = """
    import sys, threading, reactor

    path = sys.argv[1]
    for round_ in range(int(sys.argv[2])):
        state = reactor.open(path)
        scope = state.scope("s")
        if round_ == 0:
            for start in range(0, 3000, 500):
                scope.set_many({f"k{i}": i for i in range(start, start + 500)})
        go = threading.Event()
        watches = [state.watch(since=0) for _ in range(6)]

        def read(watch):
            go.wait()
            try:
                for _ in watch:  # replays the log on a reader connection of its own
                    scope.get("k1")
            except reactor.ReactorError:
                pass

        threads = [threading.Thread(target=read, args=(w,)) for w in watches]
        for thread in threads:
            thread.start()
        go.set()
        state.close()  # while the watches read the log
        for thread in threads:
            thread.join(30)
    print("ok")
"""


@pytest.mark.sqlite_only("sqlite3 connections closed under a running statement")
def test_closing_while_threads_read_never_crashes_the_interpreter(tmp_path: Path) -> None:
    """close() used to close every connection, those a reader was running a statement
    on included: Python's sqlite3 then crashes the process (a segfault, seen 1 run in 15
    of the close-racing test above; this child did not reproduce it on the old code in
    3 runs). Now a reader's connection is closed only when it is given back. Run in a
    child, so that a crash fails this test rather than the whole suite."""
    run = subprocess.run(
        [
            sys.executable,
            "-X",
            "faulthandler",
            "-c",
            textwrap.dedent(READERS_DURING_CLOSE),
            str(tmp_path / "r.db"),
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-3000:]}"
    assert run.stdout.strip() == "ok"
