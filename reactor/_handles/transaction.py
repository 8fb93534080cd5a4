"""Transactions: exclusive ownership of one scope, or several, for the body of a
``with`` block.

On entry each scope's actor hands its scope over (``Hold``): requests from elsewhere
for those scopes wait (other scopes go on). A transaction over several scopes takes
them one after another in one order, sorted by name, so that two transactions that
share scopes never wait for each other in a circle; one that fails to take a scope (a
timeout, a closing engine, a cancelled task) hands back those it took. The body's verbs
run here, in the caller's thread, against one pending write transaction kept in memory
for all the scopes; reads see the database as the body has changed it. On exit the
actor of the first scope commits what the body staged in one database transaction
that covers every scope (on PostgreSQL it takes all their locks, sorted), or nothing if
the body raised, and the scopes go back.

Within this process no other writer can touch the scopes meanwhile. Another process
can: so the commit checks, in the change log, that nothing was committed to any of the
scopes since the transaction began, and raises ``ConflictError`` (nothing applied) if
something was.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Iterable
from time import perf_counter
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from reactor._base.keys import Pattern
from reactor._base.results import Snapshot
from reactor._storage.records import Row
from reactor._storage.txn import WriteTxn
from reactor._work import jobs as _jobs
from reactor._work.commit_check import checked_commit
from reactor._work.timers import DropTimer, check_timer_id, pending_timer
from reactor.errors import ClosedError, ReentrancyError

from .run_handle import RunHandle, start_in
from .transaction_scopes import part_of, scope_names
from .verbs import ScopeVerbs, verb

if TYPE_CHECKING:
    from reactor._base.codecs import Codec
    from reactor._engine.options import Options
    from reactor._engine.port import EnginePort
    from reactor._engine.reply import ThreadReply
    from reactor._work.jobs import PutOptions

    from .binding import Binding

__all__ = [
    "Hold",
    "MultiTransaction",
    "Transaction",
    "held",
    "held_scopes",
    "in_transaction",
]

T = TypeVar("T")


class _Held(threading.local):
    """This thread's transaction bodies; ``holds`` is None until its first, so that a
    verb's check of it costs no call where no transaction ever ran (``Scope._usable``)."""

    holds: dict[tuple[int, str], Hold] | None = None


held = _Held()


def _thread_holds() -> dict[tuple[int, str], Hold]:
    holds = held.holds
    if holds is None:
        holds = held.holds = {}
    return holds


def in_transaction(engine: EnginePort, scope: str) -> bool:
    """Whether this thread is inside a transaction body on ``scope``. A hold that
    ended without saying so (a Ctrl-C in its ``exit``) no longer counts."""
    holds = held.holds
    if not holds:
        return False
    hold = holds.get((id(engine), scope))
    if hold is None:
        return False
    if hold.status in ("open", "committing"):
        return True
    del holds[(id(engine), scope)]
    return False


def held_scopes(engine: EnginePort) -> list[str]:
    """The scopes of ``engine`` this thread is inside a transaction body on, sorted."""
    holds = held.holds
    if not holds:
        return []
    return sorted(
        scope for held, scope in list(holds) if held == id(engine) and in_transaction(engine, scope)
    )


class Hold:
    """What a transaction holds: its scopes, taken from their actors in order, and the
    pending write transaction its body stages its writes in (one for all the scopes).

    The steps of ``take`` and ``finish`` are separate, for ``reactor.aio`` to wait on
    the actors' futures its own way. ``self`` is the owner the mailboxes know.
    """

    __slots__ = (
        "_binding",
        "base",
        "deadlines",
        "engine",
        "locks",
        "names",
        "outbox",
        "status",
        "taken",
        "thread",
        "txn",
    )

    def __init__(self, binding: Binding, names: tuple[str, ...]) -> None:
        self._binding = binding
        self.names = names  # sorted: the one order scopes are taken in
        self.engine: EnginePort | None = None
        self.taken: list[str] = []
        self.thread: int | None = None  # the thread of a synchronous body
        self.txn: WriteTxn | None = None
        self.base = 0  # the revision the body reads at
        # The deadline of each row the body read, as first read (``Reader.deadlines``).
        self.deadlines: dict[tuple[str, str], float | None] = {}
        self.status = "new"
        # What else the commit holds against other processes (a queue the body enqueues
        # to): the names of PostgreSQL's scope locks, with the scopes'.
        self.locks: set[str] = set()

    def options(self, engine: EnginePort, codec: Codec | None = None) -> Options:
        """What the body's writes check and encode with (``Binding.options``)."""
        return self._binding.options(engine, codec)

    def enqueue(
        self, queue: str, item: Any, delay: float | None, key: str | None, options: PutOptions
    ) -> None:
        """Add a job to ``queue`` when the transaction commits (``tx.enqueue``)."""
        engine = self.usable()
        start = perf_counter()
        try:
            checks = self.options(engine)  # with the state's codec
            name, entry = _jobs.check_put(checks, queue, item, delay, key, **options)
            txn = self.txn
            assert txn is not None
            outbox = txn.last_deferred()  # enqueues in a row share one, run in the commit
            if not isinstance(outbox, _jobs.Outbox):
                outbox = _jobs.Outbox()
                txn.defer(outbox)  # at its place among the body's writes
            outbox.add(name, entry)
            self.locks.add(_jobs.lock_name(name))
        finally:
            engine.stats.record("queue.enqueue", perf_counter() - start)

    def start_run(self, workflow: str, input: Any, run_id: str | None) -> RunHandle:  # noqa: A002 - the spec's name
        """Start a run of ``workflow`` when the transaction commits (``tx.start``)."""
        engine = self.usable()
        txn = self.txn
        assert txn is not None
        return start_in(self._binding, engine.options, txn, self.defer, (workflow, input, run_id))

    def defer(self, work: Callable[[WriteTxn], None], locks: Iterable[str]) -> None:
        """Run ``work`` in the commit's transaction, after the body's writes, holding
        ``locks`` (scopes) too against other processes: a workflow's record, which
        commits with the body's writes or not at all."""
        txn = self.txn
        assert txn is not None
        txn.defer(work)
        self.locks.update(locks)

    # -- with: the thread's bookkeeping around take and finish -----------------------
    def enter(self) -> None:
        engine = self._binding.engine
        for name in self.names:
            if in_transaction(engine, name):
                raise ReentrancyError(f"this thread already holds a transaction on {name!r}")
        self.take()
        try:
            held: dict[tuple[int, str], Hold] = _thread_holds()
            for name in self.names:
                held[(id(engine), name)] = self
        except BaseException:  # a Ctrl-C: the body never runs, the scopes go back
            try:
                self.exit(commit=False)
            except BaseException:  # noqa: BLE001 - another Ctrl-C: the first is raised
                self.exit(commit=False)  # once more
            raise

    def exit(self, commit: bool) -> None:
        try:
            self.finish(commit)
        finally:
            if self.engine is not None:
                held = _thread_holds()
                for name in self.names:
                    if held.get((id(self.engine), name)) is self:
                        del held[(id(self.engine), name)]

    # -- synchronous -----------------------------------------------------------------
    def take(self) -> None:
        """Take every scope over from its actor, in order (waiting for each while it
        moves on, within the engine's timeout from its last hand-over), and open the
        pending write transaction. On any failure no scope stays held."""
        engine = self.start()
        self.thread = threading.get_ident()
        name, future = self.names[0], None
        try:
            for name in self.names:
                future = None
                future = self.ask(name)
                engine.wait(name, future)
                self.took(name)
            self.open()
        except BaseException:
            # Calling a Python function is a point where a Ctrl-C may land (``_turn``):
            # giving up, which leaves nothing held, is tried once more then.
            try:
                self.give_up(name, future)
            except BaseException:  # noqa: BLE001 - another Ctrl-C: the first is raised
                self.give_up(name, future)
            raise

    def finish(self, commit: bool) -> None:
        """Commit what the body staged (``commit``), or drop it; hand the scopes back.

        Raises:
            ConflictError: another process changed a scope meanwhile (nothing applied).
        """
        engine = self.engine
        if engine is None or self.txn is None:
            return
        status = "failed"
        try:
            future = self.submit_commit(commit)
            if future is not None:
                engine.wait(self.names[0], future)
            status = "rolled back" if future is None else "committed"
        finally:
            # Calling a Python function is a point where a Ctrl-C may land (``_turn``):
            # the hand-back, which leaves nothing held, is tried once more then.
            try:
                self.hand_back(status)
            except BaseException:
                self.hand_back(status)
                raise

    # -- the steps -------------------------------------------------------------------
    def start(self) -> EnginePort:
        """Begin taking the scopes: the engine to take them from.

        Raises:
            ReentrancyError: this transaction was entered before.
        """
        if self.status != "new":
            raise ReentrancyError("a transaction is entered once")
        engine = self._binding.engine
        self.engine, self.status = engine, "waiting"
        return engine

    def ask(self, name: str) -> ThreadReply[None]:
        """Ask ``name``'s actor for the scope: the future is done once it is held (the
        caller then notes it with ``took``)."""
        engine = self.engine
        assert engine is not None
        return engine.hold(name, self)

    def took(self, name: str) -> None:
        self.taken.append(name)

    def give_up(self, name: str, future: ThreadReply[Any] | None) -> None:
        """Stop taking the scopes: those taken go back; the request for ``name`` is
        withdrawn or, if its actor is handing the scope over already, the scope goes
        back once it is handed over."""
        engine = self.engine
        assert engine is not None
        if future is not None and not future.cancel():
            future.add_done_callback(lambda _: engine.release(name, self))
        self.hand_back("withdrawn")

    def open(self) -> None:
        """Open the pending write transaction on the scopes now held (a short read);
        the caller gives them back if that fails."""
        engine = self.engine
        assert engine is not None
        self.base = engine.store.revision()
        reader = engine.store.reader()
        self.deadlines = reader.deadlines
        self.txn = WriteTxn(reader, engine.now())
        self.status = "open"

    def submit_commit(self, commit: bool) -> ThreadReply[None] | None:
        """Queue the commit of what the body staged, on the first scope's actor, in one
        database transaction covering every scope: its future, or None when there is
        nothing to commit (``commit`` false, or nothing staged)."""
        engine, txn = self.engine, self.txn
        assert engine is not None
        if txn is None or not (commit and txn.changed):
            return None
        self.status = "committing"
        first = self.names[0]
        scopes = (*self.names, *sorted(self.locks - set(self.names)))
        return engine.submit(
            first,
            checked_commit(self.names, txn, self.base, self.deadlines),
            owner=self,
            scopes=scopes,
        )

    def hand_back(self, status: str) -> None:
        """End the transaction as ``status`` and give every scope taken back to its
        actor."""
        engine = self.engine
        assert engine is not None
        self.status, self.txn = status, None
        self.taken = []
        # Every name, not only those noted as taken: a Ctrl-C may have come between the
        # hand-over and the note. ``release`` ignores a scope this hold does not have.
        for name in reversed(self.names):
            engine.release(name, self)

    def cancel_timer(self, timer_id: object) -> bool:
        """Cancel a timer with the commit (see ``Transaction.cancel_timer``)."""
        self.usable()
        checked = check_timer_id(timer_id)
        txn = self.txn
        assert txn is not None
        row = pending_timer(txn, checked)  # the body's own schedules and cancels count
        if row is None:
            return False
        if row.scope not in self.names:
            self.locks.add(row.scope)  # the commit holds it, ordered with the firing
        txn.defer(DropTimer(checked))  # gone already if it fired meanwhile: nothing
        return True

    def run(self, work: Callable[[WriteTxn], T]) -> T:
        """``work`` in the pending transaction: a verb that fails leaves the body's other
        writes be (rolled back to a savepoint)."""
        txn = self.txn
        assert txn is not None
        mark = txn.savepoint()
        try:
            return work(txn)
        except BaseException:
            txn.rollback_to(mark)
            raise

    def usable(self) -> EnginePort:
        engine = self.engine
        if self.status != "open" or engine is None:
            raise ClosedError(f"this transaction is {self.status}, not open")
        if engine.closed:
            raise ClosedError("the engine is closed")
        return engine


class Transaction(ScopeVerbs):
    """The ``tx`` of ``with scope.transaction() as tx:``, with every verb of a
    ``Scope``; in a transaction over several scopes, ``tx[name]`` of a
    ``MultiTransaction``: the same verbs, on that scope."""

    __slots__ = ("_codec", "_hold", "_own", "name")

    def __init__(
        self, binding: Binding, name: str, hold: Hold | None = None, *, codec: Codec | None = None
    ) -> None:
        self.name = name
        self._own = hold is None  # False: a part of a MultiTransaction
        self._hold = Hold(binding, (name,)) if hold is None else hold
        self._codec = binding.codec if codec is None else codec

    def __repr__(self) -> str:
        return f"<reactor.Transaction on {self.name!r} ({self._hold.status})>"

    # -- lifetime ------------------------------------------------------------------
    def __enter__(self) -> Transaction:
        self._check_own()
        self._hold.enter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self._hold.exit(commit=exc_type is None)

    def begin(self) -> None:
        """Take the scope over from its actor (waiting for it while the scope moves on,
        within the engine's timeout from its last hand-over) and open the pending write
        transaction. ``with`` calls it.

        Raises:
            ReentrancyError: entered before, or part of a ``MultiTransaction``.
            OperationTimeout: the scope stayed held elsewhere past the timeout.
        """
        self._check_own()
        self._hold.take()

    def finish(self, commit: bool) -> None:
        """Commit what the body staged (``commit``), or drop it; hand the scope back to
        its actor. ``with`` calls it.

        Raises:
            ConflictError: another process changed the scope meanwhile (nothing applied).
        """
        self._check_own()
        self._hold.finish(commit)

    def _check_own(self) -> None:
        if not self._own:
            raise ReentrancyError(
                f"tx[{self.name!r}] is part of a transaction over several scopes: "
                "that transaction begins and ends them all"
            )

    # The steps of begin and finish, for reactor.aio (and its tests).
    def _ask(self) -> tuple[EnginePort, ThreadReply[None]]:
        """Ask the scope's actor for the scope: the future is done once it is held."""
        engine = self._hold.start()
        return engine, self._hold.ask(self.name)

    def _withdraw(self, future: ThreadReply[Any]) -> None:
        """Stop waiting for the scope (see ``Hold.give_up``)."""
        self._hold.give_up(self.name, future)

    def cancel_timer(self, timer_id: str) -> bool:
        """Cancel a pending timer with the commit, or not at all; return whether it is
        pending now, as this body sees it: its own ``schedule`` and earlier cancels
        count. (A timer of a scope this transaction does not hold may still fire before
        the commit: then there is nothing left to cancel.)

        Raises:
            InvalidArgumentError: ``timer_id`` is not a str.
        """
        return self._hold.cancel_timer(timer_id)

    # -- how verbs run: in the pending transaction ----------------------------------
    def _usable(self) -> EnginePort:
        return self._hold.usable()

    def _run(self, work: Callable[[WriteTxn], T]) -> T:
        return self._hold.run(work)

    # -- where reads read: the pending transaction -----------------------------------
    def _live(self, key: str) -> Row | None:
        # Through _run: a read that finds a row past its deadline stages its expiry.
        return self._run(lambda txn: txn.live_row(self.name, key))

    def _row(self, key: str) -> Row | None:
        return self._live(key)

    def _text(self, key: str) -> str | None:
        row = self._live(key)
        return None if row is None else row.value

    def _entry(self, key: str, now: float) -> tuple[str, float | None] | None:  # noqa: ARG002
        row = self._live(key)  # as of the transaction's clock, which is ``now``
        return None if row is None else (row.value, row.expires_at)

    def _texts(self, keys: builtins.list[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for key in keys:
            row = self._live(key)
            if row is not None:
                found[key] = row.value
        return found

    def _items(self, pattern: Pattern) -> builtins.list[tuple[str, str]]:
        rows = self._run(lambda txn: txn.live_rows(self.name, pattern))
        return [(key, row.value) for key, row in rows]

    def _now(self) -> float:
        txn = self._hold.txn
        assert txn is not None
        return txn.now

    @verb("snapshot")
    def snapshot(self) -> Snapshot:
        """The scope as this transaction sees it, with the revision it began at."""
        return Snapshot(self.list(), self._hold.base)

    def enqueue(
        self,
        queue: str,
        item: Any,
        delay: float | None = None,
        key: str | None = None,
        **options: Unpack[PutOptions],
    ) -> None:
        """Add a job to ``queue`` (``state.queue(queue).put(item, delay, key, ...)``,
        with its ``priority``, ``group`` and ``debounce``) if, and when, the transaction
        commits: the job and the body's writes are committed together, or neither (an
        outbox). Its id is not known before the commit, so none is returned.

        Raises:
            InvalidValueError: ``item`` is not storable JSON.
            InvalidKeyError: a bad queue name, ``key`` or ``group``.
            InvalidArgumentError: as ``Queue.put``.
        """
        self._hold.enqueue(queue, item, delay, key, options)

    def start(self, workflow: str, input: Any = None, id: str | None = None) -> RunHandle:  # noqa: A002 - the spec's names
        """Start a run of ``workflow`` with the commit, or not at all (``state.start``):
        its handle; an id a run has already gets that run's, and starts nothing.

        Raises:
            InvalidValueError, InvalidKeyError: as ``state.start``.
        """
        return self._hold.start_run(workflow, input, id)

    def transaction(self) -> Transaction:
        """Transactions do not nest: raises ``ReentrancyError``, always."""
        raise ReentrancyError("transactions do not nest")


class MultiTransaction:
    """The ``tx`` of ``with state.transaction("orders", "ledger") as tx:``: the body
    owns every scope named, and ``tx["orders"]`` is a ``Transaction`` with every verb
    of a ``Scope`` on that scope. The writes of the body, to all the scopes, commit
    together when it ends, or not at all if it raises.
    """

    __slots__ = ("_hold", "_parts", "names")

    def __init__(self, binding: Binding, names: Iterable[str], hold: Hold | None = None) -> None:
        self.names: tuple[str, ...] = scope_names(names)
        """The scopes it holds, sorted by name: the order it takes them in."""
        self._hold = Hold(binding, self.names) if hold is None else hold
        self._parts = {name: Transaction(binding, name, self._hold) for name in self.names}

    def __repr__(self) -> str:
        scopes = ", ".join(repr(name) for name in self.names)
        return f"<reactor.MultiTransaction on {scopes} ({self._hold.status})>"

    def __getitem__(self, name: str) -> Transaction:
        """The verbs of scope ``name`` in this transaction.

        Raises:
            InvalidArgumentError: ``name`` is not one of the transaction's scopes.
            InvalidKeyError: ``name`` is not a valid scope name.
        """
        return self._parts[part_of(self.names, name)]

    def cancel_timer(self, timer_id: str) -> bool:
        """Cancel a pending timer with the commit (see ``Transaction.cancel_timer``)."""
        return self._hold.cancel_timer(timer_id)

    def enqueue(
        self,
        queue: str,
        item: Any,
        delay: float | None = None,
        key: str | None = None,
        **options: Unpack[PutOptions],
    ) -> None:
        """Add a job to ``queue`` if, and when, the transaction commits, with the body's
        writes to every scope (see ``Transaction.enqueue``)."""
        self._hold.enqueue(queue, item, delay, key, options)

    def start(self, workflow: str, input: Any = None, id: str | None = None) -> RunHandle:  # noqa: A002 - the spec's names
        """Start a run of ``workflow`` with the commit (see ``Transaction.start``)."""
        return self._hold.start_run(workflow, input, id)

    def __enter__(self) -> MultiTransaction:
        self._hold.enter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self._hold.exit(commit=exc_type is None)
