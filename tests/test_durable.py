"""Durable subscriptions: at-least-once delivery that follows the change log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import reactor
from reactor.testing import run_upkeep
from tests.conftest import wait_for

from .conftest import raw_query

Opener = Callable[..., reactor.State]


def _position(db_path: Path, name: str) -> int | None:
    rows = raw_query(db_path, "SELECT position FROM reactor_subscribers WHERE name = ?", (name,))
    return None if not rows else int(rows[0][0])


def test_a_new_durable_name_starts_now_and_stores_its_position(db_path: Path) -> None:
    with reactor.open(db_path) as state:
        scope = state.scope("s")
        scope.set("before", 1)
        seen: list[int] = []
        state.subscribe(lambda e: seen.append(e.revision), durable="billing")
        assert _position(db_path, "billing") == 1
        scope.set("after", 1)
        scope.set("after", 2)
        wait_for(lambda: seen == [2, 3])
        wait_for(lambda: _position(db_path, "billing") == 3)


def test_delivery_resumes_where_the_name_left_off(db_path: Path) -> None:
    with reactor.open(db_path) as state:
        seen: list[str] = []
        state.subscribe(lambda e: seen.append(e.key), durable="billing", since=0)
        state.scope("s").set("a", 1)
        wait_for(lambda: seen == ["a"])
    with reactor.open(db_path) as state:  # written while nobody listened
        state.scope("s").set("b", 1)
        state.scope("s").set("c", 1)
    with reactor.open(db_path) as state:
        resumed: list[str] = []
        state.subscribe(lambda e: resumed.append(e.key), durable="billing", since=0)
        wait_for(lambda: resumed == ["b", "c"])  # since= applies only the first time
        time.sleep(0.2)
        assert resumed == ["b", "c"]
        stats = state.stats()["durable_subscribers"]["billing"]
        assert stats["position"] == 3
        assert stats["lag"] == 0


def test_a_first_since_replays_the_log(state: reactor.State) -> None:
    scope = state.scope("s")
    for i in range(5):
        scope.set(f"k{i}", i)
    seen: list[int] = []
    state.subscribe(lambda e: seen.append(e.new_value), durable="replay", since=2)
    wait_for(lambda: seen == [2, 3, 4])


def test_filters_apply_and_skipped_events_still_advance(
    state: reactor.State, db_path: Path
) -> None:
    seen: list[str] = []
    state.subscribe(lambda e: seen.append(e.key), scope="orders", durable="orders-only")
    state.scope("orders").set("o-1", 1)
    state.scope("other").set("x", 1)
    state.scope("other").set("y", 1)
    state.scope("orders").set("o-2", 1)
    wait_for(lambda: seen == ["o-1", "o-2"])
    wait_for(lambda: _position(db_path, "orders-only") == 4)


def test_a_failing_callback_is_retried_then_recorded_and_skipped(
    state: reactor.State, db_path: Path
) -> None:
    attempts: dict[str, int] = {}

    def flaky(event: reactor.ChangeEvent) -> None:
        attempts[event.key] = attempts.get(event.key, 0) + 1
        if event.key == "poison":
            raise ValueError("cannot bill this")
        if event.key == "twice" and attempts[event.key] < 2:
            raise ValueError("transient")

    state.subscribe(flaky, durable="billing", max_retries=2)
    scope = state.scope("s")
    scope.set("poison", 1)
    scope.set("twice", 1)
    scope.set("fine", 1)
    wait_for(lambda: attempts.get("fine") == 1)
    assert attempts == {"poison": 3, "twice": 2, "fine": 1}
    failures = raw_query(db_path, "SELECT name, revision, error FROM reactor_failures")
    assert [(name, revision) for name, revision, _ in failures] == [("billing", 1)]
    assert "ValueError: cannot bill this" in failures[0][2]
    stats = state.stats()["durable_subscribers"]["billing"]
    assert stats["failed"] == 1
    wait_for(lambda: state.stats()["durable_subscribers"]["billing"]["position"] == 3)


def test_one_durable_name_once_per_process(state: reactor.State) -> None:
    state.subscribe(print, durable="billing")
    with pytest.raises(reactor.InvalidArgumentError, match="billing"):
        state.subscribe(print, durable="billing")


CONSUMER = """
    import sys, time, reactor
    path, hang_on = sys.argv[1], int(sys.argv[2])

    def bill(event):
        print("got", event.revision, flush=True)
        if event.revision == hang_on:
            time.sleep(60)  # killed here, in the middle of the callback

    with reactor.open(path) as state:
        state.subscribe(bill, durable="billing", since=0)
        time.sleep(60)
"""


def test_a_consumer_killed_mid_callback_resumes_at_the_unacknowledged_event(
    db_path: Path,
) -> None:
    with reactor.open(db_path) as state:
        state.scope("s").set_many({f"k{i}": i for i in range(10)})  # revisions 1..10

    def run_consumer(hang_on: int) -> tuple[subprocess.Popen[str], list[int]]:
        consumer = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(CONSUMER), str(db_path), str(hang_on)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert consumer.stdout is not None
        got: list[int] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = consumer.stdout.readline()
            if not line:
                break
            got.append(int(line.split()[1]))
            if got[-1] == hang_on:
                break
        return consumer, got

    first, got_first = run_consumer(hang_on=6)
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=10)
    assert got_first == [1, 2, 3, 4, 5, 6]

    second, got_second = run_consumer(hang_on=10)
    os.kill(second.pid, signal.SIGKILL)
    second.communicate(timeout=10)
    assert got_second == [6, 7, 8, 9, 10]  # the interrupted event again, then the rest


def test_durable_delivery_survives_many_events_from_threads(state: reactor.State) -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def record(event: reactor.ChangeEvent) -> None:
        with lock:
            seen.append(event.revision)

    state.subscribe(record, durable="all", since=0)

    def writer(n: int) -> None:
        for i in range(50):
            state.scope(f"w{n}").set("k", i)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    wait_for(lambda: len(seen) == 200, timeout=20)
    assert seen == list(range(1, 201))


def test_a_known_name_ignores_since_even_after_compaction(db_path: Path) -> None:
    with reactor.open(db_path, log_retention=2) as state:
        seen: list[int] = []
        state.subscribe(lambda e: seen.append(e.new_value), durable="billing", since=0)
        for i in range(5):
            state.scope("s").set("k", i)
        wait_for(lambda: state.stats()["durable_subscribers"]["billing"]["position"] == 5)
    with reactor.open(db_path, log_retention=2) as state:
        for i in range(5, 15):
            state.scope("s").set("k", i)
        run_upkeep(state)  # up to billing's position, not further
        with pytest.raises(reactor.RevisionCompactedError):
            state.changes(since=0)
        resumed: list[int] = []
        state.subscribe(lambda e: resumed.append(e.new_value), durable="billing", since=0)
        wait_for(lambda: resumed == list(range(5, 15)))


def test_events_passed_over_by_where_are_not_counted_as_delivered(state: reactor.State) -> None:
    seen: list[int] = []
    state.subscribe(
        lambda e: seen.append(e.new_value), where=lambda e: e.new_value % 2 == 0, durable="even"
    )
    for i in range(6):
        state.scope("s").set("k", i)
    wait_for(lambda: seen == [0, 2, 4])
    wait_for(lambda: state.stats()["durable_subscribers"]["even"]["position"] == 6)
    assert state.stats()["durable_subscribers"]["even"]["delivered"] == 3


def test_failures_go_with_the_log_but_each_subscribers_latest(db_path: Path) -> None:
    """A subscriber that fails on every event would otherwise grow its failures without
    end while the log stays within its retention."""
    with reactor.open(db_path, log_retention=3) as state:
        failed: list[int] = []

        def always(event: reactor.ChangeEvent) -> None:
            failed.append(event.revision)
            raise ValueError("down")

        def first_only(event: reactor.ChangeEvent) -> None:
            if event.key == "k1":
                raise ValueError("once")

        state.subscribe(always, durable="always", max_retries=0)
        state.subscribe(first_only, durable="first", max_retries=0)
        scope = state.scope("s")
        for n in range(1, 11):
            scope.set(f"k{n}", n)
        wait_for(lambda: all(d["position"] == 10 for d in _durables(state).values()))
        assert raw_query(db_path, "SELECT COUNT(*) FROM reactor_failures") == [(11,)]
        assert run_upkeep(state).log_compacted == 7
        kept = raw_query(db_path, "SELECT name, revision FROM reactor_failures")
        assert sorted(kept) == [("always", 8), ("always", 9), ("always", 10), ("first", 1)]
        assert _durables(state)["always"]["failed"] == 10  # the count stays whole
        assert failed == list(range(1, 11))


def _durables(state: reactor.State) -> dict[str, dict[str, int]]:
    subscribers: dict[str, dict[str, int]] = state.stats()["durable_subscribers"]
    return subscribers


def test_a_callback_that_meets_a_closed_engine_is_not_recorded_as_failed(db_path: Path) -> None:
    state = reactor.open(db_path)
    started = threading.Event()

    def write_back(event: reactor.ChangeEvent) -> None:
        started.set()
        time.sleep(0.2)
        state.scope("ledger").increment("n")  # the handle closes meanwhile

    state.subscribe(write_back, scope="s", durable="ledger-keeper")
    state.scope("s").set("k", 1)
    assert started.wait(5)
    state.close()
    assert raw_query(db_path, "SELECT COUNT(*) FROM reactor_failures") == [(0,)]
    with reactor.open(db_path) as again:  # the event is delivered again, and taken
        seen: list[int] = []
        again.subscribe(lambda e: seen.append(e.revision), scope="s", durable="ledger-keeper")
        wait_for(lambda: seen == [1])


def test_the_counts_of_a_durable_name_go_on_across_restarts(db_path: Path) -> None:
    """``delivered`` and ``failed`` count over the name's whole life: a restart (here,
    closing the engine and opening it again) takes them up where they were stored."""

    def bill(event: reactor.ChangeEvent) -> None:
        if event.key.startswith("bad"):
            raise ValueError("cannot bill this")

    def run(good: int, bad: int) -> dict[str, int]:
        with reactor.open(db_path) as state:
            state.subscribe(bill, durable="billing", max_retries=0)
            scope = state.scope("s")
            for i in range(good):
                scope.increment(f"good-{i}")
            for i in range(bad):
                scope.increment(f"bad-{i}")
            revision = state.stats()["revision"]

            def caught_up() -> dict[str, int] | None:
                found: dict[str, int] = state.stats()["durable_subscribers"]["billing"]
                return found if found["position"] == revision else None

            return wait_for(caught_up)

    first = run(good=3, bad=1)
    assert (first["delivered"], first["failed"]) == (3, 1)
    second = run(good=2, bad=2)
    assert (second["delivered"], second["failed"]) == (3 + 2, 1 + 2)
    stored = raw_query(db_path, "SELECT delivered, failed FROM reactor_subscribers")
    assert [tuple(row) for row in stored] == [(5, 3)]
