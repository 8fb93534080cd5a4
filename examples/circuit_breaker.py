"""A circuit breaker per service: failures counted, the cooldown ended by a timer.

    python examples/circuit_breaker.py            # a database in a temporary folder
    python examples/circuit_breaker.py state.db   # that file

Each service has one key in the scope "breakers": {"state": "closed" | "open" |
"half-open", "failures": n}. Each failed call counts; at THRESHOLD failures the breaker
opens, and in the same transaction a timer is scheduled to set it half-open when the
cooldown is over. While open, calls are refused without being tried. Half-open, the next
call is a trial: success closes the breaker, failure opens it again (and schedules the
next timer). The timer is in the database: it fires once, in whichever process has the
database open, even if the one that opened the breaker is gone. Subscriptions react: one
raises an alert when a breaker opens, one notes when the timer half-opened it (the
event's ``timer`` says it was the timer's write).
"""

from __future__ import annotations

import queue
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import reactor
from reactor import ops

THRESHOLD = 3  # failures that open the breaker
COOLDOWN = 1.0  # seconds the breaker stays open (minutes, in real life)
TIMEOUT = 5.0  # seconds to wait for an alert: they come within a second

CLOSED = {"state": "closed", "failures": 0}


class BreakerOpenError(Exception):
    """The breaker is open: the call was refused without being tried."""


def breaker_state(breakers: reactor.Scope, service: str) -> str:
    state: str = breakers.get(service, CLOSED)["state"]
    return state


def call(breakers: reactor.Scope, service: str, request: Callable[[], str]) -> str:
    """``request()`` through the breaker of ``service``.

    Raises:
        BreakerOpenError: the breaker is open; ``request`` was not called.
        Exception: whatever ``request`` raised, counted as a failure.
    """
    if breaker_state(breakers, service) == "open":
        raise BreakerOpenError("open until its timer half-opens it")
    try:
        result = request()
    except Exception:
        # One transaction: the count, the opening and the timer that ends it, together.
        with breakers.transaction() as tx:
            breaker = tx.get(service, CLOSED)
            failures = breaker["failures"] + 1
            if failures >= THRESHOLD and breaker["state"] != "open":
                tx.set(service, {"state": "open", "failures": failures})
                tx.schedule(service, ops=[ops.set("state", "half-open")], after=COOLDOWN)
            else:
                tx.set(service, {**breaker, "failures": failures})
        raise
    breakers.set(service, CLOSED)  # a success closes the breaker
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

        @state.on("breakers", where=lambda event: (event.new_value or {}).get("state") == "open")
        def on_open(event: reactor.ChangeEvent) -> None:
            failures = event.new_value["failures"]
            alerts.put(f"ALERT {event.key}: open after {failures} failures")

        @state.on("breakers", where=lambda event: event.timer is not None)
        def on_cooled(event: reactor.ChangeEvent) -> None:
            alerts.put(f"note  {event.key}: cooldown over, {event.new_value['state']} (timer)")

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
        print("timers:", [(t.key, t.every) for t in state.timers("breakers")])
        attempt("payments", payments)  # refused: the service is not even called
        print(alerts.get(timeout=TIMEOUT))  # the subscriber saw the breaker open

        print(alerts.get(timeout=TIMEOUT))  # the timer fired: half-open
        attempt("payments", payments)  # the trial fails: open again, a new timer
        print(alerts.get(timeout=TIMEOUT))

        print(alerts.get(timeout=TIMEOUT))
        attempt("payments", payments)  # the trial succeeds: closed
        assert not outcomes, "every scripted call was made"
        assert breaker_state(breakers, "payments") == "closed"
        print("timers fired:", state.stats()["timers"]["fired"], "| breakers:", breakers.list())


def main() -> None:
    if len(sys.argv) > 1:
        run(Path(sys.argv[1]))
        return
    with tempfile.TemporaryDirectory() as folder:
        run(Path(folder) / "state.db")


if __name__ == "__main__":
    main()
