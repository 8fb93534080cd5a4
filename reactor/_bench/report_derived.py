"""The bench's table of derived values: a commit's way to a subscriber in this process
and from another one (p50, p99), and writes/s with 10,000 live values against none."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text

from .cells import duration, on, rate, table, times, verdict

__all__ = ["derived_tables"]


def _latency(found: dict[str, Any], key: str) -> str:
    if found.get("error"):
        return "failed"
    value = found.get(key)
    return "-" if value is None else duration(value * 1000)


def derived_tables(result: dict[str, Any]) -> Group:
    """The derived-values section: latencies, the rates, the targets, then errors."""
    section = result["derived"]
    settings = section["settings"]
    latency = table(
        f"derived values on {on(result)}: a commit to a subscriber "
        f"({settings['count']} commits each)"
    )
    for column in ("from", "p50", "p99"):
        latency.add_column(column, justify="left" if column == "from" else "right")
    here = section.get("in_process", {})
    there = section.get("across", {})
    latency.add_row("this process", _latency(here, "p50_ms"), _latency(here, "p99_ms"))
    latency.add_row(
        "  from the set call",
        _latency(here, "from_call_p50_ms"),
        _latency(here, "from_call_p99_ms"),
    )
    latency.add_row("another process", _latency(there, "p50_ms"), _latency(there, "p99_ms"))
    many = section.get("many", {})
    rates = table(
        f"writes/s to keys no value reads, with {settings['values']:,} live values "
        f"(medians of {settings['rounds']} rounds of {settings['writes']:,})"
    )
    for column in ("none", "live", "live ÷ none", "runs"):
        rates.add_column(column, justify="right")
    if many.get("error") or "ratio" not in many:
        rates.add_row("failed", "-", "-", "-")
    else:
        rates.add_row(
            rate(many["writes_per_s_none"]),
            rate(many["writes_per_s_live"]),
            times(many["ratio"]),
            str(many["recomputations"]),
        )
    legend = Text(
        "runs: the values' computations during those writes (none is right)\n", style="dim"
    )
    for target in section["targets"]:
        legend.append(f"target {target['text']}: ")
        legend.append_text(verdict(target["ok"]))
        legend.append("\n")
    for key in ("in_process", "across", "many"):
        error = section.get(key, {}).get("error")
        if error:
            legend.append(f"failed: {error}\n", style="red")
    if section.get("error"):
        legend.append(f"failed: {section['error']}\n", style="red")
    return Group(latency, rates, legend)
