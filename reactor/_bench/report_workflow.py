"""The bench's tables of the workflow primitives: the work queue against its peers
(worker threads and processes), its put-to-take latency, and timers."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text

from .cells import divide, duration, on, rate, ratio, table, verdict

__all__ = ["workflow_tables"]


def workflow_tables(result: dict[str, Any]) -> Group:
    """The workflow section: the queue table, the latency table, the timers table, and
    notes (peers skipped, failures)."""
    section = result["workflow"]
    parts: list[Any] = [
        *_queue_table(result),
        *_latency_table(result),
        *_timers_table(result),
    ]
    notes = Text()
    for name, why in section.get("queue_skipped", {}).items():
        notes.append(f"queue peer skipped, {name}: {why}\n", style="yellow")
    for what, error in section.get("errors", {}).items():
        notes.append(f"workflow {what} failed: {error}\n", style="red")
    for name, by_workers in section.get("queue", {}).items():
        for workers, found in by_workers.items():
            if found.get("error"):
                notes.append(f"queue {name} {workers} failed: {found['error']}\n", style="red")
    parts.append(notes)
    return Group(*parts)


def _cell_order(cell: str) -> tuple[bool, int]:
    """Threads ("1", "4") first, then processes ("4p")."""
    return cell.endswith("p"), int(cell.rstrip("p"))


def _queue_table(result: dict[str, Any]) -> list[Any]:
    section = result["workflow"]
    queue = section.get("queue", {})
    if not queue:
        return []
    jobs = section["settings"]["jobs"]
    found_table = table(
        f"work queue, reactor on {on(result)}: {jobs:,} jobs put by one thread, "
        "then taken and acked by N threads (Np: processes) (ops/s; reactor ÷ peer)"
    )
    for column in ("queue", "N", "put", "take+ack", "÷ put", "÷ take", "once"):
        found_table.add_column(column, justify="left" if column == "queue" else "right")
    mine = queue.get("reactor", {})
    for name, by_workers in queue.items():
        for workers, found in sorted(by_workers.items(), key=lambda item: _cell_order(item[0])):
            base = mine.get(workers, {})
            put, take = found["put_per_s"], found["take_ack_per_s"]
            found_table.add_row(
                name,
                workers,
                "-" if put is None else rate(put),
                "-" if take is None else rate(take),
                ratio(divide(base.get("put_per_s"), put)) if name != "reactor" else "",
                ratio(divide(base.get("take_ack_per_s"), take)) if name != "reactor" else "",
                verdict(found["exactly_once"]),
            )
    return [found_table]


def _latency_table(result: dict[str, Any]) -> list[Any]:
    latency = result["workflow"].get("latency", {})
    if not latency:
        return []
    found_table = table(
        f"put to take, reactor on {on(result)}: a worker process waits in its take, one "
        "job put at a time (the others poll: not measured)"
    )
    for column in ("queue", "samples", "p50", "p99"):
        found_table.add_column(column, justify="left" if column == "queue" else "right")
    for name, found in latency.items():

        def ms(value: float | None) -> str:
            return "-" if value is None else duration(value * 1000)

        found_table.add_row(name, str(found["samples"]), ms(found["p50_ms"]), ms(found["p99_ms"]))
    return [found_table]


def _timers_table(result: dict[str, Any]) -> list[Any]:
    timers = result["workflow"].get("timers")
    if not timers:
        return []
    found_table = table(
        f"timers, reactor on {on(result)}: {timers['probes']} due 10 ms apart with "
        f"{timers['pending']:,} pending"
    )
    for column in ("fired", "lag p50", "lag p99", "lag max", "scheduled/s"):
        found_table.add_column(column, justify="right")

    def ms(value: float | None) -> str:
        return "-" if value is None else duration(value * 1000)

    found_table.add_row(
        f"{timers['fired']}/{timers['probes']}",
        ms(timers["lag_p50_ms"]),
        ms(timers["lag_p99_ms"]),
        ms(timers["lag_max_ms"]),
        "-" if timers["schedule_per_s"] is None else rate(timers["schedule_per_s"]),
    )
    return [found_table]
