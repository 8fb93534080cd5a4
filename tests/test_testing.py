"""``reactor.testing``: the manual clock, ``run_upkeep`` (each chore's count, on both
backends), its re-entrancy error, and the ``sweep_interval`` option it goes with."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import reactor
import reactor.aio
from reactor import ops
from reactor.testing import ManualClock, Upkeep, run_upkeep, run_upkeep_async
from tests.conftest import wait_for

Opener = Callable[..., reactor.State]
LONG = 1e6  # a sweep interval that leaves the upkeep to the test


@pytest.fixture
def quiet(open_state: Opener, clock: ManualClock) -> reactor.State:
    """A handle on the test's database whose background sweeper never goes round."""
    return open_state(clock=clock, sweep_interval=LONG)


# -- ManualClock -------------------------------------------------------------------
def test_the_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock()
    assert clock.time() == 1_700_000_000.0
    clock.advance(1.5)
    assert clock.time() == 1_700_000_001.5
    clock.advance(-0.5)
    assert clock.time() == 1_700_000_001.0
    clock.set(42)
    assert clock.time() == 42.0
    assert isinstance(clock.time(), float)
    assert ManualClock(start=10).time() == 10.0
    assert repr(ManualClock(start=3)) == "ManualClock(3.0)"


def test_the_manual_clock_is_a_clock_and_safe_across_threads() -> None:
    clock: reactor.Clock = ManualClock(start=0)
    assert isinstance(clock, ManualClock)

    def tick() -> None:
        for _ in range(1000):
            clock.advance(1)

    threads = [threading.Thread(target=tick) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert clock.time() == 4000.0


def test_the_manual_clock_is_the_engine_s_time(quiet: reactor.State, clock: ManualClock) -> None:
    scope = quiet.scope("s")
    scope.set("k", 1, ttl=10)
    entry = scope.entry("k")
    assert entry is not None
    assert entry.expires_at == clock.time() + 10
    clock.set(clock.time() + 9.5)
    assert scope.ttl("k") == pytest.approx(0.5)
    clock.advance(0.5)
    assert scope.get("k") is None  # absent at the deadline, before any upkeep


def test_the_public_names() -> None:
    assert reactor.testing.__all__ == ["ManualClock", "Upkeep", "run_upkeep", "run_upkeep_async"]
    for name in reactor.testing.__all__:
        assert getattr(reactor.testing, name).__module__ == "reactor.testing"
    assert dataclasses.is_dataclass(Upkeep)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Upkeep().keys_expired = 1  # type: ignore[misc]
    assert Upkeep() == Upkeep(0, 0, 0, 0, 0)


# -- run_upkeep: each chore ------------------------------------------------------------
def test_nothing_due_nothing_done(quiet: reactor.State) -> None:
    quiet.scope("s").set("k", 1, ttl=60)
    assert run_upkeep(quiet) == Upkeep()


def test_it_expires_the_keys_past_their_deadline(quiet: reactor.State, clock: ManualClock) -> None:
    scope = quiet.scope("s")
    scope.set_many({"a": 1, "b": 2, "c": 3}, ttl=10)
    quiet.scope("t").set("d", 4, ttl=10)
    scope.set("late", 5, ttl=20)
    scope.set("kept", 6)
    seen: list[reactor.ChangeEvent] = []
    quiet.subscribe(seen.append, events="expired")
    clock.advance(10)
    assert run_upkeep(quiet) == Upkeep(keys_expired=4)
    assert run_upkeep(quiet) == Upkeep()  # once
    for name, key in [("s", "a"), ("s", "b"), ("s", "c"), ("t", "d")]:
        assert quiet.scope(name).history(key)[-1].type == "expired"
    assert [event.type for event in scope.history("late")] == ["created"]
    assert scope.get("kept") == 6
    wait_for(lambda: len(seen) == 4)  # published, as the sweeper's would be
    assert quiet.stats()["keys_expired"] == 4


def test_it_expires_more_keys_than_one_look_finds(quiet: reactor.State, clock: ManualClock) -> None:
    many = 5_001  # the sweeper finds 5,000 at a time
    quiet.scope("s").set_many({f"k{n}": n for n in range(many)}, ttl=1)
    clock.advance(1)
    assert run_upkeep(quiet).keys_expired == many
    assert quiet.scope("s").keys() == []


def test_it_fires_the_timers_that_are_due(quiet: reactor.State, clock: ManualClock) -> None:
    scope = quiet.scope("s")
    scope.schedule("once", value="done", after=60)
    scope.schedule("beat", ops=[ops.increment("n")], every=10)
    scope.schedule("later", value=1, after=61)
    clock.advance(60)  # six periods of the beat: it fires once (no flood)
    assert run_upkeep(quiet) == Upkeep(timers_fired=2)
    assert scope.get("once") == "done"
    assert scope.get("beat") == {"n": 1}
    assert scope.get("later") is None
    assert sorted(timer.key for timer in quiet.timers()) == ["beat", "later"]
    clock.advance(10)
    assert run_upkeep(quiet) == Upkeep(timers_fired=2)  # the beat's next period, and later
    assert scope.get("beat") == {"n": 2}
    assert quiet.stats()["timers"]["fired"] == 4


def test_it_counts_the_timers_whose_write_failed(quiet: reactor.State, clock: ManualClock) -> None:
    scope = quiet.scope("s")
    scope.set("text", "not a number")
    scope.schedule("text", ops=[ops.increment("n")], after=1)
    scope.schedule("fine", value=1, after=1)
    clock.advance(1)
    assert run_upkeep(quiet) == Upkeep(timers_fired=2, timers_failed=1)  # as stats() counts
    assert quiet.timers() == []  # the failed one is dropped
    assert scope.get("text") == "not a number"
    assert quiet.stats()["timers"] == {"pending": 0, "fired": 2, "failed": 1}


def test_it_turns_back_the_leases_that_ran_out(quiet: reactor.State, clock: ManualClock) -> None:
    jobs = quiet.queue("jobs", max_attempts=2)
    for n in range(3):
        jobs.put(n)
    taken = [jobs.take(timeout=0, lease=30) for _ in range(3)]
    assert all(job is not None for job in taken)
    clock.advance(29)
    assert run_upkeep(quiet) == Upkeep()
    clock.advance(1)
    assert run_upkeep(quiet) == Upkeep(leases_turned_back=3)
    assert jobs.stats()["ready"] == 3
    for _ in range(3):
        job = jobs.take(timeout=0, lease=30)
        assert job is not None
        assert job.attempts == 2
    clock.advance(30)  # their last attempt: dead letters
    assert run_upkeep(quiet) == Upkeep(leases_turned_back=3)
    assert jobs.stats()["dead"] == 3


def test_it_compacts_the_log(open_state: Opener, clock: ManualClock) -> None:
    state = open_state(clock=clock, sweep_interval=LONG, log_retention=10)
    for _ in range(25):
        state.scope("s").increment("n")
    assert run_upkeep(state) == Upkeep(log_compacted=15)
    assert run_upkeep(state) == Upkeep()
    with pytest.raises(reactor.RevisionCompactedError):
        state.scope("s").get("n", at_revision=1)


def test_it_compacts_the_log_by_age(open_state: Opener, clock: ManualClock) -> None:
    state = open_state(clock=clock, sweep_interval=LONG, log_retention_seconds=60)
    for _ in range(5):
        state.scope("s").increment("n")
    clock.advance(61)
    state.scope("s").increment("n")
    assert run_upkeep(state).log_compacted == 5


def test_everything_due_is_done_on_return_with_the_sweeper_going_too(
    open_state: Opener, clock: ManualClock
) -> None:
    """The background sweeper may take some of it first; on return, all is done."""
    state = open_state(clock=clock, sweep_interval=0.01)
    scope = state.scope("s")
    for round_ in range(5):
        scope.set_many({f"k{round_}-{n}": n for n in range(50)}, ttl=1)
        scope.schedule(f"t{round_}", value=round_, after=1)
        clock.advance(1)
        run_upkeep(state)
        assert scope.keys() == sorted(f"t{n}" for n in range(round_ + 1))
        assert all(scope.history(f"k{round_}-{n}")[-1].type == "expired" for n in range(50))
        assert state.timers() == []


# -- when it raises ----------------------------------------------------------------
def test_in_a_transaction_body_it_raises_instead_of_waiting(
    quiet: reactor.State, clock: ManualClock
) -> None:
    scope = quiet.scope("s")
    scope.set("k", 1, ttl=1)
    quiet.scope("b").schedule("t", value=1, after=1)
    clock.advance(1)
    with scope.transaction() as tx:  # a key of "s" is due
        tx.set("k2", 2)
        with pytest.raises(reactor.ReentrancyError, match="key of scope 's'"):
            run_upkeep(quiet)
        tx.set("k3", 3)
    with quiet.transaction("a", "b") as multi:  # a timer of "b" is due
        multi["a"].set("k", 1)
        with pytest.raises(reactor.ReentrancyError, match="timer of scope 'b'"):
            run_upkeep(quiet)
    assert scope.get("k3") == 3  # the bodies went on
    assert quiet.scope("a").get("k") == 1
    assert quiet.scope("b").get("t") is None  # nothing of the refused round was done
    assert run_upkeep(quiet) == Upkeep(timers_fired=1)  # after the body; "k" was
    assert scope.get("k") is None  # rewritten by the body's commit: expired there


def test_in_a_body_it_raises_for_what_the_sweeper_sent_there_too(
    open_state: Opener, clock: ManualClock
) -> None:
    """The sweeper's own request for a held scope waits for the body: run_upkeep must
    not wait for it (up to the timeout) either."""
    state = open_state(clock=clock, sweep_interval=0.01, timeout=60)
    scope = state.scope("s")
    scope.set("k", 1, ttl=1)
    with scope.transaction() as tx:
        tx.set("other", 1)
        clock.advance(1)
        time.sleep(0.2)  # rounds of the sweeper: k's expiry is sent, deferred behind us
        started = time.monotonic()
        with pytest.raises(reactor.ReentrancyError):
            run_upkeep(state)
        assert time.monotonic() - started < 5
    wait_for(lambda: scope.history("k")[-1].type == "expired")


def test_in_a_transaction_body_with_nothing_due_there_it_runs(
    open_state: Opener, clock: ManualClock
) -> None:
    state = open_state(clock=clock, sweep_interval=LONG, log_retention=2)
    scope = state.scope("s")
    for n in range(5):
        scope.set("n", n)
    state.scope("other").set("k", 1, ttl=1)
    clock.advance(1)
    with scope.transaction() as tx:
        tx.set("n", 5)
        # 7 records (the expiry's too), 2 kept
        assert run_upkeep(state) == Upkeep(keys_expired=1, log_compacted=5)


def test_it_runs_where_it_cannot_deadlock(
    quiet: reactor.State, open_state: Opener, clock: ManualClock, tmp_path: Path
) -> None:
    """Only a body on the same database, in the same thread, refuses it."""
    scope = quiet.scope("s")
    scope.set("k", 1, ttl=1)
    clock.advance(1)
    other = open_state(tmp_path / "other.db", clock=clock)
    with other.scope("s").transaction() as tx:  # another database's body
        tx.set("k", 1)
        assert run_upkeep(quiet).keys_expired == 1
    scope.set("k", 1, ttl=1)
    clock.advance(1)
    done: list[Upkeep] = []
    with quiet.scope("h").transaction() as tx:  # another thread's body
        tx.set("held", 1)
        thread = threading.Thread(target=lambda: done.append(run_upkeep(quiet)))
        thread.start()
        thread.join(10)
    assert done == [Upkeep(keys_expired=1)]
    # In a subscriber's callback, which runs on the subscription's own thread.
    called: list[Upkeep] = []
    quiet.subscribe(lambda _: called.append(run_upkeep(quiet)), scope="s", key="go")
    scope.set("go", 1)
    wait_for(lambda: called)
    assert called == [Upkeep()]


def test_a_read_only_or_closed_handle_or_another_object_is_refused(
    db_path: Any, open_state: Opener, clock: ManualClock
) -> None:
    writer = open_state(clock=clock)
    writer.scope("s").set("k", 1)
    writer.close()
    reader = open_state(readonly=True)
    with pytest.raises(reactor.ReadOnlyError):
        run_upkeep(reader)
    reader.close()
    with pytest.raises(reactor.ClosedError):
        run_upkeep(reader)
    with pytest.raises(TypeError, match=r"reactor\.State"):
        run_upkeep(object())  # type: ignore[arg-type]


async def test_the_async_twin_takes_an_async_handle_only(quiet: reactor.State) -> None:
    with pytest.raises(TypeError, match=r"reactor\.aio\.AsyncState"):
        await run_upkeep_async(quiet)  # type: ignore[arg-type]


# -- asyncio -----------------------------------------------------------------------
async def test_the_async_twin(db_path: Any, clock: ManualClock) -> None:
    async with reactor.aio.open(db_path, clock=clock, sweep_interval=LONG) as state:
        scope = state.scope("s")
        await scope.set("k", 1, ttl=5)
        await scope.schedule("t", value=2, after=5)
        clock.advance(5)
        assert await run_upkeep_async(state) == Upkeep(keys_expired=1, timers_fired=1)
        assert await scope.get("t") == 2
        await scope.set("due", 1, ttl=1)
        clock.advance(1)
        async with scope.transaction() as tx:
            await tx.set("k", 3)
            with pytest.raises(reactor.ReentrancyError):
                await run_upkeep_async(state)
            with pytest.raises(reactor.ReentrancyError):
                run_upkeep(await state._sync())  # the sync one, on the loop: also
        assert await run_upkeep_async(state) == Upkeep(keys_expired=1)


# -- sweep_interval ----------------------------------------------------------------
@pytest.mark.parametrize("interval", [0.01, 0.25, 1, 1_000_000])
def test_sweep_interval_takes_numbers_in_its_bounds(open_state: Opener, interval: float) -> None:
    assert open_state(sweep_interval=interval).scope("s").set("k", 1) is not None


@pytest.mark.parametrize("interval", [0, -1, 0.009, 1_000_001, math.nan, math.inf, "1", True, [1]])
def test_sweep_interval_out_of_bounds_is_refused(open_state: Opener, interval: Any) -> None:
    with pytest.raises(reactor.InvalidArgumentError, match="sweep_interval"):
        open_state(sweep_interval=interval)


async def test_sweep_interval_out_of_bounds_is_refused_by_aio_open(db_path: Any) -> None:
    state = reactor.aio.open(db_path, sweep_interval=0)
    with pytest.raises(reactor.InvalidArgumentError, match="sweep_interval"):
        await state.scope("s").get("k")
    await state.close()


def test_sweep_interval_must_match_the_running_engine_s(open_state: Opener) -> None:
    open_state(sweep_interval=5)
    assert open_state(sweep_interval=5) is not None
    with pytest.raises(reactor.InvalidArgumentError, match="sweep_interval=5"):
        open_state(sweep_interval=6)


def test_sweep_interval_is_how_often_the_sweeper_goes_round(
    open_state: Opener, clock: ManualClock, tmp_path: Path
) -> None:
    slow = open_state(clock=clock, sweep_interval=LONG)
    fast = open_state(tmp_path / "fast.db", clock=clock, sweep_interval=0.01)
    for state in (slow, fast):
        state.scope("s").set("k", 1, ttl=1)
    clock.advance(1)
    wait_for(lambda: fast.stats()["keys_expired"] == 1, timeout=10)
    time.sleep(0.5)  # the default interval would have swept twice by now
    assert slow.stats()["keys_expired"] == 0
    assert [event.type for event in slow.scope("s").history("k")] == ["created"]
    assert run_upkeep(slow).keys_expired == 1
