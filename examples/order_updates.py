"""Update ops on an order document: many changes to one value, in one write each.

    python examples/order_updates.py            # a database in a temporary folder
    python examples/order_updates.py state.db   # that file

Each ``update`` reads the order, applies its ops in order and writes the result in one
write. By default an op that cannot apply is skipped and reported in ``errors`` while
the others are kept; ``atomic=True`` keeps nothing unless every op applies; a JSON
Patch (ops with ``"op"``) is always all or nothing.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import reactor
from reactor import ops


def show(title: str, result: reactor.UpdateResult) -> None:
    print(f"{title}:")
    print(f"  value:  {result.new_value}")
    for error in result.errors:
        print(f"  error:  op {error['index']} {error['code']}: {error['message']}")


def run(path: Path) -> None:
    with reactor.open(path) as state:
        orders = state.scope("orders")
        orders.delete("o-1")  # start afresh when the same file is used twice

        # A missing key starts as {} when an op names a field; parents are created.
        created = orders.update(
            "o-1",
            [
                ops.set("status", "new"),
                ops.set("customer.name", "Ada"),
                ops.set("customer.city", "Paris"),
                ops.set("total", 0),
            ],
        )
        show("create", created)
        assert created.old_value is None

        book = {"sku": "book", "qty": 1, "price": 12.5}
        pens = {"sku": "pen", "qty": 3, "price": 2.0}
        show(
            "add lines",
            orders.update(
                "o-1",
                [
                    ops.append(book, path="lines"),  # a missing field becomes [book]
                    ops.append(pens, path="lines"),
                    ops.increment("total", by=12.5 + 3 * 2.0),
                ],
            ),
        )

        # Paths: "lines.0.qty" (a digit segment indexes a list) or a list of segments.
        show(
            "more pens, one more book",
            orders.update(
                "o-1",
                [
                    ops.increment(["lines", 1, "qty"], by=2),
                    ops.increment("lines.0.qty"),
                    ops.increment("total", by=12.5 + 2 * 2.0),
                ],
            ),
        )

        show(
            "paid, moved to Lyon, no coupon",
            orders.update(
                "o-1",
                [
                    ops.merge({"status": "paid", "paid_at": "2024-05-01T12:00:00Z"}),
                    ops.merge({"city": "Lyon", "zip": "69001"}, path="customer"),
                    ops.remove("coupon"),  # absent: not an error
                ],
            ),
        )

        # Partial (the default): the op that cannot apply is reported, the others stay.
        partial = orders.update(
            "o-1",
            [
                ops.set("status", "packed"),
                ops.increment("status"),  # a str is not a number: type_mismatch
                ops.append("fragile", path="tags"),
            ],
        )
        show("partial update", partial)
        assert [error["code"] for error in partial.errors] == ["type_mismatch"]
        assert partial.new_value["status"] == "packed"

        # atomic=True: one error and nothing is written.
        atomic = orders.update(
            "o-1",
            [ops.set("status", "shipped"), ops.set("lines.5.qty", 1)],  # no line 5
            atomic=True,
        )
        show("atomic update", atomic)
        assert atomic.errors[0]["code"] == "path_not_found"
        assert orders.get("o-1")["status"] == "packed"

        # JSON Patch (RFC 6902): "test" guards the patch; all or nothing.
        patch: list[dict[str, Any]] = [
            {"op": "test", "path": "/status", "value": "packed"},
            {"op": "replace", "path": "/status", "value": "shipped"},
            {"op": "add", "path": "/tags/-", "value": "express"},
        ]
        show("patch", orders.update("o-1", patch))
        again = orders.update("o-1", patch)  # the status is no longer "packed"
        show("same patch again", again)
        assert again.errors[0]["code"] == "test_failed"

        order = orders.get("o-1")
        print("final order:", order)
        assert order["total"] == 35.0
        assert order["tags"] == ["fragile", "express"]


def main() -> None:
    if len(sys.argv) > 1:
        run(Path(sys.argv[1]))
        return
    with tempfile.TemporaryDirectory() as folder:
        run(Path(folder) / "state.db")


if __name__ == "__main__":
    main()
