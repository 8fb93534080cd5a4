"""An order saga as a durable workflow: reserve stock, charge the card, wait for a
person's approval, then ship; or, if the approval says no or does not come in time,
compensate (refund the charge, put the stock back).

    python examples/order_saga.py            # a database in a temporary folder
    python examples/order_saga.py state.db   # that file (run it twice: same results)

Stock moves in ``run.transaction`` steps: exactly once, whatever crashes. The charge
is a step with retries (the payment service here fails its first call). The approval
is a message (``state.send``) the run waits for with ``run.receive``, suspended and
holding no thread meanwhile; the third order's never comes, and its timeout starts
the compensation. Run ids are the order ids: starting an order twice starts one run.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import reactor

APPROVAL_TIMEOUT = 1.0  # seconds (a day, in a shop)
calls: dict[str, int] = {}


def charge_card(order_id: str, amount: int) -> str:
    """The payment service: flaky on its first call for each order."""
    calls[order_id] = calls.get(order_id, 0) + 1
    if calls[order_id] == 1:
        raise ConnectionError("payment service unavailable")
    return f"ch-{order_id}-{amount}"


def refund(charge: str) -> str:
    return f"refunded {charge}"


def register(state: reactor.State) -> None:
    @state.workflow("order", max_attempts=3, lease=10)
    def order(run: reactor.Run, order: dict[str, Any]) -> dict[str, Any]:
        item = order["item"]
        with run.transaction("stock") as tx:
            tx["stock"].decrement(item)
        charge = run.step(
            "charge", charge_card, order["id"], order["amount"], retries=3, backoff=0.05
        )
        try:
            approval = run.receive("approval", timeout=APPROVAL_TIMEOUT)
        except reactor.OperationTimeout:
            approval = {"ok": False, "why": "no approval in time"}
        if approval["ok"]:
            with run.transaction("shipments") as tx:
                tx["shipments"].set(order["id"], {"item": item, "charge": charge})
            return {"status": "shipped", "charge": charge}
        refunded = run.step("refund", refund, charge)
        with run.transaction("stock") as tx:  # compensation: the stock goes back
            tx["stock"].increment(item)
        return {"status": approval["why"], "refund": refunded}


def main(path: str) -> None:
    with reactor.open(path) as state:
        register(state)
        if state.scope("stock").get("widget") is None:
            state.scope("stock").set("widget", 10)
        orders: list[tuple[dict[str, Any], dict[str, Any] | None]] = [
            ({"id": "o-1", "item": "widget", "amount": 30}, {"ok": True}),
            ({"id": "o-2", "item": "widget", "amount": 45}, {"ok": False, "why": "rejected"}),
            ({"id": "o-3", "item": "widget", "amount": 12}, None),  # nobody answers
        ]
        handles = [state.start("order", order, id=order["id"]) for order, _ in orders]
        with state.serve(concurrency=4):
            for handle, (_, approval) in zip(handles, orders, strict=True):
                while handle.status() in ("pending", "running"):
                    time.sleep(0.01)
                if approval is not None and handle.status() == "suspended":
                    state.send(handle.id, "approval", approval)
            for handle in handles:
                print(f"{handle.id}: {handle.result(timeout=30)}")
        print(f"stock: widget {state.scope('stock').get('widget')}")
        print(f"shipments: {sorted(state.scope('shipments').keys())}")
        steps = [step.name for step in state.run_info("o-3").steps]
        print(f"o-3 steps: {', '.join(steps)}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as folder:
            main(str(Path(folder) / "saga.db"))
