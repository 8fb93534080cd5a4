"""Derived values (SPEC §15): ``state.derive`` with its ``Reader``, the read-set index,
folding and publication only on change, ``count`` and ``sum`` kept up from each change,
on both backends; other processes' writes in ``test_derived_processes``."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import pytest

import reactor
import reactor.aio
from reactor.testing import ManualClock, run_upkeep
from tests.conftest import wait_for as eventually

PATIENCE = 10.0


def open_orders(r: reactor.Reader) -> int:
    return sum(1 for v in r.scope("orders").values("o-*") if v["status"] != "shipped")


def settled(derived: reactor.DerivedValue, expected: Any) -> Any:
    """Wait until ``derived`` holds ``expected``; its value."""
    return derived.wait_for(lambda value: value == expected, timeout=PATIENCE)


# -- computing, and computing again ---------------------------------------------------------


def test_a_derived_value_is_computed_now_and_again_after_a_change_it_read(
    state: reactor.State,
) -> None:
    orders = state.scope("orders")
    orders.set("o-1", {"status": "new"})
    derived = state.derive(open_orders, name="open_orders")
    assert derived.value == 1
    assert derived.revision == orders.entry("o-1").revision  # type: ignore[union-attr]
    assert derived.name == "open_orders"
    orders.set("o-2", {"status": "new"})
    assert settled(derived, 2) == 2
    assert derived.revision == orders.entry("o-2").revision  # type: ignore[union-attr]
    orders.set("o-1", {"status": "shipped"})
    settled(derived, 1)
    assert derived.error is None


def test_unrelated_writes_compute_nothing(state: reactor.State) -> None:
    """1,000 writes to another scope, and to keys of the scope that neither a key read
    nor a pattern covers, cause no computation."""
    orders = state.scope("orders")
    orders.set("o-1", {"status": "new"})
    orders.set("total", 0)
    derived = state.derive(lambda r: [open_orders(r), r.scope("orders").get("total")])
    assert derived.recomputations == 1
    other = state.scope("elsewhere")
    for n in range(500):
        other.set(f"k{n}", n)
        orders.set(f"x-{n}", n)  # matches no pattern read, and is no key read
    orders.set("total", 5)  # a key read one by one: this one counts
    settled(derived, [1, 5])
    time.sleep(0.2)  # a computation late for the unrelated writes would show now
    assert derived.recomputations == 2


def test_changes_that_arrive_together_fold_and_an_equal_result_is_not_published(
    state: reactor.State,
) -> None:
    orders = state.scope("orders")
    derived = state.derive(open_orders)
    published: list[reactor.Derived] = []
    derived.subscribe(published.append)
    with state.transaction("orders") as tx:
        for n in range(50):
            tx["orders"].set(f"o-{n}", {"status": "new"})
    settled(derived, 50)
    orders.set("o-0", {"status": "new", "note": "same count"})  # computed, equal: not published
    eventually(lambda: derived.recomputations >= 3, timeout=PATIENCE)
    time.sleep(0.2)
    assert [(d.value, d.old_value) for d in published] == [(50, 0)]
    assert derived.recomputations == 3


def test_every_subscriber_gets_every_published_value_once_in_order(
    state: reactor.State,
) -> None:
    counter = state.scope("c")
    counter.set("n", 0)
    derived = state.derive(lambda r: r.scope("c").get("n"))
    seen: list[list[reactor.Derived]] = [[], []]
    stops = [derived.subscribe(seen[0].append), derived.subscribe(seen[1].append)]
    for n in range(1, 101):
        counter.set("n", n)
        settled(derived, n)  # one at a time: each is published
    eventually(lambda: len(seen[0]) == len(seen[1]) == 100, timeout=PATIENCE)
    for got in seen:
        assert [d.value for d in got] == list(range(1, 101))
        assert [d.old_value for d in got] == list(range(100))
        revisions = [d.revision for d in got]
        assert revisions == sorted(revisions)
    for stop in stops:
        stop()


def test_a_slow_subscriber_holds_up_neither_the_others_nor_the_value(
    state: reactor.State,
) -> None:
    counter = state.scope("c")
    derived = state.derive(lambda r: r.scope("c").get("n", 0))
    release = threading.Event()
    quick: list[int] = []
    derived.subscribe(lambda _derived: release.wait(PATIENCE))
    derived.subscribe(lambda d: quick.append(d.value))
    counter.set("n", 1)
    eventually(lambda: quick == [1], timeout=PATIENCE)
    assert derived.value == 1
    release.set()


# -- what the function reads ----------------------------------------------------------------


def test_the_reader_offers_the_read_verbs_over_several_scopes(
    state: reactor.State, clock: ManualClock
) -> None:
    state.scope("a").set("k", 1, ttl=60)
    state.scope("b").set("x-1", "one")
    state.scope("b").set("x-2", "two")
    state.scope("b").set("y", "why")

    def everything(r: reactor.Reader) -> dict[str, Any]:
        a, b = r.scope("a"), r.scope("b")
        entry = a.entry("k")
        return {
            "get": a.get("k"),
            "default": a.get("missing", "d"),
            "exists": [a.exists("k"), a.exists("missing")],
            "ttl": a.ttl("k"),
            "keys": b.keys("x-*"),
            "values": b.values("x-*"),
            "items": [list(pair) for pair in b.items("x-*")],
            "list": b.list(),
            "version": None if entry is None else entry.version,
            "revision": r.revision,
        }

    derived = state.derive(everything)
    assert derived.value == {
        "get": 1,
        "default": "d",
        "exists": [True, False],
        "ttl": 60.0,
        "keys": ["x-1", "x-2"],
        "values": ["one", "two"],
        "items": [["x-1", "one"], ["x-2", "two"]],
        "list": {"x-1": "one", "x-2": "two", "y": "why"},
        "version": 1,
        "revision": state.scope("b").entry("y").revision,  # type: ignore[union-attr]
    }
    clock.advance(61)
    run_upkeep(state)  # the expiry is a change of a key read
    eventually(lambda: derived.value is not None and derived.value["get"] is None)
    assert derived.value["exists"] == [False, False]


def test_what_is_read_is_recorded_afresh_at_each_run(state: reactor.State) -> None:
    """A function that reads ``b`` only while ``a`` says so: once it does not, changes
    of ``b`` compute nothing."""
    state.scope("a").set("switch", True)
    state.scope("b").set("v", 1)

    def switched(r: reactor.Reader) -> Any:
        return r.scope("b").get("v") if r.scope("a").get("switch") else "off"

    derived = state.derive(switched)
    assert derived.value == 1
    state.scope("b").set("v", 2)
    settled(derived, 2)
    state.scope("a").set("switch", False)
    settled(derived, "off")
    runs = derived.recomputations
    for n in range(20):
        state.scope("b").set("v", 10 + n)
    time.sleep(0.3)
    assert derived.recomputations == runs
    state.scope("a").set("switch", True)
    settled(derived, 29)


def test_a_published_value_never_mixes_two_revisions(state: reactor.State) -> None:
    """Transactions move amounts between keys: every value published of the total,
    computed and kept up alike, is the constant sum."""
    ledger = state.scope("ledger")
    for n in range(10):
        ledger.set(f"a{n}", {"amount": 100})
    computed = state.derive(lambda r: sum(v["amount"] for v in r.scope("ledger").values("a*")))
    kept_up = state.sum("ledger", "a*", path="/amount")
    seen: list[int] = []
    computed.subscribe(lambda d: seen.append(d.value))
    kept_up.subscribe(lambda d: seen.append(d.value))
    ledger.set("a0", {"amount": 150})  # +50, published by both
    rng = random.Random(7)
    for _ in range(200):
        a, b = rng.sample(range(10), 2)
        moved = rng.randint(1, 30)
        with state.transaction("ledger") as tx:
            scope = tx["ledger"]
            scope.set(f"a{a}", {"amount": scope.get(f"a{a}")["amount"] - moved})
            scope.set(f"a{b}", {"amount": scope.get(f"a{b}")["amount"] + moved})
    settled(computed, 1050)
    settled(kept_up, 1050)
    time.sleep(0.3)
    assert seen == [1050, 1050]


# -- failures -----------------------------------------------------------------------------


def test_a_function_that_raises_keeps_its_last_good_value_and_runs_at_the_next_change(
    state: reactor.State, caplog: pytest.LogCaptureFixture
) -> None:
    box = state.scope("box")
    box.set("n", 2)
    derived = state.derive(lambda r: 10 // r.scope("box").get("n"), name="ratio")
    assert derived.value == 5
    box.set("n", 0)
    eventually(lambda: isinstance(derived.error, ZeroDivisionError), timeout=PATIENCE)
    assert derived.value == 5
    assert "derived value 'ratio' failed" in caplog.text
    box.set("n", 5)
    settled(derived, 2)
    assert derived.error is None


def test_a_result_that_is_not_a_value_is_an_error(state: reactor.State) -> None:
    derived = state.derive(lambda _reader: {1, 2})
    assert isinstance(derived.error, reactor.InvalidValueError)
    assert derived.value is None


def test_bad_arguments_are_typed_errors(state: reactor.State) -> None:
    with pytest.raises(reactor.InvalidArgumentError):
        state.derive(42)  # type: ignore[arg-type]
    with pytest.raises(reactor.InvalidArgumentError):
        state.derive(open_orders, into="orders/k")  # type: ignore[arg-type]
    with pytest.raises(reactor.InvalidArgumentError):
        state.count("orders", where=3)  # type: ignore[arg-type]
    with pytest.raises(reactor.InvalidArgumentError):
        state.sum("orders", path="amount")
    with pytest.raises(reactor.InvalidKeyError):
        state.count("", "*")
    derived = state.derive(open_orders)
    with pytest.raises(reactor.InvalidArgumentError):
        derived.wait_for(3)  # type: ignore[arg-type]


# -- waiting, watching, writing it, closing ----------------------------------------------------


def test_wait_for_checks_the_current_value_first_and_times_out(state: reactor.State) -> None:
    derived = state.derive(open_orders)
    assert derived.wait_for(lambda n: n == 0, timeout=0) == 0
    with pytest.raises(reactor.OperationTimeout):
        derived.wait_for(lambda n: n == 1, timeout=0.2)
    waiter = threading.Thread(target=lambda: state.scope("orders").set("o-1", {"status": "new"}))
    threading.Timer(0.1, waiter.start).start()
    assert derived.wait_for(lambda n: n == 1, timeout=PATIENCE) == 1
    waiter.join(PATIENCE)


def test_watch_yields_the_current_value_then_each_change_and_ends_at_close(
    state: reactor.State,
) -> None:
    counter = state.scope("c")
    counter.set("n", 0)
    derived = state.derive(lambda r: r.scope("c").get("n"))
    got: list[int] = []

    def watching() -> None:
        got.extend(published.value for published in derived.watch())

    watcher = threading.Thread(target=watching)
    watcher.start()
    eventually(lambda: got == [0])
    for n in (1, 2, 3):
        counter.set("n", n)
        settled(derived, n)
    eventually(lambda: got == [0, 1, 2, 3])
    derived.close()
    watcher.join(PATIENCE)
    assert not watcher.is_alive()


def test_into_writes_each_new_result_to_its_key(state: reactor.State) -> None:
    orders = state.scope("orders")
    derived = state.derive(open_orders, into=("board", "open"))
    assert state.scope("board").get("open") == 0  # the first, at creation
    orders.set("o-1", {"status": "new"})
    settled(derived, 1)
    eventually(lambda: state.scope("board").get("open") == 1)


def test_a_closed_value_is_computed_no_more(state: reactor.State) -> None:
    derived = state.derive(open_orders)
    derived.close()
    derived.close()  # idempotent
    state.scope("orders").set("o-1", {"status": "new"})
    time.sleep(0.3)
    assert derived.value == 0
    assert derived.recomputations == 1
    with pytest.raises(reactor.ClosedError):
        derived.subscribe(print)
    assert derived not in state.derived()


def test_closing_the_engine_ends_watches_and_subscribers(
    open_state: Any,
) -> None:
    state = open_state()
    derived = state.derive(open_orders)
    derived.subscribe(lambda _derived: None)
    ended = threading.Event()

    def watching() -> None:
        for _ in derived.watch():
            pass
        ended.set()

    threading.Thread(target=watching).start()
    before = {thread.name for thread in threading.enumerate()}
    assert any(name.startswith("reactor-derive") for name in before)
    state.close()
    assert ended.wait(PATIENCE)
    eventually(
        lambda: not any(t.name.startswith("reactor-derive") for t in threading.enumerate()),
        timeout=PATIENCE,
    )
    with pytest.raises(reactor.ClosedError):
        state.derive(open_orders)


def test_live_values_are_listed(state: reactor.State) -> None:
    first = state.derive(open_orders, name="b-open")
    second = state.count("orders", "o-*")
    assert [value.name for value in state.derived()] == ["b-open", "count orders/o-*"]
    first.close()
    second.close()
    assert state.derived() == []


# -- count and sum ------------------------------------------------------------------------------


def test_count_and_sum_follow_writes_deletes_and_expiries(
    state: reactor.State, clock: ManualClock
) -> None:
    orders = state.scope("orders")
    orders.set("o-1", {"status": "new", "amount": 5})
    orders.set("o-2", {"status": "paid", "amount": 7.5})
    orders.set("note", {"status": "new", "amount": 100})  # matches no pattern
    new = state.count("orders", "o-*", where=lambda v: v["status"] == "new")
    total = state.sum("orders", "o-*", path="/amount")
    everything = state.count("orders")
    assert (new.value, total.value, everything.value) == (1, 12.5, 3)
    orders.set("o-3", {"status": "new", "amount": 1}, ttl=10)
    orders.set("o-4", {"status": "new"})  # no number: adds nothing to the sum
    orders.delete("o-2")
    settled(new, 3)
    settled(total, 6)
    settled(everything, 4)
    clock.advance(11)
    run_upkeep(state)  # o-3 expires
    settled(new, 2)
    settled(total, 5)
    assert new.recomputations == 1  # built once, then kept up from the changes


def test_count_and_sum_match_a_brute_force_count_under_random_changes(
    open_state: Any, clock: ManualClock
) -> None:
    """A model-based campaign: random sets, deletes, expiries and transactions, and a
    restart (the engine closed and opened again, its values made anew) every third
    round; after each round the kept-up values equal a count and a sum computed from
    scratch."""
    rng = random.Random(11)
    state = open_state(clock=clock)

    def made(state: reactor.State) -> tuple[reactor.DerivedValue, reactor.DerivedValue]:
        return state.count("m", "k*", where=lambda v: v["n"] > 50), state.sum("m", "k*", path="/n")

    big, total = made(state)
    for round_number in range(9):
        if round_number % 3 == 2:  # a restart: the values are built from the database
            state.close()
            state = open_state(clock=clock)
            big, total = made(state)
        scope = state.scope("m")
        for _ in range(40):
            key = f"k{rng.randrange(30)}"
            roll = rng.random()
            if roll < 0.6:
                scope.set(key, {"n": rng.randrange(100)}, ttl=rng.choice([None, 5]))
            elif roll < 0.8:
                scope.delete(key)
            else:
                with state.transaction("m") as tx:
                    tx["m"].set(key, {"n": rng.randrange(100)})
                    tx["m"].delete(f"k{rng.randrange(30)}")
        clock.advance(rng.choice([0, 6]))
        run_upkeep(state)
        values = [v["n"] for k, v in scope.list().items() if k.startswith("k")]
        settled(big, sum(1 for n in values if n > 50))
        settled(total, sum(values))


# -- asyncio ----------------------------------------------------------------------------------


def test_asyncio_derive_awaits_and_iterates(db_path: Any) -> None:
    async def main() -> None:
        async with reactor.aio.open(db_path) as state:
            counter = state.scope("c")
            await counter.set("n", 0)

            async def doubled(r: reactor.Reader) -> int:  # a coroutine function
                return int(r.scope("c").get("n")) * 2

            derived = await state.derive(doubled, name="doubled")
            assert derived.value == 0
            kept_up = await state.sum("c", "n")
            seen: list[int] = []
            watching_began = asyncio.Event()

            async def watching() -> None:
                async for published in derived.watch():
                    seen.append(published.value)
                    watching_began.set()
                    if published.value == 6:
                        return

            watcher = asyncio.create_task(watching())
            # The watch begins with the value it finds: 0 only if it began before the
            # first set (the task runs once this coroutine awaits; a set from the loop
            # in a thread may have been applied by then).
            await asyncio.wait_for(watching_began.wait(), PATIENCE)
            for n in (1, 2, 3):
                await counter.set("n", n)
                assert await derived.wait_for(lambda v, n=n: v == 2 * n, timeout=PATIENCE) == 2 * n
            await asyncio.wait_for(watcher, PATIENCE)
            assert seen == [0, 2, 4, 6]
            assert await kept_up.wait_for(lambda total: total == 3, timeout=PATIENCE) == 3
            with pytest.raises(reactor.OperationTimeout):
                await derived.wait_for(lambda v: v == 100, timeout=0.2)
            derived.close()
            with pytest.raises(reactor.ClosedError):
                await derived.wait_for(lambda v: v == 100, timeout=PATIENCE)

    asyncio.run(main())


def test_a_key_read_alone_and_a_sum_over_its_scope_both_follow_its_changes(
    state: reactor.State,
) -> None:
    """A value reading one key (the registry listens to that key) and a sum over the
    scope (it listens to the whole scope): both follow the key's changes, each change
    counted once in the sum."""
    scope = state.scope("s")
    scope.set("k", 1)
    one = state.derive(lambda r: r.scope("s").get("k"))
    total = state.sum("s")
    for n in range(2, 12):
        scope.set("k", n)
    settled(one, 11)
    settled(total, 11)
    scope.set("other", 5)
    settled(total, 16)
