"""The values verbs return.

No ``from __future__ import annotations``: the fields' annotations stay objects, so
``typing.get_type_hints`` works on these classes although their ``__module__`` is
``reactor``, which does not define ``Any``.
"""

from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "Change",
    "Derived",
    "Entry",
    "RunInfo",
    "Snapshot",
    "StepInfo",
    "Timer",
    "UpdateResult",
    "Upkeep",
]


class Change(NamedTuple):
    """What a write did to one key: its value before and after."""

    old_value: Any
    """The value before the write; None when the key was absent."""
    new_value: Any
    """The value after the write; None when the key is absent."""


class UpdateResult(NamedTuple):
    """What ``update`` did: the value before and after, and the ops that did not apply."""

    old_value: Any
    """The value before the update; None when the key was absent."""
    new_value: Any
    """The value after the update (the old one when nothing applied); None when absent."""
    errors: list[dict[str, Any]]
    """The ops that did not apply, in order: each ``{"index", "op", "code", "message"}``,
    with ``code`` one of ``invalid_op``, ``path_not_found``, ``type_mismatch``,
    ``test_failed``."""


class Snapshot(NamedTuple):
    """Every live key-value of a scope, and the revision they are current at."""

    values: dict[str, Any]
    """Every live key and its value, sorted by key."""
    revision: int
    """The database revision the values are current at."""


class Entry(NamedTuple):
    """A live key's value with its versions (``Scope.entry``)."""

    value: Any
    """The value (a fresh copy)."""
    revision: int
    """The revision of the key's last change: what ``if_revision=`` compares with."""
    created_revision: int
    """The revision that created the key (since it last did not exist)."""
    version: int
    """1 at creation, +1 at each change since."""
    expires_at: float | None
    """When the key expires (epoch seconds), or None."""


class Derived(NamedTuple):
    """A derived value as published (``DerivedValue.subscribe``, ``watch``)."""

    value: Any
    """The new result."""
    old_value: Any
    """The result published before it (None for the first)."""
    revision: int
    """The revision it is consistent with: every read it made was as of this one."""


class Timer(NamedTuple):
    """A scheduled write (``Scope.schedule``), as ``State.timers()`` lists it."""

    id: str
    """The timer's id: what ``State.cancel_timer`` takes, and ``ChangeEvent.timer`` shows."""
    scope: str
    """The scope of the key it writes."""
    key: str
    """The key it writes."""
    due: float
    """When it fires next (epoch seconds)."""
    every: float | None
    """Its period in seconds if it recurs every so many seconds, else None."""
    cron: str | None = None
    """The cron expression naming the times it fires, if it is a cron timer."""
    tz: str | None = None
    """The IANA time zone its ``cron`` expression is read in (a cron timer's)."""


@dataclass(frozen=True)
class Upkeep:
    """What one round of upkeep did (``reactor.testing.run_upkeep``)."""

    keys_expired: int = 0
    """Keys whose TTL had run out, deleted (each with its ``expired`` event)."""
    timers_fired: int = 0
    """Timers that came due and fired (those of ``timers_failed`` too), as
    ``stats()["timers"]["fired"]`` counts them."""
    timers_failed: int = 0
    """Timers whose write failed (a type mismatch, say), dropped or moved to their next
    period, as ``stats()["timers"]["failed"]`` counts them."""
    leases_turned_back: int = 0
    """Queue jobs whose lease ran out: ready again, or dead after their last attempt."""
    log_compacted: int = 0
    """Change-log records dropped beyond the retention (``log_retention``...)."""


@dataclass(frozen=True)
class StepInfo:
    """A recorded step of a workflow's run (``RunInfo.steps``)."""

    name: str
    """Its name (``sleep``, ``receive:TOPIC``, ``call:WORKFLOW``... for suspensions)."""
    status: str
    """``"succeeded"``, ``"failed"`` or ``"waiting"`` (a suspension not over yet)."""
    result: Any
    """What it returned (None unless it succeeded)."""
    error: dict[str, str] | None
    """What it raised past its retries: ``{"type": ..., "message": ...}``."""
    started: float
    """When it began (epoch seconds)."""
    ended: float | None
    """When it was recorded as done (None while waiting)."""


@dataclass(frozen=True)
class RunInfo:
    """A workflow's run as recorded (``state.run_info``, ``state.runs``)."""

    id: str
    """The run's id, unique in the database."""
    workflow: str
    """The workflow's name (its events are in scope ``run:WORKFLOW``)."""
    status: str
    """``pending``, ``running``, ``suspended``, ``succeeded``, ``failed`` or ``cancelled``."""
    input: Any
    """What it was started with."""
    result: Any
    """What the workflow returned (None unless it succeeded)."""
    error: dict[str, str] | None
    """Why it failed: ``{"type": ..., "message": ...}``."""
    attempts: int
    """1 at its first take, one more each time it was taken again after a lease ran out."""
    steps: list[StepInfo]
    """Its recorded steps, in order."""
    created: float
    """When it was started (epoch seconds)."""
    updated: float
    """When it last changed (epoch seconds)."""
