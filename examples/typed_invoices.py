"""Typed values: invoices as dataclasses, with exact money and real dates.

The scope stores plain JSON (what `reactor get invoices inv-1` prints, or an export
holds); the program works with `Invoice` objects: `set` takes them, `get(type=...)`
gives them back, and a subscriber decodes the change events it receives.

Run: python examples/typed_invoices.py
"""

from __future__ import annotations

import datetime as dt
import tempfile
import threading
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from uuid import NAMESPACE_URL, UUID, uuid5

import reactor
from reactor.codecs import TypedCodec


@dataclass(frozen=True)
class Line:
    item: str
    quantity: int
    unit_price: Decimal

    @property
    def amount(self) -> Decimal:
        return self.unit_price * self.quantity


@dataclass(frozen=True)
class Invoice:
    number: str
    customer: UUID
    issued: dt.date
    due: dt.datetime
    lines: tuple[Line, ...]
    paid_at: dt.datetime | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> Decimal:
        return sum((line.amount for line in self.lines), Decimal("0.00"))


def main() -> None:
    codec = TypedCodec()
    with tempfile.TemporaryDirectory() as folder:
        state = reactor.open(Path(folder) / "invoices.db", codec=codec)
        invoices = state.scope("invoices")

        # A subscriber gets plain JSON, as every subscriber does: the codec decodes it.
        paid: list[Invoice] = []
        settled = threading.Event()

        def on_change(event: reactor.ChangeEvent) -> None:
            invoice = codec.decode(event.new_value, Invoice)
            if invoice.paid_at is not None:
                paid.append(invoice)
                settled.set()

        state.subscribe(on_change, scope="invoices", events="updated")

        customer = uuid5(NAMESPACE_URL, "https://example.com/customers/ada")
        invoice = Invoice(
            number="inv-1",
            customer=customer,
            issued=dt.date(2026, 11, 2),
            due=dt.datetime(2026, 12, 2, 17, 0, tzinfo=dt.UTC),
            lines=(
                Line("consulting (hours)", 3, Decimal("120.00")),
                Line("travel", 1, Decimal("45.10")),
            ),
        )
        invoices.set("inv-1", invoice)
        print("stored as:", invoices.get("inv-1")["lines"][1])
        print("due as stored:", invoices.get("inv-1")["due"])

        back = invoices.get("inv-1", type=Invoice)
        print("read back equal:", back == invoice)
        print("total:", back.total, type(back.total).__name__)  # exact: 405.10, not 405.1

        # A payment: the new value goes through the codec too.
        paid_at = dt.datetime(2026, 11, 20, 9, 30, tzinfo=dt.UTC)
        invoices.set("inv-1", replace(back, paid_at=paid_at))
        settled.wait(10)
        print("paid seen by the subscriber:", paid[0].paid_at == paid_at, paid[0].total)

        # A value that does not fit the type asked for is a typed error, not garbage.
        invoices.set("broken", {"number": 7})
        try:
            invoices.get("broken", type=Invoice)
        except reactor.TypeMismatchError as error:
            print("refused:", type(error).__name__)

        # Without a codec, a dataclass is refused before anything is written.
        with reactor.open(Path(folder) / "invoices.db") as strict:
            try:
                strict.scope("invoices").set("inv-2", invoice)
            except reactor.InvalidValueError:
                print("strict handle refused a dataclass; keys:", strict.scope("invoices").keys())
        state.close()


if __name__ == "__main__":
    main()
