"""A campaign against the events of work queues (SPEC §7, §8 and §13; the queues
guide, "Events"; the triggers guide, "At most once, or at least once").

The promise attacked: every queue operation (put, take, ack, nack, extend, a lease run
out and turned back by a sweeper, dead-lettering, ``retry_dead``, ``tx.enqueue``) is an
ordinary write. It commits a change record of scope ``queue:NAME``, key the job's id,
with a revision; subscribers get its event after the commit, and never get one for an
operation that did not commit. A durable subscriber gets every event at least once, in
revision order, and after a crash resumes at the first unacknowledged event: "at most
the interrupted event twice, never a gap" (triggers guide, "Durable subscriptions").

Workers, subscribers and sweepers are processes of their own, killed with SIGKILL at
random moments (the seed is in every failure message). Every wait has a timeout; the
file runs in under 20 s on SQLite, and as fast on PostgreSQL (``--backend=postgresql``).

It found one bug, fixed: the events of a transaction's ``tx.enqueue`` came after all
of its key writes, not in the order of the body (``WriteTxn.adopt`` ran deferred work
after the body's records; it now runs it at its place among them).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import reactor
from reactor.testing import ManualClock
from tests.conftest import backend, raw_query
from tests.conftest import wait_for as eventually
from tests.test_campaign_queues import _finish, _python
from tests.test_campaign_workflow import _in_other_process

MAX_ATTEMPTS = 3  # the campaign's queues: jobs die, and are revived, often enough
QUEUES = ("a", "b")

# One JSON line per op and its outcome, flushed once the op has returned: what the
# worker knows committed (put: the id; take: the id and attempts; ack, nack, extend:
# whether it was refused with LockNotOwnedError; "late-*": the same verbs on a job
# whose lease it let run out, which must be refused).
WORKER = """
import json, os, random, sys, time
import reactor

db, seed, seconds, notes = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
stop = sys.argv[5] if len(sys.argv) > 5 else None  # a file: once it exists, stop early
rng = random.Random(seed)
LEASE = 0.5
with reactor.open(db) as state, open(notes, "a") as out:
    def note(*fields):
        out.write(json.dumps(fields) + "\\n")
        out.flush()

    queues = {name: state.queue(name, max_attempts=3) for name in ("a", "b")}
    abandoned = []  # jobs left to their lease: (when it has surely run out, job)

    def finish(job, verb, *args, late=False):
        try:
            getattr(job, verb)(*args)
        except reactor.LockNotOwnedError:
            ok = False
        else:
            ok = True
        note(("late-" if late else "") + verb, job.queue, job.id, ok)
        return ok

    def late(everything):
        while abandoned and (everything or abandoned[0][0] <= time.monotonic()):
            due, job = abandoned.pop(0)
            time.sleep(max(0.0, due - time.monotonic()))
            finish(job, rng.choice(["ack", "nack", "extend"]), late=True)

    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end and not (stop and os.path.exists(stop)):
        n += 1
        name = rng.choice(sorted(queues))
        queue = queues[name]
        late(False)
        roll = rng.random()
        if roll < 0.3:
            key = f"k{rng.randrange(10)}" if rng.random() < 0.3 else None
            delay = 0.2 if rng.random() < 0.1 else None
            note("put", name, queue.put({"n": n, "seed": seed}, delay=delay, key=key))
        elif roll < 0.36:
            item = {"n": n, "seed": seed, "outbox": True}
            try:  # another worker's commit to "orders" meanwhile: a ConflictError
                if roll < 0.34:
                    with state.scope("orders").transaction() as tx:
                        tx.increment("count")
                        tx.enqueue(name, item, key=f"e{seed}-{n}")
                else:
                    with state.transaction("ledger", "orders") as multi:
                        multi["orders"].increment("count")
                        multi.enqueue(name, item)
            except reactor.ConflictError:
                note("enqueue-conflict", name)
            else:
                note("enqueue", name)
        elif roll < 0.40:
            try:
                with state.scope("orders").transaction() as tx:
                    tx.enqueue(name, {"n": n, "seed": seed, "rolled back": True})
                    tx.increment("count")
                    raise RuntimeError("the body fails after its enqueue")
            except RuntimeError:
                note("enqueue-raised", name)
        elif roll < 0.43:
            note("retry", name, queue.retry_dead())
        else:
            job = queue.take(timeout=0, lease=LEASE)
            if job is not None:
                note("take", name, job.id, job.attempts)
                fate = rng.random()
                if fate < 0.45:
                    finish(job, "ack")
                elif fate < 0.7:
                    finish(job, "nack", rng.choice([None, 0.1]))
                elif fate < 0.85:
                    if finish(job, "extend", LEASE):
                        finish(job, "ack")
                else:
                    abandoned.append((time.monotonic() + LEASE + 0.1, job))
        time.sleep(0.002)
    late(True)
    print(n, flush=True)
"""

# A durable subscriber of every queue's events: each one it is given becomes a line of
# its file, flushed before the callback returns (and so before its position is saved).
# Killed with SIGKILL, never closed.
DURABLE = """
import json, sys, time
import reactor

db, out, name = sys.argv[1], sys.argv[2], sys.argv[3]
state = reactor.open(db)
record = open(out, "a")

def on_event(event):
    new = event.new_value
    line = [event.revision, event.scope, event.key, event.type, new and new["state"]]
    record.write(json.dumps(line) + "\\n")
    record.flush()
    time.sleep(0.001)  # recorded, not yet acknowledged: a kill now makes a repeat

state.subscribe(on_event, scope="queue:*", durable=name, since=0)
print("subscribed", flush=True)
time.sleep(600)
"""

# A subscriber (plain, or durable if given a name) that also sweeps, like every engine;
# it closes (delivering what is pending) once the file ``stop`` exists.
WATCHER = """
import json, os, sys, time
import reactor

db, out, durable, stop = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
with reactor.open(db) as state, open(out, "a") as record:
    def on_event(event):
        new = event.new_value
        line = [event.revision, event.scope, event.key, event.type, new and new["state"]]
        record.write(json.dumps(line) + "\\n")
        record.flush()

    state.subscribe(on_event, scope="queue:*", since=0, durable=durable or None)
    print("subscribed", flush=True)
    while not os.path.exists(stop):
        time.sleep(0.05)
"""

# A worker that takes four jobs with a 0.5 s lease, and keeps extending the first one
# until it is killed.
HOLDER = """
import sys, time, reactor

with reactor.open(sys.argv[1]) as state:
    held = [state.queue("w").take(timeout=10, lease=0.5) for _ in range(3)]
    held.append(state.queue("d").take(timeout=10, lease=0.5))
    print(" ".join(f"{job.queue}:{job.id}" for job in held), flush=True)
    while True:
        time.sleep(0.1)
        held[0].extend(0.5)
        print("extended", flush=True)
"""


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[str]]]:
    """The processes a test starts: killed (if still running) and reaped after it."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def _start(spawned: list[subprocess.Popen[str]], code: str, *args: str) -> subprocess.Popen[str]:
    process = _python(code, *args)
    spawned.append(process)
    return process


def _kill(process: subprocess.Popen[str]) -> None:
    """SIGKILL, and reap."""
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)


def _repeats(lives: list[Path]) -> int:
    """How many of the subscriber's lives began with the event the life before ended
    on: killed in its callback, after recording it and before acknowledging it."""
    last: int | None = None
    repeats = 0
    for life in lives:
        revisions = [row[0] for row in _lines(life)]
        if revisions and revisions[0] == last:
            repeats += 1
        if revisions:
            last = revisions[-1]
    return repeats


def _lines(path: Path) -> list[list[Any]]:
    """The JSON lines of a record file; a last line cut short by a kill was never
    recorded."""
    if not path.exists():
        return []
    rows: list[list[Any]] = []
    for line in path.read_text().splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        rows.append(json.loads(line))
    return rows


def _row(event: reactor.ChangeEvent) -> list[Any]:
    """An event as the subscriber processes record it."""
    new = event.new_value
    return [event.revision, event.scope, event.key, event.type, new and new["state"]]


def _job(event: reactor.ChangeEvent) -> tuple[str, int]:
    assert event.scope.startswith("queue:"), event
    return event.scope.removeprefix("queue:"), int(event.key)


def _kind(event: reactor.ChangeEvent) -> str:
    """Which operation an event of a job records (the queues guide's table, with a
    lease run out told from a nack by its ``ready_at``: a lease run out keeps it,
    the end of the lease; a nack sets it to now (+ delay), before that end)."""
    if event.type != "updated":
        return {"created": "put", "deleted": "ack"}.get(event.type, event.type)
    old, new = event.old_value["state"], event.new_value["state"]
    if old == "taken" and new in ("ready", "dead"):
        same = event.new_value["ready_at"] == event.old_value["ready_at"]
        return "expiry" if same else "nack"
    kinds = {("ready", "taken"): "take", ("taken", "taken"): "extend", ("dead", "ready"): "retry"}
    return kinds.get((old, new), f"{old}->{new}")


def _fold(events: list[reactor.ChangeEvent]) -> dict[tuple[str, int], Any]:
    """The jobs the events describe, each as its last document, after checking that
    every job's events form one chain of legal transitions: each event's ``old_value``
    is the previous one's ``new_value`` (no event missing, none extra), a job is
    created once, never comes back after its ``deleted``, and moves only as the queues
    guide says (attempts +1 at a take, back to 0 at a revival, dead after the
    ``MAX_ATTEMPTS``-th take)."""
    jobs: dict[tuple[str, int], Any] = {}
    gone: set[tuple[str, int]] = set()
    for event in events:
        job = _job(event)
        old, new, kind = event.old_value, event.new_value, _kind(event)
        where = f"{kind} of job {job} at revision {event.revision}"
        if kind == "put":
            assert job not in jobs, f"{where}: its id came back"
            assert job not in gone, f"{where}: its id came back"
            assert old is None, where
            assert (new["state"], new["attempts"]) == ("ready", 0), where
            jobs[job] = new
            continue
        assert job in jobs, f"{where}: no event created the job, or one deleted it"
        assert old == jobs[job], f"{where}: old_value {old} is not the last new_value"
        if kind == "ack":
            assert new is None, where
            del jobs[job]
            gone.add(job)
            continue
        if kind == "take":
            assert new["attempts"] == old["attempts"] + 1, where
        elif kind == "retry":
            assert new["attempts"] == 0, where
        elif kind in ("extend", "nack", "expiry"):
            assert new["attempts"] == old["attempts"], where
            if kind != "extend":
                dead = old["attempts"] >= MAX_ATTEMPTS
                assert new["state"] == ("dead" if dead else "ready"), where
        else:
            pytest.fail(f"{where}: not a transition of a job")
        assert new["item"] == old["item"], where
        jobs[job] = new
    return jobs


def _settle(state: reactor.State, db: Any) -> None:
    """Until no job is taken in the table (every lease has run out and been turned
    back by a sweeper) and none is delayed."""
    eventually(
        lambda: raw_query(db, "SELECT COUNT(*) FROM reactor_jobs WHERE state = 'taken'") == [(0,)],
        timeout=20,
    )
    eventually(lambda: all(state.queue(q).stats()["delayed"] == 0 for q in QUEUES), timeout=10)


def _check_jobs_match_events(state: reactor.State, db: Any) -> dict[tuple[str, int], Any]:
    """The jobs the change log describes are the jobs of the table, of ``stats()`` and
    of ``dead()`` (once settled); the jobs."""
    jobs = _fold(state.changes(scope="queue:*"))
    table = {
        (queue, int(job_id)): {
            "state": job_state,
            "attempts": attempts,
            "ready_at": float(ready_at),
            "item": json.loads(item),
            # The last failed attempt's error (a nack's, or the lease running out).
            **({} if errors is None else {"error": json.loads(errors)[-1]["error"]}),
        }
        for queue, job_id, item, job_state, ready_at, attempts, errors in raw_query(
            db, "SELECT queue, id, item, state, ready_at, attempts, errors FROM reactor_jobs"
        )
    }
    assert table == jobs, "the jobs table is not what the queue events describe"
    for name in QUEUES:
        mine = {job_id: doc for (queue, job_id), doc in jobs.items() if queue == name}
        ready = sum(1 for doc in mine.values() if doc["state"] == "ready")
        dead = {job_id: doc for job_id, doc in mine.items() if doc["state"] == "dead"}
        assert state.queue(name).stats() == {
            "ready": ready,
            "delayed": 0,
            "taken": 0,
            "dead": len(dead),
            "taken_by_group": {},
            "rate_window": 0,
        }, name
        in_order = sorted(dead, key=lambda job_id: (dead[job_id]["ready_at"], job_id))
        assert [(job.id, job.attempts, job.item) for job in state.queue(name).dead()] == [
            (job_id, dead[job_id]["attempts"], dead[job_id]["item"]) for job_id in in_order
        ], f"{name}: dead() is not the dead jobs of the events, in the order they died"
    return jobs


def _notes(paths: list[Path]) -> list[list[Any]]:
    return [note for path in paths for note in _lines(path)]


def _ops(notes: list[list[Any]], verb: str) -> Counter[tuple[str, int]]:
    """The jobs each op ``verb`` that the workers saw succeed was done to (with
    repeats): every take noted got its job; an ack, nack or extend, if not refused."""
    return Counter(
        (note[1], note[2])
        for note in notes
        if note[0] == verb and (verb == "take" or note[3] is True)
    )


def _transitions(events: list[reactor.ChangeEvent]) -> dict[str, Counter[tuple[str, int]]]:
    found: dict[str, Counter[tuple[str, int]]] = {}
    for event in events:
        found.setdefault(_kind(event), Counter())[_job(event)] += 1
    return found


def _outbox_checks(state: reactor.State, events: list[reactor.ChangeEvent]) -> int:
    """Each committed outbox transaction is one increment and one job, and a rolled
    back one neither; how many jobs came from an outbox."""
    items = [event.new_value["item"] for event in events if event.type == "created"]
    assert not [item for item in items if "rolled back" in item], "a rolled back enqueue"
    outbox = sum(1 for item in items if "outbox" in item)
    assert state.scope("orders").get("count", 0) == outbox
    return outbox


# == 1. a durable subscriber killed again and again ====================================
def test_a_durable_subscriber_killed_again_and_again_gets_every_queue_event_once_or_twice(
    open_state: Callable[..., reactor.State],
    db_path: Any,
    tmp_path: Path,
    spawned: list[subprocess.Popen[str]],
    request: pytest.FixtureRequest,
) -> None:
    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    why = f"seed {seed}"
    db = str(db_path)
    state = open_state()
    live: list[list[Any]] = []  # a plain subscriber of this process: the log, exactly
    state.subscribe(lambda event: live.append(_row(event)), scope="queue:*")
    notes = tmp_path / "worker.jsonl"
    seconds = 5.0 if backend(request.config) == "sqlite" else 4.0
    # The worker writes until the subscriber has had 4 lives, one of them killed in a
    # callback (the next began with its event again), and at least ``seconds``: on a
    # loaded machine, where a subscriber takes a second or more to start, 4 s of writes
    # saw fewer than 3 lives, or 6 with none killed in a callback (the campaign would
    # have tested too little, and said so).
    stop = tmp_path / "stop"
    worker = _start(spawned, WORKER, db, str(seed), "60", str(notes), str(stop))
    lives: list[Path] = []
    planned = time.monotonic() + seconds
    hard_stop = planned + 60
    while worker.poll() is None and time.monotonic() < hard_stop:
        if len(lives) >= 4 and time.monotonic() >= planned and _repeats(lives) >= 1:
            stop.touch()
        lives.append(tmp_path / f"life-{len(lives)}.jsonl")
        subscriber = _start(spawned, DURABLE, db, str(lives[-1]), "recorder")
        if rng.random() < 0.25:
            time.sleep(rng.uniform(0.05, 0.6))  # while it starts, or subscribes
        else:  # while it catches up with what came meanwhile, or later
            assert subscriber.stdout is not None
            subscriber.stdout.readline()
            time.sleep(rng.uniform(0.0, 0.5))
        _kill(subscriber)
    _finish(worker)
    kills = len(lives)
    assert kills >= 3, why
    _settle(state, db_path)
    events = state.changes(scope="queue:*")
    assert events, why
    final = events[-1].revision
    lives.append(tmp_path / f"life-{len(lives)}.jsonl")  # the last one sees it through
    last = _start(spawned, DURABLE, db, str(lives[-1]), "recorder")
    assert last.stdout is not None
    assert last.stdout.readline() == "subscribed\n", why
    eventually(
        lambda: state.stats()["durable_subscribers"]["recorder"]["position"] >= final,
        timeout=60,
    )
    eventually(lambda: bool(live) and live[-1][0] >= final, timeout=30)
    time.sleep(0.3)  # a repeat, or an event after the last, would arrive now
    _kill(last)

    log = {event.revision: _row(event) for event in events}
    order = [event.revision for event in events]
    assert live == [log[revision] for revision in order], f"{why}: the plain subscriber"
    merged: list[int] = []
    repeats = 0
    for n, life in enumerate(lives):
        rows = _lines(life)
        revisions = [row[0] for row in rows]
        assert all(row == log.get(row[0]) for row in rows), f"{why}: life {n} got {rows}"
        assert revisions == sorted(set(revisions)), f"{why}: life {n} out of order"
        if merged and revisions and revisions[0] == merged[-1]:
            revisions = revisions[1:]  # the event a kill interrupted, delivered again
            repeats += 1
        merged.extend(revisions)
    # Every event, in order, each once but for one repeat per kill at most: the last
    # event of a life, again at the start of the next one.
    assert merged == order, f"{why}: the durable subscriber's lives, merged"
    assert 1 <= repeats <= kills, f"{why}: no kill interrupted a callback (a missed family)"

    # What the worker saw commit is what the events say, op by op, job by job.
    done = _notes([notes])
    got = _transitions(events)
    takes, acks, nacks = _ops(done, "take"), _ops(done, "ack"), _ops(done, "nack")
    attempts = Counter((note[1], note[2], note[3]) for note in done if note[0] == "take")
    assert attempts == Counter(
        (*_job(event), event.new_value["attempts"]) for event in events if _kind(event) == "take"
    ), why
    assert got.get("take", Counter()) == takes, why
    assert got.get("ack", Counter()) == acks, f"{why}: an ack event for an ack refused?"
    assert got.get("nack", Counter()) == nacks, why
    assert got.get("extend", Counter()) == _ops(done, "extend"), why
    # Every lease ends once: acked, nacked, or run out (and turned back, by a sweeper
    # or a take) with exactly one event.
    assert got.get("expiry", Counter()) == takes - acks - nacks, why
    late = [note for note in done if note[0].startswith("late-")]
    assert late, f"{why}: no lease was left to run out"
    assert not [note for note in late if note[3]], f"{why}: a lost lease was acknowledged"
    retried = sum(note[2] for note in done if note[0] == "retry")
    assert sum(got.get("retry", Counter()).values()) == retried, why
    put_ids = {(note[1], note[2]) for note in done if note[0] == "put"}
    created = set(got["put"])
    assert put_ids <= created, why
    enqueued = sum(1 for note in done if note[0] == "enqueue")
    assert len(created) == len(put_ids) + enqueued, f"{why}: puts and enqueues vs created"
    assert _outbox_checks(state, events) == enqueued, why
    assert any(note[0] == "enqueue-raised" for note in done), why
    _check_jobs_match_events(state, db_path)
    print(
        f"seed {seed}: {len(order)} queue events; {kills} kills of the durable subscriber, "
        f"{repeats} events delivered twice; {dict(Counter(_kind(e) for e in events))}"
    )


# == 2. the events are the jobs =========================================================
def test_the_events_describe_the_jobs_table_when_workers_die_mid_operation(
    open_state: Callable[..., reactor.State],
    db_path: Any,
    tmp_path: Path,
    spawned: list[subprocess.Popen[str]],
    request: pytest.FixtureRequest,
) -> None:
    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    why = f"seed {seed}"
    db = str(db_path)
    state = open_state()
    live: list[list[Any]] = []
    state.subscribe(lambda event: live.append(_row(event)), scope="queue:*")
    seconds = 4.0 if backend(request.config) == "sqlite" else 3.0
    end = time.monotonic() + seconds
    notes = [tmp_path / f"worker-{n}.jsonl" for n in range(2)]
    runs = 0

    def start(n: int) -> subprocess.Popen[str]:
        nonlocal runs
        runs += 1
        left = max(0.5, end - time.monotonic())
        return _start(spawned, WORKER, db, str(seed * 100 + runs), str(left), str(notes[n]))

    workers = [start(0), start(1)]
    kills = 0
    while time.monotonic() < end - 1.0:
        time.sleep(rng.uniform(0.4, 1.0))  # after the ~0.5 s a worker takes to start
        n = rng.randrange(2)
        _kill(workers[n])  # in the middle of whatever it was doing
        kills += 1
        workers[n] = start(n)
    for worker in workers:
        _finish(worker)
    assert kills >= 2, why
    _settle(state, db_path)
    jobs = _check_jobs_match_events(state, db_path)
    events = state.changes(scope="queue:*")
    final = events[-1].revision
    eventually(lambda: bool(live) and live[-1][0] >= final, timeout=30)
    time.sleep(0.3)
    assert live == [_row(event) for event in events], f"{why}: the plain subscriber"

    # A killed worker's last op may have committed unseen: one event more per kill, at
    # most, of each kind a worker notes.
    done = _notes(notes)
    got = _transitions(events)
    unseen = 0
    for verb in ("take", "ack", "nack", "extend"):
        mine = _ops(done, verb)
        found = got.get(verb, Counter())
        assert not mine - found, f"{why}: {verb}s that committed with no event: {mine - found}"
        unseen += sum((found - mine).values())
    put_ids = {(note[1], note[2]) for note in done if note[0] == "put"}
    assert put_ids <= set(got["put"]), why
    enqueued = sum(1 for note in done if note[0] == "enqueue")
    outbox = _outbox_checks(state, events)
    assert enqueued <= outbox
    unseen += len(got["put"]) - len(put_ids) - enqueued
    assert unseen <= kills, f"{why}: {unseen} events no worker saw, for {kills} kills"
    assert not [note for note in done if note[0].startswith("late-") and note[3]], why
    print(
        f"seed {seed}: {len(events)} queue events, {len(jobs)} jobs left; {kills} workers "
        f"killed, {unseen} ops committed unseen; {dict(Counter(_kind(e) for e in events))}"
    )


# == 3. no event for what did not commit ================================================
def _revision(state: reactor.State) -> int:
    return int(state.stats()["revision"])


class _Quiet:
    """A block in which nothing is written to any queue; if it must raise ``raises``
    (which it then swallows), nothing is written at all, unless ``others`` (another
    process) may write meanwhile."""

    def __init__(
        self, state: reactor.State, what: str, raises: type[Exception] | None, *, others: bool
    ) -> None:
        self.state, self.what, self.raises, self.others = state, what, raises, others
        self.before = 0

    def __enter__(self) -> None:
        self.before = _revision(self.state)

    def __exit__(self, kind: type[BaseException] | None, exc: object, tb: object) -> bool:
        if self.raises is None:
            assert kind is None, (self.what, exc)
        else:
            assert kind is not None, f"{self.what}: did not raise"
            assert issubclass(kind, self.raises), (self.what, exc)
            if not self.others:
                assert self.state.changes(since=self.before) == [], self.what
        assert self.state.changes(since=self.before, scope="queue:*") == [], self.what
        return kind is not None


def test_an_operation_that_does_not_commit_publishes_nothing(
    state: reactor.State, clock: ManualClock, db_path: Any
) -> None:
    live: list[list[Any]] = []
    durable: list[list[Any]] = []
    state.subscribe(lambda event: live.append(_row(event)), scope="queue:*")
    state.subscribe(
        lambda event: durable.append(_row(event)), scope="queue:*", durable="audit", since=0
    )
    orders = state.scope("orders")
    queue = state.queue("jobs", max_attempts=2)
    expected: list[tuple[str, str, str | None]] = []  # the log of queue "jobs": key, type, state

    def quiet(what: str, raises: type[Exception] | None = None, *, others: bool = False) -> _Quiet:
        return _Quiet(state, what, raises, others=others)

    def happened(*changes: tuple[str, str, str | None]) -> None:
        expected.extend(changes)
        found = [
            (event.key, event.type, event.new_value and event.new_value["state"])
            for event in state.changes(scope="queue:jobs")
        ]
        assert found == expected

    # An enqueue in a body that raises, over one scope or several, or that conflicts.
    with quiet("a body raising", RuntimeError), orders.transaction() as tx:
        tx.set("o-1", {"paid": True})
        tx.enqueue("outbox", {"order": "o-1"})
        raise RuntimeError("payment failed")
    with (
        quiet("a body over two scopes raising", RuntimeError),
        state.transaction("ledger", "orders") as multi,
    ):
        multi["ledger"].increment("revenue", 80)
        multi.enqueue("outbox", {"order": "o-1"})
        multi.enqueue("jobs", {"order": "o-1"})
        raise RuntimeError("payment failed")
    with (
        quiet("a body's failed if_revision", reactor.ConflictError),
        orders.transaction() as tx,
    ):
        tx.enqueue("outbox", {"order": "o-1"})
        tx.set("o-1", {"paid": True}, if_revision=12345)
    with quiet("a bad item", reactor.InvalidValueError), orders.transaction() as tx:
        tx.enqueue("outbox", {"order": "o-1"})
        tx.enqueue("outbox", {"total": float("nan")})
    with (
        quiet("a commit in conflict with another process", reactor.ConflictError, others=True),
        orders.transaction() as tx,
    ):
        tx.enqueue("outbox", {"order": "o-2"})
        _in_other_process(db_path, 'state.scope("orders").set("o-2", "elsewhere")')
    assert orders.get("o-2") == "elsewhere"  # that one committed, and the enqueue not
    assert "outbox" not in state.queues()  # no queue: it never had a job
    with quiet("a bad put", reactor.InvalidValueError):
        queue.put({"total": float("inf")})

    # Control: a body that catches its failed write commits the rest, its job included.
    with orders.transaction() as tx:
        tx.enqueue("jobs", {"order": "o-3"})
        with pytest.raises(reactor.ConflictError):
            tx.set("o-3", 1, if_revision=12345)
    happened(("1", "created", "ready"))

    # A put with the key of a live job (ready, taken, dead), in a transaction too.
    first = queue.put("once", key="invoice")
    happened((str(first), "created", "ready"))
    with quiet("a put of a held key (ready)"):
        assert queue.put("twice", key="invoice") == first
    with quiet("an enqueue of a held key"), orders.transaction() as tx:
        tx.set("o-4", 1)
        tx.enqueue("jobs", "twice", key="invoice")
    assert orders.get("o-4") == 1
    with orders.transaction() as tx:  # two enqueues of one new key: one job
        tx.enqueue("jobs", "new", key="receipt")
        tx.enqueue("jobs", "again", key="receipt")
    happened((str(first + 1), "created", "ready"))
    job = queue.take(timeout=0, lease=30)
    assert job is not None
    assert job.id == 1  # FIFO: the control's job
    job.ack()
    happened(("1", "updated", "taken"), ("1", "deleted", None))
    job = queue.take(timeout=0, lease=30)
    assert job is not None
    assert job.id == first
    happened((str(first), "updated", "taken"))
    with quiet("a put of a held key (taken)"):
        assert queue.put("twice", key="invoice") == first

    # A bad argument, a second ack, nack or extend, a dead job's.
    with quiet("a nack with a bad delay", reactor.InvalidArgumentError):
        job.nack(delay=-1)
    with quiet("an extend by 0 s", reactor.InvalidArgumentError):
        job.extend(0)
    clock.advance(0.1)  # ready again later than the receipt: behind it in line
    job.nack()
    happened((str(first), "updated", "ready"))
    for verb in ("ack", "nack", "extend"):
        with quiet(f"a {verb} after a nack", reactor.LockNotOwnedError):
            getattr(job, verb)()
    job = queue.take(timeout=0, lease=30)
    assert job is not None
    assert (job.id, job.attempts) == (first + 1, 1)  # the receipt
    job.ack()
    happened((str(first + 1), "updated", "taken"), (str(first + 1), "deleted", None))
    with quiet("a second ack", reactor.LockNotOwnedError):
        job.ack()
    job = queue.take(timeout=0, lease=30)
    assert job is not None
    assert (job.id, job.attempts) == (first, 2)
    job.nack()  # its second take of two: dead
    happened((str(first), "updated", "taken"), (str(first), "updated", "dead"))
    with quiet("a put of a held key (dead)"):
        assert queue.put("twice", key="invoice") == first
    for verb in ("ack", "nack", "extend"):
        with quiet(f"a dead job's {verb}", reactor.LockNotOwnedError):
            getattr(queue.dead()[0], verb)()
    assert queue.retry_dead() == 1
    happened((str(first), "updated", "ready"))
    with quiet("a retry of no dead job"):
        assert queue.retry_dead() == 0
    job = queue.take(timeout=0, lease=30)
    assert job is not None
    assert (job.id, job.attempts) == (first, 1)
    job.ack()
    happened((str(first), "updated", "taken"), (str(first), "deleted", None))
    fresh = queue.put("receipt again", key="receipt")
    assert fresh == first + 2  # its key was freed by the ack: a new job
    happened((str(fresh), "created", "ready"))

    # A lease run out: the sweeper's one event, then nothing for the lost lease.
    lost = queue.take(timeout=0, lease=0.5)
    assert lost is not None
    assert lost.id == fresh
    happened((str(fresh), "updated", "taken"))
    clock.advance(1.0)
    eventually(lambda: len(state.changes(scope="queue:jobs")) == len(expected) + 1)
    happened((str(fresh), "updated", "ready"))  # by the sweeper
    for verb in ("ack", "nack", "extend"):
        with quiet(f"a {verb} of a lost lease", reactor.LockNotOwnedError):
            getattr(lost, verb)()
    again = queue.take(timeout=0, lease=30)
    assert again is not None
    assert (again.id, again.attempts) == (fresh, 2)
    happened((str(fresh), "updated", "taken"))
    with quiet("an ack of a lease someone else holds now", reactor.LockNotOwnedError):
        lost.ack()
    again.ack()
    happened((str(fresh), "deleted", None))

    # Nothing to take.
    with quiet("a take of nothing"):
        assert queue.take(timeout=0) is None
    with quiet("a take that times out"):
        assert queue.take(timeout=0.2) is None

    # The subscribers got exactly the log: nothing that did not commit.
    sentinel = queue.put("sentinel")
    happened((str(sentinel), "created", "ready"))
    log = [_row(event) for event in state.changes(scope="queue:*")]
    eventually(lambda: live == log and durable == log, timeout=10)
    time.sleep(0.2)  # an extra event, if any, would arrive now
    assert live == log
    assert durable == log


# == 3b. the events of a transaction, in the order of its body =========================
def test_a_transactions_enqueues_publish_in_the_order_of_its_body(state: reactor.State) -> None:
    seen: list[tuple[str, str]] = []
    state.subscribe(lambda event: seen.append((event.scope, event.key)))
    with state.transaction("ledger", "orders") as tx:
        tx.enqueue("emails", {"receipt": "o-1"})
        tx["orders"].set("o-1", {"paid": True})
        tx.enqueue("emails", {"receipt": "o-1", "copy": True})
        tx["ledger"].increment("revenue", 80)
    body = [("queue:emails", "1"), ("orders", "o-1"), ("queue:emails", "2"), ("ledger", "revenue")]
    eventually(lambda: len(seen) == 4)
    log = [(event.scope, event.key) for event in state.changes()]
    assert (log, seen) == (body, body)
    # Enqueues in a row, between writes of one key; each row at its change's revision.
    with state.transaction("orders") as tx:
        tx["orders"].set("o-2", 1)
        tx.enqueue("emails", 3)
        tx.enqueue("sms", 4)
        tx.enqueue("emails", 5)
        tx["orders"].set("o-2", 2)
        tx["orders"].set("o-3", 3)
    changes = state.changes(since=4)
    assert [(event.scope, event.key) for event in changes] == [
        ("orders", "o-2"),
        ("queue:emails", "3"),
        ("queue:sms", "1"),
        ("queue:emails", "4"),
        ("orders", "o-2"),
        ("orders", "o-3"),
    ]
    orders = state.scope("orders")
    for key, revision in (("o-1", 2), ("o-2", changes[4].revision), ("o-3", changes[5].revision)):
        entry = orders.entry(key)
        assert entry is not None
        assert entry.revision == revision, key
    created = orders.entry("o-2")
    assert created is not None
    assert created.created_revision == changes[0].revision
    assert state.scope("ledger").entry("revenue").revision == 4  # type: ignore[union-attr]


# == 4. a worker killed with its jobs ===================================================
def test_the_leases_of_a_killed_worker_run_out_with_one_event_each(
    db_path: Any, tmp_path: Path, spawned: list[subprocess.Popen[str]]
) -> None:
    seed = random.randrange(1_000_000)
    why = f"seed {seed}"
    db = str(db_path)
    with reactor.open(db_path) as state:
        for n in range(3):
            state.queue("w").put({"n": n})
        state.queue("d", max_attempts=1).put({"n": "last chance"})
    # This process keeps no engine open meanwhile: the sweepers are the watchers'.
    stop = tmp_path / "stop"
    outputs = [tmp_path / "plain.jsonl", tmp_path / "durable.jsonl"]
    watchers = [
        _start(spawned, WATCHER, db, str(out), name, str(stop))
        for out, name in zip(outputs, ("", "watcher"), strict=True)
    ]
    for watcher in watchers:
        assert watcher.stdout is not None
        assert watcher.stdout.readline() == "subscribed\n", why
    holder = _start(spawned, HOLDER, db)
    assert holder.stdout is not None
    held = holder.stdout.readline().split()
    assert sorted(held) == ["d:1", "w:1", "w:2", "w:3"], holder.stderr and holder.stderr.read()
    for _ in range(random.Random(seed).randrange(6)):
        assert holder.stdout.readline() == "extended\n", why
    _kill(holder)  # maybe in the middle of an extend
    eventually(
        lambda: (
            raw_query(db_path, "SELECT COUNT(*) FROM reactor_jobs WHERE state = 'taken'") == [(0,)]
        ),
        timeout=10,
    )
    time.sleep(0.8)  # three more sweeps by each watcher: a second expiry would come now
    stop.touch()
    for watcher in watchers:
        _finish(watcher, timeout=30)

    with reactor.open(db_path) as state:
        events = state.changes(scope="queue:*")
        assert state.queue("w").stats() == {
            "ready": 3,
            "delayed": 0,
            "taken": 0,
            "dead": 0,
            "taken_by_group": {},
            "rate_window": 0,
        }
        assert [(job.id, job.attempts) for job in state.queue("d").dead()] == [(1, 1)]
    log = [_row(event) for event in events]
    for out in outputs:
        assert _lines(out) == log, f"{why}: {out.name} is not the log, each event once"
    lateness = []
    for name in held:
        queue, job_id = name.split(":")
        history = [event for event in events if _job(event) == (queue, int(job_id))]
        kinds = [_kind(event) for event in history]
        extends = len(kinds) - 3
        assert kinds == ["put", "take", *["extend"] * extends, "expiry"], f"{why}: {name}"
        turned, before = history[-1], history[-2]
        assert turned.new_value == {
            **before.new_value,
            "state": "dead" if queue == "d" else "ready",
            "error": "the lease ran out (the worker did not ack, nack or extend in time)",
        }, f"{why}: {name}: the expiry keeps the end of the last lease committed"
        lateness.append(turned.timestamp.timestamp() - before.new_value["ready_at"])
    # The sweeper looks every 0.25 s: an expiry is due within a second (generous here).
    assert all(0 <= late < 1.5 for late in lateness), f"{why}: {lateness}"
    print(f"expired {max(lateness):.2f} s after the lease at most; seed {seed}")
