"""``reactor demo``: a reactive order workflow on an embedded database in the current folder
(or on the database ``reactor --db`` names).

Nothing calls the workflow's steps: subscriptions react to each change of an order and
write the next status, which triggers the next step. A durable subscriber keeps the
ledger (its position in the change log is stored in the database), a counter counts
orders, and a TTL cache holds an exchange rate that expires while the demo watches. Every
change is printed as it commits. Run it again: the orders, the ledger and the ledger's
position are still there, and the new orders carry on from them.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Final

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from reactor import ops
from reactor._engine.events import ChangeEvent
from reactor._handles.state import State

__all__ = ["DEMO_DATABASE", "run_demo"]

DEMO_DATABASE: Final = "reactor-demo.db"
NEXT: Final = {"new": "paid", "paid": "packed", "packed": "shipped"}
ORDERS_PER_RUN: Final = 3
QUOTE_TTL: Final = 1.0  # seconds a cached exchange rate lives
TIMEOUT: Final = 15.0  # seconds the demo waits for its workflow, at most
STYLES: Final = {"created": "green", "updated": "yellow", "deleted": "red", "expired": "magenta"}


def run_demo(state: State, console: Console, *, again: str = "reactor demo") -> None:
    """Run one round of the workflow on ``state`` and show what happens, live;
    ``again`` is the command that runs it again on the same database."""
    demo, orders, ledger, cache = (
        state.scope(name) for name in ("demo", "orders", "ledger", "cache")
    )
    run = int(demo.increment("runs"))
    _show_start(state, console, run)

    state.subscribe(
        lambda event: _print_event(console, event),
        where=lambda event: event.scope in ("orders", "ledger", "cache"),
    )
    _start_workflow(state)
    shipped = _watch_shipping(state, run)
    _start_ledger(state)

    console.rule("[bold]live: every change, as it commits")
    for number in range(1, ORDERS_PER_RUN + 1):
        key = f"o-{run}-{number}"
        rate = cache.get("rate:EUR")
        if rate is None:  # a miss: look the rate up (slowly, say) and cache it
            rate = 1.08
            cache.set("rate:EUR", rate, ttl=QUOTE_TTL)
        else:
            console.print(f"  cache hit: rate:EUR = {rate}")
        total = round((10 + 7.5 * number * run) * rate, 2)
        orders.set(key, {"total": total, "status": "new", "history": []})
        state.scope("counters").increment("orders_created")
        time.sleep(0.15)  # so that the steps of one order can be seen before the next
    if not shipped.wait(TIMEOUT):
        console.print("[red]the workflow did not finish in time[/]")
    _wait_for_ledger(state)
    time.sleep(QUOTE_TTL + 0.6)  # the cached rate expires: the sweeper publishes `expired`

    console.rule("[bold]the state now")
    console.print(_orders_table(orders.get_many(orders.keys("o-*"))))
    position = state.stats()["durable_subscribers"].get("ledger", {}).get("position", 0)
    console.print(
        f"ledger: revenue [bold]{ledger.get('revenue', 0):.2f}[/] from "
        f"{ledger.get('orders_paid', 0)} paid orders; the ledger has handled the change log "
        f"up to revision [bold]{position}[/] (stored in the database)"
    )
    console.print(
        f"counter orders_created = {state.scope('counters').get('orders_created')}; "
        f"keys still cached: {len(cache.keys())}"
    )
    console.print(
        f"Run [bold]{escape(again)}[/] again: the orders, the ledger and its position "
        f"survive in [cyan]{state.location}[/]."
    )


def _show_start(state: State, console: Console, run: int) -> None:
    if run == 1:
        console.print(
            f"[bold]First run.[/] A new database: [cyan]{state.location}[/]\n"
            f"{ORDERS_PER_RUN} orders will go new → paid → packed → shipped, driven by "
            "subscriptions; a durable subscriber keeps the ledger."
        )
        return
    orders = state.scope("orders").keys("o-*")
    ledger = state.scope("ledger")
    position = state.stats()["durable_subscribers"].get("ledger", {}).get("position", 0)
    console.print(
        f"[bold]Run #{run}.[/] The last run's state survived in [cyan]{state.location}[/]: "
        f"{len(orders)} orders, revenue {ledger.get('revenue', 0):.2f}; the ledger resumes "
        f"after revision {position}, where it stopped."
    )


def _shown(value: object) -> str:
    """A ledger value as the feed shows it: ``-`` where there is none."""
    return "-" if value is None else str(value)


def _print_event(console: Console, event: ChangeEvent) -> None:
    style = STYLES.get(event.type, "white")
    if event.scope == "orders":
        before = (event.old_value or {}).get("status", "-")
        after = (event.new_value or {}).get("status", "-")
        what = f"status {before} → {after}"
    elif event.scope == "ledger":
        what = f"{_shown(event.old_value)} → {_shown(event.new_value)}"
    else:
        what = "cached" if event.type == "created" else event.type
    where = f"{event.scope}/{event.key}"
    console.print(f"  rev {event.revision:>4}  [{style}]{event.type:<8}[/]  {where:<20} {what}")


def _start_workflow(state: State) -> None:
    """Each step is a subscription: an order whose status has a next one moves on."""
    orders = state.scope("orders")

    def step(event: ChangeEvent) -> None:
        following = NEXT[event.new_value["status"]]
        orders.update(
            event.key,
            [
                ops.set("status", following),
                ops.append({"status": following, "after": event.revision}, "history"),
            ],
        )

    state.subscribe(
        step,
        scope="orders",
        key="o-*",
        events={"created", "updated"},
        where=lambda event: event.new_value.get("status") in NEXT,
    )


def _watch_shipping(state: State, run: int) -> threading.Event:
    """An event set when every order of this run is shipped."""
    done = threading.Event()
    mine = {f"o-{run}-{number}" for number in range(1, ORDERS_PER_RUN + 1)}
    shipped: set[str] = set()

    def on_shipped(event: ChangeEvent) -> None:
        shipped.add(event.key)
        if mine <= shipped:
            done.set()

    state.subscribe(
        on_shipped,
        scope="orders",
        events={"updated"},
        where=lambda event: event.new_value.get("status") == "shipped",
    )
    return done


def _start_ledger(state: State) -> None:
    """The books, kept by a durable subscriber: at least once, so each order is counted
    in a transaction that remembers it, and counted once."""
    ledger = state.scope("ledger")

    def book(event: ChangeEvent) -> None:
        with ledger.transaction() as tx:
            if tx.exists(f"paid:{event.key}"):
                return  # delivered again after a crash: counted already
            tx.set(f"paid:{event.key}", event.new_value["total"])
            tx.increment("revenue", by=event.new_value["total"])
            tx.increment("orders_paid")

    state.subscribe(
        book,
        scope="orders",
        events={"updated"},
        where=lambda event: event.new_value.get("status") == "paid",
        durable="ledger",
    )


def _wait_for_ledger(state: State) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        lag = state.stats()["durable_subscribers"].get("ledger", {}).get("lag", 0)
        if lag == 0:
            return
        time.sleep(0.05)


def _orders_table(orders: dict[str, Any]) -> Table:
    table = Table(title="orders (all runs)")
    table.add_column("order")
    table.add_column("status")
    table.add_column("total", justify="right")
    table.add_column("steps", justify="right")
    for key, order in orders.items():
        table.add_row(key, order["status"], f"{order['total']:.2f}", str(len(order["history"])))
    return table
