"""The bench's table of durable workflows against DBOS: workflows/s in one process and
in four, a recorded step's cost, the ratios and the issue's targets."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text

from .cells import duration, on, rate, table, times, verdict

__all__ = ["durable_tables"]

_CELLS = {"1p": "wf/s, 1 process", "4p": "wf/s, 4 processes", "steps": "µs per step"}


def _figure(cell: str, found: dict[str, Any]) -> str:
    if found.get("error"):
        return "failed"
    if cell == "steps":
        value = found.get("step_us")
        return "-" if value is None else duration(value)
    value = found.get("per_s")
    return "-" if value is None else rate(value)


def durable_tables(result: dict[str, Any]) -> Group:
    """The durable-workflow section: one row per cell, the targets, then notes."""
    section = result["durable"]
    settings, figures = section["settings"], section["figures"]
    found_table = table(
        f"durable workflows, reactor and DBOS on {on(result)}: {settings['count']} "
        f"3-step workflows; a step's cost from {settings['step_count']} workflows of "
        f"{settings['steps']} steps and of 1 (medians of {settings['rounds']} rounds)"
    )
    for column in ("cell", "reactor", "DBOS", "reactor ÷ DBOS", "commits", "ok"):
        found_table.add_column(column, justify="left" if column == "cell" else "right")
    for cell, label in _CELLS.items():
        mine = figures.get("reactor", {}).get(cell, {})
        theirs = figures.get("dbos", {}).get(cell, {})
        ratio = section["ratios"].get(cell)
        commits = mine.get("commits_per_step" if cell == "steps" else "commits_per_workflow")
        found_table.add_row(
            label,
            _figure(cell, mine),
            _figure(cell, theirs) if theirs else "-",
            "-" if ratio is None else times(ratio),
            "-" if commits is None else f"{commits:.2f}",
            verdict(mine.get("correct") and (not theirs or theirs.get("correct"))),
        )
    legend = Text(
        "commits: reactor's per workflow (1p, 4p) or per recorded step (state.stats()); "
        "ok: every result right\n",
        style="dim",
    )
    for target in section["targets"]:
        legend.append(f"target {target['text']}: ")
        legend.append_text(verdict(target["ok"]))
        legend.append("\n")
    for name, why in section["skipped"].items():
        legend.append(f"durable peer skipped, {name}: {why}\n", style="yellow")
    for peer, by_cell in figures.items():
        for cell, found in by_cell.items():
            if found.get("error"):
                legend.append(f"durable {peer} {cell} failed: {found['error']}\n", style="red")
    return Group(found_table, legend)
