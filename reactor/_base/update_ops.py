"""Applying ``update`` operations: update ops (``"type"``) and JSON Patch (``"op"``).

Update ops are implemented here directly: they are the hot path. JSON Patch goes
through the jsonpatch library, one operation at a time on a document that is already a
private copy (decoded from the database), with three guards of ours: ``test`` compares
as JSON does (``1`` is not ``true``, ``1`` equals ``1.0``); ``copy`` and ``move`` are
checked for size and depth before they run (a copy is charged its JSON size plus
``CONTAINER_COST`` per object or list), so a patch cannot grow a document past the
limits, in text or in memory, or nest it until recursion fails; and a failed patch
leaves nothing behind, since the caller keeps the original text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import jsonpatch
import jsonpointer

from reactor.errors import InvalidOpError, InvalidValueError

from .values import encoded_size, json_equal

__all__ = ["Outcome", "apply_patch", "apply_update_ops", "op_style"]

UPDATE_OPS: Final = frozenset({"set", "merge", "increment", "decrement", "append", "remove"})
# A copy is charged its JSON size plus this much for each object or list in it (about
# what Python needs for an empty one), so that copies of many small containers cannot
# build in memory far more than the size limit allows.
CONTAINER_COST: Final = 64


def op_style(ops: object) -> str:
    """``"update"`` or ``"patch"``: the style of an ``update`` call's ops.

    Raises:
        InvalidOpError: ``ops`` is not a list of dicts, or mixes the two styles.
    """
    if not isinstance(ops, list):
        raise InvalidOpError(f"ops must be a list of dicts, not {type(ops).__name__}")
    styles = set()
    for index, op in enumerate(ops):
        if not isinstance(op, dict):
            raise InvalidOpError(f"ops[{index}] is {type(op).__name__}, not a dict")
        if "type" in op:
            styles.add("update")
        if "op" in op:
            styles.add("patch")
    if len(styles) > 1:
        raise InvalidOpError(
            'one update uses one style: update ops ("type") or JSON Patch ("op"), not both'
        )
    return styles.pop() if styles else "update"


@dataclass
class Outcome:
    """The document after the ops, whether it exists, the errors and the applied ops."""

    doc: Any
    exists: bool
    errors: list[dict[str, Any]] = field(default_factory=list)
    applied: list[int] = field(default_factory=list)
    implicit: bool = False  # the document exists only as the {} a field op started
    texts: bool = False  # string appends wait in _Text parts, joined when the ops end

    def start(self) -> None:
        """A missing value starts as ``{}`` when an op names a field in it."""
        if not self.exists:
            self.doc, self.exists, self.implicit = {}, True, True

    @property
    def created(self) -> bool:
        """Whether the document exists as something more than an untouched start."""
        return self.exists and not (self.implicit and self.doc == {})


class _OpError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _error(index: int, op: Any, code: str, message: str) -> dict[str, Any]:
    return {"index": index, "op": op, "code": code, "message": message}


# -- update ops -------------------------------------------------------------------------
Segment = str | int


def _segments(op: Mapping[str, Any], required: bool, max_depth: int) -> list[Segment]:
    if "path" not in op or op["path"] is None:
        if required:
            raise _OpError("invalid_op", f"a {op.get('type')!r} op needs a 'path'")
        return []
    path = op["path"]
    if isinstance(path, str):
        if path == "":
            return []
        parts: list[Segment] = list(path.split("."))
        if "" in parts:
            raise _OpError(
                "invalid_op",
                f"path {path!r} has an empty segment (use a list of segments for such keys)",
            )
    elif isinstance(path, list):
        parts = path
        for part in parts:
            if type(part) not in (str, int):
                raise _OpError("invalid_op", f"a path segment must be a str or an int: {part!r}")
    else:
        raise _OpError("invalid_op", f"a path is a dotted str or a list, not {path!r}")
    if len(parts) > max_depth:
        raise _OpError("invalid_op", f"path is deeper than the {max_depth} levels a value may nest")
    return parts


def _index(segment: Segment) -> int | None:
    if isinstance(segment, int):
        return segment if segment >= 0 else None
    if segment.isascii() and segment.isdigit() and (segment == "0" or segment[0] != "0"):
        return int(segment)
    return None


def _name(path: list[Segment], upto: int) -> str:
    return ".".join(str(part) for part in path[:upto]) or "the value"


def _container(doc: Any, path: list[Segment], create: bool) -> Any:
    """The object or list that holds the last segment of ``path``."""
    node = doc
    for depth, segment in enumerate(path[:-1]):
        if isinstance(node, dict):
            key = segment if isinstance(segment, str) else str(segment)
            if key not in node:
                if not create:
                    raise _OpError("path_not_found", f"{_name(path, depth + 1)} does not exist")
                node[key] = {}
            node = node[key]
        elif isinstance(node, list):
            index = _index(segment)
            if index is None or index >= len(node):
                raise _OpError("path_not_found", f"{_name(path, depth + 1)} does not exist")
            node = node[index]
        else:
            raise _OpError(
                "type_mismatch", f"{_name(path, depth)} is {_kind(node)}, not an object or a list"
            )
    return node


def _kind(value: Any) -> str:
    if isinstance(value, _Text):
        return "str"
    return "null" if value is None else type(value).__name__


class _Text:
    """A string that update ops append to, joined once when the ops are done.

    Appending to a Python string copies it: 10,000 appends to a long string would be
    quadratic. The parts wait here instead, and the length is checked at each append,
    so an append that takes the string past the size limit fails at once.
    """

    __slots__ = ("length", "parts")

    def __init__(self, start: str) -> None:
        self.parts = [start]
        self.length = len(start)

    def add(self, text: str, max_bytes: int) -> None:
        self.parts.append(text)
        self.length += len(text)
        if self.length + 2 > max_bytes:  # each character takes at least a byte of JSON
            raise InvalidValueError(
                f"appending makes a string of {self.length:,} characters, over the value "
                f"size limit of {max_bytes:,} bytes"
            )

    def __str__(self) -> str:
        return "".join(self.parts)


def _join_texts(node: Any) -> Any:
    """``node`` with every :class:`_Text` in it joined into a string (in place)."""
    if isinstance(node, _Text):
        return str(node)
    stack = [node]
    while stack:
        container = stack.pop()
        if isinstance(container, dict):
            for key, item in container.items():
                if isinstance(item, _Text):
                    container[key] = str(item)
                elif isinstance(item, dict | list):
                    stack.append(item)
        elif isinstance(container, list):
            for index, item in enumerate(container):
                if isinstance(item, _Text):
                    container[index] = str(item)
                elif isinstance(item, dict | list):
                    stack.append(item)
    return node


class _Slot:
    """The place the last segment of a path names: read it, write it."""

    __slots__ = ("container", "key", "path")

    def __init__(self, doc: Any, path: list[Segment], create: bool) -> None:
        self.path = path
        self.container = _container(doc, path, create)
        last = path[-1]
        if isinstance(self.container, dict):
            self.key: Segment = last if isinstance(last, str) else str(last)
        elif isinstance(self.container, list):
            index = _index(last)
            if index is None or index >= len(self.container):
                raise _OpError("path_not_found", f"{_name(path, len(path))} does not exist")
            self.key = index
        else:
            raise _OpError(
                "type_mismatch",
                f"{_name(path, len(path) - 1)} is {_kind(self.container)}, not an object or a list",
            )

    def exists(self) -> bool:
        return isinstance(self.container, list) or self.key in self.container

    def get(self) -> Any:
        return self.container[self.key] if self.exists() else None

    def put(self, value: Any) -> None:
        self.container[self.key] = value


def _number(op: Mapping[str, Any]) -> int | float:
    by = op.get("by", 1)
    if type(by) not in (int, float):
        raise _OpError("invalid_op", f"'by' must be a number, not {by!r}")
    return by  # type: ignore[no-any-return]


def _combine(
    kind: str,
    current: Any,
    present: bool,
    op: Mapping[str, Any],
    path: list[Segment],
    max_bytes: int,
) -> Any:
    """The new value of the target at ``path`` for a merge, increment/decrement or
    append op (its name is only spelled out for an error)."""
    if kind == "merge":
        value = op.get("value")
        if not isinstance(value, dict):
            raise _OpError("invalid_op", f"merge needs an object 'value', not {_kind(value)}")
        if current is None:
            return dict(value)
        if not isinstance(current, dict):
            where = _name(path, len(path))
            raise _OpError("type_mismatch", f"cannot merge into {where}: it is {_kind(current)}")
        current.update(value)
        return current
    if kind in ("increment", "decrement"):
        by = _number(op)
        if not present:
            current = 0
        if type(current) not in (int, float):
            where = _name(path, len(path))
            raise _OpError("type_mismatch", f"cannot {kind} {where}: it is {_kind(current)}")
        result = current + by if kind == "increment" else current - by
        if isinstance(result, float) and not math.isfinite(result):
            where = _name(path, len(path))
            raise InvalidValueError(f"{kind} of {where} gives {result}, not a JSON number")
        return result
    # append
    if "value" not in op:
        raise _OpError("invalid_op", "append needs a 'value'")
    value = op["value"]
    if current is None:
        return [value]
    if isinstance(current, list):
        current.append(value)
        return current
    if isinstance(current, str | _Text) and isinstance(value, str):
        text = current if isinstance(current, _Text) else _Text(current)
        text.add(value, max_bytes)
        return text
    where = _name(path, len(path))
    raise _OpError(
        "type_mismatch", f"cannot append {_kind(value)} to {where}: it is {_kind(current)}"
    )


def _check_fields(kind: str, op: Mapping[str, Any]) -> None:
    if kind in ("set", "append") and "value" not in op:
        raise _OpError("invalid_op", f"{kind} needs a 'value'")
    if kind == "merge" and not isinstance(op.get("value"), dict):
        raise _OpError("invalid_op", f"merge needs an object 'value', not {_kind(op.get('value'))}")
    if kind in ("increment", "decrement"):
        _number(op)


def _check_nesting(kind: str, op: Mapping[str, Any], path: list[Segment], max_depth: int) -> None:
    """Refuse an op whose value would nest deeper than ``max_depth`` where it lands.

    This is all the validation an update-op result needs beyond the encoder's: the
    stored value was valid, the op values are (checked on the way in), increments stay
    finite (``_combine``); only depth can grow, and only where a value is put.
    """
    if kind not in ("set", "merge", "append") or "value" not in op:
        return
    value = op["value"]
    inside = len(path) + (1 if kind == "append" else 0)
    nesting = _depth(value, max_depth) if type(value) in (dict, list) else 0
    if inside + nesting > max_depth:
        raise InvalidValueError(
            f"the {kind} at {_name(path, len(path))} would nest the value deeper than "
            f"{max_depth} levels"
        )


def _apply_one(outcome: Outcome, op: Mapping[str, Any], max_depth: int, max_bytes: int) -> None:
    kind = op.get("type")
    if kind not in UPDATE_OPS:
        raise _OpError("invalid_op", f"unknown update op type {kind!r}")
    path = _segments(op, kind in ("set", "increment", "decrement", "remove"), max_depth)
    _check_nesting(kind, op, path, max_depth)
    if not path:
        _apply_root(outcome, kind, op, max_bytes)
        return
    outcome.start()
    if kind == "remove":
        try:
            slot = _Slot(outcome.doc, path, create=False)
        except _OpError:
            return  # removing what is not there is not an error
        if isinstance(slot.container, dict):
            slot.container.pop(slot.key, None)
        else:
            del slot.container[slot.key]
        return
    _check_fields(kind, op)  # before any parent object is created for the op
    if kind == "set":
        _Slot(outcome.doc, path, create=True).put(op["value"])
        return
    slot = _Slot(outcome.doc, path, create=True)
    result = _combine(kind, slot.get(), slot.exists(), op, path, max_bytes)
    outcome.texts = outcome.texts or isinstance(result, _Text)
    slot.put(result)


def _apply_root(outcome: Outcome, kind: str, op: Mapping[str, Any], max_bytes: int) -> None:
    if kind == "remove":
        outcome.doc, outcome.exists, outcome.implicit = None, False, False
        return
    _check_fields(kind, op)
    doc = (
        op["value"]
        if kind == "set"
        else _combine(kind, outcome.doc, outcome.exists, op, [], max_bytes)
    )
    outcome.doc, outcome.exists, outcome.implicit = doc, True, False
    outcome.texts = outcome.texts or isinstance(doc, _Text)


def apply_update_ops(
    doc: Any, exists: bool, ops: list[dict[str, Any]], max_depth: int, max_bytes: int
) -> Outcome:
    """Apply update ops in order to ``doc`` (a private copy, changed in place).

    An op that cannot apply is skipped and reported. (For ``atomic=True`` the caller
    keeps the original text when there is any error.)

    Raises:
        InvalidValueError: an append makes a string longer than ``max_bytes``.
    """
    outcome = Outcome(doc, exists)
    for index, op in enumerate(ops):
        try:
            _apply_one(outcome, op, max_depth, max_bytes)
        except _OpError as exc:
            # With atomic, the ops after a failure still run (on a value that will be
            # thrown away), so that every op that cannot apply is reported at once.
            outcome.errors.append(_error(index, op, exc.code, str(exc)))
        else:
            outcome.applied.append(index)
    if outcome.texts:
        outcome.doc = _join_texts(outcome.doc)
    return outcome


# -- JSON Patch -------------------------------------------------------------------------
class _JsonTest(jsonpatch.TestOperation):
    """``test`` with JSON's equality, whatever the installed jsonpatch does."""

    def apply(self, obj: Any) -> Any:
        try:
            subobj, part = self.pointer.to_last(obj)
            found = subobj if part is None else self.pointer.walk(subobj, part)
        except jsonpointer.JsonPointerException as exc:
            raise jsonpatch.JsonPatchTestFailed(str(exc)) from None
        if "value" not in self.operation:
            raise jsonpatch.InvalidJsonPatch("test needs a 'value'")
        if not json_equal(found, self.operation["value"]):
            raise jsonpatch.JsonPatchTestFailed(
                f"{self.location or 'the value'} is {found!r}, not {self.operation['value']!r}"
            )
        return obj


_OPERATIONS: Final[Mapping[str, type[jsonpatch.PatchOperation]]] = {
    **jsonpatch.JsonPatch.operations,
    "test": _JsonTest,
}


def _operation(raw: dict[str, Any]) -> jsonpatch.PatchOperation:
    """The jsonpatch operation for ``raw``, with its pointers checked.

    Raises:
        jsonpatch.InvalidJsonPatch: an unknown op, a missing member, a bad pointer, or a
            move into the value's own child (RFC 6902 4.4 forbids it outright).
    """
    name = raw.get("op")
    if not isinstance(name, str) or name not in _OPERATIONS:
        raise jsonpatch.InvalidJsonPatch(f"unknown JSON Patch op {name!r}")
    operation = _OPERATIONS[name](raw)
    if name in ("move", "copy"):
        source = raw.get("from")
        if not isinstance(source, str):
            raise jsonpatch.InvalidJsonPatch(f"{name} needs a 'from' pointer (a string)")
        try:
            parts = jsonpointer.JsonPointer(source).parts
        except jsonpointer.JsonPointerException as exc:
            raise jsonpatch.InvalidJsonPatch(f"bad 'from' pointer {source!r}: {exc}") from None
        target = operation.pointer.parts
        if name == "move" and len(parts) < len(target) and target[: len(parts)] == parts:
            raise jsonpatch.InvalidJsonPatch("a value cannot be moved into one of its own children")
    return operation


def _depth(value: Any, limit: int) -> int:
    """Levels of nesting of ``value``, counting no further than ``limit + 1``."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list) and depth < limit + 1:
            items = node.values() if isinstance(node, dict) else node
            stack.extend((item, depth + 1) for item in items)
            deepest = max(deepest, depth + 1)
    return deepest


def _guard_growth(doc: Any, op: Mapping[str, Any], budget: list[int], max_depth: int) -> None:
    """Refuse a copy or move that would pass the size or depth limit, before it runs."""
    try:
        source = jsonpointer.resolve_pointer(doc, op.get("from", ""))
        target = jsonpointer.JsonPointer(op.get("path", ""))
        target_depth = len(target.parts)
        if target_depth > 1:  # a target without a parent fails anyway, as path_not_found
            jsonpointer.JsonPointer.from_parts(target.parts[:-1]).resolve(doc)
    except (jsonpointer.JsonPointerException, TypeError):
        return  # jsonpatch reports the bad pointer itself
    if isinstance(source, jsonpointer.EndOfList):
        raise _OpError("path_not_found", f"{op.get('from')!r} names no value (the end of a list)")
    source_depth = len(jsonpointer.JsonPointer(op.get("from", "")).parts)
    moving_up = op["op"] == "move" and target_depth <= source_depth
    # A move to no deeper a place cannot nest the value deeper: no need to walk it.
    if not moving_up and target_depth + _depth(source, max_depth) > max_depth:
        raise InvalidValueError(
            f"{op['op']} to {op.get('path')!r} would nest the value deeper than {max_depth} levels"
        )
    if op["op"] == "copy":
        budget[0] -= encoded_size(source)
        budget[0] -= CONTAINER_COST * _containers(source, budget[0] // CONTAINER_COST + 1)
        if budget[0] < 0:
            raise InvalidValueError("this copy would grow the value past the size limit")


def _containers(value: Any, limit: int) -> int:
    """How many objects and lists ``value`` holds (itself included), counting no
    further than ``limit``."""
    count, stack = 0, [value]
    while stack and count <= limit:
        node = stack.pop()
        if isinstance(node, dict):
            count += 1
            stack.extend(item for item in node.values() if isinstance(item, dict | list))
        elif isinstance(node, list):
            count += 1
            stack.extend(item for item in node if isinstance(item, dict | list))
    return count


def apply_patch(  # noqa: PLR0912 - one branch per RFC 6902 outcome
    doc: Any, exists: bool, ops: list[dict[str, Any]], max_depth: int, max_bytes: int, size: int
) -> Outcome:
    """Apply a JSON Patch to ``doc`` (a private copy); all or nothing, as RFC 6902 says.

    ``size`` is the document's current encoded size, the start of the growth budget.

    Raises:
        InvalidValueError: a ``copy`` or ``move`` would pass the size or depth limit.
    """
    outcome = Outcome(doc, exists)
    budget = [max_bytes - size]
    for index, raw in enumerate(ops):
        try:
            operation = _operation(raw)
        except (jsonpatch.InvalidJsonPatch, jsonpointer.JsonPointerException, TypeError) as exc:
            outcome.errors.append(_error(index, raw, "invalid_op", str(exc) or "invalid op"))
            return outcome
        if raw["op"] in ("copy", "move"):
            try:
                _guard_growth(outcome.doc, raw, budget, max_depth)
            except _OpError as exc:
                outcome.errors.append(_error(index, raw, exc.code, str(exc)))
                return outcome
        if raw.get("path") not in ("", None):
            outcome.start()
        try:
            outcome.doc = operation.apply(outcome.doc)
        except jsonpatch.JsonPatchTestFailed as exc:
            code, message = "test_failed", str(exc)
        except jsonpatch.InvalidJsonPatch as exc:
            if raw["op"] == "replace" and raw.get("path", "").endswith("/-"):
                code = "path_not_found"  # "-" names the element after the last: none
            else:
                code = "invalid_op"
            message = str(exc)
        except (jsonpatch.JsonPatchConflict, jsonpointer.JsonPointerException) as exc:
            code, message = "path_not_found", str(exc)
        except (TypeError, KeyError, IndexError, AttributeError, ValueError) as exc:
            code, message = "type_mismatch", f"{raw['op']} does not apply here: {exc}"
        else:
            if raw.get("path") == "" and raw["op"] in ("add", "replace", "copy", "move"):
                outcome.exists, outcome.implicit = True, False
            outcome.applied.append(index)
            continue
        outcome.errors.append(_error(index, raw, code, message))
        return outcome
    return outcome
