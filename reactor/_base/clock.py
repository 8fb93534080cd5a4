"""Time, injectable: TTLs and leases read a clock object, so tests never sleep."""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """Anything with ``time()`` returning epoch seconds as a float."""

    def time(self) -> float:
        """The current time, in seconds since the epoch."""
        ...


class SystemClock:
    """The real wall clock."""

    # The builtin itself, not a method that calls it: every read and write asks the time.
    time = staticmethod(time.time)


class ManualClock:
    """A clock that moves only when told to (``reactor.testing``): pass it to
    ``reactor.open(..., clock=...)`` and TTLs, timers and leases follow it, with no
    test sleeping. Safe to read and move from any thread.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ManualClock({self.time()!r})"

    def time(self) -> float:
        """The clock's time, in seconds since the epoch."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward (back, if negative)."""
        with self._lock:
            self._now += seconds

    def set(self, t: float) -> None:
        """Set the clock to ``t``, seconds since the epoch (back in time too)."""
        with self._lock:
            self._now = float(t)
