"""Transactions over several scopes (SPEC §13, with the rules of §5 for each scope),
synchronous and asyncio."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest

import reactor
import reactor.aio
from tests.conftest import engine_of

from .conftest import raw_query, wait_for

Opener = Callable[..., reactor.State]


def _log(db: Any) -> list[tuple[int, str, str, str | None]]:
    return raw_query(  # type: ignore[return-value]
        db, "SELECT revision, scope, key, new_value FROM reactor_changes ORDER BY revision"
    )


def _deferred(state: reactor.State, scope: str) -> bool:
    """Whether a request for ``scope`` waits in its actor's mailbox for a holder."""
    mailbox = engine_of(state)._mailbox(scope)
    return any(request.scope == scope for request in list(mailbox._deferred))


def _held(state: reactor.State, *scopes: str) -> bool:
    """Whether a transaction holds any of ``scopes``."""
    engine = engine_of(state)
    return any(scope in engine._mailbox(scope)._owners for scope in scopes)


def _in_other_process(db: Any, code: str) -> None:
    """Run ``code`` (with ``state`` open on ``db``) in a process of its own."""
    program = "import sys, reactor\nwith reactor.open(sys.argv[1]) as state:\n"
    program += textwrap.indent(textwrap.dedent(code), "    ")
    subprocess.run([sys.executable, "-c", program, str(db)], check=True, timeout=60)


# -- what commits, and what is published --------------------------------------------
def test_writes_to_several_scopes_commit_together_with_events_in_order(
    state: reactor.State, db_path: Any
) -> None:
    state.scope("ledger").set("revenue", 100)
    events: list[reactor.ChangeEvent] = []
    three = threading.Event()

    def on_change(event: reactor.ChangeEvent) -> None:
        events.append(event)
        if len(events) == 3:
            three.set()

    state.subscribe(on_change)
    with state.transaction("orders", "ledger") as tx:
        assert isinstance(tx, reactor.MultiTransaction)
        assert tx.names == ("ledger", "orders")  # sorted: the order they are taken in
        tx["orders"].set("o-1", {"total": 120})
        assert tx["ledger"].increment("revenue", 120) == 220
        tx["orders"].update("o-1", [reactor.ops.set("paid", True)])
        assert tx["ledger"].get("revenue") == 220  # the body sees its own writes
        assert tx["orders"].list() == {"o-1": {"paid": True, "total": 120}}
        assert tx["orders"] is tx["orders"]
        assert tx["orders"].name == "orders"
        assert isinstance(tx["orders"], reactor.Transaction)
        # Others see nothing of it yet.
        assert raw_query(db_path, "SELECT COUNT(*) FROM reactor_changes")[0][0] == 1
    assert state.scope("orders").get("o-1") == {"paid": True, "total": 120}
    assert state.scope("ledger").get("revenue") == 220
    log = _log(db_path)
    assert [(revision, scope, key) for revision, scope, key, _ in log] == [
        (1, "ledger", "revenue"),
        (2, "orders", "o-1"),
        (3, "ledger", "revenue"),
        (4, "orders", "o-1"),
    ]
    assert three.wait(10)
    assert [(e.scope, e.key, e.revision) for e in events] == [
        ("orders", "o-1", 2),
        ("ledger", "revenue", 3),
        ("orders", "o-1", 4),
    ]
    assert events[2].ops is not None


def test_a_body_that_raises_leaves_every_scope_untouched_and_publishes_nothing(
    state: reactor.State, db_path: Any
) -> None:
    state.scope("a").set("k", "kept")
    state.scope("b").set("n", 1)
    events: list[reactor.ChangeEvent] = []
    marker = threading.Event()

    def on_change(event: reactor.ChangeEvent) -> None:
        events.append(event)
        if event.scope == "marker":
            marker.set()

    state.subscribe(on_change)
    with pytest.raises(KeyError, match="boom"), state.transaction("a", "b") as tx:
        tx["a"].set("k", "changed")
        tx["a"].set("new", 1)
        tx["b"].increment("n", 10)
        tx["b"].delete("n")
        raise KeyError("boom")
    assert state.scope("a").list() == {"k": "kept"}
    assert state.scope("b").list() == {"n": 1}
    assert len(_log(db_path)) == 2
    state.scope("marker").set("k", 1)  # events come in order: the marker is the last
    assert marker.wait(10)
    assert [event.scope for event in events] == ["marker"]
    with state.transaction("a", "b") as tx:  # both scopes are free again
        tx["b"].increment("n")
    assert state.scope("b").get("n") == 2


def test_a_failing_verb_undoes_only_itself(state: reactor.State) -> None:
    with state.transaction("a", "b") as tx:
        tx["a"].set("text", "x")
        tx["b"].set("n", 1)
        with pytest.raises(reactor.TypeMismatchError):
            tx["b"].increment("text", 1, default="zero")  # type: ignore[arg-type]
        with pytest.raises(reactor.TypeMismatchError):
            tx["a"].increment("text")
        with pytest.raises(reactor.InvalidValueError):
            tx["b"].set("bad", float("nan"))
        tx["b"].increment("n")
    assert state.scope("a").list() == {"text": "x"}
    assert state.scope("b").list() == {"n": 2}


def test_a_body_that_changes_nothing_commits_nothing(state: reactor.State, db_path: Any) -> None:
    state.scope("a").set("k", 1)
    with state.transaction("a", "b") as tx:
        assert tx["a"].get("k") == 1
        assert tx["b"].list() == {}
        tx["a"].set("k", 1)
    assert len(_log(db_path)) == 1


def test_each_part_reads_its_own_scope_and_snapshots_at_the_start(state: reactor.State) -> None:
    state.scope("a").set("k", "in a")
    state.scope("b").set("k", "in b")
    with state.transaction("a", "b") as tx:
        assert tx["a"].get("k") == "in a"
        assert tx["b"].get("k") == "in b"
        tx["a"].set("only", 1)
        assert tx["b"].keys() == ["k"]
        assert tx["a"].snapshot() == reactor.Snapshot({"k": "in a", "only": 1}, 2)
        assert tx["b"].snapshot().revision == 2
    assert state.scope("b").keys() == ["k"]


def test_names_are_checked_deduplicated_and_sorted(state: reactor.State) -> None:
    with pytest.raises(reactor.InvalidArgumentError, match="at least one"):
        state.transaction()
    for bad in ("", "a\x00b", 1, None, ["a", "b"]):
        with pytest.raises(reactor.InvalidKeyError):
            state.transaction("a", bad)  # type: ignore[arg-type]
    tx = state.transaction("b", "a", "b", "a")
    assert tx.names == ("a", "b")
    assert "MultiTransaction" in repr(tx)
    with tx:
        with pytest.raises(reactor.InvalidArgumentError, match="not part of this transaction"):
            tx["c"]
        with pytest.raises(reactor.InvalidKeyError):
            tx[""]
        tx["a"].set("k", 1)
    one = state.transaction("solo")  # one scope is fine too
    with one:
        one["solo"].set("k", 1)
    assert state.scope("solo").get("k") == 1


def test_verbs_are_counted_in_stats(state: reactor.State) -> None:
    before = state.stats()["operations"].get("set", 0)
    with state.transaction("a", "b") as tx:
        tx["a"].set("k", 1)
        tx["b"].set("k", 1)
    assert state.stats()["operations"]["set"] == before + 2


# -- reentrancy --------------------------------------------------------------------
def test_the_held_scopes_own_handles_and_nesting_raise(state: reactor.State) -> None:
    a, b, other = state.scope("a"), state.scope("b"), state.scope("other")
    with state.transaction("a", "b") as tx:
        tx["a"].set("k", 1)
        for call in (
            lambda: a.set("k", 2),
            lambda: b.get("k"),
            lambda: state.scope("b").increment("n"),
            a.transaction,
            lambda: state.transaction("b"),
            lambda: state.transaction("other", "a"),
            tx["a"].transaction,
            tx["b"].__enter__,
            tx["b"].begin,
            tx.__enter__,
        ):
            with pytest.raises(reactor.ReentrancyError):
                call()
        other.set("k", "outside")  # other scopes: allowed, and not part of it
        tx["b"].set("k", 2)
    assert a.get("k") == 1
    assert b.get("k") == 2
    assert other.get("k") == "outside"
    # Used once: afterwards its parts refuse, and it cannot be entered again.
    with pytest.raises(reactor.ClosedError):
        tx["a"].get("k")
    with pytest.raises(reactor.ReentrancyError), tx:
        pass
    a.set("k", 3)  # the scopes are free
    assert a.get("k") == 3


def test_a_transaction_entered_twice_in_one_thread_is_refused(state: reactor.State) -> None:
    tx = state.transaction("a", "b")
    with tx:
        with pytest.raises(reactor.ReentrancyError), tx:
            pass
        tx["a"].set("k", 1)
    assert state.scope("a").get("k") == 1


# -- other threads -----------------------------------------------------------------
def test_a_plain_write_to_a_held_scope_waits_and_applies_after_the_commit(
    state: reactor.State,
) -> None:
    b = state.scope("b")
    b.set("n", 0)
    results: list[Any] = []

    def writer() -> None:
        results.append(b.increment("n"))

    thread = threading.Thread(target=writer)
    with state.transaction("a", "b") as tx:
        thread.start()
        wait_for(lambda: _deferred(state, "b"), 10)  # queued behind the transaction
        tx["b"].set("n", tx["b"].get("n") + 10)
        tx["a"].set("done", True)
        assert b.name == "b"
    thread.join(10)
    assert results == [11]  # it ran after the commit, on top of it
    assert b.get("n") == 11


@pytest.mark.parametrize("max_actors", [1, 8])
def test_opposite_orders_never_deadlock_and_lose_no_increment(
    open_state: Opener, max_actors: int
) -> None:
    state = open_state(timeout=10, max_actors=max_actors)  # 1: every scope on one actor
    errors: list[BaseException] = []

    def job(first: str, second: str) -> None:
        try:
            for _ in range(200):
                with state.transaction(first, second) as tx:
                    tx[first].increment("n")
                    tx[second].set("n", tx[second].get("n", 0) + 1)  # a read, then a write
        except BaseException as exc:  # reported below
            errors.append(exc)

    def plain() -> None:
        try:
            for _ in range(200):
                state.scope("a").increment("plain")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=job, args=("a", "b")),
        threading.Thread(target=job, args=("b", "a")),
        threading.Thread(target=plain),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert state.scope("a").get_many(["n", "plain"]) == {"n": 400, "plain": 200}
    assert state.scope("b").get("n") == 400


def test_the_commit_names_every_scope_to_the_store(
    state: reactor.State, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL the scopes given to a write are the advisory locks its transaction
    takes: the commit must name all of them, or another process could write one of the
    scopes between the conflict check and the commit."""
    store = engine_of(state).store
    seen: list[set[str]] = []
    write = store.write

    def spy(*args: Any, scopes: Collection[str] | None = None, **kwargs: Any) -> Any:
        seen.append(set(scopes) if scopes is not None else {"*"})
        return write(*args, scopes=scopes, **kwargs)

    monkeypatch.setattr(store, "write", spy)
    with state.transaction("z", "a", "m") as tx:
        tx["m"].set("k", 1)  # only m written: the check still covers all three
    assert seen
    assert {"a", "m", "z"} <= seen[-1]


def test_a_failure_taking_the_second_scope_hands_back_the_first(open_state: Opener) -> None:
    state = open_state(timeout=0.5)
    holding, done = threading.Event(), threading.Event()

    def holder() -> None:
        with state.scope("b").transaction() as tx:
            holding.set()
            done.wait(30)
            tx.set("k", "holder")

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert holding.wait(10)
        with pytest.raises(reactor.OperationTimeout), state.transaction("a", "b"):
            pytest.fail("the body must not run")
        assert not _held(state, "a")  # handed back at once
        state.scope("a").set("k", 1)  # the scope is free (it would time out otherwise)
    finally:
        done.set()
        thread.join(10)
    assert not _held(state, "a", "b")
    with state.transaction("a", "b") as tx:
        tx["a"].set("k", 2)
        tx["b"].set("k", 2)
    assert state.scope("b").get("k") == 2


def test_closing_the_engine_while_bodies_hold_and_wait_does_not_hang(
    open_state: Opener,
) -> None:
    state = open_state(timeout=30)
    holding, closed = threading.Event(), threading.Event()
    outcomes: dict[str, BaseException | None] = {}

    def holder() -> None:  # holds b until the engine is closed
        try:
            with state.transaction("b", "c") as tx:
                tx["b"].set("k", 1)
                holding.set()
                closed.wait(30)
        except BaseException as exc:  # checked below
            outcomes["holder"] = exc
        else:
            outcomes["holder"] = None

    def taker() -> None:  # takes a, then waits for b
        try:
            with state.transaction("a", "b"):
                outcomes["body ran"] = None
        except BaseException as exc:  # checked below
            outcomes["taker"] = exc

    threads = [threading.Thread(target=holder), threading.Thread(target=taker)]
    threads[0].start()
    assert holding.wait(10)
    threads[1].start()
    wait_for(lambda: _deferred(state, "b"), 10)
    started = time.monotonic()
    closer = threading.Thread(target=state.close)
    closer.start()
    closer.join(20)
    assert not closer.is_alive()
    assert time.monotonic() - started < 15
    closed.set()
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads)
    assert isinstance(outcomes["taker"], reactor.ClosedError)
    assert isinstance(outcomes["holder"], reactor.ClosedError)  # its commit could not run
    assert "body ran" not in outcomes


# -- other processes ---------------------------------------------------------------
def test_a_change_to_the_second_scope_from_another_process_is_a_conflict(
    state: reactor.State, db_path: Any
) -> None:
    state.scope("a").set("n", 1)
    state.scope("b").set("n", 1)
    events: list[reactor.ChangeEvent] = []
    state.subscribe(events.append, scope="[ab]")
    with pytest.raises(reactor.ConflictError, match="'b'"), state.transaction("a", "b") as tx:
        tx["a"].set("n", tx["a"].get("n") + 1)
        tx["b"].set("n", tx["b"].get("n") + 1)
        _in_other_process(db_path, 'state.scope("b").set("n", 100)')
    assert state.scope("a").get("n") == 1  # nothing of the body was applied
    assert state.scope("b").get("n") == 100  # the other process's write stands
    assert [(scope, key, value) for _, scope, key, value in _log(db_path)] == [
        ("a", "n", "1"),
        ("b", "n", "1"),
        ("b", "n", "100"),
    ]
    wait_for(lambda: len(events) == 1, 10)  # the other process's write only
    with state.transaction("a", "b") as tx:  # and the scopes work on
        tx["a"].increment("n")
        tx["b"].increment("n")
    assert state.scope("b").get("n") == 101


def test_a_change_to_a_scope_not_written_is_still_a_conflict(
    state: reactor.State, db_path: Any
) -> None:
    """The body read b to decide what to write to a: b's change invalidates it."""
    state.scope("b").set("limit", 10)
    with pytest.raises(reactor.ConflictError), state.transaction("a", "b") as tx:
        tx["a"].set("allowed", tx["b"].get("limit"))
        _in_other_process(db_path, 'state.scope("b").set("limit", 0)')
    assert state.scope("a").get("allowed") is None


TRANSFERS = """
import random, sys, threading, reactor

url, seed, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
scopes = ["s0", "s1", "s2"]
done = {"transfers": 0, "conflicts": 0}
lock = threading.Lock()

def work(state, rng):
    for _ in range(rounds):
        source, target = rng.sample(scopes, 2)
        while True:
            try:
                with state.transaction(target, source) as tx:  # any order: taken sorted
                    amount = rng.randint(1, 5)
                    tx[source].decrement("balance", amount)
                    tx[target].increment("balance", amount)
                break
            except reactor.ConflictError:
                with lock:
                    done["conflicts"] += 1
        with lock:
            done["transfers"] += 1

with reactor.open(url, timeout=20) as state:
    threads = [
        threading.Thread(target=work, args=(state, random.Random(seed * 10 + i)))
        for i in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
print(done["transfers"], done["conflicts"])
"""


def test_transfers_between_three_scopes_from_two_processes_keep_the_total(
    state: reactor.State, db_path: Any, tmp_path: Path
) -> None:
    for name in ("s0", "s1", "s2"):
        state.scope(name).set("balance", 1000)
    script = tmp_path / "transfers.py"
    script.write_text(TRANSFERS, encoding="utf-8")
    rounds = 60
    workers = [
        subprocess.Popen(
            [sys.executable, str(script), str(db_path), str(seed), str(rounds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    outputs = [worker.communicate(timeout=60)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0]
    transfers = sum(int(output.split()[0]) for output in outputs)
    assert transfers == 2 * 2 * rounds
    balances = [state.scope(name).get("balance") for name in ("s0", "s1", "s2")]
    assert sum(balances) == 3000
    # Every transfer wrote two changes in one commit: never one without the other.
    moves = [row for row in _log(db_path) if row[2] == "balance"][3:]
    assert len(moves) == 2 * transfers
    for first, second in zip(moves[::2], moves[1::2], strict=True):
        assert second[0] == first[0] + 1
        assert first[1] != second[1]


# -- asyncio -----------------------------------------------------------------------
async def test_async_writes_to_several_scopes_commit_together_or_not_at_all(
    db_path: Any,
) -> None:
    async with reactor.aio.open(db_path) as state:
        await state.scope("ledger").set("revenue", 100)
        async with state.transaction("orders", "ledger", "orders") as tx:
            assert isinstance(tx, reactor.aio.AsyncMultiTransaction)
            assert tx.names == ("ledger", "orders")
            await tx["orders"].set("o-1", {"total": 120})
            assert await tx["ledger"].increment("revenue", 120) == 220
            assert await tx["ledger"].get("revenue") == 220  # its own writes
            assert await state.scope("ledger").get("revenue") == 100  # others: not yet
            with pytest.raises(reactor.InvalidArgumentError):
                tx["payments"]
        assert await state.scope("orders").get("o-1") == {"total": 120}
        assert await state.scope("ledger").get("revenue") == 220
        events = await state.changes()
        assert [(e.scope, e.revision) for e in events] == [
            ("ledger", 1),
            ("orders", 2),
            ("ledger", 3),
        ]
        with pytest.raises(RuntimeError, match="abort"):
            async with state.transaction("orders", "ledger") as tx:
                await tx["orders"].delete("o-1")
                await tx["ledger"].set("revenue", 0)
                raise RuntimeError("abort")
        assert await state.scope("orders").get("o-1") == {"total": 120}
        assert await state.scope("ledger").get("revenue") == 220
        assert len(await state.changes()) == 3
        with pytest.raises(reactor.InvalidArgumentError):
            state.transaction()
        with pytest.raises(reactor.InvalidKeyError):
            state.transaction("a", "")


async def test_async_reentrancy(db_path: Any) -> None:
    async with reactor.aio.open(db_path) as state:
        tx = state.transaction("a", "b")
        with pytest.raises(reactor.ClosedError):
            await tx["a"].get("k")  # not begun
        async with tx:
            with pytest.raises(reactor.ReentrancyError):
                await state.scope("b").set("k", 1)
            for inner in (state.transaction("b", "c"), state.scope("a").transaction(), tx["a"]):
                with pytest.raises(reactor.ReentrancyError):
                    async with inner:
                        pass
            with pytest.raises(reactor.ReentrancyError):
                async with tx:
                    pass
            await state.scope("c").set("k", "outside")  # other scopes: allowed
            await tx["a"].set("k", 1)
        assert await state.scope("a").get("k") == 1
        with pytest.raises(reactor.ClosedError):
            await tx["a"].get("k")


async def test_async_a_cancelled_wait_for_the_scopes_hands_them_back(db_path: Any) -> None:
    async with reactor.aio.open(db_path, timeout=5) as state:
        sync = await state._sync()
        entered = asyncio.Event()

        async def waiting() -> None:
            async with state.transaction("a", "b") as tx:
                entered.set()
                await tx["a"].set("k", "waiter")

        async with state.scope("b").transaction() as held:
            waiter = asyncio.create_task(waiting())
            for _ in range(500):  # it takes a, then waits for b
                if _held(sync, "a") and _deferred(sync, "b"):
                    break
                await asyncio.sleep(0.01)
            assert _held(sync, "a")
            assert _deferred(sync, "b")
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert not _held(sync, "a")  # a went back at once
            await asyncio.wait_for(state.scope("a").set("k", "free"), 2)
            await held.set("k", "held")
        assert not entered.is_set()
        assert not _held(sync, "a", "b")
        async with state.transaction("a", "b") as tx:  # nobody holds either now
            await tx["b"].set("k", "after")
        assert await state.scope("a").get("k") == "free"
        assert await state.scope("b").get("k") == "after"


async def test_async_a_timeout_taking_the_second_scope_hands_back_the_first(
    db_path: Any,
) -> None:
    async with reactor.aio.open(db_path, timeout=0.5) as state:
        sync = await state._sync()
        holding, done = asyncio.Event(), asyncio.Event()

        async def holder() -> None:
            async with state.scope("b").transaction() as tx:
                holding.set()
                await done.wait()
                await tx.set("k", "holder")

        holder_task = asyncio.create_task(holder())
        await asyncio.wait_for(holding.wait(), 5)
        with pytest.raises(reactor.OperationTimeout):
            async with state.transaction("a", "b"):
                pytest.fail("the body must not run")
        assert not _held(sync, "a")
        await asyncio.wait_for(state.scope("a").set("k", 1), 2)
        done.set()
        await asyncio.wait_for(holder_task, 5)
        assert not _held(sync, "a", "b")
        assert await state.scope("b").get("k") == "holder"


async def test_async_opposite_orders_never_deadlock_and_lose_nothing(db_path: Any) -> None:
    async with reactor.aio.open(db_path, timeout=10) as state:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        async def job(first: str, second: str) -> None:
            for _ in range(50):
                async with state.transaction(first, second) as tx:
                    await tx[first].increment("n")
                    await tx[second].increment("n")

        ticking = asyncio.create_task(ticker())
        jobs = [job("a", "b"), job("b", "a"), job("b", "a"), job("a", "b")]
        await asyncio.wait_for(asyncio.gather(*jobs), 60)
        ticking.cancel()
        assert ticks > 10  # the loop ran on while tasks waited for the scopes
        assert await state.scope("a").get("n") == 200
        assert await state.scope("b").get("n") == 200


async def test_async_a_conflict_with_another_process(db_path: Any) -> None:
    async with reactor.aio.open(db_path) as state:
        await state.scope("b").set("n", 1)
        with pytest.raises(reactor.ConflictError):
            async with state.transaction("a", "b") as tx:
                await tx["a"].set("n", 1)
                await tx["b"].increment("n")
                await asyncio.to_thread(
                    _in_other_process, db_path, 'state.scope("b").set("n", 100)'
                )
        assert await state.scope("a").get("n") is None
        assert await state.scope("b").get("n") == 100
