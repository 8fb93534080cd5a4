"""``scope.wait_for`` (SPEC §13, Waiting): sync and asyncio, woken by change events.

Every wait here has a timeout; the timings asserted are loose (seconds), the order of
events exact.
"""

from __future__ import annotations

import asyncio
import functools
import math
import operator
import queue
import random
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import reactor
import reactor.aio
from reactor import ops
from reactor.testing import ManualClock
from tests.conftest import engine_of
from tests.conftest import wait_for as eventually
from tests.conftest import waiters as hub_waiters

PATIENCE = 30.0  # seconds: the timeout of waits that must succeed long before


# -- helpers ---------------------------------------------------------------------------
def waiters(engine: Any) -> int:
    """How many waiters the engine's hub holds."""
    return len(hub_waiters(engine))


def receivers(engine: Any) -> set[Any]:
    return set(engine.hub.listeners())


def assert_clean(engine: Any, before: set[Any]) -> None:
    """No waiter left in the hub."""
    assert waiters(engine) == 0
    assert receivers(engine) == before


class Background:
    """``call()`` in a thread; ``result()`` returns what it returned or raises what it
    raised, within a timeout."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._done: queue.Queue[tuple[bool, Any]] = queue.Queue()
        self.finished_at = 0.0

        def run() -> None:
            try:
                outcome = (True, call())
            except BaseException as exc:  # handed to the test
                outcome = (False, exc)
            self.finished_at = time.monotonic()
            self._done.put(outcome)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self, timeout: float = PATIENCE) -> Any:
        ok, value = self._done.get(timeout=timeout)
        self.thread.join(timeout)
        if not ok:
            raise value
        return value

    def running(self) -> bool:
        return self._done.empty()


class Recorder:
    """A predicate that records each value it is shown."""

    def __init__(self, test: Callable[[Any], bool]) -> None:
        self.test = test
        self.seen: list[Any] = []

    def __call__(self, value: Any) -> bool:
        self.seen.append(value)
        return self.test(value)


@pytest.fixture
def scope(state: reactor.State) -> reactor.Scope:
    return state.scope("jobs")


@pytest.fixture
def engine(state: reactor.State) -> Any:
    return engine_of(state)


@pytest.fixture
def blocked_dispatcher() -> Iterator[threading.Event]:
    """Holds the dispatcher thread (of every engine) on its next event until set: the
    events committed meanwhile wait in its queue."""
    release = threading.Event()

    def hold(_sender: str, event: reactor.ChangeEvent) -> None:
        release.wait(PATIENCE)

    reactor.signals.changed.connect(hold)
    try:
        yield release
    finally:
        release.set()
        reactor.signals.changed.disconnect(hold)


# -- the current value ---------------------------------------------------------------
def test_a_value_already_there_is_returned_at_once(scope: reactor.Scope, engine: Any) -> None:
    before = receivers(engine)
    scope.set("j-1", {"status": "done", "tags": ["a"]})
    started = time.monotonic()
    assert scope.wait_for("j-1", timeout=PATIENCE) == {"status": "done", "tags": ["a"]}
    assert scope.wait_for("j-1", lambda job: job["status"] == "done", timeout=0) == {
        "status": "done",
        "tags": ["a"],
    }
    assert time.monotonic() - started < 5
    assert_clean(engine, before)


def test_the_value_returned_is_a_fresh_copy(scope: reactor.Scope) -> None:
    scope.set("j-1", {"tags": ["a"]})

    def meddle(value: Any) -> bool:
        value["tags"].append("meddled")  # the predicate's copy is its own
        return True

    first = scope.wait_for("j-1", meddle, timeout=PATIENCE)
    assert first == {"tags": ["a"]}
    first["tags"].append("x")
    assert scope.wait_for("j-1", timeout=PATIENCE) == {"tags": ["a"]}
    assert scope.get("j-1") == {"tags": ["a"]}


def test_a_key_holding_null_exists(scope: reactor.Scope) -> None:
    scope.set("nothing", None)
    assert scope.wait_for("nothing", timeout=0) is None


def test_an_expired_key_that_was_not_swept_yet_does_not_exist(
    scope: reactor.Scope, clock: ManualClock, engine: Any
) -> None:
    before = receivers(engine)
    scope.set("session", "x", ttl=10)
    clock.advance(11)  # past its deadline; the sweeper may not have removed it yet
    with pytest.raises(reactor.OperationTimeout):
        scope.wait_for("session", timeout=0.2)
    with pytest.raises(reactor.OperationTimeout):
        scope.wait_for("session", lambda _value: True, timeout=0.2)
    assert_clean(engine, before)


# -- changes ---------------------------------------------------------------------------
@pytest.mark.parametrize("writes", [1, 50])
def test_a_value_that_becomes_true_after_writes_from_another_thread(
    scope: reactor.Scope, engine: Any, writes: int
) -> None:
    before = receivers(engine)
    scope.set("count", 0)
    predicate = Recorder(lambda n: n == writes)
    waiter = Background(lambda: scope.wait_for("count", predicate, timeout=PATIENCE))
    eventually(lambda: predicate.seen)  # it has read the current value

    def write() -> None:
        for _ in range(writes):
            scope.increment("count")

    writer = threading.Thread(target=write)
    writer.start()
    assert waiter.result() == writes
    writer.join(PATIENCE)
    assert predicate.seen == list(range(writes + 1))  # each change, in order
    assert_clean(engine, before)


def test_a_key_created_later_wakes_a_waiter_without_predicate(
    scope: reactor.Scope, engine: Any
) -> None:
    before = receivers(engine)
    waiter = Background(lambda: scope.wait_for("new", timeout=PATIENCE))
    eventually(lambda: waiters(engine) == 1)
    scope.set("other", 1)  # another key of the scope: not for this waiter
    assert waiter.running()
    scope.set("new", [1, 2])
    assert waiter.result() == [1, 2]
    assert_clean(engine, before)


def test_a_predicate_on_nested_values(scope: reactor.Scope) -> None:
    scope.set("order", {"customer": {"address": {"city": "Oslo"}}, "items": [{"qty": 1}]})
    predicate = Recorder(
        lambda order: (
            order["customer"]["address"]["city"] == "Bergen" and order["items"][0]["qty"] >= 3
        )
    )
    waiter = Background(lambda: scope.wait_for("order", predicate, timeout=PATIENCE))
    eventually(lambda: predicate.seen)
    scope.update("order", [ops.increment(["items", 0, "qty"], 2)])  # qty 3, still Oslo
    scope.update("order", [ops.set("customer.address.city", "Bergen")])
    assert waiter.result() == {"customer": {"address": {"city": "Bergen"}}, "items": [{"qty": 3}]}
    assert len(predicate.seen) == 3


def test_each_change_is_checked_not_only_the_latest(scope: reactor.Scope) -> None:
    """A value the key holds only for a moment satisfies the wait."""
    scope.set("status", "queued")
    predicate = Recorder(lambda status: status == "running")
    waiter = Background(lambda: scope.wait_for("status", predicate, timeout=PATIENCE))
    eventually(lambda: predicate.seen)
    with scope.transaction() as tx:  # one commit: the waiter sees its changes at once
        tx.set("status", "running")
        tx.set("status", "done")
    assert waiter.result() == "running"


def test_a_burst_of_10000_writes_returns_the_one_value_that_satisfies(
    scope: reactor.Scope, engine: Any
) -> None:
    before = receivers(engine)
    scope.set("k", {"i": -1, "last": False})
    predicate = Recorder(lambda value: value["last"])
    waiter = Background(lambda: scope.wait_for("k", predicate, timeout=120))
    eventually(lambda: predicate.seen)
    total, written = 10_000, 0
    sizes = random.Random(7)
    while written < total:  # transactions of 1 to 500 writes: bursts of events
        size = min(total - written, sizes.randint(1, 500))
        with scope.transaction() as tx:
            for i in range(written, written + size):
                tx.set("k", {"i": i, "last": i == total - 1})
        written += size
    assert waiter.result(120) == {"i": total - 1, "last": True}
    assert [value["i"] for value in predicate.seen] == list(range(-1, total))
    assert_clean(engine, before)


# -- no race between the read and the first change --------------------------------------
def test_a_write_between_joining_and_reading_is_not_missed(
    scope: reactor.Scope, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change committed after the waiter joined and before it read the value."""
    add = engine.hub.add

    def add_then_write(waiter: Any, *where: Any, **durable: Any) -> None:
        add(waiter, *where, **durable)
        writer = threading.Thread(target=lambda: scope.set(waiter.key, "written"))
        writer.start()  # from another thread: this one may be an actor's
        writer.join(PATIENCE)

    monkeypatch.setattr(engine.hub, "add", add_then_write)
    assert scope.wait_for("absent", timeout=PATIENCE) == "written"
    scope.set("present", "old")
    assert scope.wait_for("present", lambda v: v == "written", timeout=PATIENCE) == "written"


def test_a_write_right_after_the_read_is_not_missed(
    scope: reactor.Scope, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change committed after the waiter read the value and before it waits: it was
    connected before the read, so the change is offered to it."""
    read = engine.store.reader

    class ReadThenWrite:
        def fetch_row(self, scope_name: str, key: str) -> Any:
            row = read().fetch_row(scope_name, key)
            writer = threading.Thread(target=lambda: scope.set(key, "written"))
            writer.start()
            writer.join(PATIENCE)
            return row

    scope.set("present", "old")
    monkeypatch.setattr(engine.store, "reader", ReadThenWrite)
    assert scope.wait_for("absent", timeout=PATIENCE) == "written"
    assert scope.wait_for("present", lambda v: v == "written", timeout=PATIENCE) == "written"


def test_events_older_than_the_value_read_are_ignored(
    scope: reactor.Scope, blocked_dispatcher: threading.Event
) -> None:
    """Changes still queued in the dispatcher when the waiter read the value are not
    shown to the predicate again, nor out of order."""
    scope.set("blocker", 0)  # the dispatcher is held on this one
    scope.set("k", "a")
    scope.set("k", "b")  # both events wait behind the held dispatcher
    predicate = Recorder(lambda value: value == "c")
    waiter = Background(lambda: scope.wait_for("k", predicate, timeout=PATIENCE))
    eventually(lambda: predicate.seen)
    blocked_dispatcher.set()
    scope.set("k", "c")
    assert waiter.result() == "c"
    assert predicate.seen == ["b", "c"]


def test_a_deleted_key_is_not_revived_by_its_queued_events(
    state: reactor.State, scope: reactor.Scope, blocked_dispatcher: threading.Event
) -> None:
    """With no row, the waiter starts from the revision published when it joined:
    the queued creation of a key since deleted does not satisfy it."""
    engine = engine_of(state)
    marked = threading.Event()
    state.subscribe(lambda _event: marked.set(), scope="jobs", key="marker")
    scope.set("blocker", 0)  # the dispatcher is held on this one
    scope.set("k", "stale")
    scope.delete("k")
    predicate = Recorder(lambda _value: True)
    waiter = Background(lambda: scope.wait_for("k", predicate, timeout=PATIENCE))
    eventually(lambda: waiters(engine) == 1)
    blocked_dispatcher.set()
    scope.set("marker", 1)
    assert marked.wait(PATIENCE)  # the queued events have all been handed on
    assert waiter.running()
    scope.set("k", "fresh")
    assert waiter.result() == "fresh"
    assert predicate.seen == ["fresh"]


@pytest.mark.parametrize("existing", [False, True], ids=["absent", "present"])
def test_hammer_waiters_racing_writers(scope: reactor.Scope, engine: Any, existing: bool) -> None:
    """200 waiters, each started at the same moment as a write that satisfies it."""
    before = receivers(engine)
    jitter = random.Random(11)
    for i in range(200):
        key = f"race-{i}"
        if existing:
            scope.set(key, "old")
        barrier = threading.Barrier(2, timeout=PATIENCE)
        spins = jitter.randrange(0, 20_000)

        def write(
            key: str = key, spins: int = spins, i: int = i, barrier: threading.Barrier = barrier
        ) -> None:
            barrier.wait()
            for _ in range(spins):  # a little later, by a varying amount
                pass
            scope.set(key, i)

        writer = threading.Thread(target=write)
        writer.start()
        barrier.wait()
        assert scope.wait_for(key, functools.partial(operator.eq, i), timeout=PATIENCE) == i
        writer.join(PATIENCE)
    assert_clean(engine, before)


# -- other processes ----------------------------------------------------------------------
CHILD = """
import sys
import reactor

with reactor.open(sys.argv[1]) as state:
    state.scope(sys.argv[2]).set(sys.argv[3], {"status": "done", "by": "child"})
"""


def test_a_change_from_another_process_wakes_the_waiter_promptly(
    open_state: Callable[..., reactor.State], db_path: Any
) -> None:
    state = open_state()
    scope = state.scope("jobs")
    scope.set("j-1", {"status": "pending"})
    predicate = Recorder(lambda job: job["status"] == "done")
    started = time.monotonic()
    waiter = Background(lambda: scope.wait_for("j-1", predicate, timeout=60))
    eventually(lambda: predicate.seen)  # it has read the current value: now write
    subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(db_path), "jobs", "j-1"],
        check=True,
        timeout=60,
    )
    written = time.monotonic()
    assert waiter.result(60) == {"status": "done", "by": "child"}
    assert waiter.finished_at - written < 5  # woken, not timed out (60 s)
    assert waiter.finished_at - started < 50
    assert predicate.seen == [{"status": "pending"}, {"status": "done", "by": "child"}]


# -- what does not satisfy ------------------------------------------------------------------
def test_a_deletion_does_not_satisfy(
    state: reactor.State, scope: reactor.Scope, engine: Any
) -> None:
    before = receivers(engine)
    scope.set("k", "x")
    predicate = Recorder(lambda value: value != "x")
    waiter = Background(lambda: scope.wait_for("k", predicate, timeout=PATIENCE))
    eventually(lambda: predicate.seen)
    deleted = threading.Event()
    subscription = state.subscribe(
        lambda _event: deleted.set(), scope="jobs", key="k", events="deleted"
    )
    scope.delete("k")
    assert deleted.wait(PATIENCE)
    scope.clear()  # nothing to clear: no event
    scope.set("other", 1)
    assert waiter.running()
    scope.set("k", "y")
    assert waiter.result() == "y"
    assert predicate.seen == ["x", "y"]  # never None
    subscription.close()
    assert_clean(engine, before)


def test_an_expiry_does_not_satisfy(
    state: reactor.State, scope: reactor.Scope, clock: ManualClock
) -> None:
    scope.set("k", "x", ttl=10)
    predicate = Recorder(lambda value: value != "x")
    waiter = Background(lambda: scope.wait_for("k", predicate, timeout=PATIENCE))
    eventually(lambda: predicate.seen)
    expired = threading.Event()
    subscription = state.subscribe(
        lambda _event: expired.set(), scope="jobs", key="k", events="expired"
    )
    clock.advance(11)
    assert expired.wait(PATIENCE)  # the sweeper published the expiry
    scope.set("k2", "x")
    assert scope.expire("k2", 0)  # expired now, by a verb
    assert waiter.running()
    scope.set("k", "y")
    assert waiter.result() == "y"
    assert predicate.seen == ["x", "y"]
    subscription.close()


def test_a_predicate_waiting_for_none_is_not_satisfied_by_a_deletion(
    scope: reactor.Scope,
) -> None:
    scope.set("k", 1)
    waiter = Background(lambda: scope.wait_for("k", lambda v: v is None, timeout=0.5))
    scope.delete("k")
    with pytest.raises(reactor.OperationTimeout):
        waiter.result()


# -- timeouts, errors, closing ---------------------------------------------------------------
def test_a_timeout_raises_and_leaves_nothing_connected(
    state: reactor.State, scope: reactor.Scope, engine: Any
) -> None:
    before = receivers(engine)
    started = time.monotonic()
    with pytest.raises(reactor.OperationTimeout, match=r"after 0\.3 s") as raised:
        scope.wait_for("never", timeout=0.3)
    assert 0.25 <= time.monotonic() - started < 5
    assert isinstance(raised.value, TimeoutError)
    scope.set("k", 1)
    with pytest.raises(reactor.OperationTimeout):
        scope.wait_for("k", lambda v: v == 2, timeout=0)  # a look, no wait
    with pytest.raises(reactor.OperationTimeout):
        scope.wait_for("never", timeout=0.0)
    assert_clean(engine, before)
    assert state.stats()["operations"]["wait_for"] == 3


def test_waiting_takes_no_cpu(scope: reactor.Scope) -> None:
    def wait() -> float:
        start = time.thread_time()
        with pytest.raises(reactor.OperationTimeout):
            scope.wait_for("never", timeout=1.0)
        return time.thread_time() - start

    assert Background(wait).result() < 0.1  # of a second spent waiting


def test_bad_arguments_are_refused_before_waiting(scope: reactor.Scope, engine: Any) -> None:
    before = receivers(engine)
    for key in ("", 5, None, "x" * 1025):
        with pytest.raises(reactor.InvalidKeyError):
            scope.wait_for(key, timeout=1)  # type: ignore[arg-type]
    with pytest.raises(reactor.InvalidArgumentError, match="predicate"):
        scope.wait_for("k", 5, timeout=1)  # type: ignore[arg-type]
    for timeout in (-1, -0.001, "1", True, math.nan, [1]):
        with pytest.raises(reactor.InvalidArgumentError, match="timeout"):
            scope.wait_for("k", timeout=timeout)  # type: ignore[arg-type]
    assert_clean(engine, before)


def test_an_infinite_timeout_waits_like_none(scope: reactor.Scope) -> None:
    scope.set("k", 1)
    assert scope.wait_for("k", timeout=math.inf) == 1
    assert scope.wait_for("k", timeout=10**400) == 1


def test_a_predicate_that_raises_ends_the_wait(scope: reactor.Scope, engine: Any) -> None:
    before = receivers(engine)
    scope.set("k", {"n": 1})
    with pytest.raises(KeyError, match="missing"):
        scope.wait_for("k", lambda value: value["missing"], timeout=PATIENCE)
    assert_clean(engine, before)

    def explode_on_two(value: Any) -> bool:
        if value["n"] == 2:
            raise RuntimeError("two")
        return False

    waiter = Background(lambda: scope.wait_for("k", explode_on_two, timeout=PATIENCE))
    eventually(lambda: waiters(engine) == 1)
    scope.set("k", {"n": 2})
    with pytest.raises(RuntimeError, match="two"):
        waiter.result()
    assert_clean(engine, before)


def test_closing_the_engine_ends_a_waiter_without_timeout(
    open_state: Callable[..., reactor.State],
) -> None:
    state = open_state()
    scope = state.scope("jobs")
    waiter = Background(lambda: scope.wait_for("never"))
    eventually(lambda: waiters(engine_of(state)) == 1)
    started = time.monotonic()
    state.close()
    with pytest.raises(reactor.ClosedError):
        waiter.result(PATIENCE)
    assert time.monotonic() - started < 10
    with pytest.raises(reactor.ClosedError):
        scope.wait_for("never", timeout=1)


def test_a_change_committed_before_close_still_satisfies(
    open_state: Callable[..., reactor.State], blocked_dispatcher: threading.Event
) -> None:
    state = open_state()
    scope = state.scope("jobs")
    waiter = Background(lambda: scope.wait_for("k", timeout=PATIENCE))
    eventually(lambda: waiters(engine_of(state)) == 1)
    scope.set("blocker", 0)  # the dispatcher is held on this one
    scope.set("k", "last words")  # queued behind it
    closing = threading.Thread(target=state.close)
    closing.start()
    blocked_dispatcher.set()  # close() hands on what is queued, then ends the waiter
    closing.join(PATIENCE)
    assert waiter.result() == "last words"


def test_a_transaction_has_no_wait_for_and_its_scope_refuses(scope: reactor.Scope) -> None:
    with scope.transaction() as tx:
        assert not hasattr(tx, "wait_for")  # its body holds the scope: nobody could write
        with pytest.raises(reactor.ReentrancyError):
            scope.wait_for("k", timeout=1)


def test_waiting_in_a_signal_receiver_raises_instead_of_hanging(
    state: reactor.State, scope: reactor.Scope
) -> None:
    """The dispatcher's thread would have to deliver the change it waits for."""
    raised: queue.Queue[BaseException] = queue.Queue()

    def receiver(_sender: str, event: reactor.ChangeEvent) -> None:
        if event.key == "trigger":
            try:
                scope.wait_for("k", timeout=PATIENCE)
            except BaseException as exc:  # handed to the test
                raised.put(exc)

    reactor.signals.changed.connect(receiver)
    try:
        scope.set("trigger", 1)
        assert isinstance(raised.get(timeout=PATIENCE), reactor.ReentrancyError)
    finally:
        reactor.signals.changed.disconnect(receiver)
    seen: queue.Queue[Any] = queue.Queue()  # a subscription's own thread may wait
    subscription = state.subscribe(
        lambda _event: seen.put(scope.wait_for("k", timeout=PATIENCE)), key="trigger"
    )
    scope.set("trigger", 2)
    scope.set("k", "from the main thread")
    assert seen.get(timeout=PATIENCE) == "from the main thread"
    subscription.close()


def test_waiters_on_one_key_are_all_woken(scope: reactor.Scope, engine: Any) -> None:
    before = receivers(engine)

    def wait_for_at_least(n: int) -> Any:
        return scope.wait_for("k", lambda v: v >= n, timeout=PATIENCE)

    found = [Background(functools.partial(wait_for_at_least, n)) for n in range(20)]
    eventually(lambda: waiters(engine) == 20)
    for n in range(20):
        scope.set("k", n)
    results = [waiter.result() for waiter in found]
    # Each gets a value that satisfies it: the first it saw. A waiter joins the hub
    # before it reads the key, so its read may come after some of the sets (CI saw a
    # waiter for 5 read 8 on a busy PostgreSQL): then that value is the first it sees.
    assert all(n <= value < 20 for n, value in enumerate(results)), results
    assert_clean(engine, before)


# -- asyncio -------------------------------------------------------------------------------------
def async_engine(state: reactor.aio.AsyncState) -> Any:
    assert state._link.state is not None
    return engine_of(state._link.state)


async def eventually_async(condition: Callable[[], Any], timeout: float = PATIENCE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_async_returns_a_value_already_there_or_becoming_true(db_path: Any) -> None:
    async with reactor.aio.open(db_path) as state:
        scope = state.scope("jobs")
        engine = async_engine(state)
        before = receivers(engine)
        await scope.set("j-1", {"status": "done"})
        assert await scope.wait_for("j-1", timeout=0) == {"status": "done"}
        await scope.set("count", 0)
        predicate = Recorder(lambda n: n == 50)
        waiter = asyncio.ensure_future(scope.wait_for("count", predicate, timeout=PATIENCE))
        await eventually_async(lambda: predicate.seen)
        for _ in range(50):
            await scope.increment("count")
        assert await waiter == 50
        assert predicate.seen == list(range(51))
        nested = asyncio.ensure_future(
            scope.wait_for("order", lambda o: o["items"][0]["qty"] == 2, timeout=PATIENCE)
        )
        await eventually_async(lambda: waiters(engine) == 1)
        await scope.set("order", {"items": [{"qty": 1}]})
        await scope.update("order", [ops.increment(["items", 0, "qty"])])
        assert await nested == {"items": [{"qty": 2}]}
        assert_clean(engine, before)
        assert (await state.stats())["operations"]["wait_for"] == 3


async def test_async_a_write_from_another_thread_wakes_it(db_path: Any) -> None:
    async with reactor.aio.open(db_path) as state:
        scope = state.scope("jobs")
        engine = async_engine(state)
        waiter = asyncio.ensure_future(scope.wait_for("k", timeout=PATIENCE))
        await eventually_async(lambda: waiters(engine) == 1)
        with reactor.open(db_path) as sync_state:  # the same engine, from a thread
            await asyncio.to_thread(sync_state.scope("jobs").set, "k", "from a thread")
            assert await waiter == "from a thread"


async def test_async_deletion_does_not_satisfy_and_timeout_cleans_up(db_path: Any) -> None:
    async with reactor.aio.open(db_path) as state:
        scope = state.scope("jobs")
        engine = async_engine(state)
        before = receivers(engine)
        await scope.set("k", "x")
        waiter = asyncio.ensure_future(scope.wait_for("k", lambda v: v != "x", timeout=0.5))
        await eventually_async(lambda: waiters(engine) == 1)
        await scope.delete("k")
        with pytest.raises(reactor.OperationTimeout):
            await waiter
        assert_clean(engine, before)
        with pytest.raises(reactor.OperationTimeout):
            await scope.wait_for("never", timeout=0)
        assert_clean(engine, before)


async def test_async_errors(db_path: Any) -> None:
    async with reactor.aio.open(db_path) as state:
        scope = state.scope("jobs")
        with pytest.raises(reactor.InvalidKeyError):
            await scope.wait_for("", timeout=1)
        with pytest.raises(reactor.InvalidArgumentError):
            await scope.wait_for("k", "not callable", timeout=1)  # type: ignore[arg-type]
        with pytest.raises(reactor.InvalidArgumentError):
            await scope.wait_for("k", timeout=-1)
        engine = async_engine(state)
        before = receivers(engine)
        await scope.set("k", 1)
        with pytest.raises(ZeroDivisionError):
            await scope.wait_for("k", lambda v: v / 0, timeout=PATIENCE)
        assert_clean(engine, before)
        async with scope.transaction():
            with pytest.raises(reactor.ReentrancyError):
                await scope.wait_for("k", timeout=1)
    with pytest.raises(reactor.ClosedError):
        await scope.wait_for("k", timeout=1)


async def test_async_cancellation_disconnects(db_path: Any) -> None:
    async with reactor.aio.open(db_path) as state:
        scope = state.scope("jobs")
        await scope.get("warm")  # open it first
        engine = async_engine(state)
        before = receivers(engine)
        waiter = asyncio.ensure_future(scope.wait_for("never", timeout=PATIENCE))
        await eventually_async(lambda: waiters(engine) == 1)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        # Counted as waiting once its start registered it in a worker thread; cancelled
        # before that start came back to the loop (a busy machine), it leaves when it does.
        await eventually_async(lambda: waiters(engine) == 0)
        assert_clean(engine, before)
        for _ in range(20):  # cancelled at once: while it starts, in a worker thread
            early = asyncio.ensure_future(scope.wait_for("never", timeout=PATIENCE))
            await asyncio.sleep(0)
            early.cancel()
            with pytest.raises(asyncio.CancelledError):
                await early
        await eventually_async(lambda: waiters(engine) == 0)
        assert_clean(engine, before)


async def test_async_closing_ends_a_waiter(db_path: Any) -> None:
    state = reactor.aio.open(db_path)
    scope = state.scope("jobs")
    await scope.get("warm")
    engine = async_engine(state)
    waiter = asyncio.ensure_future(scope.wait_for("never"))
    await eventually_async(lambda: waiters(engine) == 1)
    await asyncio.wait_for(state.close(), PATIENCE)
    with pytest.raises(reactor.ClosedError):
        await asyncio.wait_for(waiter, PATIENCE)


async def test_1000_async_waiters_hold_no_thread(db_path: Any) -> None:
    async with reactor.aio.open(db_path) as state:
        scope = state.scope("many")
        await scope.set("warm", 0)  # the scope's actor runs
        await asyncio.gather(*(scope.get(f"warm-{i}") for i in range(200)))  # all workers
        engine = async_engine(state)
        before = receivers(engine)
        assert state._link._workers is not None
        # The handle's few workers (for the reads that start each wait) may still grow.
        workers = reactor.aio.link._WORKERS
        threads = threading.active_count() + workers - len(state._link._workers._threads)
        keys = [f"k-{i}" for i in range(1000)]
        tasks = [
            asyncio.ensure_future(scope.wait_for(key, lambda v: v >= 0, timeout=60)) for key in keys
        ]
        await eventually_async(lambda: waiters(engine) == 1000, timeout=60)
        assert threading.active_count() <= threads
        started = time.monotonic()
        await scope.set_many({key: i for i, key in enumerate(keys)})
        assert await asyncio.wait_for(asyncio.gather(*tasks), 60) == list(range(1000))
        assert time.monotonic() - started < 30
        assert threading.active_count() <= threads
        assert_clean(engine, before)
