"""Rounds into figures: medians, ratios, targets, the table and the JSON file."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import sqlite3
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from .workloads import VERBS

__all__ = ["machine_info", "render", "summarize", "targets", "write_json"]

_PACKAGES = ("reactor", "sqlalchemy", "pykka", "orjson", "diskcache", "sqlitedict", "redis")


def machine_info() -> dict[str, Any]:
    """Where the figures come from."""
    versions: dict[str, str | None] = {}
    for package in _PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "sqlite": sqlite3.sqlite_version,
        "packages": versions,
    }


# -- medians and ratios ----------------------------------------------------------------
def summarize(rounds: Sequence[dict[str, dict[str, dict[str, Any]]]]) -> dict[str, Any]:
    """``figures[peer][mode][verb]``: the median of each figure over the rounds."""
    collected: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}
    for one in rounds:
        for peer, modes in one.items():
            for mode, verbs in modes.items():
                for verb, fig in verbs.items():
                    collected.setdefault(peer, {}).setdefault(mode, {}).setdefault(verb, []).append(
                        fig
                    )
    summary: dict[str, Any] = {}
    for peer, modes in collected.items():
        for mode, verbs in modes.items():
            for verb, figs in verbs.items():
                entry: dict[str, Any] = {
                    key: statistics.median(fig[key] for fig in figs)
                    for key in ("ops_per_s", "p50_us", "p99_us")
                }
                entry["ops"] = figs[0]["ops"]
                entry["rounds"] = [fig["ops_per_s"] for fig in figs]
                if "count_exact" in figs[0]:
                    entry["count_exact"] = all(fig["count_exact"] for fig in figs)
                    entry["counts"] = [[fig["count"], fig["expected"]] for fig in figs]
                summary.setdefault(peer, {}).setdefault(mode, {})[verb] = entry
    return summary


def _ops(figures: dict[str, Any], peer: str, mode: str, verb: str) -> float | None:
    entry = figures.get(peer, {}).get(mode, {}).get(verb)
    return None if entry is None else float(entry["ops_per_s"])


def ratios(figures: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """``ratios[mode][verb][peer]``: reactor's ops/s divided by the peer's."""
    found: dict[str, dict[str, dict[str, float]]] = {}
    for mode, verbs in figures.get("reactor", {}).items():
        for verb in verbs:
            mine = _ops(figures, "reactor", mode, verb)
            for peer in figures:
                theirs = _ops(figures, peer, mode, verb)
                if peer != "reactor" and mine is not None and theirs:
                    found.setdefault(mode, {}).setdefault(verb, {})[peer] = mine / theirs
    return found


# -- targets ---------------------------------------------------------------------------
def _ratio_target(
    figures: dict[str, Any],
    verb: str,
    mode: str,
    peer: str,
    at_least: float,
    *,
    peer_verb: str | None = None,
    peer_mode: str | None = None,
) -> dict[str, Any]:
    mine = _ops(figures, "reactor", mode, verb)
    theirs = _ops(figures, peer, peer_mode or mode, peer_verb or verb)
    against = peer if peer_verb is None else f"reactor {peer_verb}"
    measured = None if mine is None or not theirs else mine / theirs
    return {
        "verb": verb,
        "mode": mode,
        "target": f">= {at_least:g}x {against}",
        "measured": measured,
        "text": "n/a" if measured is None else f"{measured:.2f}x",
        "ok": None if measured is None else measured >= at_least,
    }


def _latency_target(
    events: dict[str, Any], which: str, at_most_us: float, label: str
) -> dict[str, Any]:
    found = events.get(which) or {}
    measured = found.get("p50_us")
    return {
        "verb": "event",
        "mode": which,
        "target": f"p50 <= {label}",
        "measured": measured,
        "text": "n/a" if measured is None else _duration(measured),
        "ok": None if measured is None else measured <= at_most_us,
    }


def targets(
    figures: dict[str, Any], events: dict[str, Any], modes: dict[str, str]
) -> list[dict[str, Any]]:
    """Reactor's targets, each with what was measured and whether it is met (None: not
    measured in this run)."""
    one, many, aio = modes["threads_1"], modes["threads_n"], modes["asyncio"]
    found = [
        _ratio_target(figures, "get", one, "diskcache", 1.0),
        _ratio_target(figures, "set", one, "diskcache", 1.0),
        _ratio_target(figures, "set", many, "diskcache", 2.0),
        _ratio_target(figures, "increment", many, "diskcache", 1.5),
    ]
    counter = figures.get("reactor", {}).get(many, {}).get("increment", {})
    exact = counter.get("count_exact")
    found.append(
        {
            "verb": "increment",
            "mode": many,
            "target": "final count exact",
            "measured": exact,
            "text": "n/a" if exact is None else ("exact" if exact else "lost counts"),
            "ok": exact,
        }
    )
    found.append(_ratio_target(figures, "update", one, "reactor", 0.8, peer_verb="set"))
    for mode in dict.fromkeys((one, many)):
        found.extend(_ratio_target(figures, verb, mode, "redis", 2.0) for verb in VERBS)
    found.append(_ratio_target(figures, "set", aio, "sqlite3x100", 0.5))
    found.append(_latency_target(events, "in_process", 1000.0, "1 ms"))
    found.append(_latency_target(events, "cross_process", 50_000.0, "50 ms"))
    return found


# -- the table -------------------------------------------------------------------------
def _rate(ops_per_s: float) -> str:
    if ops_per_s >= 1e6:
        return f"{ops_per_s / 1e6:.2f}M/s"
    if ops_per_s >= 1e3:
        return f"{ops_per_s / 1e3:.1f}k/s"
    return f"{ops_per_s:.0f}/s"


def _duration(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.2f}s"
    if us >= 1e3:
        return f"{us / 1e3:.1f}ms"
    return f"{us:.0f}µs" if us >= 10 else f"{us:.1f}µs"


def _verdict(ok: bool | None) -> Text:
    if ok is None:
        return Text("n/a", style="dim")
    return Text("OK", style="green") if ok else Text("MISS", style="bold red")


def _cell(entry: dict[str, Any] | None, ratio: float | None) -> Text:
    if entry is None:
        return Text("-", style="dim")
    text = Text(_rate(entry["ops_per_s"]), style="bold")
    if ratio is not None:
        style = "green" if ratio >= 1 else "yellow" if ratio >= 0.5 else "red"
        text.append(f" {ratio:.2f}x", style=style)
    text.append(f"\n{_duration(entry['p50_us'])} / {_duration(entry['p99_us'])}", style="dim")
    if entry.get("count_exact") is False:
        text.append("\ncount short", style="red")
    return text


def _backend_name(result: dict[str, Any]) -> str:
    return str(result.get("backend", {}).get("name", "sqlite"))


def _target_heading(result: dict[str, Any]) -> str:
    """``target``, saying so when the run was not on SQLite (the targets are set there)."""
    return "target" if _backend_name(result) == "sqlite" else "target (set for SQLite)"


def _throughput_table(result: dict[str, Any]) -> Table:
    figures: dict[str, Any] = result["figures"]
    found_ratios: dict[str, Any] = result["ratios"]
    peers = [peer for peer in result["peers"] if peer in figures]
    on = "" if _backend_name(result) == "sqlite" else " on PostgreSQL"
    table = Table(
        title=f"reactor bench (reactor{on}): ops/s (reactor ÷ peer), p50 / p99 latency, "
        f"medians of {result['settings']['rounds']} round(s)",
        title_justify="left",
        show_lines=True,
    )
    table.add_column("verb")
    table.add_column("mode")
    for peer in peers:
        table.add_column(peer, justify="right", no_wrap=True)
    table.add_column(_target_heading(result))
    by_row: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for target in result["targets"]:
        by_row.setdefault((target["verb"], target["mode"]), []).append(target)
    for verb in VERBS:
        for mode in result["modes"].values():
            if not any(verb in figures.get(peer, {}).get(mode, {}) for peer in peers):
                continue
            cells = [
                _cell(
                    figures.get(peer, {}).get(mode, {}).get(verb),
                    found_ratios.get(mode, {}).get(verb, {}).get(peer),
                )
                for peer in peers
            ]
            goal = Text()
            for target in by_row.get((verb, mode), []):
                if goal:
                    goal.append("\n")
                goal.append(f"{target['target']}: {target['text']} ")
                goal.append_text(_verdict(target["ok"]))
            table.add_row(verb, mode, *cells, goal)
    return table


def _events_table(result: dict[str, Any]) -> Table:
    on = "" if _backend_name(result) == "sqlite" else " on PostgreSQL"
    table = Table(title=f"event delivery (reactor{on}): commit to callback", title_justify="left")
    for column in ("where", "delivered", "p50", "p99", "callback before ack"):
        table.add_column(column, justify="left" if column == "where" else "right")
    table.add_column(_target_heading(result))
    by_mode = {t["mode"]: t for t in result["targets"] if t["verb"] == "event"}
    for which, found in result["events"].items():
        if found is None:
            continue
        target = by_mode.get(which)
        goal = Text()
        if target is not None:
            goal.append(f"{target['target']}: ")
            goal.append_text(_verdict(target["ok"]))
        table.add_row(
            which.replace("_", "-"),
            f"{found['delivered']}/{found['events']}",
            "-" if found["p50_us"] is None else _duration(found["p50_us"]),
            "-" if found["p99_us"] is None else _duration(found["p99_us"]),
            str(found.get("before_ack", "-")),
            goal,
        )
    return table


def _scale_table(scale: dict[str, Any]) -> Group:
    table = Table(title=f"reactor at scale: keys in {scale['scopes']} scopes", title_justify="left")
    for column in ("keys", "fill", "set", "set p50 / p99", "get", "get p50 / p99"):
        table.add_column(column, justify="right")
    for step in scale["steps"]:
        table.add_row(
            f"{step['keys']:,}",
            f"{step['fill_seconds']:.1f}s ({_rate(step['fill_keys_per_s'])})",
            _rate(step["set"]["ops_per_s"]),
            f"{_duration(step['set']['p50_us'])} / {_duration(step['set']['p99_us'])}",
            _rate(step["get"]["ops_per_s"]),
            f"{_duration(step['get']['p50_us'])} / {_duration(step['get']['p99_us'])}",
        )
    reopen = scale["reopen"]
    lines = Text(
        f"database {scale['database_bytes'] / 2**20:.0f} MiB; "
        f"peak RSS while filling {scale['fill_peak_rss_mb']:.0f} MiB\n"
        f"reopen with {scale['sizes'][-1]:,} keys: open {reopen['open_seconds'] * 1000:.0f} ms, "
        f"first get {reopen['first_get_seconds'] * 1000:.1f} ms, "
        f"close {reopen['close_seconds'] * 1000:.0f} ms; "
        f"peak RSS {reopen['peak_rss_mb']:.0f} MiB after 1,000 gets "
        f"({reopen['rss_after_import_mb']:.0f} MiB after import)"
    )
    return Group(table, lines)


def render(result: dict[str, Any], console: Console) -> None:
    """Print the result as tables, then the notes."""
    if "scale" in result:
        console.print(_scale_table(result["scale"]))
    else:
        console.print(_throughput_table(result))
        console.print(_events_table(result))
    notes = Text()
    for peer, reason in result["skipped"].items():
        notes.append(f"skipped {peer}: {reason}\n", style="yellow")
    for peer, modes in result.get("errors", {}).items():
        for mode, error in modes.items():
            notes.append(f"failed {peer} {mode}: {error}\n", style="red")
    for peer, about in result["peers"].items():
        for note in about["notes"]:
            notes.append(f"{peer}: {note}\n", style="dim")
    for note in result["notes"]:
        notes.append(f"{note}\n", style="dim")
    machine = result["machine"]
    backend = result.get("backend", {}).get("describe", "SQLite files")
    notes.append(
        f"{machine['platform']}, {machine['cpu_count']} CPUs, {machine['python']}, "
        f"SQLite {machine['sqlite']}; reactor backend: {backend}; {result['seconds']:.0f} s",
        style="dim",
    )
    console.print(notes)


def write_json(result: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Every figure, the settings and the machine, as JSON."""
    Path(path).write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
