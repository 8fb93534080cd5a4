"""The bench's table of start-up: ``reactor get`` from the shell, beside a bare
interpreter and ``redis-cli get``."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text

from .cells import duration, table, times, verdict

__all__ = ["startup_table"]


def startup_table(result: dict[str, Any]) -> Group:
    """The start-up section: each command's median and its ratio to a bare interpreter."""
    section = result["startup"]
    if "error" in section:
        return Group(Text(f"start-up: failed: {section['error']}\n", style="red"))
    settings = section["settings"]
    shown = table(
        f"start-up from the shell (medians of {settings['rounds']} rounds of "
        f"{settings['runs']} runs)"
    )
    for column in ("command", "time", "÷ python -c pass"):
        shown.add_column(column, justify="left" if column == "command" else "right")
    for name, found in section["commands"].items():
        shown.add_row(name, duration(found["ms"] * 1000), times(found["ratio"]))
    target = Text(f"target: reactor get within {section['target']:g}x a bare interpreter: ")
    target.append_text(verdict(section["met"]))
    target.append("\n")
    return Group(shown, target)
