"""The values verbs return."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Change"]


class Change(NamedTuple):
    """What a write did to one key: its value before and after (None when absent)."""

    old_value: Any
    new_value: Any
