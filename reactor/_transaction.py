"""``Transaction``: exclusive ownership of a scope for the body of a ``with`` block.

On entry the scope's actor hands the scope over: requests from elsewhere for that scope
wait (other scopes go on). The body's verbs run here, in the caller's thread, against a
pending write transaction kept in memory; reads see the database as the body has
changed it. On exit the actor commits what the body staged in one database transaction,
or nothing if the body raised, and hands the scope back.

Within this process no other writer can touch the scope meanwhile. Another process can:
so the commit checks, in the change log, that nothing was committed to the scope since
the transaction began, and raises ``ConflictError`` (nothing applied) if something was.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable
from concurrent.futures import Future
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from . import _writes
from ._engine import engine_of
from ._keys import Pattern
from ._results import Snapshot
from ._sql import TransactionReader
from ._store import Row, WriteTxn
from ._verbs import ScopeVerbs, verb
from .errors import (
    ClosedError,
    ConflictError,
    ReentrancyError,
)

if TYPE_CHECKING:
    from ._engine import Engine
    from ._state import State

__all__ = ["Transaction", "in_transaction"]

T = TypeVar("T")

_held = threading.local()  # .scopes: the (engine, scope) pairs this thread's bodies hold


def in_transaction(engine: Engine, scope: str) -> bool:
    """Whether this thread is inside a transaction body on ``scope``."""
    held: set[tuple[int, str]] | None = getattr(_held, "scopes", None)
    return bool(held) and (id(engine), scope) in held  # type: ignore[operator]


class Transaction(ScopeVerbs):
    """The ``tx`` of ``with scope.transaction() as tx:``; every verb of a ``Scope``."""

    __slots__ = ("_base", "_engine_ref", "_state", "_status", "_txn", "name")

    def __init__(self, state: State, name: str) -> None:
        self._state = state
        self.name = name
        self._engine_ref: Engine | None = None
        self._txn: WriteTxn | None = None
        self._base = 0
        self._status = "new"

    def __repr__(self) -> str:
        return f"<reactor.Transaction on {self.name!r} ({self._status})>"

    # -- lifetime ------------------------------------------------------------------
    def __enter__(self) -> Transaction:
        engine = engine_of(self._state)
        if in_transaction(engine, self.name):
            raise ReentrancyError(f"this thread already holds a transaction on {self.name!r}")
        self.begin()
        scopes: set[tuple[int, str]] = getattr(_held, "scopes", None) or set()
        scopes.add((id(engine), self.name))
        _held.scopes = scopes
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._engine_ref is not None:
            _held.scopes.discard((id(self._engine_ref), self.name))
        self.finish(commit=exc_type is None)

    def begin(self) -> None:
        """Take the scope over from its actor (waiting for it while the scope moves on,
        within the engine's timeout from its last hand-over) and open the pending write
        transaction. ``with`` calls it."""
        engine, future = self._ask()
        try:
            engine.wait(self.name, future)
        except BaseException:
            self._withdraw(future)
            raise
        self._open()

    def finish(self, commit: bool) -> None:
        """Commit what the body staged (``commit``), or drop it; hand the scope back to
        its actor. ``with`` calls it.

        Raises:
            ConflictError: another process changed the scope meanwhile (nothing applied).
        """
        engine = self._engine_ref
        if engine is None or self._txn is None:
            return
        try:
            future = self._submit_commit(commit)
            if future is not None:
                engine.wait(self.name, future)
        except BaseException:
            self._hand_back("failed")
            raise
        self._hand_back("rolled back" if future is None else "committed")

    # The steps of begin and finish, for reactor.aio to wait on the futures its own way.
    def _ask(self) -> tuple[Engine, Future[Any]]:
        """Ask the scope's actor for the scope: the future is done once it is held."""
        if self._status != "new":
            raise ReentrancyError("a transaction is entered once")
        engine = engine_of(self._state)
        future = engine.mailbox(self.name).submit(None, self.name, owner=self)
        self._engine_ref, self._status = engine, "waiting"
        return engine, future

    def _withdraw(self, future: Future[Any]) -> None:
        """Stop waiting for the scope: the request is withdrawn or, if the actor is
        handing the scope over already, the scope goes back once it is handed over."""
        engine = self._engine_ref
        assert engine is not None
        self._status = "withdrawn"
        if not future.cancel():
            mailbox = engine.mailbox(self.name)
            future.add_done_callback(lambda _: mailbox.release(self.name, self))

    def _open(self) -> None:
        """Open the pending write transaction on the scope now held (a short read); the
        scope goes back if that fails."""
        engine = self._engine_ref
        assert engine is not None
        try:
            self._base = engine.store.revision()
            self._txn = WriteTxn(engine.store.reader(), engine.now())
        except BaseException:
            self._hand_back("failed")
            raise
        self._status = "open"

    def _submit_commit(self, commit: bool) -> Future[Any] | None:
        """Queue the commit of what the body staged: its future, or None when there is
        nothing to commit (``commit`` false, or nothing staged)."""
        engine, txn = self._engine_ref, self._txn
        assert engine is not None
        if txn is None or not (commit and txn.changed):
            return None
        self._status = "committing"
        return engine.mailbox(self.name).submit(
            _commit(self.name, txn, self._base), self.name, owner=self
        )

    def _hand_back(self, status: str) -> None:
        """End the transaction as ``status`` and give the scope back to its actor."""
        engine = self._engine_ref
        assert engine is not None
        self._status, self._txn = status, None
        engine.mailbox(self.name).release(self.name, self)

    def _usable(self) -> Engine:
        engine = self._engine_ref
        if self._status != "open" or engine is None:
            raise ClosedError(f"this transaction is {self._status}, not open")
        if engine.closed:
            raise ClosedError("the engine is closed")
        return engine

    def _run(self, work: Callable[[WriteTxn], T]) -> T:
        txn = self._txn
        assert txn is not None
        mark = txn.savepoint()
        try:
            return work(txn)
        except BaseException:
            txn.rollback_to(mark)  # a verb that fails leaves the body's other writes be
            raise

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
        assert self._txn is not None
        return self._txn.now

    @verb("snapshot")
    def snapshot(self) -> Snapshot:
        """The scope as this transaction sees it, with the revision it began at."""
        return Snapshot(self.list(), self._base)

    def transaction(self) -> Transaction:
        """Transactions do not nest.

        Raises:
            ReentrancyError: always.
        """
        raise ReentrancyError("transactions do not nest")


def _commit(scope: str, pending: WriteTxn, base: int) -> _writes.Work[None]:
    reader = pending.statements
    deadlines = reader.deadlines if isinstance(reader, TransactionReader) else {}

    def work(txn: WriteTxn) -> None:
        if txn.statements.changed_since(scope, base) or _deadlines_moved(txn, deadlines):
            raise ConflictError(
                f"another process changed scope {scope!r} during this transaction; "
                "nothing of it was applied"
            )
        txn.adopt(pending, deadlines)

    return _writes.Work(work)


def _deadlines_moved(txn: WriteTxn, deadlines: dict[tuple[str, str], float | None]) -> bool:
    """Whether another process changed the expiry of a key the body read (``expire``, or
    a same-value ``set`` with a new ttl): no change-log record tells of that."""
    by_scope: dict[str, list[str]] = {}
    for scope, key in deadlines:
        by_scope.setdefault(scope, []).append(key)
    for scope, keys in by_scope.items():
        rows = txn.statements.fetch_many(scope, keys)
        for key in keys:
            row = rows.get(key)
            if (None if row is None else row.expires_at) != deadlines[(scope, key)]:
                return True
    return False
