"""``Reader``: what a derived value's function reads through (SPEC §15). Every read is
of one snapshot of the database (``Store.consistent_reads``), so a result never mixes
two revisions; and every read is recorded, the keys read one by one and the patterns
listed, per scope (``ReadSet``): a change touching them, and only such a change,
computes the value again.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Any

from reactor._base.keys import Pattern, check_key, compile_pattern
from reactor._base.results import Entry
from reactor._base.values import decode
from reactor._storage.records import Row
from reactor._storage.store import SnapshotReads

__all__ = ["ReadSet", "Reader", "ScopeReader"]


@dataclass
class ReadSet:
    """What one run of a function read: keys (scope, key), and patterns by scope."""

    keys: set[tuple[str, str]] = field(default_factory=set)
    patterns: dict[str, dict[str, Pattern]] = field(default_factory=dict)

    def scopes(self) -> set[str]:
        return {scope for scope, _ in self.keys} | set(self.patterns)

    def wheres(self) -> set[tuple[str, str | None]]:
        """What to listen to: each scope a pattern was listed in, whole; each key read
        one by one of the other scopes."""
        whole: set[tuple[str, str | None]] = {(scope, None) for scope in self.patterns}
        return whole | {(scope, key) for scope, key in self.keys if scope not in self.patterns}

    def same_as(self, other: ReadSet) -> bool:
        return self.keys == other.keys and {
            scope: set(patterns) for scope, patterns in self.patterns.items()
        } == {scope: set(patterns) for scope, patterns in other.patterns.items()}

    def touched_by(self, scope: str, key: str) -> bool:
        """Whether a change of ``key`` of ``scope`` touches what was read."""
        if (scope, key) in self.keys:
            return True
        return any(pattern.matches(key) for pattern in self.patterns.get(scope, {}).values())


class Reader:
    """Reads of one snapshot, at revision ``revision``, recorded in ``read``."""

    def __init__(self, snapshot: SnapshotReads, now: float) -> None:
        self._snapshot = snapshot
        self.now = now
        """The time of the snapshot: a key past its deadline reads as absent."""
        self.revision: int = snapshot.revision()
        """The revision the snapshot holds: every read is as of it."""
        self.read = ReadSet()

    def __repr__(self) -> str:
        return f"<reactor.Reader at revision {self.revision}>"

    def scope(self, name: str) -> ScopeReader:
        """The reads of scope ``name``.

        Raises:
            InvalidKeyError: not a valid scope name.
        """
        return ScopeReader(self, check_key(name, "scope name"))

    # -- for ScopeReader ---------------------------------------------------------------
    def read_row(self, scope: str, key: str) -> Row | None:
        """The row of live ``key``, recorded as read."""
        self.read.keys.add((scope, key))
        row = self._snapshot.row(scope, key)
        return row if row is not None and row.live(self.now) else None

    def stored_rows(self, scope: str, pattern: Pattern) -> list[tuple[str, Row]]:
        """The rows of the keys matching ``pattern`` as stored, past their deadline
        too until their expiry is swept (as the change log has them), recorded as
        read: what ``count`` and ``sum``, kept up from the log's changes, start from."""
        self.read.patterns.setdefault(scope, {})[pattern.text] = pattern
        return self._snapshot.rows(scope, pattern)

    def read_rows(self, scope: str, pattern: Pattern) -> list[tuple[str, Row]]:
        """The live rows of the keys matching ``pattern``, recorded as read."""
        self.read.patterns.setdefault(scope, {})[pattern.text] = pattern
        return [
            (key, row) for key, row in self._snapshot.rows(scope, pattern) if row.live(self.now)
        ]


class ScopeReader:
    """One scope's reads, as of the reader's snapshot (the read verbs of ``Scope``)."""

    def __init__(self, reader: Reader, name: str) -> None:
        self._reader = reader
        self.name = name

    def __repr__(self) -> str:
        return f"<reactor.ScopeReader {self.name!r}>"

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` (a fresh copy), or ``default`` if it is absent."""
        row = self._reader.read_row(self.name, check_key(key))
        return default if row is None else decode(row.value)

    def exists(self, key: str) -> bool:
        """Whether ``key`` is live."""
        return self._reader.read_row(self.name, check_key(key)) is not None

    def entry(self, key: str) -> Entry | None:
        """The value of live ``key`` with its revisions, version and deadline."""
        row = self._reader.read_row(self.name, check_key(key))
        if row is None:
            return None
        return Entry(
            decode(row.value), row.revision, row.created_revision, row.version, row.expires_at
        )

    def ttl(self, key: str) -> float:
        """Seconds left before ``key`` expires, as of the snapshot; ``-1`` without
        expiry, ``-2`` if absent."""
        row = self._reader.read_row(self.name, check_key(key))
        if row is None:
            return -2.0
        return -1.0 if row.expires_at is None else row.expires_at - self._reader.now

    def keys(self, pattern: str = "*") -> builtins.list[str]:
        """The live keys matching the glob ``pattern``, sorted."""
        return [key for key, _ in self._reader.read_rows(self.name, compile_pattern(pattern))]

    def values(self, pattern: str = "*") -> builtins.list[Any]:
        """The values of the live keys matching ``pattern``, in the order of their keys."""
        rows = self._reader.read_rows(self.name, compile_pattern(pattern))
        return [decode(row.value) for _, row in rows]

    def items(self, pattern: str = "*") -> builtins.list[tuple[str, Any]]:
        """(key, value) of the live keys matching ``pattern``, sorted by key."""
        rows = self._reader.read_rows(self.name, compile_pattern(pattern))
        return [(key, decode(row.value)) for key, row in rows]

    def list(self, pattern: str = "*") -> dict[str, Any]:
        """Every live key matching ``pattern`` and its value."""
        return dict(self.items(pattern))
