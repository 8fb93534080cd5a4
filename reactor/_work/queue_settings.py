"""A queue's settings (SPEC §13, Queues and "Flow control on queues"): how many takes
a job gets, how many jobs may be taken at once (in all, and per group), how many takes
a window of time allows, and the backoff between attempts.

A handle carries the settings it was given (``Settings``: None keeps what is stored,
``False`` lifts a limit); its first write stores them in the queue's row
(``QueueRow``), which every process reads in each transaction of the queue: a limit is
the database's, not a process's.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final, Literal, TypedDict

from reactor._storage.records import QueueRow
from reactor.errors import InvalidArgumentError

if TYPE_CHECKING:
    from reactor._storage.statements import JobWrites

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "QueueOptions",
    "Settings",
    "backoff_delay",
    "check_max_attempts",
    "check_settings",
    "replace_next_id",
    "save",
    "settled",
]

DEFAULT_MAX_ATTEMPTS: Final = 5
_MOST: Final = 2**31  # the columns are 32-bit integers

# A limit given, or False to lift the one stored, or None to keep it.
Limit = int | Literal[False] | None
Pair = tuple[float, float]


class QueueOptions(TypedDict, total=False):
    """A queue's flow control and backoff, as ``state.queue`` takes them."""

    concurrency: int | Literal[False] | None
    group_concurrency: int | Literal[False] | None
    rate: tuple[int, float] | Literal[False] | None
    backoff: tuple[float, float] | Literal[False] | None


@dataclass(frozen=True, slots=True)
class Settings:
    """What a handle was given: each None keeps the stored value, ``False`` lifts it."""

    max_attempts: int | None = None
    concurrency: Limit = None
    group_concurrency: Limit = None
    rate: tuple[int, float] | Literal[False] | None = None
    backoff: Pair | Literal[False] | None = None


def check_max_attempts(max_attempts: object) -> int | None:
    """Raises:
    InvalidArgumentError: not None nor an int >= 1."""
    if max_attempts is None:
        return None
    if type(max_attempts) is not int or not 1 <= max_attempts < _MOST:
        raise InvalidArgumentError(f"max_attempts must be an int >= 1, not {max_attempts!r}")
    return max_attempts


def _limit(value: object, name: str) -> Limit:
    if value is None or value is False:
        return value
    if type(value) is not int or not 1 <= value < _MOST:
        raise InvalidArgumentError(
            f"{name} must be an int >= 1 (or False to lift it, None to keep it), not {value!r}"
        )
    return value


def _positive(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{what} must be a number of seconds, not {value!r}")
    seconds = float(value) if abs(value) < 1e300 else math.inf
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidArgumentError(f"{what} must be a finite number > 0, not {value!r}")
    return seconds


def _rate(rate: object) -> tuple[int, float] | Literal[False] | None:
    if rate is None or rate is False:
        return rate
    if not isinstance(rate, tuple | list) or len(rate) != 2:
        raise InvalidArgumentError(
            f"rate must be (limit, seconds), or False to lift it, not {rate!r}"
        )
    limit, seconds = rate
    if type(limit) is not int or not 1 <= limit < _MOST:
        raise InvalidArgumentError(f"rate's limit must be an int >= 1, not {limit!r}")
    return limit, _positive(seconds, "rate's seconds")


def _backoff(backoff: object) -> Pair | Literal[False] | None:
    if backoff is None or backoff is False:
        return backoff
    if not isinstance(backoff, tuple | list) or len(backoff) != 2:
        raise InvalidArgumentError(
            f"backoff must be (base, maximum) in seconds, or False to lift it, not {backoff!r}"
        )
    base = _positive(backoff[0], "backoff's base")
    most = _positive(backoff[1], "backoff's maximum")
    if most < base:
        raise InvalidArgumentError(f"backoff's maximum ({most}) is below its base ({base})")
    return base, most


def check_settings(
    max_attempts: object = None,
    concurrency: object = None,
    group_concurrency: object = None,
    rate: object = None,
    backoff: object = None,
) -> Settings | None:
    """The settings a handle was given (None: none at all).

    Raises:
        InvalidArgumentError: a setting of the wrong type or out of range.
    """
    settings = Settings(
        check_max_attempts(max_attempts),
        _limit(concurrency, "concurrency"),
        _limit(group_concurrency, "group_concurrency"),
        _rate(rate),
        _backoff(backoff),
    )
    return None if settings == Settings() else settings


def settled(found: QueueRow | None, settings: Settings | None) -> QueueRow:
    """The queue's row once ``settings`` are applied to the row ``found`` (None: no
    queue yet: a new one's defaults)."""
    row = found or QueueRow(DEFAULT_MAX_ATTEMPTS, 1)
    if settings is None:
        return row
    changes: dict[str, object] = {}
    if settings.max_attempts is not None:
        changes["max_attempts"] = settings.max_attempts
    for name in ("concurrency", "group_concurrency"):
        value = getattr(settings, name)
        if value is not None:
            changes[name] = value or None
    if settings.rate is not None:
        changes["rate_limit"], changes["rate_seconds"] = settings.rate or (None, None)
    if settings.backoff is not None:
        changes["backoff_base"], changes["backoff_max"] = settings.backoff or (None, None)
    return replace(row, **changes)  # type: ignore[arg-type]


def replace_next_id(row: QueueRow, next_id: int) -> QueueRow:
    """``row`` with the id its next job takes moved on to ``next_id``."""
    if row.next_id == next_id:
        return row
    return QueueRow(  # not dataclasses.replace: a put's path counts its calls
        row.max_attempts,
        next_id,
        row.concurrency,
        row.group_concurrency,
        row.rate_limit,
        row.rate_seconds,
        row.backoff_base,
        row.backoff_max,
    )


def save(jobs: JobWrites, queue: str, row: QueueRow, found: QueueRow | None) -> None:
    """Write the queue's ``row`` if it is new or differs from the one ``found``; a rate
    limit lifted forgets its window."""
    if found is None:
        jobs.add_queue(queue, row)
    elif row != found:
        jobs.set_queue(queue, row)
        if found.rate_limit is not None and row.rate_limit is None:
            jobs.drop_takes(queue)


def backoff_delay(row: QueueRow, attempts: int) -> float | None:
    """The pause before a failed job's next attempt, after ``attempts`` takes: the base
    doubled for each attempt after the first, up to the maximum, then drawn between its
    half and itself (jitter, so that jobs that failed together do not come back
    together). None: the queue has no backoff."""
    base, most = row.backoff_base, row.backoff_max
    if base is None or most is None:
        return None
    full = min(most, base * 2.0 ** min(max(attempts - 1, 0), 1000))
    return random.uniform(full / 2, full)
