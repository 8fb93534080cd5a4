"""Cron timers' times (SPEC §13, "Cron timers"): when a five-field cron expression next
names, in an IANA time zone, read by ``cronsim`` (Healthchecks' cron reader: Debian
cron's rules, local wall-clock times across DST changes: a time a change skips fires
once, right after it; a time it repeats fires once, the first time).
"""

from __future__ import annotations

import datetime as dt
import zoneinfo

from cronsim import CronSim, CronSimError

from reactor.errors import InvalidArgumentError

__all__ = ["check_cron", "next_cron_time"]

_FIELDS = 5  # minute hour day-of-month month day-of-week: no seconds, no years


def _zone(tz: str) -> zoneinfo.ZoneInfo:
    return zoneinfo.ZoneInfo(tz)  # cached by zoneinfo itself: one object per name


def check_cron(cron: object, tz: object) -> tuple[str, str]:
    """``(cron, tz)`` if ``cron`` is a five-field expression that names a time, and
    ``tz`` an IANA zone.

    Raises:
        InvalidArgumentError: either is not.
    """
    if type(cron) is not str:
        raise InvalidArgumentError(f"cron is a str, not {type(cron).__name__}")
    if type(tz) is not str:
        raise InvalidArgumentError(f"tz is an IANA time zone name, not {tz!r}")
    fields = cron.split()
    if len(fields) != _FIELDS:
        raise InvalidArgumentError(
            f"cron takes the five standard fields (minute hour day month weekday), not {cron!r}"
        )
    try:
        zone = _zone(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InvalidArgumentError(f"tz {tz!r} is not an IANA time zone") from None
    normal = " ".join(fields)
    try:
        next_cron_time(normal, tz, dt.datetime.now(zone).timestamp())
    except CronSimError as exc:
        raise InvalidArgumentError(f"cron {cron!r} is not a cron expression: {exc}") from None
    except ValueError:  # cronsim read it, but it names no time in the next 50 years
        raise InvalidArgumentError(f"cron {cron!r} names no time in the next 50 years") from None
    return normal, tz


def next_cron_time(cron: str, tz: str, after: float) -> float:
    """The first time (epoch seconds) after ``after`` that ``cron`` names in zone ``tz``
    (both checked by ``check_cron``).

    Raises:
        ValueError: it names no time in the 50 years after ``after``.
    """
    start = dt.datetime.fromtimestamp(after, _zone(tz))
    try:
        return next(CronSim(cron, start)).timestamp()
    except StopIteration:
        raise ValueError(f"cron {cron!r} names no time in the 50 years after {start}") from None
