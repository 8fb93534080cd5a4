"""Campaigns for flow control on queues (SPEC §13, "Flow control on queues"): worker
processes under ``concurrency``, ``group_concurrency`` and ``rate``, one killed with
kill -9 while holding jobs; producer processes racing debounced puts.

The checks replay the queue's change log, in commit order: every take is an event
whose document says when its lease ends (the take's time is that end less the lease,
the same for every worker here). At each take, the jobs then held (taken, their
lease not yet run out at that time) must leave room under the limits, and the takes
of any window must stay within the rate. Each campaign runs in well under 30 s on
SQLite and on PostgreSQL (``--backend=postgresql``); every wait has a timeout.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import reactor
import reactor.aio
from tests.conftest import backend
from tests.conftest import wait_for as eventually
from tests.test_campaign_queues import _finish, _python

LEASE = 2.0
CONCURRENCY, GROUP_CONCURRENCY, RATE = 3, 1, (40, 1.0)


WORKER = f"""
import json, random, sys, time, reactor

with reactor.open(sys.argv[1]) as state:
    queue = state.queue("flow")  # the limits are the queue's, stored by the producer
    done = []
    print("ready", flush=True)
    while (job := queue.take(timeout=4, lease={LEASE})) is not None:
        time.sleep(random.uniform(0, 0.02))  # the work
        if job.item["n"] % 7 == 0 and job.attempts == 1:
            job.nack(error=f"item {{job.item['n']}} failed once")
            continue
        job.ack()
        done.append(job.item["n"])
    print(json.dumps(done))
"""


def _replay(events: list[reactor.ChangeEvent]) -> tuple[list[float], list[str]]:
    """The take times, and the breaches of the concurrency limits, in commit order."""
    held: dict[str, tuple[float, str | None]] = {}  # job: (lease end, group)
    takes: list[float] = []
    breaches: list[str] = []
    for event in events:
        new, old = event.new_value, event.old_value
        taking = new is not None and new["state"] == "taken"
        if taking and not (old is not None and old["state"] == "taken"):
            at = new["ready_at"] - LEASE
            live = [group for end, group in held.values() if end > at]
            group = new.get("group")
            if len(live) >= CONCURRENCY:
                breaches.append(f"take of {event.key} at {at}: {len(live)} held already")
            if group is not None and live.count(group) >= GROUP_CONCURRENCY:
                breaches.append(f"take of {event.key} at {at}: group {group} full")
            takes.append(at)
        if taking:
            held[event.key] = (new["ready_at"], new.get("group"))
        else:
            held.pop(event.key, None)
    return takes, breaches


def test_limits_hold_across_worker_processes_and_a_kill(
    open_state: Callable[..., reactor.State], db_path: Any, request: pytest.FixtureRequest
) -> None:
    count = 240 if backend(request.config) == "sqlite" else 160
    rng = random.Random()
    seed = rng.randrange(1_000_000)
    rng.seed(seed)
    state = open_state()
    queue = state.queue(
        "flow", concurrency=CONCURRENCY, group_concurrency=GROUP_CONCURRENCY, rate=RATE
    )
    for n in range(count):
        group = rng.choice(["a", "b", "c", "d", None])
        queue.put({"n": n}, priority=rng.choice([0, 0, 1, 5]), group=group)
    workers = [_python(WORKER, str(db_path)) for _ in range(4)]
    for worker in workers:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "ready", _finish(worker)
    time.sleep(1.0)  # the first worker is busy by now, holding jobs
    workers[0].send_signal(signal.SIGKILL)
    workers[0].communicate(timeout=30)  # its pipes closed
    done: Counter[int] = Counter()
    for worker in workers[1:]:
        done.update(json.loads(_finish(worker)))
    eventually(lambda: queue.stats()["ready"] + queue.stats()["taken"] == 0, timeout=30)
    why = f"seed {seed}"
    # The killed worker acked some jobs before it died: every job was acked once or
    # (its ack lost with the worker) done again.
    events = state.changes(scope="queue:flow", limit=1_000_000)
    acked = Counter(int(e.key) for e in events if e.type == "deleted")
    assert sorted(acked) == list(range(1, count + 1)), why
    assert set(acked.values()) == {1}, why
    assert set(done) <= set(range(count)), why
    takes, breaches = _replay(events)
    assert breaches == [], f"{why}: {breaches[:5]}"
    limit, seconds = RATE
    takes.sort()
    crowded = [
        (first, takes[i + limit])
        for i, first in enumerate(takes[:-limit])
        if takes[i + limit] - first < seconds - 1e-6
    ]
    assert crowded == [], f"{why}: more than {limit} takes within {seconds} s: {crowded[:3]}"
    failed = [e for e in events if e.new_value is not None and "error" in e.new_value]
    assert failed, why  # nacks recorded their errors
    print(f"{len(takes)} takes of {count} jobs in {takes[-1] - takes[0]:.1f} s; {why}")


PRODUCER = """
import sys, reactor

with reactor.open(sys.argv[1]) as state:
    queue = state.queue("debounced")
    for n in range(int(sys.argv[3])):
        key = f"doc-{n % 10}"
        queue.put({"key": key, "by": sys.argv[2], "n": n}, key=key, debounce=0.05)
"""

TAKER = """
import sys, time, reactor

with reactor.open(sys.argv[1]) as state:
    queue = state.queue("debounced")
    deadline = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < deadline:
        job = queue.take(timeout=0.2, lease=30)
        if job is not None:
            time.sleep(0.01)
            job.ack()
"""


def test_debounced_puts_racing_keep_one_waiting_job_per_key(
    open_state: Callable[..., reactor.State], db_path: Any, request: pytest.FixtureRequest
) -> None:
    puts = 300 if backend(request.config) == "sqlite" else 150
    state = open_state()
    state.queue("debounced").put({"key": "warm", "by": "test", "n": -1})
    producers = [_python(PRODUCER, str(db_path), name, str(puts)) for name in ("p1", "p2")]
    taker = _python(TAKER, str(db_path), "6")
    for producer in producers:
        _finish(producer)
    _finish(taker)
    waiting: dict[str, set[str]] = {}  # key: the ids of its waiting jobs
    jobs: dict[str, str] = {}  # id: key
    for event in state.changes(scope="queue:debounced", limit=1_000_000):
        if event.new_value is not None:
            jobs[event.key] = event.new_value["item"]["key"]
        key = jobs[event.key]
        ids = waiting.setdefault(key, set())
        if event.new_value is not None and event.new_value["state"] == "ready":
            ids.add(event.key)
        else:
            ids.discard(event.key)
        assert len(ids) <= 1, f"{key} has waiting jobs {ids} at revision {event.revision}"
    # Every key's last put is in a job: waiting, or taken and acked after that put.
    assert set(jobs.values()) == {"warm", *(f"doc-{n}" for n in range(10))}


HOLDER = """
import sys, time, reactor

with reactor.open(sys.argv[1]) as state:
    queue = state.queue("gate")
    held = [queue.take(timeout=5, lease=60) for _ in range(2)]
    print("holding", flush=True)
    sys.stdin.readline()
    for job in held:
        time.sleep(0.5)
        print(time.time(), flush=True)  # just before the ack commits
        job.ack()
"""


def test_many_asyncio_takes_held_back_are_woken_by_another_process_acks(db_path: Any) -> None:
    """Forty asyncio takes wait on a queue whose two slots another process holds; each of
    its acks frees a slot, and the takes then go through one after another (each acks
    what it got): none busy-polls, none waits for a timer, no job is taken twice, and
    never more than two are taken at once."""
    count = 40

    async def main() -> tuple[list[tuple[float, int]], float, list[float]]:
        async with reactor.aio.open(db_path) as state:
            gate = state.queue("gate", concurrency=2)
            for n in range(count + 2):
                await gate.put(n)
            holder = _python(HOLDER, str(db_path), stdin=True)
            assert holder.stdout is not None
            assert holder.stdin is not None
            assert holder.stdout.readline().strip() == "holding", _finish(holder)
            got: list[tuple[float, int]] = []

            async def take() -> None:
                job = await gate.take(timeout=30, lease=30)
                assert job is not None
                got.append((time.time(), job.item))
                await asyncio.sleep(random.uniform(0, 0.01))
                await job.ack()

            takers = [asyncio.create_task(take()) for _ in range(count)]
            await asyncio.sleep(1.0)
            assert got == []  # held back: two taken elsewhere
            started = time.time()
            holder.stdin.write("go\n")
            holder.stdin.flush()
            await asyncio.wait_for(asyncio.gather(*takers), timeout=60)
            acks = [float(line) for line in _finish(holder).split()]
            return got, started, acks

    got, started, acks = asyncio.run(main())
    items = [item for _, item in got]
    assert len(items) == count
    assert len(set(items)) == count  # none twice
    # The first take comes with the first ack of the other process, not seconds later.
    assert min(at for at, _ in got) - acks[0] < 1.5, (acks, sorted(got)[:3])
    assert sorted(got)[-1][0] - started < 30
    with reactor.open(db_path) as state:
        events = state.changes(scope="queue:gate")
        gate = state.queue("gate")
        assert gate.stats()["ready"] == 0
        assert gate.stats()["taken"] == 0
    held: set[str] = set()
    most = 0
    for event in events:  # in commit order: never more than two taken at once
        if event.type == "deleted":
            held.discard(event.key)
        elif event.new_value is not None and event.new_value["state"] == "taken":
            held.add(event.key)
        most = max(most, len(held))
    assert most == 2
