"""``reactor queue``: put jobs, take and acknowledge them, see and retry dead ones."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import click

from .group import Group
from .options import F, command_output, command_state, data_options, limit_option, parse_json
from .output import job_id_view, job_view, jobs_view, queue_stats_view

if TYPE_CHECKING:
    from reactor import Job

__all__ = ["COMMANDS"]


@click.group(cls=Group)
@data_options()
def queue() -> None:
    """Work queues: put jobs, take and acknowledge them, see and retry dead ones.

    A job taken here is yours for its lease: finish it with 'reactor queue ack NAME ID
    TOKEN' (or nack) before the lease runs out, or it is ready again. 'take --ack'
    takes and acknowledges at once.
    """


@queue.command("put", context_settings={"ignore_unknown_options": True})  # an item of -1
@click.argument("name")
@click.argument("item", metavar="JSON")
@click.option(
    "--delay",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Ready only this many seconds from now.",
)
@click.option(
    "--key",
    metavar="KEY",
    help="An idempotency key: while a job of the queue holds it, a put with it adds nothing.",
)
@data_options()
def queue_put(name: str, item: str, delay: float | None, key: str | None) -> None:
    """Add a job to queue NAME; print its id.

    JSON is the job's item (- reads it from stdin): quote strings, '"text"'. With
    --key, a job the queue holds already under that key keeps it: its id is printed.
    """
    data = parse_json(item, "the item", value=True)
    job_id = command_state(create=True).queue(name).put(data, delay=delay, key=key)
    command_output().show({"id": job_id}, job_id_view)


@queue.command("take")
@click.argument("name")
@click.option(
    "--lease",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="How long the job is yours: ack it before, or it is ready again.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=0.0,
    metavar="SECONDS",
    help="Wait up to this long for a job ('inf': until one comes) [default: 0, look once].",
)
@click.option("--ack", "ack", is_flag=True, help="Acknowledge the job at once: done when printed.")
@data_options()
def queue_take(name: str, lease: float, timeout: float, ack: bool) -> None:
    """Take the next ready job of queue NAME; print it.

    Prints {"id", "item", "attempts", "token"}: give ID and TOKEN to 'reactor queue ack'
    (or nack) within the lease. With --ack, the job is acknowledged as it is printed (at
    most once: if this command fails after, the job is gone). Exit status 1 if no job
    came within --timeout.
    """
    job = command_state(create=True).queue(name).take(timeout=timeout, lease=lease)
    if job is None:
        waited = f" within {timeout:g} s" if timeout else ""
        raise click.ClickException(f"no job ready in queue {name!r}{waited}")
    data: dict[str, Any] = {"id": job.id, "item": job.item, "attempts": job.attempts}
    if ack:
        job.ack()
    else:
        data["token"] = job._token  # noqa: SLF001 - a friend of Job (SLF001): for the ack (_taken)
    command_output().show(data, job_view)


def _job_arguments(command: F) -> F:
    command = click.argument("token")(command)
    command = click.argument("job_id", metavar="ID", type=click.IntRange(min=1))(command)
    return click.argument("name")(command)


def _taken(name: str, job_id: int, token: str) -> Job:
    """Job ``job_id`` of queue ``name`` as the take that printed ``token`` holds it."""
    # A friend of Queue (SLF001): resuming another process's take by its token is the command
    # line's need, not an API (a program keeps its Job).
    return command_state(create=True).queue(name)._job(job_id, token)  # noqa: SLF001


@queue.command("ack")
@_job_arguments
@data_options()
def queue_ack(name: str, job_id: int, token: str) -> None:
    """Acknowledge job ID of queue NAME: it is done, and removed.

    TOKEN is what 'reactor queue take' printed. Exit status 1 if that take's lease ran
    out (the job may be someone else's now): nothing changes then.
    """
    _taken(name, job_id, token).ack()
    command_output().show(
        {"id": job_id, "acked": True}, lambda data: _said(f"job {data['id']} done")
    )


@queue.command("nack")
@_job_arguments
@click.option(
    "--delay",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Ready again only this many seconds from now.",
)
@data_options()
def queue_nack(name: str, job_id: int, token: str, delay: float | None) -> None:
    """Give job ID of queue NAME back: ready again (after --delay), or dead after its
    last attempt.

    TOKEN is what 'reactor queue take' printed. Exit status 1 if that take's lease ran
    out: nothing changes then.
    """
    _taken(name, job_id, token).nack(delay)
    command_output().show(
        {"id": job_id, "nacked": True}, lambda data: _said(f"job {data['id']} given back")
    )


@queue.command("stats")
@click.argument("name", required=False)
@data_options()
def queue_stats(name: str | None) -> None:
    """Print how many jobs are ready, delayed, taken and dead: in queue NAME, or in
    every queue."""
    state = command_state()
    if name is not None:
        command_output().show(
            state.queue(name).stats(), lambda data: queue_stats_view({name: data})
        )
        return
    counts = {found: state.queue(found).stats() for found in state.queues()}
    command_output().show(counts, queue_stats_view)


@queue.command("dead")
@click.argument("name")
@limit_option("At most N jobs: the first N to die.")
@data_options()
def queue_dead(name: str, limit: int | None) -> None:
    """List the dead jobs of queue NAME, in the order they died."""
    found = command_state().queue(name).dead(limit)
    data = [{"id": job.id, "item": job.item, "attempts": job.attempts} for job in found]
    command_output().show(data, jobs_view)


@queue.command("retry")
@click.argument("name")
@data_options()
def queue_retry(name: str) -> None:
    """Make every dead job of queue NAME ready again, attempts back to 0; print how
    many."""
    count = command_state(create=True).queue(name).retry_dead()
    command_output().show(
        {"retried": count}, lambda data: _said(f"{data['retried']:,} jobs retried")
    )


def _said(text: str) -> Any:
    from rich.text import Text

    return Text(text)


COMMANDS: Final = (queue,)
