"""A campaign against ``reactor serve``: three serve processes keep one database's upkeep
while one of them, in turn, is killed with SIGKILL and started again.

Nobody else keeps the upkeep (the test's own handle opens with a sweep interval of a
million seconds). Every key must expire exactly once, every timer fire exactly once per
due time, every lease run out be turned back exactly once, each within a second of its
time, whichever process did it and whatever was killed in the middle of it.
"""

from __future__ import annotations

import math
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any, Final

import pytest

import reactor
from reactor import ops
from tests.conftest import CLI_ENV, backend
from tests.conftest import wait_for as eventually

QUIET: Final = 1e6  # the test's sweep interval: its own upkeep never runs
SPREAD: Final = (2.0, 8.0)  # seconds from now over which keys and timers come due
LATE_MAX: Final = 1.0  # seconds past its time that any chore may be done, at most
KILL_EVERY: Final = 1.2  # seconds between two kills


class Servers:
    """Three ``reactor serve`` processes on one database, one killed and restarted at a
    time; each one's stderr goes to a file of its own."""

    def __init__(self, db: Any, folder: Path, count: int = 3) -> None:
        self._db = db
        self._folder = folder
        self._started = 0
        self.logs: list[Path] = []
        self.stopped: list[Path] = []  # the logs of those stopped by stop()
        self._running: list[tuple[subprocess.Popen[bytes], IO[bytes], Path]] = []
        for _ in range(count):
            self._start()

    def _start(self) -> None:
        log = self._folder / f"serve-{self._started}.log"
        self._started += 1
        self.logs.append(log)
        output = log.open("wb")
        command = [sys.executable, "-m", "reactor", "--db", str(self._db), "serve"]
        process = subprocess.Popen(
            [*command, "--interval", "0.1"],
            stdout=subprocess.DEVNULL,
            stderr=output,
            env=CLI_ENV,
        )
        self._running.append((process, output, log))

    def kill_one(self, rng: random.Random) -> None:
        """SIGKILL one of them, and start another in its place."""
        process, output, _log = self._running.pop(rng.randrange(len(self._running)))
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        output.close()
        self._start()

    def stop(self) -> list[int]:
        """SIGTERM each, once it is serving; their exit statuses."""
        statuses = []
        for _, _, log in self._running:
            eventually(lambda log=log: "reactor.serve: serving" in log.read_text(), timeout=30)
        for process, _, _ in self._running:
            process.terminate()
        for process, output, log in self._running:
            try:
                statuses.append(process.wait(30))
            except subprocess.TimeoutExpired:
                process.kill()
                statuses.append(process.wait(10))
            output.close()
            self.stopped.append(log)
        self._running.clear()
        return statuses


def test_three_servers_killed_in_turn_do_each_chore_once_and_on_time(
    db_path: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(25)
    count = 300 if backend(request.config) == "sqlite" else 150
    with reactor.open(db_path, sweep_interval=QUIET) as state:
        now = time.time()
        deadlines: dict[str, float] = {}
        keys, timers = state.scope("keys"), state.scope("timers")
        with keys.transaction() as tx:
            for n in range(count):
                ttl = rng.uniform(*SPREAD)
                tx.set(f"k{n}", n, ttl=ttl)
                deadlines[f"k{n}"] = now + ttl
        due = {
            timer.id: timer.due
            for timer in (
                timers.schedule(f"t{n}", n, at=now + rng.uniform(*SPREAD))
                for n in range(count // 2)
            )
        }
        ticking = timers.schedule("tick", ops=[ops.increment("n")], every=1.0)
        jobs = state.queue("jobs")
        for n in range(count // 5):
            jobs.put(n)
        lease_ends: dict[int, float] = {}
        for _ in range(count // 5):
            lease = rng.uniform(*SPREAD)
            job = jobs.take(timeout=5, lease=lease)
            assert job is not None
            lease_ends[job.id] = time.time() + lease  # a little after its true end

        servers = Servers(db_path, tmp_path)
        try:
            while time.time() < now + SPREAD[1] + 1.5:
                time.sleep(KILL_EVERY)
                servers.kill_one(rng)
            eventually(lambda: not keys.keys() and not state.timers()[1:], timeout=15)
        finally:
            statuses = servers.stop()
        events = state.changes()

    assert statuses == [0, 0, 0], [log.read_text() for log in servers.stopped]
    for log in servers.logs:  # no failure, no warning; those not killed stopped cleanly
        lines = log.read_text().splitlines()
        assert not [line for line in lines if " INFO " not in line], lines
    for log in servers.stopped:
        assert log.read_text().endswith("INFO reactor.serve: stopped\n")
    late: list[float] = []
    # Keys: each expired exactly once, on time.
    expired = [event for event in events if event.type == "expired"]
    assert Counter(event.key for event in expired) == Counter(list(deadlines))
    late += [event.timestamp.timestamp() - deadlines[event.key] for event in expired]
    # Timers: each fired exactly once, on time; the ticking one once a period at most.
    fired = [event for event in events if event.timer is not None]
    once = [event for event in fired if event.timer in due]
    assert Counter(event.timer for event in once) == Counter(list(due))
    late += [event.timestamp.timestamp() - due[str(event.timer)] for event in once]
    ticks = [event.timestamp.timestamp() for event in fired if event.timer == ticking.id]
    assert len(ticks) >= SPREAD[1] - 1  # it went on through the kills
    # Once a period at most: each tick in a period of its own (one late by half a
    # period, then the next on time, are 0.5 s apart, and that is right).
    periods = [math.floor(at - ticking.due) for at in ticks]
    assert len(set(periods)) == len(periods), ticks
    # Leases: each turned back exactly once (its one error), on time.
    turned = [
        event
        for event in events
        if event.scope == "queue:jobs"
        and event.type == "updated"
        and event.new_value["state"] == "ready"
    ]
    assert Counter(int(event.key) for event in turned) == Counter(list(lease_ends))
    late += [event.timestamp.timestamp() - lease_ends[int(event.key)] for event in turned]
    with reactor.open(db_path, sweep_interval=QUIET) as state:
        for job_id in lease_ends:
            info = state.queue("jobs").job(job_id)
            assert info is not None
            assert len(info.errors) == 1, info
    assert max(late) <= LATE_MAX, sorted(late)[-10:]
