"""``State``: the handle ``reactor.open()`` returns."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Literal, TypeVar

from reactor._base.codecs import Codec, check_codec
from reactor._base.keys import Globs, compile_pattern
from reactor._base.results import RunInfo, Timer
from reactor._engine.engine import Engine
from reactor._engine.events import ChangeEvent, EventType
from reactor._engine.port import EnginePort
from reactor._engine.report import engine_stats
from reactor._work.timers import check_timer_id, drop_timer, timer_of
from reactor._work.writes import Work
from reactor.errors import InvalidArgumentError, ReentrancyError, RevisionCompactedError

from .aggregates import Aggregate
from .binding import bind
from .derivations import derivations_of
from .derived import DerivedValue, check_into
from .locks import Lock
from .queues import Queue
from .reader import Reader
from .registry import release_engine
from .run_handle import RunHandle
from .run_workers import Workers
from .scope import Scope
from .subscriptions import DEFAULT_BUFFER, Filter, Subscription, Watch, check_since
from .transaction import MultiTransaction, in_transaction
from .workflows import Workflows

__all__ = ["State", "cancelling", "workflows_of"]

F = TypeVar("F", bound=Callable[[ChangeEvent], Any])  # a callback of one event
W = TypeVar("W", bound=Callable[..., Any])  # a workflow function
Where = Callable[[ChangeEvent], bool]
Events = Collection[EventType] | EventType


class State:
    """A handle to an engine: scopes, and what spans them.

    Handles to the same database in one process share one engine, which stops when its
    last handle closes. Use it as a context manager, or call `close()`.
    """

    location: str
    """Where the database is: a file path, or ``":memory:"``."""

    def __init__(self, engine: Engine, codec: Codec | None = None) -> None:
        self._binding = bind(self, engine, codec)
        self.location: str = engine.store.location
        self._workflows = Workflows(self._binding)  # durable workflows (SPEC §14)

    def __repr__(self) -> str:
        status = "closed" if self._binding.released else "open"
        return f"<reactor.State {self.location!r} ({status})>"

    @property
    def closed(self) -> bool:
        """Whether this handle is closed."""
        return self._binding.closed

    @property
    def codec(self) -> Codec | None:
        """The codec this handle's values go through (``open(codec=...)``), or None:
        strict JSON."""
        return self._binding.codec

    def scope(self, name: str, *, codec: Codec | None = None) -> Scope:
        """The handle to scope ``name`` (created when first written). A name beginning
        with ``queue:`` or ``run:`` is the scope of a queue's (or a workflow's) events:
        its handle reads them, and its writes raise ``InvalidKeyError``.

        ``codec``: this scope's codec, in place of the state's (``open(codec=...)``).

        Raises:
            InvalidKeyError: ``name`` is not a valid scope name.
            InvalidArgumentError: ``codec`` has no ``encode`` and ``decode`` methods.
        """
        self._binding.check()
        return Scope(self._binding, name, check_codec(codec))

    def scopes(self) -> list[str]:
        """The names of the scopes that hold at least one live key, sorted."""
        engine = self._binding.engine
        return engine.store.scopes(engine.now())

    def transaction(self, *scopes: str) -> MultiTransaction:
        """A context manager giving its body exclusive ownership of every scope named.

        ``with state.transaction("orders", "ledger") as tx:`` — ``tx["orders"]`` has
        every verb of a scope; the writes of the body, to all the scopes, commit together
        when it ends, or not at all if it raises. The scopes are taken in one order
        (sorted by name), so transactions sharing scopes never wait on each other in a
        circle. Repeated names count once.

        Raises:
            InvalidArgumentError: no scope named.
            InvalidKeyError: a name that is not a valid scope name, or a scope of events
                (``queue:NAME``, ``run:NAME``), which no transaction writes.
            ReentrancyError: this thread is inside a transaction on one of the scopes.
            ConflictError: (at the end of the block) another process changed one of the
                scopes meanwhile; nothing was applied.
        """
        engine = self._binding.engine
        transaction = MultiTransaction(self._binding, scopes)
        for name in transaction.names:
            if in_transaction(engine, name):
                raise ReentrancyError(
                    f"this thread holds a transaction on scope {name!r}: transactions do not nest"
                )
        return transaction

    def lock(self, name: str, ttl: float, timeout: float | None = None) -> Lock:
        """A lease on ``name`` for ``ttl`` seconds, shared by every process on this
        database; ``timeout`` is how long ``with`` waits to acquire it.

        Raises:
            InvalidKeyError: ``name`` is not a valid name.
            InvalidArgumentError: ``ttl`` is not a number > 0.
        """
        self._binding.check()
        return Lock(self._binding, name, ttl, timeout)

    def queue(
        self,
        name: str,
        max_attempts: int | None = None,
        *,
        concurrency: int | Literal[False] | None = None,
        group_concurrency: int | Literal[False] | None = None,
        rate: tuple[int, float] | Literal[False] | None = None,
        backoff: tuple[float, float] | Literal[False] | None = None,
    ) -> Queue:
        """A durable work queue, shared by every process on this database (created on
        first use).

        Its settings are saved with the handle's first write and hold for every
        process (None: as stored; ``False`` lifts a limit): ``max_attempts``, the takes
        a job gets before it is dead (5 for a new queue); ``concurrency``, the most jobs
        taken at once; ``group_concurrency``, the most taken at once per group;
        ``rate=(limit, seconds)``, the most takes in any window of ``seconds``;
        ``backoff=(base, maximum)``, the pause before a nacked job's next attempt
        (``base`` doubled per attempt up to ``maximum``, with jitter).

        Raises:
            InvalidKeyError: ``name`` is not a valid name (at most 1,018 characters).
            InvalidArgumentError: a setting of the wrong type or out of range.
        """
        self._binding.check()
        return Queue(
            self._binding,
            name,
            max_attempts,
            concurrency=concurrency,
            group_concurrency=group_concurrency,
            rate=rate,
            backoff=backoff,
        )

    def queues(self) -> list[str]:
        """The names of the queues in the database, sorted: every queue that ever had
        a job (a put, a transaction's enqueue), empty or not."""
        return self._binding.engine.store.reader().jobs().queue_names()

    def subscribe(
        self,
        callback: Callable[[ChangeEvent], Any],
        scope: Globs | None = None,
        key: Globs | None = None,
        events: Events | None = None,
        where: Where | None = None,
        since: int | None = None,
        durable: str | None = None,
        *,
        max_retries: int = 3,
        buffer_size: int = DEFAULT_BUFFER,
    ) -> Subscription:
        """Call ``callback(event)`` for every committed change that passes the filters.

        ``scope`` and ``key`` are globs, as Redis reads them, or lists of globs (an
        event passes when any one matches: ``scope=["orders", "ledger"]``; ``|`` is no
        alternation), ``events`` a subset of ``{"created", "updated", "deleted",
        "expired"}``, ``where`` a predicate on the event. ``since=REVISION``
        first replays the change log after it. ``durable="name"`` makes delivery
        at-least-once, resuming where that name left off (``since`` applies only the
        first time the name is seen). An ``async def`` callback runs on the event loop
        it is subscribed from.

        Raises:
            InvalidArgumentError: a bad filter, or an async callback outside a loop.
            RevisionCompactedError: the change log no longer holds what follows ``since``.
        """
        engine = self._binding.engine
        match = Filter(scope, key, events, where)
        if durable is not None and engine.hub.durable_in_use(durable):
            raise InvalidArgumentError(
                f"durable subscriber {durable!r} is already subscribed in this process"
            )
        if durable is not None and engine.store.position(durable) is not None:
            since = None  # a durable name seen before resumes where it was: since is moot
        subscription = Subscription(
            engine,
            callback,
            match,
            since=check_since(engine, since),
            durable=durable,
            max_retries=max_retries,
            buffer_size=buffer_size,
        )
        try:
            subscription.listen(subscription.durable)  # checks the durable name atomically, too
        except BaseException:
            subscription.close()
            raise
        subscription.deliver()
        return subscription

    def on(
        self,
        scope: Globs | None = None,
        key: Globs | None = None,
        events: Events | None = None,
        where: Where | None = None,
        since: int | None = None,
        durable: str | None = None,
    ) -> Callable[[F], F]:
        """``subscribe`` as a decorator: ``@state.on("orders", key="o-*")``."""

        def decorate(callback: F) -> F:
            self.subscribe(callback, scope, key, events, where, since, durable)
            return callback

        return decorate

    def changes(
        self,
        since: int | None = None,
        scope: Globs | None = None,
        key: Globs | None = None,
        limit: int | None = None,
    ) -> list[ChangeEvent]:
        """The recorded changes after revision ``since`` (every one the log retains when
        ``since`` is None), oldest first; at most ``limit`` of them. ``scope`` and
        ``key`` filter them as ``subscribe``'s do.

        Raises:
            RevisionCompactedError: the change log no longer holds what follows ``since``
                (also when compaction overtakes the read).
        """
        engine = self._binding.engine
        checked = check_since(engine, since)
        if limit is not None and (type(limit) is not int or limit < 0):
            raise InvalidArgumentError(f"limit must be an int >= 0, not {limit!r}")
        match = Filter(scope, key, None, None)
        position = engine.store.compacted() if checked is None else checked
        found: list[ChangeEvent] = []
        while limit is None or len(found) < limit:
            records = engine.store.log_after(position, 1000)
            if not records:
                break
            if records[0].revision != position + 1:  # compaction got there first
                if checked is not None:
                    raise RevisionCompactedError(
                        f"the change log was compacted past revision {position} while it "
                        "was being read"
                    )
                found = []  # every retained event: those from the new start of the log
            found.extend(ChangeEvent(record) for record in records if match.admits(record))
            position = records[-1].revision
        return found if limit is None else found[:limit]

    def watch(
        self,
        since: int | None = None,
        scope: Globs | None = None,
        key: Globs | None = None,
        *,
        buffer_size: int = 100_000,
    ) -> Watch:
        """An iterator over changes: those recorded after ``since``, then live ones.
        ``scope`` and ``key`` filter them as ``subscribe``'s do.

        Raises:
            RevisionCompactedError: the change log no longer holds what follows ``since``.
        """
        engine = self._binding.engine
        watch = Watch(
            engine, Filter(scope, key, None, None), check_since(engine, since), buffer_size
        )
        try:
            watch.listen()
        except BaseException:
            watch.close()
            raise
        return watch

    def timers(self, scope: str = "*") -> list[Timer]:
        """The pending timers of the scopes matching the glob ``scope``, earliest first
        (see ``Scope.schedule``).

        Raises:
            InvalidKeyError: a bad pattern.
        """
        engine = self._binding.engine
        pattern = compile_pattern(scope)
        return [timer_of(row) for row in engine.store.timers() if pattern.matches(row.scope)]

    def cancel_timer(self, timer_id: str) -> bool:
        """Cancel a pending timer; return whether it was pending (a timer that fired,
        unless it recurs, or was cancelled, is not).

        Raises:
            InvalidArgumentError: ``timer_id`` is not a str.
            ReentrancyError: this thread holds a transaction on the timer's scope (use
                the transaction's ``cancel_timer``).
        """
        engine = self._binding.engine
        found = cancelling(engine, timer_id)
        if found is None:
            return False
        scope, work = found
        if in_transaction(engine, scope):
            raise ReentrancyError(
                f"this thread holds a transaction on scope {scope!r}, the timer's: "
                "cancel it with tx.cancel_timer, inside the body"
            )
        return engine.write(scope, work)

    # -- durable workflows (SPEC §14) ----------------------------------------------------
    def workflow(self, name: str, max_attempts: int = 5, lease: float = 30.0) -> Callable[[W], W]:
        """A decorator registering a function as workflow ``name`` on this database, in
        this process: it is called as ``fn(run, input)`` by the workers (``serve``). A run whose
        workers' leases (``lease`` seconds, renewed while it runs) ran out
        ``max_attempts`` times fails with ``RunDeadError``.

        Raises:
            InvalidKeyError: an empty name.
            InvalidArgumentError: a bad ``max_attempts`` or ``lease``.
        """
        self._binding.check()
        return self._workflows.register(name, max_attempts, lease)  # type: ignore[return-value]

    def start(self, workflow: str, input: Any = None, id: str | None = None) -> RunHandle:  # noqa: A002 - the spec's names
        """Record a run of ``workflow`` with ``input`` and make it ready; its handle.
        An ``id`` that a run has already: that run's handle, and nothing changes.

        Raises:
            InvalidValueError: ``input`` is not a value.
            InvalidKeyError: an empty workflow name or id.
        """
        return self._workflows.start(workflow, input, id)

    def run(self, run_id: str) -> RunHandle:
        """The handle of run ``run_id``.

        Raises:
            KeyError: no such run.
        """
        return self._workflows.handle(run_id)

    def serve(self, workflows: list[str] | None = None, concurrency: int = 4) -> Workers:
        """Run the registered workflows' runs (``workflows``: only those) in
        ``concurrency`` worker threads of this process, until ``stop()``.

        Raises:
            InvalidArgumentError: a bad ``concurrency``, or a name not registered here.
        """
        self._binding.check()
        registered = self._workflows.registered
        names = sorted(registered) if workflows is None else list(workflows)
        unknown = [name for name in names if name not in registered]
        if unknown or not names:
            raise InvalidArgumentError(
                f"no workflow registered as {unknown[0]!r}" if unknown else "no workflow to serve"
            )
        return Workers(self._binding, {name: registered[name] for name in names}, concurrency)

    def send(self, run_id: str, topic: str, message: Any) -> None:
        """Send ``message`` to run ``run_id`` on ``topic``: its next ``receive(topic)``
        gets it (kept until then).

        Raises:
            KeyError: no such run.
            InvalidValueError: ``message`` is not a value.
        """
        self._workflows.send(run_id, topic, message)

    def cancel(self, run_id: str) -> bool:
        """Cancel run ``run_id``: at once if it is pending or suspended, else at its
        running step's end. Whether it was not finished.

        Raises:
            KeyError: no such run.
        """
        return self._workflows.cancel(run_id)

    def runs(self, workflow: str = "*", status: str | None = None) -> list[RunInfo]:
        """The runs of the workflows whose names match ``workflow`` (a glob), with
        ``status`` if given, oldest first."""
        return self._workflows.runs(workflow, status)

    def run_info(self, run_id: str) -> RunInfo:
        """Run ``run_id`` as recorded: status, input, result or error, attempts, steps.

        Raises:
            KeyError: no such run.
        """
        return self._workflows.run_info(run_id)

    # -- derived values (SPEC §15) -------------------------------------------------------
    def derive(
        self,
        fn: Callable[[Reader], Any],
        name: str | None = None,
        into: tuple[str, str] | None = None,
    ) -> DerivedValue:
        """A value computed by ``fn`` from what it reads through its ``Reader`` (one
        snapshot), now, and again after each commit (of any process) that changes what
        it read; ``into=(scope, key)``: each new result is also written there.

        Raises:
            InvalidArgumentError: ``fn`` is not callable, or a bad ``into``.
            ClosedError: the engine is closed.
        """
        if not callable(fn):
            raise InvalidArgumentError(f"a derived value needs a function, not {fn!r}")
        label = name if name is not None else getattr(fn, "__name__", "derived")
        self._binding.check()
        return DerivedValue(self._binding, fn, str(label), check_into(into)).open()

    def count(
        self,
        scope: str,
        pattern: str = "*",
        where: Callable[[Any], bool] | None = None,
        name: str | None = None,
    ) -> DerivedValue:
        """How many live keys of ``scope`` match ``pattern`` (and ``where``), kept up
        from each change's old and new value (``name``: by default "count
        SCOPE/PATTERN").

        Raises:
            InvalidKeyError: a bad scope name or pattern.
            InvalidArgumentError: ``where`` is not callable.
        """
        self._binding.check()
        label = f"count {scope}/{pattern}" if name is None else str(name)
        return Aggregate(self._binding, label, scope, pattern, where, None).open()

    def sum(
        self,
        scope: str,
        pattern: str = "*",
        path: str = "",
        where: Callable[[Any], bool] | None = None,
        name: str | None = None,
    ) -> DerivedValue:
        """The sum of the numbers at JSON Pointer ``path`` (the whole value: "") of the
        live keys of ``scope`` matching ``pattern`` (and ``where``), kept up from each
        change's old and new value; a value with no number there adds nothing
        (``name``: by default "sum SCOPE/PATTERN/PATH").

        Raises:
            InvalidKeyError: a bad scope name or pattern.
            InvalidArgumentError: ``where`` is not callable, or ``path`` is no pointer.
        """
        self._binding.check()
        label = f"sum {scope}/{pattern}{path}" if name is None else str(name)
        return Aggregate(self._binding, label, scope, pattern, where, path).open()

    def derived(self) -> list[DerivedValue]:
        """The derived values live in this process's engine, by name."""
        values = derivations_of(self._binding.engine).values()
        return [value for value in values if isinstance(value, DerivedValue)]

    def stats(self) -> dict[str, Any]:
        """Keys per scope, operations and latency by verb, events, expiry, size."""
        return engine_stats(self._binding.engine)

    def close(self) -> None:
        """Close this handle; the last handle of an engine stops its actors and threads
        and releases the database. Idempotent."""
        engine = self._binding.release()
        if engine is not None:
            release_engine(engine)

    def __enter__(self) -> State:
        self._binding.check()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.close()


def cancelling(engine: EnginePort, timer_id: object) -> tuple[str, Work[bool]] | None:
    """How to cancel timer ``timer_id`` (``State.cancel_timer``, and its asyncio twin):
    the timer's scope, and the work its actor runs there, under the scope's lock, so
    ordered with the timer's firing; None if the timer is not pending (a short read).

    Raises:
        InvalidArgumentError: ``timer_id`` is not a str.
    """
    checked = check_timer_id(timer_id)
    row = engine.store.timer(checked)
    return None if row is None else (row.scope, drop_timer(checked))


def workflows_of(state: State) -> Workflows:
    """A handle's durable workflows (for ``reactor.aio``, which wraps the handle)."""
    return state._workflows  # noqa: SLF001 - this module's own class
