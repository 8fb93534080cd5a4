"""The verbs every scope handle shares: writes, validated and encoded in the caller's
thread, then run as work in a write transaction (by ``_run``).

``Scope`` runs the work on the actor that owns the scope; ``Transaction`` runs it in
its own pending transaction. Reads differ between the two and live with each.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from time import perf_counter
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from . import _writes
from ._keys import check_key, compile_pattern
from ._ops import op_style
from ._results import Change, UpdateResult
from ._values import MISSING, Missing, encode
from .errors import InvalidArgumentError, TypeMismatchError

if TYPE_CHECKING:
    from ._engine import Engine

__all__ = ["Verbs", "verb"]

P = ParamSpec("P")
R = TypeVar("R")
V = TypeVar("V", bound="Verbs")


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


def check_ttl(ttl: object, name: str = "ttl") -> float | None:
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


class Verbs:
    """The write verbs of SPEC §3 and ``update`` (SPEC §4)."""

    __slots__ = ()

    name: str

    def _usable(self) -> Engine:
        """The engine, once this handle is known to be usable (else raise)."""
        raise NotImplementedError

    @property
    def _engine(self) -> Engine:
        return self._usable()

    def _run(self, work: _writes.Work) -> Any:
        raise NotImplementedError

    # -- writes --------------------------------------------------------------------
    @verb("set")
    def set(self, key: str, value: Any, ttl: float | None = None, keep_ttl: bool = False) -> Change:
        """Store ``value`` at ``key``; return the old and new value.

        Without ``ttl`` the key has no expiry, unless ``keep_ttl`` keeps the one it had.

        Raises:
            InvalidArgumentError: ``ttl`` is not a number > 0, or ``keep_ttl`` not a bool.
        """
        check_key(key)
        if keep_ttl is not False and keep_ttl is not True:
            raise InvalidArgumentError(f"keep_ttl is True or False, not {keep_ttl!r}")
        text = self._engine.encode(value)
        return self._run(_writes.set_value(self.name, key, text, check_ttl(ttl), keep_ttl))  # type: ignore[no-any-return]

    @verb("set_many")
    def set_many(self, mapping: Mapping[str, Any], ttl: float | None = None) -> dict[str, Change]:
        """Store every key-value of ``mapping`` in one write: all or nothing."""
        if not isinstance(mapping, Mapping):
            raise InvalidArgumentError(f"set_many takes a mapping, not {type(mapping).__name__}")
        engine = self._engine
        texts = {check_key(key): engine.encode(value) for key, value in mapping.items()}
        deadline = check_ttl(ttl)
        if not texts:
            return {}
        return self._run(_writes.set_many(self.name, texts, deadline))  # type: ignore[no-any-return]

    @verb("delete")
    def delete(self, key: str) -> Any:
        """Remove ``key``; return its old value, or None if it was absent."""
        return self._run(_writes.delete(self.name, check_key(key)))

    @verb("clear")
    def clear(self, pattern: str = "*") -> int:
        """Remove every key matching the glob ``pattern``; return how many."""
        return self._run(_writes.clear(self.name, compile_pattern(pattern)))  # type: ignore[no-any-return]

    @verb("expire")
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
        return self._run(_writes.expire(self.name, key, seconds))  # type: ignore[no-any-return]

    @verb("increment")
    def increment(self, key: str, by: int | float = 1, default: int | float = 0) -> int | float:
        """Add ``by`` to the number at ``key`` (``default`` when absent); return the result.

        Raises:
            TypeMismatchError: the value, ``by`` or ``default`` is not a number.
        """
        check_key(key)
        step, start = _number(by, "by"), _number(default, "default")
        return self._run(_writes.increment(self.name, key, step, start, self._engine.encode))  # type: ignore[no-any-return]

    @verb("decrement")
    def decrement(self, key: str, by: int | float = 1, default: int | float = 0) -> int | float:
        """Subtract ``by`` from the number at ``key``; return the result."""
        check_key(key)
        step, start = _number(by, "by"), _number(default, "default")
        return self._run(_writes.increment(self.name, key, -step, start, self._engine.encode))  # type: ignore[no-any-return]

    @verb("append")
    def append(self, key: str, text: str) -> int:
        """Append ``text`` to the string at ``key`` (``""`` when absent); return its length.

        Raises:
            TypeMismatchError: the value or ``text`` is not a string.
        """
        check_key(key)
        if type(text) is not str:
            raise TypeMismatchError(f"append takes a str, not {type(text).__name__}")
        return self._run(_writes.append_text(self.name, key, text, self._engine.encode))  # type: ignore[no-any-return]

    @verb("compare_and_swap")
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
        return self._run(_writes.compare_and_swap(self.name, key, expected, new_text))  # type: ignore[no-any-return]

    @verb("push")
    def push(self, key: str, *items: Any) -> int:
        """Append ``items`` to the list at ``key`` (``[]`` when absent); return its length.

        Raises:
            TypeMismatchError: the value is not a list.
        """
        check_key(key)
        items_text = self._engine.encode(list(items))
        return self._run(_writes.push(self.name, key, items_text, self._engine.encode))  # type: ignore[no-any-return]

    @verb("pop")
    def pop(self, key: str, front: bool = False) -> Any:
        """Remove and return the last item of the list at ``key`` (the first with
        ``front=True``); None when the list is empty or absent.

        Raises:
            TypeMismatchError: the value is not a list.
        """
        return self._run(_writes.pop(self.name, check_key(key), bool(front)))

    @verb("update")
    def update(
        self, key: str, ops: list[dict[str, Any]], atomic: bool | None = None
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
        check_key(key)
        if atomic is not None and type(atomic) is not bool:
            raise InvalidArgumentError(f"atomic is None, True or False, not {atomic!r}")
        patch = op_style(ops) == "patch"
        if patch and atomic is False:
            raise InvalidArgumentError(
                "a JSON Patch is all or nothing: atomic=False does not apply"
            )
        engine = self._engine
        limits = engine.options
        ops_text = encode(ops, max_depth=limits.max_depth + 2, max_bytes=limits.max_value_bytes)
        return self._run(  # type: ignore[no-any-return]
            _writes.update(
                self.name,
                key,
                ops_text,
                patch,
                patch or bool(atomic),
                engine.encode,
                limits.max_depth,
                limits.max_value_bytes,
            )
        )
