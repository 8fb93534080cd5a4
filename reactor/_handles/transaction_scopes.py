"""Which scopes a transaction holds: the names given to ``state.transaction(...)``,
checked and put in the one order they are taken in, and ``tx[name]``'s check."""

from __future__ import annotations

from collections.abc import Iterable

from reactor._base.keys import check_key, check_writable
from reactor.errors import InvalidArgumentError

__all__ = ["part_of", "scope_names"]


def scope_names(scopes: Iterable[object]) -> tuple[str, ...]:
    """The scopes of a transaction, without repeats, in the order they are taken in.

    Raises:
        InvalidArgumentError: no scope.
        InvalidKeyError: a name that is not a valid scope name, or a scope of events
            (``queue:NAME``, ``run:NAME``), which no transaction writes.
    """
    names = {check_writable(check_key(name, "scope name")) for name in scopes}
    if not names:
        raise InvalidArgumentError("a transaction needs at least one scope name")
    return tuple(sorted(names))


def part_of(names: tuple[str, ...], name: object) -> str:
    """``name``, if it is one of the transaction's scopes (``tx[name]``).

    Raises:
        InvalidKeyError: ``name`` is not a valid scope name, or is a scope of events
            (``queue:NAME``, ``run:NAME``), which no transaction holds.
        InvalidArgumentError: the transaction does not hold that scope.
    """
    checked = check_writable(check_key(name, "scope name"))
    if checked not in names:
        held = ", ".join(repr(held) for held in names)
        raise InvalidArgumentError(
            f"scope {checked!r} is not part of this transaction, which holds {held}: "
            "name every scope it writes in state.transaction(...)"
        )
    return checked
