"""Export and import: a database as JSON Lines, a backup that round-trips.

Each line is one JSON object; its fields tell its kind:

- a key: ``{"scope", "key", "value", "ttl"}``, ``ttl`` the seconds the key had left (null:
  no expiry);
- a pending timer: ``{"timer": ID, "scope", "key", "value" or "ops", "due_in", "every"}``,
  ``due_in`` the seconds it had until due (<= 0: overdue, it fires once imported) and
  ``every`` its period (null: it fires once);
- a queue: ``{"queue": NAME, "max_attempts": N}``, before its jobs;
- a job: ``{"queue": NAME, "item", "attempts", "state", "ready_in", "key"}``, ``state``
  ``"ready"`` (``ready_in`` seconds on) or ``"dead"``, ``key`` its idempotency key (null:
  none). A job taken at export time is written as if its lease had run out: ready at
  once, or dead if it has had its ``max_attempts`` takes (its take counts in
  ``attempts``): no worker holds it in a restored database.

An export is the database at one moment: it reads one snapshot (``_export``), so a
transaction that commits while it runs is in it whole or not at all. Times are
seconds from that moment; they count again from the import's commit.
Keys come sorted by scope and key, then timers, earliest first, then each queue (by
name) with its jobs, in the order they are taken. An export of some scopes (a glob other
than ``*``) has the timers of those scopes and no queue (a queue belongs to no scope).

An import checks every line, then writes it all in one transaction: keys are set,
timers put back under their ids (replacing a timer of that id), queue settings saved,
and jobs added to their queues as new jobs (new ids, in file order, their attempts and
state kept), but for a job whose idempotency key a job of the queue holds already.

```python
from reactor._backup.exchange import dump_file, load

dump_file(state, "backup.jsonl")           # keys, timers, queues and jobs
with open("backup.jsonl", "rb") as file:
    load(other, file)                      # every line checked, then all in one commit
```
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final, Protocol

import orjson

from reactor._base.keys import compile_pattern
from reactor._handles.binding import binding_of, engine_of
from reactor._handles.transaction import Hold
from reactor._work import jobs as _jobs
from reactor._work import timers as _timers
from reactor._work.queue_settings import Settings
from reactor.errors import InvalidArgumentError, InvalidValueError, ReactorError

from .export import ExportView
from .lines import Backup, Entry, JobEntry, QueueEntry, TimerEntry, entry_of, parse_json

if TYPE_CHECKING:
    from reactor._base.results import Timer
    from reactor._engine.port import EnginePort
    from reactor._handles.state import State
    from reactor._storage.txn import Work, WriteTxn

__all__ = [
    "KINDS",
    "Backup",
    "Entry",
    "JobEntry",
    "Progress",
    "QueueEntry",
    "Tally",
    "TimerEntry",
    "dump",
    "dump_file",
    "load",
    "parse_json",
    "read",
    "write",
]

KINDS: Final = ("keys", "timers", "queues")  # what an export may hold
MAX_REPORTED: Final = 10  # bad lines named in one error; the rest are counted
BATCH: Final = 1000  # keys read ahead in one statement on import; also the progress step


@dataclass(slots=True)
class Tally:
    """What an export or an import wrote: keys, timers, queues (their settings lines)
    and jobs; and, of an import, the jobs left out because a job of their queue held
    their idempotency key."""

    keys: int = 0
    timers: int = 0
    queues: int = 0
    jobs: int = 0
    skipped: int = 0

    @property
    def total(self) -> int:
        """Keys, timers and jobs (a queue's settings are not counted)."""
        return self.keys + self.timers + self.jobs


class Progress(Protocol):
    """Told how far an export or import has got (the CLI draws it on a terminal)."""

    def start(self, stage: str, total: int | None) -> None:
        """A new stage begins: ``total`` steps (lines, keys), or None if not known."""

    def advance(self, steps: int) -> None:
        """``steps`` more steps of the current stage are done."""


# -- export ----------------------------------------------------------------------
def _emit(
    file: IO[str],
    lines: Iterable[dict[str, Any]],
    progress: Progress | None,
    stage: str,
    total: int | None,
) -> int:
    """Write ``lines`` to ``file``, as one stage of ``progress``; how many."""
    if progress is not None:
        progress.start(stage, total)
    count = 0
    for line in lines:
        file.write(orjson.dumps(line).decode())
        file.write("\n")
        count += 1
        if progress is not None and count % BATCH == 0:
            progress.advance(BATCH)
    if progress is not None:
        progress.advance(count % BATCH)
    return count


def dump(
    state: State,
    file: IO[str],
    scope: str = "*",
    progress: Progress | None = None,
    kinds: Collection[str] = KINDS,
) -> Tally:
    """Write the keys, timers and queues (those of ``kinds``) of the scopes matching
    ``scope`` to ``file`` as JSON Lines, all read from one snapshot of the database
    (see ``_export``); what it wrote. Queues go only in an export of every scope
    (``scope`` a glob that matches all).

    Raises:
        InvalidKeyError: a bad pattern.
    """
    engine = engine_of(state)
    match = compile_pattern(scope)
    tally = Tally()
    with engine.store.consistent_reads() as query:
        view = ExportView(query, engine.now(), match)
        if "keys" in kinds:
            total = view.key_count() if progress is not None else None
            tally.keys = _emit(file, view.key_lines(), progress, "exporting keys", total)
        if "timers" in kinds:
            timers = view.timer_lines()
            tally.timers = _emit(file, timers, progress, "exporting timers", len(timers))
        if "queues" in kinds and match.matches_all:
            queues = view.queue_names()
            lines = view.job_lines(queues)
            written = _emit(file, lines, progress, "exporting queues", None)
            tally.queues, tally.jobs = len(queues), written - len(queues)
    return tally


def dump_file(
    state: State,
    path: str | os.PathLike[str],
    scope: str = "*",
    progress: Progress | None = None,
    kinds: Collection[str] = KINDS,
) -> Tally:
    """``dump`` to ``path``; what it wrote.

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
            return dump(state, file, scope, progress, kinds)
    try:
        handle, temporary = tempfile.mkstemp(
            prefix=f".{target.name}.", suffix=".tmp", dir=target.parent
        )
    except OSError as exc:  # name the user's file and folder, not the temporary one
        folder = str(target.parent)
        raise type(exc)(
            exc.errno,
            f"cannot export to {str(target)!r}: cannot create a file in {folder!r} "
            f"({exc.strerror}); an export writes a new file there, then puts it in "
            "place of the old one",
        ) from None
    try:
        if found is not None:
            _keep_owner_and_mode(handle, found)
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as file:
            tally = dump(state, file, scope, progress, kinds)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return tally


def _keep_owner_and_mode(handle: int, was: os.stat_result) -> None:
    """Give the replacement the replaced file's owner (where allowed) and mode."""
    # Owner first: chown may clear set-user-ID bits that chmod then puts back.
    with contextlib.suppress(OSError):  # only root may give a file away
        os.fchown(handle, was.st_uid, was.st_gid)
    os.fchmod(handle, stat.S_IMODE(was.st_mode))


# -- import ----------------------------------------------------------------------
def read(lines: Iterable[str | bytes], progress: Progress | None = None) -> Backup:
    """Parse and check exported lines (blank lines are skipped).

    Raises:
        InvalidArgumentError: some lines are not keys, timers, queues or jobs; the
            message names them by line number (the first ten, and how many more).
    """
    if progress is not None:
        progress.start("reading", None)
    found = Backup()
    bad: list[str] = []
    number = 0
    for number, line in enumerate(lines, 1):
        if progress is not None and number % BATCH == 0:
            progress.advance(BATCH)
        if not line.strip():
            continue
        try:
            found.add(entry_of(line))
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


@contextlib.contextmanager
def _handed_over(state: State, scopes: tuple[str, ...]) -> Iterator[None]:
    """Hold ``scopes`` (sorted), taken from their actors, for the body.

    Raises:
        OperationTimeout: a scope was not handed over in time (none is held then).
    """
    if not scopes:
        yield
        return
    hold = Hold(binding_of(state), scopes)
    hold.take()
    status = "failed"
    try:
        yield
        status = "committed"
    finally:
        # A Ctrl-C may land as the hand-back begins: it is tried once more then.
        try:
            hold.hand_back(status)
        except BaseException:
            hold.hand_back(status)
            raise


def write(
    state: State,
    found: Backup,
    progress: Progress | None = None,
    staged: Callable[[], None] | None = None,
) -> Tally:
    """Write everything ``found`` holds in one write transaction; what it wrote.

    Keys are set (a key given twice takes its last entry); timers put back under their
    ids (replacing a timer of that id; given twice: the last); queue settings saved;
    jobs added as new jobs of their queue, in order, but those whose idempotency key a
    job of the queue holds. Times (TTLs, timers, delayed jobs) count from the commit's
    clock. All or nothing: if anything fails before the commit (Ctrl-C included),
    nothing is written. The commit publishes its changes to subscribers (the jobs'
    as ``queue:NAME`` events), as any write does. ``staged`` is called once
    everything is staged, as the commit begins.

    Raises:
        InvalidValueError: a value, ops or item is beyond this database's limits
            (checked before the transaction begins).
        BusyError, StorageError: the database failed; nothing was written.
    """
    engine = engine_of(state)
    keys = _keys_to_set(engine, found.keys)
    timers = _timers_to_restore(engine, found.timers)
    settings = {entry.queue: entry.settings for entry in found.queues}
    jobs = _jobs_to_add(engine, found.jobs)
    queues = list(dict.fromkeys([*settings, *jobs]))
    tally = Tally(keys=sum(map(len, keys.values())), timers=len(timers), queues=len(queues))
    if not (keys or timers or queues):
        return tally

    def work(txn: WriteTxn) -> int:
        if progress is not None:
            progress.start("importing", tally.keys + tally.timers + len(found.jobs))
        _set_keys(txn, keys, progress)
        for done, (_, restore) in enumerate(timers, 1):
            restore(txn)
            if progress is not None and done % BATCH == 0:
                progress.advance(BATCH)
        if progress is not None:
            progress.advance(len(timers) % BATCH)
        added = sum(_add_jobs(txn, name, settings, jobs.get(name, []), progress) for name in queues)
        if progress is not None:
            progress.start("committing", None)  # the rows and log go in as work returns
        if staged is not None:
            staged()
        return added

    # Through the scopes' owners: their actors hand the scopes of its keys and timers
    # over first (as to a transaction), so that no write of theirs, and no transaction
    # body, runs on a scope while the import writes it. The commit is then this
    # thread's own (a Ctrl-C before it undoes everything), locking for it what it
    # writes (on PostgreSQL: those scopes and its queues; SQLite locks the whole file
    # anyway); the engine publishes the changes once committed.
    owned = tuple(sorted({*keys, *(scope for scope, _ in timers)}))
    with _handed_over(state, owned):
        tally.jobs = engine.commit(work, scopes={*owned, *map(_jobs.lock_name, queues)})
    tally.skipped = len(found.jobs) - tally.jobs
    return tally


def _keys_to_set(
    engine: EnginePort, found: Iterable[Entry]
) -> dict[str, list[tuple[str, str, float | None]]]:
    """The keys to set, by scope: (key, JSON text, TTL), the last entry of each.

    Raises:
        InvalidValueError: a value beyond the database's limits.
    """
    latest = {(entry.scope, entry.key): entry for entry in found}
    by_scope: dict[str, list[tuple[str, str, float | None]]] = {}
    for (scope, key), entry in latest.items():
        try:
            text = engine.encode(entry.value)
        except InvalidValueError as exc:
            raise InvalidValueError(f"scope {scope!r}, key {key!r}: {exc}") from None
        by_scope.setdefault(scope, []).append((key, text, entry.ttl))
    return by_scope


def _set_keys(
    txn: WriteTxn,
    by_scope: dict[str, list[tuple[str, str, float | None]]],
    progress: Progress | None,
) -> None:
    for scope, items in by_scope.items():
        for start in range(0, len(items), BATCH):
            batch = items[start : start + BATCH]
            txn.prefetch([(scope, key) for key, _, _ in batch])
            for key, text, ttl in batch:
                old = txn.live_row(scope, key)
                txn.write(scope, key, old, text, None if ttl is None else txn.now + ttl)
            if progress is not None:
                progress.advance(len(batch))


def _timers_to_restore(
    engine: EnginePort, found: Iterable[TimerEntry]
) -> list[tuple[str, Work[Timer]]]:
    """The work that puts back each timer (the last entry of each id), with its scope.

    Raises:
        InvalidValueError: a value or ops beyond the database's limits.
    """
    latest = {entry.timer: entry for entry in found}
    restored: list[tuple[str, Work[Timer]]] = []
    for timer_id, entry in latest.items():
        try:
            work = _timers.restore(engine.options, *entry)
        except InvalidValueError as exc:
            raise InvalidValueError(f"timer {timer_id!r}: {exc}") from None
        restored.append((entry.scope, work))
    return restored


def _jobs_to_add(engine: EnginePort, found: Iterable[JobEntry]) -> dict[str, list[_jobs.Restored]]:
    """The jobs to add, by queue, in order.

    Raises:
        InvalidValueError: an item beyond the database's limits.
    """
    by_queue: dict[str, list[_jobs.Restored]] = {}
    for entry in found:
        jobs = by_queue.setdefault(entry.queue, [])
        try:
            _, put = _jobs.check_put(
                engine.options,
                entry.queue,
                entry.item,
                entry.ready_in,
                entry.key,
                entry.priority,
                entry.group,
            )
        except InvalidValueError as exc:
            raise InvalidValueError(
                f"queue {entry.queue!r}, its job {len(jobs) + 1} in the file: {exc}"
            ) from None
        jobs.append((put, entry.attempts, entry.state, entry.errors))
    return by_queue


def _add_jobs(
    txn: WriteTxn,
    queue: str,
    settings: dict[str, Settings | None],
    jobs: list[_jobs.Restored],
    progress: Progress | None,
) -> int:
    """Save a queue's settings (if given) and add its jobs; how many were added."""
    if queue in settings:
        _jobs.save_settings(txn, queue, settings[queue])
    added = 0
    for start in range(0, len(jobs), BATCH):
        batch = jobs[start : start + BATCH]
        added += _jobs.restore(txn, queue, batch)
        if progress is not None:
            progress.advance(len(batch))
    return added


def load(state: State, lines: Iterable[str | bytes], progress: Progress | None = None) -> Tally:
    """Check every line (``read``), then write them all in one commit (``write``);
    what it wrote.

    Raises:
        InvalidArgumentError: some lines are bad; nothing was written.
        the errors of ``write``; nothing was written.
    """
    return write(state, read(lines, progress), progress)
