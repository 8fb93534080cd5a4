"""A webhook sender under flow control: one call at a time per customer, four at once
in all, at most 20 a second, failed calls retried with backoff, and dead letters that
say why.

    python examples/webhook_sender.py            # a database in a temporary folder
    python examples/webhook_sender.py state.db   # that file

Four worker threads share the queue "webhooks" (processes would share it the same
way: the limits are the queue's, in the database). Customer "acme"'s endpoint answers
503: its calls are retried (0.05 s, then 0.1 s, with jitter) and die after three
attempts, each attempt's error kept. A burst of five "profile changed" events of one
customer, debounced, makes one call. An urgent call (priority 10) goes before the rest.
The workers record when each call starts and ends, and the end checks the limits.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

import reactor

CONCURRENCY, PER_CUSTOMER, RATE = 4, 1, (20, 1.0)
LEASE = 10.0


class Endpoints:
    """Stand-in customers' endpoints: records each call's start and end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[float, float, str]] = []  # start, end, customer

    def post(self, customer: str, body: object) -> None:
        """Deliver ``body`` to ``customer``'s endpoint."""
        del body  # a stand-in: sent nowhere
        start = time.monotonic()
        time.sleep(0.02)  # the call
        with self.lock:
            self.calls.append((start, time.monotonic(), customer))
        if customer == "acme":
            raise ConnectionError(f"HTTP 503 from https://{customer}.example/hook")


def work(queue: reactor.Queue, endpoints: Endpoints, sent: list[dict[str, object]]) -> None:
    while (job := queue.take(timeout=1.5, lease=LEASE)) is not None:
        try:
            endpoints.post(job.item["customer"], job.item["body"])
        except ConnectionError as exc:
            job.nack(error=exc)  # after the queue's backoff; dead after 3 attempts
        else:
            job.ack()
            sent.append(job.item["body"])


def most_at_once(calls: list[tuple[float, float, str]]) -> int:
    """The most calls that overlapped in time."""
    edges = sorted([(start, 1) for start, _, _ in calls] + [(end, -1) for _, end, _ in calls])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def main(path: str) -> None:
    with reactor.open(path) as state:
        webhooks = state.queue(
            "webhooks",
            max_attempts=3,
            concurrency=CONCURRENCY,
            group_concurrency=PER_CUSTOMER,
            rate=RATE,
            backoff=(0.05, 0.2),
        )
        webhooks.purge()  # a second run on the same file starts afresh
        since = state.stats()["revision"]
        for n in range(6):
            for customer in ("initech", "globex", "acme"):
                body = {"event": "order.paid", "n": n}
                webhooks.put({"customer": customer, "body": body}, group=customer)
        for version in range(5):  # a burst: one call, with the last version
            body = {"event": "profile.changed", "version": version}
            webhooks.put(
                {"customer": "globex", "body": body},
                key="globex:profile",
                debounce=0.2,
                group="globex",
            )
        urgent = {"customer": "initech", "body": {"event": "refund", "urgent": True}}
        webhooks.put(urgent, priority=10, group="initech")

        endpoints, sent = Endpoints(), []  # type: Endpoints, list[dict[str, object]]
        workers = [
            threading.Thread(target=work, args=(webhooks, endpoints, sent)) for _ in range(4)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=60)

        # The takes, from the queue's events in commit order: when each was taken (its
        # lease's end less the lease) and what.
        takes = [
            (event.new_value["ready_at"] - LEASE, event.new_value["item"])
            for event in state.changes(since, scope="queue:webhooks", limit=10_000)
            if event.new_value is not None
            and event.new_value["state"] == "taken"
            and (event.old_value is None or event.old_value["state"] != "taken")
        ]
        print(f"first taken: {takes[0][1]['body']}")
        profiles = [body for body in sent if body["event"] == "profile.changed"]
        print(f"profile calls: {profiles}")
        print(f"delivered: {len(sent)}")
        dead = webhooks.dead()
        customers = sorted({job.item["customer"] for job in dead})
        print(f"dead letters: {len(dead)}, of {customers}")
        errors = dead[0].errors
        print(f"attempts of the first: {[error['attempt'] for error in errors]}")
        print(f"why: {errors[-1]['error'].splitlines()[-1]}")
        calls = endpoints.calls
        per_customer = max(
            most_at_once([call for call in calls if call[2] == name])
            for name in ("initech", "globex", "acme")
        )
        print(f"at once: at most {most_at_once(calls)} calls (limit {CONCURRENCY})")
        print(f"per customer: at most {per_customer} at once (limit {PER_CUSTOMER})")
        times = sorted(at for at, _ in takes)
        limit, seconds = RATE
        busiest = max(sum(1 for other in times if at <= other < at + seconds) for at in times)
        print(f"busiest second: {busiest} takes of {len(times)} (limit {limit})")
        assert most_at_once(calls) <= CONCURRENCY
        assert per_customer <= PER_CUSTOMER
        assert busiest <= limit


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as folder:
            main(str(Path(folder) / "state.db"))
