"""``Progress``: how an engine's upkeep is getting on, as its thread records it.

A round of chores is a sign of life whether it succeeds or fails: a round waiting for
another process's lock ends within the engine's timeout, and a database that fails
every round is a problem of the database, not of this process. So liveness asks how
long the chore under way has run (a thread wedged for good never ends it), and
failures are counted apart, with the first one's time and the last one's reason, for
readiness and monitoring. A request a round sent a scope's actor (the expiry of its
keys, say) that failed makes every round fail until the same request succeeds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Final

from reactor._engine.stats import UpkeepProgress

__all__ = ["LOG_EVERY", "Progress"]

LOG_EVERY: Final = 240  # failing rounds in a row between two log lines (a minute or so)


class Progress:
    """What the upkeep's rounds did: counts, times (``time.monotonic``), failures."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rounds = 0  # rounds of chores done, failed ones too
        self.last_round: float | None = None  # when the last one ended
        self.busy_since: float | None = None  # when the chore under way began
        self.failing = 0  # rounds that failed in a row, up to now
        self.failing_since: float | None = None  # when the first of them failed
        self.last_error: str | None = None  # why the last one failed
        self._requests: dict[str, str] = {}  # request that failed last time -> why

    def snapshot(self, running: bool) -> UpkeepProgress:
        return UpkeepProgress(
            rounds=self.rounds,
            last_round=self.last_round,
            failing=self.failing,
            running=running,
            busy_since=self.busy_since,
            failing_since=self.failing_since,
            last_error=self.last_error,
        )

    def chore(self) -> None:
        """A chore begins."""
        self.busy_since = time.monotonic()

    def request_ended(self, request: str, error: str | None) -> None:
        """A request a round sent (``request`` names it: the same name each round) ended,
        failed with ``error`` unless None: until it succeeds, every round fails."""
        with self._lock:
            if error is None:
                self._requests.pop(request, None)
            else:
                self._requests[request] = error

    def still_due(self, kind: str, scopes: Iterable[str]) -> None:
        """The scopes whose ``kind`` of request (``expire``, ``fire``) is in flight or
        sent again: a failure of another's is forgotten (nothing of it is due now)."""
        names = {f"{kind} {scope}" for scope in scopes}
        with self._lock:
            for request in [r for r in self._requests if r.startswith(kind + " ")]:
                if request not in names:
                    del self._requests[request]

    def ended(self, error: str | None = None) -> bool:
        """A round ended, failed with ``error`` unless None (or by a failed request);
        whether it is a failure to log (the first in a row, then one in ``LOG_EVERY``)."""
        with self._lock:
            late = next(reversed(self._requests.values()), None)
        now = time.monotonic()
        self.rounds += 1
        self.last_round = now
        self.busy_since = None
        error = error or late
        if error is None:
            self.failing = 0
            self.failing_since = None
            return False
        self.failing += 1
        if self.failing == 1:
            self.failing_since = now
        self.last_error = error
        return self.failing == 1 or self.failing % LOG_EVERY == 0
