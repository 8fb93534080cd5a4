"""A live order board (SPEC §15): orders by status and the revenue, kept up from each
change without reading the orders again, and a "batch done" gate, a derived value
written to a key, that a durable workflow waits on before it invoices the batch.

Run it: python examples/order_board.py [state.db]
"""

from __future__ import annotations

import os
import sys
import tempfile

import reactor
from reactor import ops

STATUSES = ("new", "paid", "shipped")


def main(path: str) -> None:
    state = reactor.open(path)
    orders = state.scope("orders")

    # Incremental: each change's old and new value adjust them; no re-read.
    by_status = {
        status: state.count(
            "orders", "o-*", where=lambda v, s=status: v["status"] == s, name=f"orders {status}"
        )
        for status in STATUSES
    }
    revenue = state.sum("orders", "o-*", path="/amount", where=lambda v: v["status"] != "new")

    # Computed: runs again only when a key it read (or one matching a pattern it
    # listed) changes; its result is also written to gates/b-1 for anyone to read.
    def batch_done(r: reactor.Reader) -> bool:
        batch = r.scope("batches").get("b-1", {"orders": []})["orders"]
        placed = r.scope("orders")
        return bool(batch) and all(placed.get(o, {}).get("status") == "shipped" for o in batch)

    gate = state.derive(batch_done, name="batch b-1 done", into=("gates", "b-1"))

    @state.workflow("invoice")
    def invoice(run: reactor.Run, batch: str) -> str:
        run.wait_for("gates", batch, lambda done: done is True, timeout=60)
        return str(run.step("invoice", lambda: f"invoice for {batch}"))

    def board(total: int, **expected: int) -> str:
        # Each derived value publishes on its own, so wait until all show the writes:
        # first the count that only the last write brings (then every change is in),
        # then the others (each shows its own last value soon after).
        for status, count in expected.items():
            by_status[status].wait_for(lambda n, count=count: n == count, timeout=10)
        revenue.wait_for(lambda value: value == total, timeout=10)
        counts = ", ".join(f"{status} {by_status[status].value}" for status in STATUSES)
        return f"board: {counts}, revenue {revenue.value}"

    with state.serve(workflows=["invoice"]):
        handle = state.start("invoice", "b-1", id="inv-b-1")
        state.scope("batches").set("b-1", {"orders": ["o-1", "o-2"]})
        for order, amount in (("o-1", 30), ("o-2", 45), ("o-3", 12)):
            orders.set(order, {"status": "new", "amount": amount})
        for order in ("o-1", "o-2"):
            orders.update(order, [ops.set("status", "paid")])
        print(board(75, paid=2, new=1, shipped=0))
        for order in ("o-1", "o-2"):
            orders.update(order, [ops.set("status", "shipped")])
        print(board(75, shipped=2, new=1, paid=0))
        print(f"gate b-1: {gate.wait_for(lambda done: done, timeout=10)}")
        print(f"{handle.id}: {handle.result(timeout=30)}")
    built = {value.name: value.recomputations for value in state.derived()}
    print(f"times each count was built from the orders: {[built[f'orders {s}'] for s in STATUSES]}")
    state.close()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as folder:
            main(os.path.join(folder, "board.db"))
