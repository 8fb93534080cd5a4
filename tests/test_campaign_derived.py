"""An adversarial campaign against derived values (SPEC §15): ``state.derive``,
``state.count`` and ``state.sum`` under transfers that must never be seen half done
(in this process and from others, big transactions included), bursts from threads and
processes that must lose no update, read sets that change while writes race them,
subscribers that must get every published value once and in order, closes in the
middle of things, thousands of live values, functions and predicates that fail, and
the asyncio twins. Every check is against a brute-force reading of the database.

The writers of other processes are this module run as a program
(``python -m tests.test_campaign_derived MODE DB SEED ROUNDS``).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import reactor
import reactor.aio
from reactor import ops
from reactor.testing import ManualClock, run_upkeep
from tests.conftest import wait_for as eventually

PATIENCE = 20.0  # seconds any one wait may take (the machine is shared)
REPO = Path(__file__).resolve().parent.parent
ACCOUNTS = [f"acc{n}" for n in range(5)]
BIG = 1500  # keys of one transaction: more than the follower's page of 1,000 records


# -- helpers ----------------------------------------------------------------------------------


def settled(derived: Any, expected: Any, timeout: float = PATIENCE) -> Any:
    """Wait until ``derived`` holds ``expected`` (JSON equality); its value."""
    return derived.wait_for(lambda value: value == expected, timeout=timeout)


class Recorder:
    """A subscriber that keeps every ``Derived`` it is handed, thread-safely."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self._lock = threading.Lock()
        self._got: list[reactor.Derived] = []

    def __call__(self, derived: reactor.Derived) -> None:
        if self.delay:
            time.sleep(self.delay)
        with self._lock:
            self._got.append(derived)

    @property
    def got(self) -> list[reactor.Derived]:
        with self._lock:
            return list(self._got)

    def values(self) -> list[Any]:
        return [derived.value for derived in self.got]


def assert_in_order_once(got: list[reactor.Derived]) -> None:
    """Each published value once, in revision order: revisions rise strictly, each
    ``old_value`` is the value handed before it, and no two neighbours are equal."""
    for before, after in itertools.pairwise(got):
        assert after.revision > before.revision, (before, after)
        assert after.old_value == before.value, (before, after)
        assert after.value != before.value, (before, after)


def spawn(db: Any, mode: str, seed: int, rounds: int) -> subprocess.Popen[str]:
    """This module as a writer process (``MODE`` of ``_writer_main``) on ``db``."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.test_campaign_derived",
            mode,
            str(db),
            str(seed),
            str(rounds),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(processes: list[subprocess.Popen[str]], timeout: float = 120.0) -> None:
    """Wait for each writer process; each must have succeeded."""
    for process in processes:
        try:
            _, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            pytest.fail("a writer process did not finish in time")
        assert process.returncode == 0, err


def run_threads(targets: list[Callable[[], None]], timeout: float = 60.0) -> None:
    """Run each target on a thread of its own; re-raise the first failure."""
    failures: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as exc:  # handed to the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=guarded, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a writer thread did not finish in time"
    if failures:
        raise failures[0]


def retrying(state: reactor.State, scopes: list[str], body: Callable[[Any], None]) -> None:
    """Run ``body(tx)`` in a transaction of ``scopes``, again on ``ConflictError``."""
    while True:
        try:
            with state.transaction(*scopes) as tx:
                body(tx)
            return
        except reactor.ConflictError:
            time.sleep(0.001)


def transfer(state: reactor.State, rng: random.Random) -> None:
    """One random transfer, in a transaction: within scope ``a`` or ``b``, or across
    both with a move back of the same amount, so that each scope's total stays put."""
    moved = rng.randint(1, 20)
    if rng.random() < 0.5:
        scope = rng.choice(["a", "b"])
        x, y = rng.sample(ACCOUNTS, 2)
        moves = [(scope, x, -moved), (scope, y, moved)]
    else:
        x, y, z, w = (rng.choice(ACCOUNTS) for _ in range(4))
        moves = [("a", x, -moved), ("b", y, moved), ("b", z, -moved), ("a", w, moved)]

    def body(tx: Any) -> None:
        for scope, key, delta in moves:
            held = tx[scope]
            held.set(key, {"amount": held.get(key)["amount"] + delta})

    retrying(state, sorted({scope for scope, _, _ in moves}), body)


def big_transaction(state: reactor.State, step: int) -> None:
    """``BIG`` keys of scope ``big`` in one transaction: the first half ``+step``, the
    second ``-step`` (their total stays 0; the first 1,000 changes alone are not)."""

    def body(tx: Any) -> None:
        for n in range(BIG):
            tx["big"].set(f"k{n:04d}", {"amount": step if n < BIG // 2 else -step})

    retrying(state, ["big"], body)


def pointed(reader: Any) -> dict[str, Any]:
    """What ``ptr`` points at in ``data``: one key (``to``) and a prefix's keys."""
    ptr, data = reader.scope("ptr"), reader.scope("data")
    to, prefix = ptr.get("to"), ptr.get("prefix")
    return {
        "to": to,
        "one": None if to is None else data.get(to),
        "many": {} if prefix is None else data.list(f"{prefix}*"),
    }


def scramble(state: reactor.State, rng: random.Random, rounds: int) -> None:
    """Move ``ptr`` about and write ``data`` keys, some at a time in one transaction."""
    ptr, data = state.scope("ptr"), state.scope("data")
    for n in range(rounds):
        roll = rng.random()
        if roll < 0.25:
            ptr.set("to", f"d{rng.randrange(8)}")
        elif roll < 0.4:
            ptr.set("prefix", rng.choice(["x", "y", "z"]))
        elif roll < 0.5:
            data.delete(f"{rng.choice('dxyz')}{rng.randrange(4)}")
        elif roll < 0.6:

            def body(tx: Any, n: int = n) -> None:
                tx["ptr"].set("to", f"d{rng.randrange(8)}")
                tx["data"].set(f"d{rng.randrange(8)}", n)

            retrying(state, ["data", "ptr"], body)
        else:
            data.set(f"{rng.choice('dddxyz')}{rng.randrange(8)}", n)


def _writer_main(argv: list[str]) -> None:
    """The writer processes: ``MODE DB SEED ROUNDS``."""
    mode, db, seed, rounds = argv[0], argv[1], int(argv[2]), int(argv[3])
    rng = random.Random(seed)
    with reactor.open(db) as state:
        if mode == "big":
            for step in range(1, rounds + 1):
                big_transaction(state, step)
            state.scope("big").set(f"zdone{seed}", {"amount": 0})
        elif mode == "transfers":
            for _ in range(rounds):
                transfer(state, rng)
                state.scope("noise").set(f"n{rng.randrange(20)}", rng.random())
        elif mode == "increments":
            counters = state.scope("c")
            for _ in range(rounds):
                if rng.random() < 0.8:
                    counters.increment(f"k{rng.randrange(20)}")
                else:  # drawn before: a retried body draws nothing again
                    first, second = f"k{rng.randrange(20)}", f"k{rng.randrange(20)}"

                    def body(tx: Any, first: str = first, second: str = second) -> None:
                        tx["c"].increment(first)
                        tx["c"].increment(second, 2)

                    retrying(state, ["c"], body)
        elif mode == "scramble":
            scramble(state, rng, rounds)
        else:
            raise SystemExit(f"unknown mode {mode!r}")


def derive_threads() -> list[str]:
    """The names of the derived values' threads alive now."""
    return [t.name for t in threading.enumerate() if t.name.startswith("reactor-derive")]


# -- never half a commit ---------------------------------------------------------------------


def test_transfers_by_threads_and_processes_are_never_half_seen(db_path: Any) -> None:
    """Threads here and two other processes move amounts in transactions of one scope
    and of two (``state.transaction("a", "b")``): the computed total, the sums kept up
    per scope and a computed pair publish nothing, since every snapshot has the same
    totals, until one deliberate change that each publishes exactly once."""
    with reactor.open(db_path) as state:
        for scope in ("a", "b"):
            state.scope(scope).set_many({key: {"amount": 100} for key in ACCOUNTS})

        def total(r: reactor.Reader) -> int:
            return sum(v["amount"] for s in ("a", "b") for v in r.scope(s).values("acc*"))

        def pair(r: reactor.Reader) -> list[int]:
            return [sum(v["amount"] for v in r.scope(s).values()) for s in ("a", "b")]

        values = {
            "total": state.derive(total, name="total"),
            "pair": state.derive(pair, name="pair"),
            "sum a": state.sum("a", "acc*", path="/amount"),
            "sum b": state.sum("b", path="/amount"),
        }
        assert [v.value for v in values.values()] == [1000, [500, 500], 500, 500]
        recorders = {name: Recorder() for name in values}
        for name, value in values.items():
            value.subscribe(recorders[name])
        writers = [spawn(db_path, "transfers", seed, 150) for seed in (1, 2)]

        def transfers(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(120):
                transfer(state, rng)

        run_threads([lambda seed=seed: transfers(seed) for seed in (3, 4)])
        finish(writers)
        state.scope("a").set("acc0", {"amount": state.scope("a").get("acc0")["amount"] + 7})
        settled(values["total"], 1007)
        settled(values["pair"], [507, 500])
        settled(values["sum a"], 507)
        time.sleep(0.5)  # a late, torn publication would show now
        assert recorders["total"].values() == [1007]
        assert recorders["pair"].values() == [[507, 500]]
        assert recorders["sum a"].values() == [507]
        assert recorders["sum b"].values() == []
        assert values["sum b"].value == 500
        assert values["total"].recomputations > 1  # it did run again on the transfers


def _big_transactions_scenario(
    db_path: Any, make: Callable[[reactor.State], Any], in_process: bool
) -> None:
    """Transactions of ``BIG`` keys (here, or by another process) whose total is 0:
    the value ``make`` builds must publish nothing but 0 until a last change (+1)."""
    with reactor.open(db_path) as state:
        big_transaction(state, 0)
        value = make(state)
        assert value.value == 0
        recorder = Recorder()
        value.subscribe(recorder)
        if in_process:
            for step in (1, 2, 3):
                big_transaction(state, step)
        else:
            finish([spawn(db_path, "big", 1, 3)])
        state.scope("big").set("zlast", {"amount": 1})
        settled(value, 1)
        time.sleep(0.3)
        assert recorder.values() == [1], "a value showed part of a big transaction"
        assert_in_order_once(recorder.got)


def test_a_computed_total_never_shows_part_of_a_big_transaction_of_another_process(
    db_path: Any,
) -> None:
    _big_transactions_scenario(
        db_path,
        lambda state: state.derive(
            lambda r: sum(v["amount"] for v in r.scope("big").values()), name="big total"
        ),
        in_process=False,
    )


def test_a_kept_up_sum_never_shows_part_of_a_big_transaction_of_this_process(
    db_path: Any,
) -> None:
    _big_transactions_scenario(
        db_path, lambda state: state.sum("big", path="/amount"), in_process=True
    )


def test_a_kept_up_sum_never_shows_part_of_a_big_transaction_of_another_process(
    db_path: Any,
) -> None:
    _big_transactions_scenario(
        db_path, lambda state: state.sum("big", path="/amount"), in_process=False
    )


# -- no lost update -------------------------------------------------------------------------


def test_bursts_from_threads_and_processes_lose_no_update(db_path: Any) -> None:
    """Increments of 20 counters by three threads and two processes, alone or two in a
    transaction: once they are over, the computed map, the count and the sum equal a
    brute-force reading, and the sum is every increment made."""
    with reactor.open(db_path) as state:
        counters = state.scope("c")
        whole = state.derive(lambda r: r.scope("c").list("k*"), name="map")
        how_many = state.count("c", "k*")
        total = state.sum("c", "k*")
        by_threads = 0
        lock = threading.Lock()

        def bump(seed: int) -> None:
            nonlocal by_threads
            rng = random.Random(seed)
            for _ in range(100):
                counters.increment(f"k{rng.randrange(20)}")
                with lock:
                    by_threads += 1

        writers = [spawn(db_path, "increments", seed, 150) for seed in (5, 6)]
        run_threads([lambda seed=seed: bump(seed) for seed in (7, 8, 9)])
        finish(writers)
        brute = counters.list()
        expected = by_threads + sum(  # what the processes added, replayed
            _increments_of(seed, 150) for seed in (5, 6)
        )
        assert sum(brute.values()) == expected
        settled(whole, brute)
        settled(how_many, len(brute))
        settled(total, expected)
        time.sleep(0.3)
        assert (whole.value, how_many.value, total.value) == (brute, len(brute), expected)


def _increments_of(seed: int, rounds: int) -> int:
    """What the ``increments`` writer with ``seed`` adds in all (its draws replayed)."""
    rng = random.Random(seed)
    added = 0
    for _ in range(rounds):
        if rng.random() < 0.8:
            rng.randrange(20)
            added += 1
        else:
            rng.randrange(20)
            rng.randrange(20)
            added += 3
    return added


def _numbers(scope: reactor.Scope, prefix: str) -> list[Any]:
    """The values of ``scope``'s keys that begin with ``prefix`` (read now)."""
    return [value for key, value in scope.list().items() if key.startswith(prefix)]


def _n_of(value: Any) -> Any:
    """What ``sum(..., path="/n")`` adds for ``value``: its number ``n``, or 0."""
    found = value.get("n") if isinstance(value, dict) else None
    return found if isinstance(found, int | float) and not isinstance(found, bool) else 0


def test_count_and_sum_match_brute_force_under_every_kind_of_write(
    state: reactor.State, clock: ManualClock
) -> None:
    """Random sets (with and without TTL), deletes, ``clear(pattern)``, update ops,
    ``expire``, writes to keys past their deadline before the sweep, and transactions
    mixing them: after each round's sweep, two counts and two sums (one kept up with
    ``where``) equal a count and a sum from scratch, and so does a computed twin."""
    rng = random.Random(2024)
    m = state.scope("m")
    big = state.count("m", "k*", where=lambda v: _n_of(v) > 50)
    every = state.count("m", "k*")
    total = state.sum("m", "k*", path="/n")
    small_total = state.sum("m", "k*", path="/n", where=lambda v: _n_of(v) <= 50)
    computed = state.derive(
        lambda r: [len(r.scope("m").keys("k*")), sum(_n_of(v) for v in r.scope("m").values("k*"))]
    )

    def key() -> str:
        return f"k{rng.randrange(25)}"

    def one_write(scope: Any) -> None:
        roll = rng.random()
        if roll < 0.35:
            scope.set(key(), {"n": rng.randrange(100)}, ttl=rng.choice([None, None, 5, 20]))
        elif roll < 0.45:
            scope.delete(key())
        elif roll < 0.5:
            scope.clear(f"k{rng.randrange(3)}*")
        elif roll < 0.7:
            scope.update(key(), [ops.increment("n", rng.randint(-30, 30))])
        elif roll < 0.75:
            scope.update(key(), [ops.remove("n")])
        elif roll < 0.8:
            scope.set(key(), {"note": "no number"})
        elif roll < 0.85:
            scope.expire(key(), rng.choice([None, 3, 0]))
        else:
            scope.set(f"other{rng.randrange(5)}", {"n": 1000})  # matches no pattern

    for _round in range(10):
        for _ in range(30):
            if rng.random() < 0.2:
                with state.transaction("m") as tx:
                    for _ in range(rng.randint(2, 5)):
                        one_write(tx["m"])
            else:
                one_write(m)
        clock.advance(rng.choice([0, 4, 6, 21]))
        for _ in range(5):  # writes that meet keys past their deadline, not swept yet
            one_write(m)
        run_upkeep(state)
        values = _numbers(m, "k")
        settled(every, len(values))
        settled(big, sum(1 for v in values if _n_of(v) > 50))
        settled(total, sum(_n_of(v) for v in values))
        settled(small_total, sum(_n_of(v) for v in values if _n_of(v) <= 50))
        settled(computed, [len(values), sum(_n_of(v) for v in values)])
    assert every.recomputations == big.recomputations == 1  # kept up, never rebuilt


def test_a_count_made_after_a_deadline_before_the_sweep_stays_right(
    state: reactor.State, clock: ManualClock
) -> None:
    m = state.scope("m")
    m.set("k1", 1, ttl=10)
    m.set("k2", 2)
    clock.advance(11)  # k1 is past its deadline; nothing swept it yet
    count, total = state.count("m"), state.sum("m")
    assert (count.value, total.value) == (1, 2)
    run_upkeep(state)  # k1's "expired" event
    m.set("k3", 3)  # a later change: published after the expiry was applied
    settled(total, 5, timeout=5)
    settled(count, 2, timeout=5)


# -- read sets that change --------------------------------------------------------------------


def test_a_read_set_that_changes_while_writes_race_it_ends_right(db_path: Any) -> None:
    """Values that read what a pointer names (a key, a prefix's keys) while threads
    and a process move the pointer and write the data: once they are over, each value
    is what a brute-force reading gives, follows a write of what it reads now, and
    is not computed for a write of what it read only before."""
    with reactor.open(db_path) as state:
        state.scope("ptr").set_many({"to": "d0", "prefix": "x"})
        values = [state.derive(pointed, name=f"pointed {n}") for n in range(3)]
        writer = spawn(db_path, "scramble", 11, 300)
        run_threads(
            [lambda seed=seed: scramble(state, random.Random(seed), 300) for seed in (12, 13)]
        )
        finish([writer])

        def brute() -> dict[str, Any]:
            ptr, data = state.scope("ptr"), state.scope("data")
            to, prefix = ptr.get("to"), ptr.get("prefix")
            many = {k: v for k, v in data.list().items() if k.startswith(prefix)}
            return {"to": to, "one": data.get(to), "many": many}

        expected = brute()
        for value in values:
            settled(value, expected)
        to, prefix = expected["to"], state.scope("ptr").get("prefix")
        state.scope("data").set(to, "fresh")
        for value in values:
            eventually(lambda value=value: value.value["one"] == "fresh", timeout=PATIENCE)
        time.sleep(0.2)
        runs = [value.recomputations for value in values]
        stale = next(f"d{n}" for n in range(8) if f"d{n}" != to)
        other = next(p for p in "xyz" if p != prefix)
        state.scope("data").set(stale, "unread")  # read before, by some runs: not now
        state.scope("data").set(f"{other}0", "unread")
        time.sleep(0.5)
        assert [value.recomputations for value in values] == runs


# -- subscribers and watches --------------------------------------------------------------


def test_every_subscriber_gets_every_value_once_in_order_slow_ones_too(
    state: reactor.State,
) -> None:
    """Three threads increment one counter in a burst: a quick and a slow subscriber
    get the same values, each once, rising, chained by ``old_value``; a watch that
    falls behind may skip, but only forward, and ends on the last value."""
    counter = state.scope("c")
    counter.set("n", 0)
    derived = state.derive(lambda r: r.scope("c").get("n"))
    quick, slow = Recorder(), Recorder(delay=0.003)
    derived.subscribe(quick)
    stop_slow = derived.subscribe(slow)
    watched: list[reactor.Derived] = []

    def watching() -> None:
        for published in derived.watch():
            watched.append(published)
            time.sleep(0.002)
            if published.value == 450:
                return

    watcher = threading.Thread(target=watching)
    watcher.start()
    run_threads([lambda: [counter.increment("n") for _ in range(150)] for _ in range(3)])
    settled(derived, 450)
    eventually(lambda: quick.got and quick.got[-1].value == 450, timeout=PATIENCE)
    eventually(lambda: slow.got and slow.got[-1].value == 450, timeout=PATIENCE)
    watcher.join(PATIENCE)
    assert not watcher.is_alive()
    assert quick.got == slow.got
    assert_in_order_once(quick.got)
    values = [published.value for published in quick.got]
    assert values == sorted(set(values))
    assert [published.value for published in watched] == sorted({p.value for p in watched})
    assert watched[-1].value == 450
    stop_slow()
    counter.increment("n")
    settled(derived, 451)
    eventually(lambda: quick.got[-1].value == 451, timeout=PATIENCE)
    time.sleep(0.2)
    assert slow.got[-1].value == 450  # stopped: no more calls


def test_closing_a_value_during_a_burst_stops_it_at_once(state: reactor.State) -> None:
    """``close()`` while a thread writes: no subscriber call after it returns, no
    further computation (one under way may end), watches end, and ``wait_for`` calls
    that raced it raise ``ClosedError`` at once."""
    counter = state.scope("c")
    derived = state.derive(lambda r: r.scope("c").get("n", 0))
    recorder = Recorder(delay=0.001)
    derived.subscribe(recorder)
    outcomes: list[BaseException | Any] = []

    def waiting() -> None:
        try:
            outcomes.append(derived.wait_for(lambda n: n < 0, timeout=PATIENCE))
        except BaseException as exc:  # what it raised is the result
            outcomes.append(exc)

    waiters = [threading.Thread(target=waiting) for _ in range(4)]
    watch_ended = threading.Event()

    def watching() -> None:
        for _ in derived.watch():
            pass
        watch_ended.set()

    for thread in [*waiters, threading.Thread(target=watching)]:
        thread.start()
    writing = threading.Event()

    def write() -> None:
        n = 0
        while not writing.is_set():
            n += 1
            counter.set("n", n)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        eventually(lambda: len(recorder.got) >= 20, timeout=PATIENCE)
        closing = time.monotonic()
        derived.close()
        assert time.monotonic() - closing < 10
        calls, runs = len(recorder.got), derived.recomputations
        for thread in waiters:
            thread.join(5)
            assert not thread.is_alive(), "a wait_for outlived the close"
        assert watch_ended.wait(5)
        time.sleep(0.3)
    finally:
        writing.set()
        writer.join(PATIENCE)
    assert len(recorder.got) == calls
    assert derived.recomputations <= runs + 1
    assert len(outcomes) == 4
    assert all(isinstance(outcome, reactor.ClosedError) for outcome in outcomes), outcomes
    assert_in_order_once(recorder.got)


def test_closing_the_engine_while_a_computation_is_under_way_does_not_hang(
    open_state: Callable[..., reactor.State],
) -> None:
    """The function is stuck in a computation when the engine closes: ``close``
    returns within bounds, a ``wait_for`` raises ``ClosedError``, and once the
    function returns every derived values' thread ends."""
    state = open_state()
    state.scope("s").set("n", 0)
    inside, release = threading.Event(), threading.Event()

    def stuck(r: reactor.Reader) -> Any:
        n = r.scope("s").get("n")
        if n == 1:
            inside.set()
            release.wait(PATIENCE)
            return [n, r.scope("s").get("other")]  # reads after the engine closed
        return n

    derived = state.derive(stuck)
    derived.subscribe(lambda _derived: None)
    outcome: list[BaseException | Any] = []

    def waiting() -> None:
        try:
            outcome.append(derived.wait_for(lambda v: v == "never", timeout=PATIENCE))
        except BaseException as exc:  # what it raised is the result
            outcome.append(exc)

    waiter = threading.Thread(target=waiting)
    waiter.start()
    state.scope("s").set("n", 1)
    assert inside.wait(PATIENCE)
    closer = threading.Thread(target=state.close)
    began = time.monotonic()
    closer.start()
    try:
        closer.join(PATIENCE)
        took = time.monotonic() - began
        assert not closer.is_alive(), "state.close() hung on a computation under way"
    finally:
        release.set()
    waiter.join(5)
    assert not waiter.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], reactor.ClosedError), outcome
    eventually(lambda: not derive_threads(), timeout=PATIENCE)
    closer.join(PATIENCE)
    assert took < PATIENCE


# -- many values ----------------------------------------------------------------------------


def test_thousands_of_values_only_the_one_touched_is_computed_again(
    state: reactor.State,
) -> None:
    """Thousands of values read a distinct key each (and one lists a pattern): writes
    of other keys of that scope, and of other scopes, compute none of them; a write of
    one key computes exactly its value, once."""
    many = 5000
    scope = state.scope("many")
    scope.set_many({f"k{n}": n for n in range(many)})
    values = [
        state.derive(lambda r, n=n: r.scope("many").get(f"k{n}"), name=f"v{n}") for n in range(many)
    ]
    listing = state.derive(lambda r: len(r.scope("many").keys("p-*")), name="listing")
    assert all(value.value == n for n, value in enumerate(values))
    assert sum(value.recomputations for value in values) == many

    for n in range(200):
        scope.set(f"unrelated{n}", n)
        state.scope("elsewhere").set(f"k{n}", n)
    scope.set("k7", "seven")
    settled(values[7], "seven")
    scope.set("p-1", 1)
    settled(listing, 1)
    time.sleep(0.5)
    runs = [value.recomputations for value in values]
    assert runs[7] == 2
    assert sum(runs) == many + 1
    assert listing.recomputations == 2
    assert [value.value for value in values[:10]] == [0, 1, 2, 3, 4, 5, 6, "seven", 8, 9]


# -- failures ----------------------------------------------------------------------------------


def test_a_function_that_raises_sometimes_keeps_the_last_good_value(
    state: reactor.State,
) -> None:
    """The function raises for every third value: each time, ``error`` holds it and
    the value stays the last good one; a good run clears ``error``; subscribers get
    the good values only, in order."""
    box = state.scope("box")
    box.set("n", 1)

    def picky(r: reactor.Reader) -> int:
        n = int(r.scope("box").get("n"))
        if n % 3 == 0:
            raise ValueError(f"no multiple of 3: {n}")
        return n * 10

    derived = state.derive(picky)
    recorder = Recorder()
    derived.subscribe(recorder)
    good: list[int] = []
    for n in range(2, 20):
        box.set("n", n)
        if n % 3 == 0:
            eventually(
                lambda n=n: (
                    isinstance(derived.error, ValueError) and f": {n}" in str(derived.error)
                ),
                timeout=PATIENCE,
            )
            assert derived.value == (n - 1) * 10
        else:
            settled(derived, n * 10)
            assert derived.error is None
            good.append(n * 10)
    eventually(lambda: len(recorder.got) == len(good), timeout=PATIENCE)
    assert recorder.values() == good
    assert_in_order_once(recorder.got)


@pytest.mark.parametrize(
    "bad",
    [{1, 2}, float("nan"), math.inf, object(), {3: "int key"}, (1, 2)],
    ids=["set", "nan", "inf", "object", "int-key", "tuple"],
)
def test_a_result_that_is_not_json_is_an_error_and_keeps_the_last_good_value(
    state: reactor.State, bad: Any
) -> None:
    box = state.scope("box")
    box.set("bad", False)
    derived = state.derive(lambda r: bad if r.scope("box").get("bad") else {"ok": 1})
    recorder = Recorder()
    derived.subscribe(recorder)
    box.set("bad", True)
    eventually(lambda: isinstance(derived.error, reactor.InvalidValueError), timeout=PATIENCE)
    assert derived.value == {"ok": 1}
    box.set("bad", False)
    eventually(lambda: derived.error is None, timeout=PATIENCE)
    time.sleep(0.2)
    assert derived.value == {"ok": 1}
    assert recorder.got == []  # nothing new to publish: the good value never changed


def test_a_where_that_raises_keeps_the_last_good_count_and_recovers(
    state: reactor.State,
) -> None:
    """``where`` raises on one value: the count keeps its last good value with the
    error; later changes while the bad value is there do not publish a wrong count;
    once it is gone the count is right again and the error cleared."""
    orders = state.scope("orders")
    for n in range(5):
        orders.set(f"o-{n}", {"status": "new"})
    new = state.count("orders", "o-*", where=lambda v: v["status"] == "new")
    paid = state.sum("orders", "o-*", path="/amount", where=lambda v: v["status"] != "new")
    assert (new.value, paid.value) == (5, 0)
    recorder = Recorder()
    new.subscribe(recorder)
    orders.set("o-bad", {"no status": True})
    eventually(lambda: isinstance(new.error, KeyError), timeout=PATIENCE)
    eventually(lambda: isinstance(paid.error, KeyError), timeout=PATIENCE)
    assert (new.value, paid.value) == (5, 0)
    orders.set("o-9", {"status": "new"})
    orders.set("o-0", {"status": "paid", "amount": 4})
    time.sleep(0.3)
    assert new.value == 5
    assert isinstance(new.error, KeyError)
    orders.delete("o-bad")
    settled(new, 5)  # o-9 came, o-0 went
    settled(paid, 4)
    eventually(lambda: new.error is None and paid.error is None, timeout=PATIENCE)
    orders.set("o-10", {"status": "new"})
    settled(new, 6)
    eventually(lambda: recorder.got, timeout=PATIENCE)
    time.sleep(0.2)
    assert recorder.values() == [6]  # nothing was published while where failed


def test_a_count_counts_keys_that_hold_null(state: reactor.State) -> None:
    m = state.scope("m")
    m.set("a", None)
    m.set("b", 1)
    assert m.exists("a")
    count = state.count("m")
    nulls = state.count("m", where=lambda v: v is None)
    computed = state.derive(lambda r: len(r.scope("m").keys()))
    m.set("c", None)
    settled(computed, 3)
    settled(count, 3, timeout=5)
    settled(nulls, 2, timeout=5)


def test_a_float_sum_equals_the_sum_of_the_values_there(state: reactor.State) -> None:
    m = state.scope("m")
    total = state.sum("m")
    m.set("f1", 0.1)
    m.set("f2", 0.2)
    m.delete("f1")
    computed = state.derive(lambda r: sum(r.scope("m").values()))
    settled(computed, 0.2)
    settled(total, 0.2, timeout=5)
    m.delete("f2")
    settled(total, 0, timeout=5)


def test_publication_follows_json_equality(state: reactor.State) -> None:
    """Written one at a time, each computed: ``1.0`` after ``1``, ``[1.0]`` after
    ``[1]`` and a dict in another key order are not published; ``True`` after ``1.0``,
    ``[1]`` after ``True`` are."""
    box = state.scope("box")
    box.set("v", 1)
    derived = state.derive(lambda r: r.scope("box").get("v"))
    recorder = Recorder()
    derived.subscribe(recorder)
    for value in [1.0, True, [1], [1.0], {"a": 1, "b": 2}, {"b": 2, "a": 1.0}, 0]:
        runs = derived.recomputations
        box.set("v", value)  # a change of the stored text each time: computed again
        eventually(lambda runs=runs: derived.recomputations > runs, timeout=PATIENCE)
    time.sleep(0.2)
    got = recorder.values()
    assert [type(v) for v in got] == [bool, list, dict, int], got
    assert got[0] is True
    assert got[-1] == 0
    assert_in_order_once(recorder.got)


def test_into_writes_each_published_value_once_in_order(db_path: Any) -> None:
    """``into``: the key's history is the sequence of values published (the first at
    creation), with no repeat and none out of order, and another process reads the
    last one."""
    with reactor.open(db_path) as state:
        counter = state.scope("c")
        counter.set("n", 0)
        derived = state.derive(lambda r: r.scope("c").get("n") // 3, into=("board", "third"))
        recorder = Recorder()
        derived.subscribe(recorder)
        run_threads([lambda: [counter.increment("n") for _ in range(90)] for _ in range(2)])
        settled(derived, 60)
        eventually(lambda: state.scope("board").get("third") == 60, timeout=PATIENCE)
        time.sleep(0.3)
        history = [event.new_value for event in state.scope("board").history("third")]
        assert history == [0, *recorder.values()]
        assert history == sorted(set(history))
        script = "import sys, reactor\nprint(reactor.open(sys.argv[1]).scope('board').get('third'))"
        read = subprocess.run(
            [sys.executable, "-c", script, str(db_path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert read.returncode == 0, read.stderr
        assert read.stdout.strip() == "60"


# -- asyncio ------------------------------------------------------------------------------------


def test_asyncio_transfers_are_never_half_seen_and_watch_in_order(db_path: Any) -> None:
    """The asyncio twin: a coroutine function's total and a kept-up sum while tasks
    move amounts in transactions of two scopes; nothing published but the one last
    change; a watch sees the current value, then that one."""

    async def main() -> None:
        async with reactor.aio.open(db_path) as state:
            for scope in ("a", "b"):
                await state.scope(scope).set_many({key: {"amount": 100} for key in ACCOUNTS})

            async def total(r: reactor.Reader) -> int:
                await asyncio.sleep(0)
                return sum(v["amount"] for s in ("a", "b") for v in r.scope(s).values())

            computed = await state.derive(total, name="total")
            kept_up = await state.sum("a", path="/amount")
            assert (computed.value, kept_up.value) == (1000, 500)
            recorders = [Recorder(), Recorder()]
            computed.subscribe(recorders[0])
            kept_up.subscribe(recorders[1])
            watched: list[reactor.Derived] = []

            async def watching() -> None:
                watched.extend([published async for published in computed.watch()])

            watcher = asyncio.create_task(watching())

            async def move(seed: int) -> None:
                rng = random.Random(seed)
                for _ in range(40):
                    x, y, z, w = (rng.choice(ACCOUNTS) for _ in range(4))
                    moved = rng.randint(1, 20)
                    async with state.transaction("a", "b") as tx:
                        for scope, key, delta in (
                            ("a", x, -moved),
                            ("b", y, moved),
                            ("b", z, -moved),
                            ("a", w, moved),
                        ):
                            held = tx[scope]
                            await held.set(key, {"amount": (await held.get(key))["amount"] + delta})

            await asyncio.wait_for(asyncio.gather(move(1), move(2), move(3)), 60)
            acc0 = await state.scope("a").get("acc0")
            await state.scope("a").set("acc0", {"amount": acc0["amount"] + 1})
            assert await computed.wait_for(lambda v: v == 1001, timeout=PATIENCE) == 1001
            assert await kept_up.wait_for(lambda v: v == 501, timeout=PATIENCE) == 501
            await asyncio.sleep(0.3)
            assert [r.values() for r in recorders] == [[1001], [501]]
            computed.close()
            await asyncio.wait_for(watcher, PATIENCE)
            assert [w.value for w in watched] == [1000, 1001]

    asyncio.run(main())


def test_asyncio_wait_for_racing_close_raises_closed(db_path: Any) -> None:
    async def main() -> None:
        async with reactor.aio.open(db_path) as state:
            counter = state.scope("c")
            await counter.set("n", 0)
            derived = await state.count("c")
            waits = [
                asyncio.create_task(derived.wait_for(lambda n: n > 1000, timeout=PATIENCE))
                for _ in range(5)
            ]

            async def burst() -> None:
                for n in range(50):
                    await counter.set(f"k{n}", n)

            writer = asyncio.create_task(burst())
            await derived.wait_for(lambda n: n >= 10, timeout=PATIENCE)
            derived.close()
            outcomes = await asyncio.wait_for(
                asyncio.gather(*waits, return_exceptions=True), timeout=5
            )
            assert all(isinstance(o, reactor.ClosedError) for o in outcomes), outcomes
            await asyncio.wait_for(writer, PATIENCE)

    asyncio.run(main())


def test_asyncio_wait_for_with_no_time_left_checks_the_current_value(db_path: Any) -> None:
    async def main() -> None:
        async with reactor.aio.open(db_path) as state:
            derived = await state.count("c")
            assert await derived.wait_for(lambda n: n == 0, timeout=0) == 0

    asyncio.run(main())


def test_counts_made_while_writes_go_on_end_right(state: reactor.State) -> None:
    """Counts and sums made one after another while a thread writes their scope: once
    the writes are over, each equals a brute-force count and sum (none lost a change
    that came while it was being built)."""
    scope = state.scope("w")
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            if n % 7 == 0:
                scope.delete(f"k{(n * 13) % 300}")
            else:
                scope.set(f"k{n % 300}", n)
            n += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        made = [state.count("w") if n % 2 else state.sum("w") for n in range(40)]
    finally:
        stop.set()
        writer.join(PATIENCE)
    values = scope.list()
    for n, aggregate in enumerate(made):
        settled(aggregate, len(values) if n % 2 else sum(values.values()))


def test_a_count_is_computed_at_creation_even_if_a_commit_comes_meanwhile(
    state: reactor.State,
) -> None:
    """A commit lands while ``count`` reads its snapshot (another thread writes while
    ``where`` runs, as a concurrent writer would): the count still has a value when
    ``state.count`` returns."""
    scope = state.scope("w")
    scope.set_many({f"k{n}": n for n in range(5)})
    wrote = threading.Event()

    def where(value: Any) -> bool:
        if not wrote.is_set():
            wrote.set()
            writer = threading.Thread(target=lambda: scope.set("late", 99))
            writer.start()
            writer.join(PATIENCE)
        return True

    made = state.count("w", where=where)
    assert wrote.is_set()
    assert made.value is not None, "state.count returned before computing a value"
    settled(made, 6)


if __name__ == "__main__":
    _writer_main(sys.argv[1:])
