"""``reactor runs``, ``run``, ``cancel``, ``send``: durable workflows' runs (SPEC §14)
from the command line: list them, show one with its steps, cancel one, send one a
message."""

from __future__ import annotations

import dataclasses
from typing import Any, Final

import click

from reactor._handles.workflows import STATUSES

from .options import (
    command_output,
    command_state,
    data_options,
    limit_option,
    parse_json,
    string_option,
)
from .output import run_view, runs_view, value_view

__all__ = ["COMMANDS"]


def _unknown(run_id: str) -> click.ClickException:
    return click.ClickException(f"no run {run_id!r}")


@click.command("runs")
@click.option("--workflow", default="*", metavar="GLOB", help="Only these workflows' runs.")
@click.option("--status", type=click.Choice(STATUSES), help="Only the runs in this state.")
@limit_option("At most N runs: the N started last.")
@data_options()
def runs(workflow: str, status: str | None, limit: int | None) -> None:
    """List workflows' runs, oldest first: id, workflow, status, attempts, steps."""
    found = command_state().runs(workflow, status)
    if limit is not None:
        found = found[-limit:]
    command_output().show([_summary(dataclasses.asdict(info)) for info in found], runs_view)


@click.command("run")
@click.argument("run_id", metavar="ID")
@data_options()
def run(run_id: str) -> None:
    """Show run ID: its status, input, result or error, and each step."""
    try:
        info = command_state().run_info(run_id)
    except KeyError:
        raise _unknown(run_id) from None
    command_output().show(dataclasses.asdict(info), run_view)


@click.command("cancel")
@click.argument("run_id", metavar="ID")
@data_options()
def cancel(run_id: str) -> None:
    """Cancel run ID (and its children): at once if pending or suspended, else at the
    end of its running step."""
    try:
        cancelled = command_state(create=True).cancel(run_id)
    except KeyError:
        raise _unknown(run_id) from None
    command_output().show({"id": run_id, "cancelled": cancelled}, value_view)


@click.command("send", context_settings={"ignore_unknown_options": True})
@click.argument("run_id", metavar="ID")
@click.argument("topic")
@click.argument("message", metavar="JSON")
@string_option()
@data_options()
def send(run_id: str, topic: str, message: str) -> None:
    """Send run ID a MESSAGE (JSON) on TOPIC: its next run.receive(TOPIC) gets it."""
    value = parse_json(message, "MESSAGE", value=True)
    try:
        command_state(create=True).send(run_id, topic, value)
    except KeyError:
        raise _unknown(run_id) from None
    command_output().show({"id": run_id, "topic": topic, "sent": value}, value_view)


def _summary(info: dict[str, Any]) -> dict[str, Any]:
    """A run as ``runs`` lists it: its steps counted, not shown."""
    steps = info.pop("steps")
    return {**info, "steps": len(steps)}


COMMANDS: Final = (runs, run, cancel, send)
