"""The public API as users type it, checked by mypy (``python3 dev.py test`` runs
``mypy reactor tests/typing_examples.py``), never run: pytest does not collect this
file, and its functions are only defined.

``assert_type`` pins what each call returns. Each line marked ``# type: ignore[code]``
must fail type checking with that code: mypy strict warns about an ignore that
silences nothing, so a typo the types stopped catching fails the check.
"""

from __future__ import annotations

from typing import Any, Literal, assert_type

import reactor
import reactor.aio
from reactor import ops
from reactor.testing import ManualClock, Upkeep, run_upkeep, run_upkeep_async


def opening() -> None:
    state = reactor.open(
        "state.db",
        durability="full",
        max_value_bytes=1 << 20,
        max_depth=32,
        max_actors=16,
        log_retention=10_000,
        log_retention_seconds=3600.0,
        timeout=5,
    )
    assert_type(state, reactor.State)
    durability: reactor.Durability = "memory"
    with reactor.open(":memory:", durability=durability) as memory:
        assert_type(memory, reactor.State)
        assert_type(memory.location, str)
        assert_type(memory.closed, bool)
        assert_type(memory.scopes(), list[str])
        assert_type(memory.stats(), dict[str, Any])
    state.close()
    with reactor.open("state.db", readonly=True) as reader:
        assert_type(reader, reactor.State)
        try:
            reader.scope("orders").set("o-1", 1)
        except reactor.ReadOnlyError as exc:
            assert_type(exc, reactor.ReadOnlyError)
    assert issubclass(reactor.ReadOnlyError, reactor.StorageError)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now


def clock_is_a_protocol() -> None:
    clock: reactor.Clock = FakeClock()
    reactor.open(":memory:", clock=clock).close()


def testing_helpers() -> None:
    clock = ManualClock(start=0)
    assert_type(clock.time(), float)
    clock.advance(1.5)
    clock.set(10)
    with reactor.open(":memory:", clock=clock, sweep_interval=1e6) as state:
        done = run_upkeep(state)
        assert_type(done, Upkeep)
        assert_type(done.keys_expired, int)
        assert_type(done.log_compacted, int)
    reactor.open(":memory:", sweep_interval="1")  # type: ignore[arg-type]


async def testing_helpers_async() -> None:
    async with reactor.aio.open(":memory:", sweep_interval=0.5) as state:
        assert_type(await run_upkeep_async(state), Upkeep)


def scope_verbs(state: reactor.State) -> None:
    orders = state.scope("orders")
    assert_type(orders, reactor.Scope)
    assert_type(orders.name, str)
    # reads
    assert_type(orders.get("o-1"), Any)
    assert_type(orders.get("o-1", default={}), Any)
    assert_type(orders.get_many(["o-1", "o-2"]), dict[str, Any])
    assert_type(orders.exists("o-1"), bool)
    assert_type(orders.list(), dict[str, Any])
    assert_type(orders.keys("o-*"), list[str])
    assert_type(orders.ttl("o-1"), float)
    assert_type(orders.length("queue"), int)
    snapshot = orders.snapshot()
    assert_type(snapshot, reactor.Snapshot)
    assert_type(snapshot.values, dict[str, Any])
    assert_type(snapshot.revision, int)
    # writes
    change = orders.set("o-1", {"total": 120}, ttl=30, keep_ttl=False)
    assert_type(change, reactor.Change)
    assert_type(change.old_value, Any)
    assert_type(orders.set_many({"a": 1, "b": 2}, ttl=1.5), dict[str, reactor.Change])
    assert_type(orders.delete("b"), Any)
    assert_type(orders.clear("o-*"), int)
    assert_type(orders.expire("a", 60), bool)
    assert_type(orders.expire("a", None), bool)
    assert_type(orders.increment("hits"), int | float)
    assert_type(orders.increment("price", 0.5, default=10), int | float)
    assert_type(orders.decrement("hits", by=2), int | float)
    assert_type(orders.append("log", "started"), int)
    assert_type(orders.compare_and_swap("leader", reactor.MISSING, "node-1"), bool)
    assert_type(orders.compare_and_swap("leader", "node-1", reactor.MISSING), bool)
    assert_type(orders.push("queue", "j1", "j2"), int)
    assert_type(orders.pop("queue", front=True), Any)
    result = orders.update("o-1", [ops.set("status", "paid"), ops.increment("attempts")])
    assert_type(result, reactor.UpdateResult)
    assert_type(result.errors, list[dict[str, Any]])
    patch = [{"op": "replace", "path": "/status", "value": "shipped"}]
    assert_type(orders.update("o-1", patch, atomic=None), reactor.UpdateResult)
    assert_type(reactor.MISSING, Literal[reactor.Missing.MISSING])
    # waiting
    assert_type(orders.wait_for("o-1"), Any)
    assert_type(orders.wait_for("o-1", lambda order: order["status"] == "paid", 30), Any)
    assert_type(orders.wait_for("o-1", timeout=0.5), Any)

    # versions and history
    entry = orders.entry("o-1")
    assert_type(entry, reactor.Entry | None)
    if entry is not None:
        assert_type(entry.revision, int)
        assert_type(entry.version, int)
        assert_type(entry.expires_at, float | None)
        assert_type(orders.set("o-1", 1, if_revision=entry.revision), reactor.Change)
    assert_type(orders.push("queue", "j3", if_revision=0), int)
    assert_type(orders.history("o-1", since=0, limit=10), list[reactor.ChangeEvent])
    assert_type(orders.get("o-1", at_revision=3), Any)
    orders.set("o-1", 1, 30, False, 5)  # type: ignore[call-arg]

    # timers
    timer = orders.schedule("o-1", {"status": "expired"}, after=60)
    assert_type(timer, reactor.Timer)
    assert_type(timer.due, float)
    assert_type(timer.every, float | None)
    assert_type(orders.schedule("n", ops=[ops.increment("")], every=5), reactor.Timer)
    assert_type(state.timers("ord*"), list[reactor.Timer])
    assert_type(state.cancel_timer(timer.id), bool)  # if_revision is keyword-only


def transactions_and_locks(state: reactor.State) -> None:
    orders = state.scope("orders")
    with orders.transaction() as tx:
        assert_type(tx, reactor.Transaction)
        assert_type(tx.get("stock"), Any)
        assert_type(tx.set("stock", 3), reactor.Change)
        assert_type(tx.snapshot(), reactor.Snapshot)
    with state.transaction("orders", "ledger") as both:
        assert_type(both, reactor.MultiTransaction)
        assert_type(both.names, tuple[str, ...])
        assert_type(both["orders"], reactor.Transaction)
        assert_type(both["ledger"].increment("revenue", 120), int | float)
        restock(both["orders"])
        both.set("k", 1)  # type: ignore[attr-defined]
    with state.lock("deploy", ttl=30, timeout=60) as lock:
        assert_type(lock, reactor.Lock)
        assert_type(lock.token, int | None)
        lock.extend(30)
        assert_type(lock.held(), bool)
    assert_type(state.lock("deploy", 30).acquire(blocking=False), bool)


def queues(state: reactor.State) -> None:
    emails = state.queue("emails", max_attempts=5)
    assert_type(emails, reactor.Queue)
    assert_type(emails.name, str)
    assert_type(emails.put({"to": "ada@example.com"}), int)
    assert_type(emails.put("x", delay=1.5, key="k"), int)
    job = emails.take(timeout=10, lease=30)
    assert_type(job, reactor.Job | None)
    if job is not None:
        assert_type(job.id, int)
        assert_type(job.item, Any)
        assert_type(job.attempts, int)
        assert_type(job.queue, str)
        job.extend(60)
        job.nack(delay=5)
        job.ack()
    assert_type(emails.stats(), dict[str, Any])
    assert_type(emails.dead(), list[reactor.Job])
    assert_type(emails.retry_dead(), int)
    assert_type(state.queues(), list[str])
    with state.scope("orders").transaction() as tx:
        assert_type(tx.enqueue("emails", {"order": "o-1"}, delay=None, key="o-1"), None)
        assert_type(tx.enqueue("emails", 1, priority=5, group="c-7"), None)
    with state.transaction("orders", "ledger") as both:
        assert_type(both.enqueue("emails", 1, key="k", debounce=5), None)
    emails.put(1, delay="5")  # type: ignore[arg-type]
    emails.take(lease="30")  # type: ignore[arg-type]
    state.queue("emails", max_attempts="5")  # type: ignore[arg-type]
    api = state.queue("api", concurrency=10, group_concurrency=1, rate=(100, 60.0))
    assert_type(api.put(1, priority=5, group="customer-7"), int)
    assert_type(api.put(1, key="k", debounce=5), int)
    state.queue("api", concurrency=False, rate=False, backoff=(1.0, 60.0))
    state.queue("api", concurrency="10")  # type: ignore[arg-type]
    api.put(1, priority="high")  # type: ignore[arg-type]
    info = api.job(1)
    assert_type(info, reactor.JobInfo | None)
    if info is not None:
        assert_type(info.state, str)
        assert_type(info.errors, list[dict[str, Any]])
    assert_type(api.put_every({"sync": 1}, key="sync", every=60), reactor.Timer)
    assert_type(api.put_every(1, key="daily", cron="0 9 * * *", tz="Europe/Paris"), reactor.Timer)
    api.put_every(1, every=60)  # type: ignore[call-arg]
    assert_type(api.cancel(1), bool)
    assert_type(api.purge("dead"), int)
    assert_type(api.purge(["ready", "delayed"]), int)
    job = api.take(timeout=0)
    if job is not None:
        job.nack(error=ValueError("bad input"))
        job.nack(delay=0, error="timeout calling the API")
        assert_type(job.errors, list[dict[str, Any]])


async def queues_async(state: reactor.aio.AsyncState) -> None:
    emails = state.queue("emails", max_attempts=5)
    assert_type(emails, reactor.aio.AsyncQueue)
    assert_type(await emails.put({"to": "ada@example.com"}, key="k"), int)
    job = await emails.take(timeout=10)
    assert_type(job, reactor.aio.AsyncJob | None)
    if job is not None:
        assert_type(job.item, Any)
        assert_type(job.attempts, int)
        await job.extend(60)
        await job.nack()
        await job.ack()
    assert_type(await emails.stats(), dict[str, Any])
    api = state.queue("api", concurrency=2, rate=(10, 1.0), backoff=(0.5, 30.0))
    assert_type(await api.put(1, priority=1, group="g"), int)
    assert_type(await api.job(1), reactor.JobInfo | None)
    assert_type(await api.cancel(1), bool)
    assert_type(await api.purge(), int)
    assert_type(await emails.dead(), list[reactor.aio.AsyncJob])
    assert_type(await emails.retry_dead(), int)
    assert_type(await state.queues(), list[str])
    async with state.scope("orders").transaction() as tx:
        await tx.enqueue("emails", 1)
    async with state.transaction("orders", "ledger") as both:
        await both.enqueue("emails", 1)


def restock(handle: reactor.ScopeVerbs) -> int | float:
    """A helper that writes through a scope or a transaction alike."""
    return handle.increment("stock", 10)


def scope_verbs_type(state: reactor.State) -> None:
    orders = state.scope("orders")
    restock(orders)
    with orders.transaction() as tx:
        restock(tx)


def on_change(event: reactor.ChangeEvent) -> None:
    assert_type(event.scope, str)
    assert_type(event.key, str)
    assert_type(event.type, reactor.EventType)
    assert_type(event.revision, int)
    assert_type(event.new_value, Any)
    assert_type(event.ops, list[dict[str, Any]] | None)
    assert_type(event.as_dict(), dict[str, Any])
    if event.type == "expired":
        pass


def events(state: reactor.State) -> None:
    wanted: set[reactor.EventType] = {"created", "updated"}
    subscription = state.subscribe(
        on_change,
        scope="orders",
        key="o-*",
        events=wanted,
        where=lambda event: event.new_value is not None,
        since=0,
        durable="billing",
        max_retries=5,
        buffer_size=1000,
    )
    assert_type(subscription, reactor.Subscription)
    assert_type(subscription.closed, bool)
    subscription.close(timeout=1.0)
    state.subscribe(on_change, events="deleted").close()
    state.subscribe(on_change, events=["created", "expired"]).close()
    state.subscribe(on_change, scope=["orders", "ledger"], key=("o-*", "l-*")).close()
    state.subscribe(on_change, scope=7).close()  # type: ignore[arg-type]

    @state.on("orders", events={"deleted", "expired"})
    def on_gone(event: reactor.ChangeEvent) -> None: ...

    @state.on("orders")
    async def on_order(event: reactor.ChangeEvent) -> None: ...

    @state.on("orders")  # type: ignore[type-var]
    def takes_a_number(count: int) -> None: ...

    assert_type(state.changes(since=0, scope="orders", limit=10), list[reactor.ChangeEvent])
    with state.watch(since=0, scope="orders") as watch:
        assert_type(watch, reactor.Watch)
        for event in watch:
            assert_type(event, reactor.ChangeEvent)

    def on_signal(sender: str, event: reactor.ChangeEvent) -> None: ...

    reactor.signals.changed.connect(on_signal, weak=False)


def errors(state: reactor.State) -> None:
    try:
        state.scope("orders").increment("count")
    except reactor.TypeMismatchError as exc:
        assert_type(exc, reactor.TypeMismatchError)
    except TimeoutError:  # OperationTimeout, BusyError, LockTimeout
        pass
    except reactor.ReactorError as exc:
        assert_type(exc, reactor.ReactorError)
    assert issubclass(reactor.errors.InvalidKeyError, ValueError)


async def asyncio_handles() -> None:
    async with reactor.aio.open("state.db", readonly=True) as reader:
        assert_type(await reader.scope("orders").get("o-1"), Any)
    async with reactor.aio.open("state.db", durability="normal", timeout=5) as state:
        assert_type(state, reactor.aio.AsyncState)
        assert_type(state.closed, bool)
        orders = state.scope("orders")
        assert_type(orders, reactor.aio.AsyncScope)
        assert_type(await orders.get("o-1"), Any)
        assert_type(await orders.get_many(["o-1"]), dict[str, Any])
        assert_type(await orders.exists("o-1"), bool)
        assert_type(await orders.list(), dict[str, Any])
        assert_type(await orders.keys(), list[str])
        assert_type(await orders.ttl("o-1"), float)
        assert_type(await orders.length("queue"), int)
        assert_type(await orders.snapshot(), reactor.Snapshot)
        assert_type(await orders.set("o-1", {"total": 120}), reactor.Change)
        assert_type(await orders.set_many({"a": 1}), dict[str, reactor.Change])
        assert_type(await orders.delete("a"), Any)
        assert_type(await orders.clear(), int)
        assert_type(await orders.expire("o-1", 10), bool)
        assert_type(await orders.increment("hits"), int | float)
        assert_type(await orders.decrement("hits"), int | float)
        assert_type(await orders.append("log", "x"), int)
        assert_type(await orders.compare_and_swap("k", reactor.MISSING, 1), bool)
        assert_type(await orders.push("queue", 1), int)
        assert_type(await orders.pop("queue"), Any)
        assert_type(await orders.update("o-1", [ops.remove("tmp")]), reactor.UpdateResult)
        assert_type(await orders.wait_for("o-1", lambda order: order["paid"], 30), Any)
        async with orders.transaction() as tx:
            assert_type(tx, reactor.aio.AsyncTransaction)
            assert_type(await tx.set("stock", 3), reactor.Change)
            assert_type(await tx.increment("sold"), int | float)
            assert_type(await tx.keys("s*"), list[str])
            assert_type(await tx.snapshot(), reactor.Snapshot)
            await tx.sett("stock", 3)  # type: ignore[attr-defined]
        async with state.transaction("orders", "ledger") as both:
            assert_type(both, reactor.aio.AsyncMultiTransaction)
            assert_type(both["orders"], reactor.aio.AsyncTransaction)
            assert_type(await both["ledger"].increment("revenue", 120), int | float)
        async with state.lock("deploy", ttl=30, timeout=60) as lock:
            assert_type(lock, reactor.aio.AsyncLock)
            assert_type(lock.token, int | None)
            assert_type(await lock.held(), bool)
        assert_type(await state.scopes(), list[str])
        assert_type(await state.stats(), dict[str, Any])
        assert_type(await state.changes(since=0), list[reactor.ChangeEvent])

        async def on_order(event: reactor.ChangeEvent) -> None: ...

        subscription = await state.subscribe(on_order, "orders", events={"created"})
        assert_type(subscription, reactor.Subscription)
        state.on("orders", events="updated")(on_order)
        async with state.watch(since=0, scope=["orders", "ledger"]) as watch:
            assert_type(watch, reactor.aio.AsyncWatch)
            async for event in watch:
                assert_type(event, reactor.ChangeEvent)


def rejected(state: reactor.State, scope: reactor.Scope) -> None:
    """Misspelled options and wrong types: each line must fail type checking."""
    reactor.open(durability="fulll")  # type: ignore[arg-type]
    reactor.open(durabilty="full")  # type: ignore[call-arg]
    reactor.open(timeout="30")  # type: ignore[arg-type]
    reactor.open(readonly="yes")  # type: ignore[arg-type]
    reactor.open(read_only=True)  # type: ignore[call-arg]
    reactor.aio.open(durability="fulll")  # type: ignore[arg-type]
    reactor.aio.open(durabilty="full")  # type: ignore[call-arg]
    state.subscribe(on_change, events={"craeted"})  # type: ignore[arg-type]
    state.subscribe(on_change, events="craeted")  # type: ignore[arg-type]
    state.subscribe(on_change, evnets="created")  # type: ignore[call-arg]
    state.on(events=["deleted", "expird"])  # type: ignore[list-item]
    scope.set("k", 1, ttl="30")  # type: ignore[arg-type]
    scope.increment("k", by="1")  # type: ignore[arg-type]
    scope.get_many("k", "j")  # type: ignore[call-arg]
    scope.wait_for("k", timeout="30")  # type: ignore[arg-type]
    scope.wait_for("k", predicate="done")  # type: ignore[arg-type]
    with scope.transaction() as tx:
        tx.wait_for("k")  # type: ignore[attr-defined]
    durability: str = "full"
    reactor.open(durability=durability)  # type: ignore[arg-type]
    kinds: list[reactor.EventType] = ["created", "delted"]  # type: ignore[list-item]
    state.subscribe(on_change, events=kinds)


async def rejected_async(state: reactor.aio.AsyncState) -> None:
    await state.subscribe(on_change, events={"craeted"})  # type: ignore[arg-type]
    state.on(events="craeted")  # type: ignore[arg-type]
    await state.scope("s").set("k", 1, ttl="30")  # type: ignore[arg-type]
    await state.scope("s").wait_for("k", timeout="30")  # type: ignore[arg-type]


def typed_values() -> None:
    import dataclasses
    import datetime as dt

    @dataclasses.dataclass
    class Order:
        id: str
        placed: dt.datetime

    codec = reactor.TypedCodec(encoders={Order: dataclasses.asdict})
    with reactor.open("state.db", codec=codec) as state:
        assert_type(state.codec, reactor.Codec | None)
        orders = state.scope("orders", codec=reactor.codecs.TypedCodec())
        assert_type(orders.get("o-1"), Any)
        assert_type(orders.get("o-1", type=Order), Order | None)
        assert_type(orders.get("o-1", "none", type=Order), Order | str)
        assert_type(orders.get_many(["o-1"], type=Order), dict[str, Any])
        assert_type(codec.decode({"id": "o-1"}, Order), Any)
        orders.get("o-1", type="Order")  # type: ignore[call-overload]
        reactor.open("state.db", codec=42)  # type: ignore[arg-type]
