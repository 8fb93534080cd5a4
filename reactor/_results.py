"""The values verbs return."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Change", "Snapshot", "UpdateResult"]


class Change(NamedTuple):
    """What a write did to one key: its value before and after (None when absent)."""

    old_value: Any
    new_value: Any


class UpdateResult(NamedTuple):
    """What ``update`` did: the value before and after, and the ops that did not apply.

    Each error is ``{"index", "op", "code", "message"}``, with ``code`` one of
    ``invalid_op``, ``path_not_found``, ``type_mismatch``, ``test_failed``.
    """

    old_value: Any
    new_value: Any
    errors: list[dict[str, Any]]


class Snapshot(NamedTuple):
    """Every live key-value of a scope, and the revision they are current at."""

    values: dict[str, Any]
    revision: int
