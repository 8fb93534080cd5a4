"""Timers: writes scheduled for later (SPEC §13), kept in the database.

A timer is a row of ``reactor_timers``: the key it writes, what it writes (a value, as
``set`` would, or update ops, as ``update`` would), when it is due and, if it recurs,
its period. Scheduling one is a write of the scope it belongs to (in a transaction
body, deferred to the commit, atomically with the body's writes).

Firing is the sweeper's (``Sweeper.fire_timers``), in every process that writes: it
finds the timers due, and sends each scope's actor one request that reads them again
inside the write transaction (in one statement, the rows of their keys read ahead with
the begin) and, for each one still there and due, applies its write; then deletes the
rows (or moves a recurring one to its next period after now: missed periods fire once,
not in a flood), a statement for the lot. The write and the row's removal
commit together, under the scope's lock on PostgreSQL, so a timer fires exactly once,
whichever process gets there first, and one due while no engine was open fires at the
next open. A write that fails (a type mismatch) is dropped and counted: the timer
still goes (a recurring one to its next period). So is a write the database refuses
(``RefusedError``: a constraint, a trigger, one of its limits), which fails the whole
transaction: timers fire in transactions of their own, and the sweeper fires a batch
the database refused again in halves, down to the timer it refuses (``drop_failed``).
A database that fails otherwise (a lost connection) drops nothing: the timers stay due.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from reactor._base.keys import QUEUE_PREFIX, check_key
from reactor._base.results import Timer, UpdateResult
from reactor._base.update_ops import op_style
from reactor._base.values import MISSING, decode
from reactor._storage.records import Entangled, TimerRow
from reactor._storage.txn import Work, WriteTxn
from reactor.errors import InvalidArgumentError, ReactorError, StorageError

from . import jobs as _jobs
from . import writes as _writes
from .cron import check_cron, next_cron_time
from .writes import check_ttl

if TYPE_CHECKING:
    from reactor._engine.options import Options

__all__ = [
    "AddTimer",
    "DropTimer",
    "Fired",
    "check_timer_id",
    "drop_failed",
    "drop_timer",
    "fire",
    "following_due",
    "next_due",
    "pending_timer",
    "restore",
    "schedule",
    "timer_of",
]


def _seconds(value: object, name: str) -> float:
    """A finite number of seconds (an int or a float, finite as a float; not a bool).

    Raises:
        InvalidArgumentError: it is not.
    """
    seconds = _writes.finite(value)
    if seconds is None:
        raise InvalidArgumentError(f"{name} must be a finite number of seconds, not {value!r}")
    return seconds


def schedule(
    options: Options,
    scope: str,
    key: str,
    value: Any,
    ops: object,
    after: object,
    at: object,
    every: object,
    *,
    cron: object = None,
    tz: object = None,
    timer_id: str | None = None,
    first_in: float | None = None,
    keep_same: bool = False,
) -> Work[Timer]:
    """The work that schedules a write of ``value`` (or ``ops``) to ``key``: due
    ``after`` seconds from the write, or ``at`` an epoch time, or, with neither, one
    period from now; again every ``every`` seconds if given. Or, with ``cron``, at
    each time the expression names in zone ``tz`` (UTC if None), the first after the
    write. ``timer_id``: the timer's id (None: a new one). ``first_in``: when it is
    due first, in seconds from the write, whatever else says (``restore``).
    ``keep_same``: a timer of that id that writes the same thing at the same times
    stays as it is (due when it was); one that differs is replaced (``put_every``).

    Raises:
        InvalidArgumentError: not exactly one of value and ops, both after and at, or
            neither with no period; a period that is not a number > 0; a bad cron
            expression or zone, or cron with another time; tz without cron.
        InvalidValueError: the value is not storable.
        InvalidOpError: the ops are not update ops nor a JSON Patch.
    """
    check_key(key)
    value_text, ops_text = _writing(options, value, ops)
    if after is not None and at is not None:
        raise InvalidArgumentError("a timer is due after= seconds or at= a time, not both")
    period = check_ttl(every, "every")
    zoned = _cron_of(cron, tz, after, at, period)
    if after is None and at is None and period is None and zoned is None:
        raise InvalidArgumentError("a timer needs a time: after=, at=, every= or cron=")
    delay = None if after is None else _seconds(after, "after")
    due_at = None if at is None else _seconds(at, "at")
    if timer_id is None:
        timer_id = new_timer_id()

    def work(txn: WriteTxn) -> Timer:
        if first_in is not None:
            due = txn.now + first_in
        elif due_at is not None:
            due = due_at
        elif zoned is not None:
            due = next_cron_time(*zoned, txn.now)
        else:
            due = txn.now + (delay if delay is not None else period or 0.0)
        cron_text, zone = zoned or (None, None)
        row = TimerRow(timer_id, scope, key, due, period, value_text, ops_text, cron_text, zone)
        return _add(txn, row, keep_same=keep_same)

    return Work(work)


def _add(txn: WriteTxn, row: TimerRow, *, keep_same: bool) -> Timer:
    """Add timer ``row`` with the commit; with ``keep_same``, a timer of its id that
    writes the same at the same times stays instead (one that differs goes)."""
    if keep_same:
        found = pending_timer(txn, row.id)
        if found is not None and _same(found, row):
            return timer_of(found)
        if found is not None:
            txn.defer(DropTimer(row.id))
    txn.defer(AddTimer(row))
    return timer_of(row)


def _same(found: TimerRow, row: TimerRow) -> bool:
    """Whether two timers write the same thing at the same times (their due aside)."""
    return (found.scope, found.key, found.every, found.value, found.ops, found.cron, found.tz) == (
        row.scope,
        row.key,
        row.every,
        row.value,
        row.ops,
        row.cron,
        row.tz,
    )


def _writing(options: Options, value: Any, ops: object) -> tuple[str | None, str | None]:
    """The JSON text of what a timer writes: its value's, or its ops'.

    Raises:
        InvalidArgumentError: not exactly one of value and ops.
        InvalidValueError: the value is not storable.
        InvalidOpError: the ops are not update ops nor a JSON Patch.
    """
    if (value is MISSING) == (ops is None):
        raise InvalidArgumentError("a timer writes a value or applies ops: give one of them")
    if ops is None:
        return _writes.encoder(options)(value), None
    op_style(ops)
    return None, _writes.encode_ops(options, ops)


def _cron_of(
    cron: object, tz: object, after: object, at: object, period: float | None
) -> tuple[str, str] | None:
    """``(cron, tz)`` of a cron timer, checked; None for another timer.

    Raises:
        InvalidArgumentError: a bad expression or zone; cron with another time; tz
            without cron.
    """
    if cron is None:
        if tz is not None:
            raise InvalidArgumentError("tz= is the zone of a cron= expression: give cron= too")
        return None
    if after is not None or at is not None or period is not None:
        raise InvalidArgumentError(
            "a cron timer fires at the times its expression names: not with after=, at= or every="
        )
    return check_cron(cron, "UTC" if tz is None else tz)


def restore(
    options: Options,
    timer_id: str,
    scope: str,
    key: str,
    value: Any,
    ops: object,
    due_in: float,
    every: float | None,
    cron: str | None = None,
    tz: str | None = None,
) -> Work[Timer]:
    """The work that puts back a timer of an export under its id (replacing a timer
    of that id, as a key's value is replaced): due ``due_in`` seconds from the write
    (<= 0: due at once), as ``schedule`` checks it.

    Raises:
        the errors of ``schedule``.
    """
    after = None if cron is not None or every is not None else due_in
    scheduled = schedule(
        options,
        scope,
        key,
        value,
        ops,
        after,
        None,
        every,
        cron=cron,
        tz=tz,
        timer_id=timer_id,
        first_in=due_in,
    )

    def work(txn: WriteTxn) -> Timer:
        txn.defer(DropTimer(timer_id))  # before the timer's row goes in: deferred too
        return scheduled(txn)

    return Work(work)


def check_timer_id(timer_id: object) -> str:
    """``timer_id`` if it is a str that could name a timer.

    Raises:
        InvalidArgumentError: not a str, or holding NUL or a lone surrogate (no timer
            has such an id; a database could not even compare it).
    """
    if type(timer_id) is not str:
        raise InvalidArgumentError(f"a timer id is a str, not {type(timer_id).__name__}")
    if timer_id:
        try:
            check_key(timer_id, "timer id")
        except ReactorError as exc:
            raise InvalidArgumentError(str(exc)) from None
    return timer_id


def drop_timer(timer_id: str) -> Work[bool]:
    """The work that cancels a timer: whether it was still pending."""

    def work(txn: WriteTxn) -> bool:
        return txn.writes.drop_timer(timer_id)

    return Work(work)


class AddTimer:
    """Deferred work that adds a timer's row (at the commit of a transaction body)."""

    __slots__ = ("row",)

    def __init__(self, row: TimerRow) -> None:
        self.row = row

    def __call__(self, commit: WriteTxn) -> None:
        commit.writes.add_timer(self.row, commit.now)


class DropTimer:
    """Deferred work that removes a timer's row, if it is still there."""

    __slots__ = ("timer_id",)

    def __init__(self, timer_id: str) -> None:
        self.timer_id = timer_id

    def __call__(self, commit: WriteTxn) -> None:
        commit.writes.drop_timer(self.timer_id)


def pending_timer(txn: WriteTxn, timer_id: str) -> TimerRow | None:
    """The timer ``timer_id`` as a transaction body sees it: the stored one, unless the
    body's own schedules and cancels (deferred to its commit, in order) say otherwise;
    None when there is none (never was, cancelled, or fired)."""
    row = None
    said = False
    for work in txn.deferred_work():
        if isinstance(work, AddTimer) and work.row.id == timer_id:
            row, said = work.row, True
        elif isinstance(work, DropTimer) and work.timer_id == timer_id:
            row, said = None, True
    return row if said else txn.statements.fetch_timer(timer_id)


def timer_of(row: TimerRow) -> Timer:
    return Timer(row.id, row.scope, row.key, row.due, row.every, row.cron, row.tz)


def following_due(row: TimerRow, now: float) -> float | None:
    """When recurring timer ``row``, firing at ``now``, is due next: its first period
    after ``now`` (missed ones fire once, not in a flood); None if it does not recur,
    or its cron expression names no time any more."""
    if row.cron is not None:
        try:
            return next_cron_time(row.cron, row.tz or "UTC", max(now, row.due))
        except ValueError:
            return None
    if row.every is None:
        return None
    return next_due(row.due, row.every, now)


def next_due(due: float, every: float, now: float) -> float:
    """The first time after ``now`` that is ``due`` plus a whole number of periods
    (``now + every`` where floats cannot count the periods: a tiny period, a far past)."""
    try:
        missed = math.floor((now - due) / every) + 1 if now >= due else 1
        later = due + missed * every
    except (OverflowError, ValueError):
        return now + every
    if later <= now:
        later += every
    if now >= due and not now < later <= now + every:
        return now + every  # floats could not count the periods
    return later


class Fired:
    """What firing requests did: timers fired, and those whose write failed."""

    __slots__ = ("error", "failed", "fired")

    def __init__(self) -> None:
        self.fired = 0
        self.failed: list[tuple[str, str]] = []  # (timer id, why)
        self.error: Exception | None = None  # what stopped them (the rest stay due)

    def add(self, other: Fired) -> None:
        self.fired += other.fired
        self.failed += other.failed


def fire(options: Options, scope: str, timers: list[tuple[str, str]]) -> Work[Fired]:
    """The work that fires the timers of ``timers`` (id, key: of ``scope``) that are
    still there and due when it runs, each as the write it holds.

    A few statements for the lot, not a few per timer: the rows of their keys are read
    ahead with the transaction's begin (``Work.reads``), the timers in one read, and
    their removal (or move to the next period) goes with the commit on PostgreSQL."""
    keys = tuple(dict.fromkeys((scope, key) for _, key in timers))

    def work(txn: WriteTxn) -> Fired:
        done = Fired()
        rows = txn.statements.fetch_timers([timer_id for timer_id, _ in timers])
        dropped: list[str] = []
        moved: list[tuple[str, float]] = []
        for timer_id, _ in timers:
            row = rows.get(timer_id)
            if row is None or row.scope != scope or row.due > txn.now:
                continue  # fired or cancelled elsewhere, or moved on (or replaced)
            done.fired += 1
            why = _apply(options, txn, row)
            if why is not None:
                done.failed.append((timer_id, why))
            following = following_due(row, txn.now)
            if following is None:
                dropped.append(timer_id)
            else:
                moved.append((timer_id, following))
        txn.writes.drop_timers(dropped)
        txn.writes.move_timers(moved)
        return done

    return Work(work, keys)


def drop_failed(scope: str, timer_id: str, why: str) -> Work[Fired]:
    """The work that drops timer ``timer_id`` (of ``scope``) without its write, which
    the database refused (``why``), if it is still there and due: counted as fired and
    failed; a recurring one moves to its next period."""

    def work(txn: WriteTxn) -> Fired:
        done = Fired()
        row = txn.statements.fetch_timers([timer_id]).get(timer_id)
        if row is None or row.scope != scope or row.due > txn.now:
            return done  # fired or cancelled elsewhere, or moved on
        done.fired = 1
        done.failed.append((timer_id, why))
        following = following_due(row, txn.now)
        if following is None:
            txn.writes.drop_timers([timer_id])
        else:
            txn.writes.move_timers([(timer_id, following)])
        return done

    return Work(work)


def _apply(options: Options, txn: WriteTxn, row: TimerRow) -> str | None:
    """Apply the write of timer ``row``, undone alone if it fails: why it failed, or
    None.

    Raises:
        StorageError: the database failed (the whole request does, and stays due).
    """
    mark = txn.savepoint()
    txn.timer = row.id
    try:
        if row.scope.startswith(QUEUE_PREFIX):  # a periodic put (``Queue.put_every``)
            assert row.value is not None
            _jobs.enqueue(txn, row.scope[len(QUEUE_PREFIX) :], [_jobs.Put(row.value)])
            return None
        if row.ops is None:
            assert row.value is not None
            write: Work[Any] = _writes.set_value(
                options, row.scope, row.key, decode(row.value), None, False
            )
        else:
            write = _writes.update(options, row.scope, row.key, decode(row.ops), None)
        result = write(txn)
        if isinstance(result, UpdateResult) and result.errors:
            return str(result.errors[0]["message"])
        return None
    except Exception as exc:  # one timer's failure is its own
        if not txn.rollback_to(mark) and not isinstance(exc, StorageError):
            # Its statements ran (a periodic put's): only the abort takes them back.
            raise Entangled(f"timer {row.id} failed after its statements: {exc}") from exc
        if isinstance(exc, StorageError):
            raise
        return f"{type(exc).__name__}: {exc}"
    finally:
        txn.timer = None


def new_timer_id() -> str:
    """A new timer's id: a UUIDv7, in scheduling order (a burst fires in runs of rows)."""
    import uuid6  # on first use: it loads importlib.metadata, a start-up cost for the CLI

    return uuid6.uuid7().hex
