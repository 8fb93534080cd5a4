"""The commands that run a program of their own: the web dashboard (``reactor ui``),
the demo and the bench. Each imports what only it needs (starlette and uvicorn, rich,
the demo, the bench's peers) when it runs, so that the other commands start quickly."""

from __future__ import annotations

import signal
import socket
import sys
from types import ModuleType
from typing import Final

import click

from reactor import open as open_state

from .group import Command
from .options import AS_JSON, DB, DB_HELP, F, command_state, format_option, remember

__all__ = ["COMMANDS", "dashboard_options", "import_web", "listen", "warn_beyond_loopback"]

_DEMO_DATABASE: Final = "reactor-demo.db"  # demo.DEMO_DATABASE (the demo imports rich)
# The ui extra's packages: a ModuleNotFoundError naming another is a bug, not a hint.
_UI_PACKAGES: Final = frozenset({"starlette", "uvicorn", "sse_starlette", "anyio", "h11"})


def dashboard_options(command: F) -> F:
    """The dashboard's options: ``--host``, ``--port``, ``--write``, ``--allow-host``
    (``reactor ui``, and ``reactor serve --ui``)."""
    for option in reversed(
        (
            click.option(
                "--host",
                default="127.0.0.1",
                show_default=True,
                metavar="ADDRESS",
                help="The address the dashboard listens on; anything but loopback opens "
                "the page to the network.",
            ),
            click.option(
                "--port",
                type=click.IntRange(0, 65535),
                default=8765,
                metavar="N",
                show_default=True,
                help="The port the dashboard listens on (0: any free port).",
            ),
            click.option(
                "--write",
                is_flag=True,
                help="Allow set, update, delete, cancelling timers and retrying dead letters "
                "from the page.",
            ),
            click.option(
                "--allow-host",
                "allow_hosts",
                multiple=True,
                metavar="NAME",
                help="Another host name (or address) the page may be reached by; any other is "
                "refused with 400 'Invalid host header' (the loopback names are always "
                "allowed; * allows any).",
            ),
        )
    ):
        command = option(command)
    return command


def import_web(command: str) -> ModuleType:
    """``reactor._ui.server``, which needs the ``ui`` extra (starlette, uvicorn).

    Raises:
        click.ClickException: the extra is not installed (``command`` needs it).
    """
    try:
        from reactor._ui import server
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] not in _UI_PACKAGES:
            raise
        raise click.ClickException(f"{command} needs: pip install 'reactor-state[ui]'") from None
    return server


def listen(server: ModuleType, host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port``.

    Raises:
        click.ClickException: it cannot listen there.
    """
    try:
        listener: socket.socket = server.listen(host, port)
    except OSError as exc:
        raise click.ClickException(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
    return listener


@click.command(cls=Command)
@click.option("--db", metavar="PATH|URL", expose_value=False, callback=remember, help=DB_HELP)
@dashboard_options
@click.option("--open", "open_browser", is_flag=True, help="Open the page in a web browser.")
def ui(host: str, port: int, write: bool, allow_hosts: tuple[str, ...], open_browser: bool) -> None:
    """Serve a web dashboard: scopes, keys, values, stats and the live change feed.

    Read-only unless --write. Listens on 127.0.0.1 until Ctrl-C.
    """
    server = import_web("reactor ui")
    # Opened here, so that a bad --db is one line on stderr; the app shares the engine.
    state = command_state(create=write)
    listener = listen(server, host, port)
    url = server.url_of(listener)
    mode = "read-write" if write else "read-only"
    hosts = server.allowed_hosts(host, allow_hosts)
    # SIGTERM (kill, docker stop) ends the server as Ctrl-C does: cleanly, status 0.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with listener:
            if not server.is_loopback(host):
                warn_beyond_loopback(host, url, hosts, write=write)
            click.echo(f"reactor ui: {state.location} at {url} ({mode}; Ctrl-C to stop)", err=True)
            if open_browser:
                import webbrowser

                webbrowser.open(url)
            server.serve(
                listener,
                click.get_current_context().meta.get(DB),
                write=write,
                hosts=hosts,
            )
    except KeyboardInterrupt:
        pass  # how the server is meant to end
    finally:
        signal.signal(signal.SIGTERM, previous)


def warn_beyond_loopback(host: str, url: str, hosts: list[str], *, write: bool) -> None:
    click.echo(
        f"Warning: listening on {host}, beyond this machine: whoever reaches "
        f"{url} can read every value" + (" and change it" if write else "") + " "
        "(no login).",
        err=True,
    )
    # Reached by an address or a name not among these, the page is refused
    # ("Invalid host header"): say how to allow one.
    click.echo(
        f"It answers to the host names {', '.join(hosts)} and to the "
        "address a request reaches it on; to reach it by another name, add "
        "--allow-host NAME.",
        err=True,
    )


@click.command(cls=Command)
@click.option(
    "--db",
    metavar="PATH|URL",
    default=None,
    help=f"The demo's database [default: the --db given to reactor, else {_DEMO_DATABASE} "
    "in the current folder].",
)
def demo(db: str | None) -> None:
    """Run a short program on an embedded database, and show that state survives."""
    from rich.console import Console

    from .demo import run_demo

    group = click.get_current_context().parent
    again = "reactor demo"
    # Only a --db on the command line: $REACTOR_DB names the user's own database, which
    # the demo's orders have no business in.
    if (
        db is None
        and group is not None
        and group.get_parameter_source("db") is click.core.ParameterSource.COMMANDLINE
    ):
        db = group.meta.get(DB)
    if db is not None:
        import re
        import shlex

        shown = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", db)  # a URL's password
        again = f"reactor --db {shlex.quote(shown)} demo"
    with open_state(db or _DEMO_DATABASE) as state:
        run_demo(state, Console(), again=again)


@click.command(cls=Command)
@click.option(
    "--quick",
    is_flag=True,
    help="A smoke run (CI): 200 ops per worker, 1 round, 1 and 2 writers for 0.3 s.",
)
@click.option(
    "--rounds", type=click.IntRange(min=1), default=None, help="Rounds to take medians of [3]."
)
@click.option(
    "--only",
    type=click.Choice(["peers", "writers", "workflow", "durable", "derived", "startup"]),
    default=None,
    help="One section: reactor against its peers, how its writes scale with writers, "
    "its timers and work queue (against a Redis list and a SQLite table), "
    "its durable workflows (against DBOS), its derived values' latency and cost, or "
    "the start-up of a reactor get from the shell [default: all].",
)
@click.option(
    "--peers",
    metavar="NAMES",
    default=None,
    help="Only these peers beside reactor, comma-separated (of dict+lock, sqlite3, "
    "sqlite3x100, sqlite3+log, diskcache, sqlitedict, redis) [default: every one installed].",
)
@format_option()
@click.option(
    "--output",
    "-o",
    "output_file",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Also write every figure, with the machine's details, to this JSON file.",
)
@click.option(
    "--scale",
    is_flag=True,
    help="Instead: reactor with 10,000 to 1,000,000 keys in 100 scopes (slow).",
)
@click.option(
    "--db-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where the databases go (default: a temporary directory, removed afterwards).",
)
@click.option("--threads", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--processes", type=click.IntRange(min=1), default=4, show_default=True)
@click.option(
    "--backend",
    type=click.Choice(["sqlite", "postgresql"]),
    default="sqlite",
    show_default=True,
    help="Where reactor keeps its database (a fresh schema per mode on PostgreSQL); "
    "the peers stay as they are.",
)
@click.option(
    "--postgres-url",
    "--url",
    "url",
    envvar=["REACTOR_BENCH_POSTGRES_URL", "REACTOR_TEST_POSTGRES_URL"],
    show_envvar=True,
    default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
    show_default=True,
    help="The PostgreSQL server for --backend postgresql (pgbench runs there too).",
)
def bench(
    quick: bool,
    rounds: int | None,
    only: str | None,
    peers: str | None,
    output_file: str | None,
    scale: bool,
    db_dir: str | None,
    threads: int,
    processes: int,
    backend: str,
    url: str,
) -> None:
    """Measure reactor against dict+lock, sqlite3, diskcache, sqlitedict and Redis,
    and how its writes scale with threads and processes (beside pgbench on PostgreSQL).

    Tables on a terminal (80 columns suffice), JSON when piped or with --json.
    """
    from rich.console import Console

    from reactor._bench import BackendUnavailable, Options, run
    from reactor._bench.report import dumps, render, write_json

    ctx = click.get_current_context()
    _check_bench_choices(ctx, scale=scale, only=only, backend=backend)
    wanted = None if peers is None else _bench_peers(peers, scale=scale, only=only)
    as_json = ctx.meta.get(AS_JSON)
    if as_json is None:
        as_json = not sys.stdout.isatty()
    progress = Console(stderr=True)  # shown on a terminal only, never in the JSON
    try:
        with progress.status("reactor bench") as status:
            result = run(
                Options(
                    quick=quick,
                    rounds=rounds,
                    scale=scale,
                    only=only,
                    peers=wanted,
                    db_dir=db_dir,
                    threads=threads,
                    processes=processes,
                    backend=backend,
                    url=url,
                    progress=lambda message: status.update(f"reactor bench: {message}"),
                )
            )
    except BackendUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    if output_file is not None:
        write_json(result, output_file)
    if as_json:
        click.echo(dumps(result), nl=False)
        return
    console = Console()
    render(result, console)
    if output_file is not None:
        console.print(f"figures written to {output_file}")


def _check_bench_choices(
    ctx: click.Context, *, scale: bool, only: str | None, backend: str
) -> None:
    """Refuse, before anything runs, the options that exclude each other."""
    if scale and backend != "sqlite":
        raise click.UsageError("--scale runs on SQLite only: leave out --backend postgresql")
    if scale and only is not None:
        raise click.UsageError("--scale is a section of its own: leave out --only")
    given = ctx.get_parameter_source("url")
    if backend == "sqlite" and given is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--postgres-url goes with --backend postgresql")


def _bench_peers(given: str, *, scale: bool, only: str | None) -> tuple[str, ...]:
    """The peer names of ``--peers``, each known; refused where no peer runs."""
    from reactor._bench.peers import PEERS

    if scale or only not in (None, "peers"):
        raise click.UsageError("--peers goes with the comparison: leave out --scale and --only")
    names = tuple(name.strip() for name in given.split(",") if name.strip())
    unknown = [name for name in names if name not in PEERS or name == "reactor"]
    if unknown or not names:
        known = ", ".join(name for name in PEERS if name != "reactor")
        raise click.BadParameter(f"{', '.join(unknown) or given!r}: the peers are {known}")
    return names


COMMANDS: Final = (ui, demo, bench)
