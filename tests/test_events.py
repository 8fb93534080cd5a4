"""Change events, subscriptions, signals, the change log and watches (SPEC §7)."""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import reactor
from reactor import signals
from reactor.testing import ManualClock, run_upkeep
from tests.conftest import wait_for

Opener = Callable[..., reactor.State]


class Collector:
    """A callback that records events and lets a test wait for a number of them."""

    def __init__(self) -> None:
        self.events: list[reactor.ChangeEvent] = []
        self._lock = threading.Lock()

    def __call__(self, event: reactor.ChangeEvent) -> None:
        with self._lock:
            self.events.append(event)

    def wait(self, count: int, timeout: float = 5.0) -> list[reactor.ChangeEvent]:
        wait_for(lambda: len(self.events) >= count, timeout)
        return list(self.events)

    @property
    def summary(self) -> list[tuple[str, str, object, object]]:
        return [(e.key, e.type, e.old_value, e.new_value) for e in self.events]


def test_an_event_per_change_with_old_and_new(state: reactor.State) -> None:
    seen = Collector()
    state.subscribe(seen)
    scope = state.scope("orders")
    scope.set("o-1", {"total": 10})
    scope.update("o-1", [reactor.ops.increment("total", 5)])
    scope.delete("o-1")
    events = seen.wait(3)
    assert seen.summary == [
        ("o-1", "created", None, {"total": 10}),
        ("o-1", "updated", {"total": 10}, {"total": 15}),
        ("o-1", "deleted", {"total": 15}, None),
    ]
    assert [e.scope for e in events] == ["orders"] * 3
    assert events[1].ops == [{"type": "increment", "path": "total", "by": 5}]
    assert events[0].ops is None
    assert [e.revision for e in events] == [1, 2, 3]
    assert all(e.timestamp.tzinfo is not None for e in events)


def test_writes_that_change_nothing_or_fail_publish_nothing(state: reactor.State) -> None:
    seen = Collector()
    state.subscribe(seen)
    scope = state.scope("s")
    scope.set("k", "text")
    scope.set("k", "text")
    scope.delete("missing")
    scope.clear("nothing*")
    with pytest.raises(reactor.TypeMismatchError):
        scope.increment("k")
    with pytest.raises(RuntimeError), scope.transaction() as tx:
        tx.set("k", "rolled back")
        raise RuntimeError
    scope.set("last", 1)
    seen.wait(2)
    time.sleep(0.1)
    assert [(e.key, e.type) for e in seen.events] == [("k", "created"), ("last", "created")]


def test_delivery_follows_the_commit(state: reactor.State) -> None:
    scope = state.scope("s")
    observed: list[object] = []
    done = threading.Event()

    def check(event: reactor.ChangeEvent) -> None:
        observed.append(scope.get(event.key))  # the write is visible to any reader
        done.set()

    state.subscribe(check)
    scope.set("k", "committed")
    assert done.wait(5)
    assert observed == ["committed"]


def test_clear_and_transactions_give_one_event_per_change(state: reactor.State) -> None:
    seen = Collector()
    state.subscribe(seen)
    scope = state.scope("s")
    scope.set_many({"a": 1, "b": 2, "c": 3})
    assert scope.clear() == 3
    with scope.transaction() as tx:
        tx.set("x", 1)
        tx.increment("x")
        tx.set("y", 1)
    events = seen.wait(9)
    assert [(e.key, e.type) for e in events] == [
        ("a", "created"),
        ("b", "created"),
        ("c", "created"),
        ("a", "deleted"),
        ("b", "deleted"),
        ("c", "deleted"),
        ("x", "created"),
        ("x", "updated"),
        ("y", "created"),
    ]
    assert [e.revision for e in events] == list(range(1, 10))


def test_filters(state: reactor.State) -> None:
    by_scope, by_key, by_type, by_where = Collector(), Collector(), Collector(), Collector()
    state.subscribe(by_scope, scope="ord*")
    state.subscribe(by_key, key="o-[12]")
    state.subscribe(by_type, events={"deleted"})
    state.subscribe(by_where, where=lambda e: (e.new_value or {}).get("total", 0) > 100)
    orders, other = state.scope("orders"), state.scope("other")
    orders.set("o-1", {"total": 50})
    orders.set("o-2", {"total": 150})
    orders.set("o-3", {"total": 500})
    other.set("o-1", {"total": 1000})
    orders.delete("o-1")
    all_seen = Collector()
    state.subscribe(all_seen, since=0)
    all_seen.wait(5)
    wait_for(lambda: len(by_where.events) == 3)
    time.sleep(0.1)
    assert [(e.scope, e.key) for e in by_scope.events] == [
        ("orders", "o-1"),
        ("orders", "o-2"),
        ("orders", "o-3"),
        ("orders", "o-1"),
    ]
    assert [(e.scope, e.key) for e in by_key.events] == [
        ("orders", "o-1"),
        ("orders", "o-2"),
        ("other", "o-1"),
        ("orders", "o-1"),
    ]
    assert [e.type for e in by_type.events] == ["deleted"]
    assert [e.key for e in by_where.events] == ["o-2", "o-3", "o-1"]


def test_a_list_of_globs_admits_what_any_one_of_them_matches(state: reactor.State) -> None:
    listed, piped = Collector(), Collector()
    state.subscribe(listed, scope=["orders", "ledg*"], key=("o-1", "2026-*"))
    state.subscribe(piped, scope="orders|ledger")  # a glob has no alternation: one scope
    state.scope("orders").set("o-1", 1)
    state.scope("orders").set("o-2", 2)  # no key of the list
    state.scope("other").set("o-1", 3)  # no scope of the list
    state.scope("orders|ledger").set("o-1", 4)
    state.scope("ledger").set("2026-11", 5)
    # In commit order: an event let through wrongly would come before the last one.
    wanted = [("orders", "o-1"), ("ledger", "2026-11")]
    assert [(e.scope, e.key) for e in listed.wait(2)] == wanted
    assert [(e.scope, e.key) for e in piped.wait(1)] == [("orders|ledger", "o-1")]
    by_list = state.changes(since=0, scope={"orders", "ledger"}, key=["o-1", "2026-11"])
    assert [(e.scope, e.key) for e in by_list] == wanted
    with state.watch(since=0, scope=("orders", "ledger"), key=["o-1", "2026-11"]) as feed:
        assert [(e.scope, e.key) for e in itertools.islice(feed, 2)] == wanted


@pytest.mark.parametrize("globs", [[], ("orders", ""), ["orders", 1], {"orders": 1}, b"o*"])
def test_a_bad_list_of_globs_is_refused(state: reactor.State, globs: Any) -> None:
    with pytest.raises(reactor.InvalidKeyError, match="pattern"):
        state.subscribe(print, scope=globs)
    with pytest.raises(reactor.InvalidKeyError, match="pattern"):
        state.changes(key=globs)


def test_bad_filters_are_refused(state: reactor.State) -> None:
    with pytest.raises(reactor.InvalidArgumentError):
        state.subscribe(print, events={"renamed"})
    with pytest.raises(reactor.InvalidArgumentError):
        state.subscribe("not callable")  # type: ignore[arg-type]
    with pytest.raises(reactor.InvalidKeyError):
        state.subscribe(print, scope="")
    with pytest.raises(reactor.InvalidArgumentError):
        state.subscribe(print, since=-1)


def test_commit_order_for_each_subscriber(state: reactor.State) -> None:
    seen = Collector()
    state.subscribe(seen)

    def writer(name: str) -> None:
        scope = state.scope(name)
        for i in range(50):
            scope.set(f"k{i % 5}", i)

    threads = [threading.Thread(target=writer, args=(f"scope-{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    events = seen.wait(200)
    revisions = [e.revision for e in events]
    assert revisions == list(range(1, 201))


def test_a_subscriber_that_raises_affects_nothing_else(
    state: reactor.State, caplog: pytest.LogCaptureFixture
) -> None:
    healthy = Collector()
    calls: list[int] = []

    def broken(event: reactor.ChangeEvent) -> None:
        calls.append(event.revision)
        raise ValueError("subscriber bug")

    state.subscribe(broken)
    state.subscribe(healthy)
    scope = state.scope("s")
    with caplog.at_level(logging.ERROR, logger="reactor"):
        for i in range(5):
            scope.set("k", i)  # the writer does not see the subscriber's error
        healthy.wait(5)
        wait_for(lambda: len(calls) == 5)
    assert calls == [1, 2, 3, 4, 5]  # later events still reach it
    assert state.stats()["events"]["failed"] == 5
    assert "subscriber bug" in caplog.text


def test_a_slow_subscriber_delays_neither_writers_nor_others(state: reactor.State) -> None:
    release = threading.Event()
    fast = Collector()
    stuck: list[int] = []

    def slow(event: reactor.ChangeEvent) -> None:
        stuck.append(event.revision)
        release.wait(10)

    state.subscribe(slow, buffer_size=10)
    state.subscribe(fast)
    scope = state.scope("s")
    for i in range(50):
        scope.set("k", i)
    fast.wait(50)  # all 50 arrive while the slow one sits on its first
    assert stuck == [1]
    wait_for(lambda: state.stats()["events"]["dropped"] >= 39)
    release.set()
    wait_for(lambda: len(stuck) + state.stats()["events"]["dropped"] == 50)
    dropped = state.stats()["events"]["dropped"]
    # The first, then its buffer of 10: 2..10, and the tenth place went to 11, or to a
    # later event if the subscriber took 1 out of its buffer only after 11 had been
    # dropped; or to none (40 dropped) if it took 1 only after the last was published.
    assert dropped in (39, 40)
    assert stuck[:10] == list(range(1, 11))
    assert len(stuck) == 50 - dropped
    assert all(later >= 11 for later in stuck[10:])


def test_subscribers_may_write_state_without_deadlock(state: reactor.State) -> None:
    orders = state.scope("orders")
    ledger = state.scope("ledger")

    def step(event: reactor.ChangeEvent) -> None:
        status = event.new_value["status"]
        following = {"new": "paid", "paid": "shipped"}.get(status)
        if following is not None:
            orders.update(event.key, [reactor.ops.set("status", following)])  # same scope
        ledger.push("entries", [event.key, status])  # another scope

    state.subscribe(step, scope="orders", events={"created", "updated"})
    for i in range(5):
        orders.set(f"o-{i}", {"status": "new"})
    wait_for(lambda: ledger.length("entries") == 15)
    assert all(orders.get(f"o-{i}")["status"] == "shipped" for i in range(5))


def test_subscribers_are_held_strongly(state: reactor.State) -> None:
    seen: list[int] = []
    state.subscribe(lambda event: seen.append(event.revision))
    gc.collect()
    state.scope("s").set("k", 1)
    wait_for(lambda: seen == [1])


def test_the_decorator_and_close(state: reactor.State) -> None:
    seen: list[str] = []

    @state.on("orders", key="o-*")
    def on_order(event: reactor.ChangeEvent) -> None:
        seen.append(event.key)

    assert callable(on_order)
    scope = state.scope("orders")
    scope.set("o-1", 1)
    scope.set("x", 1)
    wait_for(lambda: seen == ["o-1"])

    other: list[int] = []
    subscription = state.subscribe(lambda e: other.append(e.revision))
    scope.set("o-2", 1)
    wait_for(lambda: len(other) == 1)
    subscription.close()
    subscription.close()
    assert subscription.closed
    scope.set("o-3", 1)
    wait_for(lambda: seen == ["o-1", "o-2", "o-3"])
    assert len(other) == 1


async def test_async_callbacks_run_on_their_event_loop(open_state: Opener) -> None:
    state = open_state()
    loop_thread = threading.get_ident()
    ran_on: list[int] = []
    arrived = asyncio.Event()

    async def on_change(event: reactor.ChangeEvent) -> None:
        ran_on.append(threading.get_ident())
        await asyncio.sleep(0)
        arrived.set()

    state.subscribe(on_change)
    await asyncio.to_thread(state.scope("s").set, "k", 1)
    await asyncio.wait_for(arrived.wait(), 5)
    assert ran_on == [loop_thread]


def test_an_async_callback_needs_a_running_loop(state: reactor.State) -> None:
    async def on_change(event: reactor.ChangeEvent) -> None:
        pass

    with pytest.raises(reactor.InvalidArgumentError, match="event loop"):
        state.subscribe(on_change)


def test_one_expired_event_per_key_within_a_second(
    state: reactor.State, clock: ManualClock
) -> None:
    seen = Collector()
    state.subscribe(seen, events={"expired"})
    scope = state.scope("cache")
    scope.set("swept", 1, ttl=10)
    scope.set("written", 1, ttl=10)
    scope.set("kept", 1, ttl=100)
    clock.advance(10)
    scope.set("written", 2)  # a write notices this one first
    started = time.monotonic()
    events = seen.wait(2, timeout=1.5)
    assert time.monotonic() - started < 1.0
    time.sleep(0.6)  # two more sweeps: nothing more expires
    assert sorted((e.key, e.old_value) for e in seen.events) == [("swept", 1), ("written", 1)]
    assert all(e.new_value is None for e in events)


def test_changes(state: reactor.State) -> None:
    orders, users = state.scope("orders"), state.scope("users")
    for i in range(5):
        orders.set(f"o-{i}", i)
        users.set(f"u-{i}", i)
    everything = state.changes()
    assert [e.revision for e in everything] == list(range(1, 11))
    assert [e.key for e in state.changes(since=7)] == ["u-3", "o-4", "u-4"]
    assert [e.key for e in state.changes(scope="users", limit=2)] == ["u-0", "u-1"]
    assert [e.key for e in state.changes(key="o-[34]")] == ["o-3", "o-4"]
    assert state.changes(since=10) == []


def test_compacted_revisions_raise(open_state: Opener) -> None:
    state = open_state(log_retention=5)
    scope = state.scope("s")
    for i in range(20):
        scope.set("k", i)
    run_upkeep(state)
    assert [e.revision for e in state.changes(since=15)] == [16, 17, 18, 19, 20]
    for call in (
        lambda: state.changes(since=14),
        lambda: state.subscribe(print, since=3),
        lambda: state.watch(since=0),
    ):
        with pytest.raises(reactor.RevisionCompactedError):
            call()


def test_watch_gives_past_then_live_events(state: reactor.State) -> None:
    scope = state.scope("s")
    scope.set("a", 1)
    scope.set("b", 2)
    with state.watch(since=0) as watch:
        past = [next(watch), next(watch)]
        assert [e.key for e in past] == ["a", "b"]
        threading.Timer(0.05, scope.set, args=("c", 3)).start()
        live = next(watch)
        assert (live.key, live.revision) == ("c", 3)
    assert list(watch) == []  # a closed watch ends


def test_watch_ends_when_the_engine_closes(open_state: Opener) -> None:
    state = open_state()
    watch = state.watch(scope="s")
    state.scope("s").set("k", 1)
    state.scope("t").set("k", 1)
    threading.Timer(0.1, state.close).start()
    assert [e.scope for e in watch] == ["s"]


def test_subscribe_since_a_snapshot_misses_and_repeats_nothing(state: reactor.State) -> None:
    scope = state.scope("s")
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            scope.increment("n")
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        time.sleep(0.05)
        snap = scope.snapshot()
        seen = Collector()
        state.subscribe(seen, since=snap.revision)
        time.sleep(0.1)
    finally:
        stop.set()
        thread.join(10)
    final = scope.get("n")
    events = seen.wait(final - snap.values["n"])
    values = [e.new_value for e in events]
    assert values == list(range(snap.values["n"] + 1, final + 1))
    assert [e.revision for e in events] == list(
        range(snap.revision + 1, snap.revision + len(events) + 1)
    )


def test_signals_changed(state: reactor.State) -> None:
    received: list[tuple[str, int]] = []

    def receiver(sender: str, event: reactor.ChangeEvent) -> None:
        received.append((sender, event.revision))

    def broken(sender: str, event: reactor.ChangeEvent) -> None:
        raise RuntimeError("receiver bug")

    signals.changed.connect(broken)
    signals.changed.connect(receiver)
    try:
        state.scope("orders").set("k", 1)
        state.scope("users").set("k", 1)
        wait_for(lambda: len(received) == 2)
    finally:
        signals.changed.disconnect(receiver)
        signals.changed.disconnect(broken)
    assert received == [("orders", 1), ("users", 2)]
    assert state.stats()["events"]["failed"] == 2


def test_stats_count_events(state: reactor.State) -> None:
    seen = Collector()
    state.subscribe(seen)
    for i in range(3):
        state.scope("s").set("k", i)
    seen.wait(3)
    events = state.stats()["events"]
    assert events["published"] == 3
    wait_for(lambda: state.stats()["events"]["delivered"] == 3)


def test_close_delivers_what_is_pending(db_path: Path) -> None:
    state = reactor.open(db_path)
    seen = Collector()
    state.subscribe(seen)
    scope = state.scope("s")
    for i in range(100):
        scope.set(f"k{i}", i)
    state.close()
    assert len(seen.events) == 100
