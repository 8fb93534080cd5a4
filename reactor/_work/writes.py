"""The write verbs, each defined once: its checks, and its work in a write transaction.

Each function checks its arguments in the caller's thread (keys, values encoded and
measured against the engine's limits, numbers, flags), raising a typed error before
anything is queued, and returns the ``Work`` that the scope's actor (or a transaction
body) runs. Work reads the current row through the transaction, raises a typed error
before staging anything when the verb does not apply, and stages its result.

The handles only run what these return: ``ScopeVerbs`` (``Scope``, ``Transaction``) waits
for the result, ``AsyncScope`` awaits it; both get the result type from the ``Work``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from reactor._base.keys import Pattern, check_key, compile_pattern
from reactor._base.results import Change, UpdateResult
from reactor._base.update_ops import apply_patch, apply_update_ops, op_style
from reactor._base.values import (
    MISSING,
    Missing,
    decode,
    encode,
    encode_built,
    encode_number,
    encode_trusted,
    json_equal,
)
from reactor._storage.records import Row
from reactor._storage.txn import Work, WriteTxn
from reactor.errors import ConflictError, InvalidArgumentError, TypeMismatchError

if TYPE_CHECKING:
    from reactor._engine.options import Options

__all__ = [
    "Work",
    "append_text",
    "check_if_revision",
    "check_revision",
    "check_ttl",
    "clear",
    "compare_and_swap",
    "delete",
    "encode_ops",
    "encode_value",
    "encoder",
    "expire",
    "expire_keys",
    "finite",
    "increment",
    "pop",
    "push",
    "set_many",
    "set_value",
    "update",
]

T = TypeVar("T")


def _touching(run: Callable[[WriteTxn], T], scope: str, *keys: str) -> Work[T]:
    """The ``Work`` that runs ``run``, which reads ``keys`` of ``scope``."""
    return Work(run, tuple((scope, key) for key in keys))


def encoder(options: Options) -> Callable[[Any], str]:
    """A value's JSON text (through the handle's codec, if any), checked against the
    engine's limits."""
    codec = options.codec

    def encoded(value: Any) -> str:
        if codec is not None and value is not MISSING:
            value = codec.encode(value)
        return encode(value, max_depth=options.max_depth, max_bytes=options.max_value_bytes)

    return encoded


def encode_value(options: Options, value: Any) -> str:
    """``encoder(options)(value)``, for a single value."""
    if options.codec is not None:
        value = options.codec.encode(value)
    return encode(value, max_depth=options.max_depth, max_bytes=options.max_value_bytes)


def encode_ops(options: Options, ops: object) -> str:
    """Update ops' (or a JSON Patch's) JSON text: values in them two levels deeper."""
    if options.codec is not None and isinstance(ops, list):  # the values in the ops
        ops = options.codec.encode(ops)
    return encode(ops, max_depth=options.max_depth + 2, max_bytes=options.max_value_bytes)


def check_ttl(ttl: object, name: str = "ttl") -> float | None:
    """``ttl`` as seconds, or None.

    Raises:
        InvalidArgumentError: not None nor a finite number > 0.
    """
    if ttl is None:
        return None
    seconds = finite(ttl)
    if seconds is None or seconds <= 0:
        raise InvalidArgumentError(f"{name} must be a number of seconds > 0, not {ttl!r}")
    return seconds


def check_revision(revision: object, name: str) -> int:
    """``revision`` as a revision.

    Raises:
        InvalidArgumentError: not an int from 0 to 2**63 - 1.
    """
    if type(revision) is not int or not 0 <= revision < 2**63:
        raise InvalidArgumentError(
            f"{name} must be a revision (an int from 0 to 2**63 - 1), not {revision!r}"
        )
    return revision


def check_if_revision(if_revision: object) -> int | None:
    """``if_revision`` as a revision (0: the key must not exist), or None.

    Raises:
        InvalidArgumentError: not None nor an int >= 0.
    """
    return None if if_revision is None else check_revision(if_revision, "if_revision")


def _require(scope: str, key: str, old: Row | None, expected: int | None) -> None:
    """Raise unless the key is at revision ``expected`` (0: absent; None: no condition).

    Raises:
        ConflictError: it is not; nothing is written.
    """
    if expected is None:
        return
    actual = 0 if old is None else old.revision
    if actual != expected:
        now = "absent" if old is None else f"at revision {actual}"
        if actual < 0:
            now = "changed by this transaction"
        raise ConflictError(
            f"{key!r} of scope {scope!r} is {now}, not at revision {expected}; nothing was written"
        )


def _require_unchanged(
    scope: str, rows: dict[str, Row | None], changed: bool, expected: int | None
) -> None:
    """Raise unless none of the keys of ``rows`` (their live rows) changed after revision
    ``expected`` (``changed``: the change log says one did); with 0, unless none exists.

    Raises:
        ConflictError: one did; nothing is written.
    """
    if expected is None:
        return
    if expected == 0:
        moved = [key for key, row in rows.items() if row is not None]
    else:
        moved = [
            key for key, row in rows.items() if row is not None and not 0 < row.revision <= expected
        ]
    if moved or (expected and changed):
        what = "exists" if expected == 0 else f"changed after revision {expected}"
        which = f"{moved[0]!r}" if moved else "one of the keys"
        raise ConflictError(f"{which} of scope {scope!r} {what}; nothing was written")


def finite(value: object) -> float | None:
    """``value`` as a float if it is an int or float that is finite as a float."""
    if type(value) is not int and type(value) is not float:
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        return None
    return number if math.isfinite(number) else None


def _argument(value: object, name: str) -> int | float:
    """A number argument (``by``, ``default``).

    Raises:
        TypeMismatchError: not an int or a float (a bool is not a number).
        InvalidArgumentError: NaN or infinite.
    """
    if type(value) is not int and type(value) is not float:
        raise TypeMismatchError(f"{name} must be an int or a float, not {type(value).__name__}")
    if type(value) is float and not math.isfinite(value):
        raise InvalidArgumentError(f"{name} must be finite, not {value!r}")
    return value


def _deadline(txn: WriteTxn, old: Row | None, ttl: float | None, keep_ttl: bool) -> float | None:
    if ttl is not None:
        return txn.now + ttl
    if keep_ttl and old is not None:
        return old.expires_at
    return None


def set_value(
    options: Options,
    scope: str,
    key: str,
    value: Any,
    ttl: object,
    keep_ttl: object,
    if_revision: object = None,
) -> Work[Change]:
    check_key(key)
    # The checks of None inline: the usual set has no condition and no ttl.
    expected = None if if_revision is None else check_revision(if_revision, "if_revision")
    if keep_ttl is not False and keep_ttl is not True:
        raise InvalidArgumentError(f"keep_ttl is True or False, not {keep_ttl!r}")
    if options.codec is not None:
        value = options.codec.encode(value)
    text = encode(value, max_depth=options.max_depth, max_bytes=options.max_value_bytes)
    seconds = None if ttl is None else check_ttl(ttl)

    def work(txn: WriteTxn) -> Change:
        old = txn.live_row(scope, key)
        if expected is not None:
            _require(scope, key, old, expected)
        deadline: float | None
        if seconds is not None:
            deadline = txn.now + seconds
        else:
            deadline = old.expires_at if keep_ttl and old is not None else None
        txn.write(scope, key, old, text, deadline)
        return Change(decode(old.value) if old else None, decode(text))

    return Work(work, ((scope, key),))


def set_many(
    options: Options,
    scope: str,
    mapping: Mapping[str, Any],
    ttl: object,
    if_revision: object = None,
) -> Work[dict[str, Change]] | None:
    """None when ``mapping`` is empty: nothing to write."""
    expected = check_if_revision(if_revision)
    if not isinstance(mapping, Mapping):
        raise InvalidArgumentError(f"set_many takes a mapping, not {type(mapping).__name__}")
    encoded = encoder(options)
    texts = {check_key(key): encoded(value) for key, value in mapping.items()}
    seconds = check_ttl(ttl)
    if not texts:
        return None

    def work(txn: WriteTxn) -> dict[str, Change]:
        rows = {key: txn.live_row(scope, key) for key in texts}
        if expected is not None:
            changed = bool(expected) and txn.statements.keys_changed_since(
                scope, list(texts), expected
            )
            _require_unchanged(scope, rows, changed, expected)
        changes: dict[str, Change] = {}
        for key, text in texts.items():
            old = rows[key]
            txn.write(scope, key, old, text, _deadline(txn, old, seconds, False))
            changes[key] = Change(decode(old.value) if old else None, decode(text))
        return changes

    return _touching(work, scope, *texts)


def delete(scope: str, key: str, if_revision: object = None) -> Work[Any]:
    check_key(key)
    expected = check_if_revision(if_revision)

    def work(txn: WriteTxn) -> Any:
        old = txn.live_row(scope, key)
        _require(scope, key, old, expected)
        if old is None:
            return None
        txn.write(scope, key, old, None, None)
        return decode(old.value)

    return Work(work, ((scope, key),))


def clear(scope: str, pattern: str, if_revision: object = None) -> Work[int]:
    compiled: Pattern = compile_pattern(pattern)
    expected = check_if_revision(if_revision)

    def work(txn: WriteTxn) -> int:
        rows = txn.live_rows(scope, compiled)
        if expected is not None:
            changed = bool(expected) and bool(
                txn.statements.keys_matching_changed_since(scope, compiled, expected)
            )
            _require_unchanged(scope, dict(rows), changed, expected)
        for key, row in rows:
            txn.write(scope, key, row, None, None)
        return len(rows)

    return Work(work)


def expire(scope: str, key: str, seconds: object, if_revision: object = None) -> Work[bool]:
    check_key(key)
    expected = check_if_revision(if_revision)
    after = None if seconds is None else finite(seconds)
    if seconds is not None and after is None:
        raise InvalidArgumentError(f"seconds must be a finite number or None, not {seconds!r}")

    def work(txn: WriteTxn) -> bool:
        old = txn.live_row(scope, key)
        _require(scope, key, old, expected)
        if old is None:
            return False
        if after is not None and after <= 0:
            txn.write(scope, key, old, None, None, change_type="expired")
        else:
            deadline = None if after is None else txn.now + after
            txn.write(scope, key, old, old.value, deadline)
        return True

    return Work(work, ((scope, key),))


def expire_keys(scope: str, keys: list[str]) -> Work[int]:
    """The sweeper's work: expire each key whose deadline has passed; how many did
    (not one that a write renewed, or that expired, meanwhile)."""

    def work(txn: WriteTxn) -> int:
        changes = txn.savepoint()[1]  # the changes recorded so far: one per key expired
        for key in keys:
            txn.live_row(scope, key)
        return txn.savepoint()[1] - changes

    return _touching(work, scope, *keys)


def _number(value: Any, key: str) -> int | float:
    """``value``, the stored value of ``key``, if it is a number.

    Raises:
        TypeMismatchError: it is not (a bool is not a number).
    """
    kind = type(value)
    if kind is int or kind is float:
        return value  # type: ignore[no-any-return]
    if kind is bool or not isinstance(value, int | float):
        raise TypeMismatchError(f"the value of {key!r} is {kind.__name__}, not a number")
    return value


def increment(
    options: Options,
    scope: str,
    key: str,
    by: object,
    default: object,
    if_revision: object = None,
    *,
    down: bool = False,
) -> Work[int | float]:
    """``increment`` (or, ``down``, ``decrement``) by ``by`` from ``default``."""
    check_key(key)
    expected = check_if_revision(if_revision)
    step, start = _argument(by, "by"), _argument(default, "default")
    if down:
        step = -step
    max_bytes = options.max_value_bytes

    def work(txn: WriteTxn) -> int | float:
        old = txn.live_row(scope, key)
        if expected is not None:
            _require(scope, key, old, expected)
        current = start if old is None else _number(decode(old.value), key)
        result = current + step
        text = encode_number(result, max_bytes)
        txn.write(scope, key, old, text, old.expires_at if old else None)
        return result

    return Work(work, ((scope, key),))


def append_text(
    options: Options, scope: str, key: str, text: object, if_revision: object = None
) -> Work[int]:
    check_key(key)
    expected = check_if_revision(if_revision)
    if type(text) is not str:
        raise TypeMismatchError(f"append takes a str, not {type(text).__name__}")
    suffix: str = text
    max_depth, max_bytes = options.max_depth, options.max_value_bytes

    def work(txn: WriteTxn) -> int:
        old = txn.live_row(scope, key)
        _require(scope, key, old, expected)
        current = "" if old is None else decode(old.value)
        if type(current) is not str:
            raise TypeMismatchError(
                f"append needs a string; {key!r} holds {type(current).__name__}"
            )
        result = current + suffix
        text = encode(result, max_depth=max_depth, max_bytes=max_bytes)
        txn.write(scope, key, old, text, old.expires_at if old else None)
        return len(result)

    return Work(work, ((scope, key),))


def _list(row: Row | None, key: str, verb: str) -> list[Any]:
    if row is None:
        return []
    current = decode(row.value)
    if type(current) is not list:
        raise TypeMismatchError(f"{verb} needs a list; {key!r} holds {type(current).__name__}")
    return current


def push(
    options: Options, scope: str, key: str, items: tuple[Any, ...], if_revision: object = None
) -> Work[int]:
    check_key(key)
    expected = check_if_revision(if_revision)
    items_text = encode_value(options, list(items))
    max_depth, max_bytes = options.max_depth, options.max_value_bytes

    def work(txn: WriteTxn) -> int:
        old = txn.live_row(scope, key)
        _require(scope, key, old, expected)
        current = _list(old, key, "push")
        added = decode(items_text)
        if not added:
            return len(current)
        current.extend(added)
        text = encode(current, max_depth=max_depth, max_bytes=max_bytes)
        txn.write(scope, key, old, text, old.expires_at if old else None)
        return len(current)

    return Work(work, ((scope, key),))


def pop(scope: str, key: str, front: object, if_revision: object = None) -> Work[Any]:
    check_key(key)
    expected = check_if_revision(if_revision)
    first = bool(front)

    def work(txn: WriteTxn) -> Any:
        old = txn.live_row(scope, key)
        _require(scope, key, old, expected)
        current = _list(old, key, "pop")
        if old is None or not current:
            return None
        item = current.pop(0 if first else -1)
        # What remains of a stored list is valid as it is: no need to check it again.
        text = encode_trusted(current, parts_size=len(old.value))
        txn.write(scope, key, old, text, old.expires_at)
        return item

    return Work(work, ((scope, key),))


def compare_and_swap(
    options: Options, scope: str, key: str, expected: Any, new: Any, if_revision: object = None
) -> Work[bool]:
    check_key(key)
    revision = check_if_revision(if_revision)
    if expected is not MISSING:
        if options.codec is not None:  # compared as it would be stored
            expected = options.codec.encode(expected)
        # A value that could never be stored is refused, not compared.
        encode(expected, max_depth=options.max_depth, max_bytes=options.max_value_bytes)
    new_text: str | Missing = MISSING if new is MISSING else encode_value(options, new)

    def work(txn: WriteTxn) -> bool:
        old = txn.live_row(scope, key)
        _require(scope, key, old, revision)
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

    return Work(work, ((scope, key),))


def _applied_ops(ops_text: str, op_list: list[Any], applied: list[int]) -> str:
    """The JSON text of the ops that applied (by index), as the caller gave them."""
    if len(applied) == len(op_list):
        return ops_text
    # Decoded again: those that applied may since have been changed, in the value.
    given = decode(ops_text)
    return encode_trusted([given[index] for index in applied], parts_size=len(ops_text))


def update(
    options: Options, scope: str, key: str, ops: object, atomic: object, if_revision: object = None
) -> Work[UpdateResult]:
    """Apply update ops or a JSON Patch to the value at ``key`` (SPEC §4).

    Raises:
        InvalidOpError: ``ops`` is not a list of dicts, or mixes the two styles.
        InvalidValueError: a value in the ops is not storable.
        InvalidArgumentError: ``atomic`` is not None or a bool, or is False with a
            JSON Patch.
    """
    check_key(key)
    expected = check_if_revision(if_revision)
    if atomic is not None and type(atomic) is not bool:
        raise InvalidArgumentError(f"atomic is None, True or False, not {atomic!r}")
    patch = op_style(ops) == "patch"
    if patch and atomic is False:
        raise InvalidArgumentError("a JSON Patch is all or nothing: atomic=False does not apply")
    all_or_nothing = patch or bool(atomic)
    max_depth, max_bytes = options.max_depth, options.max_value_bytes
    ops_text = encode_ops(options, ops)

    def work(txn: WriteTxn) -> UpdateResult:
        old = txn.live_row(scope, key)
        _require(scope, key, old, expected)

        # Each use gets its own copy of the old value (the ops change theirs in place;
        # the result's old and new values are the caller's): decoding copies cheapest.
        old_text = None if old is None else old.value
        op_list = decode(ops_text)
        old_size = 0 if old_text is None else len(old_text)
        doc = None if old_text is None else decode(old_text)
        if patch:
            outcome = apply_patch(doc, old is not None, op_list, max_depth, max_bytes, old_size)
        else:
            outcome = apply_update_ops(doc, old is not None, op_list, max_depth, max_bytes)
        old_value = None if old_text is None else decode(old_text)
        if not outcome.applied or (outcome.errors and all_or_nothing):
            unchanged = None if old_text is None else decode(old_text)
            return UpdateResult(old_value, unchanged, outcome.errors)
        applied = _applied_ops(ops_text, op_list, outcome.applied)
        if not outcome.created:
            txn.write(scope, key, old, None, None, ops=applied)
            return UpdateResult(old_value, None, outcome.errors)
        # Update ops check what they add (depth, finiteness) as they go; a patch is
        # checked whole. No string of the result can be longer than the stored value
        # and the ops together.
        if patch:
            text = encode(outcome.doc, max_depth=max_depth, max_bytes=max_bytes)
        else:
            text = encode_built(
                outcome.doc, max_bytes=max_bytes, parts_size=len(ops_text) + old_size
            )
        txn.write(scope, key, old, text, None if old is None else old.expires_at, ops=applied)
        # The document is this request's own (decoded from the row and the ops): it can
        # go back to the caller as it is, without decoding the text again.
        return UpdateResult(old_value, outcome.doc, outcome.errors)

    return Work(work, ((scope, key),))
