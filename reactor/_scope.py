"""``Scope``: the handle to one named scope, with every verb of SPEC §3.

Reads run in the caller's thread, straight on the database. Writes are validated and
encoded here, in the caller's thread, then run by the actor that owns the scope.
"""

from __future__ import annotations

import builtins
import functools
import math
from collections.abc import Callable, Iterable, Mapping
from time import perf_counter
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from . import _writes
from ._keys import check_key, compile_pattern
from ._results import Change
from ._values import MISSING, Missing, decode
from .errors import InvalidArgumentError, TypeMismatchError

if TYPE_CHECKING:
    from ._engine import Engine
    from ._state import State

__all__ = ["Scope"]

P = ParamSpec("P")
R = TypeVar("R")


def _verb(
    name: str,
) -> Callable[[Callable[Concatenate[Scope, P], R]], Callable[Concatenate[Scope, P], R]]:
    """Check the handle is open, and time the call for ``stats()``."""

    def decorate(method: Callable[Concatenate[Scope, P], R]) -> Callable[Concatenate[Scope, P], R]:
        def timed(self: Scope, /, *args: P.args, **kwargs: P.kwargs) -> R:
            engine = self._state._engine_or_raise()
            start = perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                engine.stats.record(name, perf_counter() - start)

        functools.update_wrapper(timed, method)
        return timed

    return decorate


def _ttl(ttl: object, name: str = "ttl") -> float | None:
    if ttl is None:
        return None
    if type(ttl) not in (int, float) or not math.isfinite(ttl) or ttl <= 0:  # type: ignore[arg-type, operator]
        raise InvalidArgumentError(f"{name} must be a number of seconds > 0, not {ttl!r}")
    return float(ttl)  # type: ignore[arg-type]


def _number(value: object, name: str) -> int | float:
    if type(value) not in (int, float):
        raise TypeMismatchError(f"{name} must be an int or a float, not {type(value).__name__}")
    if not math.isfinite(value):  # type: ignore[arg-type]
        raise InvalidArgumentError(f"{name} must be finite, not {value!r}")
    return value  # type: ignore[return-value]


class Scope:
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

    @property
    def _engine(self) -> Engine:
        return self._state._engine_or_raise()

    def _write(self, work: _writes.Work) -> Any:
        return self._engine.write(self.name, work)

    # -- reads ---------------------------------------------------------------------
    @_verb("get")
    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` (a fresh copy), or ``default`` if it is absent."""
        engine = self._engine
        text = engine.store.get(self.name, check_key(key), engine.now())
        return default if text is None else decode(text)

    @_verb("get_many")
    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        """The values of those of ``keys`` that exist, in the order asked."""
        if isinstance(keys, str):
            raise InvalidArgumentError("get_many takes an iterable of keys, not one str")
        wanted = [check_key(key) for key in keys]
        engine = self._engine
        found = engine.store.get_many(self.name, wanted, engine.now())
        return {key: decode(text) for key, text in found.items()}

    @_verb("exists")
    def exists(self, key: str) -> bool:
        """Whether ``key`` holds a live value."""
        engine = self._engine
        return engine.store.get(self.name, check_key(key), engine.now()) is not None

    @_verb("list")
    def list(self) -> dict[str, Any]:
        """Every live key and its value, sorted by key."""
        engine = self._engine
        rows = engine.store.items(self.name, compile_pattern("*"), engine.now())
        return {key: decode(text) for key, text in rows}

    @_verb("keys")
    def keys(self, pattern: str = "*") -> builtins.list[str]:
        """The live keys matching the glob ``pattern``, sorted."""
        engine = self._engine
        return engine.store.keys(self.name, compile_pattern(pattern), engine.now())

    @_verb("ttl")
    def ttl(self, key: str) -> float:
        """Seconds left before ``key`` expires; ``-1`` without expiry, ``-2`` if absent."""
        engine = self._engine
        now = engine.now()
        entry = engine.store.get_entry(self.name, check_key(key), now)
        if entry is None:
            return -2.0
        expires_at = entry[1]
        return -1.0 if expires_at is None else expires_at - now

    @_verb("length")
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

    # -- writes --------------------------------------------------------------------
    @_verb("set")
    def set(self, key: str, value: Any, ttl: float | None = None, keep_ttl: bool = False) -> Change:
        """Store ``value`` at ``key``; return the old and new value.

        Without ``ttl`` the key has no expiry, unless ``keep_ttl`` keeps the one it had.

        Raises:
            InvalidArgumentError: ``ttl`` is not a number > 0.
        """
        check_key(key)
        text = self._engine.encode(value)
        return self._write(_writes.set_value(self.name, key, text, _ttl(ttl), bool(keep_ttl)))  # type: ignore[no-any-return]

    @_verb("set_many")
    def set_many(self, mapping: Mapping[str, Any], ttl: float | None = None) -> dict[str, Change]:
        """Store every key-value of ``mapping`` in one write: all or nothing."""
        if not isinstance(mapping, Mapping):
            raise InvalidArgumentError(f"set_many takes a mapping, not {type(mapping).__name__}")
        engine = self._engine
        texts = {check_key(key): engine.encode(value) for key, value in mapping.items()}
        deadline = _ttl(ttl)
        if not texts:
            return {}
        return self._write(_writes.set_many(self.name, texts, deadline))  # type: ignore[no-any-return]

    @_verb("delete")
    def delete(self, key: str) -> Any:
        """Remove ``key``; return its old value, or None if it was absent."""
        return self._write(_writes.delete(self.name, check_key(key)))

    @_verb("clear")
    def clear(self, pattern: str = "*") -> int:
        """Remove every key matching the glob ``pattern``; return how many."""
        return self._write(_writes.clear(self.name, compile_pattern(pattern)))  # type: ignore[no-any-return]

    @_verb("expire")
    def expire(self, key: str, seconds: float | None) -> bool:
        """Give ``key`` a new expiry; return whether it existed.

        ``None`` removes the expiry; ``seconds <= 0`` expires the key now.
        """
        check_key(key)
        if seconds is not None:
            if type(seconds) not in (int, float) or not math.isfinite(seconds):
                raise InvalidArgumentError(
                    f"seconds must be a finite number or None, not {seconds!r}"
                )
            seconds = float(seconds)
        return self._write(_writes.expire(self.name, key, seconds))  # type: ignore[no-any-return]

    @_verb("increment")
    def increment(self, key: str, by: int | float = 1, default: int | float = 0) -> int | float:
        """Add ``by`` to the number at ``key`` (``default`` when absent); return the result.

        Raises:
            TypeMismatchError: the value, ``by`` or ``default`` is not a number.
        """
        check_key(key)
        step, start = _number(by, "by"), _number(default, "default")
        return self._write(_writes.increment(self.name, key, step, start, self._engine.encode))  # type: ignore[no-any-return]

    @_verb("decrement")
    def decrement(self, key: str, by: int | float = 1, default: int | float = 0) -> int | float:
        """Subtract ``by`` from the number at ``key``; return the result."""
        check_key(key)
        step, start = _number(by, "by"), _number(default, "default")
        return self._write(_writes.increment(self.name, key, -step, start, self._engine.encode))  # type: ignore[no-any-return]

    @_verb("append")
    def append(self, key: str, text: str) -> int:
        """Append ``text`` to the string at ``key`` (``""`` when absent); return its length.

        Raises:
            TypeMismatchError: the value or ``text`` is not a string.
        """
        check_key(key)
        if type(text) is not str:
            raise TypeMismatchError(f"append takes a str, not {type(text).__name__}")
        return self._write(_writes.append_text(self.name, key, text, self._engine.encode))  # type: ignore[no-any-return]

    @_verb("compare_and_swap")
    def compare_and_swap(self, key: str, expected: Any, new: Any) -> bool:
        """Set ``key`` to ``new`` only if it holds ``expected``; return whether it did.

        Equality is JSON's (``1 == 1.0``, ``True != 1``). ``expected=MISSING`` means the
        key must not exist; ``new=MISSING`` deletes it. The expiry is kept.
        """
        check_key(key)
        engine = self._engine
        if expected is not MISSING:
            engine.encode(expected)
        new_text: str | Missing = MISSING if new is MISSING else engine.encode(new)
        return self._write(_writes.compare_and_swap(self.name, key, expected, new_text))  # type: ignore[no-any-return]

    @_verb("push")
    def push(self, key: str, *items: Any) -> int:
        """Append ``items`` to the list at ``key`` (``[]`` when absent); return its length.

        Raises:
            TypeMismatchError: the value is not a list.
        """
        check_key(key)
        items_text = self._engine.encode(list(items))
        return self._write(_writes.push(self.name, key, items_text, self._engine.encode))  # type: ignore[no-any-return]

    @_verb("pop")
    def pop(self, key: str, front: bool = False) -> Any:
        """Remove and return the last item of the list at ``key`` (the first with
        ``front=True``); None when the list is empty or absent.

        Raises:
            TypeMismatchError: the value is not a list.
        """
        return self._write(_writes.pop(self.name, check_key(key), bool(front)))
