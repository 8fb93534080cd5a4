"""How the dashboard shows a change: its values as JSON text, and what an update did,
as a JSON Patch.

The page is sent texts, written here by Python's ``json``, to show: JavaScript's
``JSON.parse`` turns ``1.0`` into ``1`` and rounds integers beyond 2**53.

An update's patch is ``jsonpatch.make_patch(old, new)``, each op with its value as text
and, for ``replace`` and ``remove``, the value it took away (``old``). It is checked by
applying it: a patch that does not give the new value (the same JSON, but for the order
of keys) is replaced by one op that replaces the whole document.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Final

import jsonpatch
import jsonpointer

from reactor._engine.events import ChangeEvent

__all__ = ["MAX_DIFF_CHARS", "MAX_DIFF_OPS", "change_view", "diff", "text"]

# A patch is computed for every follower of every update: above this size (the two
# documents' text) the page shows the values instead.
MAX_DIFF_CHARS: Final = 256 * 1024
MAX_DIFF_OPS: Final = 50  # ops sent; the rest are counted in "more"


def text(value: Any) -> str:
    """``value`` as compact JSON text: ``1.0`` stays ``1.0``."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def change_view(event: ChangeEvent) -> dict[str, Any]:
    """The event's ``as_dict()``, with ``old_text`` and ``new_text`` (None where the
    key was absent) and ``diff`` (an update's patch, else None)."""
    view = event.as_dict()
    old = None if event.type == "created" else text(view["old_value"])
    new = None if event.type in ("deleted", "expired") else text(view["new_value"])
    view["old_text"], view["new_text"] = old, new
    view["diff"] = None
    if old is not None and new is not None and len(old) + len(new) <= MAX_DIFF_CHARS:
        view["diff"] = diff(view["old_value"], view["new_value"])
    return view


def diff(old: Any, new: Any) -> dict[str, Any]:
    """The patch from ``old`` to ``new``: ``{"ops": [...], "more": N}``, each op
    ``{"op", "path", "from"?, "value"?, "old"?}`` with the values as JSON text, and
    ``more`` the ops left out past ``MAX_DIFF_OPS``. No op: the keys were reordered."""
    patch: list[dict[str, Any]] = []
    shown: list[dict[str, Any]] = []
    try:
        patch = jsonpatch.make_patch(old, new).patch
        document = copy.deepcopy(old)
        for op in patch:
            if len(shown) < MAX_DIFF_OPS:
                shown.append(_shown(op, document))
            # A copy: an op's value may be a part of ``new``, which must stay as it is.
            document = jsonpatch.apply_patch(document, [copy.deepcopy(op)], in_place=True)
        exact = _canonical(document) == _canonical(new)
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, RecursionError):
        exact = False  # RecursionError: a value nested near reactor's depth limit
    if not exact:  # not expected; but what the page shows must be what happened
        replace = {"op": "replace", "path": ""}
        return {"ops": [_shown(replace, old) | {"value": text(new)}], "more": 0}
    return {"ops": shown, "more": len(patch) - len(shown)}


def _shown(op: dict[str, Any], document: Any) -> dict[str, Any]:
    """``op`` as the page shows it, read against ``document`` before it applies."""
    shown: dict[str, Any] = {"op": op["op"], "path": op["path"]}
    if "from" in op:
        shown["from"] = op["from"]
    if op["op"] in ("replace", "remove"):
        shown["old"] = text(jsonpointer.resolve_pointer(document, op["path"]))
    if "value" in op:
        shown["value"] = text(op["value"])
    return shown


def _canonical(value: Any) -> str:
    """``value`` as JSON text with its keys sorted: equal for equal JSON values."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)
