"""The lines of a backup (``reactor export``): the kinds of entry, and how one line is
read and checked before anything is written (``_exchange`` reads and writes files).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import orjson

from reactor._base.keys import QUEUE_PREFIX, check_key, check_writable
from reactor._base.values import DEFAULT_MAX_DEPTH, DEFAULT_MAX_VALUE_BYTES, MISSING, encode
from reactor._engine.options import Options
from reactor._work import jobs as _jobs
from reactor._work import timers as _timers
from reactor._work.queue_settings import Settings, check_settings
from reactor._work.writes import check_ttl, finite

__all__ = [
    "Backup",
    "Entry",
    "JobEntry",
    "QueueEntry",
    "TimerEntry",
    "entry_of",
    "parse_json",
]

KEY_FIELDS: Final = frozenset({"scope", "key", "value", "ttl"})
TIMER_FIELDS: Final = frozenset(
    {"timer", "scope", "key", "value", "ops", "due_in", "every", "cron", "tz"}
)
QUEUE_FIELDS: Final = frozenset(
    {"queue", "max_attempts", "concurrency", "group_concurrency", "rate", "backoff"}
)
JOB_FIELDS: Final = frozenset(
    {"queue", "item", "attempts", "state", "ready_in", "key", "priority", "group", "errors"}
)
JOB_STATES: Final = ("ready", "dead")
MAX_TIMER_ID: Final = 64  # characters: the column reactor_timers.id
MAX_ATTEMPTS: Final = 2**31 - 1  # the column reactor_jobs.attempts
# Lines are checked before the database is known: against the default limits (the
# database's own are checked again before its transaction begins).
_DEFAULTS: Final = Options()


class Entry(NamedTuple):
    """One key of an export: where it lives, its value, and its seconds left (or None)."""

    scope: str
    key: str
    value: Any
    ttl: float | None


class TimerEntry(NamedTuple):
    """One pending timer of an export: its id, the key it writes, what it writes (a
    value, or update ops; ``value`` is ``MISSING`` with ops), its seconds until due
    (<= 0: overdue) and its period (None: it fires once), or its cron expression and
    zone."""

    timer: str
    scope: str
    key: str
    value: Any
    ops: Any
    due_in: float
    every: float | None
    cron: str | None = None
    tz: str | None = None


class QueueEntry(NamedTuple):
    """A queue of an export and its settings (None: as the database has them; a
    setting absent or null in the line is lifted)."""

    queue: str
    settings: Settings | None


class JobEntry(NamedTuple):
    """One job of an export: its queue, item, takes so far, state (``"ready"`` or
    ``"dead"``), seconds until ready, idempotency key (or None), priority, group (or
    None) and the errors of its attempts (JSON text of a list, or None)."""

    queue: str
    item: Any
    attempts: int
    state: str
    ready_in: float
    key: str | None
    priority: int = 0
    group: str | None = None
    errors: str | None = None


@dataclass(slots=True)
class Backup:
    """The checked lines of an import, by kind, each in file order."""

    keys: list[Entry] = field(default_factory=list)
    timers: list[TimerEntry] = field(default_factory=list)
    queues: list[QueueEntry] = field(default_factory=list)
    jobs: list[JobEntry] = field(default_factory=list)

    def add(self, line: Entry | TimerEntry | QueueEntry | JobEntry) -> None:
        if isinstance(line, Entry):
            self.keys.append(line)
        elif isinstance(line, TimerEntry):
            self.timers.append(line)
        elif isinstance(line, QueueEntry):
            self.queues.append(line)
        else:
            self.jobs.append(line)


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


class _BadLine(ValueError):
    """A line that is JSON but not a key, a timer, a queue or a job."""


def entry_of(line: str | bytes) -> Entry | TimerEntry | QueueEntry | JobEntry:
    """The entry a line holds, of the kind its fields tell."""
    try:
        data = parse_json(line)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise _BadLine(f"expected an object, not {type(data).__name__}")
    if "timer" in data:
        return _timer(data)
    if "queue" in data:
        # Any field of a job's but the queue makes it a job: a typo is then named.
        return _job(data) if data.keys() & (JOB_FIELDS - {"queue"}) else _queue(data)
    return _entry(data)


def _fields(data: dict[str, Any], allowed: frozenset[str], required: Iterable[str]) -> None:
    """Raises:
    _BadLine: a field of ``required`` is missing, or one not ``allowed`` is there."""
    missing = sorted(set(required) - data.keys())
    if missing:
        raise _BadLine(f"missing {', '.join(map(repr, missing))}")
    unknown = sorted(data.keys() - allowed)
    if unknown:
        raise _BadLine(f"unknown field {', '.join(map(repr, unknown))}")


def _entry(data: dict[str, Any]) -> Entry:
    _fields(data, KEY_FIELDS, ("scope", "key", "value"))
    ttl = data.get("ttl")
    if ttl is not None and (type(ttl) not in (int, float) or not 0 < ttl < float("inf")):
        raise _BadLine(f"'ttl' must be a number of seconds > 0 or null, not {ttl!r}")
    value = data["value"]
    encode(value, max_depth=DEFAULT_MAX_DEPTH, max_bytes=DEFAULT_MAX_VALUE_BYTES)
    # A key of a scope of events (queue:NAME) is not a line an export writes: a
    # queue's events are its jobs, exported as job lines.
    scope = check_writable(check_key(data["scope"], "scope name"))
    return Entry(scope, check_key(data["key"]), value, None if ttl is None else float(ttl))


def _timer(data: dict[str, Any]) -> TimerEntry:
    _fields(data, TIMER_FIELDS, ("timer", "scope", "key", "due_in"))
    timer_id = _timers.check_timer_id(data["timer"])
    if not 0 < len(timer_id) <= MAX_TIMER_ID:
        raise _BadLine(f"a timer id has 1 to {MAX_TIMER_ID} characters, not {len(timer_id)}")
    scope = check_key(data["scope"], "scope name")
    # A queue's timer is a periodic put (Queue.put_every): a value, the job's item.
    if not (scope.startswith(QUEUE_PREFIX) and "value" in data and "ops" not in data):
        check_writable(scope)
    due_in = finite(data["due_in"])
    if due_in is None:
        raise _BadLine(f"'due_in' must be a finite number of seconds, not {data['due_in']!r}")
    every = check_ttl(data.get("every"), "'every'")
    key, value, ops = data["key"], data.get("value", MISSING), data.get("ops")
    cron, tz = data.get("cron"), data.get("tz")
    # What scheduling it checks (the key, one of value and ops, ops that are ops, a
    # cron expression and zone).
    _timers.restore(_DEFAULTS, timer_id, scope, key, value, ops, due_in, every, cron, tz)
    return TimerEntry(timer_id, scope, key, value, ops, due_in, every, cron, tz)


def _queue(data: dict[str, Any]) -> QueueEntry:
    _fields(data, QUEUE_FIELDS, ("queue",))
    name = _jobs.check_queue(data["queue"])
    if data.keys() == {"queue"}:
        return QueueEntry(name, None)
    # A setting absent or null in the line is lifted (the export writes those it has).
    limits = [data.get(name) for name in ("concurrency", "group_concurrency", "rate", "backoff")]
    settings = check_settings(
        data.get("max_attempts"), *[False if value is None else value for value in limits]
    )
    return QueueEntry(name, settings)


def _error_text(error: object) -> bool:
    return error is None or isinstance(error, str)


def _job(data: dict[str, Any]) -> JobEntry:
    _fields(data, JOB_FIELDS, ("queue", "item"))
    attempts = data.get("attempts", 0)
    if type(attempts) is not int or not 0 <= attempts <= MAX_ATTEMPTS:
        raise _BadLine(f"'attempts' must be an int >= 0, not {attempts!r}")
    state = data.get("state", "ready")
    if not isinstance(state, str) or state not in JOB_STATES:
        raise _BadLine(f"'state' must be 'ready' or 'dead', not {state!r}")
    ready_in = finite(data.get("ready_in", 0))
    if ready_in is None or ready_in < 0:
        raise _BadLine(
            f"'ready_in' must be a finite number of seconds >= 0, not {data['ready_in']!r}"
        )
    item, key = data["item"], data.get("key")
    priority, group = data.get("priority", 0), data.get("group")
    name, _ = _jobs.check_put(_DEFAULTS, data["queue"], item, ready_in, key, priority, group)
    errors = data.get("errors")
    if errors is not None and not (
        isinstance(errors, list)
        and all(isinstance(entry, dict) and _error_text(entry.get("error")) for entry in errors)
    ):
        raise _BadLine(
            f"'errors' must be a list of objects with an 'error' (text or null), not {errors!r}"
        )
    text = None if not errors else orjson.dumps(errors).decode()
    return JobEntry(name, item, attempts, state, ready_in, key, priority, group, text)
