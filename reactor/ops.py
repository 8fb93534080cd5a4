"""Builders for update ops: each returns the dict you could also write by hand.

```python
from reactor import ops

scope.update("o-1", [
    ops.set("status", "paid"),
    ops.increment("attempts"),
    ops.append({"at": "12:00", "event": "paid"}, path="history"),
])
```

A path is a dotted string (``"customer.address.city"``) or a list of segments
(``["a.b", 0]``) for names that contain dots; ints index lists; ``""`` is the whole
value.
"""

from __future__ import annotations

from typing import Any

__all__ = ["append", "decrement", "increment", "merge", "remove", "set"]

Path = str | list[str | int]
Op = dict[str, Any]


def _with_path(op: Op, path: Path | None) -> Op:
    if path is not None:
        op["path"] = path
    return op


def set(path: Path, value: Any) -> Op:  # noqa: A001 - the op's name
    """Set the field at ``path`` to ``value``, creating parent objects."""
    return {"type": "set", "path": path, "value": value}


def merge(value: dict[str, Any], path: Path | None = None) -> Op:
    """Shallow-merge ``value`` into the object at ``path`` (the root when None)."""
    return _with_path({"type": "merge", "value": value}, path)


def increment(path: Path, by: int | float = 1) -> Op:
    """Add ``by`` to the number at ``path``; a missing field counts as 0."""
    return {"type": "increment", "path": path, "by": by}


def decrement(path: Path, by: int | float = 1) -> Op:
    """Subtract ``by`` from the number at ``path``; a missing field counts as 0."""
    return {"type": "decrement", "path": path, "by": by}


def append(value: Any, path: Path | None = None) -> Op:
    """Append ``value`` to the list at ``path``, or concatenate a string to a string.

    A missing field becomes ``[value]``.
    """
    return _with_path({"type": "append", "value": value}, path)


def remove(path: Path) -> Op:
    """Remove the field at ``path`` (no error if absent); ``""`` deletes the key."""
    return {"type": "remove", "path": path}
