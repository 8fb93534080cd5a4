"""``reactor queue``: put jobs, take and acknowledge them, look one up, cancel or purge
them, see and retry dead ones, and set a queue's flow control."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Literal

import click

from .group import Group
from .options import (
    F,
    command_output,
    command_state,
    data_options,
    limit_option,
    parse_json,
    string_option,
)
from .output import (
    job_id_view,
    job_info_view,
    job_view,
    jobs_view,
    queue_settings_view,
    queue_stats_view,
)

if TYPE_CHECKING:
    from reactor import Job

__all__ = ["COMMANDS"]


@click.group(cls=Group)
@data_options()
def queue() -> None:
    """Work queues: put jobs, take and acknowledge them, look one up, cancel or purge
    them, see and retry dead ones, and set a queue's flow control ('config').

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
@click.option("--priority", type=int, default=0, help="Higher is taken first [default: 0].")
@click.option(
    "--group", metavar="GROUP", help="Its group: group_concurrency bounds a group's taken jobs."
)
@click.option(
    "--debounce",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="With --key: replace the waiting job of that key, ready SECONDS from now.",
)
@string_option()
@data_options()
def queue_put(
    name: str,
    item: str,
    delay: float | None,
    key: str | None,
    priority: int,
    group: str | None,
    debounce: float | None,
) -> None:
    """Add a job to queue NAME; print its id.

    JSON is the job's item (- reads it from stdin): quote strings, '"text"' (or -s). With
    --key, a job the queue holds already under that key keeps it: its id is printed.
    With --key and --debounce, a waiting job of that key is replaced (same id).
    """
    data = parse_json(item, "the item", value=True)
    queue = command_state(create=True).queue(name)
    job_id = queue.put(data, delay, key, priority=priority, group=group, debounce=debounce)
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
    help="Ready again only this many seconds from now [default: the queue's backoff].",
)
@click.option("--error", metavar="TEXT", help="Why the attempt failed: kept with the job.")
@data_options()
def queue_nack(name: str, job_id: int, token: str, delay: float | None, error: str | None) -> None:
    """Give job ID of queue NAME back: ready again (after --delay, or the queue's
    backoff), or dead after its last attempt; --error says why.

    TOKEN is what 'reactor queue take' printed. Exit status 1 if that take's lease ran
    out: nothing changes then.
    """
    _taken(name, job_id, token).nack(delay, error)
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
    data = [
        {
            "id": job.id,
            "item": job.item,
            "attempts": job.attempts,
            "error": job.errors[-1]["error"] if job.errors else None,
        }
        for job in found
    ]
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


@queue.command("job")
@click.argument("name")
@click.argument("job_id", metavar="ID", type=click.IntRange(min=1))
@data_options()
def queue_job(name: str, job_id: int) -> None:
    """Show job ID of queue NAME: its state, item, attempts, the errors of its failed
    attempts and who holds it. Exit status 1 if the queue holds no such job."""
    info = command_state().queue(name).job(job_id)
    if info is None:
        raise click.ClickException(f"queue {name!r} holds no job {job_id}")
    data = {field: getattr(info, field) for field in info.__dataclass_fields__}
    command_output().show(data, job_info_view)


@queue.command("cancel")
@click.argument("name")
@click.argument("job_id", metavar="ID", type=click.IntRange(min=1))
@data_options()
def queue_cancel(name: str, job_id: int) -> None:
    """Remove job ID of queue NAME, whatever its state (a worker holding it gets an
    error from its ack). Exit status 1 if the queue holds no such job."""
    if not command_state(create=True).queue(name).cancel(job_id):
        raise click.ClickException(f"queue {name!r} holds no job {job_id}")
    command_output().show(
        {"id": job_id, "cancelled": True}, lambda data: _said(f"job {data['id']} cancelled")
    )


@queue.command("purge")
@click.argument("name")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(["ready", "delayed", "taken", "dead"]),
    help="Remove the jobs in this state (repeat for more).",
)
@click.option("--all", "everything", is_flag=True, help="Remove every job of the queue.")
@data_options()
def queue_purge(name: str, states: tuple[str, ...], everything: bool) -> None:
    """Remove the jobs of queue NAME in the states given (--state), or all (--all);
    print how many."""
    if not states and not everything:
        raise click.UsageError("say which jobs: --state STATE (repeatable), or --all")
    if states and everything:
        raise click.UsageError("give --state or --all, not both")
    count = command_state(create=True).queue(name).purge(None if everything else list(states))
    command_output().show({"purged": count}, lambda data: _said(f"{data['purged']:,} jobs purged"))


def _limit(value: str, what: str) -> int | Literal[False]:
    """An int >= 1, or 'off' (False: lifted)."""
    if value == "off":
        return False
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an int or 'off'", param_hint=what) from None


def _pair(value: str, what: str, sep: str) -> tuple[float, float] | Literal[False]:
    """'A{sep}B' as two numbers, or 'off' (False: lifted)."""
    if value == "off":
        return False
    first, found, second = value.partition(sep)
    try:
        if found:
            return float(first), float(second)
    except ValueError:
        pass
    shape = f"N{sep}SECONDS" if sep == "/" else f"BASE{sep}MAX"
    raise click.BadParameter(f"{value!r} is not {shape} or 'off'", param_hint=what)


@queue.command("config")
@click.argument("name")
@click.option("--max-attempts", type=click.IntRange(min=1), help="Takes before a job is dead.")
@click.option("--concurrency", metavar="N|off", help="The most jobs taken at once.")
@click.option(
    "--group-concurrency", metavar="N|off", help="The most jobs of one group taken at once."
)
@click.option("--rate", metavar="N/SECONDS|off", help="The most takes in any window of SECONDS.")
@click.option(
    "--backoff", metavar="BASE:MAX|off", help="The pause before a nacked job's next attempt."
)
@data_options()
def queue_config(
    name: str,
    max_attempts: int | None,
    concurrency: str | None,
    group_concurrency: str | None,
    rate: str | None,
    backoff: str | None,
) -> None:
    """Show the settings of queue NAME, after saving those given ('off' lifts a limit).

    They are the queue's for every process: workers' takes obey them at once.
    """
    options: dict[str, Any] = {}
    if concurrency is not None:
        options["concurrency"] = _limit(concurrency, "--concurrency")
    if group_concurrency is not None:
        options["group_concurrency"] = _limit(group_concurrency, "--group-concurrency")
    if rate is not None:
        pair = _pair(rate, "--rate", "/")
        options["rate"] = pair if pair is False else (round(pair[0]), pair[1])
        if pair is not False and pair[0] != round(pair[0]):
            raise click.BadParameter(
                f"{rate!r}: the number of takes is an int", param_hint="--rate"
            )
    if backoff is not None:
        options["backoff"] = _pair(backoff, "--backoff", ":")
    given = max_attempts is not None or bool(options)
    queue = command_state(create=given).queue(name, max_attempts, **options)
    command_output().show(queue.settings(), lambda data: queue_settings_view(name, data))


def _said(text: str) -> Any:
    from rich.text import Text

    return Text(text)


COMMANDS: Final = (queue,)
