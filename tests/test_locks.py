"""Locks: leases with fencing tokens, across threads and processes (SPEC §6)."""

from __future__ import annotations

import itertools
import json
import math
import os
import resource
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
from reactor.testing import ManualClock


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- try-lock, timeouts, waking up ----------------------------------------------------


def test_try_lock_succeeds_then_fails_for_a_second_holder(state: reactor.State) -> None:
    first = state.lock("deploy", ttl=30)
    second = state.lock("deploy", ttl=30)
    assert first.acquire(blocking=False) is True
    assert first.held()
    assert second.acquire(blocking=False) is False
    assert not second.held()
    assert second.acquire(timeout=0) is False
    # Another name is another lock.
    other = state.lock("backup", ttl=30)
    assert other.acquire(blocking=False) is True
    first.release()
    assert not first.held()
    assert second.acquire(blocking=False) is True
    assert second.held()
    second.release()
    other.release()


def test_acquire_with_timeout_gives_up_while_held(state: reactor.State) -> None:
    holder = state.lock("deploy", ttl=30)
    assert holder.acquire(blocking=False)
    waiter = state.lock("deploy", ttl=30)
    started = time.monotonic()
    assert waiter.acquire(timeout=0.2) is False
    elapsed = time.monotonic() - started
    assert 0.19 <= elapsed < 2.0
    assert holder.held()
    assert not waiter.held()
    holder.release()


def test_a_waiter_gets_the_lock_promptly_when_the_holder_releases(
    state: reactor.State,
) -> None:
    holder = state.lock("deploy", ttl=30)
    assert holder.acquire(blocking=False)
    waiter = state.lock("deploy", ttl=30)
    waiting = threading.Event()
    outcome: dict[str, object] = {}

    def wait() -> None:
        waiting.set()
        outcome["acquired"] = waiter.acquire(timeout=10)
        outcome["at"] = time.monotonic()

    thread = threading.Thread(target=wait)
    thread.start()
    assert waiting.wait(5)
    time.sleep(0.1)  # let it block
    assert thread.is_alive(), "the waiter should still be waiting while the lock is held"
    released_at = time.monotonic()
    holder.release()
    thread.join(5)
    assert not thread.is_alive()
    assert outcome["acquired"] is True
    assert outcome["at"] - released_at < 1.0  # type: ignore[operator]
    assert waiter.held()
    waiter.release()


# -- leases and the injected clock ---------------------------------------------------


def test_an_expired_lease_can_be_taken_and_the_stale_holder_loses_it(
    state: reactor.State, clock: ManualClock
) -> None:
    stale = state.lock("deploy", ttl=10)
    fresh = state.lock("deploy", ttl=10)
    assert stale.acquire(blocking=False)
    clock.advance(9.5)
    assert stale.held()
    assert not fresh.acquire(blocking=False)
    clock.advance(1)  # past the deadline
    assert not stale.held()
    assert fresh.acquire(blocking=False)
    assert fresh.held()
    assert not stale.held()
    with pytest.raises(reactor.LockNotOwnedError):
        stale.release()
    with pytest.raises(reactor.LockNotOwnedError):
        stale.extend()
    with pytest.raises(reactor.LockNotOwnedError):
        stale.extend(30)
    # The stale holder's attempts did not disturb the new holder.
    assert fresh.held()
    fresh.release()


def test_an_expired_lease_nobody_took_cannot_be_released_or_extended(
    state: reactor.State, clock: ManualClock
) -> None:
    lock = state.lock("deploy", ttl=5)
    assert lock.acquire(blocking=False)
    clock.advance(5)  # exactly at the deadline: gone
    assert not lock.held()
    with pytest.raises(reactor.LockNotOwnedError):
        lock.extend()
    with pytest.raises(reactor.LockNotOwnedError):
        lock.release()
    # It can be taken again, by anyone, including the old holder.
    assert lock.acquire(blocking=False)
    lock.release()


def test_extend_pushes_the_deadline(state: reactor.State, clock: ManualClock) -> None:
    lock = state.lock("deploy", ttl=10)
    other = state.lock("deploy", ttl=10)
    assert lock.acquire(blocking=False)  # deadline t0 + 10
    clock.advance(9)
    lock.extend(10)  # deadline t0 + 19
    clock.advance(2)  # t0 + 11: past the old deadline
    assert lock.held()
    assert not other.acquire(blocking=False)
    clock.advance(7.5)  # t0 + 18.5
    assert lock.held()
    lock.extend()  # the lock's own ttl: deadline t0 + 28.5
    clock.advance(9)  # t0 + 27.5
    assert lock.held()
    assert not other.acquire(blocking=False)
    clock.advance(1.5)  # t0 + 29: past it
    assert not lock.held()
    assert other.acquire(blocking=False)
    other.release()


def test_extend_rejects_a_bad_ttl(state: reactor.State) -> None:
    lock = state.lock("deploy", ttl=10)
    assert lock.acquire(blocking=False)
    for bad in (0, -1, math.nan, "x"):
        with pytest.raises(ValueError):  # noqa: PT011 - InvalidArgumentError is a ValueError
            lock.extend(bad)  # type: ignore[arg-type]
    assert lock.held()
    lock.release()


# -- fencing tokens --------------------------------------------------------------------


def test_fencing_tokens_strictly_increase(
    state: reactor.State,
    clock: ManualClock,
    open_state: Callable[..., reactor.State],
) -> None:
    tokens: list[int] = []
    a = state.lock("deploy", ttl=10)
    b = state.lock("deploy", ttl=10)
    assert a.acquire(blocking=False)
    tokens.append(a.token)  # type: ignore[arg-type]
    a.release()
    assert a.acquire(blocking=False)  # the same holder, again
    tokens.append(a.token)  # type: ignore[arg-type]
    a.release()
    assert b.acquire(blocking=False)  # a different holder
    tokens.append(b.token)  # type: ignore[arg-type]
    clock.advance(11)  # b's lease expires without a release
    assert a.acquire(blocking=False)
    tokens.append(a.token)  # type: ignore[arg-type]
    a.release()
    state.close()

    reopened = open_state(clock=clock)
    c = reopened.lock("deploy", ttl=10)
    assert c.acquire(blocking=False)
    tokens.append(c.token)  # type: ignore[arg-type]
    c.release()

    assert all(type(token) is int for token in tokens)
    assert all(earlier < later for earlier, later in itertools.pairwise(tokens))
    # Each name counts on its own.
    other = reopened.lock("backup", ttl=10)
    assert other.acquire(blocking=False)
    assert type(other.token) is int
    other.release()


def test_a_failed_acquire_hands_out_no_token(state: reactor.State) -> None:
    holder = state.lock("deploy", ttl=10)
    assert holder.acquire(blocking=False)
    first = holder.token
    loser = state.lock("deploy", ttl=10)
    for _ in range(3):
        assert not loser.acquire(blocking=False)
    holder.release()
    assert loser.acquire(blocking=False)
    assert loser.token is not None
    assert first is not None
    assert loser.token > first
    # Only one acquisition happened in between: tries that failed did not bump the count.
    assert loser.token == first + 1
    loser.release()


# -- the context manager -----------------------------------------------------------------


def test_with_acquires_and_releases(state: reactor.State) -> None:
    other = state.lock("deploy", ttl=10)
    with state.lock("deploy", ttl=10, timeout=1) as lock:
        assert isinstance(lock, reactor.Lock)
        assert lock.held()
        assert lock.token is not None
        assert not other.acquire(blocking=False)
        assert state.stats()["locks_held"] == 1
    assert not lock.held()
    assert state.stats()["locks_held"] == 0
    assert other.acquire(blocking=False)
    other.release()


def test_with_releases_when_the_body_raises(state: reactor.State) -> None:
    lock = state.lock("deploy", ttl=10, timeout=1)
    with pytest.raises(KeyError), lock:
        raise KeyError("boom")
    assert not lock.held()
    other = state.lock("deploy", ttl=10)
    assert other.acquire(blocking=False)
    other.release()


def test_with_raises_lock_timeout_when_held_elsewhere(state: reactor.State) -> None:
    holder = state.lock("deploy", ttl=10)
    assert holder.acquire(blocking=False)
    ran = False
    started = time.monotonic()
    with pytest.raises(reactor.LockTimeout), state.lock("deploy", ttl=10, timeout=0.1):
        ran = True
    assert time.monotonic() - started < 2.0
    assert not ran
    assert issubclass(reactor.LockTimeout, TimeoutError)
    assert holder.held()  # the failed `with` did not release someone else's lease
    holder.release()


def test_with_on_an_expired_lease_raises_on_a_clean_exit(
    state: reactor.State, clock: ManualClock
) -> None:
    with pytest.raises(reactor.LockNotOwnedError), state.lock("deploy", ttl=5, timeout=1):
        clock.advance(6)


def test_with_on_an_expired_lease_keeps_the_body_error(
    state: reactor.State, clock: ManualClock
) -> None:
    lock = state.lock("deploy", ttl=5, timeout=1)

    def body() -> None:
        with lock:
            clock.advance(6)
            raise KeyError("the body's own error")

    with pytest.raises(KeyError):
        body()
    assert not lock.held()


# -- misuse ------------------------------------------------------------------------------


def test_release_by_a_holder_that_never_acquired_raises(state: reactor.State) -> None:
    never = state.lock("deploy", ttl=10)
    with pytest.raises(reactor.LockNotOwnedError):
        never.release()  # nobody ever took the name
    with pytest.raises(reactor.LockNotOwnedError):
        never.extend()
    holder = state.lock("deploy", ttl=10)
    assert holder.acquire(blocking=False)
    with pytest.raises(reactor.LockNotOwnedError):
        never.release()  # someone else's
    with pytest.raises(reactor.LockNotOwnedError):
        never.extend()
    assert holder.held()  # untouched
    holder.release()
    with pytest.raises(reactor.LockNotOwnedError):
        holder.release()  # twice


def test_a_lock_is_not_reentrant(state: reactor.State) -> None:
    lock = state.lock("deploy", ttl=10)
    assert lock.acquire(blocking=False)
    with pytest.raises(reactor.ReentrancyError):
        lock.acquire(blocking=False)
    started = time.monotonic()
    with pytest.raises(reactor.ReentrancyError):
        lock.acquire(timeout=5)  # raises at once instead of waiting on itself
    with pytest.raises(reactor.ReentrancyError):
        lock.acquire()
    assert time.monotonic() - started < 2.0
    with pytest.raises(reactor.ReentrancyError), lock:
        pass
    assert lock.held()  # the refused attempts did not release it
    lock.release()
    assert lock.acquire(blocking=False)  # after a release it can be taken again
    lock.release()


@pytest.mark.parametrize("name", ["", 5, None, b"deploy", ["deploy"]])
def test_bad_lock_names_are_refused(state: reactor.State, name: object) -> None:
    with pytest.raises(reactor.InvalidKeyError):
        state.lock(name, ttl=10)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "ttl",
    [
        0,
        -1,
        math.nan,
        "x",
        None,
    ],
)
def test_bad_ttls_are_refused(state: reactor.State, ttl: object) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - InvalidArgumentError is a ValueError
        state.lock("deploy", ttl=ttl)  # type: ignore[arg-type]


# -- mutual exclusion --------------------------------------------------------------------


def test_four_threads_are_mutually_exclusive(state: reactor.State) -> None:
    threads, rounds = 4, 25
    counter = 0
    tokens: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(threads, timeout=10)

    def work() -> None:
        nonlocal counter
        try:
            lock = state.lock("counter", ttl=60)
            start.wait()
            for _ in range(rounds):
                assert lock.acquire(timeout=10), "could not acquire within 10 s"
                try:
                    tokens.append(lock.token)  # type: ignore[arg-type]
                    seen = counter
                    time.sleep(0.001)  # a window for a lost update, were two inside
                    counter = seen + 1
                finally:
                    lock.release()
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert not any(worker.is_alive() for worker in workers)
    assert not errors, errors
    assert counter == threads * rounds
    assert len(tokens) == threads * rounds
    assert len(set(tokens)) == len(tokens)
    assert tokens == sorted(tokens)  # in acquisition order
    assert state.stats()["locks_held"] == 0


LOCKED_INCREMENTER = """
    import json, sys, time, reactor
    path, rounds = sys.argv[1], int(sys.argv[2])
    tokens = []
    with reactor.open(path) as state:
        scope = state.scope("s")
        lock = state.lock("counter", ttl=30)
        for _ in range(rounds):
            if not lock.acquire(timeout=30):
                sys.exit("could not acquire within 30 s")
            try:
                tokens.append(lock.token)
                seen = scope.get("n")
                time.sleep(0.002)
                scope.set("n", seen + 1)
            finally:
                lock.release()
    print(json.dumps(tokens))
"""


def test_three_processes_are_mutually_exclusive(
    open_state: Callable[..., reactor.State], db_path: Path
) -> None:
    state = open_state()  # the real clock, as the workers use
    state.scope("s").set("n", 0)
    rounds = 20
    workers = [_python(LOCKED_INCREMENTER, str(db_path), str(rounds)) for _ in range(3)]
    all_tokens: list[int] = []
    for worker in workers:
        try:
            out, err = worker.communicate(timeout=60)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(5)
        assert worker.returncode == 0, err
        tokens = json.loads(out)
        assert len(tokens) == rounds
        assert tokens == sorted(tokens)
        assert len(set(tokens)) == rounds
        all_tokens.extend(tokens)
    assert state.scope("s").get("n") == 3 * rounds
    assert len(set(all_tokens)) == len(all_tokens) == 3 * rounds
    assert state.stats()["locks_held"] == 0


HOLDER = """
    import sys, time, reactor
    state = reactor.open(sys.argv[1])
    lock = state.lock("deploy", ttl=1)
    before = time.time()
    if not lock.acquire(timeout=10):
        sys.exit("could not acquire")
    print(before, flush=True)
    time.sleep(60)
"""


def test_a_killed_holder_s_lease_runs_out(
    open_state: Callable[..., reactor.State], db_path: Path
) -> None:
    state = open_state()  # the real clock: the lease runs out in real time
    state.scope("s").set("ready", True)  # the file exists before the child opens it
    holder = _python(HOLDER, str(db_path))
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(holder.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(30)
        assert lines, "the holder did not report within 30 s"
        assert lines[0].strip(), holder.stderr.read() if holder.poll() is not None else ""  # type: ignore[union-attr]
        acquired_before = float(lines[0])
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(5)
        killed_at = time.monotonic()
        lock = state.lock("deploy", ttl=5)
        if time.time() < acquired_before + 0.8:  # only meaningful while surely unexpired
            assert not lock.acquire(blocking=False), "a killed holder's lease ended early"
        assert lock.acquire(timeout=5)
        taken = time.time()
        assert time.monotonic() - killed_at < 3.0
        assert taken >= acquired_before + 1.0  # not before the TTL ran out
        assert lock.held()
        lock.release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(5)
        for stream in (holder.stdout, holder.stderr):
            if stream is not None:
                stream.close()


# -- stats, idle waiting, closing ------------------------------------------------------


def test_stats_count_held_leases(state: reactor.State, clock: ManualClock) -> None:
    assert state.stats()["locks_held"] == 0
    a = state.lock("a", ttl=10)
    b = state.lock("b", ttl=20)
    b_again = state.lock("b", ttl=20)
    assert a.acquire(blocking=False)
    assert state.stats()["locks_held"] == 1
    assert b.acquire(blocking=False)
    assert state.stats()["locks_held"] == 2
    assert not b_again.acquire(blocking=False)  # a failed try holds nothing
    assert state.stats()["locks_held"] == 2
    a.release()
    assert state.stats()["locks_held"] == 1
    clock.advance(21)  # b expires
    assert state.stats()["locks_held"] == 0


def test_waiting_does_not_spin_the_cpu(state: reactor.State) -> None:
    holder = state.lock("deploy", ttl=30)
    assert holder.acquire(blocking=False)
    waiter = state.lock("deploy", ttl=30)
    cpu_before, wall_before = _cpu_seconds(), time.monotonic()
    assert waiter.acquire(timeout=1.0) is False
    cpu, wall = _cpu_seconds() - cpu_before, time.monotonic() - wall_before
    assert wall >= 0.95
    assert cpu < 0.5, f"waiting {wall:.2f} s used {cpu:.2f} s of CPU"
    holder.release()


def test_close_ends_a_blocked_acquire(state: reactor.State) -> None:
    holder = state.lock("deploy", ttl=30)
    assert holder.acquire(blocking=False)
    waiter = state.lock("deploy", ttl=30)
    waiting = threading.Event()
    outcome: list[object] = []

    def wait() -> None:
        waiting.set()
        try:
            outcome.append(waiter.acquire())  # no timeout: until free or closed
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    assert waiting.wait(5)
    time.sleep(0.1)  # let it block
    assert thread.is_alive()
    closed_at = time.monotonic()
    state.close()
    thread.join(5)
    assert not thread.is_alive(), "a blocked acquire outlived close()"
    assert time.monotonic() - closed_at < 2.0
    assert len(outcome) == 1
    assert isinstance(outcome[0], reactor.ClosedError), outcome
    with pytest.raises(reactor.ClosedError):
        state.lock("deploy", ttl=30)
