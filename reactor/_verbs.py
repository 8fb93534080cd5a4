"""The verbs every synchronous scope handle shares (``Scope``, ``Transaction``).

Each write verb is defined once, in ``_writes``: its checks (run here, in the caller's
thread) and its work. A handle only says how work runs (``_run``): ``Scope`` on the
actor that owns the scope, ``Transaction`` in its own pending transaction;
``reactor.aio.AsyncScope`` awaits the same work.

Each read verb is defined once, here: a handle only says where it reads its rows
(``_text``, ``_entry``, ``_texts``, ``_items``, ``_keys``): ``Scope`` the last commit,
straight on the database; ``Transaction`` its pending transaction, as its body has
changed it. ``AsyncScope`` runs ``Scope``'s.
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Callable, Iterable, Mapping
from time import perf_counter
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from . import _writes
from ._keys import Pattern, check_key, compile_pattern
from ._results import Change, UpdateResult
from ._values import decode
from ._writes import Work, check_ttl
from .errors import InvalidArgumentError, TypeMismatchError

if TYPE_CHECKING:
    from ._engine import Engine

__all__ = ["ScopeVerbs", "check_ttl", "verb"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
V = TypeVar("V", bound="ScopeVerbs")


def verb(name: str) -> Callable[[Callable[Concatenate[V, P], R]], Callable[Concatenate[V, P], R]]:
    """Check the handle may be used, and time the call for ``stats()``."""

    def decorate(method: Callable[Concatenate[V, P], R]) -> Callable[Concatenate[V, P], R]:
        def timed(self: V, /, *args: P.args, **kwargs: P.kwargs) -> R:
            engine = self._usable()
            start = perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                engine.stats.record(name, perf_counter() - start)

        functools.update_wrapper(timed, method)
        return timed

    return decorate


# Public (reactor.ScopeVerbs): mypy names the class that defines a method in its
# messages ('"set" of "ScopeVerbs"'), so users meet this name and can look it up.
class ScopeVerbs:
    """The verbs ``Scope`` and ``Transaction`` share (SPEC §3, and ``update``, SPEC
    §4), and their type: annotate with it code that reads or writes through either.
    Not created directly; the verbs are documented with ``Scope``."""

    __slots__ = ()

    name: str
    """The scope's name."""

    def _usable(self) -> Engine:
        """The engine, once this handle is known to be usable (else raise)."""
        raise NotImplementedError

    @property
    def _engine(self) -> Engine:
        return self._usable()

    def _run(self, work: Work[T]) -> T:
        raise NotImplementedError

    # -- where reads read: each handle's own ----------------------------------------
    def _text(self, key: str) -> str | None:
        """The JSON text of live ``key``, or None."""
        raise NotImplementedError

    def _entry(self, key: str, now: float) -> tuple[str, float | None] | None:
        """The JSON text and deadline of live ``key``, or None."""
        raise NotImplementedError

    def _texts(self, keys: builtins.list[str]) -> dict[str, str]:
        """The JSON texts of those of ``keys`` that are live, in the order asked."""
        raise NotImplementedError

    def _items(self, pattern: Pattern) -> builtins.list[tuple[str, str]]:
        """The live keys matching ``pattern`` and their JSON texts, sorted by key."""
        raise NotImplementedError

    def _keys(self, pattern: Pattern) -> builtins.list[str]:
        """The live keys matching ``pattern``, sorted."""
        return [key for key, _ in self._items(pattern)]

    def _now(self) -> float:
        raise NotImplementedError

    # -- reads ---------------------------------------------------------------------
    @verb("get")
    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` (a fresh copy), or ``default`` if it is absent."""
        text = self._text(check_key(key))
        return default if text is None else decode(text)

    @verb("get_many")
    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        """The values of those of ``keys`` that exist, in the order asked."""
        if isinstance(keys, str) or not isinstance(keys, Iterable):
            raise InvalidArgumentError(
                f"get_many takes an iterable of keys, not {type(keys).__name__}"
            )
        found = self._texts([check_key(key) for key in keys])
        return {key: decode(text) for key, text in found.items()}

    @verb("exists")
    def exists(self, key: str) -> bool:
        """Whether ``key`` holds a live value."""
        return self._text(check_key(key)) is not None

    @verb("list")
    def list(self) -> dict[str, Any]:
        """Every live key and its value, sorted by key."""
        return {key: decode(text) for key, text in self._items(compile_pattern("*"))}

    @verb("keys")
    def keys(self, pattern: str = "*") -> builtins.list[str]:
        """The live keys matching the glob ``pattern``, sorted."""
        return self._keys(compile_pattern(pattern))

    @verb("ttl")
    def ttl(self, key: str) -> float:
        """Seconds left before ``key`` expires; ``-1`` without expiry, ``-2`` if absent."""
        checked = check_key(key)
        now = self._now()
        entry = self._entry(checked, now)
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
        text = self._text(check_key(key))
        if text is None:
            return 0
        value = decode(text)
        if type(value) is not builtins.list:
            raise TypeMismatchError(f"length needs a list; {key!r} holds {type(value).__name__}")
        return len(value)

    # -- writes --------------------------------------------------------------------
    @verb("set")
    def set(self, key: str, value: Any, ttl: float | None = None, keep_ttl: bool = False) -> Change:
        """Store ``value`` at ``key``; return the old and new value.

        Without ``ttl`` the key has no expiry, unless ``keep_ttl`` keeps the one it had.

        Raises:
            InvalidArgumentError: ``ttl`` is not a number > 0, or ``keep_ttl`` not a bool.
        """
        options = self._engine.options
        return self._run(_writes.set_value(options, self.name, key, value, ttl, keep_ttl))

    @verb("set_many")
    def set_many(self, mapping: Mapping[str, Any], ttl: float | None = None) -> dict[str, Change]:
        """Store every key-value of ``mapping`` in one write: all or nothing."""
        work = _writes.set_many(self._engine.options, self.name, mapping, ttl)
        return {} if work is None else self._run(work)

    @verb("delete")
    def delete(self, key: str) -> Any:
        """Remove ``key``; return its old value, or None if it was absent."""
        return self._run(_writes.delete(self.name, key))

    @verb("clear")
    def clear(self, pattern: str = "*") -> int:
        """Remove every key matching the glob ``pattern``; return how many."""
        return self._run(_writes.clear(self.name, pattern))

    @verb("expire")
    def expire(self, key: str, seconds: float | None) -> bool:
        """Give ``key`` a new expiry; return whether it existed.

        ``None`` removes the expiry; ``seconds <= 0`` expires the key now.
        """
        return self._run(_writes.expire(self.name, key, seconds))

    @verb("increment")
    def increment(self, key: str, by: int | float = 1, default: int | float = 0) -> int | float:
        """Add ``by`` to the number at ``key`` (``default`` when absent); return the result.

        Raises:
            TypeMismatchError: the value, ``by`` or ``default`` is not a number.
        """
        return self._run(_writes.increment(self._engine.options, self.name, key, by, default))

    @verb("decrement")
    def decrement(self, key: str, by: int | float = 1, default: int | float = 0) -> int | float:
        """Subtract ``by`` from the number at ``key``; return the result."""
        options = self._engine.options
        return self._run(_writes.increment(options, self.name, key, by, default, down=True))

    @verb("append")
    def append(self, key: str, text: str) -> int:
        """Append ``text`` to the string at ``key`` (``""`` when absent); return its length.

        Raises:
            TypeMismatchError: the value or ``text`` is not a string.
        """
        return self._run(_writes.append_text(self._engine.options, self.name, key, text))

    @verb("compare_and_swap")
    def compare_and_swap(self, key: str, expected: Any, new: Any) -> bool:
        """Set ``key`` to ``new`` only if it holds ``expected``; return whether it did.

        Equality is JSON's (``1 == 1.0``, ``True != 1``). ``expected=MISSING`` means the
        key must not exist; ``new=MISSING`` deletes it. The expiry is kept.
        """
        options = self._engine.options
        return self._run(_writes.compare_and_swap(options, self.name, key, expected, new))

    @verb("push")
    def push(self, key: str, *items: Any) -> int:
        """Append ``items`` to the list at ``key`` (``[]`` when absent); return its length.

        Raises:
            TypeMismatchError: the value is not a list.
        """
        return self._run(_writes.push(self._engine.options, self.name, key, items))

    @verb("pop")
    def pop(self, key: str, front: bool = False) -> Any:
        """Remove and return the last item of the list at ``key`` (the first with
        ``front=True``); None when the list is empty or absent.

        Raises:
            TypeMismatchError: the value is not a list.
        """
        return self._run(_writes.pop(self.name, key, front))

    @verb("update")
    def update(
        self, key: str, ops: builtins.list[dict[str, Any]], atomic: bool | None = None
    ) -> UpdateResult:
        """Apply ``ops`` to the value at ``key`` in one write (SPEC §4).

        ``ops`` are update ops (``{"type": ...}``, see ``reactor.ops``), applied in order,
        an op that cannot apply being skipped and reported (all or nothing with
        ``atomic=True``); or a JSON Patch (``{"op": ...}``, RFC 6902), all or nothing.

        Raises:
            InvalidOpError: ``ops`` is not a list of dicts, or mixes the two styles.
            InvalidValueError: a value in the ops, or the resulting value, is not storable.
            InvalidArgumentError: ``atomic`` is not None or a bool, or is False with a
                JSON Patch.
        """
        return self._run(_writes.update(self._engine.options, self.name, key, ops, atomic))
