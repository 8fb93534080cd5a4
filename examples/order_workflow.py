"""An order workflow driven by change triggers: new -> paid -> packed -> shipped.

    python examples/order_workflow.py            # a database in a temporary folder
    python examples/order_workflow.py state.db   # that file

Nothing calls the steps: each one is a subscription on the scope "orders". A change of
an order's status (its "created" or "updated" event) triggers the next step, which
writes the next status with ``update`` (a ``set`` of the status and an ``append`` to the
order's history, in one write), which triggers the step after it, until "shipped".

A durable subscriber, "ledger", keeps the books: when an order becomes paid it adds
the total to the revenue in the scope "ledger". Being durable, it is at-least-once: it
would resume after a crash at the first event it had not finished, so it records each
order it has counted, in a transaction, and counts an order only once.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

import reactor
from reactor import ops

ORDERS = {"o-1": 120.0, "o-2": 35.5, "o-3": 9.99, "o-4": 250.0, "o-5": 42.0}
NEXT = {"new": "paid", "paid": "packed", "packed": "shipped"}  # status -> the next one
TIMEOUT = 10.0  # seconds: the workflow takes a fraction of one


def run(path: Path) -> None:
    with reactor.open(path) as state:
        orders, ledger = state.scope("orders"), state.scope("ledger")
        orders.clear()  # start afresh when the same file is used twice
        ledger.clear()

        # The steps: one subscription moves any order whose status has a next one.
        def step(event: reactor.ChangeEvent) -> None:
            following = NEXT[event.new_value["status"]]
            orders.update(
                event.key,
                [
                    ops.set("status", following),
                    ops.append({"status": following, "after": event.revision}, path="history"),
                ],
            )

        state.subscribe(
            step,
            scope="orders",
            events={"created", "updated"},
            where=lambda event: event.new_value["status"] in NEXT,
        )

        # The end of the workflow: a decorated callback notes each shipped order.
        shipped: set[str] = set()
        all_shipped = threading.Event()

        @state.on("orders", events={"updated"}, where=lambda e: e.new_value["status"] == "shipped")
        def on_shipped(event: reactor.ChangeEvent) -> None:
            shipped.add(event.key)
            if shipped == set(ORDERS):
                all_shipped.set()

        # The books: a durable subscriber, with its position stored in the database.
        def book(event: reactor.ChangeEvent) -> None:
            total = event.new_value["total"]
            with ledger.transaction() as tx:
                if tx.exists(f"paid:{event.key}"):
                    return  # delivered again after a restart: counted already
                tx.set(f"paid:{event.key}", total)
                tx.increment("revenue", by=total)
                tx.increment("orders_paid")

        state.subscribe(
            book,
            scope="orders",
            events={"updated"},
            where=lambda e: e.old_value["status"] != "paid" and e.new_value["status"] == "paid",
            durable="ledger",
        )

        # Place the orders: each "created" event starts its workflow.
        for key, total in ORDERS.items():
            orders.set(key, {"status": "new", "total": total, "history": [{"status": "new"}]})

        # Wait, with a deadline, for the last step and for the books.
        deadline = time.monotonic() + TIMEOUT
        if not all_shipped.wait(TIMEOUT):
            raise RuntimeError(f"not all shipped after {TIMEOUT} s: {orders.list()}")
        while ledger.get("orders_paid") != len(ORDERS):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the ledger is behind after {TIMEOUT} s: {ledger.list()}")
            time.sleep(0.01)

        for key, order in orders.list().items():
            trail = " -> ".join(entry["status"] for entry in order["history"])
            print(f"{key}: {order['status']:8} {order['total']:7.2f}  {trail}")
        print("ledger:", ledger.list())
        print("events:", state.stats()["events"])

        final = orders.list()
        assert all(order["status"] == "shipped" for order in final.values())
        assert all(len(order["history"]) == 4 for order in final.values())
        assert ledger.get("orders_paid") == len(ORDERS)
        assert round(ledger.get("revenue"), 2) == round(sum(ORDERS.values()), 2)
        assert state.stats()["events"]["failed"] == 0


def main() -> None:
    if len(sys.argv) > 1:
        run(Path(sys.argv[1]))
        return
    with tempfile.TemporaryDirectory() as folder:
        run(Path(folder) / "state.db")


if __name__ == "__main__":
    main()
