"""Export and import: keys as JSON Lines, a backup that round-trips.

Each line is one key: ``{"scope": ..., "key": ..., "value": ..., "ttl": ...}``, where
``ttl`` is the seconds the key had left when it was exported, or null for no expiry.

```python
from reactor._exchange import dump_file, load

dump_file(state, "backup.jsonl")           # every live key, scope by scope
with open("backup.jsonl", "rb") as file:
    load(other, file)                      # every line checked before anything is written
```
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final, NamedTuple

import orjson

from ._keys import check_key, compile_pattern
from ._values import DEFAULT_MAX_DEPTH, DEFAULT_MAX_VALUE_BYTES, encode
from .errors import InvalidArgumentError, ReactorError

if TYPE_CHECKING:
    from ._state import State

__all__ = ["Entry", "dump", "dump_file", "entries", "load", "parse_json", "read", "write"]

FIELDS: Final = frozenset({"scope", "key", "value", "ttl"})
MAX_REPORTED: Final = 10  # bad lines named in one error; the rest are counted
BATCH: Final = 1000  # keys per set_many write on import


class Entry(NamedTuple):
    """One key of an export: where it lives, its value, and its seconds left (or None)."""

    scope: str
    key: str
    value: Any
    ttl: float | None


def parse_json(text: str | bytes) -> Any:
    """Parse strict JSON: no NaN or Infinity, which Python's parser would let through.

    Raises:
        ValueError: the text is not JSON (``json.JSONDecodeError`` is a ``ValueError``).
    """
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# -- export ----------------------------------------------------------------------
def entries(state: State, scope: str = "*") -> Iterator[Entry]:
    """Every live key of the scopes matching the glob ``scope``, sorted by scope and key.

    Each scope's values are read at once; a key deleted or expired before its TTL is
    read is left out.
    """
    match = compile_pattern(scope)
    for name in state.scopes():
        if not match.matches(name):
            continue
        handle = state.scope(name)
        for key, value in handle.list().items():
            left = handle.ttl(key)
            if left == -2:
                continue
            # A millisecond at least: a key about to expire must still import as live.
            yield Entry(name, key, value, None if left < 0 else max(round(left, 3), 0.001))


def dump(state: State, file: IO[str], scope: str = "*") -> int:
    """Write the keys of the scopes matching ``scope`` to ``file`` as JSON Lines;
    return how many."""
    count = 0
    for entry in entries(state, scope):
        file.write(orjson.dumps(entry._asdict()).decode())
        file.write("\n")
        count += 1
    return count


def dump_file(state: State, path: str | os.PathLike[str], scope: str = "*") -> int:
    """``dump`` to the file at ``path``, replaced only once the export is complete: a
    failure leaves what was there before. Return how many keys were written."""
    target = Path(path)
    handle, temporary = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".tmp", dir=target.parent
    )
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as file:
            count = dump(state, file, scope)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return count


# -- import ----------------------------------------------------------------------
def read(lines: Iterable[str | bytes]) -> list[Entry]:
    """Parse and check exported lines (blank lines are skipped).

    Raises:
        InvalidArgumentError: some lines are not entries; the message names them by
            line number (the first ten, and how many more).
    """
    found: list[Entry] = []
    bad: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            found.append(_entry(line))
        except (ValueError, ReactorError) as exc:
            bad.append(f"line {number}: {exc}")
    if bad:
        more = f"; and {len(bad) - MAX_REPORTED} more" if len(bad) > MAX_REPORTED else ""
        raise InvalidArgumentError(
            f"{len(bad)} bad line{'s' if len(bad) > 1 else ''}, nothing imported: "
            + "; ".join(bad[:MAX_REPORTED])
            + more
        )
    return found


class _BadLine(ValueError):
    """A line that is JSON but not an entry."""


def _entry(line: str | bytes) -> Entry:
    try:
        data = parse_json(line)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise _BadLine(f"expected an object, not {type(data).__name__}")
    missing = sorted({"scope", "key", "value"} - data.keys())
    if missing:
        raise _BadLine(f"missing {', '.join(map(repr, missing))}")
    unknown = sorted(data.keys() - FIELDS)
    if unknown:
        raise _BadLine(f"unknown field {', '.join(map(repr, unknown))}")
    ttl = data.get("ttl")
    if ttl is not None and (type(ttl) not in (int, float) or not 0 < ttl < float("inf")):
        raise _BadLine(f"'ttl' must be a number of seconds > 0 or null, not {ttl!r}")
    value = data["value"]
    encode(value, max_depth=DEFAULT_MAX_DEPTH, max_bytes=DEFAULT_MAX_VALUE_BYTES)
    scope = check_key(data["scope"], "scope name")
    return Entry(scope, check_key(data["key"]), value, None if ttl is None else float(ttl))


def write(state: State, found: Iterable[Entry]) -> int:
    """Set every entry, with its TTL counted from now; return how many keys were set.

    A key given twice takes its last entry. Keys without a TTL are written a thousand
    at a time (one write each); keys with one, one by one.
    """
    latest = {(entry.scope, entry.key): entry for entry in found}
    by_scope: dict[str, list[Entry]] = {}
    for entry in latest.values():
        by_scope.setdefault(entry.scope, []).append(entry)
    for name, items in by_scope.items():
        scope = state.scope(name)
        lasting = iter([entry for entry in items if entry.ttl is None])
        while batch := list(islice(lasting, BATCH)):
            scope.set_many({entry.key: entry.value for entry in batch})
        for entry in items:
            if entry.ttl is not None:
                scope.set(entry.key, entry.value, ttl=entry.ttl)
    return len(latest)


def load(state: State, lines: Iterable[str | bytes]) -> int:
    """Check every line (``read``), then write them all (``write``); return how many
    keys were set.

    Raises:
        InvalidArgumentError: some lines are not entries; nothing was written.
    """
    return write(state, read(lines))
