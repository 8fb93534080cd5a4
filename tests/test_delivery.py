"""Delivery of every committed change (SPEC §1, §3, §7): regression tests for what an
outside campaign found, each failing on the code before its fix.

Another process's large commit, a failed read of the log, compaction overtaking a
replay, a callback raising another handle's ``ClosedError``, TTL-only changes of
another process inside a transaction, expiry of many keys at once, and close() with
stuck subscribers.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import reactor
from reactor.errors import StorageError
from reactor.testing import ManualClock, run_upkeep
from tests.conftest import crowding, engine_of, wait_for


def child(db: Any, code: str, *args: str, timeout: float = 120) -> str:
    """Run ``code`` in another Python process (``db`` and ``args`` in ``sys.argv``);
    return what it printed. Fails the test if the process fails."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), str(db), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


class HeldFollower:
    """Keeps an engine's follower from looking at other processes' commits until
    released: this process then meets them first through its own next commit."""

    def __init__(self, engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self._gate = threading.Event()
        self._entered = threading.Event()
        real = engine.store.await_commits

        def held(timeout: float) -> int | None:
            self._entered.set()
            self._gate.wait(60)
            return real(timeout)

        monkeypatch.setattr(engine.store, "await_commits", held)
        assert self._entered.wait(5), "the follower never looked"

    def release(self) -> None:
        self._gate.set()


@pytest.fixture
def held_follower(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., HeldFollower]]:
    made: list[HeldFollower] = []

    def hold(state: reactor.State) -> HeldFollower:
        held = HeldFollower(engine_of(state), monkeypatch)
        made.append(held)
        return held

    yield hold
    for held in made:
        held.release()


def fail_log_reads(engine: Any, monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    """Make the next ``times`` reads of the change log fail; the list counts down."""
    left = [times]
    real = engine.store.log_after

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if left[0] > 0:
            left[0] -= 1
            raise StorageError("injected: the database is busy or the connection lost")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.store, "log_after", flaky)
    return left


SET_MANY = """
    import sys, reactor
    with reactor.open(sys.argv[1]) as state:
        count = int(sys.argv[2])
        state.scope("remote").set_many({f"k{i:05}": i for i in range(count)})
"""


def test_a_large_commit_of_another_process_reaches_every_consumer(
    open_state: Callable[..., reactor.State], db_path: Any, held_follower: Any
) -> None:
    state = open_state()
    state.scope("local").set("start", 0)
    start = state.stats()["revision"]
    seen: list[int] = []
    signalled: list[int] = []
    state.subscribe(lambda event: seen.append(event.revision))
    watch = state.watch()

    def on_signal(_sender: str, event: reactor.ChangeEvent) -> None:
        signalled.append(event.revision)

    reactor.signals.changed.connect(on_signal)
    try:
        held = held_follower(state)
        child(db_path, SET_MANY, "2500")
        state.scope("local").set("after", 1)  # meets the 2,500 changes first
        expected = list(range(start + 1, start + 2502))
        wait_for(lambda: len(seen) >= 2501 and len(signalled) >= 2501, timeout=20)
        held.release()
        got = [next(watch).revision for _ in range(2501)]
        watch.close()
        assert seen == expected
        assert signalled == expected
        assert got == expected
    finally:
        reactor.signals.changed.disconnect(on_signal)


def test_a_failed_read_of_the_log_is_tried_again_without_a_new_write(
    open_state: Callable[..., reactor.State], db_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = open_state()
    engine = engine_of(state)
    seen: list[str] = []
    state.subscribe(lambda event: seen.append(event.key))
    failures = fail_log_reads(engine, monkeypatch, 3)
    child(db_path, SET_MANY, "3")
    wait_for(lambda: len(seen) == 3, timeout=10)  # no write of this process helps
    assert seen == ["k00000", "k00001", "k00002"]
    assert failures == [0]


def test_a_failed_read_at_this_process_commit_is_caught_up_by_the_follower(
    open_state: Callable[..., reactor.State],
    db_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    held_follower: Any,
) -> None:
    state = open_state()
    engine = engine_of(state)
    seen: list[str] = []
    state.subscribe(lambda event: seen.append(event.key))
    held = held_follower(state)
    child(db_path, SET_MANY, "1500")
    fail_log_reads(engine, monkeypatch, 1)
    state.scope("local").set("after", 1)  # its read of the 1,500 fails
    held.release()
    wait_for(lambda: len(seen) == 1501, timeout=10)
    assert seen == [f"k{i:05}" for i in range(1500)] + ["after"]


# -- compaction against replays ------------------------------------------------------
def _fill(state: reactor.State, count: int) -> int:
    scope = state.scope("log")
    for start in range(0, count, 500):
        scope.set_many({f"k{i}": i for i in range(start, min(count, start + 500))})
    return state.stats()["revision"]


def test_a_watch_overtaken_by_compaction_raises_instead_of_skipping(
    open_state: Callable[..., reactor.State],
) -> None:
    state = open_state(log_retention=100)
    last = _fill(state, 3000)
    watch = state.watch(since=engine_of(state).store.compacted())
    first = next(watch)  # the replay has begun: a page is read
    run_upkeep(state)  # keeps only the newest 100
    revisions = [first.revision]
    with pytest.raises(reactor.RevisionCompactedError):
        for event in watch:
            revisions.append(event.revision)
            if event.revision == last:
                break
    assert revisions == list(range(revisions[0], revisions[-1] + 1)), "a gap was skipped"
    watch.close()


def test_a_subscription_overtaken_by_compaction_stops_and_says_so(
    open_state: Callable[..., reactor.State],
) -> None:
    state = open_state(log_retention=100)
    _fill(state, 3000)
    gate = threading.Event()
    seen: list[int] = []

    def slow(event: reactor.ChangeEvent) -> None:
        gate.wait(10)
        seen.append(event.revision)

    before = state.stats()["events"]["failed"]
    sub = state.subscribe(slow, since=0)
    run_upkeep(state)
    gate.set()
    wait_for(lambda: sub.closed, timeout=10)
    assert isinstance(sub.error, reactor.RevisionCompactedError)
    assert seen == list(range(1, len(seen) + 1)), "a gap was skipped"
    assert len(seen) < 3000
    assert state.stats()["events"]["failed"] == before + 1


def test_changes_without_since_returns_what_the_log_retains(
    open_state: Callable[..., reactor.State],
) -> None:
    state = open_state(log_retention=100)
    last = _fill(state, 1000)
    run_upkeep(state)
    retained = state.changes()
    assert [event.revision for event in retained] == list(range(last - 99, last + 1))
    assert [event.revision for event in state.changes(limit=3)] == [
        last - 99,
        last - 98,
        last - 97,
    ]
    with pytest.raises(reactor.RevisionCompactedError):
        state.changes(since=0)


def test_a_durable_name_cannot_start_behind_compaction(
    open_state: Callable[..., reactor.State],
) -> None:
    state = open_state(log_retention=100)
    _fill(state, 1000)
    run_upkeep(state)
    with pytest.raises(reactor.RevisionCompactedError):
        state.subscribe(lambda _event: None, since=5, durable="late")
    assert "late" not in state.stats()["durable_subscribers"]


# -- a callback's own ClosedError --------------------------------------------------
@pytest.mark.parametrize("durable", [None, "billing"])
def test_a_callback_raising_closed_error_of_another_handle_goes_on(
    open_state: Callable[..., reactor.State], durable: str | None
) -> None:
    state = open_state()
    other = reactor.open(":memory:")
    other.close()
    seen: list[str] = []

    def callback(event: reactor.ChangeEvent) -> None:
        seen.append(event.key)
        if event.key == "first":
            other.scope("x").get("k")  # raises ClosedError: the callback's own error

    before = state.stats()["events"]["failed"]
    sub = state.subscribe(callback, durable=durable, max_retries=0)
    scope = state.scope("s")
    scope.set("first", 1)
    scope.set("second", 2)
    wait_for(lambda: "second" in seen)
    assert not sub.closed
    assert state.stats()["events"]["failed"] == before + 1


# -- TTL-only changes of another process, inside a transaction ------------------------
EXPIRE_NONE = """
    import sys, reactor
    with reactor.open(sys.argv[1]) as state:
        print(state.scope("s").expire("k", None))
"""
SAME_VALUE_NEW_TTL = """
    import sys, reactor
    with reactor.open(sys.argv[1]) as state:
        print(state.scope("s").set("k", 1, ttl=100))
"""


@pytest.mark.parametrize(
    ("setup_ttl", "code", "kept"),
    [(100, EXPIRE_NONE, -1.0), (None, SAME_VALUE_NEW_TTL, 100.0)],
    ids=["expire-none", "same-value-new-ttl"],
)
def test_a_transaction_never_undoes_another_process_ttl_only_change(
    open_state: Callable[..., reactor.State],
    db_path: Any,
    setup_ttl: float | None,
    code: str,
    kept: float,
) -> None:
    state = open_state()
    scope = state.scope("s")
    scope.set("k", 1, ttl=setup_ttl)
    with pytest.raises(reactor.ConflictError), scope.transaction() as tx:
        assert tx.get("k") == 1
        child(db_path, code)
        tx.set("k", 1, keep_ttl=True)
        tx.set("other", 2)
    left = scope.ttl("k")
    assert left == kept if kept < 0 else 90 < left <= kept
    assert scope.get("other") is None


def test_a_transaction_that_read_nothing_of_the_key_keeps_the_ttl_change(
    open_state: Callable[..., reactor.State], db_path: Any
) -> None:
    state = open_state()
    scope = state.scope("s")
    scope.set("k", 1, ttl=100)
    with scope.transaction() as tx:
        tx.set("other", 2)
        child(db_path, EXPIRE_NONE)
    assert scope.ttl("k") == -1
    assert scope.get("other") == 2


def test_a_ttl_set_inside_a_long_transaction_counts_from_its_commit(
    open_state: Callable[..., reactor.State], clock: ManualClock
) -> None:
    # The fake clock: on the real one, a stall of this process between the commit and
    # the checks below (0.2 s of slack) expired the key or shortened its ttl.
    state = open_state(clock=clock)
    scope = state.scope("s")
    with scope.transaction() as tx:
        tx.set("k", 1, ttl=10)
        tx.set("kept", 1)
        clock.advance(20)  # longer than the ttl
    assert scope.get("k") == 1  # not expired at commit
    assert 9 < scope.ttl("k") <= 10


# -- expiry on time ------------------------------------------------------------------
def test_twenty_thousand_keys_sharing_a_deadline_expire_within_a_second(
    open_state: Callable[..., reactor.State],
) -> None:
    """Within a second, on a machine that writes the 20,000 keys in less than that: the
    bound grows with the time their writes took (CI beside two CPU burners saw 1.1 s;
    an expiry is a write of the same rows), or with how crowded the machine is. Quiet,
    they are written in about 0.4 s."""
    state = open_state()
    arrivals: list[float] = []
    state.subscribe(lambda _event: arrivals.append(time.monotonic()), events={"expired"})
    scope = state.scope("cache")
    started = time.monotonic()
    for start in range(0, 20_000, 5000):
        scope.set_many({f"k{i}": i for i in range(start, start + 5000)}, ttl=3.0)
    deadline = time.monotonic() + 3.0  # every key's deadline is before this
    writing = time.monotonic() - started
    wait_for(lambda: len(arrivals) == 20_000, timeout=30)
    late = max(arrivals) - deadline
    print(f"20,000 keys: the last expired event came {late:.3f} s after the deadline")
    crowded = crowding()
    assert late < max(crowded, 1.5 * writing), f"written in {writing:.3f} s, crowding {crowded:.2f}"
    assert scope.keys() == []


def test_keys_expire_on_time_while_another_scope_runs_a_long_transaction(
    open_state: Callable[..., reactor.State],
) -> None:
    state = open_state()
    arrivals: dict[str, float] = {}
    state.subscribe(
        lambda event: arrivals.setdefault(event.key, time.monotonic()), events={"expired"}
    )
    held = state.scope("held")
    # Due while held: 1.5 s leaves room for a stall before the transaction below takes
    # the scope (with 0.2 s, a stall there let them expire first).
    held.set_many({f"h{i}": i for i in range(2000)}, ttl=1.5)
    held_due = time.monotonic() + 1.5  # every h key's deadline is before this
    others = [state.scope(f"free-{n}") for n in range(8)]  # some share its actor
    with held.transaction() as tx:
        tx.set("x", 1)
        for n, scope in enumerate(others):
            scope.set(f"f{n}", n, ttl=0.5)
        deadline = time.monotonic() + 0.5
        wait_for(lambda: all(f"f{n}" in arrivals for n in range(8)), timeout=5)
        late = max(arrivals[f"f{n}"] for n in range(8)) - deadline
        time.sleep(max(0.0, held_due + 1.0 - time.monotonic()))  # past "within a second"
        assert not any(key.startswith("h") for key in arrivals)  # the held scope waits
    print(f"keys of free scopes expired {late:.3f} s after their deadline")
    assert late < 1.0
    wait_for(lambda: sum(key.startswith("h") for key in arrivals) == 2000, timeout=10)


# -- close() with stuck subscribers --------------------------------------------------
def test_close_waits_for_stuck_subscribers_once_not_one_after_another(
    open_state: Callable[..., reactor.State],
) -> None:
    state = open_state()
    release = threading.Event()
    started = threading.Barrier(7, timeout=10)

    def stuck(_event: reactor.ChangeEvent) -> None:
        if release.is_set():  # the buffered event, once released: the barrier is done
            return
        started.wait()
        release.wait(60)

    subs = [state.subscribe(stuck) for _ in range(6)]
    state.scope("s").set("k", 1)
    state.scope("s").set("k", 2)  # buffered behind the stuck callbacks
    started.wait()
    began = time.monotonic()
    state.close()
    took = time.monotonic() - began
    release.set()
    for sub in subs:
        sub.join(10)
    print(f"close() with six stuck subscribers took {took:.2f} s")
    assert took < 8.0  # 5 s in all, not 5 s each


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("CRITICAL", logger="reactor")
