"""``reactor demo``: a first run on an embedded database in the current folder."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ._state import State

DEMO_DATABASE = "reactor-demo.db"


def run_demo(state: State, console: Console) -> None:
    """Write a little state, read it back, and show what survived the last run."""
    demo = state.scope("demo")
    orders = state.scope("orders")
    runs = demo.increment("runs")
    previous = demo.get("last_run_at")
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")

    if runs == 1:
        console.print(f"[bold]First run.[/] Writing state to [cyan]{state.location}[/].")
    else:
        count = orders.length("history")
        console.print(
            f"[bold]Run #{runs}.[/] State survived the last run (at {previous}): "
            f"{count} order{'' if count == 1 else 's'} in the history."
        )

    order_id = f"o-{runs}"
    change = orders.set(order_id, {"id": order_id, "total": 40 + runs * 10, "status": "new"})
    console.print(f"set {order_id}: old={change.old_value} new={change.new_value}")
    orders.push("history", order_id)
    orders.increment("count")
    orders.set("session", {"run": runs}, ttl=60)
    if orders.compare_and_swap(order_id, change.new_value, {**change.new_value, "status": "paid"}):
        console.print(f"{order_id} moved from new to paid with compare_and_swap")
    demo.set("last_run_at", now)

    table = Table(title=f"scope 'orders' in {Path(state.location).name}")
    table.add_column("key")
    table.add_column("value")
    table.add_column("ttl (s)", justify="right")
    for key, value in orders.list().items():
        ttl = orders.ttl(key)
        table.add_row(key, str(value), "-" if ttl < 0 else f"{ttl:.0f}")
    console.print(table)
    console.print("Run [bold]reactor demo[/] again: the state above is still there.")
