"""Threads: writes never race within a scope, scopes proceed, threads stay bounded."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import reactor
from tests.conftest import engine_of, held_elsewhere

Opener = Callable[..., reactor.State]


def test_8_threads_x_300_increments_on_one_key_are_exact(open_state: Opener) -> None:
    scope = open_state().scope("counters")
    barrier = threading.Barrier(8)

    def job() -> list[int | float]:
        barrier.wait(timeout=10)
        return [scope.increment("hits") for _ in range(300)]

    with ThreadPoolExecutor(8) as pool:
        results = [future.result(timeout=60) for future in [pool.submit(job) for _ in range(8)]]
    assert scope.get("hits") == 2400
    every = sorted(n for result in results for n in result)
    assert every == list(range(1, 2401))  # each increment saw its own value


def test_concurrent_mixed_verbs_on_shared_keys(open_state: Opener) -> None:
    scope = open_state().scope("mixed")

    def job(worker: int) -> None:
        for i in range(100):
            scope.push("queue", [worker, i])
            scope.append("text", "x")
            scope.increment("n", 2)
            scope.set(f"w{worker}", i)

    with ThreadPoolExecutor(6) as pool:
        for future in [pool.submit(job, w) for w in range(6)]:
            future.result(timeout=60)
    assert scope.length("queue") == 600
    assert scope.get("text") == "x" * 600
    assert scope.get("n") == 1200
    assert all(scope.get(f"w{w}") == 99 for w in range(6))
    queue = scope.get("queue")
    for worker in range(6):  # one writer's items keep its order
        assert [i for w, i in queue if w == worker] == list(range(100))


def test_compare_and_swap_admits_one_winner(open_state: Opener) -> None:
    scope = open_state().scope("cas")
    barrier = threading.Barrier(8)

    def claim(worker: int) -> bool:
        barrier.wait(timeout=10)
        return scope.compare_and_swap("owner", reactor.MISSING, worker)

    with ThreadPoolExecutor(8) as pool:
        wins = list(pool.map(claim, range(8)))
    assert wins.count(True) == 1
    assert scope.get("owner") == wins.index(True)


def test_scopes_proceed_in_parallel_and_stay_separate(open_state: Opener) -> None:
    state = open_state()

    def job(name: str) -> None:
        scope = state.scope(name)
        for _ in range(200):
            scope.increment("n")

    names = [f"scope-{i}" for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(job, name) for name in names]:
            future.result(timeout=60)
    assert all(state.scope(name).get("n") == 200 for name in names)
    assert state.scopes() == sorted(names)


def test_touching_2000_scopes_keeps_threads_bounded(open_state: Opener) -> None:
    before = threading.active_count()
    state = open_state(max_actors=8)
    for i in range(2000):
        state.scope(f"s{i}").set("k", i)
    # the actors, and the sweeper, the dispatcher and the follower of other processes
    assert threading.active_count() - before <= 8 + 3
    assert len(state.scopes()) == 2000
    assert state.stats()["actors"] <= 8


def test_a_failing_write_does_not_disturb_its_batch(open_state: Opener) -> None:
    scope = open_state().scope("batch")
    scope.set("text", "not a number")
    barrier = threading.Barrier(6)

    def good(i: int) -> int | float:
        barrier.wait(timeout=10)
        return scope.increment(f"n{i}")

    def bad() -> None:
        barrier.wait(timeout=10)
        with pytest.raises(reactor.TypeMismatchError):
            scope.increment("text")

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(good, i) for i in range(5)] + [pool.submit(bad)]
        for future in futures:
            future.result(timeout=30)
    assert [scope.get(f"n{i}") for i in range(5)] == [1] * 5
    assert scope.get("text") == "not a number"


def test_readers_see_writes_acknowledged_before_they_began(open_state: Opener) -> None:
    state = open_state()
    writer_scope, reader_scope = state.scope("s"), state.scope("s")
    seen: list[int] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            seen.append(reader_scope.get("n", 0))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(1, 300):
            writer_scope.set("n", i)
            assert reader_scope.get("n") == i
    finally:
        done.set()
        thread.join(10)
    assert seen == sorted(seen)  # never goes back in time


def test_operation_timeout_withdraws_a_queued_write(open_state: Opener, db_path: Path) -> None:
    state = open_state(timeout=1.0)  # a loaded machine may stall a write 0.2 s
    engine = engine_of(state)
    scope = state.scope("slow")
    running = engine._mailbox("slow")._running  # type: ignore[attr-defined]
    # As if a batch were running: the write queues for the actor, which cannot start.
    with held_elsewhere(running), pytest.raises(reactor.OperationTimeout, match=r"withdrawn"):
        scope.set("b", 2)
    scope.set("c", 3)
    assert scope.get("c") == 3
    assert scope.get("b") is None  # withdrawn: it never ran


def test_a_writer_held_too_long_is_a_busy_error(open_state: Opener) -> None:
    state = open_state(timeout=1.0)  # a loaded machine may stall a write 0.2 s
    scope = state.scope("s")
    gate = engine_of(state).store._gate  # type: ignore[attr-defined]
    with held_elsewhere(gate), pytest.raises(reactor.BusyError):
        scope.set("a", 1)
    assert scope.get("a") is None
    scope.set("a", 2)
    assert scope.get("a") == 2
