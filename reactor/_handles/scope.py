"""``Scope``: the handle to one named scope.

Reads run in the caller's thread, straight on the database. Writes are validated and
encoded in the caller's thread (``ScopeVerbs``), then run by the actor that owns the scope.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any, TypeVar

from reactor._base.keys import RESERVED_PREFIXES, Pattern, check_key, check_writable
from reactor._base.results import Snapshot
from reactor._base.values import decode
from reactor._storage.records import Row
from reactor._work import writes as _writes
from reactor.errors import ClosedError, ReentrancyError

from . import waiting as _waiting
from .transaction import Transaction, held, in_transaction
from .verbs import ScopeVerbs, verb

if TYPE_CHECKING:
    from reactor._base.codecs import Codec
    from reactor._engine.port import EnginePort

    from .binding import Binding

__all__ = ["Scope"]

T = TypeVar("T")


class Scope(ScopeVerbs):
    """A named group of keys, owned by one actor. Take it with ``state.scope(name)``.

    Every verb raises ``ClosedError`` once the handle it came from is closed,
    ``InvalidKeyError`` for a bad key and ``InvalidValueError`` for a value that is not
    storable JSON; nothing is written when a verb raises. A scope whose name begins
    with ``queue:`` or ``run:`` holds the events of a queue or of a workflow's runs:
    its reads work, and its write verbs (and ``transaction``) raise ``InvalidKeyError``.
    """

    __slots__ = ("_binding", "_codec", "_reserved", "name")

    def __init__(self, binding: Binding, name: str, codec: Codec | None = None) -> None:
        self._binding = binding
        self.name: str = check_key(name, "scope name")
        """The scope's name."""
        self._reserved = name.startswith(RESERVED_PREFIXES)  # its writes raise
        self._codec = binding.codec if codec is None else codec

    def __repr__(self) -> str:
        return f"<reactor.Scope {self.name!r}>"

    def _writable(self) -> EnginePort:
        if self._reserved:
            check_writable(self.name)  # raises
        engine = self._binding.current  # _usable() inline: every write's first step
        if engine is None or engine.closed:
            raise ClosedError("this reactor handle is closed")
        if held.holds and in_transaction(engine, self.name):
            raise _reentered(self.name)
        return engine

    def _usable(self) -> EnginePort:
        # Every verb's first step: Binding.engine's check, and in_transaction's only
        # where this thread ever ran a transaction body, inlined (each call costs).
        engine = self._binding.current
        if engine is None or engine.closed:
            raise ClosedError("this reactor handle is closed")
        if held.holds and in_transaction(engine, self.name):
            raise _reentered(self.name)
        return engine

    @property
    def _engine(self) -> EnginePort:
        # The verb decorator has checked _usable() already; here only closing matters.
        engine = self._binding.current
        if engine is None:
            raise ClosedError("this reactor handle is closed")
        return engine

    def _run(self, work: _writes.Work[T]) -> T:
        engine = self._binding.current  # _engine inlined: this is every write's path
        if engine is None:
            raise ClosedError("this reactor handle is closed")
        return engine.write(self.name, work)

    # -- where reads read: the last commit, straight on the database ---------------
    def _text(self, key: str) -> str | None:
        engine = self._binding.current  # _engine inlined: this is every get's path
        if engine is None:
            raise ClosedError("this reactor handle is closed")
        return engine.store.get(self.name, key, engine.now())

    def _entry(self, key: str, now: float) -> tuple[str, float | None] | None:
        return self._engine.store.get_entry(self.name, key, now)

    def _texts(self, keys: builtins.list[str]) -> dict[str, str]:
        engine = self._engine
        return engine.store.get_many(self.name, keys, engine.now())

    def _items(self, pattern: Pattern) -> builtins.list[tuple[str, str]]:
        engine = self._engine
        return engine.store.items(self.name, pattern, engine.now())

    def _keys(self, pattern: Pattern) -> builtins.list[str]:
        engine = self._engine
        return engine.store.keys(self.name, pattern, engine.now())

    def _row(self, key: str) -> Row | None:
        engine = self._engine
        return engine.store.get_row(self.name, key, engine.now())

    def _now(self) -> float:
        return self._engine.now()

    @verb("snapshot")
    def snapshot(self) -> Snapshot:
        """Every live key-value and the revision they are current at, read at once.

        Subscribing with ``since=snapshot.revision`` then misses and repeats nothing.
        """
        engine = self._engine
        rows, revision = engine.store.snapshot(self.name, engine.now())
        return Snapshot({key: decode(text) for key, text in rows}, revision)

    @verb("wait_for")
    def wait_for(
        self,
        key: str,
        predicate: _waiting.Predicate | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Wait until ``key`` holds a value for which ``predicate(value)`` is true (without
        a predicate: until the key exists); return that value (a fresh copy).

        The current value is checked first, then the value of each change to the key, in
        revision order, this process's and other processes' alike: the wait wakes on
        change events, it does not poll. The predicate runs in the calling thread, and
        only sees values of a key that exists: a deletion or an expiry never satisfies
        it. What it raises propagates, and ends the wait. Nothing is missed between the
        read of the current value and the first change. Not on a transaction (``tx``):
        its body holds the scope, which others could not change meanwhile.

        Raises:
            OperationTimeout: ``timeout`` seconds went by first (None: no limit).
            ClosedError: the engine closed first.
            InvalidArgumentError: ``predicate`` is not callable, or ``timeout`` is not
                None or a number >= 0.
        """
        checked, seconds = _waiting.check_wait(key, predicate, timeout)
        return _waiting.wait(self._engine, self.name, checked, predicate, seconds)

    def transaction(self) -> Transaction:
        """A context manager giving its body exclusive ownership of this scope.

        ``with scope.transaction() as tx:`` — every verb works on ``tx``; the writes
        commit together when the body ends, or not at all if it raises. Using this
        handle inside the body raises ``ReentrancyError``.

        Raises:
            InvalidKeyError: a scope of events (``queue:NAME``, ``run:NAME``), which
                no transaction writes.
        """
        self._writable()
        return Transaction(self._binding, self.name, codec=self._codec)


def _reentered(scope: str) -> ReentrancyError:
    return ReentrancyError(
        f"this thread holds a transaction on scope {scope!r}: "
        "use the transaction (tx), not the scope's handle, inside its body"
    )
