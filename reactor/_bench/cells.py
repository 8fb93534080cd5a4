"""How figures print in the bench's tables: rates, ratios, durations, verdicts, and a
table without borders."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

__all__ = [
    "backend_name",
    "divide",
    "duration",
    "on",
    "rate",
    "ratio",
    "table",
    "times",
    "verdict",
]


def table(title: str) -> Table:
    """A table without borders, columns two spaces apart, a rule under the heading."""
    return Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )


def rate(ops_per_s: float) -> str:
    if ops_per_s >= 1e6:
        return f"{ops_per_s / 1e6:.2f}M"
    if ops_per_s >= 1e3:
        return f"{ops_per_s / 1e3:.1f}k"
    return f"{ops_per_s:.0f}"


def times(ratio: float) -> str:
    if ratio >= 100:
        return f"{ratio:.0f}"
    return f"{ratio:.1f}" if ratio >= 10 else f"{ratio:.2f}"


def duration(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.2f}s"
    if us >= 1e3:
        return f"{us / 1e3:.1f}ms"
    return f"{us:.0f}µs" if us >= 10 else f"{us:.1f}µs"


def verdict(ok: bool | None) -> Text:
    if ok is None:
        return Text("n/a", style="dim")
    return Text("OK", style="green") if ok else Text("MISS", style="bold red")


def ratio(ratio: float | None) -> Text:
    if ratio is None:
        return Text("-", style="dim")
    style = "green" if ratio >= 1 else "yellow" if ratio >= 0.5 else "red"
    return Text(times(ratio), style=style)


def backend_name(result: dict[str, Any]) -> str:
    return str(result.get("backend", {}).get("name", "sqlite"))


def on(result: dict[str, Any]) -> str:
    return "SQLite" if backend_name(result) == "sqlite" else "PostgreSQL"


def divide(mine: float | None, theirs: float | None) -> float | None:
    return None if not mine or not theirs else mine / theirs
