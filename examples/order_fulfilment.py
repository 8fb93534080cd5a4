"""Order fulfilment with reactor's workflow primitives: a timer, a queue, a wait.

    python examples/order_fulfilment.py            # a database in a temporary folder
    python examples/order_fulfilment.py state.db   # that file

- **A payment timeout (a timer).** Placing an order schedules, in the same
  transaction, a timer that cancels it if no payment came in time. A payment cancels
  the timer, in the transaction that marks the order paid.
- **A retrying email queue with dead letters (a queue).** The transaction that marks an
  order paid or cancelled also enqueues its email (an outbox: there is never one
  without the other). A worker thread sends them; the mail server fails now and then,
  so a failed email goes back to the queue after a delay; one address never works, and
  its email ends in the dead letters after ``MAX_ATTEMPTS``.
- **An approval from another process (wait_for).** A large order waits until a
  manager approves it; the manager is another process, writing to the same database.

Every step is in the database: another process, or this one after a crash, would carry
on where it stopped (the timer still fires, the emails are still sent).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import reactor
from reactor import ops

PAYMENT_TIMEOUT = 1.2  # seconds an order waits for its payment (hours, in real life)
MAX_ATTEMPTS = 3  # sends of one email before it goes to the dead letters
APPROVAL_OVER = 200.0  # orders above this total need a manager's approval
TIMEOUT = 15.0  # seconds any step of this demo may take, at most
_printing = threading.Lock()  # the worker thread prints too: whole lines, one at a time


def say(*parts: object) -> None:
    with _printing:
        print(*parts, flush=True)


MANAGER = """
import sys, time, reactor
with reactor.open(sys.argv[1]) as state:   # another process, on the same database
    time.sleep(0.3)                         # reading the order takes a moment
    state.scope("approvals").set(sys.argv[2], {"by": "manager", "ok": True})
"""


def place(state: reactor.State, order_id: str, total: float, email: str) -> None:
    """The order and its payment timeout, in one transaction."""
    with state.scope("orders").transaction() as tx:
        timeout = tx.schedule(order_id, ops=[ops.set("status", "cancelled")], after=PAYMENT_TIMEOUT)
        order = {"status": "awaiting payment", "total": total, "email": email}
        tx.set(order_id, {**order, "payment_timer": timeout.id})


def pay(state: reactor.State, order_id: str) -> bool:
    """Mark the order paid, cancel its timeout and enqueue its receipt: all or nothing.
    False if it was no longer awaiting payment (the timeout got there first)."""
    with state.transaction("orders") as tx:
        orders = tx["orders"]
        order = orders.get(order_id)
        if order["status"] != "awaiting payment":
            return False
        tx.cancel_timer(order["payment_timer"])
        orders.update(order_id, [ops.set("status", "paid")])
        tx.enqueue("emails", {"to": order["email"], "about": f"{order_id} paid"})
    return True


def mail_server(sent: list[str]) -> Any:
    """A pretend SMTP server: every email fails once, then goes through; one address
    always fails."""
    tried: set[str] = set()

    def send(email: dict[str, Any]) -> None:
        if email["to"].endswith("@nowhere.invalid"):
            raise ConnectionError("550 no such mailbox")
        if email["about"] not in tried:
            tried.add(email["about"])
            raise TimeoutError("421 try again later")
        sent.append(f"{email['to']}: {email['about']}")

    return send


def email_worker(state: reactor.State, stop: threading.Event, sent: list[str]) -> None:
    """Take emails one at a time, send them; on failure put them back, a little later."""
    emails = state.queue("emails", max_attempts=MAX_ATTEMPTS)
    send = mail_server(sent)
    while not stop.is_set():
        job = emails.take(timeout=0.2, lease=5)
        if job is None:
            continue
        try:
            send(job.item)
        except (ConnectionError, TimeoutError) as exc:
            say(f"email  attempt {job.attempts}: {job.item['about']} failed ({exc})")
            job.nack(delay=0.05)  # back to the queue; dead after MAX_ATTEMPTS
        else:
            job.ack()


def run(path: Path) -> None:
    with reactor.open(path) as state:
        orders = state.scope("orders")
        for name in ("orders", "approvals"):
            state.scope(name).clear()  # start afresh when the same file is used twice
        emails = state.queue("emails", max_attempts=MAX_ATTEMPTS)
        emails.retry_dead()
        while (job := emails.take(timeout=0)) is not None:
            job.ack()

        # A cancelled order (the timer's write) gets its email too, in a transaction.
        @state.on("orders", where=lambda event: event.timer is not None)
        def on_timeout(event: reactor.ChangeEvent) -> None:
            with state.transaction("orders") as tx:
                order = tx["orders"].get(event.key)
                tx.enqueue("emails", {"to": order["email"], "about": f"{event.key} cancelled"})
            say(f"timer  {event.key}: {event.old_value['status']} -> cancelled")

        stop, sent = threading.Event(), []
        worker = threading.Thread(target=email_worker, args=(state, stop, sent))
        worker.start()
        try:
            place(state, "o-1", 120.0, "ada@example.com")
            place(state, "o-2", 35.5, "bob@example.com")  # never paid: the timer cancels it
            place(state, "o-3", 480.0, "cy@nowhere.invalid")  # large: needs an approval
            say("timers:", [timer.key for timer in state.timers("orders")])
            say("o-1 paid:", pay(state, "o-1"), "| o-3 paid:", pay(state, "o-3"))

            # o-3 waits for a manager, in another process.
            manager = subprocess.Popen([sys.executable, "-c", MANAGER, str(path), "o-3"])  # noqa: S603 - our own code
            approval = state.scope("approvals").wait_for("o-3", timeout=TIMEOUT)
            manager.wait(timeout=TIMEOUT)
            say("o-3 approved by", approval["by"])
            orders.update("o-3", [ops.set("status", "approved")])

            orders.wait_for("o-2", lambda order: order["status"] == "cancelled", timeout=TIMEOUT)
            deadline = time.monotonic() + TIMEOUT
            while len(sent) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            while not emails.dead() and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            stop.set()
            worker.join(timeout=TIMEOUT)
        for name, order in orders.list().items():
            say(f"{name}: {order['status']}")
        say("sent:", sorted(sent))
        say("dead letters:", [(job.item["about"], job.attempts) for job in emails.dead()])
        say("queue:", emails.stats())


def main() -> None:
    if len(sys.argv) > 1:
        run(Path(sys.argv[1]))
        return
    with tempfile.TemporaryDirectory() as folder:
        run(Path(folder) / "state.db")


if __name__ == "__main__":
    main()
