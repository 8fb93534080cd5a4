"""Time, injectable: TTLs and leases read a clock object, so tests never sleep."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    """Anything with ``time()`` returning epoch seconds as a float."""

    def time(self) -> float:
        """The current time, in seconds since the epoch."""
        ...


class SystemClock:
    """The real wall clock."""

    def time(self) -> float:
        return time.time()
