"""``Options``: the settings ``open()`` resolves, checked once, read by every part of an
engine."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

from reactor._base.clock import Clock, SystemClock
from reactor._base.codecs import Codec
from reactor._base.values import DEFAULT_MAX_DEPTH, DEFAULT_MAX_VALUE_BYTES, MAX_DEPTH_LIMIT
from reactor.errors import InvalidArgumentError

__all__ = [
    "DURABILITIES",
    "MAX_TIMEOUT",
    "SWEEP_INTERVALS",
    "Durability",
    "Options",
    "with_codec",
]

Durability = Literal["normal", "full", "memory"]
"""What an acknowledged commit survives: ``"normal"`` (the default) the process being
killed, ``"full"`` also a power loss, ``"memory"`` nothing (no file is written)."""

DURABILITIES: Final[tuple[Durability, ...]] = get_args(Durability)
MAX_TIMEOUT: Final = 1_000_000.0  # seconds (11 days): 2**31 - 1 ms is 24 days
# The sweep interval's bounds, in seconds: from a busy loop's pace (what the sweeper
# waits at least between rounds anyway) to 11 days (tests that run the upkeep by hand).
SWEEP_INTERVALS: Final = (0.01, 1_000_000.0)


@dataclass(frozen=True)
class Options:
    """The options of ``open``, resolved.

    Raises:
        InvalidArgumentError: an option is out of range (on construction).
    """

    durability: Durability = "normal"
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    max_depth: int = DEFAULT_MAX_DEPTH
    max_actors: int = 64
    log_retention: int | None = 100_000
    log_retention_seconds: float | None = None
    timeout: float = 30.0
    readonly: bool = False
    sweep_interval: float = 0.25  # seconds between sweeps: expiry events within a second
    clock: Clock = field(default_factory=SystemClock, compare=False)
    # What turns a handle's typed values into plain JSON before they are checked: a
    # handle's, never the engine's (``with_codec``), so not an option to compare.
    codec: Codec | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # The Literal type stops typed callers only: check for the others.
        if self.durability not in DURABILITIES:
            raise InvalidArgumentError(
                f"durability must be one of {', '.join(DURABILITIES)}, not {self.durability!r}"
            )
        _positive_int("max_value_bytes", self.max_value_bytes)
        _positive_int("max_depth", self.max_depth)
        if self.max_depth > MAX_DEPTH_LIMIT:
            raise InvalidArgumentError(f"max_depth is at most {MAX_DEPTH_LIMIT}")
        _positive_int("max_actors", self.max_actors)
        if self.log_retention is not None:
            _positive_int("log_retention", self.log_retention)
        if self.log_retention_seconds is not None:
            _positive_number("log_retention_seconds", self.log_retention_seconds)
        _positive_number("timeout", self.timeout)
        if self.timeout > MAX_TIMEOUT:  # the drivers take it in milliseconds, as a C int
            raise InvalidArgumentError(f"timeout is at most {MAX_TIMEOUT:,.0f} seconds")
        _positive_number("sweep_interval", self.sweep_interval)
        low, high = SWEEP_INTERVALS
        if not low <= self.sweep_interval <= high:
            raise InvalidArgumentError(
                f"sweep_interval must be between {low} and {high:,.0f} seconds, "
                f"not {self.sweep_interval!r}"
            )
        if type(self.readonly) is not bool:
            raise InvalidArgumentError(f"readonly must be True or False, not {self.readonly!r}")
        if not callable(getattr(self.clock, "time", None)):
            raise InvalidArgumentError("clock must have a time() method")


def _positive_int(name: str, value: object) -> None:
    if type(value) is not int or value <= 0:
        raise InvalidArgumentError(f"{name} must be an int > 0, not {value!r}")


def _positive_number(name: str, value: object) -> None:
    if (
        type(value) not in (int, float)
        or not math.isfinite(value)  # type: ignore[arg-type]
        or value <= 0  # type: ignore[operator]
    ):
        raise InvalidArgumentError(f"{name} must be a number > 0, not {value!r}")


_coded: dict[tuple[int, int], tuple[Options, Codec, Options]] = {}


def with_codec(options: Options, codec: Codec) -> Options:
    """``options`` with ``codec``: what a handle opened with a codec encodes with (made
    once per engine and codec, then shared). Keyed by identity: options that compare
    equal may hold other clocks."""
    key = (id(options), id(codec))
    known = _coded.get(key)
    if known is not None and known[0] is options and known[1] is codec:
        return known[2]
    if len(_coded) >= 256:  # engines come and go in long-lived test runs
        _coded.clear()
    made = dataclasses.replace(options, codec=codec)
    _coded[key] = (options, codec, made)
    return made
