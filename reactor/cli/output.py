"""What the command line prints: JSON for programs, tables for people.

Every command hands ``Output.show`` its result as plain data and a renderer for it.
Piped (or with ``--json``) the data goes out as one JSON document, or one JSON line per
item for streams; on a terminal (or with ``--table``) the renderer draws it with rich,
imported only then: a piped command does not spend 30 ms importing it. With ``--raw``
(as ``redis-cli --raw``), a command printing one value (``Output.value``) prints a string
as its text, and a list of keys (``Output.lines``) goes out one per line.
"""

from __future__ import annotations

import datetime as dt
import functools
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import click
import orjson

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.highlighter import JSONHighlighter
    from rich.table import Table
    from rich.text import Text

    from reactor._engine.events import ChangeEvent

__all__ = [
    "Output",
    "change_view",
    "deleted_view",
    "duration",
    "event_line",
    "items_view",
    "job_id_view",
    "job_info_view",
    "job_view",
    "jobs_view",
    "keys_view",
    "queue_settings_view",
    "queue_stats_view",
    "run_view",
    "runs_view",
    "scopes_view",
    "short_ids",
    "stats_view",
    "ttl_view",
    "update_view",
    "value_view",
]

_UNITS: Final = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))

STYLES: Final = {"created": "green", "updated": "yellow", "deleted": "red", "expired": "magenta"}


@functools.cache
def _highlighter() -> JSONHighlighter:
    from rich.highlighter import JSONHighlighter

    return JSONHighlighter()


def duration(seconds: float) -> str:
    """``seconds`` for people, in its two largest units: "59 min 57 s", "2 h 5 min",
    "3 d 4 h"; under a minute "42 s", "4.2 s", under a second "250 ms"."""
    if seconds < 0:
        return "-" + duration(-seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    left = round(seconds)
    parts: list[str] = []
    for unit, size in _UNITS:
        count, left = divmod(left, size)
        if count or parts:
            parts.append(f"{count} {unit}")
        if len(parts) == 2:
            break
    if len(parts) == 2 and parts[1].startswith("0 "):
        parts.pop()
    return " ".join(parts)


def short_ids(ids: list[str], least: int = 8) -> dict[str, str]:
    """Each of ``ids`` by its shortest prefix of at least ``least`` characters that no
    other of them begins with (as git shortens commit ids)."""
    ordered = sorted(ids)
    short = {}
    for index, name in enumerate(ordered):
        shared = 0
        for other in ordered[max(0, index - 1) : index] + ordered[index + 1 : index + 2]:
            shared = max(shared, _shared(name, other))
        short[name] = name[: max(least, shared + 1)]
    return short


def _shared(one: str, other: str) -> int:
    """How many characters ``one`` and ``other`` begin with in common."""
    count = 0
    for mine, theirs in zip(one, other, strict=False):
        if mine != theirs:
            break
        count += 1
    return count


def dumps(data: Any) -> bytes:
    """Compact JSON, UTF-8, no trailing newline."""
    return orjson.dumps(data)


def compact(data: Any) -> Text:
    """``data`` as one line of highlighted JSON."""
    from rich.text import Text

    return _highlighter()(Text(dumps(data).decode()))


class Output:
    """Where a command's result goes: ``as_json`` None decides by whether stdout is a
    terminal; ``raw`` prints strings as text, wherever the command allows it."""

    def __init__(self, as_json: bool | None = None, *, raw: bool = False) -> None:
        self.json = not sys.stdout.isatty() if as_json is None else as_json
        self.raw = raw

    @functools.cached_property
    def console(self) -> Console:
        """The terminal, for tables (rich is imported on the first one)."""
        from rich.console import Console

        return Console(soft_wrap=False)

    def show(self, data: Any, view: Callable[[Any], RenderableType]) -> None:
        """Print ``data``: as JSON, or as ``view(data)`` draws it."""
        if self.json:
            self.line(data)
        else:
            self.console.print(view(data))

    def value(self, data: Any, view: Callable[[Any], RenderableType]) -> None:
        """Print one value: as ``show`` does, unless raw: then a string is its text
        alone, and anything else one line of JSON, on a terminal too."""
        if not self.raw:
            self.show(data, view)
        elif isinstance(data, str):
            self.text([data])
        else:
            self.line(data)

    def lines(self, items: list[str], view: Callable[[Any], RenderableType]) -> None:
        """Print a list of strings: as ``show`` does, unless raw: then one per line."""
        if self.raw:
            self.text(items)
        else:
            self.show(items, view)

    def text(self, lines: list[str]) -> None:
        """Print ``lines`` as they are, UTF-8, each ended by a newline. Bytes, so that
        click passes control characters and escape sequences through untouched."""
        click.echo(b"".join(line.encode() + b"\n" for line in lines), nl=False)

    def line(self, data: Any) -> None:
        """Print ``data`` as one JSON line, flushed at once (streams follow it live)."""
        click.echo(dumps(data) + b"\n", nl=False)
        sys.stdout.flush()

    def event(self, event: ChangeEvent) -> None:
        """Print one change event: a JSON line, or a readable line."""
        if self.json:
            self.line(event.as_dict())
        else:
            self.console.print(event_line(event), soft_wrap=True)
            self.console.file.flush()


def _grid(rows: Mapping[str, RenderableType]) -> Table:
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for name, cell in rows.items():
        grid.add_row(name, cell)
    return grid


def _empty(what: str) -> Text:
    from rich.text import Text

    return Text(f"({what})", style="dim")


# -- views: data -> what a terminal shows ----------------------------------------
def value_view(value: Any) -> RenderableType:
    """A stored value, pretty-printed."""
    from rich.json import JSON

    return JSON(dumps(value).decode(), indent=2)


def change_view(change: Mapping[str, Any]) -> RenderableType:
    """What ``set`` did: the old and the new value."""
    return _grid({"old": compact(change["old_value"]), "new": compact(change["new_value"])})


def update_view(result: Mapping[str, Any]) -> RenderableType:
    """What ``update`` did, and the ops that did not apply."""
    from rich.table import Table

    grid = _grid({"old": compact(result["old_value"]), "new": compact(result["new_value"])})
    if not result["errors"]:
        return grid
    table = Table("op", "code", "message", title="not applied", title_justify="left")
    for error in result["errors"]:
        table.add_row(str(error["index"]), error["code"], error["message"])
    container = Table.grid()
    container.add_row(grid)
    container.add_row(table)
    return container


def deleted_view(result: Mapping[str, Any]) -> RenderableType:
    """What ``delete`` did."""
    if not result["deleted"]:
        return _empty("no such key")
    return _grid({"deleted": compact(result["old_value"])})


def keys_view(keys: list[str]) -> RenderableType:
    """A list of keys, one per row."""
    from rich.table import Table
    from rich.text import Text

    if not keys:
        return _empty("no keys")
    table = Table("key")
    for key in keys:
        table.add_row(Text(key))
    return table


def items_view(items: Mapping[str, Any]) -> RenderableType:
    """Keys and their values."""
    from rich.table import Table
    from rich.text import Text

    if not items:
        return _empty("no keys")
    table = Table("key", "value")
    for key, value in items.items():
        table.add_row(Text(key), compact(value))
    return table


def scopes_view(counts: Mapping[str, int]) -> RenderableType:
    """Scopes and how many keys each holds."""
    from rich.table import Table
    from rich.text import Text

    if not counts:
        return _empty("no scopes")
    table = Table("scope", "keys")
    table.columns[1].justify = "right"
    for name, count in counts.items():
        table.add_row(Text(name), f"{count:,}")
    return table


def timers_view(
    timers: list[Mapping[str, Any]], short: Mapping[str, str] | None = None
) -> RenderableType:
    """Pending timers: when each is due (and in how long), what it writes where, and
    its id, by its ``short`` form if given (as ``timers cancel`` takes it)."""
    from rich.table import Table
    from rich.text import Text

    if not timers:
        return _empty("no timers")
    now = time.time()
    table = Table("due", "in", "scope", "key", "every", "id")
    short = short or {}
    for timer in timers:
        due = float(timer["due"])
        left = due - now
        when = dt.datetime.fromtimestamp(due).isoformat(sep=" ", timespec="seconds")
        every, cron = timer["every"], timer.get("cron")
        if cron is not None:
            period = f"{cron} ({timer.get('tz') or 'UTC'})"
        else:
            period = "" if every is None else duration(every)
        table.add_row(
            when,
            "due" if left <= 0 else duration(left),
            Text(timer["scope"]),
            Text(timer["key"]),
            Text(period),
            short.get(timer["id"], timer["id"]),
        )
    return table


def ttl_view(seconds: float) -> RenderableType:
    """Seconds left, or what -1 and -2 mean."""
    from rich.text import Text

    if seconds == -2:
        return _empty("no such key")
    if seconds == -1:
        return _empty("no expiry")
    return Text(duration(seconds))


def stats_view(stats: Mapping[str, Any]) -> RenderableType:
    """``state.stats()``: the figures in one table, each nested group in its own."""
    from rich.table import Table

    figures = Table("figure", "value", title="database", title_justify="left")
    figures.columns[1].justify = "right"
    container = Table.grid()
    container.add_row(figures)
    for name, item in stats.items():
        if not isinstance(item, Mapping):
            figures.add_row(name, _cell(item))
        elif item:
            container.add_row(_nested(name, item))
    return container


def _nested(name: str, group: Mapping[str, Any]) -> Table:
    from rich.table import Table
    from rich.text import Text

    if not any(isinstance(value, Mapping) for value in group.values()):
        table = Table(title=name, title_justify="left", show_header=False)
        table.add_column()
        table.add_column(justify="right")
        for key, value in group.items():
            table.add_row(Text(key), _cell(value))
        return table
    rows = {
        key: value if isinstance(value, Mapping) else {"": value} for key, value in group.items()
    }
    columns = list(dict.fromkeys(column for row in rows.values() for column in row))
    table = Table("", *columns, title=name, title_justify="left")
    for column in table.columns[1:]:
        column.justify = "right"
    for key, row in rows.items():
        table.add_row(Text(key), *(_cell(row.get(column)) for column in columns))
    return table


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "" if value is None else str(value)


def job_id_view(data: Mapping[str, Any]) -> RenderableType:
    """The id of a job put."""
    from rich.text import Text

    return Text(f"job {data['id']}")


def job_view(job: Mapping[str, Any]) -> RenderableType:
    """A job taken: its id, attempts, item, and the token to ack it with."""
    rows: dict[str, RenderableType] = {
        "id": str(job["id"]),
        "attempts": str(job["attempts"]),
        "item": compact(job["item"]),
    }
    if "token" in job:
        rows["token"] = job["token"]
    return _grid(rows)


def jobs_view(jobs: list[Mapping[str, Any]]) -> RenderableType:
    """Jobs (dead ones), one per row, with the first line of their last error."""
    from rich.table import Table
    from rich.text import Text

    if not jobs:
        return _empty("no jobs")
    table = Table("id", "attempts", "item", "last error")
    table.columns[0].justify = table.columns[1].justify = "right"
    for job in jobs:
        error = job.get("error")
        last = Text("") if error is None else Text(error.strip().splitlines()[-1], "red")
        table.add_row(str(job["id"]), str(job["attempts"]), compact(job["item"]), last)
    return table


def job_info_view(job: Mapping[str, Any]) -> RenderableType:
    """A job looked up: its fields, then each failed attempt's error."""
    from rich.console import Group
    from rich.text import Text

    rows: dict[str, RenderableType] = {
        "id": str(job["id"]),
        "state": job["state"],
        "attempts": str(job["attempts"]),
        "item": compact(job["item"]),
    }
    for field in ("priority", "group", "key"):
        if job[field] not in (None, 0):
            rows[field] = str(job[field])
    left = job["ready_at"] - time.time()
    rows["ready_at" if job["state"] != "taken" else "lease ends"] = _when(job["ready_at"]) + (
        f" (in {duration(left)})" if left > 0 else ""
    )
    rows["put"] = _when(job["created_at"])
    if job["worker"] is not None:
        worker = job["worker"]
        rows["held by"] = f"{worker['host']} pid {worker['pid']} thread {worker['thread']}"
    parts: list[RenderableType] = [_grid(rows)]
    for error in job["errors"]:
        where = error.get("worker")
        by = "" if where is None else f" on {where['host']} pid {where['pid']}"
        parts.append(Text(f"attempt {error['attempt']} at {_when(error['at'])}{by}:", "bold"))
        parts.append(Text(error["error"] or "(no reason given)", "red"))
    return Group(*parts)


def _when(epoch: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")


def queue_settings_view(name: str, settings: Mapping[str, Any]) -> RenderableType:
    """A queue's settings (None: no limit)."""
    rows: dict[str, RenderableType] = {"queue": name}
    for field, value in settings.items():
        if isinstance(value, tuple | list):
            shown = (
                "/".join(f"{part:g}" for part in value)
                if field == "rate"
                else ":".join(f"{part:g}" for part in value)
            )
        else:
            shown = "off" if value is None else str(value)
        rows[field] = shown
    return _grid(rows)


def queue_stats_view(counts: Mapping[str, Mapping[str, int]]) -> RenderableType:
    """Queues and how many of their jobs are in each state."""
    from rich.table import Table
    from rich.text import Text

    if not counts:
        return _empty("no queues")
    table = Table("queue", "ready", "delayed", "taken", "dead", "rate window")
    for column in table.columns[1:]:
        column.justify = "right"
    for name, found in counts.items():
        states = ("ready", "delayed", "taken", "dead", "rate_window")
        table.add_row(Text(name), *(f"{found[state]:,}" for state in states))
    return table


def event_line(event: ChangeEvent) -> Text:
    """One change, readable: time, revision, type, scope and key, then the value it
    had and the value it has (only the one that exists)."""
    from rich.text import Text

    when = event.timestamp.astimezone().strftime("%H:%M:%S")
    line = Text.assemble(
        (when, "dim"),
        "  ",
        (f"#{event.revision}", "bold"),
        "  ",
        (f"{event.type:<7}", STYLES.get(event.type, "")),
        "  ",
        (event.scope, "cyan"),
        " ",
        event.key,
        "  ",
    )
    if event.type != "created":
        line.append_text(compact(event.old_value))
    if event.type in ("created", "updated"):
        if event.type == "updated":
            line.append(" -> ", "dim")
        line.append_text(compact(event.new_value))
    return line


def runs_view(runs: list[Mapping[str, Any]]) -> RenderableType:
    """Workflows' runs, one per row: failed and dead ones in red."""
    from rich.table import Table
    from rich.text import Text

    if not runs:
        return _empty("no runs")
    table = Table("id", "workflow", "status", "attempts", "steps", "updated", "error")
    for info in runs:
        error = info["error"]
        table.add_row(
            Text(info["id"]),
            Text(info["workflow"]),
            Text(info["status"], _STATUS_STYLES.get(info["status"], "")),
            str(info["attempts"]),
            str(info["steps"]),
            _when(info["updated"]),
            Text("" if error is None else f"{error['type']}: {error['message']}", "red"),
        )
    return table


def run_view(info: Mapping[str, Any]) -> RenderableType:
    """A run: its fields, then its steps with their durations."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    rows: dict[str, RenderableType] = {
        "id": info["id"],
        "workflow": info["workflow"],
        "status": Text(info["status"], _STATUS_STYLES.get(info["status"], "")),
        "attempts": str(info["attempts"]),
        "input": compact(info["input"]),
        "started": _when(info["created"]),
        "updated": _when(info["updated"]),
    }
    if info["status"] == "succeeded":
        rows["result"] = compact(info["result"])
    if info["error"] is not None:
        rows["error"] = Text(f"{info['error']['type']}: {info['error']['message']}", "red")
    steps = Table("#", "step", "status", "took", "result or error")
    for number, step in enumerate(info["steps"]):
        took = (
            "" if step["ended"] is None else f"{(step['ended'] - step['started']) * 1000:,.1f} ms"
        )
        error = step["error"]
        outcome = (
            compact(step["result"])
            if error is None
            else Text(f"{error['type']}: {error['message']}", "red")
        )
        status = Text(step["status"], _STATUS_STYLES.get(step["status"], ""))
        steps.add_row(str(number), Text(step["name"]), status, took, outcome)
    return Group(_grid(rows), steps)


_STATUS_STYLES: Final = {"failed": "red", "cancelled": "yellow", "succeeded": "green"}
