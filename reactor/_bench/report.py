"""Rounds into figures: medians, ratios, targets, the table and the JSON file."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import sqlite3
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from .cells import (
    backend_name as _backend_name,
)
from .cells import (
    duration as _duration,
)
from .cells import (
    on as _on,
)
from .cells import (
    rate as _rate,
)
from .cells import (
    ratio as _ratio,
)
from .cells import (
    table as _table,
)
from .cells import (
    verdict as _verdict,
)
from .report_derived import derived_tables
from .report_durable import durable_tables as _durable_tables
from .report_startup import startup_table
from .report_workflow import workflow_tables as _workflow_tables
from .workloads import VERBS
from .writers import LAYOUTS, cell_key, cell_label

__all__ = [
    "dumps",
    "machine_info",
    "ratios",
    "render",
    "summarize",
    "targets",
    "write_json",
]

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
                for key in ("writes_per_transaction", "calls_per_op", "loop_calls_per_op"):
                    found = [fig[key] for fig in figs if key in fig]
                    if found:
                        entry[key] = statistics.median(found)
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
    against = peer
    if peer == "reactor":  # against itself: another verb, or another mode
        against = f"reactor {peer_verb or verb}" + (f" {peer_mode}" if peer_mode else "")
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
    found = [  # issue 24's, on SQLite
        _ratio_target(figures, "set", one, "sqlite3+log", 0.75),
        _ratio_target(figures, "set", one, "diskcache", 1.5),
        _ratio_target(figures, "get", one, "diskcache", 1.5),
        _ratio_target(figures, "set", many, "reactor", 1.3, peer_mode=one),
        _ratio_target(figures, "increment", many, "diskcache", 1.2),
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
    found.append(_ratio_target(figures, "set", aio, "sqlite3x100", 0.3))
    found.extend(_ratio_target(figures, verb, one, "redis", 2.0) for verb in VERBS if verb != "get")
    found.append(_ratio_target(figures, "update", one, "reactor", 0.8, peer_verb="set"))
    found.append(_latency_target(events, "in_process", 1000.0, "1 ms"))
    found.append(_latency_target(events, "cross_process", 50_000.0, "50 ms"))
    return found


# -- the table -------------------------------------------------------------------------
# Every table fits 80 columns: short headings, explained in a legend line under it.
_SHORT = {
    "dict+lock": "dict",
    "sqlite3": "sq3",
    "sqlite3x100": "sq3b",
    "sqlite3+log": "sq3l",
    "diskcache": "dc",
    "sqlitedict": "sqd",
    "redis": "redis",
}
_LEGEND = {
    "dict+lock": "dict = dict+lock",
    "sqlite3": "sq3 = sqlite3",
    "sqlite3x100": "sq3b = sqlite3, 100 ops a commit",
    "sqlite3+log": "sq3l = sqlite3 keeping reactor's change log (the floor)",
    "diskcache": "dc = diskcache",
    "sqlitedict": "sqd = sqlitedict",
}


def _peers_table(result: dict[str, Any]) -> Group:
    figures: dict[str, Any] = result["figures"]
    found_ratios: dict[str, Any] = result["ratios"]
    peers = [peer for peer in result["peers"] if peer in figures and peer != "reactor"]
    table = _table(
        f"reactor on {_on(result)} against its peers: reactor's ops/s and latency, "
        f"then reactor ÷ peer (medians of {result['settings']['rounds']} round(s))"
    )
    for heading in ("verb", "mode", "ops/s", "p50", "p99"):
        table.add_column(heading, justify="left" if heading in ("verb", "mode") else "right")
    for peer in peers:
        table.add_column(_SHORT.get(peer, peer), justify="right", no_wrap=True)
    short = False
    for verb in VERBS:
        first = True
        for mode in result["modes"].values():
            entry = figures.get("reactor", {}).get(mode, {}).get(verb)
            if entry is None:
                continue
            ops = Text(_rate(entry["ops_per_s"]), style="bold")
            if entry.get("count_exact") is False:
                ops.append("*", style="bold red")
                short = True
            ratios_here = found_ratios.get(mode, {}).get(verb, {})
            table.add_row(
                verb if first else "",
                mode,
                ops,
                _duration(entry["p50_us"]),
                _duration(entry["p99_us"]),
                *(_ratio(ratios_here.get(peer)) for peer in peers),
            )
            first = False
        table.add_section()
    modes = ", ".join(result["modes"].values())
    legend = Text(
        f"modes {modes}: t threads, p processes, aio asyncio tasks"
        + "".join(f"; {_LEGEND[peer]}" for peer in peers if peer in _LEGEND)
        + "; - not measured (dict+lock has no processes)",
        style="dim",
    )
    if short:
        legend.append("\n* the final count was short: increments were lost", style="red")
    return Group(table, legend)


def _work_table(result: dict[str, Any]) -> Group:
    """Counts, steady however loaded the machine: the function calls of one operation
    in one thread, for reactor and each peer, and the writes reactor's modes put in
    each transaction (concurrent writers share commits)."""
    figures: dict[str, Any] = result["figures"]
    modes: dict[str, str] = result["modes"]
    peers = [peer for peer in result["peers"] if peer in figures]
    batching = [mode for kind, mode in modes.items() if not kind.startswith("processes")]
    table = _table(
        f"work per operation: calls in one thread ({modes['threads_1']}), then reactor's "
        "writes per transaction by mode"
    )
    table.add_column("verb")
    for heading in [*(_SHORT.get(peer, peer) for peer in peers), *batching, "loop"]:
        table.add_column(heading, justify="right", no_wrap=True)
    for verb in VERBS:
        calls = [
            figures[peer].get(modes["threads_1"], {}).get(verb, {}).get("calls_per_op")
            for peer in peers
        ]
        shared = [
            figures.get("reactor", {}).get(mode, {}).get(verb, {}).get("writes_per_transaction")
            for mode in batching
        ]
        loop = figures.get("reactor", {}).get(modes["asyncio"], {}).get(verb, {})
        on_loop = loop.get("loop_calls_per_op")
        table.add_row(
            verb,
            *("-" if count is None else f"{count:.0f}" for count in calls),
            *("-" if writes is None else f"{writes:.2f}" for writes in shared),
            "-" if on_loop is None else f"{on_loop:.0f}",
        )
    legend = Text(
        "calls: Python and C function calls per operation, counted with sys.setprofile "
        "(the bench's adapter adds one or two; sqd's own thread is not counted); "
        "writes per transaction: operations ÷ transactions reactor committed in the phase; "
        f"loop: reactor's calls per operation on the event loop's thread ({modes['asyncio']})",
        style="dim",
    )
    return Group(table, legend)


def _targets_table(result: dict[str, Any]) -> Table:
    on = "" if _backend_name(result) == "sqlite" else " (set for SQLite)"
    table = _table(f"targets{on}")
    table.add_column("target")
    table.add_column("measured", justify="right")
    table.add_column("")
    for target in result["targets"]:
        table.add_row(
            f"{target['verb']} {target['mode']} {target['target']}",
            target["text"],
            _verdict(target["ok"]),
        )
    return table


def _events_table(result: dict[str, Any]) -> Table:
    table = _table(f"event delivery, reactor on {_on(result)}: commit to callback")
    for column in ("where", "delivered", "p50", "p99", "before ack"):
        table.add_column(column, justify="left" if column == "where" else "right")
    for which, found in result["events"].items():
        if found is None:
            continue
        table.add_row(
            which.replace("_", "-"),
            f"{found['delivered']}/{found['events']}",
            "-" if found["p50_us"] is None else _duration(found["p50_us"]),
            "-" if found["p99_us"] is None else _duration(found["p99_us"]),
            str(found.get("before_ack", "-")),
        )
    return table


def _scale_table(scale: dict[str, Any]) -> Group:
    table = _table(f"reactor at scale: keys in {scale['scopes']} scopes (ops/s, p50 / p99)")
    for column in ("keys", "fill", "set", "set latency", "get", "get latency"):
        table.add_column(column, justify="right")
    for step in scale["steps"]:
        table.add_row(
            f"{step['keys']:,}",
            f"{step['fill_seconds']:.1f}s",
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


def _writers_cells(section: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, layout, entry) for each measured cell, in the order measured."""
    found = []
    for processes, threads in section.get("settings", {}).get("cells", []):
        kind, count = cell_key(processes, threads)
        for layout in LAYOUTS:
            entry = section.get(kind, {}).get(layout, {}).get(count)
            if entry is not None:
                found.append((cell_label(processes, threads), layout, entry))
    return found


def _writers_table(name: str, section: dict[str, Any]) -> Group:
    settings = section.get("settings", {})
    pgbench = section.get("pgbench")
    clients = pgbench.get("clients", {}) if pgbench else {}
    on = "SQLite" if name == "sqlite" else "PostgreSQL"
    table = _table(f"how writes scale: reactor on {on}, sets/s")
    table.add_column("writers")
    for heading in ("own scopes", "x1", "p50", "one scope", "x1"):
        table.add_column(heading, justify="right")
    if clients:
        table.add_column("pgbench", justify="right")
        table.add_column("÷pgb", justify="right")
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for label, layout, entry in _writers_cells(section):
        rows.setdefault(label, {})[layout] = entry
    for label, layouts in rows.items():
        cells: list[RenderableType] = [label]
        for layout in LAYOUTS:
            found = layouts.get(layout)
            if found is None:
                cells.extend(["-", "-"] + (["-"] if layout == LAYOUTS[0] else []))
                continue
            cells.append(Text(_rate(found["writes_per_s"]), style="bold"))
            cells.append(_ratio(found.get("vs_one_writer")))
            if layout == LAYOUTS[0]:
                cells.append(_duration(found["p50_us"]))
        if clients:
            own = layouts.get(LAYOUTS[0], {})
            beside = clients.get(str(own.get("pgbench_clients")))
            cells.append("-" if beside is None else _rate(beside["tps"]))
            cells.append(_ratio(own.get("vs_pgbench")))
        table.add_row(*cells)
    return Group(table, _writers_legend(section, settings, pgbench))


def _writers_legend(
    section: dict[str, Any], settings: dict[str, Any], pgbench: dict[str, Any] | None
) -> Text:
    """What the writers table's headings mean, pgbench's note, the targets."""
    legend = Text(
        f"sets of a ~100 B value, medians of {settings.get('rounds', '?')} round(s) of "
        f"{settings.get('seconds_per_cell', 0):g} s; writers: processes x threads; own "
        "scopes: a scope per writer; one scope: all writers on one; x1: ÷ one writer "
        "(1p x 1t)",
        style="dim",
    )
    if pgbench is not None and pgbench.get("clients"):
        legend.append(
            "; pgbench: the server's pgbench -N tps with a client per writer "
            "(4p x 4t: 4 clients); ÷pgb: own scopes ÷ pgbench",
            style="dim",
        )
    elif pgbench is not None:
        legend.append(f"\n{pgbench.get('note', 'pgbench: no figures')}", style="yellow")
    for target in section.get("targets", []):
        legend.append(f"\ntarget {target['target']}: ")
        if target["ok"] is None:
            legend.append("not measured in this run", style="dim")
        else:
            legend.append(f"{target['text']} ")
            legend.append_text(_verdict(target["ok"]))
    if section.get("error"):
        legend.append(f"\nfailed: {section['error']}", style="red")
    return legend


def render(result: dict[str, Any], console: Console) -> None:
    """Print the result as tables (each fits 80 columns), then the notes."""
    if "scale" in result:
        console.print(_scale_table(result["scale"]))
    if "figures" in result:
        console.print(_peers_table(result))
        console.print(_work_table(result))
        console.print(_targets_table(result))
        console.print(_events_table(result))
    for name, section in result.get("scaling", {}).items():
        console.print(_writers_table(name, section))
    for key, tables in (
        ("workflow", _workflow_tables),
        ("durable", _durable_tables),
        ("derived", derived_tables),
        ("startup", startup_table),
    ):
        if key in result:
            console.print(tables(result))
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


def dumps(result: dict[str, Any]) -> str:
    """Every figure, the settings and the machine, as indented JSON (NaN as null)."""
    return json.dumps(_finite(result), indent=2, default=str, allow_nan=False) + "\n"


def _finite(data: Any) -> Any:
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {key: _finite(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(value) for value in data]
    return data


def write_json(result: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Every figure, the settings and the machine, as a JSON file."""
    Path(path).write_text(dumps(result), encoding="utf-8")
