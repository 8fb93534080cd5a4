"""``ChangeEvent``: one committed change, as subscribers and the change log see it."""

from __future__ import annotations

import datetime as dt
from typing import Any, Final, Literal, cast, get_args

from reactor._base.values import decode
from reactor._storage.records import ChangeRecord

__all__ = ["EVENT_TYPES", "ChangeEvent", "EventType"]

EventType = Literal["created", "updated", "deleted", "expired"]
"""The type of a change: what ``events=`` filters on, and ``ChangeEvent.type``."""

EVENT_TYPES: Final[frozenset[EventType]] = frozenset(get_args(EventType))


class ChangeEvent:
    """A committed change to one key.

    ``old_value``, ``new_value`` and ``ops`` are decoded from the stored JSON at each
    access: every reader gets its own copy, as with ``get``.
    """

    __slots__ = ("_record",)

    def __init__(self, record: ChangeRecord) -> None:
        self._record = record

    @property
    def scope(self) -> str:
        """The scope the key is in."""
        return self._record.scope

    @property
    def key(self) -> str:
        """The key that changed."""
        return self._record.key

    @property
    def type(self) -> EventType:
        """``"created"``, ``"updated"``, ``"deleted"`` or ``"expired"``."""
        return cast("EventType", self._record.type)  # the store records only these

    @property
    def revision(self) -> int:
        """Strictly increasing across the database, in commit order."""
        return self._record.revision

    @property
    def version(self) -> int | None:
        """The key's version after the change (1 when created, +1 at each change; 0
        when deleted or expired); None for a change recorded before versions were."""
        return self._record.version

    @property
    def timer(self) -> str | None:
        """The id of the timer whose write this is (``Scope.schedule``), or None."""
        return self._record.timer

    @property
    def timestamp(self) -> dt.datetime:
        """When the change was committed (UTC, from the engine's clock)."""
        return dt.datetime.fromtimestamp(self._record.timestamp, dt.UTC)

    @property
    def old_value(self) -> Any:
        """The value before the change; None when the key was absent."""
        text = self._record.old_value
        return None if text is None else decode(text)

    @property
    def new_value(self) -> Any:
        """The value after the change; None when the key is gone."""
        text = self._record.new_value
        return None if text is None else decode(text)

    @property
    def ops(self) -> list[dict[str, Any]] | None:
        """The update operations that applied, for a change made by ``update``."""
        text = self._record.ops
        return None if text is None else decode(text)

    def as_dict(self) -> dict[str, Any]:
        """The event as JSON-ready data (the timestamp in ISO 8601)."""
        return {
            "revision": self.revision,
            "scope": self.scope,
            "key": self.key,
            "type": self.type,
            "old_value": self.old_value,
            "new_value": self.new_value,
            "ops": self.ops,
            "timestamp": self.timestamp.isoformat(),
            "version": self.version,
            "timer": self.timer,
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ChangeEvent):
            return NotImplemented
        return self._record == other._record

    def __hash__(self) -> int:
        return hash((self._record.revision, self._record.scope, self._record.key))

    def __repr__(self) -> str:
        return (
            f"ChangeEvent(revision={self.revision}, scope={self.scope!r}, key={self.key!r}, "
            f"type={self.type!r}, old_value={self.old_value!r}, new_value={self.new_value!r})"
        )
