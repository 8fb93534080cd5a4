"""Timers: writes scheduled for later, fired once by one process (SPEC §13)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import reactor
import reactor.aio
from reactor import ops
from reactor.testing import ManualClock, run_upkeep
from tests.conftest import CLI_ON_SQLITE, engine_of

from .conftest import crowding, raw_query, run_reactor, wait_for


def _events(state: reactor.State) -> list[tuple[str, str, Any, str | None]]:
    return [(e.key, e.type, e.new_value, e.timer) for e in state.changes()]


def test_a_timer_writes_its_value_once_when_due(state: reactor.State, clock: ManualClock) -> None:
    scope = state.scope("s")
    timer = scope.schedule("k", {"a": 1}, after=30)
    assert timer == reactor.Timer(timer.id, "s", "k", clock.time() + 30, None)
    assert state.timers() == [timer]
    clock.advance(29)
    run_upkeep(state)
    assert scope.get("k") is None
    clock.advance(2)
    wait_for(lambda: scope.get("k") == {"a": 1})
    wait_for(lambda: state.timers() == [])
    assert _events(state) == [("k", "created", {"a": 1}, timer.id)]
    wait_for(lambda: state.stats()["timers"]["fired"] == 1)  # counted just after the commit
    assert state.stats()["timers"] == {"pending": 0, "fired": 1, "failed": 0}


def test_a_timer_of_ops_is_an_update_then(state: reactor.State, clock: ManualClock) -> None:
    scope = state.scope("s")
    scope.set("doc", {"n": 1, "tags": []})
    timer = scope.schedule(
        "doc", ops=[ops.increment("n"), ops.append("x", "tags")], at=clock.time()
    )
    wait_for(lambda: scope.get("doc") == {"n": 2, "tags": ["x"]})
    event = state.changes()[-1]
    assert (event.type, event.timer, event.ops) == ("updated", timer.id, event.ops)
    assert event.ops is not None
    assert len(event.ops) == 2


def test_a_recurring_timer_that_missed_periods_fires_once_then_keeps_its_period(
    state: reactor.State, clock: ManualClock
) -> None:
    scope = state.scope("s")
    start = clock.time()
    timer = scope.schedule("beat", ops=[ops.increment("")], every=60)
    assert timer.due == start + 60
    clock.advance(60 * 10 + 5)  # ten periods late: one firing, not ten
    wait_for(lambda: scope.get("beat") == 1)
    (pending,) = wait_for(lambda: [t for t in state.timers() if t.due > clock.time()])
    assert pending.due == start + 60 * 11
    run_upkeep(state)
    time.sleep(0.3)
    assert scope.get("beat") == 1
    clock.advance(60)
    wait_for(lambda: scope.get("beat") == 2)
    assert state.cancel_timer(timer.id) is True
    clock.advance(600)
    run_upkeep(state)
    time.sleep(0.3)
    assert scope.get("beat") == 2


def test_a_timer_whose_write_fails_is_counted_and_dropped(
    state: reactor.State, clock: ManualClock
) -> None:
    scope = state.scope("s")
    scope.set("text", "not a number")
    once = scope.schedule("text", ops=[ops.increment("")], after=1)
    recurring = scope.schedule("text", ops=[ops.increment("")], every=10)
    big = scope.schedule("fine", 1, after=1)
    clock.advance(11)
    wait_for(lambda: state.stats()["timers"]["fired"] == 3)
    assert state.stats()["timers"]["failed"] == 2
    assert scope.get("text") == "not a number"
    assert scope.get("fine") == 1
    assert [t.id for t in state.timers()] == [recurring.id]  # the next period still fires
    assert once.id not in {e.timer for e in state.changes()}
    assert big.id in {e.timer for e in state.changes()}


def test_a_timer_in_the_past_fires_at_once(open_state: Callable[..., reactor.State]) -> None:
    state = open_state()
    scope = state.scope("s")
    start = time.monotonic()
    scope.schedule("k", "now", at=time.time() - 3600)
    scope.schedule("j", "soon", after=0.2)
    wait_for(lambda: scope.get("k") == "now" and scope.get("j") == "soon", timeout=5)
    assert time.monotonic() - start < 3.0  # "within one second of its due time", loosely


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({}, reactor.InvalidArgumentError),  # no value nor ops
        ({"value": 1, "ops": [ops.increment("")], "after": 1}, reactor.InvalidArgumentError),
        ({"value": 1}, reactor.InvalidArgumentError),  # no time
        ({"value": 1, "after": 1, "at": 2}, reactor.InvalidArgumentError),
        ({"value": 1, "every": 0}, reactor.InvalidArgumentError),
        ({"value": 1, "every": True}, reactor.InvalidArgumentError),
        ({"value": 1, "after": float("nan")}, reactor.InvalidArgumentError),
        ({"value": 1, "at": "tomorrow"}, reactor.InvalidArgumentError),
        ({"value": {1, 2}, "after": 1}, reactor.InvalidValueError),
        ({"ops": "increment", "after": 1}, reactor.InvalidOpError),
        (
            {"ops": [{"type": "set", "path": "a", "value": float("inf")}], "after": 1},
            reactor.InvalidValueError,
        ),
    ],
)
def test_a_bad_timer_is_refused_and_nothing_is_scheduled(
    state: reactor.State, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        state.scope("s").schedule("k", **kwargs)
    with pytest.raises(reactor.InvalidKeyError):
        state.scope("s").schedule("", 1, after=1)
    assert state.timers() == []


def test_cancel(state: reactor.State, clock: ManualClock) -> None:
    scope = state.scope("s")
    timer = scope.schedule("k", 1, after=5)
    assert state.cancel_timer(timer.id) is True
    assert state.cancel_timer(timer.id) is False
    assert state.cancel_timer("no-such-timer") is False
    with pytest.raises(reactor.InvalidArgumentError):
        state.cancel_timer(42)  # type: ignore[arg-type]
    fired = scope.schedule("j", 1, after=1)
    clock.advance(2)
    wait_for(lambda: scope.get("j") == 1)
    assert state.cancel_timer(fired.id) is False
    clock.advance(10)
    run_upkeep(state)
    time.sleep(0.3)
    assert scope.get("k") is None


def test_timers_lists_by_scope_glob_earliest_first(state: reactor.State) -> None:
    late = state.scope("orders").schedule("o-1", "late", after=50)
    early = state.scope("orders").schedule("o-2", "early", after=10)
    other = state.scope("billing").schedule("b", 1, after=20)
    assert state.timers() == [early, other, late]
    assert state.timers("ord*") == [early, late]
    assert state.timers("none") == []


def test_a_transaction_creates_its_timers_with_its_commit(
    state: reactor.State, clock: ManualClock
) -> None:
    scope = state.scope("s")
    with scope.transaction() as tx:
        timer = tx.schedule("k", "from tx", after=5)
        tx.set("other", 1)
        assert state.timers() == []  # not before the commit
    assert state.timers() == [timer]
    with pytest.raises(RuntimeError), scope.transaction() as tx:
        tx.schedule("never", 1, after=5)
        raise RuntimeError
    with state.transaction("s", "t") as multi:
        both = multi["t"].schedule("k", 2, after=5)
    assert sorted(state.timers()) == sorted([timer, both])  # due together: by id
    clock.advance(6)
    wait_for(lambda: scope.get("k") == "from tx" and state.scope("t").get("k") == 2)
    assert scope.get("never") is None


def test_a_body_sees_its_own_schedules_and_cancels(
    state: reactor.State, clock: ManualClock
) -> None:
    """Issue 22, item 8: tx.cancel_timer could not see the same body's tx.schedule
    (False, and the timer fired after the commit), and cancelling a stored timer twice
    in one body said True twice."""
    scope = state.scope("s")
    stored = scope.schedule("stored", 1, after=5)
    with scope.transaction() as tx:
        fresh = tx.schedule("fresh", 1, after=5)
        assert tx.cancel_timer(fresh.id) is True  # the body's own schedule
        assert tx.cancel_timer(fresh.id) is False  # cancelled already, in this body
        assert tx.cancel_timer(stored.id) is True
        assert tx.cancel_timer(stored.id) is False
        kept = tx.schedule("kept", 1, after=5)
        assert state.timers() == [stored]  # nothing changes before the commit
    assert state.timers() == [kept]
    with state.transaction("s", "t") as multi:
        other = multi["t"].schedule("k", 2, after=5)
        assert multi.cancel_timer(other.id) is True
        assert multi["s"].cancel_timer(other.id) is False
    with pytest.raises(RuntimeError), scope.transaction() as tx:
        assert tx.cancel_timer(kept.id) is True
        raise RuntimeError  # rolled back: the cancel goes with it
    with scope.transaction() as tx:
        assert tx.cancel_timer(kept.id) is True
        with pytest.raises(reactor.InvalidArgumentError):
            tx.schedule("bad", 1, after=float("nan"))  # a failed verb undoes nothing else
        assert tx.cancel_timer(kept.id) is False
    assert state.timers() == []
    clock.advance(6)
    run_upkeep(state)
    assert scope.keys() == []
    assert state.scope("t").keys() == []


async def test_an_async_body_sees_its_own_schedules_and_cancels(db_path: Any) -> None:
    async with reactor.aio.open(db_path) as state:
        async with state.scope("s").transaction() as tx:
            fresh = await tx.schedule("fresh", 1, after=5)
            assert await tx.cancel_timer(fresh.id) is True
            assert await tx.cancel_timer(fresh.id) is False
        assert await state.timers() == []


CONFLICTER = """
    import sys, reactor
    with reactor.open(sys.argv[1]) as state:
        state.scope("s").set("moved", 1)
"""


def test_a_conflicting_transaction_creates_no_timer(db_path: Any) -> None:
    with reactor.open(db_path) as state:
        scope = state.scope("s")
        with pytest.raises(reactor.ConflictError), scope.transaction() as tx:
            tx.schedule("k", 1, after=100)
            subprocess.run(
                [sys.executable, "-c", textwrap.dedent(CONFLICTER), str(db_path)],
                check=True,
                timeout=60,
            )
        assert state.timers() == []


FIRER = """
    import sys, time, reactor
    with reactor.open(sys.argv[1]) as state:
        time.sleep(float(sys.argv[2]))
"""


def test_several_processes_fire_each_timer_exactly_once(db_path: Any) -> None:
    count = 150
    with reactor.open(db_path) as state:
        scope = state.scope("s")
        due = time.time() + 2.0
        for n in range(count):
            scope.schedule(f"k{n % 5}", ops=[ops.increment("")], at=due + (n % 10) * 0.05)
        runs = [
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(FIRER), str(db_path), "4.5"],
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        errors = [run.communicate(timeout=90)[1] for run in runs]
        assert [run.returncode for run in runs] == [0, 0, 0], errors
        wait_for(lambda: state.timers() == [], timeout=10)
        total = sum(scope.get(f"k{n}", 0) for n in range(5))
        assert total == count
        fired = [e.timer for e in state.changes() if e.timer is not None]
        assert len(fired) == len(set(fired)) == count


SCHEDULE_THEN_DIE = """
    import os, signal, sys, time, reactor
    state = reactor.open(sys.argv[1])
    state.scope("s").schedule("k", "fired", at=float(sys.argv[2]))
    state.scope("s").schedule("beat", ops=[{"type": "increment", "path": ""}], every=0.5)
    print("scheduled", flush=True)
    time.sleep(60)
"""


def test_a_timer_due_during_a_crash_fires_once_after_the_restart(db_path: Any) -> None:
    due = time.time() + 1.0
    dying = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SCHEDULE_THEN_DIE), str(db_path), str(due)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert dying.stdout is not None
        assert dying.stdout.readline().strip() == "scheduled"
        dying.send_signal(signal.SIGKILL)
    finally:
        if dying.poll() is None:
            os.kill(dying.pid, signal.SIGKILL)
        dying.communicate(timeout=30)  # reaped, its pipes closed
    time.sleep(max(0.0, due + 2.0 - time.time()))  # due, and a few periods missed
    with reactor.open(db_path) as state:
        scope = state.scope("s")
        wait_for(lambda: scope.get("k") == "fired" and scope.get("beat") == 1, timeout=5)
        fired = [e for e in state.changes() if e.key == "k"]
        assert len(fired) == 1
        assert len(state.timers()) == 1  # the recurring one, at its next period


def test_a_read_only_engine_lists_timers_and_schedules_none(
    open_state: Callable[..., reactor.State], db_path: Any
) -> None:
    writer = open_state()
    timer = writer.scope("s").schedule("k", 1, after=100)
    writer.close()
    reader = open_state(readonly=True)
    assert reader.timers() == [timer]
    with pytest.raises(reactor.ReadOnlyError):
        reader.scope("s").schedule("k", 2, after=1)
    with pytest.raises(reactor.ReadOnlyError):
        reader.cancel_timer(timer.id)


def test_timer_ids_follow_the_order_they_were_scheduled_in(state: reactor.State) -> None:
    """Timers due together fire in id order, a batch a transaction: ids in scheduling
    order (UUIDv7) keep a batch's rows side by side in the table. Random ids spread
    a batch of 1,000 over about as many pages: 100,000 timers due at once on SQLite
    came 6.4-8.6 s late, and 3.3-3.9 s with ordered ids."""
    with state.transaction("s") as tx:
        ids = [tx["s"].schedule(f"k{n}", n, after=60).id for n in range(2000)]
    ids += [state.scope("s").schedule("k", 1, after=60).id for _ in range(100)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert [timer.id for timer in state.timers()] == ids  # due together: in id order


def test_the_asyncio_twins(db_path: Any) -> None:
    async def main() -> None:
        async with reactor.aio.open(db_path) as state:
            scope = state.scope("s")
            timer = await scope.schedule("k", 1, after=0.2)
            assert await state.timers() == [timer]
            keep = await scope.schedule("j", 1, after=100)
            async with scope.transaction() as tx:
                pending = await tx.schedule("t", 1, after=100)
            assert await state.cancel_timer(keep.id) is True
            assert await state.cancel_timer(keep.id) is False
            assert await scope.wait_for("k", timeout=5) == 1
            assert await state.timers() == [pending]

    asyncio.run(main())


@pytest.mark.sqlite_only(CLI_ON_SQLITE)
def test_the_command_line(db_path: Any, tmp_path: Any) -> None:
    def reactor_cli(*args: str) -> Any:
        done = run_reactor("--db", str(db_path), "--json", *args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    added = reactor_cli("timers", "add", "s", "k", '"later"', "--after", "100")
    beat = reactor_cli(
        "timers", "add", "s", "n", '[{"type": "increment", "path": ""}]', "--ops", "--every", "60"
    )
    assert beat["every"] == 60.0
    assert [t["id"] for t in reactor_cli("timers")] == [beat["id"], added["id"]]
    assert reactor_cli("timers", "--scope", "other") == []
    assert reactor_cli("timers", "--limit", "1") == [beat]
    assert reactor_cli("timers", "cancel", added["id"]) == {"cancelled": added["id"]}
    again = run_reactor("--db", str(db_path), "timers", "cancel", added["id"], cwd=tmp_path)
    assert again.returncode == 1
    assert "no pending timer" in again.stderr
    bad = run_reactor("--db", str(db_path), "timers", "add", "s", "k", "1", cwd=tmp_path)
    assert bad.returncode == 2  # usage: no time given
    assert "needs a time" in bad.stderr
    assert "Traceback" not in bad.stderr
    with reactor.open(db_path) as state:
        assert [t.id for t in state.timers()] == [beat["id"]]


@pytest.mark.parametrize("bad", ["a\x00b", "\ud800", "x" * 2000])
def test_a_timer_id_that_no_timer_could_have_is_refused(state: reactor.State, bad: str) -> None:
    timer = state.scope("s").schedule("k", 1, after=100)
    with pytest.raises(reactor.InvalidArgumentError):
        state.cancel_timer(bad)
    with pytest.raises(reactor.InvalidArgumentError), state.scope("s").transaction() as tx:
        tx.cancel_timer(bad)
    assert state.cancel_timer("") is False
    assert state.timers() == [timer]


# -- a burst on time -----------------------------------------------------------------
def _burst(state: reactor.State, count: int, scopes: int, lead: float) -> tuple[list[float], float]:
    """Schedule ``count`` timers over ``scopes`` scopes, all due ``lead`` seconds from
    now (created by one commit); check that each fires once, writing its value; how
    late each one's event came, earliest first, and how long the scheduling commit
    took (the machine's pace for writes of that many rows, at that moment)."""
    arrivals: dict[str, float] = {}
    state.subscribe(lambda event: arrivals.setdefault(event.timer or "", time.time()))
    names = [f"burst-{n}" for n in range(scopes)]
    due = time.time() + lead
    started = time.monotonic()
    with state.transaction(*names) as tx:
        scheduled = {tx[names[n % scopes]].schedule(f"k{n}", n, at=due).id: n for n in range(count)}
    scheduling = time.monotonic() - started
    assert time.time() < due - 0.5, "scheduling took too long to measure anything"
    wait_for(lambda: len(arrivals) >= count, timeout=due - time.time() + 60)
    time.sleep(0.2)  # an event too many would show up now
    assert set(arrivals) == set(scheduled)  # each once, and nothing else
    fired = [e.timer for e in state.changes(limit=None) if e.timer is not None]
    assert len(fired) == len(set(fired)) == count
    assert state.timers() == []
    values = {name: state.scope(name).list() for name in names}
    assert sum(len(found) for found in values.values()) == count
    assert all(values[names[n % scopes]][f"k{n}"] == n for n in scheduled.values())
    late = sorted(arrival - due for arrival in arrivals.values())
    print(
        f"{count} timers, {scopes} scope(s): late by {late[len(late) // 2]:.3f} s median, "
        f"{late[-1]:.3f} s max; scheduled in {scheduling:.3f} s"
    )
    assert late[0] >= -0.05  # none early (the clocks of the two threads agree)
    return late, scheduling


@pytest.mark.parametrize("scopes", [1, 5])
def test_ten_thousand_timers_due_at_once_fire_within_a_second_exactly_once(
    open_state: Callable[..., reactor.State], scopes: int
) -> None:
    """SPEC §13: "within one second of its due time", for a burst too. Timers used to
    be fired one by one, three round trips each: on PostgreSQL, 10,000 due at once came
    2-5 s late at the median, 4-9 s at most. Now a few statements fire a thousand: the
    last comes 0.5-0.9 s late here on a quiet machine. The median is held to the
    second (the promise); the last one only to what catches a return of one-by-one
    firing while leaving room for a loaded machine (it came 1.8 s late with six busy
    processes on two cores, 2.3 s beside two CPU burners, a full test run and 50 held
    PostgreSQL connections). How late, at what rate, is measured in ``reactor bench``.

    A machine too loaded to write 10,000 rows in a second cannot fire 10,000 timers in
    one either (the median came 1.4-2.8 s late beside two CPU burners and a second test
    run): the bounds grow with what the scheduling commit, 10,000 rows too, took at
    that moment, or with how crowded the machine is (the scheduling commit alone once
    took 0.4 s there while the firing, threads of the writer and the dispatcher, came
    1.4 s late at the median). One-by-one firing still fails them: it was 2-5 s late at
    the median where scheduling takes 0.5 s."""
    late, scheduling = _burst(open_state(), 10_000, scopes, lead=8.0)
    crowded = crowding()
    assert late[len(late) // 2] < max(crowded, 1.5 * scheduling), f"crowding {crowded:.2f}"
    assert late[-1] < max(4.0 * crowded, 4 * scheduling), f"crowding {crowded:.2f}"


@pytest.mark.slow
@pytest.mark.sqlite_only("a measure: SQLite's own writes are what a burst costs there")
def test_a_hundred_thousand_timers_due_at_once_fire_exactly_once(
    open_state: Callable[..., reactor.State],
) -> None:
    """At 100,000 due at once the last fires 3.3-3.9 s late on this two-core machine
    (6.4-8.6 s before timer ids were time-ordered): about 17 µs a timer on the
    writer's thread alone, 30 µs beside the dispatcher, SQLite's row writes being
    half of it (the same statements from a bare loop: 15.7 µs a timer). A measure, and
    a check that each fires once; the bound only catches a collapse (or a return of
    scattered writes) on a loaded machine."""
    late, _ = _burst(open_state(log_retention=None), 100_000, 5, lead=20.0)
    assert late[-1] < 15.0


# -- a write the database refuses ----------------------------------------------------
def _refuse_key(db: Any, key: str) -> None:
    """Have the database itself refuse any row of ``key`` in reactor_kv (a trigger):
    a refusal reactor cannot see coming, as a key past an index's limit once was."""
    if str(db).startswith("postgresql"):
        raw_query(
            db,
            "CREATE FUNCTION refuse_key() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.key = '{key}' THEN RAISE EXCEPTION 'no row for this key'; END IF; "
            "RETURN NEW; END $$",
        )
        raw_query(
            db,
            "CREATE TRIGGER refuse_key BEFORE INSERT OR UPDATE ON reactor_kv "
            "FOR EACH ROW EXECUTE FUNCTION refuse_key()",
        )
        return
    for event in ("INSERT", "UPDATE"):
        raw_query(
            db,
            f"CREATE TRIGGER refuse_key_{event} BEFORE {event} ON reactor_kv "
            f"WHEN NEW.key = '{key}' BEGIN SELECT RAISE(ABORT, 'no row for this key'); END",
        )


def test_due_timers_stay_due_while_the_database_is_down_and_fire_once_it_is_back(
    state: reactor.State, clock: ManualClock, db_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outage is not a refusal: no timer is dropped, each fires when it is over."""
    scope = state.scope("s")
    timers = [scope.schedule(f"k{n}", n, after=1) for n in range(5)]
    engine = engine_of(state)
    store: Any = engine.store
    if str(db_path).startswith("postgresql"):
        import psycopg

        lost: Exception = psycopg.OperationalError("server closed the connection unexpectedly")
    else:
        import sqlite3

        lost = sqlite3.OperationalError("disk I/O error")
    begin = store._begin_write
    down = threading.Event()
    down.set()

    def begin_write(*args: Any) -> Any:
        if down.is_set():
            raise lost  # as the driver raises it: the store translates it
        return begin(*args)

    monkeypatch.setattr(store, "_begin_write", begin_write)
    clock.advance(2)
    for _ in range(3):
        engine.sweeper.fire_timers()
        for firing in list(engine.sweeper._firing.values()):
            firing.result(timeout=10)
    assert state.stats()["timers"] == {"pending": 5, "fired": 0, "failed": 0}
    down.clear()
    wait_for(lambda: state.timers() == [], timeout=10)
    assert [scope.get(timer.key) for timer in timers] == list(range(5))
    # counted when the firing's future completes, a moment after its commit is visible
    wait_for(lambda: state.stats()["timers"]["fired"] == 5, timeout=10)
    assert state.stats()["timers"] == {"pending": 0, "fired": 5, "failed": 0}
