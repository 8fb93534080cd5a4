"""``Scope``: the handle to one named scope.

Reads run in the caller's thread, straight on the database. Writes are validated and
encoded in the caller's thread (``Verbs``), then run by the actor that owns the scope.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from . import _writes
from ._keys import check_key, compile_pattern
from ._results import Snapshot
from ._transaction import Transaction, in_transaction
from ._values import decode
from ._verbs import Verbs, verb
from .errors import ClosedError, InvalidArgumentError, ReentrancyError, TypeMismatchError

if TYPE_CHECKING:
    from ._engine import Engine
    from ._state import State

__all__ = ["Scope"]

T = TypeVar("T")


class Scope(Verbs):
    """A named group of keys, owned by one actor. Take it with ``state.scope(name)``.

    Every verb raises ``ClosedError`` once the handle it came from is closed,
    ``InvalidKeyError`` for a bad key and ``InvalidValueError`` for a value that is not
    storable JSON; nothing is written when a verb raises.
    """

    __slots__ = ("_state", "name")

    def __init__(self, state: State, name: str) -> None:
        self._state = state
        self.name: str = check_key(name, "scope name")

    def __repr__(self) -> str:
        return f"<reactor.Scope {self.name!r}>"

    def _usable(self) -> Engine:
        engine = self._state._engine_or_raise()
        if in_transaction(engine, self.name):
            raise ReentrancyError(
                f"this thread holds a transaction on scope {self.name!r}: "
                "use the transaction (tx), not the scope's handle, inside its body"
            )
        return engine

    @property
    def _engine(self) -> Engine:
        # The verb decorator has checked _usable() already; here only closing matters.
        engine = self._state._engine
        if engine is None:
            raise ClosedError("this reactor handle is closed")
        return engine

    def _run(self, work: _writes.Work[T]) -> T:
        return self._engine.write(self.name, work)

    # -- reads ---------------------------------------------------------------------
    @verb("get")
    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` (a fresh copy), or ``default`` if it is absent."""
        engine = self._engine
        text = engine.store.get(self.name, check_key(key), engine.now())
        return default if text is None else decode(text)

    @verb("get_many")
    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        """The values of those of ``keys`` that exist, in the order asked."""
        if isinstance(keys, str) or not isinstance(keys, Iterable):
            raise InvalidArgumentError(
                f"get_many takes an iterable of keys, not {type(keys).__name__}"
            )
        wanted = [check_key(key) for key in keys]
        engine = self._engine
        found = engine.store.get_many(self.name, wanted, engine.now())
        return {key: decode(text) for key, text in found.items()}

    @verb("exists")
    def exists(self, key: str) -> bool:
        """Whether ``key`` holds a live value."""
        engine = self._engine
        return engine.store.get(self.name, check_key(key), engine.now()) is not None

    @verb("list")
    def list(self) -> dict[str, Any]:
        """Every live key and its value, sorted by key."""
        engine = self._engine
        rows = engine.store.items(self.name, compile_pattern("*"), engine.now())
        return {key: decode(text) for key, text in rows}

    @verb("keys")
    def keys(self, pattern: str = "*") -> builtins.list[str]:
        """The live keys matching the glob ``pattern``, sorted."""
        engine = self._engine
        return engine.store.keys(self.name, compile_pattern(pattern), engine.now())

    @verb("ttl")
    def ttl(self, key: str) -> float:
        """Seconds left before ``key`` expires; ``-1`` without expiry, ``-2`` if absent."""
        engine = self._engine
        now = engine.now()
        entry = engine.store.get_entry(self.name, check_key(key), now)
        if entry is None:
            return -2.0
        expires_at = entry[1]
        return -1.0 if expires_at is None else expires_at - now

    @verb("length")
    def length(self, key: str) -> int:
        """The length of the list at ``key``; 0 when it is absent.

        Raises:
            TypeMismatchError: the value is not a list.
        """
        engine = self._engine
        text = engine.store.get(self.name, check_key(key), engine.now())
        if text is None:
            return 0
        value = decode(text)
        if type(value) is not list:
            raise TypeMismatchError(f"length needs a list; {key!r} holds {type(value).__name__}")
        return len(value)

    @verb("snapshot")
    def snapshot(self) -> Snapshot:
        """Every live key-value and the revision they are current at, read at once.

        Subscribing with ``since=snapshot.revision`` then misses and repeats nothing.
        """
        engine = self._engine
        rows, revision = engine.store.snapshot(self.name, engine.now())
        return Snapshot({key: decode(text) for key, text in rows}, revision)

    def transaction(self) -> Transaction:
        """A context manager giving its body exclusive ownership of this scope.

        ``with scope.transaction() as tx:`` — every verb works on ``tx``; the writes
        commit together when the body ends, or not at all if it raises. Using this
        handle inside the body raises ``ReentrancyError``.
        """
        self._usable()
        return Transaction(self._state, self.name)
