"""Work queues (SPEC §13, Queues): leases, retries, dead letters, the outbox, waiting
takes; sync and asyncio.

Leases run out on the manual clock (``clock.advance``), and ``run_upkeep`` turns them
back at once, as the sweeper would. Every wait has a timeout; timings asserted
are loose (seconds), orders exact. The campaigns across processes, and the scale of a
queue of 100,000 jobs, are in ``test_campaign_queues.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import queue as queues
import resource
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from unittest.mock import ANY

import pytest

import reactor
import reactor.aio
from reactor.testing import ManualClock, run_upkeep
from tests.conftest import CLI_ON_SQLITE, engine_of, raw_postgres, raw_query, take_lines, waiters
from tests.conftest import wait_for as eventually

PATIENCE = 30.0  # seconds: the timeout of waits that must succeed long before
COUNTING = threading.Lock()  # for counters that takers' threads add to


# -- helpers ---------------------------------------------------------------------------
def waiting(engine: Any, name: str = "q") -> int:
    """How many takes wait in the line of queue ``name``."""
    scope = f"queue:{name}"
    return sum(len(line) for line in take_lines(engine) if line.scope == scope)


def receivers(engine: Any) -> set[Any]:
    return set(engine.hub.listeners())


def assert_clean(engine: Any, before: set[Any]) -> None:
    """No take left waiting: every line is empty and out of the hub."""
    assert receivers(engine) == before
    assert take_lines(engine) == []


def queue_events(state: reactor.State, name: str = "q") -> list[tuple[str, str, Any]]:
    """(key, type, state after) of every recorded change of queue ``name``."""
    return [
        (event.key, event.type, None if event.new_value is None else event.new_value["state"])
        for event in state.changes(scope=f"queue:{name}")
    ]


def waiting_for(engine: Any) -> int:
    """How many ``wait_for`` calls wait on the engine's changes."""
    return len(waiters(engine))


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Background:
    """``call()`` in a thread; ``result()`` returns what it returned or raises what it
    raised, within a timeout."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._done: queues.Queue[tuple[bool, Any]] = queues.Queue()
        self.finished_at = 0.0

        def run() -> None:
            try:
                outcome = (True, call())
            except BaseException as exc:  # handed to the test
                outcome = (False, exc)
            self.finished_at = time.monotonic()
            self._done.put(outcome)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self, timeout: float = PATIENCE) -> Any:
        ok, value = self._done.get(timeout=timeout)
        self.thread.join(timeout)
        if not ok:
            raise value
        return value

    def running(self) -> bool:
        return self._done.empty()


@pytest.fixture
def engine(state: reactor.State) -> Any:
    return engine_of(state)


@pytest.fixture
def q(state: reactor.State) -> reactor.Queue:
    return state.queue("q")


def take_now(q: reactor.Queue, lease: float = 30) -> reactor.Job:
    job = q.take(timeout=0, lease=lease)
    assert job is not None
    return job


# -- putting and taking ----------------------------------------------------------------
def test_put_take_ack(state: reactor.State, q: reactor.Queue) -> None:
    item = {"to": "ada@example.com", "tags": ["a"]}
    assert q.put(item) == 1
    item["tags"].append("changed after the put")
    assert q.put("second") == 2
    assert q.stats() == {
        "ready": 2,
        "delayed": 0,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    job = take_now(q)
    assert (job.id, job.item, job.attempts, job.queue) == (
        1,
        {"to": "ada@example.com", "tags": ["a"]},
        1,
        "q",
    )
    assert repr(job) == "Job(id=1, item={'to': 'ada@example.com', 'tags': ['a']}, attempts=1)"
    assert q.stats() == {
        "ready": 1,
        "delayed": 0,
        "taken": 1,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    job.ack()
    assert q.stats() == {
        "ready": 1,
        "delayed": 0,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    assert take_now(q).item == "second"
    assert q.take(timeout=0) is None
    assert repr(q) == "<reactor.Queue 'q'>"
    assert q.name == "q"


def test_ids_are_per_queue_and_never_reused(state: reactor.State) -> None:
    emails, sms = state.queue("emails"), state.queue("sms")
    assert [emails.put(i) for i in range(3)] == [1, 2, 3]
    assert sms.put("x") == 1
    for _ in range(3):
        take_now(emails).ack()
    assert emails.put("after") == 4  # the queue is empty, its ids go on
    assert state.queue("emails").put("again") == 5  # another handle, the same counter
    assert state.queues() == ["emails", "sms"]


def test_queues_are_the_queues_written_sorted(state: reactor.State) -> None:
    assert state.queues() == []
    state.queue("unused")  # a handle writes nothing
    assert state.queue("unused").take(timeout=0) is None  # nor a take that finds no job
    assert state.queues() == []
    names = ["sms", "emails", "Zebra", "é-mails", "a b", "queue:x", "emails-2"]
    for name in names:
        state.queue(name).put(1)
    assert state.queues() == sorted(names)  # by code point, on both backends
    take_now(state.queue("sms")).ack()
    assert "sms" in state.queues()  # empty, it is still a queue
    with state.scope("orders").transaction() as tx:
        tx.enqueue("outbox", 1)
        assert "outbox" not in state.queues()  # not before the commit
    assert state.queues() == sorted([*names, "outbox"])
    state.close()
    with pytest.raises(reactor.ClosedError):
        state.queues()


def test_items_are_json_values_checked_before_anything_is_written(
    state: reactor.State, q: reactor.Queue
) -> None:
    for bad in (float("nan"), {1: "a"}, (1, 2), b"x", object()):
        with pytest.raises(reactor.InvalidValueError):
            q.put(bad)
    with reactor.open(":memory:", max_value_bytes=10) as small:
        with pytest.raises(reactor.InvalidValueError):
            small.queue("small").put("x" * 100)
        with pytest.raises(reactor.InvalidValueError), small.scope("s").transaction() as tx:
            tx.enqueue("small", "x" * 100)
        assert small.queue("small").stats()["ready"] == 0
    for value in (None, 0, 1.5, True, "", [], {"nested": [{"a": None}]}):
        q.put(value)
    taken = [take_now(q).item for _ in range(7)]
    assert taken == [None, 0, 1.5, True, "", [], {"nested": [{"a": None}]}]
    assert queue_events(state)[:1] == [("1", "created", "ready")]


def test_bad_arguments_are_refused(state: reactor.State, q: reactor.Queue) -> None:
    for name in ("", 1, None, "x" * 1019):
        with pytest.raises(reactor.InvalidKeyError):
            state.queue(name)  # type: ignore[arg-type]
    assert state.queue("x" * 1018).put(1) == 1
    for attempts in (0, -1, 1.5, True, "3"):
        with pytest.raises(reactor.InvalidArgumentError):
            state.queue("q", max_attempts=attempts)  # type: ignore[arg-type]
    for delay in (-1, float("nan"), float("inf"), "1", True):
        with pytest.raises(reactor.InvalidArgumentError):
            q.put(1, delay=delay)  # type: ignore[arg-type]
    with pytest.raises(reactor.InvalidKeyError):
        q.put(1, key="")
    with pytest.raises(reactor.InvalidKeyError):
        q.put(1, key=7)  # type: ignore[arg-type]
    for lease in (0, -1, float("inf"), None, "30"):
        with pytest.raises(reactor.InvalidArgumentError):
            q.take(timeout=0, lease=lease)  # type: ignore[arg-type]
    for timeout in (-1, "1", True, float("nan")):
        with pytest.raises(reactor.InvalidArgumentError):
            q.take(timeout=timeout)  # type: ignore[arg-type]
    with pytest.raises(reactor.InvalidArgumentError):
        q.dead(limit=-1)
    assert q.stats() == {
        "ready": 0,
        "delayed": 0,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    q.put("ok")
    job = take_now(q)
    for seconds in (0, -5, float("nan"), "1"):
        with pytest.raises(reactor.InvalidArgumentError):
            job.extend(seconds)  # type: ignore[arg-type]
    with pytest.raises(reactor.InvalidArgumentError):
        job.nack(delay=-1)
    job.ack()


# -- order -----------------------------------------------------------------------------
def test_jobs_are_taken_in_the_order_they_became_ready(
    state: reactor.State, q: reactor.Queue, clock: ManualClock
) -> None:
    q.put("a")
    q.put("late", delay=10)
    clock.advance(1)
    q.put("b")
    q.put("soon", delay=2)
    q.put("zero delay", delay=0)
    assert q.stats() == {
        "ready": 3,
        "delayed": 2,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    assert [take_now(q).item for _ in range(3)] == ["a", "b", "zero delay"]
    assert q.take(timeout=0) is None
    clock.advance(2)  # "soon" is due (t=3); "late" at t=10
    assert take_now(q).item == "soon"
    clock.advance(7)
    assert take_now(q).item == "late"


def test_a_nack_puts_the_job_back_in_line_from_then(
    state: reactor.State, q: reactor.Queue, clock: ManualClock
) -> None:
    for item in ("a", "b", "c"):
        q.put(item)
        clock.advance(1)
    first = take_now(q)
    first.nack()  # ready now: behind b and c, which became ready before
    assert [job.item for job in (take_now(q), take_now(q), take_now(q))] == ["b", "c", "a"]
    q.put("d")
    q.put("e")
    job = take_now(q)
    job.nack(delay=5)
    assert q.stats()["delayed"] == 1
    clock.advance(1)
    q.put("f")
    assert take_now(q).item == "e"
    assert take_now(q).item == "f"
    assert q.take(timeout=0) is None
    clock.advance(4)
    again = take_now(q)
    assert (again.item, again.attempts) == ("d", 2)


# -- idempotency keys --------------------------------------------------------------------
def test_a_key_held_by_a_job_returns_that_job(state: reactor.State, clock: ManualClock) -> None:
    q = state.queue("q", max_attempts=1)
    assert q.put("first", key="k") == 1
    assert q.put("second", key="k") == 1  # ready: the same job
    assert q.put("other", key="other") == 2
    assert state.queue("p").put("x", key="k") == 1  # keys are per queue
    job = take_now(q)
    assert q.put("third", key="k") == 1  # taken: still the same job
    job.nack()  # max_attempts=1: dead
    assert q.stats()["dead"] == 1
    assert q.put("fourth", key="k") == 1  # dead: it keeps its key
    assert q.retry_dead() == 1
    job = take_now(q)
    assert job.item == "first"
    job.ack()  # gone: the key is free
    assert q.put("fifth", key="k") == 3
    assert take_now(q).item == "other"
    assert take_now(q).item == "fifth"
    created = [event for event in queue_events(state) if event[1] == "created"]
    assert created == [
        ("1", "created", "ready"),
        ("2", "created", "ready"),
        ("3", "created", "ready"),
    ]


def test_threads_putting_one_key_make_one_job(state: reactor.State, q: reactor.Queue) -> None:
    barrier = threading.Barrier(8)

    def put(i: int) -> int:
        barrier.wait(PATIENCE)
        return q.put({"from": i}, key="once")

    ids = [Background(lambda i=i: put(i)) for i in range(8)]  # type: ignore[misc]
    assert {job.result() for job in ids} == {1}
    assert q.stats()["ready"] == 1


# -- one taker at a time ---------------------------------------------------------------
def test_eight_threads_take_every_job_once(state: reactor.State, q: reactor.Queue) -> None:
    count = 400
    for i in range(count):
        q.put(i)
    taken: list[int] = []
    lock = threading.Lock()

    def work() -> int:
        mine = 0
        while (job := q.take(timeout=0.5)) is not None:
            with lock:
                taken.append(job.item)
            job.ack()
            mine += 1
        return mine

    workers = [Background(work) for _ in range(8)]
    assert sum(worker.result() for worker in workers) == count
    assert sorted(taken) == list(range(count))
    assert q.stats() == {
        "ready": 0,
        "delayed": 0,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }


# -- leases ----------------------------------------------------------------------------
def test_a_lease_that_runs_out_makes_the_job_ready_again(
    state: reactor.State, engine: Any, q: reactor.Queue, clock: ManualClock
) -> None:
    q.put("work")
    lost = take_now(q, lease=10)
    clock.advance(9.5)
    assert run_upkeep(state).leases_turned_back == 0  # not yet
    assert q.take(timeout=0) is None
    clock.advance(1)
    assert q.stats() == {
        "ready": 1,
        "delayed": 0,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }  # counted at once
    assert run_upkeep(state).leases_turned_back == 1
    assert run_upkeep(state).leases_turned_back == 0  # once
    again = take_now(q, lease=10)
    assert (again.id, again.item, again.attempts) == (lost.id, "work", 2)
    revision = state.stats()["revision"]
    for verb in (lost.ack, lost.nack, lost.extend):
        with pytest.raises(reactor.LockNotOwnedError, match="not held by this taker"):
            verb()
    assert state.stats()["revision"] == revision  # nothing changed
    assert q.stats() == {
        "ready": 0,
        "delayed": 0,
        "taken": 1,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    again.ack()
    assert queue_events(state) == [
        ("1", "created", "ready"),
        ("1", "updated", "taken"),
        ("1", "updated", "ready"),
        ("1", "updated", "taken"),
        ("1", "deleted", None),
    ]


def test_a_take_turns_back_a_lease_run_out_itself(
    state: reactor.State, q: reactor.Queue, clock: ManualClock
) -> None:
    q.put("work")
    take_now(q, lease=5)
    clock.advance(6)
    job = take_now(q)  # no sweep needed
    assert job.attempts == 2


def test_leases_run_out_take_their_place_in_line_among_ready_jobs(
    state: reactor.State, clock: ManualClock
) -> None:
    """A take reads the leases run out and the first ready job together: a job turned
    back is in line from when its lease ran out, and one that goes dead is skipped."""
    q = state.queue("line", max_attempts=2)
    q.put("early")  # t=0
    q.put("doomed")
    assert take_now(q, lease=2).item == "early"  # its lease ends at t=2
    doomed = take_now(q, lease=5)
    clock.advance(1)
    doomed.nack()  # ready again at t=1 (attempt 1 of 2)
    q.put("before")  # t=1
    assert take_now(q, lease=0.5).item == "doomed"  # attempt 2: dead when it runs out
    clock.advance(2)
    q.put("after")  # t=3
    clock.advance(1)  # t=4: doomed's and early's leases ran out
    order = [take_now(q).item for _ in range(3)]
    assert order == ["before", "early", "after"]
    assert q.take(timeout=0) is None
    assert [(job.item, job.attempts) for job in q.dead()] == [("doomed", 2)]
    q.put("x")  # t=4
    take_now(q, lease=1)  # its lease ends at t=5
    clock.advance(2)
    q.put("y")  # t=6
    clock.advance(1)
    assert [take_now(q).item for _ in range(2)] == ["x", "y"]


def test_the_sweeper_turns_back_leases_by_itself(
    state: reactor.State, q: reactor.Queue, clock: ManualClock
) -> None:
    q.put("work")
    take_now(q, lease=5)
    clock.advance(6)
    eventually(lambda: ("1", "updated", "ready") in queue_events(state), timeout=PATIENCE)


def test_leases_run_out_in_thousands_of_queues_keep_no_timer_or_expiry_waiting(
    state: reactor.State, clock: ManualClock, db_path: Any
) -> None:
    """A worker that held a job of each of thousands of queues dies: its leases run out,
    then an unrelated timer and key come due. They still come within a second (SPEC §3,
    §13), and every job is ready again, once. The sweeper used to turn the leases back
    a write per queue, all of them before its next look: the timer and the expiry came
    1.7-2.6 s late."""
    count = 1000 if str(db_path).startswith("postgresql") else 10_000
    names = [f"q{n:05d}" for n in range(count)]
    with state.scope("setup").transaction() as tx:
        for name in names:
            tx.enqueue(name, name)
    for name in names:
        take_now(state.queue(name), lease=10)  # and the worker dies: no ack, no nack
    other = state.scope("other")
    due = clock.time() + 11  # a second after the leases
    other.schedule("timer", "fired", at=due)
    other.set("cached", 1, ttl=due - clock.time())
    arrivals: dict[str, float] = {}
    turned: list[str] = []

    def note(event: reactor.ChangeEvent) -> None:
        if event.scope == "other":
            arrivals.setdefault(event.type, time.monotonic())
        elif event.new_value is not None and event.new_value["state"] == "ready":
            assert event.new_value["attempts"] == 1
            turned.append(event.scope)

    state.subscribe(note)
    clock.advance(10.5)  # the leases ran out, not yet the timer nor the key
    eventually(lambda: turned, timeout=PATIENCE)  # the sweeper is turning them back
    clock.advance(1)
    began = time.monotonic()
    eventually(lambda: {"created", "expired"} <= set(arrivals), timeout=PATIENCE)
    late = max(arrivals.values()) - began
    print(f"{count} leases run out: the timer and the expiry came {late:.3f} s late at most")
    assert late < 1.0
    eventually(lambda: len(turned) >= count, timeout=PATIENCE)
    time.sleep(0.2)  # one too many would show up now
    assert sorted(turned) == [f"queue:{name}" for name in names]  # each once
    for name in (names[0], names[-1]):
        assert state.queue(name).stats()["ready"] == 1
        assert take_now(state.queue(name)).attempts == 2


def test_after_max_attempts_a_job_is_dead(
    state: reactor.State, engine: Any, clock: ManualClock
) -> None:
    q = state.queue("q", max_attempts=3)
    q.put("poison")
    for attempt in (1, 2, 3):
        job = take_now(q, lease=10)
        assert (job.item, job.attempts) == ("poison", attempt)
        clock.advance(11)
        assert run_upkeep(state).leases_turned_back == 1
    q.put("fine")
    assert q.stats() == {
        "ready": 1,
        "delayed": 0,
        "taken": 0,
        "dead": 1,
        "taken_by_group": {},
        "rate_window": 0,
    }
    (dead,) = q.dead()
    assert (dead.id, dead.item, dead.attempts) == (1, "poison", 3)
    with pytest.raises(reactor.LockNotOwnedError):
        dead.ack()
    assert take_now(q).item == "fine"
    assert q.take(timeout=0) is None
    events = queue_events(state)
    assert events.count(("1", "updated", "taken")) == 3
    assert events[-3:] == [
        ("1", "updated", "dead"),
        ("2", "created", "ready"),
        ("2", "updated", "taken"),
    ]


def test_a_nack_on_the_last_attempt_is_a_death(state: reactor.State, clock: ManualClock) -> None:
    q = state.queue("q", max_attempts=2)
    q.put("x")
    take_now(q).nack(delay=100)  # attempt 1 of 2: ready again, later
    assert q.stats() == {
        "ready": 0,
        "delayed": 1,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    clock.advance(100)
    job = take_now(q)
    assert job.attempts == 2
    job.nack(delay=100)  # the last: dead at once, the delay is moot
    assert q.stats() == {
        "ready": 0,
        "delayed": 0,
        "taken": 0,
        "dead": 1,
        "taken_by_group": {},
        "rate_window": 0,
    }
    assert [(dead.id, dead.attempts) for dead in q.dead()] == [(1, 2)]


def test_nack_extend_and_their_rules(
    state: reactor.State, q: reactor.Queue, clock: ManualClock
) -> None:
    q.put("x")
    job = take_now(q, lease=10)
    clock.advance(8)
    job.extend()  # the take's lease again: 10 s from now
    clock.advance(8)
    job.extend(60)
    clock.advance(59)
    assert q.stats()["taken"] == 1
    job.nack(delay=5)
    with pytest.raises(reactor.LockNotOwnedError):
        job.nack()  # given back already
    with pytest.raises(reactor.LockNotOwnedError):
        job.extend(10)
    assert q.stats() == {
        "ready": 0,
        "delayed": 1,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    clock.advance(5)
    job = take_now(q)
    assert job.attempts == 2
    job.ack()
    with pytest.raises(reactor.LockNotOwnedError):
        job.ack()
    types = [event[1:] for event in queue_events(state)]
    assert types == [
        ("created", "ready"),
        ("updated", "taken"),
        ("updated", "taken"),  # extend
        ("updated", "taken"),  # extend
        ("updated", "ready"),  # nack
        ("updated", "taken"),
        ("deleted", None),
    ]


def test_max_attempts_is_saved_and_can_change(state: reactor.State, db_path: Any) -> None:
    q = state.queue("q", max_attempts=1)
    assert q.stats() == {
        "ready": 0,
        "delayed": 0,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    assert raw_query(db_path, "SELECT name FROM reactor_queues") == []  # not yet
    q.put("x")
    assert raw_query(db_path, "SELECT max_attempts FROM reactor_queues") == [(1,)]
    take_now(state.queue("q")).nack()  # a handle without a setting: the stored one
    assert state.queue("q").stats()["dead"] == 1
    assert state.queue("q").retry_dead() == 1
    more = state.queue("q", max_attempts=4)
    take_now(more).nack()
    assert raw_query(db_path, "SELECT max_attempts FROM reactor_queues") == [(4,)]
    assert more.stats()["ready"] == 1


def test_retry_dead_revives_every_dead_job(state: reactor.State, clock: ManualClock) -> None:
    q = state.queue("q", max_attempts=1)
    for i in range(5):
        q.put(i)
    for _ in range(5):
        take_now(q).nack()
    assert [job.item for job in q.dead()] == [0, 1, 2, 3, 4]
    assert [job.item for job in q.dead(limit=2)] == [0, 1]
    assert q.retry_dead() == 5
    assert q.retry_dead() == 0
    assert q.dead() == []
    jobs = [take_now(q) for _ in range(5)]
    assert [(job.item, job.attempts) for job in jobs] == [(i, 1) for i in range(5)]


# -- the outbox: tx.enqueue -------------------------------------------------------------
def test_enqueue_commits_with_the_transaction(state: reactor.State, q: reactor.Queue) -> None:
    orders = state.scope("orders")
    with orders.transaction() as tx:
        tx.set("o-1", {"total": 120})
        assert tx.enqueue("q", {"order": "o-1"}) is None
        tx.enqueue("q", {"order": "o-1", "again": True}, key="o-1")
        tx.enqueue("q", "duplicate", key="o-1")  # the same key: nothing more
        tx.enqueue("other", "elsewhere", delay=5)
        assert q.stats()["ready"] == 0  # not before the commit
    assert q.stats() == {
        "ready": 2,
        "delayed": 0,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    assert state.queue("other").stats()["delayed"] == 1
    assert [take_now(q).item for _ in range(2)] == [
        {"order": "o-1"},
        {"order": "o-1", "again": True},
    ]
    kinds = [(e.scope, e.key, e.type) for e in state.changes()]
    assert kinds == [
        ("orders", "o-1", "created"),
        ("queue:q", "1", "created"),
        ("queue:q", "2", "created"),
        ("queue:other", "1", "created"),
        ("queue:q", "1", "updated"),
        ("queue:q", "2", "updated"),
    ]


def test_a_body_that_raises_enqueues_nothing(state: reactor.State, q: reactor.Queue) -> None:
    with pytest.raises(RuntimeError), state.scope("orders").transaction() as tx:
        tx.set("o-1", 1)
        tx.enqueue("q", "never")
        raise RuntimeError("the body fails")
    with pytest.raises(reactor.InvalidValueError), state.scope("orders").transaction() as tx:
        tx.enqueue("q", "kept")
        tx.enqueue("q", float("nan"))
    assert q.stats()["ready"] == 0
    with state.scope("orders").transaction() as tx:
        tx.enqueue("q", "alone")  # only an enqueue: it still commits
        with pytest.raises(reactor.InvalidKeyError):
            tx.enqueue("", "bad queue")
    assert take_now(q).item == "alone"
    assert state.scope("orders").get("o-1") is None


def test_a_conflicting_commit_enqueues_nothing(
    state: reactor.State, q: reactor.Queue, db_path: Any
) -> None:
    scope = state.scope("s")
    scope.set("n", 1)
    with pytest.raises(reactor.ConflictError), scope.transaction() as tx:
        tx.set("n", tx.get("n") + 1)
        tx.enqueue("q", "lost")
        subprocess.run(
            [
                sys.executable,
                "-c",
                textwrap.dedent(
                    """
                    import sys, reactor
                    with reactor.open(sys.argv[1]) as state:
                        state.scope("s").set("n", 100)
                    """
                ),
                str(db_path),
            ],
            check=True,
            timeout=60,
        )
    assert q.stats()["ready"] == 0
    assert scope.get("n") == 100
    assert queue_events(state) == []


def test_enqueue_in_a_transaction_over_several_scopes(
    state: reactor.State, q: reactor.Queue
) -> None:
    with state.transaction("orders", "ledger") as tx:
        tx["orders"].set("o-1", 1)
        tx["ledger"].increment("revenue", 120)
        tx.enqueue("q", "from the transaction")
        tx["ledger"].enqueue("q", "from a part")
    assert [take_now(q).item for _ in range(2)] == ["from the transaction", "from a part"]
    with pytest.raises(KeyError), state.transaction("orders") as tx:
        tx.enqueue("q", "no")
        raise KeyError("x")
    assert q.take(timeout=0) is None


def test_a_transaction_enqueueing_many_jobs(state: reactor.State, q: reactor.Queue) -> None:
    with state.scope("s").transaction() as tx:
        for i in range(1000):
            tx.enqueue("q", i, key=f"k{i % 700}")
    assert q.stats()["ready"] == 700
    assert [take_now(q).item for _ in range(3)] == [0, 1, 2]


# -- events ----------------------------------------------------------------------------
def test_subscribers_see_every_transition_in_order(
    state: reactor.State, engine: Any, clock: ManualClock
) -> None:
    q = state.queue("q", max_attempts=2)
    seen: list[reactor.ChangeEvent] = []
    done = threading.Event()

    def record(event: reactor.ChangeEvent) -> None:
        seen.append(event)
        if event.type == "deleted":
            done.set()

    subscription = state.subscribe(record, scope="queue:*")
    q.put({"n": 1})
    job = take_now(q, lease=10)
    job.nack()
    job = take_now(q, lease=10)
    clock.advance(11)
    run_upkeep(state)  # attempts 2 of 2: dead
    q.retry_dead()
    take_now(q).ack()
    assert done.wait(PATIENCE)
    subscription.close()
    summary = [
        (e.type, e.new_value and e.new_value["state"], e.new_value and e.new_value["attempts"])
        for e in seen
    ]
    assert summary == [
        ("created", "ready", 0),
        ("updated", "taken", 1),
        ("updated", "ready", 1),
        ("updated", "taken", 2),
        ("updated", "dead", 2),
        ("updated", "ready", 0),
        ("updated", "taken", 1),
        ("deleted", None, None),
    ]
    for before, after in itertools.pairwise(seen):
        assert after.old_value == before.new_value  # each change follows the last
        assert after.revision > before.revision
    assert {e.scope for e in seen} == {"queue:q"}
    assert {e.key for e in seen} == {"1"}
    assert seen[0].new_value == {
        "state": "ready",
        "attempts": 0,
        "ready_at": clock.time() - 11,
        "item": {"n": 1},
    }
    assert seen[-1].old_value["item"] == {"n": 1}


# -- the scope of a queue's events: read, never written (SPEC §2) ---------------------
WHY = "scope names beginning with 'queue:' or 'run:' are reserved for the events of queues"


def test_a_queues_events_read_through_its_scope(state: reactor.State, q: reactor.Queue) -> None:
    scope = state.scope("queue:q")
    seen: list[reactor.ChangeEvent] = []
    subscription = state.subscribe(seen.append, scope="queue:*")
    taken = Background(lambda: scope.wait_for("1", lambda job: job["state"] == "taken", PATIENCE))
    eventually(lambda: waiting_for(engine_of(state)))
    q.put({"n": 1})
    take_now(q).ack()
    assert taken.result() == {"state": "taken", "attempts": 1, "ready_at": ANY, "item": {"n": 1}}
    history = scope.history("1")
    assert [(e.type, e.new_value and e.new_value["state"]) for e in history] == [
        ("created", "ready"),
        ("updated", "taken"),
        ("deleted", None),
    ]
    assert scope.get("1", at_revision=history[0].revision) == history[0].new_value
    assert scope.get("1", at_revision=history[1].revision) == history[1].new_value
    assert scope.get("1", at_revision=history[2].revision) is None
    # A job is a row of the jobs table, not a key: the scope holds no keys.
    assert (scope.get("1"), scope.keys(), scope.list()) == (None, [], {})
    with state.watch(since=0, scope="queue:q") as watch:
        assert [next(watch) for _ in history] == history
    eventually(lambda: len(seen) == len(history))
    subscription.close()
    assert seen == history
    assert state.changes(scope="queue:q") == history


def test_a_scope_of_your_own_cannot_share_a_queues_events(
    state: reactor.State, q: reactor.Queue
) -> None:
    # The report: a scope "queue:q" of the user's, next to queue "q", took the queue's
    # job documents into its history, at_revision and wait_for, and its transactions
    # conflicted with the queue's activity. It can no longer be written to.
    q.put("job")
    mine = state.scope("queue:q")
    for write in (
        lambda: mine.set("1", "my value"),
        lambda: mine.set_many({"2": "mine"}),
        lambda: mine.delete("1"),
        mine.transaction,
        lambda: state.transaction("orders", "queue:q"),
    ):
        with pytest.raises(reactor.InvalidKeyError, match=WHY):
            write()
    take_now(q).ack()
    assert [e.new_value and e.new_value["item"] for e in mine.history("1")] == ["job", "job", None]
    assert {e.scope for e in state.changes()} == {"queue:q"}
    with state.scope("orders").transaction() as tx:  # the outbox still writes there
        tx.set("o-1", 1)
        tx.enqueue("q", "from the outbox")
    assert mine.history("2")[0].new_value["item"] == "from the outbox"


# -- waiting ---------------------------------------------------------------------------
def test_a_waiting_take_wakes_on_a_put(state: reactor.State, engine: Any) -> None:
    q = state.queue("q")
    before = receivers(engine)
    taker = Background(lambda: q.take(timeout=PATIENCE))
    eventually(lambda: waiting(engine) == 1)
    put_at = time.monotonic()
    q.put("now")
    job = taker.result()
    assert job.item == "now"
    assert taker.finished_at - put_at < 5
    assert_clean(engine, before)


def test_a_take_times_out_with_none(state: reactor.State, engine: Any) -> None:
    q = state.queue("q")
    before = receivers(engine)
    started = time.monotonic()
    assert q.take(timeout=0.3) is None
    assert 0.25 <= time.monotonic() - started < 5
    assert q.take(timeout=0) is None
    assert_clean(engine, before)
    assert state.stats()["operations"]["queue.take"] == 2


def test_a_delayed_job_wakes_a_waiting_take_when_due(
    open_state: Callable[..., reactor.State],
) -> None:
    state = open_state()  # the real clock
    q = state.queue("q")
    q.put("later", delay=0.5)
    started = time.monotonic()
    job = q.take(timeout=PATIENCE)
    assert job is not None
    assert job.item == "later"
    assert 0.4 <= time.monotonic() - started < 5


def test_a_lease_running_out_wakes_a_waiting_take(open_state: Callable[..., reactor.State]) -> None:
    state = open_state()
    q = state.queue("q")
    q.put("x")
    take_now(q, lease=0.5)
    job = q.take(timeout=PATIENCE)
    assert job is not None
    assert job.attempts == 2


def test_closing_ends_a_waiting_take(open_state: Callable[..., reactor.State]) -> None:
    state = open_state()
    q = state.queue("q")
    takers = [Background(q.take) for _ in range(3)]
    eventually(lambda: waiting(engine_of(state)) == 3)
    state.close()
    for taker in takers:
        with pytest.raises(reactor.ClosedError):
            taker.result()
    with pytest.raises(reactor.ClosedError):
        q.take(timeout=0)


def test_a_waiting_take_in_a_signal_receiver_raises(state: reactor.State, q: reactor.Queue) -> None:
    outcome: queues.Queue[Any] = queues.Queue()

    def receiver(_sender: str, event: reactor.ChangeEvent) -> None:
        if event.scope == "trigger":
            try:
                outcome.put(q.take(timeout=1))
            except Exception as exc:
                outcome.put(exc)
            outcome.put(q.take(timeout=0))  # a look is fine

    reactor.signals.changed.connect(receiver)
    try:
        state.scope("trigger").set("k", 1)
        assert isinstance(outcome.get(timeout=PATIENCE), reactor.ReentrancyError)
        assert outcome.get(timeout=PATIENCE) is None
    finally:
        reactor.signals.changed.disconnect(receiver)


def test_100_waiting_takers_and_10_puts(
    state: reactor.State, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = state.queue("q")
    looks = Counter[str]()
    look = reactor.Queue._look

    def counted(self: reactor.Queue, engine: Any, lease: float, *then: Any) -> Any:
        with COUNTING:
            looks["look"] += 1
        return look(self, engine, lease, *then)

    monkeypatch.setattr(reactor.Queue, "_look", counted)
    before = receivers(engine)
    takers = [Background(lambda: q.take(timeout=PATIENCE)) for _ in range(100)]
    eventually(lambda: waiting(engine) == 100, timeout=PATIENCE)
    for i in range(10):
        q.put(i)
    eventually(lambda: sum(not taker.running() for taker in takers) == 10, timeout=PATIENCE)
    done = [taker for taker in takers if not taker.running()]
    assert sorted(taker.result().item for taker in done) == list(range(10))
    assert len({taker.thread.ident for taker in done}) == 10
    # The other 90 wait without spinning: the head alone looks, now and then (a lease
    # runs out, on the fake clock, in 30 s: it looks at least every 2 s).
    time.sleep(0.2)
    cpu, before_looks = cpu_seconds(), looks["look"]
    time.sleep(1.0)
    assert cpu_seconds() - cpu < 0.5
    assert looks["look"] - before_looks <= 2
    assert waiting(engine) == 90
    assert q.stats() == {
        "ready": 0,
        "delayed": 0,
        "taken": 10,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    for i in range(90):
        q.put(i)
    results = [taker.result() for taker in takers if taker not in done]
    assert sorted(job.item for job in results) == list(range(90))
    assert_clean(engine, before)


def test_a_put_from_another_process_wakes_a_waiting_take(
    open_state: Callable[..., reactor.State], db_path: Any
) -> None:
    state = open_state()
    q = state.queue("q")
    engine = engine_of(state)
    taker = Background(lambda: q.take(timeout=60))
    eventually(lambda: waiting(engine) == 1)
    subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import sys, reactor\n"
                "with reactor.open(sys.argv[1]) as state:\n"
                "    state.queue('q').put({'from': 'child'})\n"
            ),
            str(db_path),
        ],
        check=True,
        timeout=60,
    )
    written = time.monotonic()
    job = taker.result(60)
    assert job.item == {"from": "child"}
    assert taker.finished_at - written < 5  # woken, not timed out (60 s)


# -- read-only ---------------------------------------------------------------------------
def test_a_read_only_engine_reads_queues_and_refuses_writes(db_path: Any) -> None:
    with reactor.open(db_path) as writer:
        q = writer.queue("q", max_attempts=1)
        q.put("ready")
        q.put("dead")
        take_now(q)  # ready
        take_now(q).nack()  # dead
    with reactor.open(db_path, readonly=True) as reader:
        q = reader.queue("q")
        assert q.stats() == {
            "ready": 0,
            "delayed": 0,
            "taken": 1,
            "dead": 1,
            "taken_by_group": {},
            "rate_window": 0,
        }
        assert [job.item for job in q.dead()] == ["dead"]
        for write in (
            lambda: q.put("x"),
            lambda: q.take(timeout=0),
            lambda: q.take(timeout=5),
            q.retry_dead,
        ):
            with pytest.raises(reactor.ReadOnlyError):
                write()
        with pytest.raises(reactor.ReadOnlyError), reader.scope("s").transaction() as tx:
            tx.enqueue("q", "x")
        assert reader.queues() == ["q"]


# -- persistence and stats ----------------------------------------------------------------
def test_jobs_survive_a_restart(db_path: Any, clock: ManualClock) -> None:
    with reactor.open(db_path, clock=clock) as state:
        q = state.queue("q", max_attempts=2)
        q.put("a", key="ka")
        q.put("b", delay=60)
        take_now(q, lease=10)
    clock.advance(11)
    with reactor.open(db_path, clock=clock) as state:
        q = state.queue("q")
        assert q.put("a again", key="ka") == 1
        job = take_now(q)
        assert (job.item, job.attempts) == ("a", 2)
        job.nack()
        assert q.stats() == {
            "ready": 0,
            "delayed": 1,
            "taken": 0,
            "dead": 1,
            "taken_by_group": {},
            "rate_window": 0,
        }


def test_verbs_are_timed_in_stats(state: reactor.State, q: reactor.Queue) -> None:
    q.put(1)
    job = take_now(q)
    job.extend(5)
    job.nack()
    take_now(q).ack()
    q.stats()
    q.dead()
    q.retry_dead()
    with state.scope("s").transaction() as tx:
        tx.enqueue("q", 2)
    operations = state.stats()["operations"]
    for verb in (
        "queue.put",
        "queue.take",
        "queue.ack",
        "queue.nack",
        "queue.extend",
        "queue.stats",
        "queue.dead",
        "queue.retry_dead",
        "queue.enqueue",
    ):
        assert operations[verb] >= 1, verb
    assert operations["queue.take"] == 2
    assert "queue.look" not in operations


# -- asyncio ---------------------------------------------------------------------------
def async_engine(state: reactor.aio.AsyncState) -> Any:
    assert state._link.state is not None
    return engine_of(state._link.state)


async def eventually_async(condition: Callable[[], Any], timeout: float = PATIENCE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_async_put_take_ack_nack_extend(db_path: Any, clock: ManualClock) -> None:
    async with reactor.aio.open(db_path, clock=clock) as state:
        q = state.queue("q", max_attempts=2)
        assert repr(q) == "<reactor.aio.AsyncQueue 'q'>"
        assert await q.put({"n": 1}) == 1
        assert await q.put("dup", key="k") == 2
        assert await q.put("dup again", key="k") == 2
        job = await q.take(timeout=0, lease=10)
        assert job is not None
        assert (job.id, job.item, job.attempts, job.queue) == (1, {"n": 1}, 1, "q")
        await job.extend(20)
        clock.advance(1)
        await job.nack()  # in line after job 2, ready before
        assert await q.stats() == {
            "ready": 2,
            "delayed": 0,
            "taken": 0,
            "dead": 0,
            "taken_by_group": {},
            "rate_window": 0,
        }
        second = await q.take(timeout=0)
        assert second is not None
        assert second.item == "dup"
        await second.ack()
        with pytest.raises(reactor.LockNotOwnedError):
            await second.ack()
        again = await q.take(timeout=0)
        assert again is not None
        assert again.attempts == 2
        await again.nack()
        (dead,) = await q.dead()
        assert dead.item == {"n": 1}
        assert await q.retry_dead() == 1
        assert await q.take(timeout=0) is not None
        assert await q.take(timeout=0) is None
        async with state.scope("s").transaction() as tx:
            await tx.set("k", 1)
            await tx.enqueue("q", "outbox")
        async with state.transaction("a", "b") as multi:
            await multi.enqueue("q", "multi")
            await multi["a"].enqueue("q", "part")
        items = [(await q.take(timeout=0)) for _ in range(3)]
        assert [job.item for job in items if job is not None] == ["outbox", "multi", "part"]


async def test_async_a_waiting_take_wakes_and_holds_no_thread(db_path: Any) -> None:
    async with reactor.aio.open(db_path) as state:
        q = state.queue("q")
        await q.stats()  # open it first
        engine = async_engine(state)
        before = receivers(engine)
        takers = [asyncio.ensure_future(q.take(timeout=PATIENCE)) for _ in range(50)]
        await eventually_async(lambda: waiting(engine) == 50)
        threads = threading.active_count()
        for i in range(5):
            await q.put(i)
        await eventually_async(lambda: sum(t.done() for t in takers) == 5)
        await asyncio.sleep(0.2)
        assert sum(t.done() for t in takers) == 5
        assert threading.active_count() <= threads
        assert sorted((t.result()).item for t in takers if t.done()) == list(range(5))  # type: ignore[union-attr]
        for taker in takers:
            taker.cancel()
        await asyncio.gather(*takers, return_exceptions=True)
        await eventually_async(lambda: waiting(engine) == 0)
        assert_clean(engine, before)
        assert await q.stats() == {
            "ready": 0,
            "delayed": 0,
            "taken": 5,
            "dead": 0,
            "taken_by_group": {},
            "rate_window": 0,
        }
        started = time.monotonic()
        assert await q.take(timeout=0.2) is None
        assert time.monotonic() - started >= 0.15


async def test_async_cancelling_a_waiting_take_takes_nothing(db_path: Any) -> None:
    async with reactor.aio.open(db_path) as state:
        q = state.queue("q")
        await q.stats()
        engine = async_engine(state)
        before = receivers(engine)
        taker = asyncio.ensure_future(q.take(timeout=PATIENCE))
        await eventually_async(lambda: waiting(engine) == 1)
        taker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await taker
        # Its line goes as the cancellation is handled: a loaded machine may lag.
        await eventually_async(lambda: waiting(engine) == 0)
        assert_clean(engine, before)
        # Cancelled at every point of a look: a job taken meanwhile goes back as it was.
        for i in range(30):
            await q.put(i)
            early = asyncio.ensure_future(q.take(timeout=PATIENCE))
            for _ in range(i % 5):
                await asyncio.sleep(0)
            early.cancel()
            try:
                job = await early
            except asyncio.CancelledError:
                continue
            assert job is not None
            await job.ack()
        await eventually_async(lambda: waiting(engine) == 0)

        async def settled() -> bool:
            stats = await q.stats()
            return stats["taken"] == 0

        deadline = time.monotonic() + PATIENCE
        while not await settled():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        left = []
        while (job := await q.take(timeout=0)) is not None:
            left.append(job)
        assert all(job.attempts == 1 for job in left)  # never taken before
        assert_clean(engine, before)


async def test_async_closing_ends_a_waiting_take(db_path: Any) -> None:
    state = reactor.aio.open(db_path)
    q = state.queue("q")
    await q.stats()
    engine = async_engine(state)
    taker = asyncio.ensure_future(q.take())
    await eventually_async(lambda: waiting(engine) == 1)
    await asyncio.wait_for(state.close(), PATIENCE)
    with pytest.raises(reactor.ClosedError):
        await asyncio.wait_for(taker, PATIENCE)


async def test_async_queues(db_path: Any) -> None:
    async with reactor.aio.open(db_path) as state:
        assert await state.queues() == []
        await state.queue("sms").put(1)
        await state.queue("emails").put(2)
        assert await state.queues() == ["emails", "sms"]
    with pytest.raises(reactor.ClosedError):
        await state.queues()


async def test_async_read_only(db_path: Any) -> None:
    with reactor.open(db_path) as writer:
        writer.queue("q").put(1)
    async with reactor.aio.open(db_path, readonly=True) as state:
        q = state.queue("q")
        assert (await q.stats())["ready"] == 1
        with pytest.raises(reactor.ReadOnlyError):
            await q.take(timeout=5)
        with pytest.raises(reactor.ReadOnlyError):
            await q.put(2)


def test_a_ready_job_wakes_only_the_head(
    state: reactor.State, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One job, ten waiters: one look or two, not ten."""
    q = state.queue("q")
    looks = Counter[str]()
    look = reactor.Queue._look

    def counted(self: reactor.Queue, engine: Any, lease: float, *then: Any) -> Any:
        with COUNTING:
            looks["look"] += 1
        return look(self, engine, lease, *then)

    monkeypatch.setattr(reactor.Queue, "_look", counted)
    takers = [Background(lambda: q.take(timeout=PATIENCE)) for _ in range(10)]
    eventually(lambda: waiting(engine) == 10 and looks["look"] == 10)  # each looked once
    looks.clear()
    q.put("one")
    eventually(lambda: sum(not t.running() for t in takers) == 1)
    time.sleep(0.3)
    assert looks["look"] <= 3  # the head's, and the next head's
    for i in range(9):
        q.put(i)
    for taker in takers:
        taker.result()


def test_takers_of_an_idle_queue_write_nothing(
    state: reactor.State, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take reads first, and writes only if a job may be ready; after a take that
    found a job, the next one writes at once (one transaction: a busy queue's take)."""
    q = state.queue("q")
    writes = Counter[str]()
    write = engine.store.write

    def counted(*args: Any, **kwargs: Any) -> Any:
        writes["write"] += 1
        return write(*args, **kwargs)

    monkeypatch.setattr(engine.store, "write", counted)

    def writes_of(call: Callable[[], Any]) -> tuple[Any, int]:
        writes.clear()
        return call(), writes["write"]

    assert writes_of(lambda: q.take(timeout=0)) == (None, 0)
    q.put("a")
    q.put("b")
    for item in ("a", "b"):
        job, count = writes_of(lambda: q.take(timeout=0))
        assert (job.item, count) == (item, 1)
        job.ack()
    assert writes_of(lambda: q.take(timeout=0)) == (None, 1)  # it was busy: one write
    assert writes_of(lambda: q.take(timeout=0)) == (None, 0)  # idle again: a read
    assert q.stats() == {
        "ready": 0,
        "delayed": 0,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }


async def test_a_queues_events_read_through_its_async_scope(db_path: Any) -> None:
    async with reactor.aio.open(db_path) as state:
        q, scope = state.queue("q"), state.scope("queue:q")
        waiting = asyncio.ensure_future(scope.wait_for("1", timeout=PATIENCE))
        await eventually_async(lambda: waiting_for(async_engine(state)))
        await q.put("job")
        assert (await waiting)["item"] == "job"
        assert [e.type for e in await scope.history("1")] == ["created"]
        with pytest.raises(reactor.InvalidKeyError, match=WHY):
            await scope.set("1", "mine")
        with pytest.raises(reactor.InvalidKeyError, match=WHY):
            scope.transaction()


# -- the command line ------------------------------------------------------------------
@pytest.mark.sqlite_only(CLI_ON_SQLITE)
def test_the_command_line_puts_takes_and_acks(db_path: Any, tmp_path: Any) -> None:
    from tests.conftest import run_reactor

    db = ["--db", str(db_path)]

    def reactor_json(*args: str) -> Any:
        done = run_reactor("queue", *args, *db, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert reactor_json("put", "emails", '{"to": "ada"}') == {"id": 1}
    assert reactor_json("put", "emails", '"b"', "--key", "k") == {"id": 2}
    assert reactor_json("put", "emails", '"b again"', "--key", "k") == {"id": 2}
    assert reactor_json("put", "emails", "-1", "--delay", "3600") == {"id": 3}
    assert reactor_json("stats") == {
        "emails": {
            "ready": 2,
            "delayed": 1,
            "taken": 0,
            "dead": 0,
            "taken_by_group": {},
            "rate_window": 0,
        }
    }
    job = reactor_json("take", "emails", "--lease", "60")
    assert set(job) == {"id", "item", "attempts", "token"}
    assert (job["id"], job["item"], job["attempts"]) == (1, {"to": "ada"}, 1)
    assert reactor_json("ack", "emails", "1", job["token"]) == {"id": 1, "acked": True}
    again = run_reactor("queue", "ack", "emails", "1", job["token"], *db, cwd=tmp_path)
    assert again.returncode == 1
    assert again.stderr.startswith("Error: job 1 of queue 'emails' is not held by this taker")
    assert "Traceback" not in again.stderr
    job = reactor_json("take", "emails")
    assert reactor_json("nack", "emails", str(job["id"]), job["token"], "--delay", "60") == {
        "id": 2,
        "nacked": True,
    }
    assert reactor_json("stats", "emails") == {
        "ready": 0,
        "delayed": 2,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    none = run_reactor("queue", "take", "emails", "--timeout", "0.2", *db, cwd=tmp_path)
    assert (none.returncode, none.stdout) == (1, "")
    assert none.stderr.strip() == "Error: no job ready in queue 'emails' within 0.2 s"
    assert reactor_json("put", "once", "[1]") == {"id": 1}
    assert reactor_json("take", "once", "--ack") == {"id": 1, "item": [1], "attempts": 1}
    assert reactor_json("stats", "once") == {
        "ready": 0,
        "delayed": 0,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    assert reactor_json("dead", "emails") == []
    assert reactor_json("retry", "emails") == {"retried": 0}
    bad = run_reactor("queue", "put", "emails", "nope", *db, cwd=tmp_path)
    assert bad.returncode == 2  # usage
    assert "is not JSON" in bad.stderr


@pytest.mark.sqlite_only(CLI_ON_SQLITE)
def test_the_command_line_lists_dead_jobs_and_retries_them(db_path: Any, tmp_path: Any) -> None:
    from tests.conftest import run_reactor

    with reactor.open(db_path) as state:
        q = state.queue("flaky", max_attempts=1)
        q.put({"n": 1})
        take_now(q).nack(error="ValueError: no n")
    db = ["--db", str(db_path)]
    dead = run_reactor("queue", "dead", "flaky", *db, cwd=tmp_path)
    assert json.loads(dead.stdout) == [
        {"id": 1, "item": {"n": 1}, "attempts": 1, "error": "ValueError: no n"}
    ]
    table = run_reactor("queue", "dead", "flaky", "--table", *db, cwd=tmp_path)
    assert '{"n":1}' in table.stdout
    assert "ValueError: no n" in table.stdout  # the last error, with each dead letter
    retried = run_reactor("queue", "retry", "flaky", *db, cwd=tmp_path)
    assert json.loads(retried.stdout) == {"retried": 1}
    stats = run_reactor("queue", "stats", "--table", *db, cwd=tmp_path)
    assert "flaky" in stats.stdout
    assert "ready" in stats.stdout


def test_a_job_kept_by_extend_is_not_turned_back(open_state: Callable[..., reactor.State]) -> None:
    state = open_state()  # the real clock, and its sweeper
    q = state.queue("q")
    q.put("long work")
    job = take_now(q, lease=1.0)
    for _ in range(15):
        time.sleep(0.1)
        job.extend()  # a second from now, again
    assert q.take(timeout=0) is None
    job.ack()
    assert [event[1:] for event in queue_events(state)][-1] == ("deleted", None)
    assert ("1", "updated", "ready") not in queue_events(state)


def test_a_put_on_another_queue_does_not_wake_a_taker(
    state: reactor.State, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = state.queue("q")
    looks = Counter[str]()
    look = reactor.Queue._look

    def counted(self: reactor.Queue, engine: Any, lease: float, *then: Any) -> Any:
        with COUNTING:
            looks[self.name] += 1
        return look(self, engine, lease, *then)

    monkeypatch.setattr(reactor.Queue, "_look", counted)
    taker = Background(lambda: q.take(timeout=PATIENCE))
    eventually(lambda: waiting(engine) == 1 and looks["q"] == 1)
    first = looks["q"]
    other = state.queue("other")
    for n in range(20):
        other.put(n)
    state.scope("q").set("k", 1)  # a scope is not a queue
    time.sleep(0.3)
    assert looks["q"] == first
    q.put("mine")
    assert taker.result().item == "mine"


# -- PostgreSQL: takes and acks of several processes go on together --------------------
@pytest.mark.postgresql_only
def test_a_take_passes_over_a_job_another_transaction_holds(db_path: Any) -> None:
    """Takes hold their queue in shared mode and lock the jobs they read: one passes
    over the job another process's take holds (SKIP LOCKED), neither waits."""
    with reactor.open(db_path) as state:
        q = state.queue("q")
        first, second = q.put("first"), q.put("second")
        with raw_postgres(db_path) as other, other.transaction():
            other.execute("SELECT id FROM reactor_jobs WHERE id = %s FOR UPDATE", (first,))
            job = q.take(timeout=0)
            assert job is not None
            assert (job.id, job.item) == (second, "second")
            assert q.take(timeout=0) is None  # the held one is passed over, not waited for
        job.ack()
        again = q.take(timeout=0)
        assert again is not None
        assert again.id == first


@pytest.mark.postgresql_only
def test_an_ack_waits_for_the_transaction_holding_its_job_and_reads_it_after(
    db_path: Any,
) -> None:
    """A process whose clock runs ahead turns back a lease that this taker still holds
    by its own clock; the late ack waits for that transaction, then finds the job is no
    longer its own: it fails and the job stays (without the lock, the ack read the job
    before the turn-back committed and then deleted the job made ready again)."""
    with reactor.open(db_path) as state:
        q = state.queue("q")
        job_id = q.put("work")
        job = q.take(timeout=0, lease=60)
        assert job is not None
        outcome: queues.Queue[BaseException | None] = queues.Queue()

        def ack() -> None:
            try:
                job.ack()
                outcome.put(None)
            except BaseException as exc:
                outcome.put(exc)

        with raw_postgres(db_path) as other:
            with other.transaction():
                other.execute(
                    "UPDATE reactor_jobs SET state = 'ready', owner = NULL WHERE id = %s",
                    (job_id,),
                )
                acker = threading.Thread(target=ack)
                acker.start()
                with pytest.raises(queues.Empty):
                    outcome.get(timeout=0.5)  # waiting for the row
            acker.join(timeout=30)
        assert isinstance(outcome.get(timeout=1), reactor.LockNotOwnedError)
        info = q.job(job_id)
        assert info is not None
        assert info.state in ("ready", "delayed")
