"""Campaigns for work queues (SPEC §13, Queues): processes sharing queues, a worker
killed with its job, sweepers racing, and a queue of 100,000 jobs.

Each runs in well under 30 s on SQLite and on PostgreSQL (``--backend=postgresql``).
Workers are subprocesses; every wait has a timeout.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import reactor
from tests.conftest import backend, raw_query
from tests.conftest import wait_for as eventually


def _python(code: str, *args: str, stdin: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str], timeout: float = 120) -> str:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return out


WORKER = """
import json, sys, reactor

with reactor.open(sys.argv[1]) as state:
    queue = state.queue("work")
    done = []
    print("ready", flush=True)
    sys.stdin.readline()  # every worker starts at once: none finishes before another opens
    while (job := queue.take(timeout=3, lease=60)) is not None:
        if job.item % 11 == 0 and job.attempts == 1:
            job.nack()  # a failure: taken again, by whoever comes first
            continue
        job.ack()
        done.append(job.item)
    print(json.dumps(done))
"""


def test_four_processes_do_every_job_exactly_once(
    open_state: Callable[..., reactor.State], db_path: Any, request: pytest.FixtureRequest
) -> None:
    # PostgreSQL: a take and an ack are two commits of a few milliseconds each, in turn
    # on the queue's lock.
    count = 1000 if backend(request.config) == "sqlite" else 500
    state = open_state()
    with state.scope("load").transaction() as tx:
        for n in range(count):
            tx.enqueue("work", n)
    started = time.monotonic()
    workers = [_python(WORKER, str(db_path), stdin=True) for _ in range(4)]
    for worker in workers:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "ready", _finish(worker)
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
    done: Counter[int] = Counter()
    shares = []
    for worker in workers:
        share = json.loads(_finish(worker))
        shares.append(len(share))
        done.update(share)
    assert sorted(done) == list(range(count))  # none lost
    assert set(done.values()) == {1}  # none done twice
    assert sum(1 for share in shares if share) >= 2  # the work was shared
    assert state.queue("work").stats() == {
        "ready": 0,
        "delayed": 0,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    events = state.changes(scope="queue:work")
    deleted = Counter(event.key for event in events if event.type == "deleted")
    assert len(deleted) == count
    assert set(deleted.values()) == {1}
    retried = [e for e in events if e.type == "updated" and e.new_value["state"] == "ready"]
    assert len(retried) == len(range(0, count, 11))
    assert time.monotonic() - started < 120


TAKER = """
import sys, time, reactor

with reactor.open(sys.argv[1]) as state:
    job = state.queue("work").take(timeout=30, lease=float(sys.argv[2]))
    print(job.id, job.attempts, flush=True)
    time.sleep(120)  # killed before it acks
"""


def test_a_killed_workers_job_is_taken_again(
    open_state: Callable[..., reactor.State], db_path: Any
) -> None:
    state = open_state()
    queue = state.queue("work")
    job_id = queue.put({"task": "resize"})
    worker = _python(TAKER, str(db_path), "2")
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        assert line.split() == [str(job_id), "1"], worker.stderr and worker.stderr.read()
        taken_at = time.monotonic()
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.communicate(timeout=30)
    assert queue.stats()["taken"] == 1  # until its lease runs out
    job = queue.take(timeout=30)
    assert job is not None
    assert (job.id, job.item, job.attempts) == (job_id, {"task": "resize"}, 2)
    assert 1.0 <= time.monotonic() - taken_at < 25  # after the lease, and soon after
    job.ack()
    assert queue.stats() == {
        "ready": 0,
        "delayed": 0,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }


KEYED = """
import json, sys, reactor

with reactor.open(sys.argv[1]) as state:
    queue = state.queue("work")
    print(json.dumps([queue.put(sys.argv[2], key=f"k{n}") for n in range(150)]))
"""


def test_processes_racing_with_the_same_keys_make_one_job_per_key(
    open_state: Callable[..., reactor.State], db_path: Any
) -> None:
    state = open_state()
    putters = [_python(KEYED, str(db_path), f"from {n}") for n in range(4)]
    results = [json.loads(_finish(putter)) for putter in putters]
    assert all(sorted(ids) == sorted(results[0]) for ids in results)  # every put, its job
    assert sorted(results[0]) == list(range(1, 151))
    for ids in results:
        assert ids == results[0]  # key n has one id, whoever put it
    assert state.queue("work").stats()["ready"] == 150
    rows = raw_query(db_path, "SELECT COUNT(*), COUNT(DISTINCT key) FROM reactor_jobs")
    assert rows == [(150, 150)]


IDLE = """
import sys, time, reactor

with reactor.open(sys.argv[1]) as state:
    print("open", flush=True)
    time.sleep(float(sys.argv[2]))  # its sweeper runs meanwhile
"""


def test_sweepers_of_several_processes_turn_each_lease_back_once(
    open_state: Callable[..., reactor.State], db_path: Any
) -> None:
    state = open_state()
    work = state.queue("work", max_attempts=1)
    again = state.queue("again", max_attempts=1000)
    for n in range(300):
        work.put(n)
        again.put(n)
    sweepers = [_python(IDLE, str(db_path), "4") for _ in range(3)]
    for sweeper in sweepers:
        assert sweeper.stdout is not None
        assert sweeper.stdout.readline() == "open\n"
    for _ in range(150):
        assert work.take(timeout=0, lease=0.5) is not None  # attempts 1 of 1: dead then
        # A slow machine may take one again once its lease ran out: that is two turns.
        assert again.take(timeout=0, lease=0.5) is not None
    eventually(lambda: work.stats()["dead"] == 150, timeout=30)
    eventually(lambda: again.stats()["taken"] == 0, timeout=30)
    eventually(lambda: _turns(state, "work") == 150 and _turns(state, "again") >= 150, timeout=30)
    for sweeper in sweepers:
        _finish(sweeper)
    for name, back in (("work", "dead"), ("again", "ready")):
        for key, states in _histories(state, name).items():
            # Each take turned back once, whoever swept: taken, then back, in turn.
            assert states[0] == "ready", (name, key)
            turns = states[1:]
            assert turns == ["taken", back] * (len(turns) // 2), (name, key, states)
    assert work.stats() == {
        "ready": 150,
        "delayed": 0,
        "taken": 0,
        "dead": 150,
        "taken_by_group": {},
        "rate_window": 0,
    }
    assert again.stats() == {
        "ready": 300,
        "delayed": 0,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }


def _histories(state: reactor.State, name: str) -> dict[str, list[str]]:
    """The states each job of queue ``name`` went through, in order."""
    found: dict[str, list[str]] = {}
    for event in state.changes(scope=f"queue:{name}"):
        found.setdefault(event.key, []).append(event.new_value["state"])
    return found


def _turns(state: reactor.State, name: str) -> int:
    """How many leases of queue ``name`` have been turned back."""
    return sum(
        1
        for event in state.changes(scope=f"queue:{name}")
        if event.type == "updated" and event.old_value["state"] == "taken"
    )


# -- scale -----------------------------------------------------------------------------
def _median_take(queue: reactor.Queue) -> float:
    times = []
    for _ in range(15):
        started = time.perf_counter()
        job = queue.take(timeout=0)
        times.append(time.perf_counter() - started)
        assert job is not None
        job.nack()
    return sorted(times)[len(times) // 2]
