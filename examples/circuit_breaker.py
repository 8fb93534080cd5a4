"""A circuit breaker per service: failures counted, the cooldown kept as a TTL.

    python examples/circuit_breaker.py            # a database in a temporary folder
    python examples/circuit_breaker.py state.db   # that file

Each failed call to a service increments "failures:SERVICE" in the scope "breakers". At
THRESHOLD failures the breaker opens: "open:SERVICE" is set with the cooldown as its
TTL, and while that key exists calls are refused without being tried. When the TTL runs
out the key expires and the breaker is half-open: the next call is a trial. Success
resets the count (closed); failure opens the breaker again for another cooldown.
(Every caller may try while half-open; to let one trial through, callers would first
take ``state.lock(f"trial:{service}", ttl=...)`` with ``acquire(blocking=False)``.)
Subscriptions react to the changes: one raises an alert when a breaker opens, one
notes when a cooldown is over. The state is in the database, so every process sharing
it sees the same breakers.
"""

from __future__ import annotations

import queue
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import reactor

THRESHOLD = 3  # failures that open the breaker
COOLDOWN = 0.5  # seconds the breaker stays open (minutes, in real life)
TIMEOUT = 5.0  # seconds to wait for an alert: they come within a second


class BreakerOpenError(Exception):
    """The breaker is open: the call was refused without being tried."""


def breaker_state(breakers: reactor.Scope, service: str) -> str:
    if breakers.exists(f"open:{service}"):
        return "open"
    if breakers.get(f"failures:{service}", 0) >= THRESHOLD:
        return "half-open"  # the cooldown is over, the failures are not forgiven yet
    return "closed"


def call(breakers: reactor.Scope, service: str, request: Callable[[], str]) -> str:
    """``request()`` through the breaker of ``service``.

    Raises:
        BreakerOpenError: the breaker is open; ``request`` was not called.
        Exception: whatever ``request`` raised, counted as a failure.
    """
    if breakers.exists(f"open:{service}"):
        left = breakers.ttl(f"open:{service}")
        raise BreakerOpenError(f"open for {max(left, 0):.1f} s more")
    try:
        result = request()
    except Exception:
        failures = breakers.increment(f"failures:{service}")  # atomic, across processes too
        if failures >= THRESHOLD:
            # The cooldown is the key's TTL: the breaker half-opens by itself, even if
            # the process that opened it is gone.
            breakers.set(f"open:{service}", {"failures": failures}, ttl=COOLDOWN)
        raise
    breakers.delete(f"failures:{service}")  # a success closes the breaker
    return result


def scripted(outcomes: list[bool]) -> Callable[[], str]:
    """A pretend remote service: each call succeeds or times out, as scripted."""

    def request() -> str:
        if not outcomes.pop(0):
            raise TimeoutError("no answer within 2 s")
        return "200 OK"

    return request


def run(path: Path) -> None:
    with reactor.open(path) as state:
        breakers = state.scope("breakers")
        breakers.clear()  # start afresh when the same file is used twice
        alerts: queue.Queue[str] = queue.Queue()  # what a pager or a chat would receive

        @state.on("breakers", key="open:*", events={"created"})
        def on_open(event: reactor.ChangeEvent) -> None:
            failures = event.new_value["failures"]
            alerts.put(f"ALERT {event.key.removeprefix('open:')}: open after {failures} failures")

        @state.on("breakers", key="open:*", events={"expired"})
        def on_cooled(event: reactor.ChangeEvent) -> None:
            alerts.put(f"note  {event.key.removeprefix('open:')}: cooldown over, half-open")

        def attempt(service: str, request: Callable[[], str]) -> None:
            try:
                outcome = call(breakers, service, request)
            except BreakerOpenError as exc:
                outcome = f"refused: {exc}"
            except TimeoutError as exc:
                outcome = f"failed: {exc}"
            print(f"{service:8} {outcome:38} -> {breaker_state(breakers, service)}")

        # Failures are counted per service: one failure of "search" is forgiven.
        search = scripted([False, True])
        attempt("search", search)
        attempt("search", search)

        outcomes = [False, False, False, False, True]
        payments = scripted(outcomes)
        for _ in range(THRESHOLD):
            attempt("payments", payments)
        attempt("payments", payments)  # refused: the service is not even called
        print(alerts.get(timeout=TIMEOUT))  # the subscriber saw the breaker open

        print(alerts.get(timeout=TIMEOUT))  # the key expired: the sweeper told us
        attempt("payments", payments)  # the trial fails: open again
        print(alerts.get(timeout=TIMEOUT))

        print(alerts.get(timeout=TIMEOUT))
        attempt("payments", payments)  # the trial succeeds: closed
        assert not outcomes, "every scripted call was made"
        assert breaker_state(breakers, "payments") == "closed"
        print("keys expired:", state.stats()["keys_expired"], "| breakers:", breakers.list())


def main() -> None:
    if len(sys.argv) > 1:
        run(Path(sys.argv[1]))
        return
    with tempfile.TemporaryDirectory() as folder:
        run(Path(folder) / "state.db")


if __name__ == "__main__":
    main()
