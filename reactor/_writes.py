"""The write verbs, as work that runs inside a scope's write transaction.

Each function takes arguments the caller has already validated (keys checked, values
encoded) and returns the work for the scope's actor. Work reads the current row through
the transaction, raises a typed error before staging anything when the verb does not
apply, and stages its result; the actor commits it with the rest of its batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._keys import Pattern
from ._ops import apply_patch, apply_update_ops
from ._results import Change, UpdateResult
from ._store import Row, WriteTxn
from ._values import MISSING, Missing, decode, encode_built, encode_trusted, json_equal
from .errors import TypeMismatchError

__all__ = [
    "append_text",
    "clear",
    "compare_and_swap",
    "delete",
    "expire",
    "expire_keys",
    "increment",
    "pop",
    "push",
    "set_many",
    "set_value",
    "update",
]

Work = Callable[[WriteTxn], Any]
Encoder = Callable[[Any], str]


def _touching(work: Work, scope: str, *keys: str) -> Work:
    """Mark ``work`` with the keys it reads, so that a batch can read them all at once."""
    work.keys = [(scope, key) for key in keys]  # type: ignore[attr-defined]
    return work


def _deadline(txn: WriteTxn, old: Row | None, ttl: float | None, keep_ttl: bool) -> float | None:
    if ttl is not None:
        return txn.now + ttl
    if keep_ttl and old is not None:
        return old.expires_at
    return None


def set_value(scope: str, key: str, text: str, ttl: float | None, keep_ttl: bool) -> Work:
    def work(txn: WriteTxn) -> Change:
        old = txn.live_row(scope, key)
        txn.write(scope, key, old, text, _deadline(txn, old, ttl, keep_ttl))
        return Change(decode(old.value) if old else None, decode(text))

    return _touching(work, scope, key)


def set_many(scope: str, texts: Mapping[str, str], ttl: float | None) -> Work:
    def work(txn: WriteTxn) -> dict[str, Change]:
        changes: dict[str, Change] = {}
        for key, text in texts.items():
            old = txn.live_row(scope, key)
            txn.write(scope, key, old, text, _deadline(txn, old, ttl, False))
            changes[key] = Change(decode(old.value) if old else None, decode(text))
        return changes

    return _touching(work, scope, *texts)


def delete(scope: str, key: str) -> Work:
    def work(txn: WriteTxn) -> Any:
        old = txn.live_row(scope, key)
        if old is None:
            return None
        txn.write(scope, key, old, None, None)
        return decode(old.value)

    return _touching(work, scope, key)


def clear(scope: str, pattern: Pattern) -> Work:
    def work(txn: WriteTxn) -> int:
        rows = txn.live_rows(scope, pattern)
        for key, row in rows:
            txn.write(scope, key, row, None, None)
        return len(rows)

    return work


def expire(scope: str, key: str, seconds: float | None) -> Work:
    def work(txn: WriteTxn) -> bool:
        old = txn.live_row(scope, key)
        if old is None:
            return False
        if seconds is not None and seconds <= 0:
            txn.write(scope, key, old, None, None, change_type="expired")
        else:
            deadline = None if seconds is None else txn.now + seconds
            txn.write(scope, key, old, old.value, deadline)
        return True

    return _touching(work, scope, key)


def expire_keys(scope: str, keys: list[str]) -> Work:
    """The sweeper's work: expire each key whose deadline has passed."""

    def work(txn: WriteTxn) -> None:
        for key in keys:
            txn.live_row(scope, key)

    return _touching(work, scope, *keys)


def _number(value: Any, what: str) -> int | float:
    if type(value) is bool or not isinstance(value, int | float):
        raise TypeMismatchError(f"{what} is {type(value).__name__}, not a number")
    return value


def increment(scope: str, key: str, by: int | float, default: int | float, encode: Encoder) -> Work:
    def work(txn: WriteTxn) -> int | float:
        old = txn.live_row(scope, key)
        current = default if old is None else _number(decode(old.value), f"the value of {key!r}")
        result = current + by
        txn.write(scope, key, old, encode(result), old.expires_at if old else None)
        return result

    return _touching(work, scope, key)


def append_text(scope: str, key: str, text: str, encode: Encoder) -> Work:
    def work(txn: WriteTxn) -> int:
        old = txn.live_row(scope, key)
        current = "" if old is None else decode(old.value)
        if type(current) is not str:
            raise TypeMismatchError(
                f"append needs a string; {key!r} holds {type(current).__name__}"
            )
        result = current + text
        txn.write(scope, key, old, encode(result), old.expires_at if old else None)
        return len(result)

    return _touching(work, scope, key)


def _list(row: Row | None, key: str, verb: str) -> list[Any]:
    if row is None:
        return []
    current = decode(row.value)
    if type(current) is not list:
        raise TypeMismatchError(f"{verb} needs a list; {key!r} holds {type(current).__name__}")
    return current


def push(scope: str, key: str, items_text: str, encode: Encoder) -> Work:
    def work(txn: WriteTxn) -> int:
        old = txn.live_row(scope, key)
        current = _list(old, key, "push")
        items = decode(items_text)
        if not items:
            return len(current)
        current.extend(items)
        txn.write(scope, key, old, encode(current), old.expires_at if old else None)
        return len(current)

    return _touching(work, scope, key)


def pop(scope: str, key: str, front: bool) -> Work:
    def work(txn: WriteTxn) -> Any:
        old = txn.live_row(scope, key)
        current = _list(old, key, "pop")
        if old is None or not current:
            return None
        item = current.pop(0 if front else -1)
        # What remains of a stored list is valid as it is: no need to check it again.
        text = encode_trusted(current, parts_size=len(old.value))
        txn.write(scope, key, old, text, old.expires_at)
        return item

    return _touching(work, scope, key)


def compare_and_swap(scope: str, key: str, expected: Any, new_text: str | Missing) -> Work:
    def work(txn: WriteTxn) -> bool:
        old = txn.live_row(scope, key)
        if expected is MISSING:
            matches = old is None
        else:
            matches = old is not None and json_equal(decode(old.value), expected)
        if not matches:
            return False
        if new_text is MISSING:
            txn.write(scope, key, old, None, None)
        else:
            txn.write(scope, key, old, new_text, old.expires_at if old else None)
        return True

    return _touching(work, scope, key)


def update(
    scope: str,
    key: str,
    ops_text: str,
    patch: bool,
    atomic: bool,
    encode: Encoder,
    max_depth: int,
    max_bytes: int,
) -> Work:
    """Apply update ops or a JSON Patch (``patch``) to the value at ``key``."""

    def work(txn: WriteTxn) -> UpdateResult:
        old = txn.live_row(scope, key)
        ops = decode(ops_text)
        doc = None if old is None else decode(old.value)
        if patch:
            size = 0 if old is None else len(old.value)
            outcome = apply_patch(doc, old is not None, ops, max_depth, max_bytes, size)
        else:
            outcome = apply_update_ops(doc, old is not None, ops, max_depth, max_bytes)
        old_value = None if old is None else decode(old.value)
        if not outcome.applied or (outcome.errors and atomic):
            return UpdateResult(
                old_value, None if old is None else decode(old.value), outcome.errors
            )
        if len(outcome.applied) == len(ops):
            applied = ops_text
        else:  # the ops as given: those applied may have been changed since, in the value
            given = decode(ops_text)
            applied = encode_trusted(
                [given[index] for index in outcome.applied], parts_size=len(ops_text)
            )
        if not outcome.created:
            txn.write(scope, key, old, None, None, ops=applied)
            return UpdateResult(old_value, None, outcome.errors)
        # Update ops check what they add (depth, finiteness) as they go; a patch is
        # checked whole.
        if patch:
            text = encode(outcome.doc)
        else:  # no string can be longer than the stored value and the ops together
            parts = len(ops_text) + (0 if old is None else len(old.value))
            text = encode_built(outcome.doc, max_bytes=max_bytes, parts_size=parts)
        txn.write(scope, key, old, text, None if old is None else old.expires_at, ops=applied)
        # The document is this request's own (decoded from the row and the ops): it can
        # go back to the caller as it is, without decoding the text again.
        return UpdateResult(old_value, outcome.doc, outcome.errors)

    return _touching(work, scope, key)
