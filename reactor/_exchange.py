"""Export and import: keys as JSON Lines, a backup that round-trips.

Each line is one key: ``{"scope": ..., "key": ..., "value": ..., "ttl": ...}``, where
``ttl`` is the seconds the key had left when it was exported, or null for no expiry.

```python
from reactor._exchange import dump_file, load

dump_file(state, "backup.jsonl")           # every live key, scope by scope
with open("backup.jsonl", "rb") as file:
    load(other, file)                      # every line checked, then all set in one commit
```
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final, NamedTuple, Protocol

import orjson

from ._engine import engine_of
from ._keys import check_key, compile_pattern
from ._values import DEFAULT_MAX_DEPTH, DEFAULT_MAX_VALUE_BYTES, encode
from .errors import InvalidArgumentError, InvalidValueError, ReactorError

if TYPE_CHECKING:
    from ._state import State
    from ._store import WriteTxn

__all__ = [
    "Entry",
    "Progress",
    "dump",
    "dump_file",
    "entries",
    "load",
    "parse_json",
    "read",
    "write",
]

FIELDS: Final = frozenset({"scope", "key", "value", "ttl"})
MAX_REPORTED: Final = 10  # bad lines named in one error; the rest are counted
BATCH: Final = 1000  # keys read ahead in one statement on import; also the progress step


class Entry(NamedTuple):
    """One key of an export: where it lives, its value, and its seconds left (or None)."""

    scope: str
    key: str
    value: Any
    ttl: float | None


class Progress(Protocol):
    """Told how far an export or import has got (the CLI draws it on a terminal)."""

    def start(self, stage: str, total: int | None) -> None:
        """A new stage begins: ``total`` steps (lines, keys), or None if not known."""

    def advance(self, steps: int) -> None:
        """``steps`` more steps of the current stage are done."""


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


def dump(state: State, file: IO[str], scope: str = "*", progress: Progress | None = None) -> int:
    """Write the keys of the scopes matching ``scope`` to ``file`` as JSON Lines;
    return how many."""
    if progress is not None:
        engine = engine_of(state)
        match = compile_pattern(scope)
        counts = engine.store.counts(engine.now())
        progress.start("exporting", sum(n for name, n in counts.items() if match.matches(name)))
    count = 0
    for entry in entries(state, scope):
        file.write(orjson.dumps(entry._asdict()).decode())
        file.write("\n")
        count += 1
        if progress is not None and count % BATCH == 0:
            progress.advance(BATCH)
    if progress is not None:
        progress.advance(count % BATCH)
    return count


def dump_file(
    state: State, path: str | os.PathLike[str], scope: str = "*", progress: Progress | None = None
) -> int:
    """``dump`` to ``path``; return how many keys were written.

    A regular file (or no file) is replaced only once the export is complete, keeping
    its permission bits: a failure leaves what was there before. Anything else (a
    symlink, a FIFO, a device such as ``/dev/null`` or ``/dev/stdout``) is written
    through and stays what it was: replacing it would put a regular file in its place.

    Raises:
        InvalidArgumentError: ``path`` is a directory (or a symlink to one).
    """
    target = Path(path)
    try:
        found: os.stat_result | None = os.lstat(target)
    except FileNotFoundError:
        found = None
    if found is not None and stat.S_ISDIR(found.st_mode):
        raise InvalidArgumentError(f"cannot export to {str(target)!r}: it is a directory")
    if found is not None and not stat.S_ISREG(found.st_mode):
        try:
            file = open(target, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
        except IsADirectoryError:
            raise InvalidArgumentError(
                f"cannot export to {str(target)!r}: it leads to a directory"
            ) from None
        with file:
            return dump(state, file, scope, progress)
    handle, temporary = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".tmp", dir=target.parent
    )
    try:
        if found is not None:
            _keep_owner_and_mode(handle, found)
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as file:
            count = dump(state, file, scope, progress)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return count


def _keep_owner_and_mode(handle: int, was: os.stat_result) -> None:
    """Give the replacement the replaced file's owner (where allowed) and mode."""
    # Owner first: chown may clear set-user-ID bits that chmod then puts back.
    with contextlib.suppress(OSError):  # only root may give a file away
        os.fchown(handle, was.st_uid, was.st_gid)
    os.fchmod(handle, stat.S_IMODE(was.st_mode))


# -- import ----------------------------------------------------------------------
def read(lines: Iterable[str | bytes], progress: Progress | None = None) -> list[Entry]:
    """Parse and check exported lines (blank lines are skipped).

    Raises:
        InvalidArgumentError: some lines are not entries; the message names them by
            line number (the first ten, and how many more).
    """
    if progress is not None:
        progress.start("reading", None)
    found: list[Entry] = []
    bad: list[str] = []
    number = 0
    for number, line in enumerate(lines, 1):
        if progress is not None and number % BATCH == 0:
            progress.advance(BATCH)
        if not line.strip():
            continue
        try:
            found.append(_entry(line))
        except (ValueError, ReactorError) as exc:
            bad.append(f"line {number}: {exc}")
    if progress is not None:
        progress.advance(number % BATCH)
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


def write(state: State, found: Iterable[Entry], progress: Progress | None = None) -> int:
    """Set every entry in one write transaction; return how many keys were set.

    All or nothing: if anything fails before the commit (Ctrl-C included), no key is
    set. A TTL counts from the commit's clock; a key given twice takes its last entry.
    The commit publishes its changes to subscribers, as any write does.

    Raises:
        InvalidValueError: a value is beyond this database's limits (checked before
            the transaction begins).
        BusyError, StorageError: the database failed; nothing was set.
    """
    engine = engine_of(state)
    latest = {(entry.scope, entry.key): entry for entry in found}
    by_scope: dict[str, list[tuple[str, str, float | None]]] = {}
    for (scope, key), entry in latest.items():
        try:
            text = engine.encode(entry.value)
        except InvalidValueError as exc:
            raise InvalidValueError(f"scope {scope!r}, key {key!r}: {exc}") from None
        by_scope.setdefault(scope, []).append((key, text, entry.ttl))
    if not latest:
        return 0

    def work(txn: WriteTxn) -> None:
        if progress is not None:
            progress.start("importing", len(latest))
        for scope, items in by_scope.items():
            for start in range(0, len(items), BATCH):
                batch = items[start : start + BATCH]
                txn.prefetch([(scope, key) for key, _, _ in batch])
                for key, text, ttl in batch:
                    old = txn.live_row(scope, key)
                    txn.write(scope, key, old, text, None if ttl is None else txn.now + ttl)
                if progress is not None:
                    progress.advance(len(batch))
        if progress is not None:
            progress.start("committing", None)  # the rows and log go in as work returns

    # The scopes it writes are locked for it from the start (on PostgreSQL; SQLite
    # locks the whole file anyway), as for any write; the engine publishes the changes
    # once committed.
    engine.store.write(work, engine.now(), engine.publish, scopes=list(by_scope))
    return len(latest)


def load(state: State, lines: Iterable[str | bytes], progress: Progress | None = None) -> int:
    """Check every line (``read``), then write them all in one commit (``write``);
    return how many keys were set.

    Raises:
        InvalidArgumentError: some lines are not entries; nothing was written.
        the errors of ``write``; nothing was written.
    """
    return write(state, read(lines, progress), progress)
